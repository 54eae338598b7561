//! The AVX2 and FMA version of the decode arithmetic.

use super::{reduce, scores_in_threes, sums_in_threes, tile_max, Avx2, DecodeMath};
use super::{ScoresKernels, SumsKernels};
use crate::fastmath::fast_exp;
use half::f16;
use std::arch::x86_64::*;

/// What the vector kernels read keys and values as: f32 in place, or f16 straight from the
/// pool, widened in the register that loads it (exactly: the arithmetic after the load is the
/// same on the same values, so both give the same bits).
pub(super) trait Elem: Copy {
    /// Eight values from `p` (AVX, and F16C for f16).
    unsafe fn load8(p: *const Self) -> __m256;
    /// Eight values from `a` in lanes 0-7 and eight from `b` in lanes 8-15 (AVX-512F).
    unsafe fn halves(a: *const Self, b: *const Self) -> __m512;
    /// Sixteen values from `p` (AVX-512F).
    unsafe fn load16(p: *const Self) -> __m512;
}

impl Elem for f32 {
    #[inline(always)]
    unsafe fn load8(p: *const f32) -> __m256 {
        _mm256_loadu_ps(p)
    }

    /// Inserted as 4 f64s: an AVX-512F instruction, where the f32 form needs AVX-512DQ.
    #[inline(always)]
    unsafe fn halves(a: *const f32, b: *const f32) -> __m512 {
        _mm512_castpd_ps(_mm512_insertf64x4::<1>(
            _mm512_castpd256_pd512(_mm256_loadu_pd(a as *const f64)),
            _mm256_loadu_pd(b as *const f64),
        ))
    }

    #[inline(always)]
    unsafe fn load16(p: *const f32) -> __m512 {
        _mm512_loadu_ps(p)
    }
}

impl Elem for f16 {
    #[inline(always)]
    unsafe fn load8(p: *const f16) -> __m256 {
        _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
    }

    #[inline(always)]
    unsafe fn halves(a: *const f16, b: *const f16) -> __m512 {
        let bits = _mm256_inserti128_si256::<1>(
            _mm256_castsi128_si256(_mm_loadu_si128(a.cast())),
            _mm_loadu_si128(b.cast()),
        );
        _mm512_cvtph_ps(bits)
    }

    #[inline(always)]
    unsafe fn load16(p: *const f16) -> __m512 {
        _mm512_cvtph_ps(_mm256_loadu_si256(p.cast()))
    }
}

/// The four lanes' sums of four accumulators, in [`reduce`]'s order.
#[inline(always)]
pub(super) unsafe fn reduce4(a: __m256, b: __m256, c: __m256, d: __m256) -> __m128 {
    // hadd pairs neighbours: (l0+l1), (l2+l3) per 128-bit half; twice gives the half sums;
    // the two halves then add: ((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7)).
    let ab = _mm256_hadd_ps(a, b);
    let cd = _mm256_hadd_ps(c, d);
    let abcd = _mm256_hadd_ps(ab, cd);
    _mm_add_ps(_mm256_castps256_ps128(abcd), _mm256_extractf128_ps(abcd, 1))
}

#[inline(always)]
unsafe fn lanes(v: __m256) -> [f32; 8] {
    let mut out = [0f32; 8];
    _mm256_storeu_ps(out.as_mut_ptr(), v);
    out
}

#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn scores<E: Elem>(q: &[f32], keys: &[E], d: usize, scale: f32, out: &mut [f32]) {
    let (qp, kp) = (q.as_ptr(), keys.as_ptr());
    let n = out.len();
    let sv = _mm_set1_ps(scale);
    let mut j = 0;
    while j + 4 <= n {
        let k = kp.add(j * d);
        let (mut a0, mut a1, mut a2, mut a3) = (
            _mm256_setzero_ps(),
            _mm256_setzero_ps(),
            _mm256_setzero_ps(),
            _mm256_setzero_ps(),
        );
        for c in (0..d).step_by(8) {
            let qv = _mm256_loadu_ps(qp.add(c));
            a0 = _mm256_fmadd_ps(qv, E::load8(k.add(c)), a0);
            a1 = _mm256_fmadd_ps(qv, E::load8(k.add(d + c)), a1);
            a2 = _mm256_fmadd_ps(qv, E::load8(k.add(2 * d + c)), a2);
            a3 = _mm256_fmadd_ps(qv, E::load8(k.add(3 * d + c)), a3);
        }
        _mm_storeu_ps(
            out.as_mut_ptr().add(j),
            _mm_mul_ps(reduce4(a0, a1, a2, a3), sv),
        );
        j += 4;
    }
    while j < n {
        let k = kp.add(j * d);
        let mut a = _mm256_setzero_ps();
        for c in (0..d).step_by(8) {
            a = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(c)), E::load8(k.add(c)), a);
        }
        out[j] = reduce(lanes(a)) * scale;
        j += 1;
    }
}

