//! The 8-lane kernel (AVX2, FMA, F16C): one group of 8 columns per register.

use super::*;
use crate::packed::{five_bits, head as cell_head, kcells, prefetch_cell, Scales, AHEAD};
use std::arch::x86_64::*;

/// [`run_groups`] for `m` rows (1 to 7) and `groups` groups (1, 2 or 4), as
/// [`super::columns`] chose them; 8 groups only for one row of 4-bit cells, which go straight
/// to their own loop (the general kernel is not compiled for 8 groups).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn run_set(m: usize, groups: usize, set: &Set) {
    macro_rules! by_shape {
        ($($rows:literal: [$($g:literal),*]),*) => {
            match (m, groups) {
                $($(($rows, $g) => run_groups::<$rows, $g>(set),)*)*
                _ => unreachable!("no 8-lane kernel for {m} rows by {groups} groups"),
            }
        };
    }
    if let (1, 8, CellValues::Nibbles(s)) = (m, groups, set.values) {
        return super::one_row::nibble_row::<8>(set, s);
    }
    by_shape!(1: [1, 2, 4], 2: [1, 2, 4], 3: [1, 2], 4: [1, 2], 5: [1], 6: [1], 7: [1])
}

/// Rows `0..R` of x against `G` groups: per reduction row, each group's 8 weights are
/// widened, converted and scaled once and multiplied into the R rows' accumulators.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_groups<const R: usize, const G: usize>(a: &Set) {
    if R == 1 && a.values.is_k_quant() {
        // One row of K-quant cells: a loop of its own (here, beside the other formats' arms,
        // LLVM kept an accumulator in memory, a store and a load in its multiply-add chain).
        macro_rules! one_row {
            ($k:expr) => {
                super::one_row::k_quant_row::<G, $k>(a)
            };
        }
        return kcells::by_kind!(a.values, one_row);
    }
    if let (1, CellValues::Nibbles(s)) = (R, a.values) {
        return super::one_row::nibble_row::<G>(a, s);
    }
    let rows = a.cell_rows;
    let cell_bytes = a.values.cell_bytes(rows);
    let cells = a.k / rows;
    let mut acc = [[_mm256_setzero_ps(); G]; R];
    let low = _mm256_set1_epi32(0x0f);
    for c in 0..cells {
        let head: [*const u8; G] = std::array::from_fn(|i| a.cells[i].add(c * cell_bytes));
        // K-quant kernels prefetch per sub-block, set by set (`prefetch_target`).
        if !a.values.is_k_quant() {
            for h in head {
                prefetch_cell(h.wrapping_add(AHEAD * cell_bytes), cell_bytes);
            }
        }
        let xrow = |r: usize, i: usize| _mm256_broadcast_ss(&*a.x.add((c * rows + i) * R + r));
        // Each group's 8 scales and offsets, for integer cells.
        let scales = |s| -> ([__m256; G], [__m256; G]) {
            let both: [(__m256, __m256); G] = std::array::from_fn(|i| cell_head(s, head[i]));
            (
                std::array::from_fn(|i| both[i].0),
                std::array::from_fn(|i| both[i].1),
            )
        };
        match a.values {
            // K-quant cells: every group's row at once (G chains of multiply-adds per row).
            CellValues::Q2K
            | CellValues::Q3K
            | CellValues::Q4K
            | CellValues::Q5K
            | CellValues::Q6K
            | CellValues::IQ4XS => {
                let ahead = head.map(|p| prefetch_target(p, c, cells, cell_bytes, G));
                macro_rules! run {
                    ($k:expr) => {
                        kcells::avx2::each_row::<G, $k>(head, ahead, |p, w| {
                            multiply_into(&mut acc, w, |r| xrow(r, p))
                        })
                    };
                }
                kcells::by_kind!(a.values, run);
            }
            CellValues::Nibbles(s) => {
                let (scale, offset) = scales(s);
                let values = s.head_bytes();
                for p in 0..rows / 2 {
                    let bytes: [__m256i; G] = std::array::from_fn(|i| {
                        _mm256_cvtepu8_epi32(_mm_loadl_epi64(
                            head[i].add(values + p * GROUP) as *const _
                        ))
                    });
                    let lo: [__m256; G] = std::array::from_fn(|i| {
                        let q = _mm256_cvtepi32_ps(_mm256_and_si256(bytes[i], low));
                        _mm256_fmadd_ps(scale[i], q, offset[i])
                    });
                    multiply_into(&mut acc, &lo, |r| xrow(r, 2 * p));
                    let hi: [__m256; G] = std::array::from_fn(|i| {
                        let q = _mm256_cvtepi32_ps(_mm256_srli_epi32(bytes[i], 4));
                        _mm256_fmadd_ps(scale[i], q, offset[i])
                    });
                    multiply_into(&mut acc, &hi, |r| xrow(r, 2 * p + 1));
                }
            }
            CellValues::Iq4Nl => {
                let (scale, offset) = scales(Scales::HalfOnly);
                let values = Scales::HalfOnly.head_bytes();
                for p in 0..rows / 2 {
                    let q: [[__m256i; 2]; G] = std::array::from_fn(|i| {
                        crate::packed::iq4_rows(head[i].add(values + p * GROUP))
                    });
                    for half in 0..2 {
                        let w: [__m256; G] = std::array::from_fn(|i| {
                            _mm256_fmadd_ps(scale[i], _mm256_cvtepi32_ps(q[i][half]), offset[i])
                        });
                        multiply_into(&mut acc, &w, |r| xrow(r, 2 * p + half));
                    }
                }
            }
            CellValues::FiveBits(s) => {
                let (scale, offset) = scales(s);
                let values = s.head_bytes();
                // The sign a constant in each copy of the loop, which then keeps to registers.
                macro_rules! runs {
                    ($signed:expr) => {
                        for r8 in (0..rows).step_by(8) {
                            let mut q = [[[_mm_setzero_si128(); 4]; 2]; G];
                            for (i, q) in q.iter_mut().enumerate() {
                                let [even, odd] =
                                    five_bits::avx2::run_bytes(head[i].add(values), r8, $signed);
                                *q = [
                                    five_bits::avx2::quarters(even),
                                    five_bits::avx2::quarters(odd),
                                ];
                            }
                            for p in 0..4 {
                                for half in 0..2 {
                                    let w: [__m256; G] = std::array::from_fn(|i| {
                                        let q = five_bits::avx2::widen(q[i][half][p], $signed);
                                        _mm256_fmadd_ps(scale[i], _mm256_cvtepi32_ps(q), offset[i])
                                    });
                                    multiply_into(&mut acc, &w, |r| xrow(r, r8 + 2 * p + half));
                                }
                            }
                        }
                    };
                }
                if five_bits::signed(s) {
                    runs!(true)
                } else {
                    runs!(false)
                }
            }
            CellValues::Bytes(s) => {
                let (scale, offset) = scales(s);
                let values = s.head_bytes();
                for p in 0..rows {
                    let wv: [__m256; G] = std::array::from_fn(|i| {
                        let q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(
                            head[i].add(values + p * GROUP) as *const _,
                        ));
                        _mm256_fmadd_ps(scale[i], _mm256_cvtepi32_ps(q), offset[i])
                    });
                    multiply_into(&mut acc, &wv, |r| xrow(r, p));
                }
            }
            CellValues::Bf16 | CellValues::F16 => {
                for p in 0..rows {
                    let wv: [__m256; G] =
                        std::array::from_fn(|i| widen_floats(a.values, head[i].add(p * GROUP * 2)));
                    multiply_into(&mut acc, &wv, |r| xrow(r, p));
                }
            }
        }
        end_of_cell(a, c, &mut acc);
    }
}

