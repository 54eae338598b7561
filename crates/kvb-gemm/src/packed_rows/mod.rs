//! Products of a few rows (a decode step of up to 16 sequences) by a packed weight, dequantizing in
//! registers: each weight is loaded once at its stored size, widened, converted and scaled in
//! a vector register, and multiplied into every row's accumulators, never written back out as
//! f32. (Expanding a task's columns into a scratch first, as [`crate::blocked`] does for many
//! rows, took 70% of a SmolLM2 decode step.)
//!
//! **The same bits as the f32 kernels.** Per output column the reduction runs in row order,
//! summed from zero in blocks of [`KC`] rows, the block sums added to the output in order:
//! exactly [`crate::few_rows`]'s (and matrixmultiply's) sums over the same f32 values
//! (`tests` below; kvb-model's `cpu_ops::tests::packed_products_equal_the_f32_products_bit_for_bit`).
//!
//! Two kernels: [`avx2`] (8 lanes, one group of columns per register) and, where the CPU has
//! AVX-512, [`avx512`] (16 lanes, two groups per register), which compute the same bits.

use crate::column_tasks::in_column_shares;
use crate::few_rows::KC;
#[cfg(target_arch = "x86_64")]
use crate::packed::widen_floats;
use crate::packed::{CellValues, PackedMatrix, GROUP};
#[cfg(target_arch = "x86_64")]
use crate::tile::Tile;

/// `y [m, n] = x [m, k] · w`, or `None` where the CPU lacks AVX2 and FMA or `m` is above what
/// its kernel takes ([`Kernel::max_rows`]; the caller then takes the general path).
pub fn matmul(x: &[f32], m: usize, w: &PackedMatrix) -> Option<Vec<f32>> {
    matmul_with(crate::isa(), x, m, w)
}

/// [`matmul`] with the kernels of `isa` (one this CPU runs).
fn matmul_with(isa: crate::Isa, x: &[f32], m: usize, w: &PackedMatrix) -> Option<Vec<f32>> {
    assert_eq!(
        w.order(),
        crate::packed::CellOrder::Rows,
        "f32 products of {}: its cells are in the 8-bit products' order",
        w.source()
    );
    #[cfg(target_arch = "x86_64")]
    {
        matmul_by(Kernel::of(isa)?, x, m, w)
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (isa, x, m, w);
        None
    }
}

/// [`matmul`] with `kernel` (one this CPU runs).
#[cfg(target_arch = "x86_64")]
fn matmul_by(kernel: Kernel, x: &[f32], m: usize, w: &PackedMatrix) -> Option<Vec<f32>> {
    {
        let kernel = kernel.for_values(w.cell_values());
        let fits = (1..=kernel.max_rows()).contains(&m)
            && KC.is_multiple_of(w.cell_rows())
            && x.len() >= m * w.k();
        if !fits || !w.cell_values().vectorised() {
            return None;
        }
        // Whole sets of the kernel's widest pass: a narrower range would run narrower sets.
        let unit = kernel.most_units(m, w.cell_values()) * kernel.unit_groups() * GROUP;
        let x = by_reduction_row(x, m, w.k());
        Some(in_column_shares(m, w.n(), unit, |j0, cols, tile| {
            // SAFETY: the kernel's instructions are present (`isa` is this CPU's); `x` holds k
            // reduction rows of m values; the tile holds m rows of `cols`.
            unsafe { columns(kernel, &x, m, w, j0, cols, tile) }
        }))
    }
}

/// The two kernels, by register width.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug)]
enum Kernel {
    /// AVX2, FMA and F16C: one group of 8 columns per register, 16 registers.
    Lanes8,
    /// AVX-512F: two groups side by side per register, 32 registers.
    Lanes16,
    /// [`Kernel::Lanes16`] with AVX-512 VBMI's byte permutes for Q5_K and Q6_K values.
    Lanes16Bytes,
}

