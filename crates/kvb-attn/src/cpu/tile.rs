//! The tiled online-softmax routine behind dense attention and paged prefill rows, in the manner
//! of FlashAttention.
//!
//! A task takes about [`QUERY_BLOCK`] query rows that share their keys (one q head's rows, or
//! the rows of a kv head's q heads at a few positions), walks the visible keys in tiles of
//! [`KEY_BLOCK`] and keeps a running softmax, so scores live only in a small L2-resident tile
//! and keys no row sees are never touched. The two products per tile go to
//! `kvb_gemm::strided`, which reads K/V in place through strides on the task's own thread.
//!
//! Tiles sit on a fixed grid of key slots (`0, 256, 512, ...`), whatever the rows of the task and
//! wherever the K/V lives, and keys a row does not see weigh exactly zero; so a row's result
//! depends only on its query, its keys and its visibility: not on the other rows of its task, nor
//! on how a prefill was cut into chunks, nor on which sequences share the batch.

use crate::fastmath::fast_exp;
use kvb_gemm::strided::{product, Output, Strided};

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
        product(
            (rows, d, width),
            scale,
            Strided {
                ptr: q.ptr,
                row: q.row,
                col: q.col,
            },
            Strided {
                ptr: t.k,
                row: t.k_col,
                col: t.k_row,
            },
            Output::Overwrite,
            tile,
            width,
        );
        for r in 0..rows {
            let row = &mut tile[r * width..(r + 1) * width];
            // Visibility is a prefix of the tile; the blocked set can hide more.
            let visible = (vis.last[r] + 1).saturating_sub(j0).min(width);
            if let Some(blocked) = vis.blocked {
                for (j, s) in row[..visible].iter_mut().enumerate() {
                    if blocked(r, j0 + j) {
                        *s = f32::NEG_INFINITY;
                    }
                }
            }
            match online_softmax_step(row, visible, &mut running_max[r], &mut running_sum[r]) {
                None => row.fill(0.0), // nothing visible here: contributes exactly nothing
                Some(rescale) if rescale != 1.0 => out[r * d..(r + 1) * d]
                    .iter_mut()
                    .for_each(|o| *o *= rescale),
                Some(_) => {}
            }
        }
        // SAFETY: as above; the output block is `rows x d`, contiguous.
        product(
            (rows, width, d),
            1.0,
            Strided {
                ptr: tile.as_ptr(),
                row: width as isize,
                col: 1,
            },
            Strided {
                ptr: t.v,
                row: t.v_row,
                col: t.v_col,
            },
            Output::Accumulate,
            out,
            d,
        );
    }
    for r in 0..rows {
        let inv = 1.0 / running_sum[r];
        out[r * d..(r + 1) * d].iter_mut().for_each(|o| *o *= inv);
    }
}

/// One tile's step of the online softmax for one row: the row's scores become weights
/// `e^(s - max)` over the running maximum (hidden keys, at `-inf` or past `visible`, weigh exactly
/// 0), their sum joins `running_sum`, and the factor by which earlier tiles' output must shrink is
/// returned (`None` when the tile shows the row nothing).
///
/// The passes are written to vectorise: the maximum is exact in any order, and the sum runs in
/// eight lanes combined as `((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7))`, the same for a row whatever
/// else shares its task. With AVX2 (detected once, by kvb-gemm) the same loops run on 8-lane
/// vectors, with AVX-512 the exponentials on 16 (the sum keeps its eight lanes); Rust never fuses
/// a multiply and an add on its own, so all compile to the same bits.
fn online_softmax_step(
    row: &mut [f32],
    visible: usize,
    running_max: &mut f32,
    running_sum: &mut f32,
) -> Option<f32> {
    #[cfg(target_arch = "x86_64")]
    if kvb_gemm::isa() == kvb_gemm::Isa::Avx512 {
        // SAFETY: the CPU has AVX-512F (kvb-gemm checked).
        return unsafe { softmax_step_avx512(row, visible, running_max, running_sum) };
    }
    #[cfg(target_arch = "x86_64")]
    if kvb_gemm::has_fma() {
        // SAFETY: the CPU has AVX2 (checked, with FMA, which this step does not use).
        return unsafe { softmax_step_avx2(row, visible, running_max, running_sum) };
    }
    softmax_step(row, visible, running_max, running_sum)
}

