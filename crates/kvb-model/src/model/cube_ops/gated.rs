//! The gated MLP's middle, `act(gate) * up`, in one launch: a unit per output value, computed
//! in f32 (`A`) whatever the tensors hold (f16's exponential overflows at 11).

use crate::config::Activation;
use burn::tensor::DType;
use burn_cubecl::ops::numeric::empty_device_contiguous_dtype;
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::CubeRuntime;
use cubecl::prelude::*;

/// Units per cube.
const UNITS: u32 = 256;

/// Cubes along one axis of a launch, at most.
const MAX_CUBES_PER_AXIS: usize = 65_535;

/// The activations the kernel computes (GELU with erf stays on burn's ops).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kind {
    /// `x * sigmoid(x)`.
    Silu,
    /// `0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3)))`.
    GeluTanh,
}

impl Kind {
    pub fn of(act: Activation) -> Option<Kind> {
        match act {
            Activation::Silu => Some(Kind::Silu),
            Activation::GeluTanh => Some(Kind::GeluTanh),
            Activation::Gelu => None,
        }
    }
}

#[cube(launch)]
fn gated_kernel<F: Float, A: Float>(
    gu: &Tensor<F>,      // [n, 2 i], gate then up, any strides
    out: &mut Tensor<F>, // [n, i], contiguous
    #[comptime] gelu_tanh: bool,
    #[define(F, A)] _dtypes: [StorageType; 2],
) {
    let i = out.shape(1);
    let pos = ABSOLUTE_POS;
    if pos < out.shape(0) * i {
        let r = pos / i;
        let c = pos % i;
        let g = A::cast_from(gu[r * gu.stride(0) + c * gu.stride(1)]);
        let up = A::cast_from(gu[r * gu.stride(0) + (c + i) * gu.stride(1)]);
        // SiLU, unless the comptime flag asks for GELU's tanh form.
        let mut a = g / (A::new(1.0) + A::exp(-g));
        if gelu_tanh {
            let inner = A::new(0.797_884_6) * (g + A::new(0.044715) * g * g * g);
            a = A::new(0.5) * g * (A::new(1.0) + A::tanh(inner));
        }
        out[pos] = F::cast_from(a * up);
    }
}

/// `act(gate) * up` `[n, i]` of `gu` `[n, 2 i]` (n, i > 0).
pub(super) fn launch<R: CubeRuntime>(gu: CubeTensor<R>, kind: Kind) -> CubeTensor<R> {
    let [n, two_i] = [gu.meta.shape[0], gu.meta.shape[1]];
    let i = two_i / 2;
    let dtype = gu.dtype;
    let out = empty_device_contiguous_dtype::<R>(
        gu.client.clone(),
        gu.device.clone(),
        vec![n, i].into(),
        dtype,
    );
    // A grid of at most 65,535 cubes per axis (WebGPU's limit); units past the end do nothing.
    let cubes = (n * i).div_ceil(UNITS as usize);
    let x = cubes.min(MAX_CUBES_PER_AXIS);
    gated_kernel::launch::<R>(
        &gu.client,
        CubeCount::Static(x as u32, cubes.div_ceil(x) as u32, 1),
        CubeDim::new_1d(UNITS),
        gu.clone().into_tensor_arg(),
        out.clone().into_tensor_arg(),
        kind == Kind::GeluTanh,
        [dtype.into(), DType::F32.into()],
    );
    out
}
