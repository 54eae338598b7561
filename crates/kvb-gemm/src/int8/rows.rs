//! Input rows quantized to 8 bits per value, one scale per block of 32 (llama.cpp's Q8_1 form:
//! `dx = max |x| / 127`, `q = round(x / dx)`, and the block's sum kept beside it).

use super::products::Kernel;
use super::BLOCK;
use rayon::prelude::*;

/// Values per sum in [`QuantizedRows::sums16`].
const HALF: usize = BLOCK / 2;

/// Rows per parallel task when quantizing many rows (a prefill): enough to amortise rayon.
const ROWS_PER_TASK: usize = 32;

/// `m` rows of `k` values as 8-bit integers with their per-block scales.
#[derive(Debug, Clone)]
pub struct QuantizedRows {
    pub(super) m: usize,
    pub(super) k: usize,
    /// `[m, k]`.
    pub(super) q: Vec<i8>,
    /// `[m, k / 32]`: each block's scale `dx`.
    pub(super) scale: Vec<f32>,
    /// `[m, k / 32]`: `dx` times the sum of the block's integers (the weights' offsets multiply
    /// it).
    pub(super) scaled_sum: Vec<f32>,
    /// `[m, k / 32]`: -128 times the sum of the block's integers, the correction for weights
    /// stored as unsigned bytes `q + 128` (see [`super::IntDotMatrix`]).
    pub(super) unsigned_correction: Vec<i32>,
    /// `[m, k / 16]`: the sum of each 16 integers (the signed K-quant cells take their bias
    /// off with it, [`Self::sub_block_sum`]).
    pub(super) sums16: Vec<i32>,
}

impl QuantizedRows {
    /// Quantizes row-major `x [m, k]` (`k` a multiple of 32, `x` at least `m * k` long).
    pub fn new(x: &[f32], m: usize, k: usize) -> Self {
        assert!(
            k.is_multiple_of(BLOCK) && x.len() >= m * k,
            "QuantizedRows: {m} rows of {k} from {} values",
            x.len()
        );
        let blocks = k / BLOCK;
        let mut out = QuantizedRows {
            m,
            k,
            q: vec![0; m * k],
            scale: vec![0.0; m * blocks],
            scaled_sum: vec![0.0; m * blocks],
            unsigned_correction: vec![0; m * blocks],
            sums16: vec![0; m * k / HALF],
        };
        // Chosen once per call, with the products' kernel (whose CPU has its instructions).
        let kernel = Kernel::detect();
        let rows = |(((q, scale), sum), (fix, x)): RowsOut| {
            for (i, xb) in x.chunks_exact(BLOCK).enumerate() {
                let (d, total) = quantize_block(kernel, xb, &mut q[i * BLOCK..(i + 1) * BLOCK]);
                scale[i] = d;
                sum[i] = d * total as f32;
                fix[i] = -128 * total;
            }
        };
        // One task for a few rows (a decode step), several for a prefill's hundreds.
        out.q
            .par_chunks_mut(k)
            .zip(out.scale.par_chunks_mut(blocks))
            .zip(out.scaled_sum.par_chunks_mut(blocks))
            .zip(
                out.unsigned_correction
                    .par_chunks_mut(blocks)
                    .zip(x[..m * k].par_chunks(k)),
            )
            .with_min_len(ROWS_PER_TASK)
            .for_each(rows);
        out.sums16
            .par_chunks_mut(k / HALF)
            .zip(out.q.par_chunks(k))
            .with_min_len(ROWS_PER_TASK)
            .for_each(|(sums, q)| {
                for (s, q) in sums.iter_mut().zip(q.chunks_exact(HALF)) {
                    *s = q.iter().map(|&v| v as i32).sum();
                }
            });
        out
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.m
    }

    /// Values per row.
    pub fn width(&self) -> usize {
        self.k
    }

    /// The sum of row `r`'s integers `from` (a multiple of 16) on for `len` values (16 or 32):
    /// a sub-block's share, which the K-quant products take their cells' bias off with.
    ///
    /// # Safety
    /// `r < m` and `from + len <= k`; unchecked, as the kernels call it in their inner loop.
    #[inline(always)]
    pub(super) unsafe fn sub_block_sum(&self, r: usize, from: usize, len: usize) -> i32 {
        let h = (r * self.k + from) / HALF;
        // SAFETY: the caller keeps `r` and `from + len` inside the rows; `len` is 16 or 32.
        unsafe {
            let mut sum = *self.sums16.get_unchecked(h);
            if len == 2 * HALF {
                sum += *self.sums16.get_unchecked(h + 1);
            }
            sum
        }
    }