#[cfg(target_arch = "x86_64")]
impl Kernel {
    /// `isa`'s kernel (none without AVX2 and FMA).
    fn of(isa: crate::Isa) -> Option<Kernel> {
        match isa {
            crate::Isa::Avx512 if crate::cpu().avx512vbmi => Some(Kernel::Lanes16Bytes),
            crate::Isa::Avx512 => Some(Kernel::Lanes16),
            crate::Isa::Avx2Fma => Some(Kernel::Lanes8),
            crate::Isa::Portable => None,
        }
    }

    /// The kernel that runs products over cells of `values` in place of this one: Q2_K's and
    /// Q3_K's cells have only the 8-lane kernel.
    fn for_values(self, values: CellValues) -> Kernel {
        if crate::packed::kcells::has_16_lanes(values) {
            self
        } else {
            Kernel::Lanes8
        }
    }

    /// Every kernel this CPU runs (tests compare them).
    #[cfg(test)]
    fn supported() -> Vec<Kernel> {
        let mut all: Vec<Kernel> = crate::Isa::supported()
            .into_iter()
            .filter_map(Kernel::of)
            .collect();
        if all.iter().any(|k| matches!(k, Kernel::Lanes16Bytes)) {
            all.push(Kernel::Lanes16);
        }
        all
    }

    /// The most rows the kernel takes: up to here dequantizing in registers costs less than
    /// expanding the weight into the blocked GEMM's panels (measured on Zen 5 with
    /// `model_speed`'s batched steps; the 8-lane kernel's chunks on Zen 4 capped by
    /// `KVB_CPU_ISA`: 1.1-1.4x the blocked GEMM at 8 rows, mixed at 9, slower from 10,
    /// bench/results/2026-12-06-avx2-rows-in-chunks).
    fn max_rows(self) -> usize {
        match self {
            Kernel::Lanes8 => 8,
            Kernel::Lanes16 | Kernel::Lanes16Bytes => 16,
        }
    }

    /// Groups of 8 columns per register.
    fn unit_groups(self) -> usize {
        match self {
            Kernel::Lanes8 => 1,
            Kernel::Lanes16 | Kernel::Lanes16Bytes => 2,
        }
    }

    /// The most units (registers of columns) one pass over `m` rows takes: each takes `m`
    /// accumulators, and they must fit in the registers beside the weights, scales and offsets.
    /// One row of 4-bit cells on 8 lanes takes 8, its scales and offsets read from memory
    /// ([`one_row::nibble_row`]): at 4 its products were no faster on 2 threads, at 8 they took
    /// a quarter to a third less time (bench/results/2026-12-06-avx2-nibble-row-zen4). From 2
    /// rows the 8-lane kernel forms weights into memory a chunk at a time and holds only the
    /// sums ([`avx2`]), so 2 rows take 4 units and 3 to 6 rows 2: each sum's chain of
    /// multiply-adds waits 4 cycles a reduction row, and fewer chains left the FMA units idle
    /// (bench/results/2026-12-06-avx2-rows-in-chunks).
    fn most_units(self, m: usize, values: CellValues) -> usize {
        match (self, m) {
            (Kernel::Lanes8, 1) if matches!(values, CellValues::Nibbles(_)) => 8,
            (_, 1 | 2) => 4,
            (Kernel::Lanes8, 3..=6) | (Kernel::Lanes16 | Kernel::Lanes16Bytes, 3..=8) => 2,
            _ => 1,
        }
    }
}

/// Values of one set's scratch output: `[m, units x lanes]`, at most 256 (16 accumulators).
const SET_VALUES: usize = 256;

/// One pass of a kernel: rows `0..R` of x against a set of units of columns.
struct Set {
    /// x as `[k, R]`: reduction row by reduction row, the rows' values side by side, so that
    /// the kernel reads them at fixed offsets from one moving pointer.
    x: *const f32,
    k: usize,
    values: CellValues,
    cell_rows: usize,
    /// The first cell of each group of the set (only the set's own are read).
    cells: [*const u8; 8],
    /// `[R, stride]`: row r's unit i at `out + r * stride + lanes * i`.
    out: *mut f32,
    stride: usize,
}

