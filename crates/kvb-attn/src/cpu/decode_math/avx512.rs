//! The AVX-512 version of the decode arithmetic, with the bits of [`super::avx2`]: each lane does
//! what an AVX2 lane does, in the same order.
//!
//! - Scores put two keys in one register (key `a`'s 8-value chunk in lanes 0-7, key `b`'s in
//!   8-15, the query's chunk in both halves), so a key keeps its 8 running lanes and the same
//!   final reduction, and 8 keys go per pass instead of 4.
//! - Value sums run 16 dimensions per register: a lane is one dimension, summed over the keys in
//!   order, exactly as in 8-lane registers.

use super::avx2::{reduce4, scores3 as scores3_avx2, Elem};
use super::{scores_in_threes, sums_in_threes, Avx2, Avx512, DecodeMath};
use super::{ScoresKernels, SumsKernels};
use half::f16;
use std::arch::x86_64::*;

/// Lanes 0-7 and 8-15 of `v`.
#[inline(always)]
unsafe fn split(v: __m512) -> (__m256, __m256) {
    (
        _mm512_castps512_ps256(v),
        _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))),
    )
}

/// Scores of `H` (1 to 3) heads against keys, 8 keys per pass in 4 registers of two; the last
/// `n % 8` keys go through the 8-lane kernel (the same bits).
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn scores3<const H: usize, E: Elem>(
    qs: [*const f32; 3],
    keys: &[E],
    d: usize,
    scale: f32,
    out: [*mut f32; 3],
    n: usize,
) {
    let kp = keys.as_ptr();
    let sv = _mm_set1_ps(scale);
    let mut j = 0;
    while j + 8 <= n {
        let k = kp.add(j * d);
        let mut a = [[_mm512_setzero_ps(); 4]; H];
        for c in (0..d).step_by(8) {
            let kv: [__m512; 4] = std::array::from_fn(|i| {
                E::halves(k.add(2 * i * d + c), k.add((2 * i + 1) * d + c))
            });
            for (h, acc) in a.iter_mut().enumerate() {
                let qv = _mm512_castpd_ps(_mm512_broadcast_f64x4(_mm256_loadu_pd(
                    qs[h].add(c) as *const f64
                )));
                for (acc, kv) in acc.iter_mut().zip(&kv) {
                    *acc = _mm512_fmadd_ps(qv, *kv, *acc);
                }
            }
        }
        for (h, a) in a.iter().enumerate() {
            let [(k0, k1), (k2, k3), (k4, k5), (k6, k7)] = a.map(|v| split(v));
            _mm_storeu_ps(out[h].add(j), _mm_mul_ps(reduce4(k0, k1, k2, k3), sv));
            _mm_storeu_ps(out[h].add(j + 4), _mm_mul_ps(reduce4(k4, k5, k6, k7), sv));
        }
        j += 8;
    }
    if j < n {
        let rest = out.map(|o| o.add(j));
        scores3_avx2::<H, E>(qs, &keys[j * d..], d, scale, rest, n - j);
    }
}

/// Value sums of `H` (1 to 3) heads, `CH` registers of 16 dimensions at a time from lane `c`:
/// each value row is read once for all the heads.
#[inline(always)]
unsafe fn accumulate_chunks<const H: usize, const CH: usize, E: Elem>(
    acc: [*mut f32; 3],
    p: [*const f32; 3],
    values: *const E,
    d: usize,
    n: usize,
    c: usize,
) {
    let mut a: [[__m512; CH]; H] =
        std::array::from_fn(|h| std::array::from_fn(|i| _mm512_loadu_ps(acc[h].add(c + 16 * i))));
    for j in 0..n {
        let row = values.add(j * d + c);
        let w: [__m512; H] = std::array::from_fn(|h| _mm512_set1_ps(*p[h].add(j)));
        let v: [__m512; CH] = std::array::from_fn(|i| E::load16(row.add(16 * i)));
        for (a, w) in a.iter_mut().zip(&w) {
            for (a, v) in a.iter_mut().zip(&v) {
                *a = _mm512_fmadd_ps(*w, *v, *a);
            }
        }
    }
    for (h, a) in a.iter().enumerate() {
        for (i, a) in a.iter().enumerate() {
            _mm512_storeu_ps(acc[h].add(c + 16 * i), *a);
        }
    }
}

