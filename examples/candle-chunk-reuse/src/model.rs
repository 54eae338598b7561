//! A Llama-family model on candle, read from a GGUF file with candle's own reader and run with
//! its quantized matmuls: the runtime kvb's crates are given to. It owns its K/V ([`KvCache`]).

use crate::cache::KvCache;
use candle_core::quantized::{gguf_file, QMatMul, QTensor};
use candle_core::{DType, Device, Module, Tensor, D};
use kvb_modelfile::ModelConfig;
use std::path::Path;

/// One decoder layer's weights.
struct Layer {
    attn_norm: Tensor,
    q: QMatMul,
    k: QMatMul,
    v: QMatMul,
    o: QMatMul,
    ffn_norm: Tensor,
    gate: QMatMul,
    up: QMatMul,
    down: QMatMul,
}

/// A Llama-family model (llama.cpp's tensor names, its Q/K rows permuted for interleaved RoPE).
pub struct CandleLlama {
    /// The file's hyperparameters, read by `kvb-modelfile`.
    pub config: ModelConfig,
    embed: Tensor,
    layers: Vec<Layer>,
    norm: Tensor,
    head: QMatMul,
    /// `[max_positions, head_dim / 2]`: the runtime's own RoPE tables.
    cos: Tensor,
    sin: Tensor,
    device: Device,
}

/// The most positions the RoPE tables cover.
const MAX_POSITIONS: usize = 8192;

impl CandleLlama {
    /// Loads a GGUF file on the CPU.
    pub fn load(path: &Path) -> anyhow::Result<Self> {
        let config = kvb_modelfile::gguf::GgufModel::open(path)?.config(true)?;
        let device = Device::Cpu;
        let mut file = std::fs::File::open(path)?;
        let content = gguf_file::Content::read(&mut file)
            .map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        let mut tensor = |name: &str| content.tensor(&mut file, name, &device);
        let embed_q = tensor("token_embd.weight")?;
        let embed = embed_q.dequantize(&device)?;
        let head = match tensor("output.weight") {
            Ok(t) => widened(t, &device)?,
            Err(_) => widened(embed_q, &device)?,
        };
        let norm = tensor("output_norm.weight")?.dequantize(&device)?;
        let mut layers = Vec::with_capacity(config.num_layers);
        for i in 0..config.num_layers {
            let mut q = |part: &str| -> anyhow::Result<QMatMul> {
                widened(tensor(&format!("blk.{i}.{part}.weight"))?, &device)
            };
            layers.push(Layer {
                q: q("attn_q")?,
                k: q("attn_k")?,
                v: q("attn_v")?,
                o: q("attn_output")?,
                gate: q("ffn_gate")?,
                up: q("ffn_up")?,
                down: q("ffn_down")?,
                attn_norm: tensor(&format!("blk.{i}.attn_norm.weight"))?.dequantize(&device)?,
                ffn_norm: tensor(&format!("blk.{i}.ffn_norm.weight"))?.dequantize(&device)?,
            });
        }
        let (cos, sin) = rope_tables(config.head_dim, config.rope_theta, &device)?;
        Ok(CandleLlama {
            config,
            embed,
            layers,
            norm,
            head,
            cos,
            sin,
            device,
        })
    }

    /// An empty cache for this model.
    pub fn new_cache(&self) -> KvCache {
        KvCache::new(
            self.config.num_layers,
            self.config.num_kv_heads,
            self.config.head_dim,
        )
    }

    /// Runs `tokens` at positions `cache.len()..`, appending their K/V to `cache`; returns the
    /// logits of the last token.
    pub fn forward(&self, tokens: &[u32], cache: &mut KvCache) -> anyhow::Result<Vec<f32>> {
        anyhow::ensure!(!tokens.is_empty(), "forward needs at least one token");
        let start = cache.len();
        anyhow::ensure!(
            start + tokens.len() <= MAX_POSITIONS,
            "{} positions exceed the {MAX_POSITIONS} this example's RoPE tables cover",
            start + tokens.len()
        );
        let t = tokens.len();
        let ids = Tensor::new(tokens, &self.device)?;
        let mut x = self.embed.index_select(&ids, 0)?.unsqueeze(0)?;
        let mask = causal_mask(t, start, &self.device)?;
        for (i, layer) in self.layers.iter().enumerate() {
            let h = rms_norm(&x, &layer.attn_norm, self.config.rms_norm_eps)?;
            let h = self.attention(layer, &h, i, start, mask.as_ref(), cache)?;
            x = (x + h)?;
            let h = rms_norm(&x, &layer.ffn_norm, self.config.rms_norm_eps)?;
            let h = (layer.gate.forward(&h)?.silu()? * layer.up.forward(&h)?)?;
            x = (x + layer.down.forward(&h)?)?;
        }
        let last = x.narrow(1, t - 1, 1)?;
        let last = rms_norm(&last, &self.norm, self.config.rms_norm_eps)?;
        Ok(self.head.forward(&last)?.flatten_all()?.to_vec1()?)
    }

