//! Products `x [m, k] · w [k, n]` with many rows: a blocked GEMM in the manner of BLIS, whose
//! weight operand can come from any form (f32 rows, packed quantized cells).
//!
//! A prefill multiplies hundreds of token rows by every weight. matrixmultiply's sgemm does this
//! well for f32 operands (~140 GFLOP/s on 2 Zen 3 cores, 72% of the FMA peak), but a packed
//! weight had to be expanded to f32 panels first and each panel handed to sgemm, which packed
//! the whole of `x` again for every panel: a 2,709-token prefill took 14.6 s from the Q4_1 GGUF
//! against 11.7 s from f32. Here the weight is expanded straight into the kernel's panels, `x` is
//! packed once per call, and the micro-kernel keeps a 6 x 16 block of the output in registers.
//!
//! The loops, outermost first:
//! - parallel tasks, each owning [`MC`] rows by [`NC`] columns of `y`;
//! - the reduction in blocks of [`KC`] (256) rows of `w`: the task expands its `[KC, NC]` block
//!   of the weight into [`NR`]-column panels (L2-resident, 64 KiB);
//! - each `[KC, NR]` panel (16 KiB, L1) against each [`MR`]-row panel of packed `x`.
//!
//! Rounds as the crate doc says (the same bits as matrixmultiply's sgemm, tested).

use crate::kernel::{self, MR, NR};
use crate::{Isa, KC};
use rayon::prelude::*;
/// Rows of `y` per task, a whole number of micro-kernel panels: `[MC, KC]` of packed `x`
/// (252 KiB) stays in L2 while a weight panel passes over it.
const MC: usize = 42 * MR;
/// Columns of `y` per task: the task's weight block `[KC, NC]` is 64 KiB.
const NC: usize = 64;

/// A weight that can write any block of itself as f32 (`Sync`: tasks read it at once).
pub trait WeightPanels: Sync {
    /// Rows `k0..k0 + rows` of columns `j0..j0 + cols` (`cols <= NR`), row-major into `out`
    /// with `NR` values per row; columns past `cols` may hold anything (their results are
    /// computed but never stored).
    fn panel(&self, k0: usize, rows: usize, j0: usize, cols: usize, out: &mut [f32]);
}

/// A row-major f32 weight `[k, n]`.
pub struct DenseWeight<'a> {
    pub w: &'a [f32],
    pub n: usize,
}

impl WeightPanels for DenseWeight<'_> {
    fn panel(&self, k0: usize, rows: usize, j0: usize, cols: usize, out: &mut [f32]) {
        for (p, dst) in out.chunks_exact_mut(NR).take(rows).enumerate() {
            let at = (k0 + p) * self.n + j0;
            dst[..cols].copy_from_slice(&self.w[at..at + cols]);
        }
    }
}

/// `y = x · w` for row-major `x [m, k]` and a `[k, n]` weight, on rayon's threads.
pub fn matmul(x: &[f32], m: usize, k: usize, n: usize, w: &impl WeightPanels) -> Vec<f32> {
    matmul_with(crate::isa(), x, m, k, n, w)
}

/// [`matmul`] with the kernels of `isa` (one of [`Isa::supported`]).
pub(crate) fn matmul_with(
    isa: Isa,
    x: &[f32],
    m: usize,
    k: usize,
    n: usize,
    w: &impl WeightPanels,
) -> Vec<f32> {
    assert!(x.len() >= m * k, "gemm::matmul: operand sizes");
    let mut y = vec![0f32; m * n];
    if m == 0 || n == 0 || k == 0 {
        return y;
    }
    let a = PackedRows::new(x, m, k);
    let out = Output {
        ptr: y.as_mut_ptr(),
        n,
    };
    let row_blocks = m.div_ceil(MC);
    let col_blocks = n.div_ceil(NC);
    (0..row_blocks * col_blocks).into_par_iter().for_each(|t| {
        let (i0, j0) = ((t / col_blocks) * MC, (t % col_blocks) * NC);
        let tile = Tile {
            i0,
            rows: MC.min(m - i0),
            j0,
            cols: NC.min(n - j0),
        };
        task(&a, w, tile, &out, isa);
    });
    y
}

/// One task's block of `y`.
#[derive(Clone, Copy)]
struct Tile {
    i0: usize,
    rows: usize,
    j0: usize,
    cols: usize,
}

/// `y`'s values, written by tasks at disjoint tiles.
struct Output {
    ptr: *mut f32,
    n: usize,
}

// SAFETY: tasks write only their own tile of `y` (disjoint rows x columns), so sharing the
// pointer between threads never lets two of them touch one value.
unsafe impl Sync for Output {}

