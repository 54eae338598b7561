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

use super::plan::ITEM_FIELDS;
use cubecl::prelude::*;

/// A score below any real one. WGSL has no infinity literal.
const NEG_BIG: f32 = -1.0e30;

#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn paged_attention_kernel<F: Float, I: Numeric>(
    q: &Tensor<F>,         // [1, q_heads, rows, head_dim]
    k_pool: &Tensor<F>,    // [kv_heads, slots, head_dim]
    v_pool: &Tensor<F>,    // [kv_heads, slots, head_dim]
    tables: &Tensor<I>,    // every sequence's block table, concatenated
    last_slot: &Tensor<I>, // [rows]
    items: &Tensor<I>,     // [items * ITEM_FIELDS]
    out: &mut Tensor<F>,   // [rows, q_heads * head_dim], contiguous
    scale: InputScalar,
    group: u32,
    block_size: u32,
    #[comptime] head_dim: usize,
    #[comptime] tile: usize,
    #[define(F, I)] _dtypes: [StorageType; 2],
) {
    let item = CUBE_POS_X as usize * ITEM_FIELDS;
    let kv_head = CUBE_POS_Y as usize;
    let units = CUBE_DIM_X as usize;
    let unit = UNIT_POS_X as usize;
    let group = group as usize;
    let block_size = block_size as usize;
    let rows_per_item = units / group;

    let first_row = u32::cast_from(items[item]) as usize;
    let n_rows = u32::cast_from(items[item + 1]) as usize;
    let table = u32::cast_from(items[item + 2]) as usize;
    let keys = u32::cast_from(items[item + 3]) as usize;

    // Unit -> (q head of the group, row). Units past the item's rows idle but still reach every
    // barrier (a unit that leaves early would hang the others on some runtimes).
    let q_head = kv_head * group + unit / rows_per_item;
    let r = unit % rows_per_item;
    let active = r < n_rows;
    let row = first_row + r;
    let mut last = 0usize;
    if active {
        last = u32::cast_from(last_slot[row]) as usize;
    }

    let scale = scale.get::<F>();
    let mut q_row = Array::<F>::new(head_dim);
    let mut acc = Array::<F>::new(head_dim);
    let mut scores = Array::<F>::new(tile);
    for e in 0..head_dim {
        let mut x = F::new(0.0);
        if active {
            x = q[q_head * q.stride(1) + row * q.stride(2) + e * q.stride(3)] * scale;
        }
        q_row[e] = x;
        acc[e] = F::new(0.0);
    }
    let mut running_max = F::new(NEG_BIG);
    let mut running_sum = F::new(0.0);

    let mut k_tile = SharedMemory::<F>::new(tile * head_dim);
    let mut v_tile = SharedMemory::<F>::new(tile * head_dim);
    let tile_elems = tile * head_dim;

    let mut start = 0usize;
    while start < keys {
        // Stage keys [start, start + tile) of the item's sequence, read through its block table.
        let mut i = unit;
        while i < tile_elems {
            let slot = start + i / head_dim;
            let e = i % head_dim;
            let mut k = F::new(0.0);
            let mut v = F::new(0.0);
            if slot < keys {
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
                let mut s = F::new(NEG_BIG);
                if start + j <= last {
                    let mut dot = F::new(0.0);
                    for e in 0..head_dim {
                        dot += q_row[e] * k_tile[j * head_dim + e];
                    }
                    s = dot;
                }
                scores[j] = s;
                tile_max = F::max(tile_max, s);
            }
            let correction = (running_max - tile_max).exp();
            running_sum *= correction;
            for e in 0..head_dim {
                acc[e] *= correction;
            }
            for j in 0..tile {
                if start + j <= last {
                    let p = (scores[j] - tile_max).exp();
                    running_sum += p;
                    for e in 0..head_dim {
                        acc[e] += p * v_tile[j * head_dim + e];
                    }
                }
            }
            running_max = tile_max;
        }
        sync_cube();
        start += tile;
    }

    if active {
        let base = row * out.stride(0) + q_head * head_dim;
        for e in 0..head_dim {
            out[base + e] = acc[e] / running_sum;
        }
    }
}