/// Value sums of `H` (1 to 3) heads over `d` (a multiple of 16) dimensions: 64 at a time (12
/// accumulators for 3 heads), then 16.
#[target_feature(enable = "avx512f")]
unsafe fn accumulate3<const H: usize, E: Elem>(
    acc: [*mut f32; 3],
    p: [*const f32; 3],
    values: &[E],
    d: usize,
    n: usize,
) {
    let mut c = 0;
    while c + 64 <= d {
        accumulate_chunks::<H, 4, E>(acc, p, values.as_ptr(), d, n, c);
        c += 64;
    }
    while c < d {
        accumulate_chunks::<H, 1, E>(acc, p, values.as_ptr(), d, n, c);
        c += 16;
    }
}

/// Needs `d % 16 == 0` and AVX-512F (the caller falls back to [`Avx2`] otherwise); what it does
/// not vectorise wider it leaves to [`Avx2`].
impl DecodeMath for Avx512 {
    fn max(scores: &[f32]) -> f32 {
        Avx2::max(scores)
    }

    fn exp_sum(scores: &mut [f32], max: f32) -> f32 {
        Avx2::exp_sum(scores, max)
    }

    fn scores_group(
        q: super::Heads,
        keys: &[f32],
        d: usize,
        scale: f32,
        out: &mut [f32],
        out_stride: usize,
        n: usize,
    ) {
        debug_assert!(d.is_multiple_of(16) && keys.len() >= n * d);
        let kernels: ScoresKernels = [scores3::<1, f32>, scores3::<2, f32>, scores3::<3, f32>];
        // SAFETY: AVX-512F (and AVX2/FMA/F16C) present and d % 16 == 0 (see
        // `decode_attention`); queries, keys and outputs lie within what the caller passed
        // (asserted above and by `out_stride`, `n`).
        unsafe { scores_in_threes(kernels, q, keys, d, scale, out, out_stride, n) }
    }

    fn accumulate_group(
        acc: &mut [f32],
        acc_stride: usize,
        p: &[f32],
        p_stride: usize,
        heads: usize,
        values: &[f32],
        d: usize,
        n: usize,
    ) {
        debug_assert!(d.is_multiple_of(16) && values.len() >= n * d);
        let kernels: SumsKernels = [
            accumulate3::<1, f32>,
            accumulate3::<2, f32>,
            accumulate3::<3, f32>,
        ];
        // SAFETY: as above; head `h`'s accumulator and weights lie at `h * stride`.
        unsafe { sums_in_threes(kernels, acc, acc_stride, p, p_stride, heads, values, d, n) }
    }

    const READS_F16: bool = true;

    fn scores_group_f16(
        q: super::Heads,
        keys: &[f16],
        d: usize,
        scale: f32,
        out: &mut [f32],
        out_stride: usize,
        n: usize,
    ) {
        debug_assert!(d.is_multiple_of(16) && keys.len() >= n * d);
        let kernels: ScoresKernels<f16> = [scores3::<1, f16>, scores3::<2, f16>, scores3::<3, f16>];
        // SAFETY: as in `scores_group`; the CPU has F16C too (see `decode_attention`).
        unsafe { scores_in_threes(kernels, q, keys, d, scale, out, out_stride, n) }
    }

    fn accumulate_group_f16(
        acc: &mut [f32],
        acc_stride: usize,
        p: &[f32],
        p_stride: usize,
        heads: usize,
        values: &[f16],
        d: usize,
        n: usize,
    ) {
        debug_assert!(d.is_multiple_of(16) && values.len() >= n * d);
        let kernels: SumsKernels<f16> = [
            accumulate3::<1, f16>,
            accumulate3::<2, f16>,
            accumulate3::<3, f16>,
        ];
        // SAFETY: as in `accumulate_group`.
        unsafe { sums_in_threes(kernels, acc, acc_stride, p, p_stride, heads, values, d, n) }
    }

    fn scores(q: &[f32], keys: &[f32], d: usize, scale: f32, out: &mut [f32]) {
        Avx2::scores(q, keys, d, scale, out)
    }

    fn accumulate(acc: &mut [f32], p: &[f32], values: &[f32], d: usize) {
        Self::accumulate_group(acc, d, p, p.len(), 1, values, d, p.len())
    }
}
