//! Products `x [m, k] · w [k, n]` with few rows on the CPU, streaming the weight once.
//!
//! A warm request computes only its new tokens: a few to a few dozen rows against every weight
//! of the model. matrixmultiply packs the whole `[k, n]` weight on each call, which costs about
//! as much as the product itself at these sizes (measured: 13% of a 160-row suffix prefill, and
//! the LM head at 0.5 GFLOP/s for one row). Here each thread takes a band of 16 output columns
//! and runs down the weight rows once per group of 4 input rows, with the band's 4x16
//! accumulators in registers; the band of the weight stays in cache between row groups.
//!
//! Up to [`STREAM_MAX_ROWS`] rows the product is memory-bound, and the band order reads a wide
//! weight badly: a band's rows lie a whole row apart, one cache line per 4 KiB page, which the
//! prefetchers do not follow (the LM head's 113 MB streamed at 7 GB/s). There each thread takes a
//! range of columns and reads the weight row by row instead, contiguously, keeping its partial
//! sums in cache.
//!
//! With AVX2 and FMA (detected at run time) the kernels use fused multiply-adds; elsewhere a
//! portable loop computes the same sums.
//!
//! **Bit-identical to matrixmultiply.** The reduction over `k` runs in blocks of [`KC`] (256, the
//! `kc` of matrixmultiply's sgemm, which burn-ndarray uses above kvb-model's few-row threshold): each
//! block is summed from zero by sequential multiply-adds, and the block sums are added to the
//! output in order, exactly as matrixmultiply's micro-kernel and its `beta = 1` accumulation do.
//! So a row's result does not depend on how many rows share the call, nor on which of the two
//! kernels ran: a sequence batched with others computes bit for bit what it computes alone
//! (`tests::matches_matrixmultiply_bit_for_bit`).

use crate::column_tasks::in_column_ranges;
use crate::tile::Tile;

/// Output columns per band: two 8-lane vectors.
const BAND: usize = 16;
/// Bands per parallel task: enough work per task to amortise scheduling ...
const BANDS_PER_TASK: usize = 4;
/// ... and for wide weights (the LM head) more, so each weight row is read in runs of 1 KiB
/// when a task packs its 256-row block (see `avx2::bands`).
const BANDS_PER_WIDE_TASK: usize = 16;
const WIDE: usize = 8192;
pub(crate) use crate::{has_fma, KC};
/// A weight is read row by row (see the module doc) for up to this many rows ...
const STREAM_MAX_ROWS: usize = 4;
/// ... when it is this wide; for 1 or 2 rows already from [`STREAM_MIN_COLS_FEW`] columns.
/// Measured on the model's shapes: 1 row x 3,072 columns 0.45 -> 0.28 ms, 1 x 49,152 (the LM
/// head) 15.7 -> 3.9 ms, 4 x 49,152 18.2 -> 6.8 ms; but 4 x 3,072 0.32 -> 0.51 ms.
const STREAM_MIN_COLS: usize = 16_384;
const STREAM_MIN_COLS_FEW: usize = 1024;

/// Whether [`matmul`] reads the weight row by row for this shape.
fn streams(m: usize, n: usize) -> bool {
    (m <= 2 && n >= STREAM_MIN_COLS_FEW) || (m <= STREAM_MAX_ROWS && n >= STREAM_MIN_COLS)
}

/// `y = x · w` for row-major `x [m, k]` and `w [k, n]`.
pub fn matmul(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    assert!(
        x.len() >= m * k && w.len() >= k * n,
        "matmul: operand sizes"
    );
    #[cfg(target_arch = "x86_64")]
    if streams(m, n) && has_fma() {
        return streamed(x, w, m, k, n);
    }
    let width = BAND
        * if n >= WIDE {
            BANDS_PER_WIDE_TASK
        } else {
            BANDS_PER_TASK
        };
    in_column_ranges(m, n, width, |j0, cols, tile| {
        columns(x, w, m, k, n, j0, cols, tile)
    })
}

/// [`matmul`] for few rows and a wide weight: each task owns a range of columns and reads the
/// weight's rows in order over it.
#[cfg(target_arch = "x86_64")]
fn streamed(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let tasks = 4 * rayon::current_num_threads();
    let per = n.div_ceil(tasks).div_ceil(BAND) * BAND;
    in_column_ranges(m, n, per, |j0, cols, tile| {
        // SAFETY: the CPU has AVX2 and FMA (checked by the caller); the kernel reads x rows
        // `0..m` (k each) and w rows `0..k` at columns `j0..j0 + cols` (within n).
        unsafe { avx2::stream(x, w, m, k, n, j0, cols, tile) }
    })
}

