//! The paged flash-attention kernel (CubeCL: one source for wgpu, CUDA and every runtime burn has).
//!
//! One cube per (work item, kv head). A work item is up to a few rows of one sequence
//! ([`super::plan`]); its units are every (q head of the group, row) pair, so a K/V tile staged
//! in shared memory serves all of them, and grouped-query attention never repeats K/V. Each unit
//! keeps its query, its running max and sum, and its output row in registers, and folds in one
//! tile of keys at a time (FlashAttention-2's online softmax): scores are never written out.
//! K/V is read in place through the sequence's block table; the visibility of a row is "slots
//! up to `last_slot`", which covers a causal prefill, a suffix after cached K/V, a decode step
//! and CacheBlend's scattered rows alike.
//!
//! When the items are too few cubes to fill the GPU (a decode step over a long cache), the keys
//! are also split across cubes (flash-decoding): cube `z` reads one split and writes its
//! unnormalised output with its running max and sum, and [`merge_splits_kernel`] combines them.
//!
//! Tensors may be half precision (`F`: f16 or bf16 weights and activations); the arithmetic is
//! not. Scores, the running max and sum and the output accumulate in `A` (f32 at every launch),
//! and the split partials are stored in it: an f16 sum of a few hundred weighted values loses
//! digits, and f16 cannot hold the masked score's sentinel.

use super::plan::ITEM_FIELDS;
use cubecl::prelude::*;

/// A score below any real one. WGSL has no infinity literal.
const NEG_BIG: f32 = -1.0e30;

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn paged_attention_kernel<F: Float, I: Numeric, A: Float, P: Float>(
    q: &Tensor<F>,         // [1, q_heads, rows, head_dim]
    k_pool: &Tensor<F>,    // [kv_heads, slots, head_dim]
    v_pool: &Tensor<F>,    // [kv_heads, slots, head_dim]
    tables: &Tensor<I>,    // every sequence's block table, concatenated
    last_slot: &Tensor<I>, // [rows]
    items: &Tensor<I>,     // [items * ITEM_FIELDS]
    // Unsplit: [rows, q_heads * head_dim] (P is F). Split: the partials, [rows, q_heads,
    // splits, head_dim + 2] contiguous (output, then running max and sum; P is A).
    out: &mut Tensor<P>,
    scale: InputScalar,
    group: u32,
    rows_per_item: u32,
    block_size: u32,
    split_len: u32,
    #[comptime] head_dim: usize,
    #[comptime] tile: usize,
    #[comptime] split: bool,
    #[define(F, I, A, P)] _dtypes: [StorageType; 4],
) {
    let item = CUBE_POS_X as usize * ITEM_FIELDS;
    let kv_head = CUBE_POS_Y as usize;
    let split_pos = CUBE_POS_Z as usize;
    let splits = CUBE_COUNT_Z as usize;
    let units = CUBE_DIM_X as usize;
    let unit = UNIT_POS_X as usize;
    let group = group as usize;
    let block_size = block_size as usize;
    let rows_per_item = rows_per_item as usize;

    let first_row = u32::cast_from(items[item]) as usize;
    let n_rows = u32::cast_from(items[item + 1]) as usize;
    let table = u32::cast_from(items[item + 2]) as usize;
    let keys = u32::cast_from(items[item + 3]) as usize;
    // This cube's keys: its split of the item's.
    let begin = split_pos * split_len as usize;
    let end = (begin + split_len as usize).min(keys);

    // Unit -> (q head of the group, row). A cube may have more units than (head, row) pairs:
    // the extra ones only help stage tiles (a decode item has just `group` pairs). Idle units
    // still reach every barrier (a unit that leaves early would hang the others on some runtimes).
    let q_head = kv_head * group + unit / rows_per_item;
    let r = unit % rows_per_item;
    let active = r < n_rows && unit < group * rows_per_item;
    let row = first_row + r;
    let mut last = 0usize;
    if active {
        last = u32::cast_from(last_slot[row]) as usize;
    }

    let scale = scale.get::<A>();
    let mut q_row = Array::<A>::new(head_dim);
    let mut acc = Array::<A>::new(head_dim);
    let mut scores = Array::<A>::new(tile);
    for e in 0..head_dim {
        let mut x = A::new(0.0);
        if active {
            x = A::cast_from(q[q_head * q.stride(1) + row * q.stride(2) + e * q.stride(3)]) * scale;
        }
        q_row[e] = x;
        acc[e] = A::new(0.0);
    }
    let mut running_max = A::new(NEG_BIG);
    let mut running_sum = A::new(0.0);

    let mut k_tile = SharedMemory::<F>::new(tile * head_dim);
    let mut v_tile = SharedMemory::<F>::new(tile * head_dim);
    let tile_elems = tile * head_dim;

    let mut start = begin;
    while start < end {
        // Stage keys [start, start + tile) of the item's sequence, read through its block table.
        let mut i = unit;
        while i < tile_elems {
            let slot = start + i / head_dim;
            let e = i % head_dim;
            let mut k = F::new(0.0);
            let mut v = F::new(0.0);
            if slot < end {
                let block = u32::cast_from(tables[table + slot / block_size]) as usize;
                let pool_slot = block * block_size + slot % block_size;
                k = k_pool[kv_head * k_pool.stride(0)
                    + pool_slot * k_pool.stride(1)
                    + e * k_pool.stride(2)];
                v = v_pool[kv_head * v_pool.stride(0)
                    + pool_slot * v_pool.stride(1)
                    + e * v_pool.stride(2)];
            }
            k_tile[i] = k;
            v_tile[i] = v;
            i += units;
        }
        sync_cube();

        if active && start <= last {
            // Scores of the tile, then one rescale of the running sums for the whole tile.
            let mut tile_max = running_max;
            for j in 0..tile {
                let mut s = A::new(NEG_BIG);
                if start + j <= last && start + j < end {
                    let mut dot = A::new(0.0);
                    for e in 0..head_dim {
                        dot += q_row[e] * A::cast_from(k_tile[j * head_dim + e]);
                    }
                    s = dot;
                }
                scores[j] = s;
                tile_max = A::max(tile_max, s);
            }
            let correction = (running_max - tile_max).exp();
            running_sum *= correction;
            for e in 0..head_dim {
                acc[e] *= correction;
            }
            for j in 0..tile {
                if start + j <= last && start + j < end {
                    let p = (scores[j] - tile_max).exp();
                    running_sum += p;
                    for e in 0..head_dim {
                        acc[e] += p * A::cast_from(v_tile[j * head_dim + e]);
                    }
                }
            }
            running_max = tile_max;
        }
        sync_cube();
        start += tile;
    }

    if active {
        if split {
            let q_heads = CUBE_COUNT_Y as usize * group;
            let base = ((row * q_heads + q_head) * splits + split_pos) * (head_dim + 2);
            for e in 0..head_dim {
                out[base + e] = P::cast_from(acc[e]);
            }
            out[base + head_dim] = P::cast_from(running_max);
            out[base + head_dim + 1] = P::cast_from(running_sum);
        } else {
            let base = row * out.stride(0) + q_head * head_dim;
            for e in 0..head_dim {
                out[base + e] = P::cast_from(acc[e] / running_sum);
            }
        }
    }
}

