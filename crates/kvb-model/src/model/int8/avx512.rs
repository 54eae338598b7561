//! The AVX-512 VNNI kernel: up to 8 rows against one group of 16 columns, an i32 sum per row
//! per block in a register (`vpdpbusd`: 4 byte products per lane per instruction, the weights'
//! unsigned bytes times the row's signed bytes), scaled into an f32 output per row, both in
//! registers for the whole reduction. The same steps as [`super::products::portable`].

use super::matrix::HEAD;
use super::products::MAX_TILE_ROWS;
use super::{IntDotMatrix, QuantizedRows, BLOCK, LANES};
use std::arch::x86_64::*;

/// Rows `r0..r0 + rows` (1 to 8) of `a` against group `g` of `w`, into `out` (row `r`'s 16 lanes
/// at `r * 16`).
///
/// # Safety
/// The CPU has AVX-512F, BW and VNNI; `a` holds rows `r0..r0 + rows` of width `w.k`; `g` is a
/// group of `w`; `out` holds `rows * 16` values.
pub(super) unsafe fn tile(
    a: &QuantizedRows,
    r0: usize,
    rows: usize,
    w: &IntDotMatrix,
    g: usize,
    out: &mut [f32],
) {
    assert!(rows <= MAX_TILE_ROWS && out.len() >= rows * LANES && r0 + rows <= a.m);
    macro_rules! dispatch {
        ($($r:literal)*) => {
            match (rows, w.nibbles, w.has_offsets) {
                $(
                    ($r, true, true) => run::<$r, true, true>(a, r0, w, g, out),
                    ($r, true, false) => run::<$r, true, false>(a, r0, w, g, out),
                    ($r, false, true) => run::<$r, false, true>(a, r0, w, g, out),
                    ($r, false, false) => run::<$r, false, false>(a, r0, w, g, out),
                )*
                _ => {}
            }
        };
    }
    dispatch!(1 2 3 4 5 6 7 8);
}

/// The 4 bytes of row `r`'s block `b` from value `at` (`q` is `[m, k]`), as one i32 to
/// broadcast.
#[inline(always)]
unsafe fn four(q: *const i8, at: usize) -> __m512i {
    _mm512_set1_epi32((q.add(at) as *const i32).read_unaligned())
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
unsafe fn run<const R: usize, const NIBBLES: bool, const OFFSETS: bool>(
    a: &QuantizedRows,
    r0: usize,
    w: &IntDotMatrix,
    g: usize,
    out: &mut [f32],
) {
    let (k, blocks) = (a.k, a.k / BLOCK);
    let block_bytes = w.block_bytes();
    let group = w.group(g);
    let q = a.q.as_ptr().add(r0 * k);
    let low = _mm512_set1_epi8(0x0f);
    let mut y = [_mm512_setzero_ps(); R];
    for b in 0..blocks {
        let block = group.as_ptr().add(b * block_bytes);
        let values = block.add(HEAD);
        let at = |r: usize| (r0 + r) * blocks + b;
        let mut acc = [_mm512_setzero_si512(); R];
        if NIBBLES {
            for c in 0..4 {
                let v = _mm512_loadu_si512(values.add(64 * c) as *const _);
                let lo = _mm512_and_si512(v, low);
                let hi = _mm512_and_si512(_mm512_srli_epi16::<4>(v), low);
                for (r, acc) in acc.iter_mut().enumerate() {
                    let x = r * k + b * BLOCK + 4 * c;
                    *acc = _mm512_dpbusd_epi32(*acc, lo, four(q, x));
                    *acc = _mm512_dpbusd_epi32(*acc, hi, four(q, x + 16));
                }
            }
        } else {
            for (r, acc) in acc.iter_mut().enumerate() {
                *acc = _mm512_set1_epi32(*a.unsigned_correction.get_unchecked(at(r)));
            }
            for t in 0..8 {
                let v = _mm512_loadu_si512(values.add(64 * t) as *const _);
                for (r, acc) in acc.iter_mut().enumerate() {
                    *acc = _mm512_dpbusd_epi32(*acc, v, four(q, r * k + b * BLOCK + 4 * t));
                }
            }
        }
        let scales = _mm512_loadu_ps(block as *const f32);
        let offsets = _mm512_loadu_ps(block.add(LANES * 4) as *const f32);
        for r in 0..R {
            let dx = _mm512_set1_ps(*a.scale.get_unchecked(at(r)));
            let sum = _mm512_cvtepi32_ps(acc[r]);
            y[r] = _mm512_fmadd_ps(sum, _mm512_mul_ps(scales, dx), y[r]);
            if OFFSETS {
                let sx = _mm512_set1_ps(*a.scaled_sum.get_unchecked(at(r)));
                y[r] = _mm512_fmadd_ps(offsets, sx, y[r]);
            }
        }
    }
    for (r, y) in y.iter().enumerate() {
        _mm512_storeu_ps(out.as_mut_ptr().add(r * LANES), *y);
    }
}
