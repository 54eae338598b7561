//! Paged attention for decode rows: one query per sequence over its whole cache.
//!
//! A decode step reads every K/V block of every running sequence for a single query row each;
//! the product is memory-bound, and sequences behind one system prompt read the same blocks. So
//! the work is organised by *block*, not by row: a task takes one kv head and a range of logical
//! blocks, and for each block loads it once and runs every row that reads it (all q heads of the
//! kv head's group, of every sequence whose table holds that block) while it sits in L1. Sixteen
//! chats behind one ~1,000-token prompt read that prompt's K/V once per step instead of sixteen
//! times.
//!
//! Keys are split into segments of a fixed number of blocks (flash-decoding), so a long cache
//! spreads over every core; each segment keeps its own running softmax per row, and the segments
//! are merged in order. A row's arithmetic depends only on its query, its blocks and the segment
//! grid, never on which other rows share the step (batch invariance).

use super::view::View;
use crate::fastmath::fast_exp;
use rayon::prelude::*;

/// Keys per segment: at ~3,000 tokens of context a sequence spreads over 6 segments per kv head.
const SEGMENT_KEYS: usize = 512;

/// One decode row: its index among the query rows, its block table and its last visible slot.
pub(crate) struct DecodeRow<'a> {
    pub row: usize,
    pub blocks: &'a [u32],
    pub last: usize,
}

/// The pool of one layer: `[kv_heads, slots, head_dim]`, head_dim contiguous.
pub(crate) struct Pool {
    pub k: View<3>,
    pub v: View<3>,
    pub block_size: usize,
}

/// Running softmax of one (row, q head) over one segment: `acc` holds `d` values.
struct State<'a> {
    max: &'a mut f32,
    sum: &'a mut f32,
    acc: &'a mut [f32],
}

/// `q . k` in 8 lanes, summed in a fixed order (so every caller gets the same bits).
#[inline(always)]
fn dot(q: &[f32], k: &[f32]) -> f32 {
    let mut lanes = [0f32; 8];
    let mut qc = q.chunks_exact(8);
    let mut kc = k.chunks_exact(8);
    for (a, b) in (&mut qc).zip(&mut kc) {
        for l in 0..8 {
            lanes[l] += a[l] * b[l];
        }
    }
    let mut s = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5]))
        + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
    for (a, b) in qc.remainder().iter().zip(kc.remainder()) {
        s += a * b;
    }
    s
}

/// Folds `visible` keys of one block into a row's running softmax.
#[inline(always)]
fn update(state: State, q: &[f32], keys: &[f32], values: &[f32], d: usize, scale: f32) {
    let visible = keys.len() / d;
    let mut scores = [0f32; 512];
    let scores = &mut scores[..visible];
    let mut block_max = f32::NEG_INFINITY;
    for (j, s) in scores.iter_mut().enumerate() {
        *s = dot(q, &keys[j * d..(j + 1) * d]) * scale;
        block_max = block_max.max(*s);
    }
    let new_max = state.max.max(block_max);
    let rescale = if *state.max == f32::NEG_INFINITY {
        0.0
    } else {
        fast_exp(*state.max - new_max)
    };
    if rescale != 1.0 {
        state.acc.iter_mut().for_each(|a| *a *= rescale);
    }
    let mut sum = 0f32;
    for (j, s) in scores.iter().enumerate() {
        let p = fast_exp(s - new_max);
        sum += p;
        for (a, &v) in state.acc.iter_mut().zip(&values[j * d..(j + 1) * d]) {
            *a += p * v;
        }
    }
    *state.sum = *state.sum * rescale + sum;
    *state.max = new_max;
}