/// Combines the key splits of [`paged_attention_kernel`]: one cube per (row, q head), one unit
/// per output element. Each unit rescales every split's partial output by `exp(max_s - max)`
/// and divides by the rescaled total of the sums. A split that saw no key of its row has the
/// sentinel max, so its weight is zero.
#[cube(launch)]
pub(crate) fn merge_splits_kernel<F: Float, A: Float>(
    partials: &Tensor<A>, // [rows, q_heads, splits, head_dim + 2]
    out: &mut Tensor<F>,  // [rows, q_heads * head_dim], contiguous
    splits: u32,
    #[comptime] head_dim: usize,
    #[define(F, A)] _dtypes: [StorageType; 2],
) {
    let row = CUBE_POS_X as usize;
    let q_head = CUBE_POS_Y as usize;
    let q_heads = CUBE_COUNT_Y as usize;
    let e = UNIT_POS_X as usize;
    let splits = splits as usize;
    let width = head_dim + 2;
    let base = (row * q_heads + q_head) * splits * width;

    let mut max = A::new(NEG_BIG);
    for s in 0..splits {
        max = A::max(max, partials[base + s * width + head_dim]);
    }
    let mut sum = A::new(0.0);
    let mut acc = A::new(0.0);
    for s in 0..splits {
        let at = base + s * width;
        let weight = (partials[at + head_dim] - max).exp();
        sum += weight * partials[at + head_dim + 1];
        acc += weight * partials[at + e];
    }
    out[row * out.stride(0) + q_head * head_dim + e] = F::cast_from(acc / sum);
}
