//! `c = alpha · a · b` (or `c += ...`) on the calling thread, for operands read in place through
//! strides: the two products of an attention tile (queries by keys, weights by values), which
//! run inside a parallel task per head and must not start threads of their own.
//!
//! Both operands are packed into the micro-kernel's panels first (thread-local buffers, reused),
//! so the strides cost one pass each; rounds as the crate doc says.

use crate::kernel::{self, MR, NR};
use crate::KC;
use std::cell::RefCell;

#[cfg(target_arch = "x86_64")]
mod pack_avx2;

/// A read-only matrix: element `(i, j)` at `ptr + i * row + j * col`.
#[derive(Clone, Copy, Debug)]
pub struct Strided {
    pub ptr: *const f32,
    pub row: isize,
    pub col: isize,
}

impl Strided {
    /// # Safety
    /// `(i, j)` must lie inside the matrix the view was made for.
    unsafe fn at(&self, i: usize, j: usize) -> f32 {
        // SAFETY: as the caller promised.
        unsafe {
            *self
                .ptr
                .offset(i as isize * self.row + j as isize * self.col)
        }
    }
}

/// What to do with `c`'s previous values.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    /// `c = alpha · a · b`.
    Overwrite,
    /// `c += alpha · a · b`.
    Accumulate,
}

thread_local! {
    /// Packed `a` and `b` of the current call: a few KiB to a few hundred, reused.
    static PANELS: RefCell<(Vec<f32>, Vec<f32>)> = const { RefCell::new((Vec::new(), Vec::new())) };
}

/// `c [m, n] (=|+=) alpha · a [m, k] · b [k, n]`, `c` row-major with `ldc` values per row.
///
/// # Safety
/// `a` must address `m x k` readable values and `b` `k x n` through their strides, valid for the
/// call and not overlapping `c`.
#[allow(clippy::too_many_arguments)]
pub unsafe fn product(
    (m, k, n): (usize, usize, usize),
    alpha: f32,
    a: Strided,
    b: Strided,
    output: Output,
    c: &mut [f32],
    ldc: usize,
) {
    // SAFETY: as the caller promised; `isa()` is this CPU's.
    unsafe { product_with(crate::isa(), (m, k, n), alpha, a, b, output, c, ldc) }
}

/// [`product`] with the kernels of `isa`.
///
/// # Safety
/// As for [`product`], and `isa` one of [`crate::Isa::supported`].
#[allow(clippy::too_many_arguments)]
unsafe fn product_with(
    isa: crate::Isa,
    (m, k, n): (usize, usize, usize),
    alpha: f32,
    a: Strided,
    b: Strided,
    output: Output,
    c: &mut [f32],
    ldc: usize,
) {
    assert!(
        m == 0 || n == 0 || (ldc >= n && c.len() >= (m - 1) * ldc + n),
        "strided::product: output size"
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if output == Output::Overwrite {
            c.chunks_mut(ldc).take(m).for_each(|r| r[..n].fill(0.0));
        }
        return;
    }
    let (rows, cols) = (m.div_ceil(MR) * MR, n.div_ceil(NR) * NR);
    PANELS.with_borrow_mut(|(pa, pb)| {
        pa.resize(pa.len().max(rows * KC), 0.0);
        pb.resize(pb.len().max(cols * KC), 0.0);
        for k0 in (0..k).step_by(KC) {
            let kc = KC.min(k - k0);
            // SAFETY: the caller guarantees the operands' extents.
            unsafe {
                pack_rows(isa, a, m, k0, kc, pa);
                pack_columns(isa, b, n, k0, kc, pb);
            }
            let sweep = kernel::Sweep {
                kc,
                a: pa,
                a_step: kc * MR,
                rows: m,
                b: pb,
                b_step: kc * NR,
                cols: n,
                alpha,
                first: k0 == 0 && output == Output::Overwrite,
            };
            // SAFETY: the m x n output lies within c (checked above), which this thread alone
            // holds; `isa` is this CPU's.
            unsafe { kernel::sweep(&sweep, c.as_mut_ptr(), ldc, isa) };
        }
    });
}

