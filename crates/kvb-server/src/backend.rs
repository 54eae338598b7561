//! Choosing a burn backend at run time and calling generic code with it.

use kvb_model::{backends::BackendKind, FloatDtype};

/// Calls `$body` (a generic function call with turbofish `B`) on the backend chosen by `$kind`
/// holding its floats in `$dtype`. Each pair is one instantiation of the generic stack.
macro_rules! with_backend {
    ($kind:expr, $dtype:expr, |$b:ident, $dev:ident| $body:expr) => {{
        use kvb_model::{backends::BackendKind, FloatDtype};
        let (kind, dtype): (BackendKind, FloatDtype) = ($kind, $dtype);
        match (kind, dtype) {
            #[cfg(feature = "ndarray")]
            (BackendKind::Cpu, FloatDtype::F32) => {
                type $b = kvb_model::backends::Cpu;
                let $dev = Default::default();
                $body
            }
            #[cfg(feature = "wgpu")]
            (BackendKind::Wgpu, FloatDtype::F32) => {
                type $b = kvb_model::backends::Wgpu;
                let $dev = burn::backend::wgpu::WgpuDevice::default();
                $body
            }
            #[cfg(feature = "wgpu")]
            (BackendKind::Wgpu, FloatDtype::F16) => {
                type $b = kvb_model::backends::WgpuF16;
                let $dev = burn::backend::wgpu::WgpuDevice::default();
                $body
            }
            #[cfg(feature = "cuda")]
            (BackendKind::Cuda, FloatDtype::F32) => {
                type $b = kvb_model::backends::Cuda;
                let $dev = burn::backend::cuda::CudaDevice::default();
                $body
            }
            #[cfg(feature = "cuda")]
            (BackendKind::Cuda, FloatDtype::F16) => {
                type $b = kvb_model::backends::CudaF16;
                let $dev = burn::backend::cuda::CudaDevice::default();
                $body
            }
            #[cfg(feature = "cuda")]
            (BackendKind::Cuda, FloatDtype::Bf16) => {
                type $b = kvb_model::backends::CudaBf16;
                let $dev = burn::backend::cuda::CudaDevice::default();
                $body
            }
            #[allow(unreachable_patterns)]
            (kind, dtype) => Err(match kind.check_dtype(dtype) {
                Err(why) => anyhow::anyhow!(why),
                Ok(()) => anyhow::anyhow!("backend {kind:?} is not compiled into this build"),
            }),
        }
    }};
}
pub(crate) use with_backend;

/// Makes sure `device` works before loading a model on it. GPU runtimes panic when their driver
/// is missing (cudarc, wgpu without an adapter); that becomes an error with a hint instead.
pub fn probe_device<B: burn::tensor::backend::Backend>(
    device: &B::Device,
    kind: BackendKind,
    dtype: FloatDtype,
) -> anyhow::Result<()> {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let dev = device.clone();
    // The runtime's state after a failed start is never used again: the process reports and exits.
    let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        // An add, not only an allocation: it compiles a kernel in the backend's float type, which
        // fails here on an adapter without it (f16 needs wgpu's `shader-f16`).
        (burn::tensor::Tensor::<B, 1>::zeros([1], kvb_model::float_on::<B>(&dev)) + 1.0)
            .into_data();
    }));
    std::panic::set_hook(previous);
    ok.map_err(|_| {
        let hint = match kind {
            BackendKind::Cuda => "no usable CUDA driver (libcuda.so) or GPU was found",
            BackendKind::Wgpu => "no usable wgpu adapter was found (on a machine without a GPU, install Mesa's lavapipe: apt-get install mesa-vulkan-drivers)",
            BackendKind::Cpu => "the CPU backend failed to start",
        };
        if dtype == FloatDtype::F32 {
            anyhow::anyhow!("backend {kind:?} is not available: {hint}")
        } else {
            anyhow::anyhow!(
                "backend {kind:?} is not available in {dtype}: {hint}, or the device has no \
                 {dtype} arithmetic (try --dtype f32)"
            )
        }
    })
}

/// Parses `--backend`.
pub fn parse_backend(s: &str) -> Result<BackendKind, String> {
    s.parse()
}
