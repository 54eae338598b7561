//! Attention kernels for the burn backends built on CubeCL: wgpu (Vulkan, Metal, DX12, and
//! lavapipe on a CPU) and CUDA, from one kernel source ([`kernel`]).
//!
//! Both entry points of [`AttentionBackend`] run the same paged flash-attention kernel: a paged
//! call directly, a plain call as one sequence whose K/V is a single block (a plain call with an
//! extra boolean mask or a batch of more than one stays on the reference ops; the engine makes
//! neither). The kernel matches the per-element answer on every property test
//! (`tests/cube_matches_naive.rs`, on lavapipe in CI and on CUDA and NVIDIA's Vulkan on an H100)
//! and the default model's greedy output on every backend. `KVB_ATTN=reference` in the
//! environment (read once per process) runs burn's reference ops instead, to compare or to
//! work around a driver that miscompiles the kernel.
//!
//! In f16 and bf16 on a device with cooperative matrices, long prefills take [`tensor_core`]'s
//! kernel instead ([`plan::kernel_for`] decides; `KVB_ATTN=vector` opts out).
mod kernel;
mod memo;
mod plan;
mod pool_write;
mod tensor_core;

pub use plan::Kernel;

use crate::paged::{check_paged, PagedBatch, PagedDims, PagedSeq};
use crate::{reference, AttentionBackend, AttnError, PoolBackend, Visibility};
use burn::tensor::{Bool, DType, Tensor, TensorPrimitive};
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};
use cubecl::prelude::*;

/// Keys per tile staged in shared memory: with head dim 128 the two tiles take 16 KiB, well
/// inside every runtime's limit (Metal's is 32 KiB).
const TILE_KEYS: usize = 16;

/// Units per cube the kernel asks for at most.
const MAX_UNITS: usize = 256;

/// Units per cube at least: (head, row) pairs can be as few as a decode item's `group`, and a
/// K/V tile staged by three units would leave the loads serial.
const MIN_UNITS: usize = 64;

/// Planes (warps) per cube of the tensor-core kernel: 64 query rows share each K/V tile.
const MMA_PLANES: usize = plan::WIDE_ROWS / tensor_core::PLANE_ROWS;

/// What `KVB_ATTN` asks for, read once per process: `reference` runs burn's reference ops,
/// `vector` keeps every call off tensor cores (to compare, or to work around a driver), anything
/// else (or nothing) lets each call take the fastest kernel the device has.
fn mode() -> plan::Mode {
    static MODE: std::sync::OnceLock<plan::Mode> = std::sync::OnceLock::new();
    *MODE.get_or_init(|| match std::env::var("KVB_ATTN").as_deref() {
        Ok("reference") => plan::Mode::Reference,
        Ok("vector") => plan::Mode::Vector,
        _ => plan::Mode::Auto,
    })
}

fn kernel_chosen() -> bool {
    mode() != plan::Mode::Reference
}

/// Whether the device multiplies 16x16x16 blocks of `dtype` into f32 sums in planes of 32
/// units, as [`tensor_core`] needs.
fn has_tensor_cores<R: CubeRuntime>(client: &ComputeClient<R>, dtype: DType) -> bool {
    if !matches!(dtype, DType::F16 | DType::BF16) {
        return false;
    }
    let props = client.properties();
    let half: cubecl::ir::StorageType = dtype.into();
    let single: cubecl::ir::StorageType = DType::F32.into();
    props.hardware.plane_size_min == 32
        && props.hardware.plane_size_max == 32
        && props
            .features
            .matmul
            .cmma
            .contains(&cubecl::features::MmaConfig {
                a_type: half,
                b_type: half,
                cd_type: single,
                m: 16,
                n: 16,
                k: 16,
            })
}

/// Which kernel a paged call takes on a CubeCL backend: the choice made for every call, for
/// tests and benchmarks to see (tensor cores on a device that has them, else the vector kernel).
pub trait PagedKernelChoice: burn::tensor::backend::Backend {
    /// The kernel for a batch of `q_heads` heads of `head_dim` whose sequences bring `seq_rows`
    /// query rows each.
    fn paged_kernel(
        device: &Self::Device,
        head_dim: usize,
        q_heads: usize,
        seq_rows: &[usize],
    ) -> plan::Kernel;
}

impl<R, F, I, BT> PagedKernelChoice for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn paged_kernel(
        device: &R::Device,
        head_dim: usize,
        q_heads: usize,
        seq_rows: &[usize],
    ) -> plan::Kernel {
        kernel_of(
            &R::client(device),
            F::dtype(),
            head_dim,
            q_heads,
            seq_rows.iter().copied(),
        )
    }
}

/// The kernel for a call of `q_heads` heads of `head_dim` in `dtype` on `client`'s device.
fn kernel_of<R: CubeRuntime>(
    client: &ComputeClient<R>,
    dtype: DType,
    head_dim: usize,
    q_heads: usize,
    seq_rows: impl IntoIterator<Item = usize>,
) -> plan::Kernel {
    plan::kernel_for(
        mode(),
        has_tensor_cores(client, dtype),
        head_dim,
        q_heads,
        seq_rows,
    )
}

