//! Choosing a burn backend at run time and calling generic code with it.

use kvb_model::backends::BackendKind;

/// Calls `$body` (a generic function call with turbofish `B`) on the backend chosen by `$kind`.
macro_rules! with_backend {
    ($kind:expr, |$b:ident, $dev:ident| $body:expr) => {{
        match $kind {
            #[cfg(feature = "ndarray")]
            kvb_model::backends::BackendKind::Cpu => {
                type $b = kvb_model::backends::Cpu;
                let $dev = Default::default();
                $body
            }
            #[cfg(feature = "wgpu")]
            kvb_model::backends::BackendKind::Wgpu => {
                type $b = kvb_model::backends::Wgpu;
                let $dev = burn::backend::wgpu::WgpuDevice::default();
                $body
            }
            #[cfg(feature = "cuda")]
            kvb_model::backends::BackendKind::Cuda => {
                type $b = kvb_model::backends::Cuda;
                let $dev = burn::backend::cuda::CudaDevice::default();
                $body
            }
            #[allow(unreachable_patterns)]
            other => Err(anyhow::anyhow!(
                "backend {other:?} is not compiled into this build"
            )),
        }
    }};
}
pub(crate) use with_backend;

/// Makes sure `device` works before loading a model on it. GPU runtimes panic when their driver
/// is missing (cudarc, wgpu without an adapter); that becomes an error with a hint instead.
pub fn probe_device<B: burn::tensor::backend::Backend>(
    device: &B::Device,
    kind: BackendKind,
) -> anyhow::Result<()> {
    let previous = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let dev = device.clone();
    // The runtime's state after a failed start is never used again: the process reports and exits.
    let ok = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
        burn::tensor::Tensor::<B, 1>::zeros([1], &dev).into_data();
    }));
    std::panic::set_hook(previous);
    ok.map_err(|_| {
        let hint = match kind {
            BackendKind::Cuda => "no usable CUDA driver (libcuda.so) or GPU was found",
            BackendKind::Wgpu => "no usable wgpu adapter was found (on a machine without a GPU, install Mesa's lavapipe: apt-get install mesa-vulkan-drivers)",
            BackendKind::Cpu => "the CPU backend failed to start",
        };
        anyhow::anyhow!("backend {kind:?} is not available: {hint}")
    })
}

/// Parses `--backend`.
pub fn parse_backend(s: &str) -> Result<BackendKind, String> {
    s.parse()
}
