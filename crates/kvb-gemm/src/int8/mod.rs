//! Products with 8-bit activations (`--activations q8`): the arithmetic llama.cpp runs on a
//! quantized model, for CPUs whose f32 multiply-adds are the bottleneck (many rows at once: a
//! prefill, or a decode step of many sequences).
//!
//! Each input row is quantized to signed 8-bit integers with one f32 scale per 32 values
//! ([`QuantizedRows`]); each 32-value block is multiplied with the weight's stored integers in
//! integer arithmetic (exact), and the block's integer sum is scaled back into the f32 output.
//! AVX-512 VNNI's `vpdpbusd` does 64 byte products per instruction where an f32 FMA does 16.
//! The cost is the activations' rounding (about 0.4% of a block's largest value); the weights
//! keep their stored values. Output therefore differs slightly from the f32 products', and a
//! cache key tells the two apart (kvb-engine's fingerprint).
//!
//! **A row's result does not depend on the rows beside it**, as with every kvb product. The
//! integer sums are exact in any order; the float steps per output are fixed: starting from
//! zero, for each block `b` in order,
//! `y = fma(isum_b as f32, scale_b * dx_b, y)`, then, for weights with offsets (Q4_1),
//! `y = fma(offset_b, sx_b, y)`, where `dx_b` is the row's block scale and `sx_b` is `dx_b`
//! times the sum of the row's block integers. The vector kernels (AVX-512 VNNI in [`avx512`],
//! AVX2 in [`avx2`]) and the portable loop ([`products`]) compute exactly these, so they give
//! the same bits, and a sequence decoded in a batch of 16 gets what it gets alone (`tests`).
//! Where Intel AMX runs ([`crate::CpuFeatures::amx_int8`]), 16 rows by K-quant cells with
//! sub-blocks of 32 rows take tile products for the integer sums (`kcells_amx`), then the
//! same float steps.
//!
//! Weights: every [`crate::packed::PackedMatrix`] of integer cells of 32 rows (Q4_0, Q4_1, Q8_0,
//! and `--weights q8_0`), re-laid out for `vpdpbusd` ([`IntDotMatrix`]), and K-quant cells
//! (Q2_K to Q6_K, IQ4_XS) at the file's bits ([`kcells`]): Q4_K's, Q5_K's, Q6_K's and IQ4_XS's
//! with their rows' bits moved into `vpdpbusd`'s order at load
//! ([`crate::packed::CellOrder::Dot`], the same bytes), Q2_K's and Q3_K's as loaded. Others
//! (16-bit floats, f32) keep the f32 products.

mod kcells;
mod matrix;
mod products;
mod rows;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod kcells_amx;
#[cfg(target_arch = "x86_64")]
mod kcells_x86;

pub use matrix::IntDotMatrix;
pub use products::{kernel_name, matmul};
pub use rows::QuantizedRows;

/// Values per activation block and per weight block (ggml's block of 32).
pub const BLOCK: usize = 32;
/// Output columns per group: one 16-lane vector of i32 sums.
pub const LANES: usize = 16;

#[cfg(test)]
mod tests;
