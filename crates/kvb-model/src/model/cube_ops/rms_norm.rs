//! RMSNorm of each row in one launch: a cube per row sums its squares in a tree in shared
//! memory, then scales the row by the weight. The sum and the scale are f32 (`A`) whatever the
//! tensors hold: a half-precision row of a few hundred values in the tens overflows f16's range
//! when squared and summed. The residual form adds a sublayer's output to the stream first and
//! writes both the new stream and its norm, so the add is no launch of its own.

use burn::tensor::DType;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;

/// Units per cube (a power of two, for the tree): a row of a few hundred to a few thousand
/// values gives each unit a handful.
const UNITS: usize = 128;

#[cube(launch)]
fn rms_norm_kernel<F: Float, A: Float>(
    x: &Tensor<F>,       // [n, h], any strides
    weight: &Tensor<F>,  // [1, h]
    out: &mut Tensor<F>, // [n, h], contiguous
    eps: InputScalar,
    #[comptime] units: usize,
    #[define(F, A)] _dtypes: [StorageType; 2],
) {
    let row = CUBE_POS_X as usize;
    let unit = UNIT_POS_X as usize;
    let h = x.shape(1);
    let base = row * x.stride(0);

    // Unit `unit` takes values unit, unit + units, ...
    let steps = (h + units - 1 - unit) / units;
    let mut partial = A::new(0.0);
    for s in 0..steps {
        let v = A::cast_from(x[base + (unit + s * units) * x.stride(1)]);
        partial += v * v;
    }
    let inv = inverse_rms::<A>(partial, h, eps.get::<A>(), units);

    for s in 0..steps {
        let e = unit + s * units;
        out[row * out.stride(0) + e] = F::cast_from(
            A::cast_from(x[base + e * x.stride(1)])
                * inv
                * A::cast_from(weight[e * weight.stride(1)]),
        );
    }
}

/// `1 / sqrt(mean + eps)` of a row whose units hold `partial` sums of squares of its `h` values.
#[cube]
fn inverse_rms<A: Float>(partial: A, h: usize, eps: A, #[comptime] units: usize) -> A {
    let unit = UNIT_POS_X as usize;
    let mut sums = SharedMemory::<A>::new(units);
    sums[unit] = partial;
    sync_cube();
    // A runtime count (the cube's units): a `let mut` copy of a comptime value stays a constant
    // that cannot be halved.
    let mut half = CUBE_DIM_X as usize / 2;
    while half > 0 {
        if unit < half {
            sums[unit] = sums[unit] + sums[unit + half];
        }
        sync_cube();
        half /= 2;
    }
    let mean = sums[0] / A::cast_from(h as u32);
    A::new(1.0) / A::sqrt(mean + eps)
}

/// `sum = x + delta` rounded to `F` (as the separate add would), then RMSNorm of `sum`.
#[cube(launch)]
fn add_rms_norm_kernel<F: Float, A: Float>(
    x: &Tensor<F>,          // [n, h], any strides
    delta: &Tensor<F>,      // [n, h], any strides
    weight: &Tensor<F>,     // [1, h]
    sum: &mut Tensor<F>,    // [n, h], contiguous
    normed: &mut Tensor<F>, // [n, h], contiguous
    eps: InputScalar,
    #[comptime] units: usize,
    #[define(F, A)] _dtypes: [StorageType; 2],
) {
    let row = CUBE_POS_X as usize;
    let unit = UNIT_POS_X as usize;
    let h = x.shape(1);
    let steps = (h + units - 1 - unit) / units;
    let mut partial = A::new(0.0);
    for s in 0..steps {
        let e = unit + s * units;
        let v = F::cast_from(
            A::cast_from(x[row * x.stride(0) + e * x.stride(1)])
                + A::cast_from(delta[row * delta.stride(0) + e * delta.stride(1)]),
        );
        sum[row * sum.stride(0) + e] = v;
        let v = A::cast_from(v);
        partial += v * v;
    }
    let inv = inverse_rms::<A>(partial, h, eps.get::<A>(), units);
    // Each unit reads back only the values it wrote.
    for s in 0..steps {
        let e = unit + s * units;
        normed[row * normed.stride(0) + e] = F::cast_from(
            A::cast_from(sum[row * sum.stride(0) + e])
                * inv
                * A::cast_from(weight[e * weight.stride(1)]),
        );
    }
}

/// Units of a row's cube on `x`'s device: a power of two, since the tree halves them.
fn units_per_row<R: CubeRuntime>(x: &CubeTensor<R>) -> usize {
    1usize
        << UNITS
            .min(x.client.properties().hardware.max_cube_dim.0 as usize)
            .ilog2()
}

/// `x` `[n, h]` (n, h > 0) divided by its rows' root mean square, times `weight` `[1, h]`.
pub(super) fn launch<R: CubeRuntime>(
    x: CubeTensor<R>,
    weight: CubeTensor<R>,
    eps: f32,
) -> CubeTensor<R> {
    let [n, h] = [x.meta.shape[0], x.meta.shape[1]];
    let dtype = x.dtype;
    let units = units_per_row(&x);
    let out = empty_device_contiguous_dtype::<R>(
        x.client.clone(),
        x.device.clone(),
        vec![n, h].into(),
        dtype,
    );
    rms_norm_kernel::launch::<R>(
        &x.client,
        CubeCount::Static(n as u32, 1, 1),
        CubeDim::new_1d(units as u32),
        x.clone().into_tensor_arg(),
        weight.into_tensor_arg(),
        out.clone().into_tensor_arg(),
        InputScalar::new(eps, DType::F32),
        units,
        [dtype.into(), DType::F32.into()],
    );
    out
}

/// `x + delta` (`[n, h]`, n, h > 0) and its RMSNorm with `weight` `[1, h]`.
pub(super) fn launch_residual<R: CubeRuntime>(
    x: CubeTensor<R>,
    delta: CubeTensor<R>,
    weight: CubeTensor<R>,
    eps: f32,
) -> [CubeTensor<R>; 2] {
    let [n, h] = [x.meta.shape[0], x.meta.shape[1]];
    let dtype = x.dtype;
    let units = units_per_row(&x);
    let out = || {
        empty_device_contiguous_dtype::<R>(
            x.client.clone(),
            x.device.clone(),
            vec![n, h].into(),
            dtype,
        )
    };
    let (sum, normed) = (out(), out());
    add_rms_norm_kernel::launch::<R>(
        &x.client,
        CubeCount::Static(n as u32, 1, 1),
        CubeDim::new_1d(units as u32),
        x.clone().into_tensor_arg(),
        delta.into_tensor_arg(),
        weight.into_tensor_arg(),
        sum.clone().into_tensor_arg(),
        normed.clone().into_tensor_arg(),
        InputScalar::new(eps, DType::F32),
        units,
        [dtype.into(), DType::F32.into()],
    );
    [sum, normed]
}
