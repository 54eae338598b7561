//! Products `x [m, k] · w [k, n]` with few rows on the CPU, streaming the weight once.
//!
//! A warm request computes only its new tokens: a few to a few dozen rows against every weight
//! of the model. matrixmultiply packs the whole `[k, n]` weight on each call, which costs about
//! as much as the product itself at these sizes (measured: 13% of a 160-row suffix prefill, and
//! the LM head at 0.5 GFLOP/s for one row). Here each thread takes a band of 16 output columns
//! and runs down the weight rows once per group of 4 input rows, with the band's 4x16
//! accumulators in registers; the band of the weight stays in cache between row groups.
//!
//! With AVX2 and FMA (detected at run time) the band kernel uses fused multiply-adds; elsewhere
//! a portable loop computes the same sums.
//!
//! **Bit-identical to matrixmultiply.** The reduction over `k` runs in blocks of [`KC`] (256, the
//! `kc` of matrixmultiply's sgemm, which burn-ndarray uses above [`super`]'s row threshold): each
//! block is summed from zero by sequential multiply-adds, and the block sums are added to the
//! output in order, exactly as matrixmultiply's micro-kernel and its `beta = 1` accumulation do.
//! So a row's result does not depend on how many rows share the call, nor on which of the two
//! kernels ran: a sequence batched with others computes bit for bit what it computes alone
//! (`tests::matches_matrixmultiply_bit_for_bit`).

use rayon::prelude::*;

/// Output columns per band: two 8-lane vectors.
const BAND: usize = 16;
/// Bands per parallel task: enough work per task to amortise scheduling.
const BANDS_PER_TASK: usize = 4;
/// The reduction block of matrixmultiply's sgemm (`S_KC` in its `archparam_defaults.rs`).
pub(crate) const KC: usize = 256;

/// `y = x · w` for row-major `x [m, k]` and `w [k, n]`.
pub fn matmul(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    assert!(
        x.len() >= m * k && w.len() >= k * n,
        "matmul: operand sizes"
    );
    let width = BAND * BANDS_PER_TASK;
    let tasks: Vec<Vec<f32>> = (0..n.div_ceil(width))
        .into_par_iter()
        .map(|t| {
            let j0 = t * width;
            let cols = width.min(n - j0);
            let mut tile = vec![0f32; m * cols];
            columns(x, w, m, k, n, j0, cols, &mut tile);
            tile
        })
        .collect();
    let mut y = vec![0f32; m * n];
    for (t, tile) in tasks.iter().enumerate() {
        let j0 = t * width;
        let cols = tile.len() / m.max(1);
        for r in 0..m {
            y[r * n + j0..r * n + j0 + cols].copy_from_slice(&tile[r * cols..(r + 1) * cols]);
        }
    }
    y
}

/// Columns `j0..j0 + cols` of `y` into `tile` (`[m, cols]`).
#[allow(clippy::too_many_arguments)]
fn columns(
    x: &[f32],
    w: &[f32],
    m: usize,
    k: usize,
    n: usize,
    j0: usize,
    cols: usize,
    tile: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    {
        if has_fma() {
            let full = cols / BAND * BAND;
            // SAFETY: the CPU supports AVX2 and FMA (checked above); the kernel reads x rows
            // `0..m` (k each), w rows `0..k` at columns `j0..j0 + full` (within n), and writes
            // tile columns `0..full` of rows `0..m`.
            unsafe { avx2::bands(x, w, m, k, n, j0, full, tile, cols) };
            portable(x, w, m, k, n, j0 + full, full, cols, tile);
            return;
        }
    }
    portable(x, w, m, k, n, j0, 0, cols, tile);
}

/// Tile columns `from..cols` (output columns `j0 - from + ..`), one multiply-add at a time.
#[allow(clippy::too_many_arguments)]
fn portable(
    x: &[f32],
    w: &[f32],
    m: usize,
    k: usize,
    n: usize,
    j: usize,
    from: usize,
    cols: usize,
    tile: &mut [f32],
) {
    let width = cols - from;
    if width == 0 {
        return;
    }
    let fused = has_fma();
    let mut acc = vec![0f32; width];
    for r in 0..m {
        let out = &mut tile[r * cols + from..r * cols + cols];
        for k0 in (0..k).step_by(KC) {
            acc.fill(0.0);
            for i in k0..(k0 + KC).min(k) {
                let xi = x[r * k + i];
                let row = &w[i * n + j..i * n + j + width];
                for (a, &wv) in acc.iter_mut().zip(row) {
                    *a = if fused {
                        xi.mul_add(wv, *a)
                    } else {
                        xi * wv + *a
                    };
                }
            }
            for (o, a) in out.iter_mut().zip(&acc) {
                *o = if k0 == 0 { *a } else { *o + *a };
            }
        }
    }
}

