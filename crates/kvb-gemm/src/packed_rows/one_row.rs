//! The 8-lane kernel's K-quant cells for one row (a single sequence's decode step, where a
//! step spends nearly all its time): the general kernel's arrays of a row's weights for every
//! group, beside each group's scale and offset, took more than the 16 registers, and LLVM
//! spilled accumulators, which put a store and a load into every multiply-add chain.
//!
//! Here each group's weights are formed and used at once, and the sub-block's scales and
//! offsets are read from memory where they are used, so the registers hold the accumulators,
//! the row's x and the weights in flight. The values and the order of the sums are the
//! general kernel's ([`kcells::avx2::each_row`]): the same bits. [`nibble_row`] does the
//! same for 4-bit cells (Q4_0, Q4_1), where the general kernel's arrays spilled the same way.

use super::{prefetch_target, Set};
use crate::packed::kcells::{self, prefetch_part, Layout, ROWS};
use crate::packed::{head as cell_head, prefetch_cell, CellValues, Scales, AHEAD, GROUP};
use std::arch::x86_64::*;

/// Row 0 of the set's x against its `G` groups of K-quant cells of kind `K`, into its out, as
/// [`super::avx2`]'s `run_groups` does for the other formats. Not inlined there: beside its
/// other arms LLVM kept one accumulator in memory.
///
/// # Safety
/// AVX2, FMA and F16C are present; `a` is a set of `G` groups of cells of kind `K` and one row.
#[inline(never)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn k_quant_row<const G: usize, const K: u8>(a: &Set) {
    let values = kcells::of_kind(K);
    let rows = a.cell_rows;
    let cell_bytes = values.cell_bytes(rows);
    let cells = a.k / rows;
    let mut acc = [[_mm256_setzero_ps(); G]; 1];
    for c in 0..cells {
        let head: [*const u8; G] = std::array::from_fn(|i| a.cells[i].add(c * cell_bytes));
        let ahead = head.map(|p| prefetch_target(p, c, cells, cell_bytes, G));
        let x = a.x.add(c * rows);
        if values == CellValues::Q4K {
            q4k_cells::<G>(head, ahead, x, &mut acc[0]);
        } else {
            high_bit_cells::<G, K>(head, ahead, x, &mut acc[0]);
        }
        super::avx2::end_of_cell(a, c, &mut acc);
    }
}

/// Row 0 of the set's x against its `G` groups of 4-bit cells with scales `s`, as the general
/// kernel's Nibbles arm: per pair of reduction rows, each group's low nibbles (the even row)
/// and high nibbles (the odd row) widened, scaled and multiplied in, group by group. Each
/// cell's scales and offsets are stored once and read where used (volatile, as in
/// [`start_sub_block`]), so the registers hold the accumulators, the two rows' x and the
/// weights in flight. Not inlined into the general kernel, for the reason [`k_quant_row`] gives.
///
/// # Safety
/// AVX2, FMA and F16C are present; `a` is a set of `G` groups of 4-bit cells with scales `s`
/// and one row.
#[inline(never)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn nibble_row<const G: usize>(a: &Set, s: Scales) {
    let rows = a.cell_rows;
    let cell_bytes = a.values.cell_bytes(rows);
    let cells = a.k / rows;
    let values = s.head_bytes();
    let low = _mm256_set1_epi32(0x0f);
    let mut acc = [[_mm256_setzero_ps(); G]; 1];
    let mut scale = [_mm256_setzero_ps(); G];
    let mut offset = [_mm256_setzero_ps(); G];
    for c in 0..cells {
        let head: [*const u8; G] = std::array::from_fn(|i| a.cells[i].add(c * cell_bytes));
        for i in 0..G {
            prefetch_cell(head[i].wrapping_add(AHEAD * cell_bytes), cell_bytes);
            let (sc, off) = cell_head(s, head[i]);
            std::ptr::write_volatile(&mut scale[i], sc);
            std::ptr::write_volatile(&mut offset[i], off);
        }
        let x = a.x.add(c * rows);
        for p in 0..rows / 2 {
            let x0 = _mm256_broadcast_ss(&*x.add(2 * p));
            let x1 = _mm256_broadcast_ss(&*x.add(2 * p + 1));
            for i in 0..G {
                let at = head[i].add(values + p * GROUP);
                let bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(at as *const _));
                let sc = std::ptr::read_volatile(&scale[i]);
                let off = std::ptr::read_volatile(&offset[i]);
                let lo = _mm256_cvtepi32_ps(_mm256_and_si256(bytes, low));
                acc[0][i] = _mm256_fmadd_ps(x0, _mm256_fmadd_ps(sc, lo, off), acc[0][i]);
                let hi = _mm256_cvtepi32_ps(_mm256_srli_epi32::<4>(bytes));
                acc[0][i] = _mm256_fmadd_ps(x1, _mm256_fmadd_ps(sc, hi, off), acc[0][i]);
            }
        }
        super::avx2::end_of_cell(a, c, &mut acc);
    }
}

