//! The AVX2 kernel, for CPUs without AVX-512 VNNI: a group's 16 columns as two 8-lane halves,
//! byte products by `vpmaddubsw` (unsigned weight bytes times signed activation bytes, pairs
//! summed to i16) and `vpmaddwd` (pairs of i16 summed to i32). The integer sums are the VNNI
//! kernel's, the float steps [`super::products::portable`]'s, so all three give the same bits.
//!
//! 4-bit weights (at most 15) times activations (at most 127 in magnitude) sum to at most 3,810
//! per i16 pair, so a whole block's 8 products add up in i16 before one widening. 8-bit weights
//! are taken back to signed (`u - 128`) and multiplied as `|q|` times `x` with `q`'s sign moved
//! onto `x` (`vpsignb`), at most 32,512 per pair: widened at every step.

use super::products::MAX_TILE_ROWS;
use super::{IntDotMatrix, QuantizedRows, BLOCK, LANES};
use crate::packed::head_lanes;
use std::arch::x86_64::*;

/// Rows one pass keeps in registers: an i32 sum and an f32 output per row per half, 16
/// registers in all.
const PASS_ROWS: usize = 2;

/// Rows `r0..r0 + rows` (1 to 8) of `a` against group `g` of `w`, into `out` (row `r`'s 16 lanes
/// at `r * 16`), in passes of up to 2 rows over the group's blocks.
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `a` holds rows `r0..r0 + rows` of width `w.k`; `g` is a group of
/// `w`; `out` holds `rows * 16` values.
pub(super) unsafe fn tile(
    a: &QuantizedRows,
    r0: usize,
    rows: usize,
    w: &IntDotMatrix,
    g: usize,
    out: &mut [f32],
) {
    assert!(rows <= MAX_TILE_ROWS && out.len() >= rows * LANES && r0 + rows <= a.m);
    for p in (0..rows).step_by(PASS_ROWS) {
        let at = &mut out[p * LANES..];
        match (rows - p >= 2, w.nibbles, w.has_offsets) {
            (true, true, true) => run::<2, true, true>(a, r0 + p, w, g, at),
            (true, true, false) => run::<2, true, false>(a, r0 + p, w, g, at),
            (true, false, true) => run::<2, false, true>(a, r0 + p, w, g, at),
            (true, false, false) => run::<2, false, false>(a, r0 + p, w, g, at),
            (false, true, true) => run::<1, true, true>(a, r0 + p, w, g, at),
            (false, true, false) => run::<1, true, false>(a, r0 + p, w, g, at),
            (false, false, true) => run::<1, false, true>(a, r0 + p, w, g, at),
            (false, false, false) => run::<1, false, false>(a, r0 + p, w, g, at),
        }
    }
}

/// The 4 bytes of the activations at `at` (`q` is `[m, k]`), broadcast to every lane.
#[inline(always)]
unsafe fn four(q: *const i8, at: usize) -> __m256i {
    _mm256_set1_epi32((q.add(at) as *const i32).read_unaligned())
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run<const R: usize, const NIBBLES: bool, const OFFSETS: bool>(
    a: &QuantizedRows,
    r0: usize,
    w: &IntDotMatrix,
    g: usize,
    out: &mut [f32],
) {
    let (k, blocks) = (a.k, a.k / BLOCK);
    let (head_bytes, value_bytes) = (w.head_bytes(), w.value_bytes());
    let (heads, group) = w.group(g);
    let q = a.q.as_ptr().add(r0 * k);
    let low = _mm256_set1_epi8(0x0f);
    let flip = _mm256_set1_epi8(-128);
    let ones = _mm256_set1_epi16(1);
    let mut y = [[_mm256_setzero_ps(); 2]; R];
    for b in 0..blocks {
        let head = heads.as_ptr().add(b * head_bytes);
        let values = group.as_ptr().add(b * value_bytes);
        let mut acc = [[_mm256_setzero_si256(); 2]; R];
        for (half, o) in [0usize, 32].into_iter().enumerate() {
            if NIBBLES {
                let mut pairs = [_mm256_setzero_si256(); R];
                for c in 0..4 {
                    let v = _mm256_loadu_si256(values.add(64 * c + o) as *const __m256i);
                    let lo = _mm256_and_si256(v, low);
                    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low);
                    for (r, pairs) in pairs.iter_mut().enumerate() {
                        let x = r * k + b * BLOCK + 4 * c;
                        *pairs = _mm256_add_epi16(*pairs, _mm256_maddubs_epi16(lo, four(q, x)));
                        *pairs =
                            _mm256_add_epi16(*pairs, _mm256_maddubs_epi16(hi, four(q, x + 16)));
                    }
                }
                for r in 0..R {
                    acc[r][half] = _mm256_madd_epi16(pairs[r], ones);
                }
            } else {
                for t in 0..8 {
                    let u = _mm256_loadu_si256(values.add(64 * t + o) as *const __m256i);
                    let signed = _mm256_xor_si256(u, flip);
                    let magnitude = _mm256_abs_epi8(signed);
                    for (r, acc) in acc.iter_mut().enumerate() {
                        let x = _mm256_sign_epi8(four(q, r * k + b * BLOCK + 4 * t), signed);
                        let pairs = _mm256_maddubs_epi16(magnitude, x);
                        acc[half] = _mm256_add_epi32(acc[half], _mm256_madd_epi16(pairs, ones));
                    }
                }
            }
        }
        for half in 0..2 {
            let (scales, offsets) = head_lanes(w.scales, head, LANES, 8 * half);
            for r in 0..R {
                let at = (r0 + r) * blocks + b;
                let dx = _mm256_set1_ps(*a.scale.get_unchecked(at));
                let sum = _mm256_cvtepi32_ps(acc[r][half]);
                y[r][half] = _mm256_fmadd_ps(sum, _mm256_mul_ps(scales, dx), y[r][half]);
                if OFFSETS {
                    let sx = _mm256_set1_ps(*a.scaled_sum.get_unchecked(at));
                    y[r][half] = _mm256_fmadd_ps(offsets, sx, y[r][half]);
                }
            }
        }
    }
    for (r, y) in y.iter().enumerate() {
        _mm256_storeu_ps(out.as_mut_ptr().add(r * LANES), y[0]);
        _mm256_storeu_ps(out.as_mut_ptr().add(r * LANES + 8), y[1]);
    }
}
