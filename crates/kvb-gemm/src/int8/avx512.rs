//! The AVX-512 VNNI kernel: up to 8 rows against one group of 16 columns, or up to 4 rows against
//! two, an i32 sum per row and group per block in a register (`vpdpbusd`: 4 byte products per lane per instruction, the weights'
//! unsigned bytes times the row's signed bytes), scaled into an f32 output per row, both in
//! registers for the whole reduction. The same steps as [`super::products::portable`].

use super::products::{MAX_TILE_ROWS, PAIR_ROWS};
use super::{IntDotMatrix, QuantizedRows, BLOCK, LANES};
use crate::packed::Scales;
use std::arch::x86_64::*;

/// Rows `r0..r0 + rows` of `a` against `groups` adjacent groups of `w` from `g` (1 group and
/// 1 to 8 rows, or 2 groups and 1 to [`PAIR_ROWS`] rows), into `out` (row `r`'s lanes of group
/// `g + j` at `(r * groups + j) * 16`).
///
/// Two groups share each broadcast of a row's four bytes: every `vpdpbusd` of a one-group tile
/// needs its own broadcast load, and the load ports set its pace (16 rows, weights in L2, one
/// core: 1.07x faster with pairs on Q4_1, 1.18x on Q8_0). Each output still gets exactly the
/// one-group steps, so the bits are the same.
///
/// With `prefetch`, the kernel asks for the weights [`AHEAD`] blocks on as it goes: a model's
/// weights come from memory at every step, and a tile of many rows works on each block long
/// enough for the hardware prefetchers to fall behind (16 rows over 56 MB of Q4_1 weights, one
/// core: 11.4 -> 6.0 ms). Only the first row tile of a group needs it; the others find the
/// block in L1.
///
/// # Safety
/// The CPU has AVX-512F, BW and VNNI; `a` holds rows `r0..r0 + rows` of width `w.k`; groups
/// `g..g + groups` are groups of `w`; `out` holds `rows * groups * 16` values.
pub(super) unsafe fn tile(
    a: &QuantizedRows,
    r0: usize,
    rows: usize,
    w: &IntDotMatrix,
    (g, groups): (usize, usize),
    prefetch: bool,
    out: &mut [f32],
) {
    assert!(
        (groups == 1 && rows <= MAX_TILE_ROWS || groups == 2 && rows <= PAIR_ROWS)
            && out.len() >= rows * groups * LANES
            && r0 + rows <= a.m
            && g + groups <= w.n.div_ceil(LANES)
    );
    macro_rules! dispatch {
        ($groups:literal: $($r:literal)*) => {
            match (rows, w.nibbles, w.has_offsets) {
                $(
                    ($r, true, true) => run::<$r, $groups, true, true>(a, r0, w, g, prefetch, out),
                    ($r, true, false) => run::<$r, $groups, true, false>(a, r0, w, g, prefetch, out),
                    ($r, false, true) => run::<$r, $groups, false, true>(a, r0, w, g, prefetch, out),
                    ($r, false, false) => run::<$r, $groups, false, false>(a, r0, w, g, prefetch, out),
                )*
                _ => {}
            }
        };
    }
    if groups == 1 {
        dispatch!(1: 1 2 3 4 5 6 7 8);
    } else {
        dispatch!(2: 1 2 3 4);
    }
}

/// Blocks ahead whose weights a kernel asks for while it works on one.
const AHEAD: usize = 8;

/// The 4 bytes of row `r`'s block `b` from value `at` (`q` is `[m, k]`), as one i32 to
/// broadcast.
#[inline(always)]
unsafe fn four(q: *const i8, at: usize) -> __m512i {
    _mm512_set1_epi32((q.add(at) as *const i32).read_unaligned())
}