#[target_feature(enable = "avx2,fma")]
unsafe fn accumulate(acc: &mut [f32], p: &[f32], values: &[f32], d: usize) {
    let (ap, vp) = (acc.as_mut_ptr(), values.as_ptr());
    for c in (0..d).step_by(8) {
        let mut a = _mm256_loadu_ps(ap.add(c));
        for (j, &pj) in p.iter().enumerate() {
            a = _mm256_fmadd_ps(_mm256_set1_ps(pj), _mm256_loadu_ps(vp.add(j * d + c)), a);
        }
        _mm256_storeu_ps(ap.add(c), a);
    }
}

/// Scores of `H` (1 to 3) heads against keys, four keys per pass: each key chunk is loaded
/// once for all the heads. `H` is a constant so that the 4 x `H` accumulators live in
/// registers (indexed by a run-time count they went through the stack: a store and a load in
/// every accumulation chain).
#[target_feature(enable = "avx2,fma,f16c")]
pub(super) unsafe fn scores3<const H: usize, E: Elem>(
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
    while j + 4 <= n {
        let k = kp.add(j * d);
        let mut a = [[_mm256_setzero_ps(); 4]; H];
        for c in (0..d).step_by(8) {
            let kv = [
                E::load8(k.add(c)),
                E::load8(k.add(d + c)),
                E::load8(k.add(2 * d + c)),
                E::load8(k.add(3 * d + c)),
            ];
            for (h, acc) in a.iter_mut().enumerate() {
                let qv = _mm256_loadu_ps(qs[h].add(c));
                for (acc, kv) in acc.iter_mut().zip(&kv) {
                    *acc = _mm256_fmadd_ps(qv, *kv, *acc);
                }
            }
        }
        for (h, a) in a.iter().enumerate() {
            _mm_storeu_ps(
                out[h].add(j),
                _mm_mul_ps(reduce4(a[0], a[1], a[2], a[3]), sv),
            );
        }
        j += 4;
    }
    for (h, q) in qs.iter().enumerate().take(H) {
        let q = std::slice::from_raw_parts(*q, d);
        let rest = std::slice::from_raw_parts_mut(out[h].add(j), n - j);
        scores(q, &keys[j * d..], d, scale, rest);
    }
}

/// Value sums of `H` (1 to 3) heads: each value row is read once for all the heads, four
/// chunks of 8 at a time, so that 4 x `H` independent chains hide the multiply-add's
/// latency. Every lane still adds its values in row order.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn accumulate3<const H: usize, E: Elem>(
    acc: [*mut f32; 3],
    p: [*const f32; 3],
    values: &[E],
    d: usize,
    n: usize,
) {
    let mut c = 0;
    while c + 32 <= d {
        // Three heads with four chunks each would need 19 of the 16 vector registers.
        if H == 3 {
            accumulate_chunks::<H, 2, E>(acc, p, values.as_ptr().add(c), d, n, c);
            accumulate_chunks::<H, 2, E>(acc, p, values.as_ptr().add(c + 16), d, n, c + 16);
        } else {
            accumulate_chunks::<H, 4, E>(acc, p, values.as_ptr().add(c), d, n, c);
        }
        c += 32;
    }
    while c < d {
        accumulate_chunks::<H, 1, E>(acc, p, values.as_ptr().add(c), d, n, c);
        c += 8;
    }
}

/// Lanes `c..c + 8 CH` of [`accumulate3`]; `values` points at lane `c` of the first row.
#[inline(always)]
unsafe fn accumulate_chunks<const H: usize, const CH: usize, E: Elem>(
    acc: [*mut f32; 3],
    p: [*const f32; 3],
    values: *const E,
    d: usize,
    n: usize,
    c: usize,
) {
    let mut a: [[__m256; CH]; H] =
        std::array::from_fn(|h| std::array::from_fn(|i| _mm256_loadu_ps(acc[h].add(c + 8 * i))));
    for j in 0..n {
        let row = values.add(j * d);
        let w: [__m256; H] = std::array::from_fn(|h| _mm256_broadcast_ss(&*p[h].add(j)));
        let v: [__m256; CH] = std::array::from_fn(|i| E::load8(row.add(8 * i)));
        for (a, w) in a.iter_mut().zip(&w) {
            for (a, v) in a.iter_mut().zip(&v) {
                *a = _mm256_fmadd_ps(*w, *v, *a);
            }
        }
    }
    for (h, a) in a.iter().enumerate() {
        for (i, a) in a.iter().enumerate() {
            _mm256_storeu_ps(acc[h].add(c + 8 * i), *a);
        }
    }
}

