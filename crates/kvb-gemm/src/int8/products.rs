//! `y = x · w` with 8-bit activations: the work split, the kernel choice, and the portable loop
//! that defines the arithmetic (see the parent module) and runs where AVX-512 VNNI is absent.

use super::{IntDotMatrix, QuantizedRows, BLOCK, LANES};
use crate::column_tasks::in_column_shares;
use crate::tile::Tile;

/// Rows one kernel call keeps in registers (an i32 sum and an f32 output each, beside the
/// weights).
pub(super) const MAX_TILE_ROWS: usize = 8;
/// Rows one call of a two-group kernel keeps (twice the sums per row).
pub(super) const PAIR_ROWS: usize = MAX_TILE_ROWS / 2;
/// Rows a task runs over each group of its columns before the next group: the group's weights
/// stay in L1 between the row tiles, these rows' integers in L2 between the groups.
const ROWS_PER_PASS: usize = 64;

/// The kernels, by instruction set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Kernel {
    /// Plain loops (the definition).
    Portable,
    /// AVX2 and FMA: `vpmaddubsw` and `vpmaddwd` on 8 lanes.
    #[cfg(target_arch = "x86_64")]
    Avx2,
    /// AVX-512 with VNNI and BW: `vpdpbusd` on 16 lanes.
    #[cfg(target_arch = "x86_64")]
    Vnni512,
    /// [`Kernel::Vnni512`], with AMX's tile products for K-quant cells by 16 rows at a time
    /// (a prefill: [`super::kcells_amx`]).
    #[cfg(target_arch = "x86_64")]
    Amx,
}

impl Kernel {
    /// The fastest kernel this CPU runs, within `KVB_CPU_ISA`'s cap ([`crate::isa`]).
    pub(super) fn detect() -> Kernel {
        static KERNEL: std::sync::OnceLock<Kernel> = std::sync::OnceLock::new();
        *KERNEL.get_or_init(|| {
            let all = Kernel::on(crate::cpu());
            all[all.len() - 1]
        })
    }

    /// Whether the kernel takes two groups of columns per call.
    fn pairs(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        if self.vector() == Kernel::Vnni512 {
            return true;
        }
        false
    }

    /// The kernel without AMX's tiles: what runs where they do not (the quantizer, the
    /// re-laid matrices, tiles of fewer rows).
    pub(super) fn vector(self) -> Kernel {
        #[cfg(target_arch = "x86_64")]
        if self == Kernel::Amx {
            return Kernel::Vnni512;
        }
        self
    }

    /// Every kernel this CPU runs (tests compare them).
    #[cfg(test)]
    pub(super) fn supported() -> Vec<Kernel> {
        let widest = crate::CpuFeatures::supported();
        Kernel::on(&widest[widest.len() - 1])
    }

    /// The kernels a CPU with `features` runs, narrowest first.
    fn on(features: &crate::CpuFeatures) -> Vec<Kernel> {
        #[cfg(not(target_arch = "x86_64"))]
        let _ = features;
        let mut all = vec![Kernel::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            // F16C widens the file's f16 scales (every AVX2 CPU has it).
            if features.isa >= crate::Isa::Avx2Fma && features.f16c {
                all.push(Kernel::Avx2);
            }
            if features.avx512bw && features.avx512vnni && features.f16c {
                all.push(Kernel::Vnni512);
                if features.avx512vl && features.amx_int8 {
                    all.push(Kernel::Amx);
                }
            }
        }
        all
    }
}

/// The instructions the 8-bit products run on here, for messages: `AMX and AVX-512 VNNI`,
/// `AVX-512 VNNI`, `AVX2`, or `portable loops (slow)`.
pub fn kernel_name() -> &'static str {
    match Kernel::detect() {
        Kernel::Portable => "portable loops (slow)",
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => "AVX2",
        #[cfg(target_arch = "x86_64")]
        Kernel::Vnni512 => "AVX-512 VNNI",
        #[cfg(target_arch = "x86_64")]
        Kernel::Amx => "AMX and AVX-512 VNNI",
    }
}

/// `y [m, n] = x [m, k] · w` with `x` quantized to 8 bits per value ([`QuantizedRows`]).
pub fn matmul(x: &[f32], m: usize, w: &IntDotMatrix) -> Vec<f32> {
    matmul_quantized(&QuantizedRows::new(x, m, w.k()), w, Kernel::detect())
}

/// `y = a · w` with `kernel`.
pub(super) fn matmul_quantized(a: &QuantizedRows, w: &IntDotMatrix, kernel: Kernel) -> Vec<f32> {
    assert_eq!(a.k, w.k, "int8 matmul: the rows' width is not the weight's");
    if let Some(cells) = &w.kcells {
        return super::kcells::matmul(a, cells, kernel);
    }
    let (m, n) = (a.m, w.n);
    in_column_shares(m, n, LANES, |j0, cols, tile| {
        columns(a, w, kernel, j0, cols, tile)
    })
}