/// Computes `tile` of `y` over the whole reduction, one `KC` block after another.
fn task(a: &PackedRows, w: &impl WeightPanels, tile: Tile, out: &Output, isa: Isa) {
    thread_local! {
        /// The task's expanded weight block, reused between tasks.
        static PANELS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
    }
    PANELS.with_borrow_mut(|panels| {
        let col_panels = tile.cols.div_ceil(NR);
        if panels.len() < KC * NR * col_panels {
            panels.resize(KC * NR * col_panels, 0.0);
        }
        for k0 in (0..a.k).step_by(KC) {
            let kc = KC.min(a.k - k0);
            for c in 0..col_panels {
                let cols = NR.min(tile.cols - c * NR);
                let panel = &mut panels[c * KC * NR..][..kc * NR];
                w.panel(k0, kc, tile.j0 + c * NR, cols, panel);
            }
            let sweep = kernel::Sweep {
                kc,
                a: a.panels_from(k0, tile.i0),
                a_step: kc * MR,
                rows: tile.rows,
                b: panels,
                b_step: KC * NR,
                cols: tile.cols,
                alpha: 1.0,
                first: k0 == 0,
            };
            // SAFETY: `y` holds m rows of n; rows `i0..i0 + rows` and columns `j0..j0 + cols`
            // are this task's tile, which no other task writes; `isa` is this CPU's.
            unsafe { kernel::sweep(&sweep, out.ptr.add(tile.i0 * out.n + tile.j0), out.n, isa) };
        }
    });
}

/// `x` packed for the micro-kernel: for each `KC` block of the reduction, each [`MR`]-row panel
/// as `[kc, MR]` (rows past `m` zero), so the kernel reads it contiguously.
struct PackedRows {
    values: Vec<f32>,
    k: usize,
    /// `m` rounded up to [`MR`].
    rows: usize,
}

impl PackedRows {
    fn new(x: &[f32], m: usize, k: usize) -> Self {
        let rows = m.div_ceil(MR) * MR;
        let mut values = vec![0f32; rows * k];
        // Block `k0` holds `rows * kc` values from `rows * k0`; panel `p` of it `kc * MR` from
        // `p * kc * MR`. Panels are packed in parallel: each is a disjoint range.
        let mut panels: Vec<(usize, usize, &mut [f32])> =
            Vec::with_capacity(rows / MR * k.div_ceil(KC));
        let mut rest = values.as_mut_slice();
        for k0 in (0..k).step_by(KC) {
            let kc = KC.min(k - k0);
            for p in 0..rows / MR {
                let (panel, tail) = rest.split_at_mut(kc * MR);
                panels.push((k0, p * MR, panel));
                rest = tail;
            }
        }
        panels.into_par_iter().for_each(|(k0, i0, panel)| {
            let kc = panel.len() / MR;
            for r in 0..MR.min(m - i0) {
                let row = &x[(i0 + r) * k + k0..][..kc];
                for (p, &v) in row.iter().enumerate() {
                    panel[p * MR + r] = v;
                }
            }
        });
        Self { values, k, rows }
    }

    /// The panels of rows `i..` in the reduction block starting at `k0`, `kc * MR` apart.
    fn panels_from(&self, k0: usize, i: usize) -> &[f32] {
        let kc = KC.min(self.k - k0);
        &self.values[self.rows * k0 + i * kc..self.rows * (k0 + kc)]
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    /// matrixmultiply's sgemm of row-major operands.
    pub(crate) fn sgemm(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let mut y = vec![0f32; m * n];
        // SAFETY: x is [m, k], w [k, n], y [m, n], all row-major and disjoint.
        unsafe {
            matrixmultiply::sgemm(
                m,
                k,
                n,
                1.0,
                x.as_ptr(),
                k as isize,
                1,
                w.as_ptr(),
                n as isize,
                1,
                0.0,
                y.as_mut_ptr(),
                n as isize,
                1,
            )
        };
        y
    }

    /// Deterministic operands spread over [-1.4, 1.4].
    pub(crate) fn values(len: usize, seed: u32) -> Vec<f32> {
        (0..len)
            .map(|i| {
                (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 2001) as f32 - 1000.0)
                    / 700.0
            })
            .collect()
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(40))]
        /// The same bits as matrixmultiply for every shape: reductions of several 256-wide
        /// blocks, row counts past one task's, remainders of the 6 x 16 and 12 x 32 blocks, with
        /// every kernel this CPU runs (FMA ones: matrixmultiply picks FMA on the same CPUs).
        #[test]
        fn matches_matrixmultiply_bit_for_bit(
            m in prop_oneof![1usize..20, 250usize..530], k in 1usize..700, n in 1usize..150, seed in 0u32..1000,
        ) {
            let (x, w) = (values(m * k, seed), values(k * n, seed + 1));
            let want = sgemm(&x, &w, m, k, n);
            // Every kernel this CPU runs with fused multiply-adds, as matrixmultiply's.
            for isa in Isa::supported().into_iter().filter(|i| *i >= Isa::Avx2Fma) {
                let got = matmul_with(isa, &x, m, k, n, &DenseWeight { w: &w, n });
                for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                    prop_assert_eq!(g.to_bits(), e.to_bits(), "{:?}, element {}: {} vs {}", isa, i, g, e);
                }
            }
            // Without FMA: within rounding of it.
            let got = matmul_with(Isa::Portable, &x, m, k, n, &DenseWeight { w: &w, n });
            for (g, e) in got.iter().zip(&want) {
                prop_assert!((g - e).abs() <= 1e-4 * (1.0 + e.abs()), "portable: {} vs {}", g, e);
            }
        }
    }

    /// Empty operands give an empty or zero product instead of touching memory.
    #[test]
    fn empty_shapes_give_zeros() {
        assert!(matmul(
            &[],
            0,
            5,
            7,
            &DenseWeight {
                w: &[0.0; 35],
                n: 7
            }
        )
        .is_empty());
        assert_eq!(
            matmul(&[], 3, 0, 2, &DenseWeight { w: &[], n: 2 }),
            vec![0.0; 6]
        );
    }
}
