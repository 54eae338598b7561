//! A decode step's projections: a few rows times a weight held `[out, in]`, in one launch that
//! reads each weight once. burn's matrix products (cubek) look up their autotuned kernel and
//! infer its tiling on every call; on an H100 that host work was ~100 us a product, most of a
//! decode step (`bench/results/2026-11-26-gpu-products`), where this kernel launches as cheaply
//! as the elementwise ones.
//!
//! A group of 32 units takes one output: each unit reads every 32nd vector of the output's
//! weight row (consecutive units, consecutive vectors: coalesced), multiplies it with the same
//! vector of every input row and keeps one f32 sum per row; the group then adds its 32 sums,
//! with one plane operation where the device's planes are 32 wide and in shared memory
//! elsewhere (lavapipe has no plane operations).

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
    x: &Tensor<Vector<F, N>>, // [m, k], contiguous
    w: &Tensor<Vector<F, N>>, // [n, k], contiguous: the weight's [out, in]
    out: &mut Tensor<F>,      // [m, n], contiguous
    #[comptime] rows: usize,
    #[comptime] plane: bool,
    #[define(F, A)] _dtypes: [StorageType; 2],
) {
    let lane = UNIT_POS_X as usize;
    let slot = UNIT_POS_Y as usize;
    let group = CUBE_DIM_X as usize;
    let col = CUBE_POS_X as usize * CUBE_DIM_Y as usize + slot;
    let m = x.shape(0);
    let n = w.shape(0);
    let k_vectors = w.shape(1) / w.vector_size();

    // One scalar sum per row: vector sums for 16 rows held 128 registers a unit, too few units
    // then fit an SM to keep the loads in flight (a third of the bandwidth on an H100).
    let mut acc = Array::<A>::new(rows);
    #[unroll]
    for r in 0..rows {
        acc[r] = A::new(0.0);
    }
    if col < n {
        let steps = (k_vectors + group - 1 - lane) / group;
        for s in 0..steps {
            let i = lane + s * group;
            let wv = Vector::<A, N>::cast_from(w[col * k_vectors + i]);
            #[unroll]
            for r in 0..rows {
                if r < m {
                    let xv = Vector::<A, N>::cast_from(x[r * k_vectors + i]);
                    acc[r] += A::cast_from(Vector::vector_sum(xv * wv));
                }
            }
        }
    }

    if plane {
        #[unroll]
        for r in 0..rows {
            let total = plane_sum(acc[r]);
            if lane == 0 && col < n && r < m {
                out[r * n + col] = F::cast_from(total);
            }
        }
    } else {
        // One tree per output over its group's units; every unit reaches every barrier.
        let units = comptime!(GROUP * OUTPUTS_PER_CUBE);
        let mut sums = SharedMemory::<A>::new(rows * units);
        let unit = slot * group + lane;
        #[unroll]
        for r in 0..rows {
            sums[r * units + unit] = acc[r];
        }
        sync_cube();
        let mut half = group / 2;
        while half > 0 {
            if lane < half {
                #[unroll]
                for r in 0..rows {
                    sums[r * units + unit] = sums[r * units + unit] + sums[r * units + unit + half];
                }
            }
            sync_cube();
            half /= 2;
        }
        if lane == 0 && col < n {
            #[unroll]
            for r in 0..rows {
                if r < m {
                    out[r * n + col] = F::cast_from(sums[r * units + unit]);
                }
            }
        }
    }
}

/// Whether [`launch`] takes `x` `[m, k]` times the transpose of `w` `[n, k]`: at most
/// [`MAX_ROWS`] rows, both contiguous, and cubes enough on one axis.
pub(super) fn fits<R: CubeRuntime>(x: &CubeTensor<R>, w: &CubeTensor<R>) -> bool {
    let ([m, k], [n, wk]) = (dims(x), dims(w));
    let cubes = n.div_ceil(OUTPUTS_PER_CUBE);
    let max_cubes = x.client.properties().hardware.max_cube_count.0 as usize;
    let max_units = x.client.properties().hardware.max_cube_dim.0 as usize;
    (1..=MAX_ROWS).contains(&m)
        && k > 0
        && wk == k
        && n > 0
        && x.dtype == w.dtype
        && x.meta.strides[..] == [k, 1]
        && w.meta.strides[..] == [k, 1]
        && cubes <= max_cubes
        && GROUP * OUTPUTS_PER_CUBE <= max_units
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
    // The widest load the device optimises that divides a row (so every row's vectors start
    // on a boundary): 8 halves on CUDA, 4 on wgpu, whose shaders have no wider vectors.
    let vector = x
        .client
        .io_optimized_vector_sizes(dtype.size())
        .find(|v| k % v == 0)
        .unwrap_or(1);
    let props = x.client.properties();
    let plane = props.features.plane.contains(Plane::Ops)
        && props.hardware.plane_size_min as usize == GROUP
        && props.hardware.plane_size_max as usize == GROUP;
    projection_kernel::launch::<R>(
        &x.client,
        CubeCount::Static(n.div_ceil(OUTPUTS_PER_CUBE) as u32, 1, 1),
        CubeDim::new_2d(GROUP as u32, OUTPUTS_PER_CUBE as u32),
        vector,
        x.clone().into_tensor_arg(),
        w.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        m.next_power_of_two(),
        plane,
        [dtype.into(), DType::F32.into()],
    );
    out
}
