//! The arithmetic of the decode kernel: scores of one query against a run of keys, and the
//! weighted sum of values. Once portable, once with AVX2 and FMA (chosen per machine at run time;
//! a machine always runs the same one, so a row's bits never depend on its batch).
//!
//! Both give each key's score the same reduction order wherever the key falls in a run: eight
//! lanes accumulated over the head dimension, then `((l0+l1)+(l2+l3)) + ((l4+l5)+(l6+l7))`. The
//! AVX2 version scores four keys per pass (one load of each query chunk for four keys, and one
//! shared horizontal reduction), which is what makes it fast. Where the CPU has AVX-512, a third
//! version computes the AVX2 bits with 16-lane registers ([`avx512`]).

use crate::fastmath::fast_exp;
use half::f16;

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

    /// Whether this version reads an f16 pool's keys and values where they lie
    /// ([`DecodeMath::scores_group_f16`], [`DecodeMath::accumulate_group_f16`]); the kernel
    /// widens them into a scratch tile for the others.
    const READS_F16: bool = false;

    /// [`DecodeMath::scores_group`] of f16 keys, with the bits of their f32 widening. Here
    /// widened into a buffer first.
    fn scores_group_f16(
        q: Heads,
        keys: &[f16],
        d: usize,
        scale: f32,
        out: &mut [f32],
        out_stride: usize,
        n: usize,
    ) {
        let wide: Vec<f32> = keys[..n * d].iter().map(|k| k.to_f32()).collect();
        Self::scores_group(q, &wide, d, scale, out, out_stride, n)
    }

    /// [`DecodeMath::accumulate_group`] of f16 values, with the bits of their f32 widening.
    /// Here widened into a buffer first.
    #[allow(clippy::too_many_arguments)]
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
        let wide: Vec<f32> = values[..n * d].iter().map(|v| v.to_f32()).collect();
        Self::accumulate_group(acc, acc_stride, p, p_stride, heads, &wide, d, n)
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

/// A vector kernel's scores for 1 to 3 heads (one entry per count): queries, keys, `d`, scale,
/// outputs, keys scored. Three heads' accumulators fit in the registers.
#[cfg(target_arch = "x86_64")]
type ScoresKernels<E = f32> =
    [unsafe fn([*const f32; 3], &[E], usize, f32, [*mut f32; 3], usize); 3];

/// A vector kernel's value sums for 1 to 3 heads: accumulators, weights, values, `d`, rows.
#[cfg(target_arch = "x86_64")]
type SumsKernels<E = f32> = [unsafe fn([*mut f32; 3], [*const f32; 3], &[E], usize, usize); 3];

/// [`DecodeMath::scores_group`] through `kernels`, 3 heads at a time.
///
/// # Safety
/// The CPU runs `kernels`, which accept `d`; queries, keys and outputs lie within what the
/// arguments describe.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn scores_in_threes<E>(
    kernels: ScoresKernels<E>,
    q: Heads,
    keys: &[E],
    d: usize,
    scale: f32,
    out: &mut [f32],
    out_stride: usize,
    n: usize,
) {
    in_threes(q.count, |g, count| {
        let qs = three(q.ptr, q.stride, g, count);
        let outs = three(out.as_mut_ptr(), out_stride as isize, g, count).map(|o| o.cast_mut());
        kernels[count - 1](qs, keys, d, scale, outs, n);
    });
}

/// [`DecodeMath::accumulate_group`] through `kernels`, 3 heads at a time.
///
/// # Safety
/// As [`scores_in_threes`]; head `h`'s accumulator and weights lie at `h * stride`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn sums_in_threes<E>(
    kernels: SumsKernels<E>,
    acc: &mut [f32],
    acc_stride: usize,
    p: &[f32],
    p_stride: usize,
    heads: usize,
    values: &[E],
    d: usize,
    n: usize,
) {
    in_threes(heads, |g, count| {
        let accs = three(acc.as_mut_ptr(), acc_stride as isize, g, count).map(|a| a.cast_mut());
        let ps = three(p.as_ptr(), p_stride as isize, g, count);
        kernels[count - 1](accs, ps, values, d, n);
    });
}

/// Calls `each(first, count)` for runs of at most 3 of `heads` heads.
#[cfg(target_arch = "x86_64")]
fn in_threes(heads: usize, mut each: impl FnMut(usize, usize)) {
    let mut g = 0;
    while g < heads {
        let count = (heads - g).min(3);
        each(g, count);
        g += count;
    }
}