#[target_feature(enable = "avx512f,avx512bw,avx512vnni,f16c")]
unsafe fn run<const R: usize, const G: usize, const NIBBLES: bool, const OFFSETS: bool>(
    a: &QuantizedRows,
    r0: usize,
    w: &IntDotMatrix,
    g: usize,
    prefetch: bool,
    out: &mut [f32],
) {
    let (k, blocks) = (a.k, a.k / BLOCK);
    let (head_bytes, value_bytes) = (w.head_bytes(), w.value_bytes());
    let heads: [*const u8; G] = std::array::from_fn(|j| w.group(g + j).0.as_ptr());
    let group: [*const u8; G] = std::array::from_fn(|j| w.group(g + j).1.as_ptr());
    let q = a.q.as_ptr().add(r0 * k);
    let low = _mm512_set1_epi8(0x0f);
    let mut y = [[_mm512_setzero_ps(); G]; R];
    for b in 0..blocks {
        let block: [*const u8; G] = std::array::from_fn(|j| group[j].add(b * value_bytes));
        if prefetch {
            for (j, start) in block.into_iter().enumerate() {
                // Past the values' end this is the next group's heads (groups are contiguous),
                // and a prefetch never faults.
                let ahead = start.wrapping_add(AHEAD * value_bytes);
                for line in (0..value_bytes).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line) as *const i8);
                }
                let head_ahead = heads[j].wrapping_add((b + AHEAD) * head_bytes);
                _mm_prefetch::<_MM_HINT_T0>(head_ahead as *const i8);
            }
        }
        let at = |r: usize| (r0 + r) * blocks + b;
        let mut acc = [[_mm512_setzero_si512(); G]; R];
        if NIBBLES {
            for c in 0..4 {
                let mut lo = [_mm512_setzero_si512(); G];
                let mut hi = [_mm512_setzero_si512(); G];
                for j in 0..G {
                    let v = _mm512_loadu_si512(block[j].add(64 * c) as *const _);
                    lo[j] = _mm512_and_si512(v, low);
                    hi[j] = _mm512_and_si512(_mm512_srli_epi16::<4>(v), low);
                }
                for (r, acc) in acc.iter_mut().enumerate() {
                    let x = r * k + b * BLOCK + 4 * c;
                    let (xl, xh) = (four(q, x), four(q, x + 16));
                    for j in 0..G {
                        acc[j] = _mm512_dpbusd_epi32(acc[j], lo[j], xl);
                        acc[j] = _mm512_dpbusd_epi32(acc[j], hi[j], xh);
                    }
                }
            }
        } else {
            for (r, acc) in acc.iter_mut().enumerate() {
                let correction = _mm512_set1_epi32(*a.unsigned_correction.get_unchecked(at(r)));
                acc.iter_mut().for_each(|a| *a = correction);
            }
            for t in 0..8 {
                let v: [__m512i; G] =
                    std::array::from_fn(|j| _mm512_loadu_si512(block[j].add(64 * t) as *const _));
                for (r, acc) in acc.iter_mut().enumerate() {
                    let x = four(q, r * k + b * BLOCK + 4 * t);
                    for j in 0..G {
                        acc[j] = _mm512_dpbusd_epi32(acc[j], v[j], x);
                    }
                }
            }
        }
        for j in 0..G {
            let (scales, offsets) = head(w.scales, heads[j].add(b * head_bytes));
            for r in 0..R {
                let dx = _mm512_set1_ps(*a.scale.get_unchecked(at(r)));
                let sum = _mm512_cvtepi32_ps(acc[r][j]);
                y[r][j] = _mm512_fmadd_ps(sum, _mm512_mul_ps(scales, dx), y[r][j]);
                if OFFSETS {
                    let sx = _mm512_set1_ps(*a.scaled_sum.get_unchecked(at(r)));
                    y[r][j] = _mm512_fmadd_ps(offsets, sx, y[r][j]);
                }
            }
        }
    }
    for (r, y) in y.iter().enumerate() {
        for (j, y) in y.iter().enumerate() {
            _mm512_storeu_ps(out.as_mut_ptr().add((r * G + j) * LANES), *y);
        }
    }
}

/// The 16 columns' scales and offsets of the head at `p`, as [`Scales::read_of`] gives them.
#[inline]
#[target_feature(enable = "avx512f,f16c")]
unsafe fn head(scales: Scales, p: *const u8) -> (__m512, __m512) {
    let halves = |at: usize| _mm512_cvtph_ps(_mm256_loadu_si256(p.add(at) as *const __m256i));
    match scales {
        Scales::F32 => (
            _mm512_loadu_ps(p as *const f32),
            _mm512_loadu_ps((p as *const f32).add(LANES)),
        ),
        Scales::Half => (halves(0), halves(2 * LANES)),
        Scales::HalfCentred => {
            let d = halves(0);
            (d, _mm512_mul_ps(_mm512_set1_ps(-8.0), d))
        }
        Scales::HalfOnly => (halves(0), _mm512_set1_ps(-0.0)),
    }
}