/// Whether matrixmultiply runs its FMA kernel here (AVX2 and FMA): multiply-adds must then be
/// fused to round as it does; elsewhere they round twice, as its other kernels do.
fn has_fma() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("fma") && std::arch::is_x86_feature_detected!("avx2")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{BAND, KC};
    use std::arch::x86_64::*;

    /// `tile = acc` for the first reduction block, `tile += acc` after it.
    #[inline(always)]
    unsafe fn put(out: *mut f32, acc: __m256, first: bool) {
        if first {
            _mm256_storeu_ps(out, acc);
        } else {
            _mm256_storeu_ps(out, _mm256_add_ps(_mm256_loadu_ps(out), acc));
        }
    }

    /// Bands of 16 columns: tile columns `0..full`, output columns `j0..j0 + full`; `stride` is
    /// the tile's row length.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn bands(
        x: &[f32],
        w: &[f32],
        m: usize,
        k: usize,
        n: usize,
        j0: usize,
        full: usize,
        tile: &mut [f32],
        stride: usize,
    ) {
        let (xp, wp, tp) = (x.as_ptr(), w.as_ptr(), tile.as_mut_ptr());
        for b in (0..full).step_by(BAND) {
            let wb = wp.add(j0 + b);
            for k0 in (0..k).step_by(KC) {
                let (k1, first) = ((k0 + KC).min(k), k0 == 0);
                let mut r = 0;
                while r + 4 <= m {
                    let mut acc = [_mm256_setzero_ps(); 8];
                    for i in k0..k1 {
                        let w0 = _mm256_loadu_ps(wb.add(i * n));
                        let w1 = _mm256_loadu_ps(wb.add(i * n + 8));
                        for q in 0..4 {
                            let xq = _mm256_broadcast_ss(&*xp.add((r + q) * k + i));
                            acc[2 * q] = _mm256_fmadd_ps(xq, w0, acc[2 * q]);
                            acc[2 * q + 1] = _mm256_fmadd_ps(xq, w1, acc[2 * q + 1]);
                        }
                    }
                    for q in 0..4 {
                        let out = tp.add((r + q) * stride + b);
                        put(out, acc[2 * q], first);
                        put(out.add(8), acc[2 * q + 1], first);
                    }
                    r += 4;
                }
                while r < m {
                    let (mut a0, mut a1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
                    for i in k0..k1 {
                        let xq = _mm256_broadcast_ss(&*xp.add(r * k + i));
                        a0 = _mm256_fmadd_ps(xq, _mm256_loadu_ps(wb.add(i * n)), a0);
                        a1 = _mm256_fmadd_ps(xq, _mm256_loadu_ps(wb.add(i * n + 8)), a1);
                    }
                    let out = tp.add(r * stride + b);
                    put(out, a0, first);
                    put(out.add(8), a1, first);
                    r += 1;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn naive(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut y = vec![0f64; m * n];
        for r in 0..m {
            for i in 0..k {
                for j in 0..n {
                    y[r * n + j] += x[r * k + i] as f64 * w[i * n + j] as f64;
                }
            }
        }
        y.into_iter().map(|v| v as f32).collect()
    }

    /// burn-ndarray's product, which runs matrixmultiply's sgemm.
    fn sgemm(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        use burn::tensor::{Tensor, TensorData};
        type Cpu = burn::backend::NdArray<f32>;
        let dev = Default::default();
        let x = Tensor::<Cpu, 2>::from_data(TensorData::new(x.to_vec(), [m, k]), &dev);
        let w = Tensor::<Cpu, 2>::from_data(TensorData::new(w.to_vec(), [k, n]), &dev);
        x.matmul(w).into_data().to_vec::<f32>().unwrap()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// The same bits as matrixmultiply for every shape (reductions longer than one 256-wide
        /// block, band and row remainders included), so which kernel a row goes through, and how
        /// many rows share the call, never changes its result. Only where matrixmultiply and this
        /// kernel pick matching instruction sets (x86-64 with or without AVX2+FMA); elsewhere the
        /// f64 test below still bounds the error.
        #[test]
        fn matches_matrixmultiply_bit_for_bit(m in 1usize..40, k in 1usize..700, n in 1usize..90, seed in 0u32..1000) {
            let val = |i: usize| (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 2001) as f32 - 1000.0) / 700.0;
            let x: Vec<f32> = (0..m * k).map(val).collect();
            let w: Vec<f32> = (0..k * n).map(|i| val(i + 104729)).collect();
            let got = matmul(&x, &w, m, k, n);
            let want = sgemm(&x, &w, m, k, n);
            if cfg!(target_arch = "x86_64") {
                for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                    prop_assert_eq!(g.to_bits(), e.to_bits(), "element {} of [{}, {}]: {} vs {}", i, m, n, g, e);
                }
            }
        }
    }

    proptest! {
        /// Every shape, band remainders and row remainders included, gives the product within
        /// float rounding of an f64 reference.
        #[test]
        fn equals_the_naive_product(m in 1usize..13, k in 1usize..40, n in 1usize..150, seed in 0u32..1000) {
            let val = |i: usize| (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 2001) as f32 - 1000.0) / 500.0;
            let x: Vec<f32> = (0..m * k).map(val).collect();
            let w: Vec<f32> = (0..k * n).map(|i| val(i + 7919)).collect();
            let got = matmul(&x, &w, m, k, n);
            let want = naive(&x, &w, m, k, n);
            for (g, e) in got.iter().zip(&want) {
                prop_assert!((g - e).abs() <= 1e-4 * (1.0 + e.abs()), "{g} vs {e}");
            }
        }
    }
}