/// What a K-quant kernel prefetches while it reads cell `c` (of `cells`) at `head`: the cell
/// [`AHEAD`](crate::packed::kcells::AHEAD) later in its group's run, and near the run's end
/// the cell the next set of `groups` groups reads first (a set's groups lie side by side, each
/// a run of `cells`), so that no set starts on lines still in memory.
#[cfg(target_arch = "x86_64")]
fn prefetch_target(
    head: *const u8,
    c: usize,
    cells: usize,
    cell_bytes: usize,
    groups: usize,
) -> *const u8 {
    let ahead = crate::packed::kcells::AHEAD;
    let next = head.wrapping_add(ahead * cell_bytes);
    if c + ahead < cells {
        next
    } else {
        next.wrapping_add((groups - 1) * cells * cell_bytes)
    }
}

/// Columns `j0..j0 + cols` (`j0` a multiple of 8) of `y` into `tile` (m rows of `cols`) from `x`
/// laid out as `[k, m]`, in sets of up to 4 units (8 for one row of 4-bit cells on the 8-lane
/// kernel; independent accumulator chains): the fewer the rows, the more units share one pass
/// over them. An odd last group is read twice (as its own pair, or as the padding of a set) and
/// only its own lanes kept.
///
/// # Safety
/// The CPU has `kernel`'s instructions; `x` holds `k * m` values; `tile` holds m rows of `cols`.
#[cfg(target_arch = "x86_64")]
unsafe fn columns(
    kernel: Kernel,
    x: &[f32],
    m: usize,
    w: &PackedMatrix,
    j0: usize,
    cols: usize,
    tile: &mut Tile,
) {
    let (g0, g1) = (j0 / GROUP, (j0 + cols).div_ceil(GROUP));
    let unit_groups = kernel.unit_groups();
    let most = kernel.most_units(m, w.cell_values());
    let mut g = g0;
    while g < g1 {
        let left = (g1 - g).div_ceil(unit_groups);
        let units = [8, 4, 2, 1]
            .into_iter()
            .find(|&u| u <= most && u <= left)
            .unwrap_or(1);
        let stride = units * unit_groups * GROUP;
        let mut out = [0f32; SET_VALUES];
        let set = Set {
            x: x.as_ptr(),
            k: w.k(),
            values: w.cell_values(),
            cell_rows: w.cell_rows(),
            cells: std::array::from_fn(|i| w.group_cells((g + i).min(g1 - 1)).as_ptr()),
            out: out.as_mut_ptr(),
            stride,
        };
        match kernel {
            Kernel::Lanes8 => avx2::run_set(m, units, &set),
            Kernel::Lanes16 => avx512::run_set(m, units, false, &set),
            Kernel::Lanes16Bytes => avx512::run_set(m, units, true, &set),
        }
        let first = (g - g0) * GROUP;
        let width = stride.min(cols - first);
        for r in 0..m {
            tile.row(r)[first..first + width].copy_from_slice(&out[r * stride..r * stride + width]);
        }
        g += units * unit_groups;
    }
}