/// Pool writes in one launch per call (`cube/pool_write.rs`); the rest is burn's ops.
impl<R, F, I, BT> PoolBackend for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn pool_scatter(
        pool: Tensor<Self, 3>,
        slots: &[usize],
        values: Tensor<Self, 3>,
    ) -> Tensor<Self, 3> {
        match pool_write::pool_write_in_place(pool, slots, values.clone()) {
            Ok(pool) => pool,
            Err(pool) => crate::paged::pool_write_runs(pool, slots, values),
        }
    }

    fn pool_scatter_pair(
        pools: [Tensor<Self, 3>; 2],
        slots: &[usize],
        values: [Tensor<Self, 3>; 2],
    ) -> [Tensor<Self, 3>; 2] {
        match pool_write::pool_write_pair_in_place(pools, slots, values.clone()) {
            Ok(pools) => pools,
            Err([k_pool, v_pool]) => {
                let [k, v] = values;
                [
                    Self::pool_scatter(k_pool, slots, k),
                    Self::pool_scatter(v_pool, slots, v),
                ]
            }
        }
    }
}

impl<R, F, I, BT> AttentionBackend for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn attention(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        v: Tensor<Self, 4>,
        visibility: &Visibility,
        extra_mask: Option<&Tensor<Self, 2, Bool>>,
        scale: f32,
    ) -> Result<Tensor<Self, 4>, AttnError> {
        let [batch, q_heads, n, d] = q.dims();
        let [_, kv_heads, t, _] = k.dims();
        if !kernel_chosen() || extra_mask.is_some() || batch != 1 || k.dims() != v.dims() || t == 0
        {
            return reference::attention(q, k, v, visibility, extra_mask, scale);
        }
        let last_slot = visibility.last_slots(n, t)?;
        // The keys as a pool of one block holding the whole sequence.
        let k_pool = k.reshape([kv_heads, t, d]);
        let v_pool = v.reshape([kv_heads, t, d]);
        let blocks = [0u32];
        let seqs = [PagedSeq {
            blocks: &blocks,
            rows: 0..n,
            last_slot: &last_slot,
            decode: false,
        }];
        let batch = PagedBatch {
            block_size: t,
            seqs: &seqs,
        };
        let out = Self::paged_attention(q, &k_pool, &v_pool, &batch, scale)?; // [n, hq d]
        Ok(out
            .reshape([n, q_heads, d])
            .swap_dims(0, 1)
            .unsqueeze::<4>())
    }

    fn paged_attention(
        q: Tensor<Self, 4>,
        k_pool: &Tensor<Self, 3>,
        v_pool: &Tensor<Self, 3>,
        batch: &PagedBatch,
        scale: f32,
    ) -> Result<Tensor<Self, 2>, AttnError> {
        if !kernel_chosen() {
            return crate::paged::paged_attention(q, k_pool, v_pool, batch, scale);
        }
        let dims = check_paged(q.dims(), k_pool.dims(), v_pool.dims(), batch)?;
        let device = q.device();
        if dims.rows == 0 {
            // Zero elements: `empty` launches nothing, where burn-cubecl's `zeros` launches a kernel of
            // zero cubes, which CUDA rejects (CUDA_ERROR_INVALID_VALUE).
            return Ok(Tensor::empty(
                [0, dims.q_heads * dims.head_dim],
                (&device, q.dtype()),
            ));
        }
        let group = dims.q_heads / dims.kv_heads;
        let client = q.clone().into_primitive().tensor().client;
        let max_units = (client.properties().hardware.max_cube_dim.0 as usize).min(MAX_UNITS);
        if group > max_units {
            return Err(AttnError::Shape(format!(
                "{group} query heads per kv head exceed the {max_units} units of one cube"
            )));
        }
        let kernel = kernel_of(
            &client,
            q.dtype(),
            dims.head_dim,
            dims.q_heads,
            batch.seqs.iter().map(|s| s.rows.len()),
        );
        if kernel == plan::Kernel::TensorCore {
            let work = plan::plan(batch, plan::WIDE_ROWS);
            let n_items = work.len();
            let index = upload::<R, F, I, BT>(work, &device);
            let out = launch_mma::<R>(
                q.into_primitive().tensor(),
                k_pool.clone().into_primitive().tensor(),
                v_pool.clone().into_primitive().tensor(),
                index,
                &dims,
                n_items,
                group,
                batch.block_size,
                scale,
            );
            return Ok(Tensor::from_primitive(TensorPrimitive::Float(out)));
        }
        let rows_per_item = plan::rows_per_item(batch, group, max_units);
        let work = plan::plan(batch, rows_per_item);
        let split = plan::key_split(&work, dims.kv_heads, TILE_KEYS);
        let n_items = work.len();
        let index = upload::<R, F, I, BT>(work, &device);
        let out = launch::<R>(
            q.into_primitive().tensor(),
            k_pool.clone().into_primitive().tensor(),
            v_pool.clone().into_primitive().tensor(),
            index,
            &dims,
            Launch {
                items: n_items,
                rows_per_item,
                units: (rows_per_item * group).max(MIN_UNITS.min(max_units)),
                group,
                block_size: batch.block_size,
                split,
                scale,
            },
        );
        Ok(Tensor::from_primitive(TensorPrimitive::Float(out)))
    }
}