/// Adds the products of row x (its 256 values of this cell at `x`) by `G` Q4_K cells (one per
/// group) into `acc[i]`, reduction row by reduction row.
///
/// # Safety
/// AVX2, FMA and F16C are present; `cells` point at whole Q4_K cells; `x` holds 256 f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn q4k_cells<const G: usize>(
    cells: [*const u8; G],
    ahead: [*const u8; G],
    x: *const f32,
    acc: &mut [__m256; G],
) {
    let at = Layout::of(CellValues::Q4K);
    let subs = ROWS / at.sub_rows;
    let sign = _mm256_set1_ps(-0.0);
    let low = _mm256_set1_epi32(0x0f);
    let mut scale = [_mm256_setzero_ps(); G];
    let mut offset = [sign; G];
    for s in 0..subs {
        start_sub_block::<G, { kcells::KIND_Q4K }>(cells, ahead, s, &mut scale, &mut offset);
        let r0 = s * at.sub_rows;
        for r in (r0..r0 + at.sub_rows).step_by(2) {
            let x0 = _mm256_broadcast_ss(&*x.add(r));
            let x1 = _mm256_broadcast_ss(&*x.add(r + 1));
            for i in 0..G {
                let nib = kcells::avx2::bytes(cells[i].add(at.nibbles + r / 2 * GROUP), false);
                let (lo, hi) = (_mm256_and_si256(nib, low), _mm256_srli_epi32::<4>(nib));
                let sc = std::ptr::read_volatile(&scale[i]);
                let off = std::ptr::read_volatile(&offset[i]);
                let w = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(lo), off);
                acc[i] = _mm256_fmadd_ps(x0, w, acc[i]);
                let w = _mm256_fmadd_ps(sc, _mm256_cvtepi32_ps(hi), off);
                acc[i] = _mm256_fmadd_ps(x1, w, acc[i]);
            }
        }
    }
}

/// [`q4k_cells`] for Q2_K, Q3_K, Q5_K and Q6_K: per run of 8 rows, each group's values are joined in
/// two registers of bytes ([`kcells::avx2::run_bytes`]; Q3_K's and Q6_K's less their bias), stored, and
/// widened from memory row by row: taking the rows out of registers cost a shuffle each, and
/// LLVM held all groups' runs at once. Q3_K's and Q6_K's `scale * q` is a multiply where the
/// general kernel adds an offset of -0.0 to it: the same bits.
///
/// # Safety
/// AVX2, FMA and F16C are present; `cells` point at whole cells of kind `K`; `x` holds 256 f32.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn high_bit_cells<const G: usize, const K: u8>(
    cells: [*const u8; G],
    ahead: [*const u8; G],
    x: *const f32,
    acc: &mut [__m256; G],
) {
    let values = kcells::of_kind(K);
    let signed = kcells::signed(values);
    let at = Layout::of(values);
    let subs = ROWS / at.sub_rows;
    let bias = _mm256_set1_epi8(kcells::bias(values) as i8);
    let sign = _mm256_set1_ps(-0.0);
    let mut scale = [_mm256_setzero_ps(); G];
    let mut offset = [sign; G];
    for s in 0..subs {
        start_sub_block::<G, K>(cells, ahead, s, &mut scale, &mut offset);
        for r0 in (s * at.sub_rows..(s + 1) * at.sub_rows).step_by(8) {
            let mut runs = [[_mm256_setzero_si256(); 2]; G];
            for (i, run) in runs.iter_mut().enumerate() {
                let [even, odd] = kcells::avx2::run_bytes::<K>(cells[i], r0);
                std::ptr::write_volatile(&mut run[0], _mm256_sub_epi8(even, bias));
                std::ptr::write_volatile(&mut run[1], _mm256_sub_epi8(odd, bias));
            }
            for p in 0..4 {
                for half in 0..2 {
                    let xr = _mm256_broadcast_ss(&*x.add(r0 + 2 * p + half));
                    for (i, run) in runs.iter().enumerate() {
                        let at = (run.as_ptr() as *const u8).add(half * 32 + p * 8);
                        let q = _mm_loadl_epi64(at as *const _);
                        let sc = std::ptr::read_volatile(&scale[i]);
                        let w = if signed {
                            _mm256_mul_ps(sc, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q)))
                        } else {
                            let q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(q));
                            _mm256_fmadd_ps(sc, q, std::ptr::read_volatile(&offset[i]))
                        };
                        acc[i] = _mm256_fmadd_ps(xr, w, acc[i]);
                    }
                }
            }
        }
    }
}

/// Starts sub-block `s` of `G` cells of kind `K`: prefetches its share of the cells `ahead`
/// and stores each group's scale `d * sc` and offset `-(dmin * m)` (Q3_K and Q6_K have none:
/// their offset stays -0.0). Volatile: stored once a sub-block and loaded by each use, never held in
/// registers (`d` and `dmin` are read again per sub-block for the same reason).
///
/// # Safety
/// AVX2 and F16C are present; `cells` point at whole cells of kind `K`.
#[inline(always)]
unsafe fn start_sub_block<const G: usize, const K: u8>(
    cells: [*const u8; G],
    ahead: [*const u8; G],
    s: usize,
    scale: &mut [__m256; G],
    offset: &mut [__m256; G],
) {
    let values = kcells::of_kind(K);
    let (at, signed) = (Layout::of(values), kcells::signed(values));
    let (subs, cell_bytes) = (ROWS / at.sub_rows, values.cell_bytes(ROWS));
    for cell in ahead {
        prefetch_part(cell, cell_bytes, s, subs);
    }
    for i in 0..G {
        let at_head = |o: usize| _mm256_cvtph_ps(_mm_loadu_si128(cells[i].add(o) as *const _));
        let (sc, m) = kcells::avx2::sub_ints::<K>(cells[i], s);
        let sc = _mm256_cvtepi32_ps(sc);
        std::ptr::write_volatile(&mut scale[i], _mm256_mul_ps(at_head(0), sc));
        if !signed {
            let m = _mm256_mul_ps(at_head(at.dmin), _mm256_cvtepi32_ps(m));
            std::ptr::write_volatile(&mut offset[i], _mm256_xor_ps(m, _mm256_set1_ps(-0.0)));
        }
    }
}