/// After cell `c`: at the end of a KC block (or of the reduction), out = block sum for the
/// first block, out += block sum after it, as the f32 kernels do; the sums start again.
#[inline]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn end_of_cell<const R: usize, const G: usize>(
    a: &Set,
    c: usize,
    acc: &mut [[__m256; G]; R],
) {
    // In reduction rows, not cells: no division in the kernel's loop (the stores to `out`
    // may alias `a`, so LLVM divided again every cell).
    let end = (c + 1) * a.cell_rows;
    if !end.is_multiple_of(KC) && end != a.k {
        return;
    }
    let first = end <= KC;
    for (r, row) in acc.iter_mut().enumerate() {
        for (i, v) in row.iter_mut().enumerate() {
            let o = a.out.add(r * a.stride + i * GROUP);
            let sum = if first {
                *v
            } else {
                _mm256_add_ps(_mm256_loadu_ps(o), *v)
            };
            _mm256_storeu_ps(o, sum);
            *v = _mm256_setzero_ps();
        }
    }
}

/// `acc[r][i] += x(r) * w[i]` for every row and group.
#[inline]
#[target_feature(enable = "avx2,fma")]
unsafe fn multiply_into<const R: usize, const G: usize>(
    acc: &mut [[__m256; G]; R],
    w: &[__m256; G],
    x: impl Fn(usize) -> __m256,
) {
    for (r, row) in acc.iter_mut().enumerate() {
        let xv = x(r);
        for (a, w) in row.iter_mut().zip(w) {
            *a = _mm256_fmadd_ps(xv, *w, *a);
        }
    }
}
