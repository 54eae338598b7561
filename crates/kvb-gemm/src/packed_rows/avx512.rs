//! The 16-lane kernel (AVX-512F): two groups of 8 columns per register. The two groups' values
//! are loaded side by side (8 bytes, or 16 for 16-bit floats, from each), widened and scaled
//! together, so a row of cells costs half the instructions of the 8-lane kernel. Each lane
//! computes what [`super::avx2`] computes for its column, in the same order: the same bits.

use super::*;
use crate::packed::{
    bytes16, five_bits, head_pair, kcells, kcells_bytes, prefetch_cell, widen16, widen_pair,
    Scales, AHEAD,
};
use std::arch::x86_64::*;

/// [`run_pairs`] for `m` rows (1 to 16) and `pairs` pairs (1, 2 or 4), as [`super::columns`]
/// chose them; with `bytes`, Q5_K and Q6_K values assembled by byte permutes and 4-bit K-quant
/// nibbles gathered a column per lane.
///
/// # Safety
/// The CPU has AVX-512F, and AVX-512 VBMI with `bytes`.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn run_set(m: usize, pairs: usize, bytes: bool, set: &Set) {
    // Past a few rows Q5_K's and Q6_K's byte permutes cost more than they save: the 16-byte
    // path shares its work between two rows (bench/results/2026-11-27-q6k-bytes). With two
    // rows a permute, 5 to 8 rows measured mixed on Zen 4
    // (bench/results/2026-12-07-q6k-rows-without-conversion), so the limit stays at 4.
    // 4-bit cells' nibble lanes save at any row count.
    let nibbles = matches!(set.values, CellValues::Q4K | CellValues::IQ4XS);
    if bytes && (m <= 4 || nibbles) {
        run_shape::<true>(m, pairs, set)
    } else {
        run_shape::<false>(m, pairs, set)
    }
}

#[target_feature(enable = "avx512f")]
unsafe fn run_shape<const BYTES: bool>(m: usize, pairs: usize, set: &Set) {
    macro_rules! by_shape {
        ($($rows:literal: [$($p:literal),*]),*) => {
            match (m, pairs) {
                $($(($rows, $p) => run_pairs::<$rows, $p, BYTES>(set),)*)*
                _ => unreachable!("no 16-lane kernel for {m} rows by {pairs} pairs"),
            }
        };
    }
    by_shape!(
        1: [1, 2, 4], 2: [1, 2, 4], 3: [1, 2], 4: [1, 2], 5: [1, 2], 6: [1, 2], 7: [1, 2],
        8: [1, 2], 9: [1], 10: [1], 11: [1], 12: [1], 13: [1], 14: [1], 15: [1], 16: [1]
    )
}

