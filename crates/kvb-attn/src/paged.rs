//! Attention over K/V held in a block pool: many sequences, one call.
//!
//! A pool holds the K/V of every sequence in fixed-size blocks of token slots, per layer
//! `[kv_heads, blocks * block_size, head_dim]`. A sequence is a *block table*: its logical slot `s`
//! lives at pool slot `blocks[s / block_size] * block_size + s % block_size`. Sequences that share
//! a prefix share its blocks (vLLM's PagedAttention, SGLang's RadixAttention), so one system
//! prompt's K/V sits in memory once however many requests read it.
//!
//! A [`PagedBatch`] is one forward pass's view: the query rows of several sequences, stacked, and
//! for each row the last logical slot it sees. Causal prefill, a chunk of a prefill after cached
//! K/V, one decode token, and the scattered rows CacheBlend recomputes are all the same thing here:
//! row `i` sees its sequence's slots `0..=last_slot[i]`.

use crate::reference::attention;
use crate::{AttnError, Visibility};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use std::ops::Range;

/// One sequence's part of a [`PagedBatch`].
#[derive(Debug, Clone)]
pub struct PagedSeq<'a> {
    /// Its block table: pool blocks in logical order.
    pub blocks: &'a [u32],
    /// Its query rows in the batch (rows of consecutive sequences follow each other).
    pub rows: Range<usize>,
    /// Per query row, the last logical slot it sees.
    pub last_slot: &'a [usize],
    /// The rows are decode steps (one new token of a sequence that finished its prefill). A kernel
    /// may run decode rows differently from prefill rows (the CPU one does: one pass over each K/V
    /// block for every row that reads it); a row's arithmetic depends only on which kind it is
    /// and on its own K/V, never on the other sequences in the batch.
    pub decode: bool,
}

/// The sequences of one attention call over a pool.
#[derive(Debug, Clone)]
pub struct PagedBatch<'a> {
    /// Token slots per block.
    pub block_size: usize,
    /// The sequences, in row order.
    pub seqs: &'a [PagedSeq<'a>],
}

impl PagedSeq<'_> {
    /// The pool slot of logical slot `s`.
    #[inline]
    pub fn pool_slot(&self, s: usize, block_size: usize) -> usize {
        self.blocks[s / block_size] as usize * block_size + s % block_size
    }

    /// Keys any of its rows sees: one more than its largest last slot.
    pub fn key_len(&self) -> usize {
        self.last_slot.iter().max().map_or(0, |&m| m + 1)
    }
}

/// The checked shape of a paged call.
pub(crate) struct PagedDims {
    pub q_heads: usize,
    pub kv_heads: usize,
    pub rows: usize,
    pub head_dim: usize,
}

/// Checks that `q` (`[1, q_heads, rows, head_dim]`), the pool (`[kv_heads, slots, head_dim]`) and
/// the batch fit together: rows are covered in order, every row sees at least one slot, and every
/// slot it sees lies in a block of the pool.
pub(crate) fn check_paged(
    q: [usize; 4],
    k_pool: [usize; 3],
    v_pool: [usize; 3],
    batch: &PagedBatch,
) -> Result<PagedDims, AttnError> {
    let [one, q_heads, rows, head_dim] = q;
    let [kv_heads, slots, k_dim] = k_pool;
    if one != 1 {
        return Err(AttnError::Shape(format!(
            "paged queries are [1, heads, rows, dim], got {q:?}"
        )));
    }
    if k_pool != v_pool {
        return Err(AttnError::Shape(format!(
            "the K pool is {k_pool:?} but the V pool is {v_pool:?}"
        )));
    }
    if k_dim != head_dim {
        return Err(AttnError::Shape(format!(
            "queries have head dim {head_dim}, the pool {k_dim}"
        )));
    }
    if kv_heads == 0 || q_heads % kv_heads != 0 {
        return Err(AttnError::Shape(format!(
            "{q_heads} query heads cannot share {kv_heads} kv heads"
        )));
    }
    let bs = batch.block_size;
    if bs == 0 || slots % bs != 0 {
        return Err(AttnError::Shape(format!(
            "a pool of {slots} slots is not made of blocks of {bs}"
        )));
    }
    let pool_blocks = slots / bs;
    let mut next_row = 0;
    for (i, s) in batch.seqs.iter().enumerate() {
        if s.rows.start != next_row || s.rows.end < s.rows.start {
            return Err(AttnError::Visibility(format!(
                "sequence {i} covers rows {:?}; the previous one ended at row {next_row}",
                s.rows
            )));
        }
        next_row = s.rows.end;
        if s.last_slot.len() != s.rows.len() {
            return Err(AttnError::Visibility(format!(
                "sequence {i} has {} rows but {} last slots",
                s.rows.len(),
                s.last_slot.len()
            )));
        }
        let keys = s.key_len();
        if keys > s.blocks.len() * bs {
            return Err(AttnError::Visibility(format!(
                "sequence {i} reads slot {} but its {} blocks hold {} slots",
                keys - 1,
                s.blocks.len(),
                s.blocks.len() * bs
            )));
        }
        if let Some(&b) = s.blocks.iter().find(|&&b| b as usize >= pool_blocks) {
            return Err(AttnError::Visibility(format!(
                "sequence {i} names block {b}; the pool has {pool_blocks}"
            )));
        }
    }
    if next_row != rows {
        return Err(AttnError::Visibility(format!(
            "the sequences cover {next_row} rows; the queries have {rows}"
        )));
    }
    Ok(PagedDims {
        q_heads,
        kv_heads,
        rows,
        head_dim,
    })
}

