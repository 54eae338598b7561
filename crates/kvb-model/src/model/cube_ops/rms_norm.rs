//! RMSNorm of each row in one launch: a cube per row sums its squares in a tree in shared
//! memory, then scales the row by the weight. The sum and the scale are f32 (`A`) whatever the
//! tensors hold: a half-precision row of a few hundred values in the tens overflows f16's range
//! when squared and summed.

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
    let inv = A::new(1.0) / A::sqrt(mean + eps.get::<A>());

    for s in 0..steps {
        let e = unit + s * units;
        out[row * out.stride(0) + e] = F::cast_from(
            A::cast_from(x[base + e * x.stride(1)])
                * inv
                * A::cast_from(weight[e * weight.stride(1)]),
        );
    }
}

/// `x` `[n, h]` (n, h > 0) divided by its rows' root mean square, times `weight` `[1, h]`.
pub(super) fn launch<R: CubeRuntime>(
    x: CubeTensor<R>,
    weight: CubeTensor<R>,
    eps: f32,
) -> CubeTensor<R> {
    let [n, h] = [x.meta.shape[0], x.meta.shape[1]];
    let dtype = x.dtype;
    let units = UNITS.min(x.client.properties().hardware.max_cube_dim.0 as usize);
    // The tree halves the units: keep a power of two.
    let units = 1usize << units.ilog2();
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