/// Columns `j0..j0 + cols` of `y` into `tile` (m rows of `cols`).
#[allow(clippy::too_many_arguments)]
fn columns(
    x: &[f32],
    w: &[f32],
    m: usize,
    k: usize,
    n: usize,
    j0: usize,
    cols: usize,
    tile: &mut Tile,
) {
    #[cfg(target_arch = "x86_64")]
    {
        if has_fma() {
            let full = cols / BAND * BAND;
            // SAFETY: the CPU supports AVX2 and FMA (checked above); the kernel reads x rows
            // `0..m` (k each), w rows `0..k` at columns `j0..j0 + full` (within n), and writes
            // tile columns `0..full` of rows `0..m`.
            unsafe { avx2::bands(x, w, m, k, n, j0, full, tile) };
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
    tile: &mut Tile,
) {
    let width = cols - from;
    if width == 0 {
        return;
    }
    let fused = has_fma();
    let mut acc = vec![0f32; width];
    for r in 0..m {
        let out = &mut tile.row(r)[from..cols];
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

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Tile, BAND, KC};
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

    /// What [`group`] reads and writes: `(x, k, r, band, step, k0, k1, out, stride, first)`, one
    /// tuple so the callers for every group size pass the same thing.
    type GroupArgs = (
        *const f32,
        usize,
        usize,
        *const f32,
        usize,
        usize,
        usize,
        *mut f32,
        usize,
        bool,
    );

    /// Rows `r..r + R` of x (`[m, k]`) against one band over weight rows `k0..k1` (row i at
    /// `band + (i - k0) * step`), with the R x 16 accumulators in registers; stores into `out`
    /// (row stride `stride`), or adds to it unless `first`.
    #[inline(always)]
    unsafe fn group<const R: usize>((xp, k, r, band, step, k0, k1, out, stride, first): GroupArgs) {
        let mut acc = [[_mm256_setzero_ps(); 2]; R];
        for i in k0..k1 {
            let row = band.add((i - k0) * step);
            let w0 = _mm256_loadu_ps(row);
            let w1 = _mm256_loadu_ps(row.add(8));
            for (q, a) in acc.iter_mut().enumerate() {
                let xq = _mm256_broadcast_ss(&*xp.add((r + q) * k + i));
                a[0] = _mm256_fmadd_ps(xq, w0, a[0]);
                a[1] = _mm256_fmadd_ps(xq, w1, a[1]);
            }
        }
        for (q, a) in acc.iter().enumerate() {
            let o = out.add(q * stride);
            put(o, a[0], first);
            put(o.add(8), a[1], first);
        }
    }

    /// Columns `j0..j0 + cols` of `y = x · w` into `tile` (m rows, at most 4), reading the
    /// weight row by row. Per output element the same sums as [`bands`]: each 256-row block
    /// summed from zero by fused multiply-adds in row order, the blocks added in order.
    #[target_feature(enable = "avx2,fma")]
    #[allow(clippy::too_many_arguments)]
    pub unsafe fn stream(
        x: &[f32],
        w: &[f32],
        m: usize,
        k: usize,
        n: usize,
        j0: usize,
        cols: usize,
        tile: &mut Tile,
    ) {
        debug_assert!(m <= 4);
        let mut acc = vec![0f32; m * cols];
        let full = cols / 8 * 8;
        let (xp, wp, ap) = (x.as_ptr(), w.as_ptr(), acc.as_mut_ptr());
        for k0 in (0..k).step_by(KC) {
            let k1 = (k0 + KC).min(k);
            acc.fill(0.0);
            for i in k0..k1 {
                let row = wp.add(i * n + j0);
                let mut xs = [_mm256_setzero_ps(); 4];
                for (r, xr) in xs.iter_mut().enumerate().take(m) {
                    *xr = _mm256_broadcast_ss(&*xp.add(r * k + i));
                }
                for c in (0..full).step_by(8) {
                    let wv = _mm256_loadu_ps(row.add(c));
                    for (r, xr) in xs.iter().enumerate().take(m) {
                        let a = ap.add(r * cols + c);
                        _mm256_storeu_ps(a, _mm256_fmadd_ps(*xr, wv, _mm256_loadu_ps(a)));
                    }
                }
                for c in full..cols {
                    let wv = *row.add(c);
                    for r in 0..m {
                        let a = &mut acc[r * cols + c];
                        *a = x[r * k + i].mul_add(wv, *a);
                    }
                }
            }
            for (r, acc) in acc.chunks_exact(cols).enumerate() {
                for (t, a) in tile.row(r).iter_mut().zip(acc) {
                    *t = if k0 == 0 { *a } else { *t + *a };
                }
            }
        }
    }

    /// Bands of 16 columns: tile columns `0..full`, output columns `j0..j0 + full`.
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
        tile: &mut Tile,
    ) {
        assert!(tile.rows() >= m && tile.cols() >= full);
        let (xp, wp, stride, tp) = (x.as_ptr(), w.as_ptr(), tile.stride(), tile.as_mut_ptr());
        // A band's rows lie `n` floats apart: when that is a multiple of 4 KiB (the LM head's
        // 49,152 columns, the MLP's 3,072) every row of the band falls in the same cache sets,
        // and each group of 4 input rows would fetch the band from memory again (measured: the
        // LM head at 24 GFLOP/s for 16 rows). With more than one group, each 256-row block of the
        // task's columns is first copied, band after band, into a contiguous scratch (reading
        // each weight row in one run), and every group reads its band from there.
        let pack = m > 4;
        let mut scratch = if pack {
            vec![0f32; KC * full]
        } else {
            Vec::new()
        };
        for k0 in (0..k).step_by(KC) {
            let (k1, first) = ((k0 + KC).min(k), k0 == 0);
            let rows = k1 - k0;
            if pack {
                let sp = scratch.as_mut_ptr();
                for i in k0..k1 {
                    let src = wp.add(i * n + j0);
                    for b in (0..full).step_by(BAND) {
                        let dst = sp.add(b * rows + (i - k0) * BAND);
                        _mm256_storeu_ps(dst, _mm256_loadu_ps(src.add(b)));
                        _mm256_storeu_ps(dst.add(8), _mm256_loadu_ps(src.add(b + 8)));
                    }
                }
            }
            for b in (0..full).step_by(BAND) {
                // Row i of the block at `band.add((i - k0) * step)`.
                let (band, step) = if pack {
                    (scratch.as_ptr().add(b * rows), BAND)
                } else {
                    (wp.add(k0 * n + j0 + b), n)
                };
                // Rows in register groups of 6, then 4, then one by one.
                let mut r = 0;
                while r < m {
                    let out = tp.add(r * stride + b);
                    let rows = match m - r {
                        6.. => 6,
                        4 | 5 => 4,
                        _ => 1,
                    };
                    let args = (xp, k, r, band, step, k0, k1, out, stride, first);
                    match rows {
                        6 => group::<6>(args),
                        4 => group::<4>(args),
                        _ => group::<1>(args),
                    }
                    r += rows;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocked::tests::sgemm;
    use crate::test_values::spread;
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

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// The same bits as matrixmultiply for every shape (reductions longer than one 256-wide
        /// block, band and row remainders included), so which kernel a row goes through, and how
        /// many rows share the call, never changes its result. Only where matrixmultiply and this
        /// kernel pick matching instruction sets (x86-64 with or without AVX2+FMA); elsewhere the
        /// f64 test below still bounds the error.
        #[test]
        fn matches_matrixmultiply_bit_for_bit(m in 1usize..40, k in 1usize..700, n in 1usize..90, seed in 0u32..1000) {
            let val = |i: usize| spread(i, seed, 700.0);
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

    /// The row-by-row path too: the same bits as matrixmultiply.
    #[test]
    fn the_streamed_path_matches_matrixmultiply_bit_for_bit() {
        for (m, k, n) in [
            (1, 100, 1024),
            (2, 300, 1100),
            (1, 600, 1031),
            (3, 257, 16_400),
            (4, 64, 16_384),
        ] {
            assert!(streams(m, n));
            let val = |i: usize| spread(i, 0, 700.0);
            let x: Vec<f32> = (0..m * k).map(val).collect();
            let w: Vec<f32> = (0..k * n).map(|i| val(i + 104729)).collect();
            let got = matmul(&x, &w, m, k, n);
            let want = sgemm(&x, &w, m, k, n);
            if cfg!(target_arch = "x86_64") {
                for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                    assert_eq!(
                        g.to_bits(),
                        e.to_bits(),
                        "[{m}, {k}] x [{k}, {n}], element {i}"
                    );
                }
            }
        }
    }

    proptest! {
        /// Every shape, band remainders and row remainders included, gives the product within
        /// float rounding of an f64 reference.
        #[test]
        fn equals_the_naive_product(m in 1usize..13, k in 1usize..40, n in 1usize..150, seed in 0u32..1000) {
            let val = |i: usize| spread(i, seed, 500.0);
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