/// Paged attention in burn tensor ops: the reference every backend can run.
///
/// - `q`: `[1, q_heads, rows, head_dim]`, the rows of every sequence stacked
/// - `k_pool`, `v_pool`: `[kv_heads, slots, head_dim]`, `slots` a multiple of the block size
/// - returns `[rows, q_heads * head_dim]` (heads side by side, as the output projection reads them)
///
/// Each sequence's visible K/V is gathered through its block table and attended with
/// [`attention`] (slot visibility per row); a kernel reads the blocks in place instead.
pub fn paged_attention<B: Backend>(
    q: Tensor<B, 4>,
    k_pool: &Tensor<B, 3>,
    v_pool: &Tensor<B, 3>,
    batch: &PagedBatch,
    scale: f32,
) -> Result<Tensor<B, 2>, AttnError> {
    let PagedDims {
        q_heads,
        kv_heads,
        rows,
        head_dim: d,
    } = check_paged(q.dims(), k_pool.dims(), v_pool.dims(), batch)?;
    let device = q.device();
    let mut parts = Vec::with_capacity(batch.seqs.len());
    for s in batch.seqs.iter().filter(|s| !s.rows.is_empty()) {
        let t = s.key_len();
        let slots: Vec<i64> = (0..t)
            .map(|i| s.pool_slot(i, batch.block_size) as i64)
            .collect();
        let idx = Tensor::<B, 1, Int>::from_data(TensorData::new(slots, [t]), &device);
        let k = k_pool.clone().select(1, idx.clone()).unsqueeze::<4>();
        let v = v_pool.clone().select(1, idx).unsqueeze::<4>();
        let n = s.rows.len();
        let qs = q.clone().slice([0..1, 0..q_heads, s.rows.clone(), 0..d]);
        let out = attention(
            qs,
            k,
            v,
            &Visibility::UpToSlot(s.last_slot.to_vec()),
            None,
            scale,
        )?; // [1, hq, n, d]
        parts.push(
            out.reshape([q_heads, n, d])
                .swap_dims(0, 1)
                .reshape([n, q_heads * d]),
        );
    }
    debug_assert!(kv_heads > 0);
    if parts.is_empty() {
        // Zero elements: `empty` launches nothing, where burn-cubecl's `zeros` launches a kernel of
        // zero cubes, which CUDA rejects (CUDA_ERROR_INVALID_VALUE).
        return Ok(Tensor::empty([rows, q_heads * d], (&device, q.dtype())));
    }
    Ok(Tensor::cat(parts, 0))
}

/// Consecutive runs of `slots`: `(index of the run's first value, first slot, length)`.
pub fn runs(slots: &[usize]) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        if i >= slots.len() {
            return None;
        }
        let start = i;
        i += 1;
        while i < slots.len() && slots[i] == slots[i - 1] + 1 {
            i += 1;
        }
        Some((start, slots[start], i - start))
    })
}

/// [`crate::pool::PoolBackend::pool_scatter`] in burn tensor ops: one slice-assign per run of
/// consecutive slots (in place on backends that own the pool uniquely, as burn's do).
pub fn pool_write_runs<B: Backend>(
    mut pool: Tensor<B, 3>,
    slots: &[usize],
    values: Tensor<B, 3>,
) -> Tensor<B, 3> {
    let [h, _, d] = pool.dims();
    for (at, first, len) in runs(slots) {
        let part = values.clone().slice([0..h, at..at + len, 0..d]);
        pool = pool.slice_assign([0..h, first..first + len, 0..d], part);
    }
    pool
}