/// A work plan's block tables, last slots and items on `device` (reused across layers, see
/// [`memo`]).
fn upload<R, F, I, BT>(work: plan::WorkPlan, device: &R::CubeDevice) -> [CubeTensor<R>; 3]
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    let plan::WorkPlan {
        tables,
        last_slot,
        items,
    } = work;
    memo::int_tensors::<R, F, I, BT, 3>(&memo::ATTENTION, device, [tables, last_slot, items])
}

/// The launch's sizes, besides the tensors.
struct Launch {
    items: usize,
    rows_per_item: usize,
    /// Units per cube: every (head, row) pair, and more to stage tiles with when they are few.
    units: usize,
    group: usize,
    block_size: usize,
    split: plan::KeySplit,
    scale: f32,
}

/// Allocates the output `[rows, q_heads * head_dim]` and runs the kernel into it, through the
/// partials of every key split and their merge when the keys are split.
fn launch<R: CubeRuntime>(
    q: CubeTensor<R>,
    k_pool: CubeTensor<R>,
    v_pool: CubeTensor<R>,
    [tables, last_slot, items]: [CubeTensor<R>; 3],
    dims: &PagedDims,
    l: Launch,
) -> CubeTensor<R> {
    let client = q.client.clone();
    let float = q.dtype;
    // The kernels' arithmetic, and the split partials, are f32 whatever the tensors hold.
    let accumulate = DType::F32;
    let int = tables.dtype;
    let device = q.device.clone();
    let alloc = |shape: Vec<usize>, dtype: DType| {
        empty_device_contiguous_dtype::<R>(client.clone(), device.clone(), shape.into(), dtype)
    };
    let out = alloc(vec![dims.rows, dims.q_heads * dims.head_dim], float);
    let splits = l.split.splits;
    let first_pass = if splits > 1 {
        alloc(
            vec![dims.rows, dims.q_heads, splits, dims.head_dim + 2],
            accumulate,
        )
    } else {
        out.clone()
    };
    let first_pass_dtype = first_pass.dtype;
    crate::host_work::launched(if splits > 1 { 2 } else { 1 });
    kernel::paged_attention_kernel::launch::<R>(
        &client,
        CubeCount::Static(l.items as u32, dims.kv_heads as u32, splits as u32),
        CubeDim::new_1d(l.units as u32),
        q.into_tensor_arg(),
        k_pool.into_tensor_arg(),
        v_pool.into_tensor_arg(),
        tables.into_tensor_arg(),
        last_slot.into_tensor_arg(),
        items.into_tensor_arg(),
        first_pass.clone().into_tensor_arg(),
        InputScalar::new(l.scale, accumulate),
        l.group as u32,
        l.rows_per_item as u32,
        l.block_size as u32,
        l.split.split_len as u32,
        dims.head_dim,
        TILE_KEYS,
        splits > 1,
        [
            float.into(),
            int.into(),
            accumulate.into(),
            first_pass_dtype.into(),
        ],
    );
    if splits > 1 {
        kernel::merge_splits_kernel::launch::<R>(
            &client,
            CubeCount::Static(dims.rows as u32, dims.q_heads as u32, 1),
            CubeDim::new_1d(dims.head_dim as u32),
            first_pass.into_tensor_arg(),
            out.clone().into_tensor_arg(),
            splits as u32,
            dims.head_dim,
            [float.into(), accumulate.into()],
        );
    }
    out
}

/// Allocates the output `[rows, q_heads * head_dim]` and runs the tensor-core kernel into it.
#[allow(clippy::too_many_arguments)]
fn launch_mma<R: CubeRuntime>(
    q: CubeTensor<R>,
    k_pool: CubeTensor<R>,
    v_pool: CubeTensor<R>,
    [tables, last_slot, items]: [CubeTensor<R>; 3],
    dims: &PagedDims,
    n_items: usize,
    group: usize,
    block_size: usize,
    scale: f32,
) -> CubeTensor<R> {
    let client = q.client.clone();
    let float = q.dtype;
    let accumulate = DType::F32;
    let int = tables.dtype;
    let out = empty_device_contiguous_dtype::<R>(
        client.clone(),
        q.device.clone(),
        vec![dims.rows, dims.q_heads * dims.head_dim].into(),
        float,
    );
    crate::host_work::launched(1);
    tensor_core::paged_attention_mma_kernel::launch::<R>(
        &client,
        CubeCount::Static(n_items as u32, dims.q_heads as u32, 1),
        CubeDim::new_2d(32, MMA_PLANES as u32),
        q.into_tensor_arg(),
        k_pool.into_tensor_arg(),
        v_pool.into_tensor_arg(),
        tables.into_tensor_arg(),
        last_slot.into_tensor_arg(),
        items.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        InputScalar::new(scale, accumulate),
        group as u32,
        block_size as u32,
        dims.head_dim,
        MMA_PLANES,
        [float.into(), int.into(), accumulate.into()],
    );
    out
}
