//! The 8-lane kernel (AVX2, FMA, F16C): one group of 8 columns per register.
//!
//! Two rows and more form a chunk of reduction rows' weights in memory and then run its
//! multiply-adds with only the sums in registers ([`multiply_chunk`]): held beside the weights,
//! scales and offsets of each group, the sums of more than one group spilled from the 16
//! registers, and with one group per pass each sum's chain of multiply-adds waited on itself
//! (bench/results/2026-12-06-avx2-rows-in-chunks).

use super::*;
use crate::packed::{five_bits, head as cell_head, kcells, prefetch_cell, Scales, AHEAD};
use std::arch::x86_64::*;

/// Cell `c` of the set `a`'s `G` groups (`G` the caller's): `$put!(p, w)` for each of its
/// reduction rows `p` in order, `w[i]` the 8 weights of group `i`. A macro, so that each use
/// writes its multiply-adds in place: passed as a closure, LLVM called a row's multiply-adds
/// out of line with the sums in memory.
macro_rules! form_cell {
    ($a:expr, $c:expr, $put:ident) => {{
        let (a, c): (&Set, usize) = ($a, $c);
        let rows = a.cell_rows;
        let cell_bytes = a.values.cell_bytes(rows);
        let cells = a.k / rows;
        let low = _mm256_set1_epi32(0x0f);
        let head: [*const u8; G] = std::array::from_fn(|i| a.cells[i].add(c * cell_bytes));
        // K-quant kernels prefetch per sub-block, set by set (`prefetch_target`).
        if !a.values.is_k_quant() {
            for h in head {
                prefetch_cell(h.wrapping_add(AHEAD * cell_bytes), cell_bytes);
            }
        }
        // Each group's 8 scales and offsets, for integer cells.
        let scales = |s| -> ([__m256; G], [__m256; G]) {
            let both: [(__m256, __m256); G] = std::array::from_fn(|i| cell_head(s, head[i]));
            (
                std::array::from_fn(|i| both[i].0),
                std::array::from_fn(|i| both[i].1),
            )
        };
        match a.values {
            // K-quant cells: every group's row at once.
            CellValues::Q2K
            | CellValues::Q3K
            | CellValues::Q4K
            | CellValues::Q5K
            | CellValues::Q6K
            | CellValues::IQ4XS => {
                let ahead = head.map(|p| prefetch_target(p, c, cells, cell_bytes, G));
                k_quant_rows::<G>(a.values, head, ahead, |p, w| $put!(p, w));
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
                    $put!(2 * p, &lo);
                    let hi: [__m256; G] = std::array::from_fn(|i| {
                        let q = _mm256_cvtepi32_ps(_mm256_srli_epi32(bytes[i], 4));
                        _mm256_fmadd_ps(scale[i], q, offset[i])
                    });
                    $put!(2 * p + 1, &hi);
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
                        $put!(2 * p + half, &w);
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
                                    $put!(r8 + 2 * p + half, &w);
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
                    $put!(p, &wv);
                }
            }
            CellValues::Bf16 | CellValues::F16 => {
                for p in 0..rows {
                    let wv: [__m256; G] =
                        std::array::from_fn(|i| widen_floats(a.values, head[i].add(p * GROUP * 2)));
                    $put!(p, &wv);
                }
            }
        }
    }};
}

/// [`run_groups`] for `m` rows (1 to 8) and `groups` groups (1, 2 or 4; up to 2 from 3 rows,
/// 1 from 7), as [`super::columns`] chose them; 8 groups only for one row of 4-bit cells, which
/// go straight to their own loop (the general kernel is not compiled for 8 groups).
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
    by_shape!(1: [1, 2, 4], 2: [1, 2, 4], 3: [1, 2], 4: [1, 2], 5: [1, 2], 6: [1, 2], 7: [1], 8: [1])
}

