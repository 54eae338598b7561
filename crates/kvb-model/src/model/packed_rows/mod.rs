//! Products of a few rows (a decode step: 1 to 4) by a packed weight, dequantizing in
//! registers: each weight is loaded once at its stored size, widened, converted and scaled in
//! a vector register, and multiplied into every row's accumulators, never written back out as
//! f32. (Expanding a task's columns into a scratch first, as [`kvb_gemm`] does for many
//! rows, took 70% of a SmolLM2 decode step.)
//!
//! **The same bits as the f32 kernels.** Per output column the reduction runs in row order,
//! summed from zero in blocks of [`KC`] rows, the block sums added to the output in order:
//! exactly [`super::few_rows`]'s (and matrixmultiply's) sums over the same f32 values
//! (`cpu_ops::tests::packed_products_equal_the_f32_products_bit_for_bit`).
//!
//! Two kernels: [`avx2`] (8 lanes, one group of columns per register) and, where the CPU has
//! AVX-512, [`avx512`] (16 lanes, two groups per register), which compute the same bits.

use super::few_rows::{in_column_ranges, KC};
#[cfg(target_arch = "x86_64")]
use crate::packed::widen_floats;
use crate::packed::{CellValues, PackedMatrix, GROUP, HEAD_BYTES};

/// At most this many rows take the fused kernel.
pub const MAX_ROWS: usize = 4;

/// `y [m, n] = x [m, k] · w`, or `None` where the CPU lacks AVX2 and FMA or `m` is above
/// [`MAX_ROWS`] (the caller then takes the general path).
pub fn matmul(x: &[f32], m: usize, w: &PackedMatrix) -> Option<Vec<f32>> {
    matmul_with(kvb_gemm::isa(), x, m, w)
}

/// [`matmul`] with the kernels of `isa` (one this CPU runs).
fn matmul_with(isa: kvb_gemm::Isa, x: &[f32], m: usize, w: &PackedMatrix) -> Option<Vec<f32>> {
    #[cfg(target_arch = "x86_64")]
    {
        let fits =
            (1..=MAX_ROWS).contains(&m) && KC.is_multiple_of(w.cell_rows()) && x.len() >= m * w.k();
        if !fits || isa < kvb_gemm::Isa::Avx2Fma || !w.cell_values().vectorised() {
            return None;
        }
        let wide = isa == kvb_gemm::Isa::Avx512;
        // Several tasks per thread so that uneven cores even out, whole groups each (whole
        // pairs of groups for the 16-lane kernel).
        let unit = if wide { 2 * GROUP } else { GROUP };
        let tasks = 4 * rayon::current_num_threads();
        let per_task = w.n().div_ceil(unit).div_ceil(tasks).max(1);
        Some(in_column_ranges(
            m,
            w.n(),
            per_task * unit,
            |j0, cols, tile| {
                // SAFETY: AVX-512F, or AVX2, FMA and F16C, are present (checked above); `x` holds
                // m rows of k; the tile holds m rows of `cols` (see `columns`).
                unsafe {
                    if wide {
                        avx512::columns(x, m, w, j0, cols, tile)
                    } else {
                        avx2::columns(x, m, w, j0, cols, tile)
                    }
                }
            },
        ))
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, x, m, w);
        None
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

#[cfg(test)]
mod tests {
    use super::super::test_values::{packed_matrix, spread};
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        /// Every kernel this CPU runs gives the bits of the f32 product over the expanded
        /// weight, for every format, row count and width (odd group counts included).
        #[test]
        fn each_kernel_gives_the_f32_products_bits(
            m in 1usize..=MAX_ROWS, blocks_per_row in 1usize..20, n in 1usize..300,
            format in 0usize..5, seed in 0u32..1000,
        ) {
            let (packed, k) = packed_matrix(format, blocks_per_row, n, seed);
            let x: Vec<f32> = (0..m * k).map(|i| spread(i, seed, 700.0)).collect();
            let want = super::super::few_rows::matmul(&x, &packed.to_dense(), m, k, n);
            for isa in kvb_gemm::Isa::supported() {
                let Some(got) = matmul_with(isa, &x, m, &packed) else {
                    prop_assert!(isa < kvb_gemm::Isa::Avx2Fma, "{:?} declined", isa);
                    continue;
                };
                for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                    prop_assert_eq!(g.to_bits(), e.to_bits(), "{:?}, element {} of [{}, {}]", isa, i, m, n);
                }
            }
        }
    }
}
