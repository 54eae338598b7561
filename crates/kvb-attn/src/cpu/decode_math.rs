//! The arithmetic of the decode kernel: scores of one query against a run of keys, and the
//! weighted sum of values. Once portable, once with AVX2 and FMA (chosen per machine at run time;
//! a machine always runs the same one, so a row's bits never depend on its batch).
//!
//! Both give each key's score the same reduction order wherever the key falls in a run: eight
//! lanes accumulated over the head dimension, then `((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7))`. The
//! AVX2 version scores four keys per pass (one load of each query chunk for four keys, and one
//! shared horizontal reduction), which is what makes it fast.

use crate::fastmath::fast_exp;

/// Scores and value sums for one (query, run of keys) at a time.
pub(crate) trait DecodeMath {
    /// `out[j] = scale * (q . keys[j])` for the `out.len()` keys of `keys` (`d` values each).
    fn scores(q: &[f32], keys: &[f32], d: usize, scale: f32, out: &mut [f32]);
    /// `acc += sum_j p[j] * values[j]` over the `p.len()` rows of `values` (`d` values each), in
    /// row order.
    fn accumulate(acc: &mut [f32], p: &[f32], values: &[f32], d: usize);

    /// [`DecodeMath::scores`] for the query heads of one GQA group, which read the same keys:
    /// head `g`'s query is `q.group(g)`, its scores go to `out[g * out_stride..][..n]`.
    fn scores_group(
        q: Heads,
        keys: &[f32],
        d: usize,
        scale: f32,
        out: &mut [f32],
        out_stride: usize,
        n: usize,
    ) {
        for g in 0..q.count {
            Self::scores(q.get(g, d), keys, d, scale, &mut out[g * out_stride..][..n]);
        }
    }

    /// [`DecodeMath::accumulate`] for the heads of one group: head `g` adds
    /// `p[g * p_stride..][..n]` times the values into `acc[g * acc_stride..][..d]`.
    #[allow(clippy::too_many_arguments)]
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
        for g in 0..heads {
            Self::accumulate(
                &mut acc[g * acc_stride..][..d],
                &p[g * p_stride..][..n],
                values,
                d,
            );
        }
    }

    /// The largest of a tile's scores (exact in any order).
    fn max(scores: &[f32]) -> f32 {
        tile_max(scores)
    }

    /// Replaces each score by `e^(score - max)` and returns their sum: eight lanes in key order,
    /// then [`reduce`].
    fn exp_sum(scores: &mut [f32], max: f32) -> f32 {
        tile_exp_sum(scores, max)
    }
}

/// The query heads of one GQA group for one row: `count` vectors of `d`, `stride` apart.
#[derive(Clone, Copy)]
pub(crate) struct Heads {
    pub ptr: *const f32,
    pub stride: isize,
    pub count: usize,
}

impl Heads {
    /// Head `g`'s query.
    pub fn get(&self, g: usize, d: usize) -> &[f32] {
        // SAFETY: built by the kernel from a q view holding `count` heads of `d` values.
        unsafe { std::slice::from_raw_parts(self.ptr.offset(g as isize * self.stride), d) }
    }
}

/// [`DecodeMath::max`]: eight running maxima (they vectorise; a fold of `f32::max` does not).
#[inline(always)]
fn tile_max(scores: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; 8];
    let mut rows = scores.chunks_exact(8);
    for row in &mut rows {
        for (l, &x) in lanes.iter_mut().zip(row) {
            *l = if x > *l { x } else { *l };
        }
    }
    rows.remainder()
        .iter()
        .chain(&lanes)
        .fold(f32::NEG_INFINITY, |m, &x| if x > m { x } else { m })
}

