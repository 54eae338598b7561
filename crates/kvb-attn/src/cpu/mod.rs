//! CPU attention kernels for burn-ndarray (f32 compute; K/V pools in f32 or f16).
//!
//! The reference materialises every score (`[heads, n, t]`: 150 MB per layer at 2,048 tokens) and
//! runs burn's multi-pass softmax over it; measured on SmolLM2's shapes, that took 830 ms per layer
//! at 2,048 tokens. Here:
//! - [`tile`]: prefill rows (and dense attention) in tiles with an online softmax, products by
//!   `kvb_gemm::strided` on the task's thread, reading K/V in place through strides;
//! - [`decode`]: decode rows, block by block, each block read once for every row that shares it.
//!
//! Paged K/V is read in place wherever a tile's keys sit in consecutive pool slots (a sequence's
//! blocks are allocated in runs); a tile that spans scattered blocks is first gathered into a
//! scratch tile. Either way the arithmetic is the same. A pool layer may also hold f16 (as its bits,
//! [`layer`]): its keys and values are widened to f32 on the way in, exactly, and
//! the same arithmetic follows.

mod decode;
mod decode_math;
mod layer;
mod pool;
mod pool_view;
mod tile;
mod view;

use crate::backend::AttentionBackend;
use crate::mask::{Mask, Visibility};
use crate::paged::{check_paged, PagedBatch, PagedDims, PagedSeq};
use crate::reference::{self, check_dims, Dims};
use crate::{paged, AttnError};
use burn::tensor::{Bool, Tensor};
use burn_ndarray::NdArray;
use decode::{decode_attention, DecodeRow, Pool};
use layer::CpuLayer;
use pool_view::PoolView;
use rayon::prelude::*;
use tile::{attend_rows, KvTile, RowVisibility, Rows, KEY_BLOCK, QUERY_BLOCK};
use view::{primitive, tensor, View};

/// Dense attention: every task is (batch, q head, block of query rows).
fn dense((q, k, v): (View<4>, View<4>, View<4>), mask: &Mask, dims: &Dims, scale: f32) -> Vec<f32> {
    let Dims {
        batch,
        q_heads,
        kv_heads,
        n,
        head_dim: d,
        ..
    } = *dims;
    let group = q_heads / kv_heads;
    let mut out = vec![0f32; batch * q_heads * n * d];
    let tasks: Vec<(usize, usize, usize, &mut [f32])> = out
        .chunks_mut(n * d)
        .enumerate()
        .flat_map(|(bh, head)| {
            head.chunks_mut(QUERY_BLOCK * d)
                .enumerate()
                .map(move |(blk, rows)| (bh / q_heads, bh % q_heads, blk * QUERY_BLOCK, rows))
        })
        .collect();
    tasks.into_par_iter().for_each(|(b, h, i0, rows)| {
        let kh = h / group;
        let blocked = |r: usize, j: usize| !mask.visible(i0 + r, j);
        let vis = RowVisibility {
            last: &mask.last[i0..],
            blocked: mask
                .blocked
                .as_ref()
                .map(|_| &blocked as &dyn Fn(usize, usize) -> bool),
        };
        let query = Rows {
            ptr: q.at([b, h, i0, 0]),
            row: q.strides[2],
            col: q.strides[3],
        };
        let mut tile_at = |j0: usize, _w: usize| KvTile {
            k: k.at([b, kh, j0, 0]),
            k_row: k.strides[2],
            k_col: k.strides[3],
            v: v.at([b, kh, j0, 0]),
            v_row: v.strides[2],
            v_col: v.strides[3],
        };
        // SAFETY: rows i0.. of head h and keys 0..t of kv head kh lie inside q, k, v, which the
        // caller keeps alive; the mask bounds every key index by t.
        unsafe { attend_rows(query, &vis, d, scale, &mut tile_at, rows) };
    });
    out
}

