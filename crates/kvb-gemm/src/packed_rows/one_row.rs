//! The 8-lane kernel's Q4_K cells for one row (a single sequence's decode step, where a step
//! spends nearly all its time): the general kernel's arrays of a row's weights for every
//! group, beside each group's scale and offset, took more than the 16 registers, and LLVM
//! spilled accumulators, which put a store and a load into every multiply-add chain.
//!
//! Here each group's weights are formed and used at once, and the sub-block's scales and
//! offsets are read from memory where they are used, so the registers hold the accumulators,
//! the row's x and the weights in flight. The values and the order of the sums are the
//! general kernel's ([`kcells::avx2::each_row`]): the same bits. (Q5_K and Q6_K done this way,
//! a group or two at a time, were slower than the general kernel: bench/results.)

use super::{prefetch_target, Set};
use crate::packed::kcells::{self, prefetch_part, Layout, ROWS};
use crate::packed::{CellValues, GROUP};
use std::arch::x86_64::*;

/// Row 0 of the set's x against its `G` groups of Q4_K cells, into its out, as
/// [`super::avx2`]'s `run_groups` does for the other formats. Not inlined there: beside its
/// other arms LLVM kept one accumulator in memory.
///
/// # Safety
/// AVX2, FMA and F16C are present; `a` is a set of `G` groups of Q4_K cells and one row.
#[inline(never)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn q4k_row<const G: usize>(a: &Set) {
    let rows = a.cell_rows;
    let cell_bytes = CellValues::Q4K.cell_bytes(rows);
    let cells = a.k / rows;
    let mut acc = [[_mm256_setzero_ps(); G]; 1];
    for c in 0..cells {
        let head: [*const u8; G] = std::array::from_fn(|i| a.cells[i].add(c * cell_bytes));
        let ahead = head.map(|p| prefetch_target(p, c, cells, cell_bytes, G));
        q4k_cells::<G>(head, ahead, a.x.add(c * rows), &mut acc[0]);
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
    let (subs, cell_bytes) = (ROWS / at.sub_rows, CellValues::Q4K.cell_bytes(ROWS));
    let sign = _mm256_set1_ps(-0.0);
    let low = _mm256_set1_epi32(0x0f);
    let mut scale = [_mm256_setzero_ps(); G];
    let mut offset = [sign; G];
    for s in 0..subs {
        for cell in ahead {
            prefetch_part(cell, cell_bytes, s, subs);
        }
        // Volatile: stored once a sub-block and loaded by each use, never held in registers
        // (`d` and `dmin` are read again per sub-block for the same reason).
        for i in 0..G {
            let at_head = |o: usize| _mm256_cvtph_ps(_mm_loadu_si128(cells[i].add(o) as *const _));
            let sub = |o: usize| _mm256_cvtepi32_ps(kcells::avx2::bytes(cells[i].add(o), false));
            let (d, dmin) = (at_head(0), at_head(at.dmin));
            let (sc, m) = (sub(at.sc + s * GROUP), sub(at.m + s * GROUP));
            std::ptr::write_volatile(&mut scale[i], _mm256_mul_ps(d, sc));
            std::ptr::write_volatile(&mut offset[i], _mm256_xor_ps(_mm256_mul_ps(dmin, m), sign));
        }
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