/// Columns `j0..j0 + cols` (`j0` a multiple of 16) of `y` into `tile` (m rows of `cols`).
pub(super) fn columns(
    a: &QuantizedRows,
    w: &IntDotMatrix,
    kernel: Kernel,
    j0: usize,
    cols: usize,
    tile: &mut Tile,
) {
    if let Some(cells) = &w.kcells {
        return super::kcells::columns(a, cells, kernel, j0, cols, tile);
    }
    // AMX's tiles serve K-quant cells only.
    let kernel = kernel.vector();
    let (g0, g1) = (j0 / LANES, (j0 + cols).div_ceil(LANES));
    let mut out = [0f32; MAX_TILE_ROWS * LANES];
    for p0 in (0..a.m).step_by(ROWS_PER_PASS) {
        let p1 = (p0 + ROWS_PER_PASS).min(a.m);
        let mut g = g0;
        while g < g1 {
            // The AVX-512 kernel takes two groups at once where two are left, for two rows
            // or more: one row streams its weights from memory, and one stream at a time keeps
            // the hardware prefetchers on it (a pair measured 1.2x slower there).
            let groups = if kernel.pairs() && g + 1 < g1 && p1 - p0 > 1 {
                2
            } else {
                1
            };
            let step = if groups == 2 {
                PAIR_ROWS
            } else {
                MAX_TILE_ROWS
            };
            for r0 in (p0..p1).step_by(step) {
                let rows = step.min(p1 - r0);
                match kernel {
                    Kernel::Portable => portable(a, r0, rows, w, g, &mut out),
                    // SAFETY: `detect` found AVX-512F, BW, VNNI and F16C; `a` holds rows
                    // `r0..r0 + rows` (within m, at most PAIR_ROWS for a pair) of width
                    // k = w.k; groups `g..g + groups` are w's; `out` holds MAX_TILE_ROWS * 16
                    // = PAIR_ROWS * 2 * 16 values.
                    #[cfg(target_arch = "x86_64")]
                    Kernel::Vnni512 => unsafe {
                        // The first row tile of a group fetches its weights ahead.
                        super::avx512::tile(a, r0, rows, w, (g, groups), r0 == p0, &mut out)
                    },
                    // SAFETY: as above, with AVX2, FMA and F16C (`detect`), one group.
                    #[cfg(target_arch = "x86_64")]
                    Kernel::Avx2 => unsafe { super::avx2::tile(a, r0, rows, w, g, &mut out) },
                    #[cfg(target_arch = "x86_64")]
                    Kernel::Amx => unreachable!("`vector` takes the tiles off"),
                }
                for j in 0..groups {
                    let first = (g + j - g0) * LANES;
                    let width = LANES.min(cols - first);
                    for r in 0..rows {
                        let from = (r * groups + j) * LANES;
                        tile.row(r0 + r)[first..first + width]
                            .copy_from_slice(&out[from..from + width]);
                    }
                }
            }
            g += groups;
        }
    }
}

/// The definition: rows `r0..r0 + rows` of `a` against group `g`'s 16 columns, into `out`
/// (row `r`'s lanes at `r * 16`), summing each output as the parent module says. Each block's
/// columns are decoded once for all the rows, and the integer dot products are plain loops the
/// compiler vectorises (this runs where no kernel does, on ARM too).
pub(super) fn portable(
    a: &QuantizedRows,
    r0: usize,
    rows: usize,
    w: &IntDotMatrix,
    g: usize,
    out: &mut [f32],
) {
    let blocks = a.k / BLOCK;
    let mut y = [[0f32; LANES]; MAX_TILE_ROWS];
    for b in 0..blocks {
        let columns: [(f32, f32, [i32; BLOCK]); LANES] = std::array::from_fn(|lane| {
            let j = g * LANES + lane;
            if j < w.n {
                w.stored(j, b)
            } else {
                (0.0, 0.0, [0; BLOCK])
            }
        });
        for (r, y) in y.iter_mut().enumerate().take(rows) {
            let row = r0 + r;
            let x = &a.q[row * a.k + b * BLOCK..][..BLOCK];
            let at = row * blocks + b;
            let (dx, sx) = (a.scale[at], a.scaled_sum[at]);
            for (y, (scale, offset, q)) in y.iter_mut().zip(&columns) {
                let isum: i32 = q.iter().zip(x).map(|(&q, &x)| q * x as i32).sum();
                *y = (isum as f32).mul_add(scale * dx, *y);
                if w.has_offsets {
                    *y = offset.mul_add(sx, *y);
                }
            }
        }
    }
    for (r, y) in y.iter().enumerate().take(rows) {
        out[r * LANES..(r + 1) * LANES].copy_from_slice(y);
    }
}