/// One task: kv head `kh`, logical blocks `blocks` (one segment), every decode row. Returns the
/// segment's states, `[rows][group][d + 2]` (acc, then max and sum).
#[allow(clippy::too_many_arguments)]
#[inline(always)]
fn segment(
    q: View<4>,
    pool: &Pool,
    rows: &[DecodeRow],
    (kh, group, d): (usize, usize, usize),
    blocks: std::ops::Range<usize>,
    scale: f32,
) -> Vec<f32> {
    let bs = pool.block_size;
    let width = d + 2;
    let mut states = vec![0f32; rows.len() * group * width];
    for s in states.chunks_mut(width) {
        s[d] = f32::NEG_INFINITY;
    }
    // Rows that read logical block b, grouped by the physical block they read there.
    let mut readers: Vec<(u32, usize)> = Vec::with_capacity(rows.len());
    for b in blocks {
        readers.clear();
        readers.extend(
            rows.iter()
                .enumerate()
                .filter(|(_, r)| b * bs <= r.last)
                .map(|(i, r)| (r.blocks[b], i)),
        );
        readers.sort_unstable();
        let mut i = 0;
        while i < readers.len() {
            let physical = readers[i].0 as usize;
            // SAFETY: the block lies inside the pool (checked by `check_paged`), head_dim
            // contiguous: bs keys of d values from its first slot.
            let (keys, values) = unsafe {
                let at = [kh, physical * bs, 0];
                (
                    std::slice::from_raw_parts(pool.k.at(at), bs * d),
                    std::slice::from_raw_parts(pool.v.at(at), bs * d),
                )
            };
            while i < readers.len() && readers[i].0 as usize == physical {
                let r = readers[i].1;
                let visible = (rows[r].last - b * bs + 1).min(bs);
                for g in 0..group {
                    // SAFETY: q is [1, hq, n, d] with d contiguous; row and head are in range.
                    let qv = unsafe {
                        std::slice::from_raw_parts(q.at([0, kh * group + g, rows[r].row, 0]), d)
                    };
                    let s = &mut states[(r * group + g) * width..(r * group + g + 1) * width];
                    let (acc, rest) = s.split_at_mut(d);
                    let (max, sum) = rest.split_at_mut(1);
                    update(
                        State {
                            max: &mut max[0],
                            sum: &mut sum[0],
                            acc,
                        },
                        qv,
                        &keys[..visible * d],
                        &values[..visible * d],
                        d,
                        scale,
                    );
                }
                i += 1;
            }
        }
    }
    states
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
#[allow(clippy::too_many_arguments)]
unsafe fn segment_avx2(
    q: View<4>,
    pool: &Pool,
    rows: &[DecodeRow],
    shape: (usize, usize, usize),
    blocks: std::ops::Range<usize>,
    scale: f32,
) -> Vec<f32> {
    segment(q, pool, rows, shape, blocks, scale)
}

/// Runs the decode rows, writing each row's heads into `out` (`[rows, q_heads, d]`, row-major).
/// Needs `d` contiguous in `q` and the pool, and blocks of at most 512 slots; the caller checks.
pub(crate) fn decode_attention(
    q: View<4>,
    pool: &Pool,
    rows: &[DecodeRow],
    (q_heads, kv_heads, d): (usize, usize, usize),
    scale: f32,
    out: &mut [f32],
) {
    if rows.is_empty() {
        return;
    }
    let bs = pool.block_size;
    let group = q_heads / kv_heads;
    let max_blocks = rows.iter().map(|r| r.last / bs + 1).max().unwrap_or(0);
    let per_segment = (SEGMENT_KEYS / bs).max(1);
    let segments = max_blocks.div_ceil(per_segment);
    #[cfg(target_arch = "x86_64")]
    let avx2 =
        std::arch::is_x86_feature_detected!("avx2") && std::arch::is_x86_feature_detected!("fma");
    let tasks: Vec<(usize, usize)> = (0..kv_heads)
        .flat_map(|kh| (0..segments).map(move |s| (kh, s)))
        .collect();
    let results: Vec<Vec<f32>> = tasks
        .par_iter()
        .map(|&(kh, s)| {
            let blocks = s * per_segment..((s + 1) * per_segment).min(max_blocks);
            let shape = (kh, group, d);
            #[cfg(target_arch = "x86_64")]
            if avx2 {
                // SAFETY: the CPU has AVX2 and FMA (checked above).
                return unsafe { segment_avx2(q, pool, rows, shape, blocks, scale) };
            }
            segment(q, pool, rows, shape, blocks, scale)
        })
        .collect();
    // Merge the segments of each (row, head) in order.
    let width = d + 2;
    for (r, row) in rows.iter().enumerate() {
        for kh in 0..kv_heads {
            for g in 0..group {
                let h = kh * group + g;
                let at = (r * group + g) * width;
                let parts = || (0..segments).map(|s| &results[kh * segments + s][at..at + width]);
                let max = parts().fold(f32::NEG_INFINITY, |m, p| m.max(p[d]));
                let dst = &mut out[(row.row * q_heads + h) * d..(row.row * q_heads + h + 1) * d];
                dst.fill(0.0);
                let mut sum = 0f32;
                for p in parts().filter(|p| p[d + 1] > 0.0) {
                    let w = fast_exp(p[d] - max);
                    sum += p[d + 1] * w;
                    for (o, a) in dst.iter_mut().zip(&p[..d]) {
                        *o += a * w;
                    }
                }
                let inv = 1.0 / sum;
                dst.iter_mut().for_each(|o| *o *= inv);
            }
        }
    }
}
