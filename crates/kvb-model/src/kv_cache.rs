//! The live K/V cache of one sequence, addressable per token range.
//!
//! A [`KvCache`] is a private [`KvPool`] holding one sequence whose blocks are the pool's blocks in
//! order, so the model has a single forward path (over pools) and a lone sequence is read in
//! place, in long contiguous tiles. Tokens occupy *slots* `0..len` in the order they were written;
//! a slot's RoPE position is whatever the forward pass was told, so reused K/V can sit at any
//! position. Keys are stored after RoPE. Storage grows by doubling; writes go in place, so a
//! decode step does not copy the whole cache.

use crate::error::{ModelError, Result};
use crate::model::ModelBackend;
use crate::KvPool;
use burn::tensor::Tensor;
use std::ops::Range;

/// Slots per block of a lone sequence's pool.
const BLOCK: usize = 64;

/// The K/V of every layer for one sequence.
#[derive(Debug)]
pub struct KvCache<B: ModelBackend> {
    pool: KvPool<B>,
    /// `0..pool.blocks()`: the sequence owns the whole pool, in order.
    blocks: Vec<u32>,
    len: usize,
}

impl<B: ModelBackend> KvCache<B> {
    /// An empty cache for `num_layers` layers of `kv_heads` heads of `head_dim`.
    pub fn new(num_layers: usize, kv_heads: usize, head_dim: usize, device: &B::Device) -> Self {
        KvCache {
            pool: KvPool::new(num_layers, (kv_heads, head_dim), BLOCK, 0, device)
                .expect("a block size of 64 is valid"),
            blocks: Vec::new(),
            len: 0,
        }
    }

    /// Number of token slots in use.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no token is cached.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Number of layers.
    pub fn num_layers(&self) -> usize {
        self.pool.num_layers()
    }

    /// `(kv_heads, head_dim)` of every layer.
    pub fn head_shape(&self) -> (usize, usize) {
        self.pool.head_shape()
    }

    /// Token slots the storage holds before it must grow (growing copies the cache).
    pub fn capacity(&self) -> usize {
        self.blocks.len() * BLOCK
    }

    /// The device the cache lives on.
    pub fn device(&self) -> &B::Device {
        self.pool.device()
    }

    /// Forgets slots `len..`; their storage is reused by later writes.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Forgets every slot.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Makes room for `additional` more slots after `len`.
    pub fn reserve(&mut self, additional: usize) {
        let needed = (self.len + additional).div_ceil(BLOCK);
        if needed <= self.blocks.len() {
            return;
        }
        let blocks = needed.max(2 * self.blocks.len());
        self.pool.grow(blocks);
        self.blocks = (0..blocks as u32).collect();
    }

    /// Marks slots `0..len` as filled (after the layers were written up to there).
    pub fn set_len(&mut self, len: usize) -> Result<()> {
        if len > self.capacity() {
            return Err(ModelError::Forward(format!(
                "length {len} exceeds the reserved {} slots",
                self.capacity()
            )));
        }
        self.len = len;
        Ok(())
    }

    /// K and V of `layer` for slots `range` (within `0..len`): `[1, kv_heads, range.len(), head_dim]`.
    pub fn read(&self, layer: usize, range: Range<usize>) -> Result<(Tensor<B, 4>, Tensor<B, 4>)> {
        if range.end > self.len || range.start > range.end || layer >= self.num_layers() {
            return Err(ModelError::Forward(format!(
                "read of slots {range:?} in layer {layer}: the cache holds {} slots of {} layers",
                self.len,
                self.num_layers()
            )));
        }
        // The sequence owns the pool in order: logical slots are pool slots.
        let slots: Vec<usize> = range.collect();
        let (k, v) = self.pool.read(layer, &slots)?;
        Ok((k.unsqueeze::<4>(), v.unsqueeze::<4>()))
    }

    /// Appends `n` slots whose K/V per layer are given (`[1, kv_heads, n, head_dim]` each), e.g.
    /// cached chunks restored from a store.
    pub fn append(&mut self, per_layer: Vec<(Tensor<B, 4>, Tensor<B, 4>)>) -> Result<()> {
        if per_layer.len() != self.num_layers() {
            return Err(ModelError::Forward(format!(
                "{} layers of K/V given for a cache of {} layers",
                per_layer.len(),
                self.num_layers()
            )));
        }
        let n = per_layer.first().map(|(k, _)| k.dims()[2]).unwrap_or(0);
        self.reserve(n);
        let slots: Vec<usize> = (self.len..self.len + n).collect();
        for (layer, (k, v)) in per_layer.into_iter().enumerate() {
            let [_, h, t, d] = k.dims();
            if t != n {
                return Err(ModelError::Forward(format!(
                    "layer {layer} has {t} tokens of K/V, layer 0 has {n}"
                )));
            }
            let [_, vh, vt, vd] = v.dims();
            self.pool
                .write(layer, &slots, k.reshape([h, t, d]), v.reshape([vh, vt, vd]))?;
        }
        self.len += n;
        Ok(())
    }

    /// The pool and the sequence's block table, for the forward pass.
    pub(crate) fn parts(&mut self) -> (&mut KvPool<B>, &[u32]) {
        (&mut self.pool, &self.blocks)
    }
}
