//! The live K/V cache of one sequence, addressable per token range.
//!
//! Tokens occupy *slots* `0..len` in the order they were written; a slot's RoPE position is whatever
//! the forward pass was told, so reused K/V can sit at any position. Keys are stored after RoPE.
//! Storage grows by doubling, and writes go in place (slice-assign on a uniquely owned tensor), so a
//! decode step does not copy the whole cache.

use crate::error::{ModelError, Result};
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;
use std::ops::Range;

/// K and V of one layer: `[1, kv_heads, capacity, head_dim]` each.
type LayerKv<B> = (Tensor<B, 4>, Tensor<B, 4>);

/// The K/V of every layer for one sequence.
#[derive(Debug, Clone)]
pub struct KvCache<B: Backend> {
    /// `Some` outside of `&mut self` methods; taken only to update a layer in place.
    layers: Vec<Option<LayerKv<B>>>,
    len: usize,
    capacity: usize,
    kv_heads: usize,
    head_dim: usize,
    device: B::Device,
}

const MIN_CAPACITY: usize = 64;

impl<B: Backend> KvCache<B> {
    /// An empty cache for `num_layers` layers of `kv_heads` heads of `head_dim`.
    pub fn new(num_layers: usize, kv_heads: usize, head_dim: usize, device: &B::Device) -> Self {
        KvCache {
            layers: (0..num_layers)
                .map(|_| {
                    let empty = Tensor::zeros([1, kv_heads, 0, head_dim], device);
                    Some((empty.clone(), empty))
                })
                .collect(),
            len: 0,
            capacity: 0,
            kv_heads,
            head_dim,
            device: device.clone(),
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
        self.layers.len()
    }

    /// `(kv_heads, head_dim)` of every layer.
    pub fn head_shape(&self) -> (usize, usize) {
        (self.kv_heads, self.head_dim)
    }

    /// Token slots the storage holds before it must grow (growing copies the cache).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// The device the cache lives on.
    pub fn device(&self) -> &B::Device {
        &self.device
    }

    /// Forgets slots `len..`; their storage is reused by later writes.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    /// Forgets every slot.
    pub fn clear(&mut self) {
        self.len = 0;
    }

    fn layer(&self, layer: usize) -> &LayerKv<B> {
        self.layers[layer]
            .as_ref()
            .expect("a layer is only taken inside a method that puts it back")
    }

    /// Makes room for `additional` more slots after `len`.
    pub fn reserve(&mut self, additional: usize) {
        let needed = self.len + additional;
        if needed <= self.capacity {
            return;
        }
        let new_cap = needed.max(self.capacity * 2).max(MIN_CAPACITY);
        let (h, d, len) = (self.kv_heads, self.head_dim, self.len);
        for slot in self.layers.iter_mut() {
            let (k, v) = slot.take().expect("layer present");
            let grow = |t: Tensor<B, 4>| {
                let fresh = Tensor::zeros([1, h, new_cap, d], &self.device);
                if len == 0 {
                    fresh
                } else {
                    fresh.slice_assign(
                        [0..1, 0..h, 0..len, 0..d],
                        t.slice([0..1, 0..h, 0..len, 0..d]),
                    )
                }
            };
            *slot = Some((grow(k), grow(v)));
        }
        self.capacity = new_cap;
    }

    /// Writes `k`, `v` (`[1, kv_heads, n, head_dim]`) of `layer` at slots `start..start + n`, which
    /// must lie within the reserved capacity. Does not change `len`.
    pub fn write(
        &mut self,
        layer: usize,
        start: usize,
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
    ) -> Result<()> {
        let [_, h, n, d] = k.dims();
        if k.dims() != v.dims() || h != self.kv_heads || d != self.head_dim {
            return Err(ModelError::Forward(format!(
                "K/V of shape {:?}/{:?} do not fit a cache of {} heads x {}",
                k.dims(),
                v.dims(),
                self.kv_heads,
                self.head_dim
            )));
        }
        if start + n > self.capacity || layer >= self.layers.len() {
            return Err(ModelError::Forward(format!(
                "write of slots {start}..{} in layer {layer} exceeds the reserved {} slots of {} layers",
                start + n,
                self.capacity,
                self.layers.len()
            )));
        }
        let range = [0..1, 0..h, start..start + n, 0..d];
        let (ck, cv) = self.layers[layer].take().expect("layer present");
        self.layers[layer] = Some((ck.slice_assign(range.clone(), k), cv.slice_assign(range, v)));
        Ok(())
    }

    /// Writes `k`, `v` (`[1, kv_heads, slots.len(), head_dim]`) at the given increasing slots,
    /// one slice-assign per run of consecutive slots.
    pub fn write_slots(
        &mut self,
        layer: usize,
        slots: &[usize],
        k: Tensor<B, 4>,
        v: Tensor<B, 4>,
    ) -> Result<()> {
        let [_, h, _, d] = k.dims();
        let mut i = 0;
        while i < slots.len() {
            let mut j = i + 1;
            while j < slots.len() && slots[j] == slots[j - 1] + 1 {
                j += 1;
            }
            let part = [0..1, 0..h, i..j, 0..d];
            self.write(
                layer,
                slots[i],
                k.clone().slice(part.clone()),
                v.clone().slice(part),
            )?;
            i = j;
        }
        Ok(())
    }

    /// Marks slots `0..len` as filled (after the layers were written up to there).
    pub fn set_len(&mut self, len: usize) -> Result<()> {
        if len > self.capacity {
            return Err(ModelError::Forward(format!(
                "length {len} exceeds the reserved {} slots",
                self.capacity
            )));
        }
        self.len = len;
        Ok(())
    }

    /// K and V of `layer` for slots `range` (within `0..len`): `[1, kv_heads, range.len(), head_dim]`.
    pub fn read(&self, layer: usize, range: Range<usize>) -> Result<(Tensor<B, 4>, Tensor<B, 4>)> {
        if range.end > self.len || range.start > range.end || layer >= self.layers.len() {
            return Err(ModelError::Forward(format!(
                "read of slots {range:?} in layer {layer}: the cache holds {} slots of {} layers",
                self.len,
                self.layers.len()
            )));
        }
        let (k, v) = self.layer(layer);
        let r = [0..1, 0..self.kv_heads, range, 0..self.head_dim];
        Ok((k.clone().slice(r.clone()), v.clone().slice(r)))
    }

    /// K and V of `layer` for slots `0..t` without bounds checks against `len` (the forward pass
    /// reads slots it has just written, before `len` moves).
    pub(crate) fn prefix(&self, layer: usize, t: usize) -> (Tensor<B, 4>, Tensor<B, 4>) {
        let (k, v) = self.layer(layer);
        let r = [0..1, 0..self.kv_heads, 0..t, 0..self.head_dim];
        (k.clone().slice(r.clone()), v.clone().slice(r))
    }

    /// Appends `n` slots whose K/V per layer are given (`[1, kv_heads, n, head_dim]` each), e.g.
    /// cached chunks restored from a store.
    pub fn append(&mut self, per_layer: Vec<(Tensor<B, 4>, Tensor<B, 4>)>) -> Result<()> {
        if per_layer.len() != self.layers.len() {
            return Err(ModelError::Forward(format!(
                "{} layers of K/V given for a cache of {} layers",
                per_layer.len(),
                self.layers.len()
            )));
        }
        let n = per_layer.first().map(|(k, _)| k.dims()[2]).unwrap_or(0);
        self.reserve(n);
        let start = self.len;
        for (layer, (k, v)) in per_layer.into_iter().enumerate() {
            if k.dims()[2] != n {
                return Err(ModelError::Forward(format!(
                    "layer {layer} has {} tokens of K/V, layer 0 has {n}",
                    k.dims()[2]
                )));
            }
            self.write(layer, start, k, v)?;
        }
        self.len = start + n;
        Ok(())
    }
}
