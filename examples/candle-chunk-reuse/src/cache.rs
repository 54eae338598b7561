//! The runtime's K/V cache, held as candle tensors the way candle's own models hold it (one
//! `[kv_heads, tokens, head_dim]` K and V per layer, grown by concatenation), and the
//! [`RuntimeKv`] impl through which kvb's store reads and writes it.

use candle_core::{Device, Tensor};
use kvb_store::seam::{KvDtype, KvLayout, KvOrder, KvPart, RuntimeKv, SeamError};
use std::ops::Range;

/// Per layer, K and V after RoPE.
pub struct KvCache {
    layers: Vec<[Option<Tensor>; 2]>,
    kv_heads: usize,
    head_dim: usize,
}

impl KvCache {
    /// An empty cache.
    pub fn new(layers: usize, kv_heads: usize, head_dim: usize) -> Self {
        KvCache {
            layers: (0..layers).map(|_| [None, None]).collect(),
            kv_heads,
            head_dim,
        }
    }

    /// Tokens held (layer 0's keys).
    pub fn len(&self) -> usize {
        self.tokens(0, 0)
    }

    /// Whether nothing is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn tokens(&self, layer: usize, part: usize) -> usize {
        self.layers[layer][part].as_ref().map_or(0, |t| t.dims()[1])
    }

    /// Appends a layer's new K and V; returns all of them.
    pub fn append(
        &mut self,
        layer: usize,
        k: Tensor,
        v: Tensor,
    ) -> candle_core::Result<(Tensor, Tensor)> {
        let slot = &mut self.layers[layer];
        for (held, new) in slot.iter_mut().zip([k, v]) {
            *held = Some(match held.take() {
                Some(old) => Tensor::cat(&[&old, &new], 1)?,
                None => new,
            });
        }
        Ok((slot[0].clone().unwrap(), slot[1].clone().unwrap()))
    }

    /// Drops every token from `len` on (a turn's answer not kept, say).
    pub fn truncate(&mut self, len: usize) -> candle_core::Result<()> {
        for slot in &mut self.layers {
            for held in slot.iter_mut() {
                if let Some(t) = held.take() {
                    let keep = len.min(t.dims()[1]);
                    *held = (keep > 0).then(|| t.narrow(1, 0, keep)).transpose()?;
                }
            }
        }
        Ok(())
    }

    fn check(&self, layer: usize) -> Result<(), SeamError> {
        if layer >= self.layers.len() {
            return Err(SeamError::Runtime(format!(
                "layer {layer} of a {}-layer cache",
                self.layers.len()
            )));
        }
        Ok(())
    }
}

fn part_index(part: KvPart) -> usize {
    match part {
        KvPart::K => 0,
        KvPart::V => 1,
    }
}

fn runtime(e: candle_core::Error) -> SeamError {
    SeamError::Runtime(e.to_string())
}

impl RuntimeKv for KvCache {
    fn layout(&self) -> KvLayout {
        KvLayout {
            layers: self.layers.len(),
            kv_heads: self.kv_heads,
            head_dim: self.head_dim,
            order: KvOrder::HeadMajor,
            dtype: KvDtype::F32,
        }
    }

    fn read(&self, layer: usize, part: KvPart, tokens: Range<usize>) -> Result<Vec<u8>, SeamError> {
        self.check(layer)?;
        let p = part_index(part);
        let held = self.tokens(layer, p);
        if tokens.start > tokens.end || tokens.end > held {
            return Err(SeamError::Runtime(format!(
                "tokens {tokens:?} of layer {layer}, which holds {held}"
            )));
        }
        let Some(t) = &self.layers[layer][p] else {
            return Ok(Vec::new());
        };
        let run = t.narrow(1, tokens.start, tokens.len()).map_err(runtime)?;
        let values: Vec<f32> = run
            .flatten_all()
            .and_then(|r| r.to_vec1())
            .map_err(runtime)?;
        Ok(values.iter().flat_map(|v| v.to_le_bytes()).collect())
    }

    fn write(
        &mut self,
        layer: usize,
        part: KvPart,
        at: usize,
        bytes: &[u8],
    ) -> Result<(), SeamError> {
        self.check(layer)?;
        let p = part_index(part);
        let held = self.tokens(layer, p);
        let row = self.kv_heads * self.head_dim * 4;
        if !bytes.len().is_multiple_of(row) || at > held {
            return Err(SeamError::Runtime(format!(
                "{} bytes at token {at} of layer {layer}, which holds {held} tokens of {row} bytes",
                bytes.len()
            )));
        }
        let n = bytes.len() / row;
        let values: Vec<f32> = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
            .collect();
        let new = Tensor::from_vec(values, (self.kv_heads, n, self.head_dim), &Device::Cpu)
            .map_err(runtime)?;
        let slot = &mut self.layers[layer][p];
        // Keep what lies before `at` and after the run; the run replaces the rest.
        let mut parts = Vec::with_capacity(3);
        if let Some(old) = slot.as_ref() {
            if at > 0 {
                parts.push(old.narrow(1, 0, at).map_err(runtime)?);
            }
        }
        parts.push(new);
        if let Some(old) = slot.as_ref() {
            if at + n < held {
                parts.push(old.narrow(1, at + n, held - at - n).map_err(runtime)?);
            }
        }
        *slot = Some(Tensor::cat(&parts, 1).map_err(runtime)?);
        Ok(())
    }
}
