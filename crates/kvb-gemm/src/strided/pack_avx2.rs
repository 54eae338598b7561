//! The two packings of a strided product that transpose, with AVX2: a row-contiguous `a` into
//! `[kc, MR]` panels, and a column-contiguous `b` (keys read as a transpose) into `[kc, NR]`
//! panels. Done one value at a time, they were 14% of a 2,706-token prefill (`perf`); here 8 x 8
//! blocks are transposed in registers. They write the same values to the same places as the
//! scalar loops in `super`, so products keep their bits.

use super::Strided;
use crate::kernel::{MR, NR};
use std::arch::x86_64::*;

/// The 8 x 8 transpose of `r` (row `i` of the result holds element `i` of every input).
#[inline]
#[target_feature(enable = "avx2")]
fn transpose8(r: [__m256; 8]) -> [__m256; 8] {
    let t0 = _mm256_unpacklo_ps(r[0], r[1]);
    let t1 = _mm256_unpackhi_ps(r[0], r[1]);
    let t2 = _mm256_unpacklo_ps(r[2], r[3]);
    let t3 = _mm256_unpackhi_ps(r[2], r[3]);
    let t4 = _mm256_unpacklo_ps(r[4], r[5]);
    let t5 = _mm256_unpackhi_ps(r[4], r[5]);
    let t6 = _mm256_unpacklo_ps(r[6], r[7]);
    let t7 = _mm256_unpackhi_ps(r[6], r[7]);
    // Inputs 0-3's elements (0, 4), (1, 5), (2, 6), (3, 7) in the two halves...
    let u0 = _mm256_shuffle_ps::<0x44>(t0, t2);
    let u1 = _mm256_shuffle_ps::<0xEE>(t0, t2);
    let u2 = _mm256_shuffle_ps::<0x44>(t1, t3);
    let u3 = _mm256_shuffle_ps::<0xEE>(t1, t3);
    // ...and inputs 4-7's.
    let u4 = _mm256_shuffle_ps::<0x44>(t4, t6);
    let u5 = _mm256_shuffle_ps::<0xEE>(t4, t6);
    let u6 = _mm256_shuffle_ps::<0x44>(t5, t7);
    let u7 = _mm256_shuffle_ps::<0xEE>(t5, t7);
    [
        _mm256_permute2f128_ps::<0x20>(u0, u4),
        _mm256_permute2f128_ps::<0x20>(u1, u5),
        _mm256_permute2f128_ps::<0x20>(u2, u6),
        _mm256_permute2f128_ps::<0x20>(u3, u7),
        _mm256_permute2f128_ps::<0x31>(u0, u4),
        _mm256_permute2f128_ps::<0x31>(u1, u5),
        _mm256_permute2f128_ps::<0x31>(u2, u6),
        _mm256_permute2f128_ps::<0x31>(u3, u7),
    ]
}

/// [`super::pack_rows`] for one whole panel (`MR` rows) of an `a` whose rows are contiguous (queries,
/// score tiles): 8 columns of the 6 rows at a time are transposed in registers (two zero rows
/// make the eighth), and each column's 6 values are stored as 8, the 2 extra overwritten by the
/// next column's store; the last column of a run goes through a small buffer so nothing is
/// written past it.
///
/// # Safety
/// As for [`super::pack_rows`], with `a.col == 1`, rows `i0..i0 + MR` inside `a` and AVX2 present.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn rows_panel(a: Strided, i0: usize, k0: usize, kc: usize, panel: &mut [f32]) {
    const { assert!(MR == 6) };
    debug_assert!(a.col == 1 && panel.len() == kc * MR);
    let row = |r: usize| {
        a.ptr
            .wrapping_offset((i0 + r) as isize * a.row + k0 as isize)
    };
    let whole_p = kc / 8 * 8;
    for p in (0..whole_p).step_by(8) {
        let r: [__m256; 8] = std::array::from_fn(|i| {
            if i < MR {
                // SAFETY: row i0 + i < m and columns k0 + p..k0 + p + 8 < k0 + kc, as the
                // caller promised.
                unsafe { _mm256_loadu_ps(row(i).add(p)) }
            } else {
                _mm256_setzero_ps()
            }
        });
        let columns = transpose8(r);
        for (i, v) in columns.into_iter().enumerate() {
            let at = (p + i) * MR;
            if i < 7 {
                // (p + i) * 6 + 8 <= (p + 8) * 6 <= kc * 6: inside the panel.
                let dst = &mut panel[at..][..8];
                // SAFETY: `dst` holds 8 values.
                unsafe { _mm256_storeu_ps(dst.as_mut_ptr(), v) };
            } else {
                let mut last = [0f32; 8];
                // SAFETY: `last` holds 8 values.
                unsafe { _mm256_storeu_ps(last.as_mut_ptr(), v) };
                panel[at..][..MR].copy_from_slice(&last[..MR]);
            }
        }
    }
    for p in whole_p..kc {
        for r in 0..MR {
            // SAFETY: as above.
            panel[p * MR + r] = unsafe { *row(r).add(p) };
        }
    }
}

/// [`super::pack_columns`] for a `b` whose columns are contiguous (the keys of a score product, read as
/// a transpose): 8 columns by 8 rows at a time are loaded as 8 vectors and transposed in
/// registers, instead of one scalar store per value (the scalar walk was 7% of a 2,706-token
/// prefill). The panels hold the same values in the same places.
///
/// # Safety
/// As for [`super::pack_columns`], with `b.row == 1` and AVX2 present.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn transposed_columns(
    b: Strided,
    n: usize,
    k0: usize,
    kc: usize,
    out: &mut [f32],
) {
    debug_assert_eq!(b.row, 1);
    for j0 in (0..n).step_by(NR) {
        let panel = &mut out[j0 * kc..][..kc * NR];
        let valid = NR.min(n - j0);
        // Column `j`'s rows `k0..k0 + kc`, contiguous.
        let column = |j: usize| {
            b.ptr
                .wrapping_offset((j0 + j) as isize * b.col + k0 as isize)
        };
        let (whole_j, whole_p) = (valid / 8 * 8, kc / 8 * 8);
        for j in (0..whole_j).step_by(8) {
            for p in (0..whole_p).step_by(8) {
                // SAFETY: columns j0 + j..j0 + j + 8 < n and rows k0 + p..k0 + p + 8 < k0 + kc
                // lie in `b`, as the caller promised.
                let r: [__m256; 8] =
                    std::array::from_fn(|i| unsafe { _mm256_loadu_ps(column(j + i).add(p)) });
                let rows = transpose8(r);
                for (i, v) in rows.into_iter().enumerate() {
                    let at = &mut panel[(p + i) * NR + j..][..8];
                    // SAFETY: `at` holds 8 values.
                    unsafe { _mm256_storeu_ps(at.as_mut_ptr(), v) };
                }
            }
            for p in whole_p..kc {
                for i in 0..8 {
                    // SAFETY: as above.
                    panel[p * NR + j + i] = unsafe { *column(j + i).add(p) };
                }
            }
        }
        for j in whole_j..valid {
            for p in 0..kc {
                // SAFETY: as above.
                panel[p * NR + j] = unsafe { *column(j).add(p) };
            }
        }
    }
}
