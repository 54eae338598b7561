//! A decode step's projections: a few rows times a weight held `[out, in]`, in one launch that
//! reads each weight once. burn's matrix products (cubek) look up their autotuned kernel and
//! infer its tiling on every call; on an H100 that host work was ~100 us a product, most of a
//! decode step (`bench/results/2026-11-26-gpu-products`), where this kernel launches as cheaply
//! as the elementwise ones.
//!
//! A group of 32 units takes one output, or a few neighbouring ones when there are several
//! rows: each unit reads every 32nd vector of the outputs' weight rows (consecutive units,
//! consecutive vectors: coalesced), multiplies them with the same vector of every input row and
//! keeps one f32 sum per row and output; the group then adds its 32 sums, with one plane
//! operation where the device's planes are 32 wide and in shared memory elsewhere (lavapipe has
//! no plane operations). Several outputs a group let one input vector loaded serve several
//! weight rows: at 16 rows and one output a group, input loads outnumbered weight loads 16 to 1.

use burn::tensor::DType;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::features::Plane;
use cubecl::prelude::*;

/// Rows one launch takes at most: a decode batch of up to 16 sequences.
pub const MAX_ROWS: usize = 16;

/// Units that share one output's sums.
const GROUP: usize = 32;

/// Outputs a cube takes (cubes of 128 units).
const OUTPUTS_PER_CUBE: usize = 4;

#[cube(launch)]
fn projection_kernel<F: Float, A: Float, N: Size>(
    x: &Tensor<Vector<F, N>>, // [m, k], rows of unit stride (CUDA pads rows: any row stride)
    w: &Tensor<Vector<F, N>>, // [n, k], the same: the weight's [out, in]
    out: &mut Tensor<F>,      // [m, n], contiguous
    #[comptime] rows: usize,
    #[comptime] outputs: usize,
    #[comptime] plane: bool,
    #[define(F, A)] _dtypes: [StorageType; 2],
) {
    let lane = UNIT_POS_X as usize;
    let slot = UNIT_POS_Y as usize;
    let group = CUBE_DIM_X as usize;
    let first = (CUBE_POS_X as usize * CUBE_DIM_Y as usize + slot) * outputs;
    let m = x.shape(0);
    let n = w.shape(0);
    let k_vectors = w.shape(1) / w.vector_size();
    // Row strides in vectors (the launch picks a vector width that divides them).
    let x_row = x.stride(0) / x.vector_size();
    let w_row = w.stride(0) / w.vector_size();

    // One scalar sum per row and output: vector sums for 16 rows held 128 registers a unit, too
    // few units then fit an SM to keep the loads in flight (a third of an H100's bandwidth).
    let mut acc = Array::<A>::new(rows * outputs);
    #[unroll]
    for a in 0..rows * outputs {
        acc[a] = A::new(0.0);
    }
    let mut wv = Array::<Vector<A, N>>::new(outputs);
    if first < n {
        let steps = (k_vectors + group - 1 - lane) / group;
        for s in 0..steps {
            let i = lane + s * group;
            // A group's outputs past the last reread the last row; their sums are not written.
            #[unroll]
            for o in 0..outputs {
                let col = (first + o).min(n - 1);
                wv[o] = Vector::<A, N>::cast_from(w[col * w_row + i]);
            }
            #[unroll]
            for r in 0..rows {
                if r < m {
                    let xv = Vector::<A, N>::cast_from(x[r * x_row + i]);
                    #[unroll]
                    for o in 0..outputs {
                        acc[r * outputs + o] += A::cast_from(Vector::vector_sum(xv * wv[o]));
                    }
                }
            }
        }
    }

    if plane {
        #[unroll]
        for r in 0..rows {
            #[unroll]
            for o in 0..outputs {
                let total = plane_sum(acc[r * outputs + o]);
                if lane == 0 && first + o < n && r < m {
                    out[r * n + first + o] = F::cast_from(total);
                }
            }
        }
    } else {
        // One tree per sum over its group's units; every unit reaches every barrier.
        let units = comptime!(GROUP * OUTPUTS_PER_CUBE);
        let sums_per_unit = comptime!(rows * outputs);
        let mut sums = SharedMemory::<A>::new(sums_per_unit * units);
        let unit = slot * group + lane;
        #[unroll]
        for a in 0..sums_per_unit {
            sums[a * units + unit] = acc[a];
        }
        sync_cube();
        let mut half = group / 2;
        while half > 0 {
            if lane < half {
                #[unroll]
                for a in 0..sums_per_unit {
                    sums[a * units + unit] = sums[a * units + unit] + sums[a * units + unit + half];
                }
            }
            sync_cube();
            half /= 2;
        }
        if lane == 0 {
            #[unroll]
            for r in 0..rows {
                #[unroll]
                for o in 0..outputs {
                    if first + o < n && r < m {
                        out[r * n + first + o] =
                            F::cast_from(sums[(r * outputs + o) * units + unit]);
                    }
                }
            }
        }
    }
}

