//! 8-bit activation products over K-quant cells at the file's bits (Q2_K to Q6_K and IQ4_XS,
//! [`crate::packed::kcells`]): no second copy of the weights, and the decode step streams what
//! the file holds. Cells with nibbles (Q4_K, Q5_K, Q6_K, IQ4_XS) are read in the byte dot
//! products' order ([`crate::packed::kcells_order`]), Q2_K's and Q3_K's as loaded.
//!
//! The arithmetic, per output and in this order: starting from zero, for each sub-block `s` of
//! each cell (32 rows; Q2_K, Q3_K and Q6_K 16), with `b` the activation block holding it,
//! `y = fma(isum_s as f32, scale_s * dx_b, y)`, then for Q2_K, Q4_K and Q5_K
//! `y = fma(offset_s, sx_s, y)` with `sx_s = dx_b * (the sub-block's sum of the row's integers)`
//! (for 32 rows the block's `scaled_sum`); `isum_s` is the exact integer dot product of the sub-block's
//! values (Q3_K's and Q6_K's signed, `q - 4` and `q - 32`; IQ4_XS's its table's entries) with
//! the row's 8-bit integers. For Q4_K and Q5_K these are the steps of the re-laid-out
//! matrices' products ([`super::products`]), so the bits are theirs, and for IQ4_XS those of
//! its 8-bit cells with f32 scales, which held it before (offset-free, a scale per 32).
//! [`portable`] is the definition; the x86 kernels ([`super::kcells_x86`]) give its bits.

use super::products::Kernel;
use super::{QuantizedRows, BLOCK};
use crate::column_tasks::in_column_shares;
use crate::packed::kcells::{self, parts, Layout, ROWS};
use crate::packed::{CellOrder, CellValues, PackedMatrix, GROUP};
use crate::tile::Tile;

/// Rows one kernel call keeps in registers at most (AVX-512's 32 registers: a sum and an
/// output per row).
pub(super) const MAX_TILE_ROWS: usize = 8;
/// Rows of the largest tile, AMX's, whose outputs one call leaves together.
#[cfg(target_arch = "x86_64")]
const OUT_ROWS: usize = super::kcells_amx::TILE_ROWS;
#[cfg(not(target_arch = "x86_64"))]
const OUT_ROWS: usize = MAX_TILE_ROWS;
/// Rows a task runs over each group before the next: the group's cells stay in L1 and L2
/// between the row tiles.
const ROWS_PER_PASS: usize = 64;
/// The rows' integers an AMX pass reads at most (a quarter of a 2 MB L2).
const AMX_PASS_BYTES: usize = 512 << 10;

/// `y [m, n] = a · w` for K-quant cells `w`, with `kernel`.
pub(super) fn matmul(a: &QuantizedRows, w: &PackedMatrix, kernel: Kernel) -> Vec<f32> {
    assert!(
        w.cell_values().is_k_quant(),
        "int8 K-quant products of {}",
        w.source()
    );
    let (m, n) = (a.m, w.n());
    // Pairs of groups: VNNI's two-group tile takes them at once from two rows.
    in_column_shares(m, n, 2 * GROUP, |j0, cols, tile| {
        columns(a, w, kernel, j0, cols, tile)
    })
}