/// [`DecodeMath::exp_sum`]. The exponentials and the lane sums are separate multiplies and adds
/// (never fused), so every version gives the same bits.
#[inline(always)]
fn tile_exp_sum(scores: &mut [f32], max: f32) -> f32 {
    let mut lanes = [0f32; 8];
    let mut rows = scores.chunks_exact_mut(8);
    for row in &mut rows {
        for (l, s) in lanes.iter_mut().zip(row) {
            *s = fast_exp(*s - max);
            *l += *s;
        }
    }
    for (l, s) in lanes.iter_mut().zip(rows.into_remainder()) {
        *s = fast_exp(*s - max);
        *l += *s;
    }
    reduce(lanes)
}

/// Plain Rust (two roundings per multiply-add).
pub(crate) struct Portable;

/// The eight-lane reduction every score goes through.
#[inline(always)]
fn reduce(l: [f32; 8]) -> f32 {
    ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))
}

impl DecodeMath for Portable {
    fn scores(q: &[f32], keys: &[f32], d: usize, scale: f32, out: &mut [f32]) {
        for (j, s) in out.iter_mut().enumerate() {
            let k = &keys[j * d..(j + 1) * d];
            let mut lanes = [0f32; 8];
            for (i, (a, b)) in q.iter().zip(k).enumerate() {
                lanes[i % 8] += a * b;
            }
            *s = reduce(lanes) * scale;
        }
    }

    fn accumulate(acc: &mut [f32], p: &[f32], values: &[f32], d: usize) {
        for (j, &pj) in p.iter().enumerate() {
            for (a, &v) in acc.iter_mut().zip(&values[j * d..(j + 1) * d]) {
                *a += pj * v;
            }
        }
    }
}