/// `x [rows, k]` (row-major) as `[k, rows]`.
#[cfg(target_arch = "x86_64")]
fn by_reduction_row(x: &[f32], rows: usize, k: usize) -> Vec<f32> {
    let mut out = vec![0f32; rows * k];
    for (r, row) in x.chunks_exact(k).take(rows).enumerate() {
        for (i, v) in row.iter().enumerate() {
            out[i * rows + r] = *v;
        }
    }
    out
}

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(target_arch = "x86_64")]
mod one_row;

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use crate::test_values::{packed_matrix, spread};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Every kernel this CPU runs gives the bits of the f32 product over the expanded
        /// weight, for every format, row count and width (odd group counts included).
        #[test]
        fn each_kernel_gives_the_f32_products_bits(
            m in 1usize..=16, blocks_per_row in 1usize..20, n in 1usize..300,
            format in 0usize..crate::test_values::FORMATS, seed in 0u32..1000,
        ) {
            let (packed, k) = packed_matrix(format, blocks_per_row, n, seed);
            let x: Vec<f32> = (0..m * k).map(|i| spread(i, seed, 700.0)).collect();
            let want = crate::few_rows::matmul(&x, &packed.to_dense(), m, k, n);
            for kernel in Kernel::supported() {
                let Some(got) = matmul_by(kernel, &x, m, &packed) else {
                    let runs = kernel.for_values(packed.cell_values());
                    prop_assert!(m > runs.max_rows(), "{:?} declined {} rows", runs, m);
                    continue;
                };
                for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                    prop_assert_eq!(g.to_bits(), e.to_bits(), "{:?}, element {} of [{}, {}]", kernel, i, m, n);
                }
            }
        }
    }

    /// One row over 4-bit cells in sets of 8 groups (the 8-lane kernel's widest, which the
    /// proptest's widths reach on no more than 1 thread), with reductions of one KC block,
    /// a block and a part, and two blocks, and widths of whole, uneven and padded sets.
    #[test]
    fn one_row_over_nibbles_in_sets_of_eight_gives_the_f32_bits() {
        let one = rayon::ThreadPoolBuilder::new()
            .num_threads(1)
            .build()
            .unwrap();
        one.install(|| {
            for format in [1, 8] {
                for blocks_per_row in [1, 9, 16] {
                    for n in [256, 300, 517] {
                        let (packed, k) = packed_matrix(format, blocks_per_row, n, 7);
                        let x: Vec<f32> = (0..k).map(|i| spread(i, 11, 700.0)).collect();
                        let want = crate::few_rows::matmul(&x, &packed.to_dense(), 1, k, n);
                        for kernel in Kernel::supported() {
                            let got = matmul_by(kernel, &x, 1, &packed).unwrap();
                            let same = got
                                .iter()
                                .zip(&want)
                                .all(|(g, e)| g.to_bits() == e.to_bits());
                            assert!(same, "{kernel:?}, format {format}, [{k}, {n}]");
                        }
                    }
                }
            }
        });
    }

    /// Every row count each kernel takes over cells of 32 rows (Q8_0 with f32 and f16 scales,
    /// Q4_1, bf16, f16, Q4_0, Q5_1, IQ4_NL, Q5_0), with a reduction of a KC block and a cell
    /// (the 8-lane kernel's chunks end with each cell) and widths of one group, an odd number
    /// of groups and a padded last group: the chunks and the sums kept beside the weights are
    /// separate code per row count, which the proptest reaches only by chance per format.
    #[test]
    fn every_row_count_over_32_row_cells_gives_the_f32_bits() {
        every_row_count_gives_the_f32_bits(&[0, 1, 3, 4, 7, 8, 9, 14, 15], 9);
    }

    /// Every row count each kernel takes, for every K-quant cell type and widths of one group,
    /// an odd number of groups and a padded last group: the kernels' register sets per row count
    /// are separate code, which the proptest above reaches only by chance per type.
    #[test]
    fn every_row_count_over_k_quant_cells_gives_the_f32_bits() {
        every_row_count_gives_the_f32_bits(&[2, 5, 6, 10, 11, 12, 13], 16);
    }

    /// Rows 1 to 16 by `formats` with `blocks_per_row` cells of 32 rows, 1, 3 and 6 groups
    /// wide (the last padded), against the f32 product, for every kernel that takes them.
    fn every_row_count_gives_the_f32_bits(formats: &[usize], blocks_per_row: usize) {
        for &format in formats {
            for n in [8, 24, 45] {
                let (packed, k) = packed_matrix(format, blocks_per_row, n, 3);
                for m in 1..=16 {
                    let x: Vec<f32> = (0..m * k).map(|i| spread(i, 5, 700.0)).collect();
                    let want = crate::few_rows::matmul(&x, &packed.to_dense(), m, k, n);
                    for kernel in Kernel::supported() {
                        if let Some(got) = matmul_by(kernel, &x, m, &packed) {
                            let same = got
                                .iter()
                                .zip(&want)
                                .all(|(g, e)| g.to_bits() == e.to_bits());
                            assert!(same, "{kernel:?}, format {format}, [{m}, {n}]");
                        }
                    }
                }
            }
        }
    }
}