/// Columns `j0..j0 + cols` (`j0` a multiple of 8) of `y` into `tile` (m rows of `cols`).
pub(super) fn columns(
    a: &QuantizedRows,
    w: &PackedMatrix,
    kernel: Kernel,
    j0: usize,
    cols: usize,
    tile: &mut Tile,
) {
    assert_eq!(
        a.k,
        w.k(),
        "int8 matmul: the rows' width is not the weight's"
    );
    assert_eq!(
        w.order(),
        CellOrder::for_int8(w.cell_values()),
        "int8 products of {}: cells not in the order they read",
        w.source()
    );
    // AMX's tiles take 16 rows by two groups of the cells they take; fewer rows, and every
    // other tile, run VNNI's.
    #[cfg(target_arch = "x86_64")]
    let tiles = kernel == Kernel::Amx && super::kcells_amx::takes(w.cell_values());
    #[cfg(not(target_arch = "x86_64"))]
    let tiles = false;
    let kernel = usable(kernel.vector());
    let (g0, g1) = (j0 / GROUP, (j0 + cols).div_ceil(GROUP));
    let step = tile_rows(kernel);
    let mut out = [0f32; OUT_ROWS * 2 * GROUP];
    // AVX2's tiles of 4 rows: a pass of more decodes each group's cells once for all of them.
    #[cfg(target_arch = "x86_64")]
    let mut runs = Vec::new();
    // AMX's tiles: each pair of groups decoded once per pass, and longer passes where the
    // rows' integers still fit in L2.
    #[cfg(target_arch = "x86_64")]
    let mut pair = super::kcells_amx::DecodedPair::new();
    let pass = if tiles {
        (AMX_PASS_BYTES / a.k).clamp(ROWS_PER_PASS, 4 * ROWS_PER_PASS) / OUT_ROWS * OUT_ROWS
    } else {
        ROWS_PER_PASS
    };
    for p0 in (0..a.m).step_by(pass) {
        let p1 = (p0 + pass).min(a.m);
        let mut g = g0;
        while g < g1 {
            // VNNI takes two groups at once for two rows or more: its float steps per
            // sub-block then serve 16 columns (one row streams its weights, one stream at a
            // time, as the f32 decode kernels do).
            let groups = if pairs(kernel, w.cell_values()) && g + 1 < g1 && p1 - p0 > 1 {
                2
            } else {
                1
            };
            #[cfg(target_arch = "x86_64")]
            let decoded = kernel == Kernel::Avx2 && p1 - p0 > step;
            #[cfg(target_arch = "x86_64")]
            if decoded {
                // SAFETY: `Kernel::Avx2` was found on this CPU; `g` is a group of `w`.
                unsafe { super::kcells_x86::decode_group(w, g, &mut runs) };
            }
            let lanes = groups * GROUP;
            let amx = tiles && groups == 2 && p1 - p0 >= OUT_ROWS;
            #[cfg(target_arch = "x86_64")]
            if amx {
                // SAFETY: `Kernel::Amx` was found on this CPU (AVX-512 F and BW with it);
                // `g + 1` is a group of `w`, whose cells the tiles take (`tiles`).
                unsafe { super::kcells_amx::decode_pair(w, g, &mut pair) };
            }
            let outer = if amx { OUT_ROWS } else { step };
            for r0 in (p0..p1).step_by(outer) {
                let rows = outer.min(p1 - r0);
                if amx && rows == OUT_ROWS {
                    // SAFETY: `Kernel::Amx` was found on this CPU (AMX granted, AVX-512 F
                    // beside it); rows `r0..r0 + 16` are `a`'s; `pair` was decoded above from
                    // two groups of `w`.
                    #[cfg(target_arch = "x86_64")]
                    unsafe {
                        super::kcells_amx::tile_pair(a, r0, w, &mut pair, &mut out)
                    };
                } else {
                    for t0 in (r0..r0 + rows).step_by(step) {
                        let (n, out) = (step.min(r0 + rows - t0), &mut out[(t0 - r0) * lanes..]);
                        match (kernel, groups) {
                            (Kernel::Portable, _) => portable(a, t0, n, w, g, out),
                            // SAFETY: as below; `runs` are group `g`'s, decoded above.
                            #[cfg(target_arch = "x86_64")]
                            (Kernel::Avx2, _) if decoded => unsafe {
                                super::kcells_x86::tile_decoded(a, t0, n, w, g, &runs, out)
                            },
                            // SAFETY: `Kernel::detect` (or `supported`) found AVX2, FMA and F16C
                            // for these kernels (and AVX-512 BW, VL and VNNI for `Vnni512`, the
                            // only one taking pairs); rows are `a`'s, at most `tile_rows`; `g`
                            // (and `g + 1` for a pair) are groups of `w`.
                            #[cfg(target_arch = "x86_64")]
                            (_, 2) => unsafe { super::kcells_x86::tile_pair(a, t0, n, w, g, out) },
                            #[cfg(target_arch = "x86_64")]
                            _ => unsafe { super::kcells_x86::tile(kernel, a, t0, n, w, g, out) },
                        }
                    }
                }
                let first = (g - g0) * GROUP;
                let width = lanes.min(cols - first);
                for r in 0..rows {
                    tile.row(r0 + r)[first..first + width]
                        .copy_from_slice(&out[r * lanes..r * lanes + width]);
                }
            }
            g += groups;
        }
    }
}