/// Rows of `a` into `[kc, MR]` panels (panel of row `i` from `i * kc`), rows past `m` zero.
///
/// # Safety
/// As for [`product`], and `isa` this CPU's.
unsafe fn pack_rows(isa: crate::Isa, a: Strided, m: usize, k0: usize, kc: usize, out: &mut [f32]) {
    #[cfg(not(target_arch = "x86_64"))]
    let _ = isa;
    for i0 in (0..m).step_by(MR) {
        let panel = &mut out[i0 * kc..][..kc * MR];
        let valid = MR.min(m - i0);
        #[cfg(target_arch = "x86_64")]
        if valid == MR && a.col == 1 && isa >= crate::Isa::Avx2Fma {
            // SAFETY: as the caller promised; AVX2 is present.
            unsafe { pack_avx2::rows_panel(a, i0, k0, kc, panel) };
            continue;
        }
        if valid < MR {
            panel.fill(0.0);
        }
        for r in 0..valid {
            for p in 0..kc {
                // SAFETY: row i0 + r < m, column k0 + p < k.
                panel[p * MR + r] = unsafe { a.at(i0 + r, k0 + p) };
            }
        }
    }
}

/// Columns of `b` into `[kc, NR]` panels (panel of column `j` from `j * kc`); columns past `n`
/// keep stale values, whose results are never stored.
///
/// # Safety
/// As for [`product`], and `isa` this CPU's.
unsafe fn pack_columns(
    isa: crate::Isa,
    b: Strided,
    n: usize,
    k0: usize,
    kc: usize,
    out: &mut [f32],
) {
    #[cfg(target_arch = "x86_64")]
    if b.row == 1 && isa >= crate::Isa::Avx2Fma {
        // SAFETY: as the caller promised; AVX2 is present.
        unsafe { pack_avx2::transposed_columns(b, n, k0, kc, out) };
        return;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = isa;
    for j0 in (0..n).step_by(NR) {
        let panel = &mut out[j0 * kc..][..kc * NR];
        let valid = NR.min(n - j0);
        if b.col == 1 {
            // Rows contiguous (values): copy runs of a row.
            for p in 0..kc {
                for j in 0..valid {
                    // SAFETY: row k0 + p < k, column j0 + j < n.
                    panel[p * NR + j] = unsafe { b.at(k0 + p, j0 + j) };
                }
            }
        } else {
            // Columns contiguous (keys read as a transpose): walk each column down.
            for j in 0..valid {
                for p in 0..kc {
                    // SAFETY: as above.
                    panel[p * NR + j] = unsafe { b.at(k0 + p, j0 + j) };
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::blocked::tests::values;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]
        /// Through strides (a transposed `b`, as attention reads its keys) and with `alpha`
        /// (scaled scores), the same bits as matrixmultiply on x86-64; accumulating (weights by
        /// values) adds onto what `c` held as its `beta = 1` does.
        #[test]
        fn matches_matrixmultiply_bit_for_bit(
            m in 1usize..70, k in 1usize..300, n in 1usize..270, seed in 0u32..1000,
            transposed in any::<bool>(), accumulate in any::<bool>(), scaled in any::<bool>(),
        ) {
            // matrixmultiply rounds `alpha * sum + c` once in whole blocks and twice at edges;
            // kvb-gemm always twice: the same bits wherever alpha is 1.
            let alpha = if scaled && !accumulate { 0.125f32 } else { 1.0 };
            let (x, w) = (values(m * k, seed), values(k * n, seed + 1));
            let start = values(m * n, seed + 2);
            // `w` as given ([k, n] row-major) or stored transposed ([n, k]) and read through strides.
            let wt: Vec<f32> = (0..n * k).map(|i| w[(i % k) * n + i / k]).collect();
            let b = if transposed {
                Strided { ptr: wt.as_ptr(), row: 1, col: k as isize }
            } else {
                Strided { ptr: w.as_ptr(), row: n as isize, col: 1 }
            };
            let a = Strided { ptr: x.as_ptr(), row: k as isize, col: 1 };
            let output = if accumulate { Output::Accumulate } else { Output::Overwrite };
            let mut want = start.clone();
            // SAFETY: as above; matrixmultiply's own call.
            unsafe {
                matrixmultiply::sgemm(
                    m, k, n, alpha, x.as_ptr(), k as isize, 1, w.as_ptr(), n as isize, 1,
                    if accumulate { 1.0 } else { 0.0 }, want.as_mut_ptr(), n as isize, 1,
                )
            };
            // Every FMA kernel this CPU runs (matrixmultiply picks FMA on the same CPUs).
            for isa in crate::Isa::supported().into_iter().filter(|i| *i >= crate::Isa::Avx2Fma) {
                let mut got = start.clone();
                // SAFETY: the views address x [m, k] and w [k, n] exactly; isa is supported.
                unsafe { product_with(isa, (m, k, n), alpha, a, b, output, &mut got, n) };
                for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                    prop_assert_eq!(g.to_bits(), e.to_bits(), "{:?}, element {}: {} vs {}", isa, i, g, e);
                }
            }
        }
    }
}