    /// Row `r`'s scale `dx` times the sum of its integers `from` on for `len` values (16 or 32,
    /// inside one block): what a sub-block's offset multiplies. For a whole block it is the
    /// block's `scaled_sum` (the same product); for 16 rows (Q2_K's sub-blocks) it is formed here.
    ///
    /// # Safety
    /// As [`Self::sub_block_sum`].
    #[inline(always)]
    pub(super) unsafe fn sub_block_scaled_sum(&self, r: usize, from: usize, len: usize) -> f32 {
        let b = (r * self.k + from) / BLOCK;
        // SAFETY: the caller keeps `r` and `from + len` inside the rows.
        unsafe {
            if len == BLOCK {
                return *self.scaled_sum.get_unchecked(b);
            }
            *self.scale.get_unchecked(b) * self.sub_block_sum(r, from, len) as f32
        }
    }

    /// Row `r`'s values as the products see them: each integer times its block's scale.
    pub fn dequantized_row(&self, r: usize) -> Vec<f32> {
        let blocks = self.k / BLOCK;
        self.q[r * self.k..(r + 1) * self.k]
            .iter()
            .enumerate()
            .map(|(i, &q)| q as f32 * self.scale[r * blocks + i / BLOCK])
            .collect()
    }
}

/// One row's outputs and input, as the quantizing loop takes them.
type RowsOut<'a> = (
    ((&'a mut [i8], &'a mut [f32]), &'a mut [f32]),
    (&'a mut [i32], &'a [f32]),
);

/// Quantizes one block into `q` with `kernel`'s instructions (one [`Kernel::detect`] found);
/// returns its scale and the sum of its integers. A block of zeros (or of non-finite values,
/// which no scale represents) has scale 0.
fn quantize_block(kernel: Kernel, x: &[f32], q: &mut [i8]) -> (f32, i32) {
    #[cfg(not(target_arch = "x86_64"))]
    let _ = kernel;
    #[cfg(target_arch = "x86_64")]
    if x.len() == BLOCK && q.len() == BLOCK {
        match kernel.vector() {
            // SAFETY: the VNNI kernel's CPU has AVX-512F; both slices hold one block.
            Kernel::Vnni512 => return unsafe { quantize_block_avx512(x, q) },
            // SAFETY: the AVX2 kernel's CPU has AVX2; both slices hold one block.
            Kernel::Avx2 => return unsafe { quantize_block_avx2(x, q) },
            Kernel::Portable => {}
            Kernel::Amx => unreachable!("`vector` takes the tiles off"),
        }
    }
    quantize_block_portable(x, q)
}

/// [`quantize_block`] in plain loops (the definition).
pub(super) fn quantize_block_portable(x: &[f32], q: &mut [i8]) -> (f32, i32) {
    let amax = x.iter().fold(0f32, |a, v| a.max(v.abs()));
    let (d, inv) = scale_of(amax);
    let mut total = 0i32;
    for (q, v) in q.iter_mut().zip(x) {
        let r = round_to_int(v * inv);
        *q = r as i8;
        total += r;
    }
    (d, total)
}

/// A block's scale `max |x| / 127` and its inverse (both 0 where no scale represents it).
fn scale_of(amax: f32) -> (f32, f32) {
    let d = amax / 127.0;
    if d > 0.0 && d.is_finite() {
        (d, 1.0 / d)
    } else {
        (0.0, 0.0)
    }
}

/// Adding and subtracting 1.5 * 2^23 rounds an f32 of magnitude below 2^22 to an integer, to
/// nearest, ties to even (the default rounding mode): the rounding of `roundps` and
/// `round_ties_even`, in plain SSE2 arithmetic that vectorises everywhere.
const ROUNDER: f32 = 12_582_912.0;

/// `v` (at most 127 in magnitude by construction, NaN from a non-finite input) rounded to
/// nearest even, clamped to -127..=127; NaN gives 0.
fn round_to_int(v: f32) -> i32 {
    let r = ((v + ROUNDER) - ROUNDER).clamp(-127.0, 127.0);
    if r.is_nan() {
        0
    } else {
        r as i32
    }
}