/// Keys `j0..j0 + w` of kv head `kh` of a paged sequence: in place when the pool holds f32 and
/// their pool slots are consecutive, else gathered (and widened from f16) into `scratch`
/// (`[2, KEY_BLOCK, d]`).
fn paged_tile(
    (k, v): (PoolView, PoolView),
    seq: &PagedSeq,
    bs: usize,
    (kh, d): (usize, usize),
    (j0, w): (usize, usize),
    scratch: &mut [f32],
) -> KvTile {
    let first = seq.pool_slot(j0, bs);
    let contiguous = (j0 / bs..(j0 + w - 1) / bs).all(|b| seq.blocks[b + 1] == seq.blocks[b] + 1);
    if let (true, Some(k), Some(v)) = (contiguous, k.as_f32(), v.as_f32()) {
        return KvTile {
            k: k.at([kh, first, 0]),
            k_row: k.strides[1],
            k_col: 1,
            v: v.at([kh, first, 0]),
            v_row: v.strides[1],
            v_col: 1,
        };
    }
    let (ks, vs) = scratch.split_at_mut(KEY_BLOCK * d);
    let mut j = 0;
    while j < w {
        // The rest of this key's block, within the tile: consecutive pool slots.
        let slot = seq.pool_slot(j0 + j, bs);
        let run = (bs - (j0 + j) % bs).min(w - j);
        let (kd, vd) = (&mut ks[j * d..(j + run) * d], &mut vs[j * d..(j + run) * d]);
        // SAFETY: the run lies in one block of the pool (checked by `check_paged`); d contiguous
        // values per slot, slots d apart (checked by the caller).
        unsafe {
            k.read_into((kh, slot, run), d, kd);
            v.read_into((kh, slot, run), d, vd);
        }
        j += run;
    }
    KvTile {
        k: ks.as_ptr(),
        k_row: d as isize,
        k_col: 1,
        v: vs.as_ptr(),
        v_row: d as isize,
        v_col: 1,
    }
}

/// Paged prefill rows: every task is (sequence, kv head, block of query positions), and takes
/// the rows of all the kv head's query heads at those positions, so that each tile of keys and
/// values is gathered (and widened from f16, and packed) once for the group rather than once per
/// query head: a question after a long cached document has few rows, and there the tiles'
/// preparation was most of attention's time (bench/results/2026-12-06-peers-avx2-on-emr).
/// A row's result does not depend on the other rows of its task ([`tile`]). Writes `[rows,
/// q_heads, d]` into `out`.
fn paged_prefill(
    q: View<4>,
    (k, v): (PoolView, PoolView),
    batch: &PagedBatch,
    dims: &PagedDims,
    scale: f32,
    out: &mut [f32],
) {
    let PagedDims {
        q_heads,
        kv_heads,
        head_dim: d,
        ..
    } = *dims;
    let group = q_heads / kv_heads;
    let bs = batch.block_size;
    let prefills: Vec<&PagedSeq> = batch.seqs.iter().filter(|s| !s.decode).collect();
    // Positions per task: a task's rows (positions x group) stay near QUERY_BLOCK, and a few
    // rows over few kv heads are still cut to fill the threads evenly, as decode's rows are,
    // but two tasks a thread, not four: each task prepares its tiles anew (measured in
    // bench/results/2026-12-06-attn-group-rows).
    let base = kv_heads * prefills.len();
    let threads = rayon::current_num_threads();
    let tasks: Vec<(&PagedSeq, usize, usize, usize)> = prefills
        .into_iter()
        .flat_map(|s| {
            let cuts = decode::row_groups(base, threads, s.rows.len(), 2);
            let step = (QUERY_BLOCK / group)
                .min(s.rows.len().div_ceil(cuts))
                .max(1);
            (0..kv_heads).flat_map(move |kh| {
                (s.rows.start..s.rows.end)
                    .step_by(step)
                    .map(move |i0| (s, kh, i0, step))
            })
        })
        .collect();
    let blocks: Vec<(usize, usize, usize, Vec<f32>)> = tasks
        .into_par_iter()
        .map(|(s, kh, i0, step)| {
            let n = step.min(s.rows.end - i0);
            // Row g * n + r: query head kh * group + g at position i0 + r.
            let mut queries = vec![0f32; group * n * d];
            for (i, row) in queries.chunks_exact_mut(d).enumerate() {
                let (h, r) = (kh * group + i / n, i % n);
                for (e, x) in row.iter_mut().enumerate() {
                    // SAFETY: head h and row i0 + r lie in q, element e < d.
                    *x = unsafe { *q.at([0, h, i0 + r, e]) };
                }
            }
            let last: Vec<usize> = (0..group)
                .flat_map(|_| &s.last_slot[i0 - s.rows.start..][..n])
                .copied()
                .collect();
            let mut block = vec![0f32; group * n * d];
            let mut scratch = vec![0f32; 2 * KEY_BLOCK * d];
            let vis = RowVisibility {
                last: &last,
                blocked: None,
            };
            let query = Rows {
                ptr: queries.as_ptr(),
                row: d as isize,
                col: 1,
            };
            let mut tile_at =
                |j0: usize, w: usize| paged_tile((k, v), s, bs, (kh, d), (j0, w), &mut scratch);
            // SAFETY: the queries are `group * n` rows of d contiguous values; every key slot is
            // mapped through the block table, whose blocks lie in the pool (checked); the pool
            // outlives the call.
            unsafe { attend_rows(query, &vis, d, scale, &mut tile_at, &mut block) };
            (kh, i0, n, block)
        })
        .collect();
    for (kh, i0, n, block) in blocks {
        for (i, row) in block.chunks_exact(d).enumerate() {
            let (h, r) = (kh * group + i / n, i % n);
            let at = ((i0 + r) * q_heads + h) * d;
            out[at..at + d].copy_from_slice(row);
        }
    }
}