/// AVX2 and FMA intrinsics; needs `d % 8 == 0` (the caller falls back to [`Portable`] otherwise).
#[cfg(target_arch = "x86_64")]
pub(crate) struct Avx2;

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{reduce, tile_max, Avx2, DecodeMath};
    use crate::fastmath::fast_exp;
    use std::arch::x86_64::*;

    /// The four lanes' sums of four accumulators, in [`reduce`]'s order.
    #[inline(always)]
    unsafe fn reduce4(a: __m256, b: __m256, c: __m256, d: __m256) -> __m128 {
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

    #[target_feature(enable = "avx2,fma")]
    unsafe fn scores(q: &[f32], keys: &[f32], d: usize, scale: f32, out: &mut [f32]) {
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
                a0 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k.add(c)), a0);
                a1 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k.add(d + c)), a1);
                a2 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k.add(2 * d + c)), a2);
                a3 = _mm256_fmadd_ps(qv, _mm256_loadu_ps(k.add(3 * d + c)), a3);
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
                a = _mm256_fmadd_ps(_mm256_loadu_ps(qp.add(c)), _mm256_loadu_ps(k.add(c)), a);
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
    #[target_feature(enable = "avx2,fma")]
    unsafe fn scores3<const H: usize>(
        qs: [*const f32; 3],
        keys: &[f32],
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
                    _mm256_loadu_ps(k.add(c)),
                    _mm256_loadu_ps(k.add(d + c)),
                    _mm256_loadu_ps(k.add(2 * d + c)),
                    _mm256_loadu_ps(k.add(3 * d + c)),
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
    #[target_feature(enable = "avx2,fma")]
    unsafe fn accumulate3<const H: usize>(
        acc: [*mut f32; 3],
        p: [*const f32; 3],
        values: &[f32],
        d: usize,
        n: usize,
    ) {
        let mut c = 0;
        while c + 32 <= d {
            // Three heads with four chunks each would need 19 of the 16 vector registers.
            if H == 3 {
                accumulate_chunks::<H, 2>(acc, p, values.as_ptr().add(c), d, n, c);
                accumulate_chunks::<H, 2>(acc, p, values.as_ptr().add(c + 16), d, n, c + 16);
            } else {
                accumulate_chunks::<H, 4>(acc, p, values.as_ptr().add(c), d, n, c);
            }
            c += 32;
        }
        while c < d {
            accumulate_chunks::<H, 1>(acc, p, values.as_ptr().add(c), d, n, c);
            c += 8;
        }
    }

    /// Lanes `c..c + 8 CH` of [`accumulate3`]; `values` points at lane `c` of the first row.
    #[inline(always)]
    unsafe fn accumulate_chunks<const H: usize, const CH: usize>(
        acc: [*mut f32; 3],
        p: [*const f32; 3],
        values: *const f32,
        d: usize,
        n: usize,
        c: usize,
    ) {
        let mut a: [[__m256; CH]; H] = std::array::from_fn(|h| {
            std::array::from_fn(|i| _mm256_loadu_ps(acc[h].add(c + 8 * i)))
        });
        for j in 0..n {
            let row = values.add(j * d);
            let w: [__m256; H] = std::array::from_fn(|h| _mm256_broadcast_ss(&*p[h].add(j)));
            let v: [__m256; CH] = std::array::from_fn(|i| _mm256_loadu_ps(row.add(8 * i)));
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
            // SAFETY: only chosen where the CPU has AVX2 and FMA (see `decode_attention`).
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
            let mut g = 0;
            while g < q.count {
                let heads = (q.count - g).min(3);
                let base = out.as_mut_ptr();
                // SAFETY: AVX2/FMA present and d % 8 == 0 (see `decode_attention`); queries,
                // keys and outputs lie within what the caller passed (asserted above and by
                // `out_stride`, `n`).
                unsafe {
                    let qs =
                        [0, 1, 2].map(|h| q.ptr.offset((g + h.min(heads - 1)) as isize * q.stride));
                    let outs = [0, 1, 2].map(|h| base.add((g + h.min(heads - 1)) * out_stride));
                    match heads {
                        1 => scores3::<1>(qs, keys, d, scale, outs, n),
                        2 => scores3::<2>(qs, keys, d, scale, outs, n),
                        _ => scores3::<3>(qs, keys, d, scale, outs, n),
                    }
                }
                g += heads;
            }
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
            let mut g = 0;
            while g < heads {
                let count = (heads - g).min(3);
                let (ab, pb) = (acc.as_mut_ptr(), p.as_ptr());
                // SAFETY: as above; head `h`'s accumulator and weights lie at `h * stride`.
                unsafe {
                    let accs = [0, 1, 2].map(|h| ab.add((g + h.min(count - 1)) * acc_stride));
                    let ps = [0, 1, 2].map(|h| pb.add((g + h.min(count - 1)) * p_stride));
                    match count {
                        1 => accumulate3::<1>(accs, ps, values, d, n),
                        2 => accumulate3::<2>(accs, ps, values, d, n),
                        _ => accumulate3::<3>(accs, ps, values, d, n),
                    }
                }
                g += count;
            }
        }

        #[inline(always)]
        fn scores(q: &[f32], keys: &[f32], d: usize, scale: f32, out: &mut [f32]) {
            debug_assert!(d.is_multiple_of(8) && keys.len() >= out.len() * d && q.len() >= d);
            // SAFETY: only chosen where the CPU has AVX2 and FMA and d % 8 == 0 (see
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 2001) as f32 - 1000.0)
                    / 700.0
            })
            .collect()
    }

    /// The tile softmax's maximum and exponentials have the same bits in both versions, for
    /// every length (whole rows of eight and a remainder), and match libm within 1e-6.
    #[test]
    fn both_versions_give_the_same_softmax_bits() {
        for n in 1..70 {
            let scores: Vec<f32> = values(n, n as u32).iter().map(|x| x * 9.0).collect();
            let max = Portable::max(&scores);
            assert_eq!(
                max,
                scores.iter().copied().fold(f32::NEG_INFINITY, f32::max)
            );
            let mut portable = scores.clone();
            let sum = Portable::exp_sum(&mut portable, max);
            for (e, s) in portable.iter().zip(&scores) {
                assert!(
                    (e - (s - max).exp()).abs() <= 1e-6,
                    "{e} vs e^({s} - {max})"
                );
            }
            let want: f32 = portable.iter().sum();
            assert!((sum - want).abs() <= 1e-5 * want, "n {n}: {sum} vs {want}");
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2")
                && std::arch::is_x86_feature_detected!("fma")
            {
                assert_eq!(Avx2::max(&scores).to_bits(), max.to_bits(), "n {n}");
                let mut fast = scores.clone();
                assert_eq!(
                    Avx2::exp_sum(&mut fast, max).to_bits(),
                    sum.to_bits(),
                    "n {n}"
                );
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&fast), bits(&portable), "n {n}");
            }
        }
    }

    /// Both versions score and sum within float rounding of each other, and a key's score is the
    /// same bits whatever its place in the run (four at a time, or alone at the end).
    #[test]
    fn both_versions_agree_and_a_keys_score_ignores_its_place() {
        for d in [8usize, 16, 48, 64, 128] {
            for n in 1..11 {
                let (q, keys, v) = (values(d, 1), values(n * d, 2), values(n * d, 3));
                let mut portable = vec![0f32; n];
                Portable::scores(&q, &keys, d, 0.125, &mut portable);
                let mut acc_p = vec![0.5f32; d];
                Portable::accumulate(&mut acc_p, &portable, &v, d);
                #[cfg(target_arch = "x86_64")]
                if std::arch::is_x86_feature_detected!("avx2")
                    && std::arch::is_x86_feature_detected!("fma")
                {
                    let mut fast = vec![0f32; n];
                    Avx2::scores(&q, &keys, d, 0.125, &mut fast);
                    for (a, b) in fast.iter().zip(&portable) {
                        assert!((a - b).abs() <= 1e-5 * (1.0 + b.abs()), "d {d}: {a} vs {b}");
                    }
                    for j in 0..n {
                        let mut one = [0f32];
                        Avx2::scores(&q, &keys[j * d..(j + 1) * d], d, 0.125, &mut one);
                        assert_eq!(one[0].to_bits(), fast[j].to_bits(), "d {d}, key {j} of {n}");
                    }
                    let mut acc_f = vec![0.5f32; d];
                    Avx2::accumulate(&mut acc_f, &portable, &v, d);
                    for (a, b) in acc_f.iter().zip(&acc_p) {
                        assert!((a - b).abs() <= 1e-4 * (1.0 + b.abs()));
                    }
                    // Heads of a group together give each head's bits alone.
                    for heads in 1..=7 {
                        let qs = values(heads * d, 9);
                        let group = Heads {
                            ptr: qs.as_ptr(),
                            stride: d as isize,
                            count: heads,
                        };
                        let mut out = vec![0f32; heads * 16];
                        Avx2::scores_group(group, &keys, d, 0.125, &mut out, 16, n);
                        let mut acc = vec![0.25f32; heads * (d + 2)];
                        let p: Vec<f32> = (0..heads * 16).map(|i| (i % 5) as f32 * 0.1).collect();
                        Avx2::accumulate_group(&mut acc, d + 2, &p, 16, heads, &v, d, n);
                        for g in 0..heads {
                            let mut one = vec![0f32; n];
                            Avx2::scores(&qs[g * d..(g + 1) * d], &keys, d, 0.125, &mut one);
                            assert!(
                                one.iter()
                                    .zip(&out[g * 16..])
                                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                                "scores, {heads} heads"
                            );
                            let mut alone = vec![0.25f32; d];
                            Avx2::accumulate(&mut alone, &p[g * 16..g * 16 + n], &v, d);
                            assert!(
                                alone
                                    .iter()
                                    .zip(&acc[g * (d + 2)..])
                                    .all(|(a, b)| a.to_bits() == b.to_bits()),
                                "sums, {heads} heads"
                            );
                        }
                    }
                }
            }
        }
    }
}