/// [`quantize_block`] on 16 lanes: the same max, scale, rounding and clamp, so the same bits.
///
/// # Safety
/// The CPU has AVX-512F; `x` and `q` hold 32 values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn quantize_block_avx512(x: &[f32], q: &mut [i8]) -> (f32, i32) {
    use std::arch::x86_64::*;
    let (a, b) = (
        _mm512_loadu_ps(x.as_ptr()),
        _mm512_loadu_ps(x.as_ptr().add(16)),
    );
    // max is exact in any order; NaN lanes count as 0, as f32::max drops them.
    let finite_abs =
        |v: __m512| _mm512_maskz_mov_ps(_mm512_cmp_ps_mask::<_CMP_ORD_Q>(v, v), _mm512_abs_ps(v));
    let amax = _mm512_reduce_max_ps(_mm512_max_ps(finite_abs(a), finite_abs(b)));
    let (d, inv) = scale_of(amax);
    let (inv, rounder) = (_mm512_set1_ps(inv), _mm512_set1_ps(ROUNDER));
    let (lo, hi) = (_mm512_set1_ps(-127.0), _mm512_set1_ps(127.0));
    let round = |v: __m512| {
        let r = _mm512_sub_ps(_mm512_add_ps(_mm512_mul_ps(v, inv), rounder), rounder);
        // max/min with the bound second return the bound for NaN: then the NaN lane is
        // cleared below (as round_to_int's 0).
        let clamped = _mm512_min_ps(_mm512_max_ps(r, lo), hi);
        let ordered = _mm512_cmp_ps_mask::<_CMP_ORD_Q>(r, r);
        _mm512_maskz_cvtps_epi32(ordered, clamped)
    };
    let (ia, ib) = (round(a), round(b));
    _mm_storeu_si128(q.as_mut_ptr() as *mut __m128i, _mm512_cvtepi32_epi8(ia));
    _mm_storeu_si128(
        q.as_mut_ptr().add(16) as *mut __m128i,
        _mm512_cvtepi32_epi8(ib),
    );
    (d, _mm512_reduce_add_epi32(_mm512_add_epi32(ia, ib)))
}

/// [`quantize_block`] on 8 lanes: the same max, scale, rounding and clamp, so the same bits.
///
/// # Safety
/// The CPU has AVX2; `x` and `q` hold 32 values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
pub(super) unsafe fn quantize_block_avx2(x: &[f32], q: &mut [i8]) -> (f32, i32) {
    use std::arch::x86_64::*;
    let v: [__m256; 4] = std::array::from_fn(|i| _mm256_loadu_ps(x.as_ptr().add(8 * i)));
    let ordered = |v: __m256| _mm256_cmp_ps::<_CMP_ORD_Q>(v, v);
    let abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(i32::MAX));
    // max is exact in any order; NaN lanes count as 0, as f32::max drops them.
    let finite_abs = |v: __m256| _mm256_and_ps(_mm256_and_ps(v, abs_mask), ordered(v));
    let m = _mm256_max_ps(
        _mm256_max_ps(finite_abs(v[0]), finite_abs(v[1])),
        _mm256_max_ps(finite_abs(v[2]), finite_abs(v[3])),
    );
    let m = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps::<1>(m));
    let m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    let m = _mm_max_ss(m, _mm_shuffle_ps::<1>(m, m));
    let (d, inv) = scale_of(_mm_cvtss_f32(m));
    let (inv, rounder) = (_mm256_set1_ps(inv), _mm256_set1_ps(ROUNDER));
    let (lo, hi) = (_mm256_set1_ps(-127.0), _mm256_set1_ps(127.0));
    let round = |v: __m256| {
        let r = _mm256_sub_ps(_mm256_add_ps(_mm256_mul_ps(v, inv), rounder), rounder);
        // NaN lanes (from a non-finite input) become 0, as round_to_int's.
        let clamped = _mm256_and_ps(_mm256_min_ps(_mm256_max_ps(r, lo), hi), ordered(r));
        _mm256_cvtps_epi32(clamped)
    };
    let i: [__m256i; 4] = std::array::from_fn(|k| round(v[k]));
    // Saturating packs interleave the 128-bit lanes; the permute puts the 32 bytes in order.
    let bytes = _mm256_packs_epi16(
        _mm256_packs_epi32(i[0], i[1]),
        _mm256_packs_epi32(i[2], i[3]),
    );
    let ordered_bytes =
        _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    _mm256_storeu_si256(q.as_mut_ptr() as *mut __m256i, ordered_bytes);
    let s = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
    let s = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256::<1>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
    let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
    (d, _mm_cvtsi128_si32(s))
}