    fn attention(
        &self,
        layer: &Layer,
        x: &Tensor,
        index: usize,
        start: usize,
        mask: Option<&Tensor>,
        cache: &mut KvCache,
    ) -> anyhow::Result<Tensor> {
        let c = &self.config;
        let (_, t, hidden) = x.dims3()?;
        let heads = |w: &QMatMul, n: usize| -> anyhow::Result<Tensor> {
            Ok(w.forward(x)?
                .reshape((t, n, c.head_dim))?
                .transpose(0, 1)?
                .contiguous()?)
        };
        let q = self.rope(&heads(&layer.q, c.num_heads)?, start)?;
        let k = self.rope(&heads(&layer.k, c.num_kv_heads)?, start)?;
        let v = heads(&layer.v, c.num_kv_heads)?;
        let (k, v) = cache.append(index, k, v)?;
        let group = c.num_heads / c.num_kv_heads;
        let repeat = |kv: &Tensor| -> anyhow::Result<Tensor> {
            let (h, n, d) = kv.dims3()?;
            Ok(kv
                .unsqueeze(1)?
                .expand((h, group, n, d))?
                .reshape((h * group, n, d))?)
        };
        let (k, v) = (repeat(&k)?, repeat(&v)?);
        let scores = (q.matmul(&k.t()?)? / (c.head_dim as f64).sqrt())?;
        let scores = match mask {
            Some(m) => scores.broadcast_add(m)?,
            None => scores,
        };
        let max = scores.max_keepdim(D::Minus1)?;
        let p = scores.broadcast_sub(&max)?.exp()?;
        let p = p.broadcast_div(&p.sum_keepdim(D::Minus1)?)?;
        let y = p.matmul(&v.contiguous()?)?;
        let y = y.transpose(0, 1)?.reshape((1, t, hidden))?;
        Ok(layer.o.forward(&y)?)
    }

    /// Interleaved RoPE (pairs `2i, 2i+1`, as llama.cpp's permuted Q/K rows want) over
    /// `[heads, t, head_dim]` at positions `start..start + t`.
    fn rope(&self, x: &Tensor, start: usize) -> anyhow::Result<Tensor> {
        let (h, t, d) = x.dims3()?;
        let cos = self.cos.narrow(0, start, t)?.unsqueeze(0)?.unsqueeze(3)?;
        let sin = self.sin.narrow(0, start, t)?.unsqueeze(0)?.unsqueeze(3)?;
        let pairs = x.reshape((h, t, d / 2, 2))?;
        let a = pairs.narrow(3, 0, 1)?;
        let b = pairs.narrow(3, 1, 1)?;
        let ra = (a.broadcast_mul(&cos)? - b.broadcast_mul(&sin)?)?;
        let rb = (a.broadcast_mul(&sin)? + b.broadcast_mul(&cos)?)?;
        Ok(Tensor::cat(&[ra, rb], 3)?.reshape((h, t, d))?)
    }
}

/// A projection as f32 weights: candle's CPU product for Q4_1 blocks is its scalar fallback
/// (tens of times slower than its f32 GEMM on prefill), so the example widens every block type.
fn widened(q: QTensor, device: &Device) -> anyhow::Result<QMatMul> {
    Ok(QMatMul::Tensor(q.dequantize(device)?))
}

/// `x * rsqrt(mean(x^2) + eps) * weight` over the last axis.
fn rms_norm(x: &Tensor, weight: &Tensor, eps: f64) -> candle_core::Result<Tensor> {
    let ms = x.sqr()?.mean_keepdim(D::Minus1)?;
    x.broadcast_div(&(ms + eps)?.sqrt()?)?.broadcast_mul(weight)
}

/// `-inf` above the diagonal for `t` queries at `start..` over `start + t` keys; `None` for one.
fn causal_mask(t: usize, start: usize, device: &Device) -> candle_core::Result<Option<Tensor>> {
    if t == 1 {
        return Ok(None);
    }
    let keys = start + t;
    let mask: Vec<f32> = (0..t)
        .flat_map(|i| {
            (0..keys).map(move |j| {
                if j > start + i {
                    f32::NEG_INFINITY
                } else {
                    0.0
                }
            })
        })
        .collect();
    Tensor::from_vec(mask, (1, t, keys), device).map(Some)
}

/// cos and sin of `position * theta^(-2i/d)` for every position and pair, in f32.
fn rope_tables(
    head_dim: usize,
    theta: f32,
    device: &Device,
) -> candle_core::Result<(Tensor, Tensor)> {
    let inv: Vec<f32> = (0..head_dim / 2)
        .map(|i| 1.0 / theta.powf((2 * i) as f32 / head_dim as f32))
        .collect();
    let inv = Tensor::from_vec(inv, (1, head_dim / 2), device)?;
    let pos = Tensor::arange(0u32, MAX_POSITIONS as u32, device)?
        .to_dtype(DType::F32)?
        .reshape((MAX_POSITIONS, 1))?;
    let angles = pos.broadcast_mul(&inv)?;
    Ok((angles.cos()?, angles.sin()?))
}
