//! CPU matrix products for kvb's forward pass and attention, with one promise above speed:
//! **a row's result does not depend on the rows computed beside it.** A sequence prefilled alone,
//! batched with others, or in slices of any size gets the same bits, which is what lets exact
//! K/V reuse give greedy output identical to a full prefill.
//!
//! Every product here sums each output over the reduction in blocks of [`KC`] (256) values: a
//! block is summed from zero by multiply-adds in order (fused where the CPU has FMA, see
//! [`has_fma`]), and the block sums are added to the output in order. matrixmultiply's sgemm (what
//! burn-ndarray runs) rounds exactly so, and kvb-model's few-row kernels follow the same rule.
//!
//! - [`blocked`]: `y = x · w` for many rows, parallel, with the weight expanded block by block
//!   from any form ([`WeightPanels`]: f32 rows, packed quantized cells).
//! - [`strided`]: a product on the calling thread over strided views, for attention tiles.
//!
//! No tensors, no burn: slices and a micro-kernel (6 x 16 with AVX2+FMA, portable elsewhere).

pub mod blocked;
mod kernel;
pub mod strided;

pub use blocked::{matmul, DenseWeight, WeightPanels};
pub use kernel::{MR, NR};

/// The reduction block: the `kc` of matrixmultiply's sgemm (`S_KC` in its
/// `archparam_defaults.rs`), so products here and there round alike.
pub const KC: usize = 256;

/// Whether products here use fused multiply-adds (AVX2 and FMA, detected once at run time), as
/// matrixmultiply's FMA kernel does on the same CPU; elsewhere they round twice, as its other
/// kernels do.
pub fn has_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        static FMA: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *FMA.get_or_init(|| {
            std::arch::is_x86_feature_detected!("fma")
                && std::arch::is_x86_feature_detected!("avx2")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}
