//! kvb's CPU kernels: matrix products on host slices, with one promise above speed: **a row's
//! result does not depend on the rows computed beside it.** A sequence prefilled alone, batched
//! with others, or in slices of any size gets the same bits, which is what lets exact K/V reuse
//! give greedy output identical to a full prefill.
//!
//! Every f32 product here sums each output over the reduction in blocks of [`KC`] (256) values:
//! a block is summed from zero by multiply-adds in order (fused where the CPU has FMA, see
//! [`has_fma`]), and the block sums are added to the output in order. matrixmultiply's sgemm
//! (what burn-ndarray runs) rounds exactly so.
//!
//! - [`blocked`]: `y = x · w` for many rows, parallel, with the weight expanded block by block
//!   from any form ([`WeightPanels`]: f32 rows, packed quantized cells).
//! - [`few_rows`]: 1 to a few dozen rows by an f32 weight, streaming it once.
//! - [`packed`]: weights kept at their file's bits ([`packed::PackedMatrix`], from GGUF blocks
//!   read by `kvb-modelfile`), and [`packed_rows`]: 1 to 16 rows by them (Q2_K and Q3_K: 1 to 8,
//!   AVX2's kernel), dequantized in registers, the same bits as the f32 products over the
//!   expanded weight.
//! - [`int8`]: 8-bit activations by integer weights (VNNI, AMX tiles, AVX2, portable: the same
//!   bits); the K-quants with nibbles re-laid in the dot products' order ([`packed::CellOrder`],
//!   the same bytes; `packed::kcells_order`'s tests and `int8`'s
//!   `kernels_give_the_definitions_bits`).
//! - [`strided`]: a product on the calling thread over strided views, for attention tiles.
//! - `column_tasks`: which thread computes which columns of a product (each writes its own
//!   columns in place; in shares that shrink towards the end, for the short decode products).
//! - [`cpu`]: what the CPU offers, detected once for all of these and kvb-attn's kernels
//!   (`KVB_CPU_ISA` caps it to measure narrower paths).
//!
//! No tensors, no burn: slices and micro-kernels (AVX2+FMA, AVX-512, portable elsewhere).
//! Promises proved by each module's tests (bit-for-bit against matrixmultiply and against the
//! f32 expansion of every packed format, on every kernel this CPU runs); packed blocks read back
//! as llama.cpp's own Python package dequantizes them (`tests/gguf_blocks.rs`).

mod amx;
pub mod blocked;
mod column_tasks;
pub mod cpu;
pub mod few_rows;
pub mod int8;
mod kernel;
pub mod packed;
pub mod packed_rows;
pub mod strided;
#[doc(hidden)]
pub mod test_values;
mod tile;

pub use blocked::{matmul, DenseWeight, WeightPanels};
pub use cpu::{cpu, isa, CpuFeatures, Isa};

/// The README's example, run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
pub use kernel::{MR, NR};

/// The reduction block: the `kc` of matrixmultiply's sgemm (`S_KC` in its
/// `archparam_defaults.rs`), so products here and there round alike.
pub const KC: usize = 256;

/// Whether products here use fused multiply-adds (AVX2 and FMA, or wider), as matrixmultiply's
/// FMA kernel does on the same CPU; elsewhere they round twice, as its other kernels do.
pub fn has_fma() -> bool {
    isa() >= Isa::Avx2Fma
}
