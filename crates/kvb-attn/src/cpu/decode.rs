//! Paged attention for decode rows: one query per sequence over its whole cache.
//!
//! A decode step reads every K/V block of every running sequence for a single query row each;
//! the product is memory-bound, and sequences behind one system prompt read the same blocks. So
//! the work is organised by *block*, not by row: a task takes one kv head and a range of logical
//! keys, and loads each block once for every row that reads it (all q heads of the kv head's
//! group, of every sequence whose table holds that block) while it sits in L1. Sixteen chats
//! behind one ~1,000-token prompt read that prompt's K/V once per step instead of sixteen times.
//!
//! Keys are split into segments of a fixed number of blocks (flash-decoding), so a long cache
//! spreads over every core; each segment keeps its own running softmax per row, and the segments
//! are merged in order. Where kv heads times segments are too few tasks for the threads (a
//! short cache), the rows are also split into a few groups, each loading shared blocks for
//! itself. A row's arithmetic depends only on its query, its blocks and the segment grid, never
//! on which other rows share the step or its group (batch invariance).

use super::decode_math::{DecodeMath, Heads, Portable};
use super::pool_view::{PoolView, Run};
use super::view::View;
use crate::fastmath::fast_exp;
use rayon::prelude::*;

/// Keys per segment: at ~3,000 tokens of context a sequence spreads over 6 segments per kv head.
const SEGMENT_KEYS: usize = 512;
/// Keys per step of the running softmax: a fixed logical grid, whatever the block size.
const TILE: usize = 64;
/// How far ahead (in keys) the key pass asks for keys and values. Measured with `kvb generate`
/// after 2,706 tokens (SmolLM2, f16 pool, 2 cores, median of 5): 32 keys ahead took decode from
/// 136 to 149 tokens/s, 64 did as well, 96 or more gained nothing (the lines arrive too early and
/// crowd L1); short contexts are unchanged.
const PREFETCH_AHEAD: usize = 32;

/// Whether the key and value passes ask for blocks ahead ([`PREFETCH_AHEAD`]) for kv heads
/// read by `group` query heads each. With no grouping (SmolLM2-1.7B's 32 kv heads) each byte of
/// K/V serves one query: the step is a pure stream, and on Zen 4 (AMD family 0x19 with
/// AVX-512) the asks crowded its miss buffers: that decode after 2,022 tokens took 16% longer
/// and its attention 1.6x as long (bench/results/2026-12-05-decode-prefetch); there the hardware
/// prefetchers keep up alone. Grouped heads keep them (Llama-3.2-1B's decode there was 3%
/// faster with them, within the noise), as do other CPUs (on Zen 5 they were 10% faster).
fn prefetches(group: usize) -> bool {
    group > 1 || !kvb_gemm::cpu().zen4()
}

/// One decode row: its index among the query rows, its block table and its last visible slot.
pub(crate) struct DecodeRow<'a> {
    pub row: usize,
    pub blocks: &'a [u32],
    pub last: usize,
}

/// The pool of one layer: `[kv_heads, slots, head_dim]`, head_dim contiguous, slots `head_dim`
/// apart.
pub(crate) struct Pool {
    pub k: PoolView,
    pub v: PoolView,
    pub block_size: usize,
}

/// Calls `each(first key, keys, physical slot, readers)` for every run of keys of tile
/// `tile` (logical keys `tile * TILE..`) that sits in one physical block, with the rows that
/// read it (indices into `rows`) grouped by that block.
fn for_each_block(
    rows: &[DecodeRow],
    bs: usize,
    tile: usize,
    readers: &mut Vec<(u32, usize)>,
    mut each: impl FnMut(usize, usize, usize, &[(u32, usize)]),
) {
    let (t0, t1) = (tile * TILE, (tile + 1) * TILE);
    let mut key = t0;
    while key < t1 {
        let b = key / bs;
        let end = ((b + 1) * bs).min(t1);
        readers.clear();
        readers.extend(
            rows.iter()
                .enumerate()
                .filter(|(_, r)| key <= r.last)
                .map(|(i, r)| (r.blocks[b], i)),
        );
        readers.sort_unstable();
        for group in readers.chunk_by(|a, b| a.0 == b.0) {
            let physical = group[0].0 as usize * bs + key % bs;
            each(key, end - key, physical, group);
        }
        key = end;
    }
}