/// The addresses of heads `g..g + count` (`count` of 1 to 3) at `stride` from `base`, the last
/// repeated to fill three (the kernels read only the first `count`).
#[cfg(target_arch = "x86_64")]
fn three<T>(base: *const T, stride: isize, g: usize, count: usize) -> [*const T; 3] {
    [0, 1, 2].map(|h| base.wrapping_offset((g + h.min(count - 1)) as isize * stride))
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

/// AVX-512F intrinsics where they go wider than [`Avx2`], its bits everywhere; needs
/// `d % 16 == 0` (the caller falls back to [`Avx2`] otherwise).
#[cfg(target_arch = "x86_64")]
pub(crate) struct Avx512;

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;

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
            if kvb_gemm::Isa::supported().contains(&kvb_gemm::Isa::Avx2Fma) {
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
                if kvb_gemm::Isa::supported().contains(&kvb_gemm::Isa::Avx2Fma) {
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

    /// The vector versions read f16 keys and values where they lie with the bits of the f32
    /// versions on their widening: scores and value sums of 1 to 7 heads, over runs that are
    /// and are not whole passes and head dims that are and are not whole registers.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn f16_runs_give_the_bits_of_their_widening() {
        fn check<M: DecodeMath>(step: usize) {
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            let half = |v: Vec<f32>| v.into_iter().map(f16::from_f32).collect::<Vec<_>>();
            let wide = |v: &[f16]| v.iter().map(|x| x.to_f32()).collect::<Vec<_>>();
            for d in [8usize, 16, 24, 48, 64, 96, 128]
                .into_iter()
                .filter(|d| d % step == 0)
            {
                for n in [1usize, 3, 4, 7, 8, 9, 17, 32, 33] {
                    for heads in 1..=7 {
                        let qs = values(heads * d, 11);
                        let (keys, v) = (half(values(n * d, 12)), half(values(n * d, 13)));
                        let group = Heads {
                            ptr: qs.as_ptr(),
                            stride: d as isize,
                            count: heads,
                        };
                        let stride = 40;
                        let (mut direct, mut widened) =
                            (vec![0f32; heads * stride], vec![0f32; heads * stride]);
                        M::scores_group_f16(group, &keys, d, 0.125, &mut direct, stride, n);
                        M::scores_group(group, &wide(&keys), d, 0.125, &mut widened, stride, n);
                        assert_eq!(
                            bits(&direct),
                            bits(&widened),
                            "scores: d {d}, n {n}, {heads}"
                        );
                        let p: Vec<f32> = (0..heads * stride)
                            .map(|i| (i % 9) as f32 * 0.1 - 0.3)
                            .collect();
                        let (mut direct, mut widened) = (
                            vec![0.25f32; heads * (d + 2)],
                            vec![0.25f32; heads * (d + 2)],
                        );
                        M::accumulate_group_f16(&mut direct, d + 2, &p, stride, heads, &v, d, n);
                        M::accumulate_group(
                            &mut widened,
                            d + 2,
                            &p,
                            stride,
                            heads,
                            &wide(&v),
                            d,
                            n,
                        );
                        assert_eq!(bits(&direct), bits(&widened), "sums: d {d}, n {n}, {heads}");
                    }
                }
            }
        }
        // Without AVX2, FMA and F16C the vector versions never run (`decode_attention`).
        let cpu = kvb_gemm::cpu();
        if !kvb_gemm::Isa::supported().contains(&kvb_gemm::Isa::Avx2Fma) || !cpu.f16c {
            eprintln!("no AVX2/F16C here: nothing to compare");
            return;
        }
        assert!(Avx2::READS_F16);
        check::<Avx2>(8);
        if kvb_gemm::isa() == kvb_gemm::Isa::Avx512 {
            assert!(Avx512::READS_F16);
            check::<Avx512>(16);
        }
    }

    /// Where the CPU has AVX-512, its kernels give the AVX2 kernels' bits: scores of 1 to 7 heads
    /// over runs of keys that are and are not whole passes of 8, and value sums over head dims
    /// that are and are not whole registers of 64.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn the_avx512_kernels_give_the_avx2_bits() {
        // Without AVX-512 the 16-lane kernels never run (`decode_attention` picks them only
        // where the CPU has it), so there is nothing to compare.
        if kvb_gemm::isa() != kvb_gemm::Isa::Avx512 {
            eprintln!("no AVX-512 here: nothing to compare");
            return;
        }
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        for d in [16usize, 32, 48, 64, 96, 128] {
            for n in [1usize, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33] {
                for heads in 1..=7 {
                    let (qs, keys, v) = (values(heads * d, 4), values(n * d, 5), values(n * d, 6));
                    let group = Heads {
                        ptr: qs.as_ptr(),
                        stride: d as isize,
                        count: heads,
                    };
                    let stride = 40;
                    let (mut wide, mut narrow) =
                        (vec![0f32; heads * stride], vec![0f32; heads * stride]);
                    Avx512::scores_group(group, &keys, d, 0.125, &mut wide, stride, n);
                    Avx2::scores_group(group, &keys, d, 0.125, &mut narrow, stride, n);
                    assert_eq!(
                        bits(&wide),
                        bits(&narrow),
                        "scores: d {d}, {n} keys, {heads} heads"
                    );
                    let p: Vec<f32> = (0..heads * stride)
                        .map(|i| (i % 7) as f32 * 0.1 - 0.2)
                        .collect();
                    let (mut wide, mut narrow) = (
                        vec![0.25f32; heads * (d + 2)],
                        vec![0.25f32; heads * (d + 2)],
                    );
                    Avx512::accumulate_group(&mut wide, d + 2, &p, stride, heads, &v, d, n);
                    Avx2::accumulate_group(&mut narrow, d + 2, &p, stride, heads, &v, d, n);
                    assert_eq!(
                        bits(&wide),
                        bits(&narrow),
                        "sums: d {d}, {n} keys, {heads} heads"
                    );
                }
            }
        }
    }
}