/// Outputs one group takes for `rows` rows: one up to 4 rows, two beyond, so that each input
/// vector loaded serves two weight rows. On an H100 at 16 rows two took a 1B layer's four
/// products in 534 us where one took 692 and four 682: four sums of 16 rows spill registers
/// (`bench/results/2026-11-27-gpu-decode`). Where there are no plane operations the group's
/// sums go through shared memory, which bounds them. `KVB_PROJECTION_OUTPUTS` (1, 2, 4 or 8)
/// overrides the choice, to compare on a device.
fn outputs_for(rows: usize, plane: bool, shared_bytes: usize) -> usize {
    static OVERRIDE: std::sync::OnceLock<Option<usize>> = std::sync::OnceLock::new();
    let chosen = OVERRIDE
        .get_or_init(|| {
            std::env::var("KVB_PROJECTION_OUTPUTS")
                .ok()
                .and_then(|v| v.parse::<usize>().ok())
                .filter(|o| [1, 2, 4, 8].contains(o))
        })
        .unwrap_or(if rows <= 4 { 1 } else { 2 });
    let fits = |o: usize| plane || rows * o * GROUP * OUTPUTS_PER_CUBE * 4 <= shared_bytes;
    let mut outputs = chosen;
    while outputs > 1 && !fits(outputs) {
        outputs /= 2;
    }
    outputs
}

/// Whether [`launch`] takes `x` `[m, k]` times the transpose of `w` `[n, k]`: at most
/// [`MAX_ROWS`] rows, both with rows of unit stride (CUDA's allocator pads rows to its pitch, so
/// row strides may exceed `k`), one dtype, and cubes enough on one axis.
pub(super) fn fits<R: CubeRuntime>(x: &CubeTensor<R>, w: &CubeTensor<R>) -> bool {
    let ([m, k], [n, wk]) = (dims(x), dims(w));
    let hardware = &x.client.properties().hardware;
    (1..=MAX_ROWS).contains(&m)
        && k > 0
        && wk == k
        && n > 0
        && x.dtype == w.dtype
        && x.meta.strides[1] == 1
        && w.meta.strides[1] == 1
        && (m == 1 || x.meta.strides[0] >= k)
        && w.meta.strides[0] >= k
        && n.div_ceil(OUTPUTS_PER_CUBE) <= hardware.max_cube_count.0 as usize
        && GROUP * OUTPUTS_PER_CUBE <= hardware.max_units_per_cube as usize
        && GROUP <= hardware.max_cube_dim.0 as usize
        && OUTPUTS_PER_CUBE <= hardware.max_cube_dim.1 as usize
}

/// Elements from the start of `t`'s buffer to its first value (a slice's offset).
fn offset_elements<R: CubeRuntime>(t: &CubeTensor<R>) -> usize {
    t.handle.offset_start.unwrap_or(0) as usize / t.dtype.size()
}