/// One task: kv head `kh`, logical tiles `tiles` (one segment), every decode row. Returns the
/// segment's states, `[rows][group][d + 2]` (acc, then max and sum).
///
/// Each tile is two passes over the blocks it covers, each block loaded once for all the rows
/// that read it: scores from the keys, then the running softmax is updated per row, then the
/// values are accumulated. The softmax advances tile by tile, so a row's arithmetic does not
/// depend on the block size.
#[inline(always)]
fn segment<M: DecodeMath>(
    q: View<4>,
    pool: &Pool,
    rows: &[DecodeRow],
    (kh, group, d): (usize, usize, usize),
    tiles: std::ops::Range<usize>,
    scale: f32,
) -> Vec<f32> {
    let (bs, prefetch) = (pool.block_size, prefetches(group));
    let width = d + 2;
    let mut states = vec![0f32; rows.len() * group * width];
    for s in states.chunks_mut(width) {
        s[d] = f32::NEG_INFINITY;
    }
    let mut scores = vec![0f32; rows.len() * group * TILE];
    let mut readers: Vec<(u32, usize)> = Vec::with_capacity(rows.len());
    // An f16 pool's keys or values of one block run, widened (at most a tile's worth) for a
    // version that does not read f16; an f32 pool is read in place and needs none.
    let mut widened = match pool.k {
        PoolView::F16(_) if !M::READS_F16 => vec![0f32; TILE.min(bs) * d],
        _ => Vec::new(),
    };
    // SAFETY (here and at both `run` calls below): `physical` and the `len` keys after it lie
    // in one block inside the pool (checked by `check_paged`), head_dim contiguous; q is
    // [1, hq, n, d] with d contiguous.
    let query = |row: usize, g: usize| unsafe {
        std::slice::from_raw_parts(q.at([0, kh * group + g, row, 0]), d)
    };
    for tile in tiles {
        let t0 = tile * TILE;
        for_each_block(
            rows,
            bs,
            tile,
            &mut readers,
            |key, len, physical, readers| {
                let keys = unsafe {
                    pool.k
                        .run((kh, physical, len), d, &mut widened, M::READS_F16)
                };
                // The value pass reads this block's values next.
                if prefetch {
                    pool.v.prefetch((kh, physical, len), d);
                }
                // And a block later, the keys and values `PREFETCH_AHEAD` further on: a long
                // cache comes from memory, and each block is a page the hardware prefetchers do
                // not run into.
                let (ahead, first) = (key + PREFETCH_AHEAD, &rows[readers[0].1]);
                if prefetch && ahead <= first.last {
                    let slot = first.blocks[ahead / bs] as usize * bs + ahead % bs;
                    let n = len.min(first.last + 1 - ahead);
                    pool.k.prefetch((kh, slot, n), d);
                    pool.v.prefetch((kh, slot, n), d);
                }
                for &(_, r) in readers {
                    let visible = (rows[r].last + 1 - key).min(len);
                    let heads = Heads {
                        ptr: query(rows[r].row, 0).as_ptr(),
                        stride: q.strides[1],
                        count: group,
                    };
                    let out = &mut scores[r * group * TILE + key - t0..];
                    match keys {
                        Run::F32(k) => M::scores_group(heads, k, d, scale, out, TILE, visible),
                        Run::F16(k) => M::scores_group_f16(heads, k, d, scale, out, TILE, visible),
                    }
                }
            },
        );
        for (r, row) in rows.iter().enumerate() {
            if row.last < t0 {
                continue;
            }
            let visible = (row.last + 1 - t0).min(TILE);
            for g in 0..group {
                let tile_scores = &mut scores[(r * group + g) * TILE..][..visible];
                let state = &mut states[(r * group + g) * width..][..width];
                let block_max = M::max(tile_scores);
                let new_max = state[d].max(block_max);
                let rescale = if state[d] == f32::NEG_INFINITY {
                    0.0
                } else {
                    fast_exp(state[d] - new_max)
                };
                if rescale != 1.0 {
                    state[..d].iter_mut().for_each(|a| *a *= rescale);
                }
                let sum = M::exp_sum(tile_scores, new_max);
                state[d + 1] = state[d + 1] * rescale + sum;
                state[d] = new_max;
            }
        }
        for_each_block(
            rows,
            bs,
            tile,
            &mut readers,
            |key, len, physical, readers| {
                let values = unsafe {
                    pool.v
                        .run((kh, physical, len), d, &mut widened, M::READS_F16)
                };
                // The key pass of the next tile reads these readers' next keys.
                let (next, first) = (key + TILE, &rows[readers[0].1]);
                if prefetch && next <= first.last {
                    let slot = first.blocks[next / bs] as usize * bs + next % bs;
                    pool.k
                        .prefetch((kh, slot, len.min(first.last + 1 - next)), d);
                }
                for &(_, r) in readers {
                    let visible = (rows[r].last + 1 - key).min(len);
                    let p = &scores[r * group * TILE + key - t0..];
                    let acc = &mut states[r * group * width..];
                    match values {
                        Run::F32(v) => {
                            M::accumulate_group(acc, width, p, TILE, group, v, d, visible)
                        }
                        Run::F16(v) => {
                            M::accumulate_group_f16(acc, width, p, TILE, group, v, d, visible)
                        }
                    }
                }
            },
        );
    }
    states
}