/// Whether `kernel` has a two-group tile for cells of `values` (Q3_K's have none).
fn pairs(kernel: Kernel, values: CellValues) -> bool {
    #[cfg(target_arch = "x86_64")]
    if kernel == Kernel::Vnni512 {
        return kcells::has_16_lanes(values);
    }
    let _ = (kernel, values);
    false
}

/// `kernel`, or the next one down where this CPU lacks what its K-quant version also needs
/// (F16C for both, AVX-512 VL for VNNI's 8-lane form).
fn usable(kernel: Kernel) -> Kernel {
    #[cfg(target_arch = "x86_64")]
    {
        // The widest set's features: a test may ask for a kernel above the one in use.
        let cpu = crate::cpu::widest();
        if !cpu.f16c {
            return Kernel::Portable;
        }
        if kernel == Kernel::Vnni512 && !cpu.avx512vl {
            return Kernel::Avx2;
        }
    }
    kernel
}

/// Rows per kernel call: 16 vector registers hold 4 rows' sums, 32 hold 8.
fn tile_rows(kernel: Kernel) -> usize {
    match kernel {
        #[cfg(target_arch = "x86_64")]
        Kernel::Avx2 => 4,
        _ => MAX_TILE_ROWS,
    }
}

/// The definition: rows `r0..r0 + rows` of `a` against group `g`'s 8 columns, into `out` (row
/// `r`'s lanes at `r * 8`), in the module's steps. Each sub-block's columns are decoded once
/// for all the rows.
pub(super) fn portable(
    a: &QuantizedRows,
    r0: usize,
    rows: usize,
    w: &PackedMatrix,
    g: usize,
    out: &mut [f32],
) {
    let values = w.cell_values();
    let (sub, signed) = (Layout::of(values).sub_rows, kcells::signed(values));
    let cell_bytes = values.cell_bytes(ROWS);
    let cells = w.group_cells(g);
    let blocks = a.k / BLOCK;
    let mut y = [[0f32; GROUP]; MAX_TILE_ROWS];
    for (c, cell) in cells.chunks_exact(cell_bytes).enumerate() {
        for s in 0..ROWS / sub {
            let mut q = [[0i32; BLOCK]; GROUP];
            let (mut scale, mut offset) = ([0f32; GROUP], [0f32; GROUP]);
            for (lane, q) in q.iter_mut().enumerate() {
                for (r, q) in q.iter_mut().take(sub).enumerate() {
                    let (v, sc, off) = parts(values, w.order(), cell, s * sub + r, lane);
                    (*q, scale[lane], offset[lane]) = (v, sc, off);
                }
            }
            let row0 = c * ROWS + s * sub;
            for (i, y) in y.iter_mut().enumerate().take(rows) {
                let row = r0 + i;
                let x = &a.q[row * a.k + row0..][..sub];
                let dx = a.scale[row * blocks + row0 / BLOCK];
                // SAFETY: `x`, the row's `sub` integers from `row0`, was just sliced from them.
                let sx = unsafe { a.sub_block_scaled_sum(row, row0, sub) };
                for lane in 0..GROUP {
                    let isum: i32 = q[lane].iter().zip(x).map(|(&q, &x)| q * x as i32).sum();
                    y[lane] = (isum as f32).mul_add(scale[lane] * dx, y[lane]);
                    if !signed {
                        y[lane] = offset[lane].mul_add(sx, y[lane]);
                    }
                }
            }
        }
    }
    for (r, y) in y.iter().enumerate().take(rows) {
        out[r * GROUP..(r + 1) * GROUP].copy_from_slice(y);
    }
}
