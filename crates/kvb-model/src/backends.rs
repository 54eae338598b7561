//! The concrete burn backends enabled by cargo features. Model code is generic over
//! `B: Backend`; these aliases only let binaries and tests name one.

/// The CPU backend (burn-ndarray), feature `ndarray` (default).
#[cfg(feature = "ndarray")]
pub type Cpu = burn::backend::NdArray<f32>;

/// Any GPU through wgpu (Vulkan, Metal, DX12; Mesa's lavapipe on a CPU), feature `wgpu`.
#[cfg(feature = "wgpu")]
pub type Wgpu = burn::backend::Wgpu<f32, i32>;

/// NVIDIA GPUs through CUDA (kernels compiled at run time by NVRTC), feature `cuda`.
#[cfg(feature = "cuda")]
pub type Cuda = burn::backend::Cuda<f32, i32>;

/// A backend chosen at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    /// burn-ndarray on the CPU.
    Cpu,
    /// wgpu.
    Wgpu,
    /// CUDA.
    Cuda,
}

impl BackendKind {
    /// The backends this build was compiled with.
    pub fn available() -> Vec<BackendKind> {
        let mut v = Vec::new();
        if cfg!(feature = "ndarray") {
            v.push(BackendKind::Cpu);
        }
        if cfg!(feature = "wgpu") {
            v.push(BackendKind::Wgpu);
        }
        if cfg!(feature = "cuda") {
            v.push(BackendKind::Cuda);
        }
        v
    }
}

impl std::str::FromStr for BackendKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let kind = match s.to_ascii_lowercase().as_str() {
            "cpu" | "ndarray" => BackendKind::Cpu,
            "wgpu" | "vulkan" | "metal" => BackendKind::Wgpu,
            "cuda" => BackendKind::Cuda,
            other => return Err(format!("unknown backend `{other}` (cpu, wgpu, cuda)")),
        };
        if !Self::available().contains(&kind) {
            return Err(format!(
                "backend `{s}` is not compiled in; rebuild with `--features {}`",
                match kind {
                    BackendKind::Cpu => "ndarray",
                    BackendKind::Wgpu => "wgpu",
                    BackendKind::Cuda => "cuda",
                }
            ));
        }
        Ok(kind)
    }
}