/// Rows `0..R` of x against `P` pairs of groups: per reduction row, each pair's 16 weights are
/// widened, converted and scaled once and multiplied into the R rows' accumulators.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn run_pairs<const R: usize, const P: usize, const BYTES: bool>(a: &Set) {
    let rows = a.cell_rows;
    let cell_bytes = a.values.cell_bytes(rows);
    let cells = a.k / rows;
    let per_block = KC / rows;
    let mut acc = [[_mm512_setzero_ps(); P]; R];
    let nibble_values = kcells::avx512::nibble_values();
    let iq4_values = kcells::avx512::iq4_values();
    let prefetch = !a.values.is_k_quant() && prefetches_cells();
    for c in 0..cells {
        let mut head = [[std::ptr::null::<u8>(); 2]; P];
        for (i, h) in head.iter_mut().enumerate() {
            *h = [
                a.cells[2 * i].add(c * cell_bytes),
                a.cells[2 * i + 1].add(c * cell_bytes),
            ];
        }
        // K-quant kernels prefetch per sub-block, set by set (`prefetch_target`).
        if prefetch {
            for h in head.iter().flatten() {
                prefetch_cell(h.wrapping_add(AHEAD * cell_bytes), cell_bytes);
            }
        }
        let xrow = |r: usize, i: usize| a.x.add((c * rows + i) * R + r);
        match a.values {
            CellValues::Q2K | CellValues::Q3K => {
                unreachable!("Q2_K and Q3_K cells take the 8-lane kernel")
            }
            // K-quant cells: every pair's row at once (P chains of multiply-adds per row).
            CellValues::Q4K | CellValues::Q5K | CellValues::Q6K | CellValues::IQ4XS => {
                let ahead =
                    head.map(|h| h.map(|p| prefetch_target(p, c, cells, cell_bytes, 2 * P)));
                macro_rules! run {
                    ($k:expr) => {
                        kcells::avx512::each_row::<P, $k, BYTES>(head, ahead, R <= 2, |p, w| {
                            multiply_into(&mut acc, w, |r| xrow(r, p))
                        })
                    };
                }
                kcells::by_kind!(a.values, run);
            }
            CellValues::Nibbles(_) | CellValues::Bytes(_) | CellValues::Iq4Nl => {
                let (s, table) = match a.values {
                    CellValues::Nibbles(s) | CellValues::Bytes(s) => (s, nibble_values),
                    _ => (Scales::HalfOnly, iq4_values),
                };
                let (scale, offset) = pair_scales(s, &head);
                let values = s.head_bytes();
                let mut wv = [_mm512_setzero_ps(); P];
                // Row pair p's bytes of each pair's two cells, widened: two 4-bit rows a lane.
                // A macro, not a function: a call moved this kernel's loop counters to memory
                // and cost 1-2% at 1 and 4 rows.
                macro_rules! widened {
                    ($p:expr) => {{
                        let mut q = [_mm512_setzero_si512(); P];
                        for (i, h) in head.iter().enumerate() {
                            let at = values + $p * GROUP;
                            q[i] = _mm512_cvtepu8_epi32(bytes16(h[0].add(at), h[1].add(at)));
                        }
                        q
                    }};
                }
                let f16_scales = matches!(a.values, CellValues::Nibbles(s) if s != Scales::F32);
                if f16_scales && (R == 2 || R == 3) {
                    // As Q4_K's `byte_rows`: both nibbles masked in place, the high one as
                    // 16 q by a sixteenth of the scale (exact for the file's f16 scales: a
                    // sixteenth of one is a normal f32 or zero), no shift and no lookup.
                    // Measured faster at 2 and 3 rows only (1.05x, 1.3x), the same at 1 and 4
                    // (bench/results/2026-12-06-q4k-rows-in-place-zen4).
                    let sixteenth = scale.map(|s| _mm512_mul_ps(s, _mm512_set1_ps(1.0 / 16.0)));
                    let (low, high) = (_mm512_set1_epi32(0x0f), _mm512_set1_epi32(0xf0));
                    for p in 0..rows / 2 {
                        let q = widened!(p);
                        let w = kcells::avx512::masked_weights(&q, low, &scale, &offset);
                        multiply_into(&mut acc, &w, |r| xrow(r, 2 * p));
                        let w = kcells::avx512::masked_weights(&q, high, &sixteenth, &offset);
                        multiply_into(&mut acc, &w, |r| xrow(r, 2 * p + 1));
                    }
                } else if let CellValues::Nibbles(_) | CellValues::Iq4Nl = a.values {
                    for p in 0..rows / 2 {
                        let q = widened!(p);
                        for i in 0..P {
                            let lo = _mm512_permutexvar_ps(q[i], table);
                            wv[i] = _mm512_fmadd_ps(scale[i], lo, offset[i]);
                        }
                        multiply_into(&mut acc, &wv, |r| xrow(r, 2 * p));
                        for i in 0..P {
                            let hi = _mm512_srli_epi32::<4>(q[i]);
                            let hi = _mm512_permutexvar_ps(hi, table);
                            wv[i] = _mm512_fmadd_ps(scale[i], hi, offset[i]);
                        }
                        multiply_into(&mut acc, &wv, |r| xrow(r, 2 * p + 1));
                    }
                } else {
                    for p in 0..rows {
                        for (i, h) in head.iter().enumerate() {
                            let at = values + p * GROUP;
                            let q = _mm512_cvtepi8_epi32(bytes16(h[0].add(at), h[1].add(at)));
                            wv[i] = _mm512_fmadd_ps(scale[i], _mm512_cvtepi32_ps(q), offset[i]);
                        }
                        multiply_into(&mut acc, &wv, |r| xrow(r, p));
                    }
                }
            }
            CellValues::FiveBits(s) => {
                let (scale, offset) = pair_scales(s, &head);
                let values = s.head_bytes();
                let mut wv = [_mm512_setzero_ps(); P];
                if BYTES {
                    // Q5_K's byte permutes (`kcells_bytes`).
                    let c = kcells_bytes::Constants::five_bits(five_bits::signed(s));
                    let at = five_bits::layout(s);
                    for r8 in (0..rows).step_by(8) {
                        let mut runs = [[[_mm512_setzero_si512(); 2]; 2]; P];
                        for (run, h) in runs.iter_mut().zip(&head) {
                            *run = kcells_bytes::run::<{ kcells::KIND_Q5K }>(*h, &at, r8, &c);
                        }
                        kcells_bytes::run_rows(&runs, &c, &scale, &offset, |j, w| {
                            multiply_into(&mut acc, w, |r| xrow(r, r8 + j))
                        });
                    }
                } else {
                    // The sign a constant in each copy of the loop, which then keeps to registers.
                    macro_rules! runs {
                        ($signed:expr) => {
                            for r8 in (0..rows).step_by(8) {
                                // Per pair, each half's rows: the two groups' bytes side by side.
                                let mut q = [[[_mm_setzero_si128(); 4]; 2]; P];
                                for (i, h) in head.iter().enumerate() {
                                    let a =
                                        five_bits::avx2::run_bytes(h[0].add(values), r8, $signed);
                                    let b =
                                        five_bits::avx2::run_bytes(h[1].add(values), r8, $signed);
                                    for half in 0..2 {
                                        let (qa, qb) = (
                                            five_bits::avx2::quarters(a[half]),
                                            five_bits::avx2::quarters(b[half]),
                                        );
                                        for p in 0..4 {
                                            q[i][half][p] = _mm_unpacklo_epi64(qa[p], qb[p]);
                                        }
                                    }
                                }
                                for p in 0..4 {
                                    for half in 0..2 {
                                        for i in 0..P {
                                            let w =
                                                _mm512_cvtepi32_ps(widen16(q[i][half][p], $signed));
                                            wv[i] = _mm512_fmadd_ps(scale[i], w, offset[i]);
                                        }
                                        multiply_into(&mut acc, &wv, |r| {
                                            xrow(r, r8 + 2 * p + half)
                                        });
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
            }
            CellValues::Bf16 | CellValues::F16 => {
                let mut wv = [_mm512_setzero_ps(); P];
                for p in 0..rows {
                    for (i, h) in head.iter().enumerate() {
                        let at = p * GROUP * 2;
                        wv[i] = widen_pair(a.values, h[0].add(at), h[1].add(at));
                    }
                    multiply_into(&mut acc, &wv, |r| xrow(r, p));
                }
            }
        }
        // The end of a KC block (or of the reduction): out = block sum for the first block,
        // out += block sum after it, as the f32 kernels do.
        if (c + 1) % per_block == 0 || c + 1 == cells {
            let first = c < per_block;
            for (r, row) in acc.iter_mut().enumerate() {
                for (i, v) in row.iter_mut().enumerate() {
                    let o = a.out.add(r * a.stride + i * 2 * GROUP);
                    let sum = if first {
                        *v
                    } else {
                        _mm512_add_ps(_mm512_loadu_ps(o), *v)
                    };
                    _mm512_storeu_ps(o, sum);
                    *v = _mm512_setzero_ps();
                }
            }
        }
    }
}

/// Whether [`run_pairs`] asks for the cells [`AHEAD`] of the 32-row cells it reads (Q8_0,
/// Q4_0, Q4_1, Q5_0, Q5_1, IQ4_NL, 16-bit floats). Not on Zen 4 (AMD family 0x19 with AVX-512):
/// there the hardware prefetchers keep up with the pairs' streams alone, and the asks, a few per
/// 32 rows of each group, made one-row Q8_0 products from memory 1.2-1.3x slower
/// (bench/results/2026-12-05-broadcast-operands). Other CPUs keep them (measured where they were
/// added). K-quant cells, 256 rows each, keep theirs everywhere: without them one-row Q6_K from
/// memory fell from 26 to 18 G weights/s on that core.
fn prefetches_cells() -> bool {
    !crate::cpu().zen4()
}

/// Each pair's 16 scales and offsets, from the heads of its two cells.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn pair_scales<const P: usize>(
    s: Scales,
    head: &[[*const u8; 2]; P],
) -> ([__m512; P], [__m512; P]) {
    let mut scale = [_mm512_setzero_ps(); P];
    let mut offset = [_mm512_setzero_ps(); P];
    for (i, h) in head.iter().enumerate() {
        (scale[i], offset[i]) = head_pair(s, h[0], h[1]);
    }
    (scale, offset)
}

/// `acc[r][i] += x(r) * w[i]` for every row and pair, `x(r)` pointing at row r's value.
/// Each multiply-add broadcasts its x in its own load (`{1to16}`): LLVM would emit one
/// `vbroadcastss` per row, which on Zen 4 takes a slot of the vector pipes that the weights'
/// permutes and shifts already fill (bench/results/2026-12-05-broadcast-operands).
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn multiply_into<const R: usize, const P: usize>(
    acc: &mut [[__m512; P]; R],
    w: &[__m512; P],
    x: impl Fn(usize) -> *const f32,
) {
    for (r, row) in acc.iter_mut().enumerate() {
        let xp = x(r);
        for (a, w) in row.iter_mut().zip(w) {
            // SAFETY: AVX-512F is enabled; `xp` points at an f32 of the set's x.
            unsafe {
                std::arch::asm!(
                    "vfmadd231ps {a}, {w}, dword ptr [{x}]{{1to16}}",
                    a = inout(zmm_reg) *a, w = in(zmm_reg) *w, x = in(reg) xp,
                    options(pure, readonly, nostack, preserves_flags),
                )
            };
        }
    }
}
