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
//! No tensors, no burn: slices and a micro-kernel (6 x 16 with AVX2+FMA, 12 x 32 with AVX-512,
//! portable elsewhere).

pub mod blocked;
mod kernel;
pub mod strided;

pub use blocked::{matmul, DenseWeight, WeightPanels};
pub use kernel::{MR, NR};

/// The reduction block: the `kc` of matrixmultiply's sgemm (`S_KC` in its
/// `archparam_defaults.rs`), so products here and there round alike.
pub const KC: usize = 256;

/// The vector instructions this crate's kernels use, from the CPU's features (detected once at
/// run time). All of them sum every output in the same order, so they give the same bits except
/// [`Isa::Portable`], which rounds products and sums separately as non-FMA CPUs must.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Isa {
    /// Plain loops, separate multiplies and adds.
    Portable,
    /// AVX2 with fused multiply-adds: 8 lanes.
    Avx2Fma,
    /// AVX-512F: 16 lanes, 32 registers (a 12 x 32 output block in registers).
    Avx512,
}

impl Isa {
    /// The widest set this CPU runs, capped by `KVB_CPU_ISA` (`avx2` or `portable`) so that one
    /// machine can measure the narrower paths beside the wider one.
    pub fn detect() -> Isa {
        let cap = match std::env::var("KVB_CPU_ISA").as_deref() {
            Ok("portable") => Isa::Portable,
            Ok("avx2") => Isa::Avx2Fma,
            Ok("avx512") | Err(_) => Isa::Avx512,
            Ok(other) => {
                // Read once per process, where no caller can take an error: say it and go on
                // with what the CPU has, rather than run a path the user did not ask for silently.
                eprintln!(
                    "kvb: KVB_CPU_ISA={other:?} is not one of portable, avx2, avx512; ignoring it"
                );
                Isa::Avx512
            }
        };
        Isa::supported()
            .into_iter()
            .filter(|i| *i <= cap)
            .max()
            .unwrap_or(Isa::Portable)
    }

    /// Every set this CPU runs, narrowest first (tests compare them).
    pub fn supported() -> Vec<Isa> {
        let mut all = vec![Isa::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            use std::arch::is_x86_feature_detected as has;
            if has!("avx2") && has!("fma") {
                all.push(Isa::Avx2Fma);
                if has!("avx512f") {
                    all.push(Isa::Avx512);
                }
            }
        }
        all
    }
}

/// The set [`Isa::detect`] found, once per process, so that every product rounds alike.
pub fn isa() -> Isa {
    static ISA: std::sync::OnceLock<Isa> = std::sync::OnceLock::new();
    *ISA.get_or_init(Isa::detect)
}

/// Whether products here use fused multiply-adds (AVX2 and FMA, or wider), as matrixmultiply's
/// FMA kernel does on the same CPU; elsewhere they round twice, as its other kernels do.
pub fn has_fma() -> bool {
    isa() >= Isa::Avx2Fma
}