/// burn's reference ops, for a pool or queries the kernels cannot read in place. They cannot read
/// an f16 pool (f16 bits in a `u16` array) at all: that is an error, not a wrong answer.
fn fallback(
    q: Tensor<NdArray<f32>, 4>,
    (k_pool, v_pool): (&Tensor<NdArray<f32>, 3>, &Tensor<NdArray<f32>, 3>),
    batch: &PagedBatch,
    scale: f32,
) -> Result<Tensor<NdArray<f32>, 2>, AttnError> {
    if CpuLayer::is_f16(k_pool) || CpuLayer::is_f16(v_pool) {
        return Err(AttnError::Shape(
            "an f16 K/V pool must be contiguous ([kv_heads, slots, head_dim])".into(),
        ));
    }
    paged::paged_attention(q, k_pool, v_pool, batch, scale)
}

impl AttentionBackend for NdArray<f32> {
    fn attention(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        v: Tensor<Self, 4>,
        visibility: &Visibility,
        extra_mask: Option<&Tensor<Self, 2, Bool>>,
        scale: f32,
    ) -> Result<Tensor<Self, 4>, AttnError> {
        let dims = check_dims(q.dims(), k.dims(), v.dims())?;
        let mask = Mask::new::<Self>(visibility, extra_mask, dims.n, dims.t)?;
        if dims.n == 0 || dims.head_dim == 0 {
            return Ok(q);
        }
        let (Some(qp), Some(kp), Some(vp)) = (primitive(&q), primitive(&k), primitive(&v)) else {
            return reference::attention(q, k, v, visibility, extra_mask, scale);
        };
        let (Some(qv), Some(kv), Some(vv)) = (View::of(&qp), View::of(&kp), View::of(&vp)) else {
            return reference::attention(q, k, v, visibility, extra_mask, scale);
        };
        let out = dense((qv, kv, vv), &mask, &dims, scale);
        // The views above borrowed from these primitives; they are dropped only now.
        drop((qp, kp, vp));
        Ok(tensor(
            out,
            [dims.batch, dims.q_heads, dims.n, dims.head_dim],
        ))
    }

    fn paged_attention(
        q: Tensor<Self, 4>,
        k_pool: &Tensor<Self, 3>,
        v_pool: &Tensor<Self, 3>,
        batch: &PagedBatch,
        scale: f32,
    ) -> Result<Tensor<Self, 2>, AttnError> {
        let dims = check_paged(q.dims(), k_pool.dims(), v_pool.dims(), batch)?;
        let d = dims.head_dim;
        let (Some(qp), Some(kl), Some(vl)) =
            (primitive(&q), CpuLayer::of(k_pool), CpuLayer::of(v_pool))
        else {
            return paged::paged_attention(q, k_pool, v_pool, batch, scale);
        };
        let views = (View::<4>::of(&qp), kl.view(), vl.view());
        // The kernels read head_dim contiguously, and a pool's slots one after another.
        let (Some(qv), Some(kv), Some(vv)) = views else {
            return fallback(q, (k_pool, v_pool), batch, scale);
        };
        let packed = |p: &PoolView| p.strides()[1..] == [d as isize, 1];
        if qv.strides[3] != 1 || !packed(&kv) || !packed(&vv) {
            return fallback(q, (k_pool, v_pool), batch, scale);
        }
        crate::host_work::launched(1);
        let mut out = vec![0f32; dims.rows * dims.q_heads * d];
        paged_prefill(qv, (kv, vv), batch, &dims, scale, &mut out);
        let decode_rows: Vec<DecodeRow> = batch
            .seqs
            .iter()
            .filter(|s| s.decode)
            .flat_map(|s| {
                s.rows
                    .clone()
                    .zip(s.last_slot)
                    .map(move |(row, &last)| DecodeRow {
                        row,
                        blocks: s.blocks,
                        last,
                    })
            })
            .collect();
        let pool = Pool {
            k: kv,
            v: vv,
            block_size: batch.block_size,
        };
        decode_attention(
            qv,
            &pool,
            &decode_rows,
            (dims.q_heads, dims.kv_heads, d),
            scale,
            &mut out,
        );
        // The views above borrowed from these; they are dropped only now.
        drop((qp, kl, vl));
        Ok(tensor(out, [dims.rows, dims.q_heads * d]))
    }
}