/// [`softmax_step`] compiled for AVX2.
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn softmax_step_avx2(
    row: &mut [f32],
    visible: usize,
    running_max: &mut f32,
    running_sum: &mut f32,
) -> Option<f32> {
    softmax_step(row, visible, running_max, running_sum)
}

/// [`softmax_step`] compiled for AVX-512F.
///
/// # Safety
/// The CPU must have AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn softmax_step_avx512(
    row: &mut [f32],
    visible: usize,
    running_max: &mut f32,
    running_sum: &mut f32,
) -> Option<f32> {
    softmax_step(row, visible, running_max, running_sum)
}

#[inline(always)]
fn softmax_step(
    row: &mut [f32],
    visible: usize,
    running_max: &mut f32,
    running_sum: &mut f32,
) -> Option<f32> {
    const LANES: usize = 8;
    let (seen, hidden) = row.split_at_mut(visible);
    hidden.fill(0.0);
    let mut maxes = [f32::NEG_INFINITY; LANES];
    let mut chunks = seen.chunks_exact(LANES);
    for c in &mut chunks {
        for (m, &s) in maxes.iter_mut().zip(c) {
            *m = if s > *m { s } else { *m };
        }
    }
    let block_max = chunks
        .remainder()
        .iter()
        .chain(&maxes)
        .fold(f32::NEG_INFINITY, |m, &s| if s > m { s } else { m });
    if block_max == f32::NEG_INFINITY {
        return None;
    }
    let new_max = running_max.max(block_max);
    for s in seen.iter_mut() {
        // -inf (hidden) must give exactly 0, not the clamped e^-87.
        let e = fast_exp(*s - new_max);
        *s = if *s == f32::NEG_INFINITY { 0.0 } else { e };
    }
    let mut lanes = [0f32; LANES];
    let mut chunks = seen.chunks_exact(LANES);
    for c in &mut chunks {
        for (l, &s) in lanes.iter_mut().zip(c) {
            *l += s;
        }
    }
    for (l, &s) in lanes.iter_mut().zip(chunks.remainder()) {
        *l += s;
    }
    let sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3]))
        + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
    let rescale = if *running_max == f32::NEG_INFINITY {
        0.0
    } else {
        fast_exp(*running_max - new_max)
    };
    *running_sum = *running_sum * rescale + sum;
    *running_max = new_max;
    Some(rescale)
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// One softmax step over a row, its running max and its running sum.
    type Step<'a> = dyn Fn(&mut [f32], &mut f32, &mut f32) -> Option<f32> + 'a;

    proptest! {
        /// Every compiled form of the softmax step (portable, AVX2, AVX-512 where the CPU has
        /// them) gives the same bits: exponentials, sum, running max and sum, rescale.
        #[test]
        fn each_softmax_step_gives_the_same_bits(
            row in prop::collection::vec(prop_oneof![9 => -40f32..40.0, 1 => Just(f32::NEG_INFINITY)], 1..150),
            hidden in 0usize..20,
            running_max in prop_oneof![Just(f32::NEG_INFINITY), -40f32..40.0],
            running_sum in 0f32..100.0,
        ) {
            let visible = row.len().saturating_sub(hidden).max(1);
            let run = |step: &Step<'_>| {
                let (mut r, mut m, mut s) = (row.clone(), running_max, running_sum);
                let rescale = step(&mut r, &mut m, &mut s);
                (r, m, s, rescale)
            };
            let bits = |(r, m, s, rescale): (Vec<f32>, f32, f32, Option<f32>)| {
                let mut v: Vec<u32> = r.iter().map(|x| x.to_bits()).collect();
                v.extend([m.to_bits(), s.to_bits(), rescale.map_or(1, f32::to_bits)]);
                v
            };
            let want = bits(run(&|r, m, s| softmax_step(r, visible, m, s)));
            if kvb_gemm::has_fma() {
                // SAFETY: the CPU has AVX2 (with FMA).
                let got = bits(run(&|r, m, s| unsafe { softmax_step_avx2(r, visible, m, s) }));
                prop_assert_eq!(&got, &want, "AVX2");
            }
            if kvb_gemm::Isa::supported().contains(&kvb_gemm::Isa::Avx512) {
                // SAFETY: the CPU has AVX-512F.
                let got = bits(run(&|r, m, s| unsafe { softmax_step_avx512(r, visible, m, s) }));
                prop_assert_eq!(&got, &want, "AVX-512");
            }
        }
    }
}