/// Rows `0..R` of x against `G` groups: per reduction row, each group's 8 weights are
/// widened, converted and scaled once and multiplied into the R rows' sums, at once
/// ([`in_registers`]) or a chunk of reduction rows at a time. Not inlined into [`run_set`]:
/// there one row of 5-bit cells ran 1.3x slower.
#[inline(never)]
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
    let cells = a.k / rows;
    if in_registers(R, a.values) {
        let mut acc = [[_mm256_setzero_ps(); G]; R];
        for c in 0..cells {
            let x = a.x.add(c * rows * R);
            macro_rules! multiply_now {
                ($p:expr, $w:expr) => {
                    multiply_into(&mut acc, $w, |r| _mm256_broadcast_ss(&*x.add($p * R + r)))
                };
            }
            form_cell!(a, c, multiply_now);
            end_of_cell(a, c, &mut acc);
        }
        return;
    }
    // A chunk: a whole cell of 16 or 32 rows, or 32 rows of a K-quant cell.
    let step = rows.min(CHUNK);
    debug_assert!(step.is_power_of_two());
    let mut sums = [[_mm256_setzero_ps(); G]; R];
    let mut chunk = [[_mm256_setzero_ps(); G]; CHUNK];
    for c in 0..cells {
        let x = a.x.add(c * rows * R);
        macro_rules! into_chunk {
            ($p:expr, $w:expr) => {{
                let p: usize = $p;
                chunk[p % CHUNK] = *$w;
                if (p + 1) & (step - 1) == 0 {
                    multiply_chunk(&mut sums, &chunk, x.add((p + 1 - step) * R), step);
                }
            }};
        }
        form_cell!(a, c, into_chunk);
        end_of_cell(a, c, &mut sums);
    }
}

/// Whether `r` rows of cells of `values` keep their sums beside the weights rather than
/// forming chunks: where that fits the registers, the forming overlaps the multiply-adds' waits.
/// Chunks were slower for 3 rows (by up to 1.4x on a Llama-3.2-1B layer's matrices from memory),
/// for 4 rows of cells with high bits and for 2 and 4 rows of IQ4_XS
/// (bench/results/2026-12-06-avx2-rows-in-chunks).
fn in_registers(r: usize, values: CellValues) -> bool {
    let high_bits = matches!(
        values,
        CellValues::Q2K | CellValues::Q3K | CellValues::Q5K | CellValues::Q6K
    ) || matches!(values, CellValues::FiveBits(_));
    match r {
        1 | 3 => true,
        2 => values == CellValues::IQ4XS,
        4 => high_bits || values == CellValues::IQ4XS,
        _ => false,
    }
}

/// Reduction rows of a chunk: [`multiply_chunk`] runs after this many (or a whole cell's).
const CHUNK: usize = 32;

/// `sums[r][i] += x[p][r] * w[p][i]` for the chunk's reduction rows `p` in order (x as
/// `[rows, R]`): the sums in registers, each reduction row's weights loaded from the chunk.
/// Not inlined, so that the weights are formed into memory and the sums leave the registers
/// to the forming between chunks.
///
/// # Safety
/// AVX2 and FMA are present; `x` holds `rows * R` values; `rows <= CHUNK`.
#[inline(never)]
#[target_feature(enable = "avx2,fma")]
unsafe fn multiply_chunk<const R: usize, const G: usize>(
    sums: &mut [[__m256; G]; R],
    w: &[[__m256; G]; CHUNK],
    x: *const f32,
    rows: usize,
) {
    let mut acc = *sums;
    let (mut x, mut w) = (x, w.as_ptr());
    for _ in 0..rows {
        for (r, row) in acc.iter_mut().enumerate() {
            let xr = _mm256_broadcast_ss(&*x.add(r));
            for (a, w) in row.iter_mut().zip(&*w) {
                *a = _mm256_fmadd_ps(xr, *w, *a);
            }
        }
        (x, w) = (x.add(R), w.add(1));
    }
    *sums = acc;
}

/// Every reduction row of `G` K-quant cells of `values`, as [`kcells::avx2::each_row`].
///
/// # Safety
/// AVX2, FMA and F16C are present; `cells` point at whole cells of `values`.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn k_quant_rows<const G: usize>(
    values: CellValues,
    cells: [*const u8; G],
    ahead: [*const u8; G],
    put: impl FnMut(usize, &[__m256; G]),
) {
    macro_rules! run {
        ($k:expr) => {
            kcells::avx2::each_row::<G, $k>(cells, ahead, put)
        };
    }
    kcells::by_kind!(values, run);
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
