//! The unit of storage: the K/V of every layer for one chunk of tokens.

use half::{bf16, f16};
use kvb_hash::{ContentKey, PrefixKey};
use kvb_quant::{quantize, QuantAxis, QuantConfig, QuantError, QuantizedKv};

/// How K/V values are held.
#[derive(Debug, Clone, PartialEq)]
pub enum KvData {
    /// 32-bit floats.
    F32(Vec<f32>),
    /// 16-bit floats.
    F16(Vec<f16>),
    /// bfloat16.
    Bf16(Vec<bf16>),
    /// KIVI-quantized.
    Quantized(QuantizedKv),
}

impl KvData {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        match self {
            KvData::F32(v) => v.len() * 4,
            KvData::F16(v) => v.len() * 2,
            KvData::Bf16(v) => v.len() * 2,
            KvData::Quantized(q) => q.memory_bytes(),
        }
    }

    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            KvData::F32(v) => v.len(),
            KvData::F16(v) => v.len(),
            KvData::Bf16(v) => v.len(),
            KvData::Quantized(q) => q.shape().iter().product(),
        }
    }

    /// Whether there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The values as f32 (dequantized or widened).
    pub fn to_f32(&self) -> Vec<f32> {
        let mut out = vec![0f32; self.len()];
        self.write_f32(&mut out);
        out
    }

    /// Writes the values as f32 into `out` (`len()` values).
    pub fn write_f32(&self, out: &mut [f32]) {
        match self {
            KvData::F32(v) => out.copy_from_slice(v),
            KvData::F16(v) => out.iter_mut().zip(v).for_each(|(o, x)| *o = x.to_f32()),
            KvData::Bf16(v) => out.iter_mut().zip(v).for_each(|(o, x)| *o = x.to_f32()),
            KvData::Quantized(q) => q.dequantize_into(out),
        }
    }
}

/// The format chunks are stored in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvFormat {
    /// As computed (f32).
    F32,
    /// Halved to f16.
    F16,
    /// Halved to bf16.
    Bf16,
    /// KIVI: keys per channel, values per token.
    Kivi(QuantConfig),
}

impl KvFormat {
    /// Encodes `[kv_heads, tokens, head_dim]` f32 values; `is_key` picks KIVI's axis.
    pub fn encode(
        &self,
        values: Vec<f32>,
        shape: [usize; 3],
        is_key: bool,
    ) -> Result<KvData, QuantError> {
        Ok(match self {
            KvFormat::F32 => KvData::F32(values),
            KvFormat::F16 => KvData::F16(values.iter().map(|&x| f16::from_f32(x)).collect()),
            KvFormat::Bf16 => KvData::Bf16(values.iter().map(|&x| bf16::from_f32(x)).collect()),
            KvFormat::Kivi(cfg) => {
                let axis = if is_key {
                    QuantAxis::PerChannel
                } else {
                    QuantAxis::PerToken
                };
                KvData::Quantized(quantize(&values, shape, axis, *cfg)?)
            }
        })
    }
}

/// K and V of one layer, each `[kv_heads, tokens, head_dim]`.
#[derive(Debug, Clone, PartialEq)]
pub struct LayerKv {
    /// Keys (after RoPE).
    pub k: KvData,
    /// Values.
    pub v: KvData,
}

/// A cached chunk: its keys, tokens, positions, and the K/V of every layer.
#[derive(Debug, Clone, PartialEq)]
pub struct KvChunk {
    /// Names the chunk in context.
    pub prefix_key: PrefixKey,
    /// Names its tokens alone.
    pub content_key: ContentKey,
    /// The prefix key of the chunk before it (the namespace root for a first chunk).
    pub parent: PrefixKey,
    /// Its token ids.
    pub tokens: Vec<u32>,
    /// The RoPE position of each token when its K/V were computed.
    pub positions: Vec<u32>,
    /// K/V heads per layer.
    pub kv_heads: usize,
    /// Width of a head.
    pub head_dim: usize,
    /// K/V per layer.
    pub layers: Vec<LayerKv>,
}

impl KvChunk {
    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Whether the chunk holds no token.
    pub fn is_empty(&self) -> bool {
        self.tokens.is_empty()
    }

    /// `[kv_heads, tokens, head_dim]` of every K and V block.
    pub fn block_shape(&self) -> [usize; 3] {
        [self.kv_heads, self.tokens.len(), self.head_dim]
    }

    /// Bytes the chunk holds: K/V data, tokens and positions, and a fixed overhead for keys.
    pub fn bytes(&self) -> usize {
        let kv: usize = self.layers.iter().map(|l| l.k.bytes() + l.v.bytes()).sum();
        kv + 8 * self.tokens.len() + 3 * 32
    }

    /// Checks that every block has `kv_heads * tokens * head_dim` values and positions match tokens.
    pub fn check(&self) -> Result<(), String> {
        let want = self.kv_heads * self.tokens.len() * self.head_dim;
        if self.positions.len() != self.tokens.len() {
            return Err(format!(
                "{} positions for {} tokens",
                self.positions.len(),
                self.tokens.len()
            ));
        }
        for (i, l) in self.layers.iter().enumerate() {
            for (name, d) in [("K", &l.k), ("V", &l.v)] {
                let shape_ok = match d {
                    KvData::Quantized(q) => q.shape() == self.block_shape(),
                    _ => true,
                };
                if d.len() != want || !shape_ok {
                    return Err(format!(
                        "layer {i} {name} holds {} values, expected {want}",
                        d.len()
                    ));
                }
            }
        }
        Ok(())
    }
}