/// [`tile_max`] compiled for AVX2 (eight lanes in one register).
#[target_feature(enable = "avx2,fma")]
unsafe fn max_avx2(scores: &[f32]) -> f32 {
    tile_max(scores)
}

/// [`fast_exp`] on eight lanes, operation for operation (no fused multiply-adds), so each
/// lane has the scalar version's bits.
#[inline(always)]
unsafe fn exp8(x: __m256) -> __m256 {
    let c = _mm256_set1_ps;
    let x = _mm256_max_ps(_mm256_min_ps(x, c(88.0)), c(-87.0));
    let t = _mm256_add_ps(
        _mm256_mul_ps(x, c(std::f32::consts::LOG2_E)),
        c(12_582_912.0),
    );
    let n = _mm256_sub_ps(t, c(12_582_912.0));
    let r = _mm256_sub_ps(
        _mm256_sub_ps(x, _mm256_mul_ps(n, c(0.693_145_75))),
        _mm256_mul_ps(n, c(1.428_606_8e-6)),
    );
    let mut p = c(1.0 / 720.0);
    for k in [1.0 / 120.0, 1.0 / 24.0, 1.0 / 6.0, 0.5, 1.0, 1.0] {
        p = _mm256_add_ps(c(k), _mm256_mul_ps(r, p));
    }
    let exponent = _mm256_sub_epi32(_mm256_castps_si256(t), _mm256_set1_epi32(0x4B40_0000));
    let scale = _mm256_slli_epi32::<23>(_mm256_add_epi32(exponent, _mm256_set1_epi32(127)));
    _mm256_mul_ps(p, _mm256_castsi256_ps(scale))
}

/// [`tile_exp_sum`] eight lanes at a time, with its bits (the same lanes, the same order).
#[target_feature(enable = "avx2,fma")]
unsafe fn exp_sum_avx2(scores: &mut [f32], max: f32) -> f32 {
    let (mut lanes, m) = (_mm256_setzero_ps(), _mm256_set1_ps(max));
    let mut rows = scores.chunks_exact_mut(8);
    for row in &mut rows {
        let e = exp8(_mm256_sub_ps(_mm256_loadu_ps(row.as_ptr()), m));
        _mm256_storeu_ps(row.as_mut_ptr(), e);
        lanes = _mm256_add_ps(lanes, e);
    }
    let mut lanes = self::lanes(lanes);
    for (l, s) in lanes.iter_mut().zip(rows.into_remainder()) {
        *s = fast_exp(*s - max);
        *l += *s;
    }
    reduce(lanes)
}

impl DecodeMath for Avx2 {
    fn max(scores: &[f32]) -> f32 {
        // SAFETY: only chosen where the CPU has AVX2, FMA and F16C (see `decode_attention`).
        unsafe { max_avx2(scores) }
    }

    fn exp_sum(scores: &mut [f32], max: f32) -> f32 {
        // SAFETY: as above.
        unsafe { exp_sum_avx2(scores, max) }
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
        debug_assert!(d.is_multiple_of(8) && keys.len() >= n * d);
        let kernels: ScoresKernels = [scores3::<1, f32>, scores3::<2, f32>, scores3::<3, f32>];
        // SAFETY: AVX2/FMA/F16C present and d % 8 == 0 (see `decode_attention`); queries, keys
        // and outputs lie within what the caller passed (asserted above and by `out_stride`, `n`).
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
        debug_assert!(d.is_multiple_of(8) && values.len() >= n * d);
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
        debug_assert!(d.is_multiple_of(8) && keys.len() >= n * d);
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
        debug_assert!(d.is_multiple_of(8) && values.len() >= n * d);
        let kernels: SumsKernels<f16> = [
            accumulate3::<1, f16>,
            accumulate3::<2, f16>,
            accumulate3::<3, f16>,
        ];
        // SAFETY: as in `accumulate_group`; the CPU has F16C too (see `decode_attention`).
        unsafe { sums_in_threes(kernels, acc, acc_stride, p, p_stride, heads, values, d, n) }
    }

    #[inline(always)]
    fn scores(q: &[f32], keys: &[f32], d: usize, scale: f32, out: &mut [f32]) {
        debug_assert!(d.is_multiple_of(8) && keys.len() >= out.len() * d && q.len() >= d);
        // SAFETY: only chosen where the CPU has AVX2, FMA and F16C and d % 8 == 0 (see
        // `decode_attention`); every pointer stays within the slices asserted above.
        unsafe { scores(q, keys, d, scale, out) }
    }

    #[inline(always)]
    fn accumulate(acc: &mut [f32], p: &[f32], values: &[f32], d: usize) {
        debug_assert!(d.is_multiple_of(8) && acc.len() >= d && values.len() >= p.len() * d);
        // SAFETY: as above.
        unsafe { accumulate(acc, p, values, d) }
    }
}
