//! The tiled online-softmax routine behind dense attention and paged prefill rows, in the manner
//! of FlashAttention.
//!
//! A task takes one q head and a block of up to [`QUERY_BLOCK`] query rows, walks the visible keys
//! in tiles of [`KEY_BLOCK`] and keeps a running softmax, so scores live only in a small
//! L2-resident tile and keys no row sees are never touched. The two products per tile go to
//! `matrixmultiply::sgemm`, which reads K/V in place through strides.
//!
//! Tiles sit on a fixed grid of key slots (`0, 256, 512, ...`), whatever the rows of the task and
//! wherever the K/V lives, and keys a row does not see weigh exactly zero; so a row's result
//! depends only on its query, its keys and its visibility: not on the other rows of its task, nor
//! on how a prefill was cut into chunks, nor on which sequences share the batch.

use crate::fastmath::fast_exp;

/// Queries per task: 64 rows x 256 keys keeps the score tile at 64 KiB.
pub(crate) const QUERY_BLOCK: usize = 64;
/// Keys per tile.
pub(crate) const KEY_BLOCK: usize = 256;

/// A tile of keys and values: `rows` keys from `k`/`v`, each `d` values apart by `col` (element
/// stride) and `row` (key stride).
#[derive(Clone, Copy)]
pub(crate) struct KvTile {
    pub k: *const f32,
    pub k_row: isize,
    pub k_col: isize,
    pub v: *const f32,
    pub v_row: isize,
    pub v_col: isize,
}

/// Query rows of one head: row `r` starts at `ptr + r * row`, elements `col` apart.
#[derive(Clone, Copy)]
pub(crate) struct Rows {
    pub ptr: *const f32,
    pub row: isize,
    pub col: isize,
}

/// Which keys each row of a task sees: `0..=last[r]`, minus those `blocked(r, j)` says.
pub(crate) struct RowVisibility<'a> {
    pub last: &'a [usize],
    pub blocked: Option<&'a dyn Fn(usize, usize) -> bool>,
}

/// Attends `rows` query rows (`out.len() / d` of them) over the keys `tile_at(j0, width)` returns,
/// writing `out` (`[rows, d]`, contiguous).
///
/// # Safety
/// Every pointer that `q` and `tile_at` give must address `d` readable values per row or key for
/// the rows and keys asked for, and stay valid for the call.
pub(crate) unsafe fn attend_rows(
    q: Rows,
    vis: &RowVisibility,
    d: usize,
    scale: f32,
    tile_at: &mut dyn FnMut(usize, usize) -> KvTile,
    out: &mut [f32],
) {
    let rows = out.len() / d;
    let key_end = vis.last[..rows].iter().max().map_or(0, |m| m + 1);
    let mut running_max = vec![f32::NEG_INFINITY; rows];
    let mut running_sum = vec![0f32; rows];
    let mut scores = vec![0f32; rows * KEY_BLOCK];
    out.fill(0.0);
    for j0 in (0..key_end).step_by(KEY_BLOCK) {
        let width = KEY_BLOCK.min(key_end - j0);
        let t = tile_at(j0, width);
        let tile = &mut scores[..rows * width];
        // SAFETY: the caller guarantees rows x d queries and width x d keys behind the pointers;
        // the output tile is `rows x width`, row stride `width`.
        matrixmultiply::sgemm(
            rows,
            d,
            width,
            scale,
            q.ptr,
            q.row,
            q.col,
            t.k,
            t.k_col,
            t.k_row,
            0.0,
            tile.as_mut_ptr(),
            width as isize,
            1,
        );
        for r in 0..rows {
            let row = &mut tile[r * width..(r + 1) * width];
            // Visibility is a prefix of the tile; the blocked set can hide more.
            let visible = (vis.last[r] + 1).saturating_sub(j0).min(width);
            row[visible..].fill(f32::NEG_INFINITY);
            if let Some(blocked) = vis.blocked {
                for (j, s) in row[..visible].iter_mut().enumerate() {
                    if blocked(r, j0 + j) {
                        *s = f32::NEG_INFINITY;
                    }
                }
            }
            let block_max = row[..visible]
                .iter()
                .copied()
                .fold(f32::NEG_INFINITY, f32::max);
            if block_max == f32::NEG_INFINITY {
                row.fill(0.0); // nothing visible here: contributes exactly nothing
                continue;
            }
            let new_max = running_max[r].max(block_max);
            let mut sum = 0f32;
            for s in row.iter_mut() {
                // -inf (hidden) must give exactly 0, not the clamped e^-87.
                *s = if *s == f32::NEG_INFINITY {
                    0.0
                } else {
                    fast_exp(*s - new_max)
                };
                sum += *s;
            }
            let rescale = if running_max[r] == f32::NEG_INFINITY {
                0.0
            } else {
                fast_exp(running_max[r] - new_max)
            };
            running_sum[r] = running_sum[r] * rescale + sum;
            running_max[r] = new_max;
            if rescale != 1.0 {
                out[r * d..(r + 1) * d]
                    .iter_mut()
                    .for_each(|o| *o *= rescale);
            }
        }
        // SAFETY: as above; the output block is `rows x d`, contiguous.
        matrixmultiply::sgemm(
            rows,
            width,
            d,
            1.0,
            tile.as_ptr(),
            width as isize,
            1,
            t.v,
            t.v_row,
            t.v_col,
            1.0,
            out.as_mut_ptr(),
            d as isize,
            1,
        );
    }
    for r in 0..rows {
        let inv = 1.0 / running_sum[r];
        out[r * d..(r + 1) * d].iter_mut().for_each(|o| *o *= inv);
    }
}