/// Groups to split the rows into, so that the tasks (kv heads x segments x row groups here;
/// kv heads x sequences x row groups in paged prefill) are at least `per_thread` per thread
/// (decode: four) and a multiple of the threads: a short cache gives one segment per kv head,
/// and 3 kv heads over 2 threads left one thread idle a third of the time. Each group
/// loads a shared block for itself, so the groups are no more than that needs. Which group a
/// row is in changes nothing in its arithmetic (only which rows share a block's load).
pub(super) fn row_groups(
    base_tasks: usize,
    threads: usize,
    rows: usize,
    per_thread: usize,
) -> usize {
    let (base, threads) = (base_tasks.max(1), threads.max(1));
    let mut groups = (per_thread * threads).div_ceil(base);
    while (base * groups) % threads != 0 {
        groups += 1;
    }
    groups.clamp(1, rows.max(1))
}

/// Runs the decode rows, writing each row's heads into `out` (`[rows, q_heads, d]`, row-major).
/// Needs `d` contiguous in `q` and the pool; the caller checks.
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
    debug_assert!(bs > 0);
    let max_tiles = rows.iter().map(|r| r.last / TILE + 1).max().unwrap_or(0);
    let per_segment = SEGMENT_KEYS / TILE;
    let segments = max_tiles.div_ceil(per_segment);
    // The vector versions read f16 with F16C, which every CPU with FMA has; checked anyway.
    #[cfg(target_arch = "x86_64")]
    let avx2 = d % 8 == 0 && kvb_gemm::has_fma() && kvb_gemm::cpu().f16c;
    #[cfg(target_arch = "x86_64")]
    let avx512 = avx2 && d % 16 == 0 && kvb_gemm::isa() == kvb_gemm::Isa::Avx512;
    let per_group = rows.len().div_ceil(row_groups(
        kv_heads * segments,
        rayon::current_num_threads(),
        rows.len(),
        4,
    ));
    let groups = rows.len().div_ceil(per_group);
    let tasks: Vec<(usize, usize, usize)> = (0..kv_heads)
        .flat_map(|kh| (0..segments).flat_map(move |s| (0..groups).map(move |g| (kh, s, g))))
        .collect();
    let results: Vec<Vec<f32>> = tasks
        .par_iter()
        .map(|&(kh, s, g)| {
            let tiles = s * per_segment..((s + 1) * per_segment).min(max_tiles);
            let rows = &rows[g * per_group..((g + 1) * per_group).min(rows.len())];
            let shape = (kh, group, d);
            #[cfg(target_arch = "x86_64")]
            if avx512 {
                return segment::<super::decode_math::Avx512>(q, pool, rows, shape, tiles, scale);
            }
            #[cfg(target_arch = "x86_64")]
            if avx2 {
                return segment::<super::decode_math::Avx2>(q, pool, rows, shape, tiles, scale);
            }
            segment::<Portable>(q, pool, rows, shape, tiles, scale)
        })
        .collect();
    // Merge the segments of each (row, head) in order.
    let width = d + 2;
    for (r, row) in rows.iter().enumerate() {
        let (rg, local) = (r / per_group, r % per_group);
        for kh in 0..kv_heads {
            for g in 0..group {
                let h = kh * group + g;
                let at = (local * group + g) * width;
                let task = |s: usize| (kh * segments + s) * groups + rg;
                let parts = || (0..segments).map(|s| &results[task(s)][at..at + width]);
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

#[cfg(test)]
mod tests {
    use super::row_groups;
    use proptest::prelude::*;

    proptest! {
        /// Between one group and one per row; unless capped by the rows, enough tasks for
        /// `per_thread` per thread (decode's four among them), in a multiple of the threads.
        #[test]
        fn row_groups_fill_the_threads_evenly(
            base in 1usize..40,
            threads in 1usize..33,
            rows in 1usize..65,
            per_thread in 1usize..6,
        ) {
            let g = row_groups(base, threads, rows, per_thread);
            prop_assert!((1..=rows).contains(&g));
            if g < rows {
                prop_assert_eq!(base * g % threads, 0);
                prop_assert!(base * g >= per_thread * threads);
            }
        }
    }
}
