//! The concrete burn backends enabled by cargo features. Model code is generic over
//! `B: Backend`; these aliases only let binaries and tests name one.

use crate::FloatDtype;

/// The CPU backend (burn-ndarray), feature `ndarray` (default).
#[cfg(feature = "ndarray")]
pub type Cpu = burn::backend::NdArray<f32>;

/// Any GPU through wgpu (Vulkan, Metal, DX12; Mesa's lavapipe on a CPU), feature `wgpu`.
#[cfg(feature = "wgpu")]
pub type Wgpu = burn::backend::Wgpu<f32, i32>;

/// wgpu holding weights, activations and K/V in f16 (`--dtype f16`), feature `wgpu`. The
/// kernels of kvb-attn and kvb-model compute in f32 and round once when they write.
#[cfg(feature = "wgpu")]
pub type WgpuF16 = burn::backend::Wgpu<half::f16, i32>;

/// NVIDIA GPUs through CUDA (kernels compiled at run time by NVRTC), feature `cuda`.
#[cfg(feature = "cuda")]
pub type Cuda = burn::backend::Cuda<f32, i32>;

/// CUDA in f16 (`--dtype f16`), feature `cuda`.
#[cfg(feature = "cuda")]
pub type CudaF16 = burn::backend::Cuda<half::f16, i32>;

/// CUDA in bf16 (`--dtype bf16`), feature `cuda`.
#[cfg(feature = "cuda")]
pub type CudaBf16 = burn::backend::Cuda<half::bf16, i32>;

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

impl BackendKind {
    /// Whether this backend can hold and compute in `dtype`, with the reason when not.
    pub fn check_dtype(self, dtype: FloatDtype) -> Result<(), String> {
        match (self, dtype) {
            (_, FloatDtype::F32) | (BackendKind::Wgpu | BackendKind::Cuda, FloatDtype::F16) => {
                Ok(())
            }
            (BackendKind::Cuda, FloatDtype::Bf16) => Ok(()),
            (BackendKind::Wgpu, FloatDtype::Bf16) => Err(
                "--dtype bf16 needs CUDA: WGSL has no bf16 type (use --dtype f16 on wgpu)".into(),
            ),
            (BackendKind::Cpu, _) => Err(format!(
                "--dtype {dtype} is for the GPU backends: the CPU backend computes in f32 \
                 (for less memory on the CPU use --weights bf16 or q8_0 and --pool-dtype f16)"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_backend_takes_the_dtypes_it_has() {
        assert!(BackendKind::Cpu.check_dtype(FloatDtype::F32).is_ok());
        assert!(BackendKind::Cpu.check_dtype(FloatDtype::F16).is_err());
        assert!(BackendKind::Wgpu.check_dtype(FloatDtype::F16).is_ok());
        assert!(BackendKind::Wgpu.check_dtype(FloatDtype::Bf16).is_err());
        assert!(BackendKind::Cuda.check_dtype(FloatDtype::Bf16).is_ok());
    }
}