fn dims<R: CubeRuntime>(t: &CubeTensor<R>) -> [usize; 2] {
    [t.meta.shape[0], t.meta.shape[1]]
}

/// `x` `[m, k]` times the transpose of `w` `[n, k]` (see [`fits`]) -> `[m, n]`, contiguous.
pub(super) fn launch<R: CubeRuntime>(x: CubeTensor<R>, w: CubeTensor<R>) -> CubeTensor<R> {
    let ([m, k], [n, _]) = (dims(&x), dims(&w));
    let dtype = x.dtype;
    let out = empty_device_contiguous_dtype::<R>(
        x.client.clone(),
        x.device.clone(),
        vec![m, n].into(),
        dtype,
    );
    // The widest load the device optimises (8 halves on CUDA, 4 on wgpu, whose shaders have no
    // wider vectors) that divides a row, the row strides and the offsets, so that every row's
    // vectors start on a boundary.
    let x_row = if m == 1 { k } else { x.meta.strides[0] };
    let aligned = [
        k,
        x_row,
        w.meta.strides[0],
        offset_elements(&x),
        offset_elements(&w),
    ];
    let vector = x
        .client
        .io_optimized_vector_sizes(dtype.size())
        .find(|v| aligned.iter().all(|a| a % v == 0))
        .unwrap_or(1);
    let props = x.client.properties();
    let plane = props.features.plane.contains(Plane::Ops)
        && props.hardware.plane_size_min as usize == GROUP
        && props.hardware.plane_size_max as usize == GROUP;
    let rows = m.next_power_of_two();
    let outputs = outputs_for(rows, plane, props.hardware.max_shared_memory_size);
    projection_kernel::launch::<R>(
        &x.client,
        CubeCount::Static(n.div_ceil(OUTPUTS_PER_CUBE * outputs) as u32, 1, 1),
        CubeDim::new_2d(GROUP as u32, OUTPUTS_PER_CUBE as u32),
        vector,
        x.clone().into_tensor_arg(),
        w.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        rows,
        outputs,
        plane,
        [dtype.into(), DType::F32.into()],
    );
    out
}

#[cfg(all(test, feature = "wgpu"))]
mod tests {
    use super::*;
    use burn::tensor::{Tensor, TensorData, TensorPrimitive};

    type B = burn::backend::Wgpu<f32, i32>;

    /// Rows whose stride exceeds `k` (CUDA pads rows to its pitch; wgpu never does, so the test
    /// narrows a wider tensor's shape) take the kernel, with vectors that divide the stride or
    /// with none, and read each row from its own start.
    #[test]
    fn padded_rows_take_the_kernel() {
        let dev = Default::default();
        let (m, k, n) = (3, 20, 5);
        for pad in [4, 1] {
            let row = k + pad;
            let value = |i: usize, a: usize| ((i * a % 101) as f32 - 50.0) / 25.0;
            let xs: Vec<f32> = (0..m * row).map(|i| value(i, 37)).collect();
            let ws: Vec<f32> = (0..n * row).map(|i| value(i, 53)).collect();
            let padded = |v: &[f32], rows: usize| {
                let t = Tensor::<B, 2>::from_data(TensorData::new(v.to_vec(), [rows, row]), &dev);
                let mut t = t.into_primitive().tensor();
                t.meta.shape_mut()[1] = k;
                t
            };
            let (x, w) = (padded(&xs, m), padded(&ws, n));
            assert!(fits(&x, &w), "pad {pad}");
            let got = Tensor::<B, 2>::from_primitive(TensorPrimitive::Float(launch(x, w)))
                .into_data()
                .to_vec::<f32>()
                .unwrap();
            for (i, g) in got.iter().enumerate() {
                let (r, c) = (i / n, i % n);
                let want: f32 = (0..k).map(|j| xs[r * row + j] * ws[c * row + j]).sum();
                assert!(
                    (g - want).abs() <= 1e-5 * (1.0 + want.abs()),
                    "pad {pad}, {i}: {g} vs {want}"
                );
            }
        }
    }
}
