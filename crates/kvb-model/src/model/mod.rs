//! The Llama-layout transformer: load from any [`TensorSource`], run at explicit positions.

mod backend_ops;
mod batch;
mod bf16_compute;
#[cfg(feature = "ndarray")]
mod cpu_ops;
#[cfg(feature = "cube")]
mod cube_ops;
#[cfg(all(test, feature = "ndarray"))]
mod gemm_tests;
pub use kvb_gemm::int8;
mod layers;
mod linear_weight;
mod precision;
mod q8_activations;
#[cfg(all(test, feature = "ndarray"))]
mod test_values;

pub use backend_ops::{
    gated_activation_reference, rms_norm_reference, split_heads_reference, ModelBackend,
};
pub use batch::{ForwardBatch, SeqRows};
pub use bf16_compute::ComputePrecision;
/// Rows up to which a CubeCL backend multiplies a projection in kvb's own kernel.
#[cfg(feature = "cube")]
pub use cube_ops::PROJECTION_KERNEL_ROWS;
pub use kvb_attn::pool::HostKv;
pub use layers::{activate, Embedding, Linear, RmsNorm};
pub use linear_weight::{Dense, IntDot, LinearWeight, Packed, Stacked};
pub use precision::WeightPrecision;
pub use q8_activations::ActivationPrecision;

use crate::config::{Family, ModelConfig};
use crate::error::{ModelError, Result};
use crate::kv_cache::KvCache;
use crate::rope::{Rope, RopeTables};
use crate::weights::{StoredTensor, TensorSource, WeightLoader};
use batch::Layout;
use burn::tensor::{Int, Tensor, TensorData};
use kvb_attn::KvPool;
use kvb_attn::{host_work, AttentionBackend, PagedBatch};

/// Which positions of a forward pass get logits. Projecting every prefill position through a
/// 49k-vocabulary head would cost more than a layer, so only what is asked for is computed.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum LogitsFor {
    /// The last input token (the next-token distribution).
    #[default]
    Last,
    /// Every input token.
    All,
    /// These indices into the input tokens.
    Rows(Vec<usize>),
    /// None (filling a cache).
    Nothing,
}

/// One transformer block.
#[derive(Debug, Clone)]
struct Block<B: ModelBackend> {
    attn_norm: RmsNorm<B>,
    /// q, k and v fused: `[hidden, (heads + 2 kv_heads) * head_dim]`.
    qkv: Linear<B>,
    o: Linear<B>,
    mlp_norm: RmsNorm<B>,
    /// gate and up fused: `[hidden, 2 * intermediate]`.
    gate_up: Linear<B>,
    down: Linear<B>,
}

/// A loaded model on a burn backend.
#[derive(Debug, Clone)]
pub struct Model<B: ModelBackend> {
    config: ModelConfig,
    rope: Rope,
    /// `[vocab, hidden]`.
    embed: Embedding<B>,
    blocks: Vec<Block<B>>,
    norm: RmsNorm<B>,
    /// `[hidden, vocab]` (when tied: a transposed copy of the embedding on the CPU, its
    /// transposed view where weights are held `[out, in]`, the same packed matrix when packed).
    lm_head: Linear<B>,
    /// The precision the weights were asked for.
    precision: WeightPrecision,
    /// How activations are held between operations.
    compute: ComputePrecision,
    /// How products quantize their input rows.
    activations: ActivationPrecision,
    device: B::Device,
}

fn take_vec(loader: &WeightLoader, name: &str, shape: &[usize]) -> Result<Vec<f32>> {
    Ok(loader.take(name, shape)?.data)
}

impl<B: ModelBackend> Model<B> {
    /// Builds the model from `source`, checking every tensor's shape and that none is left unused.
    /// `progress(done, total)` is called after each block. Weights as stored
    /// ([`WeightPrecision::Auto`]).
    pub fn load(
        config: &ModelConfig,
        source: &dyn TensorSource,
        device: &B::Device,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        Self::load_with(config, source, WeightPrecision::Auto, device, progress)
    }

    /// [`Model::load`] with weights held in `precision`.
    pub fn load_with(
        config: &ModelConfig,
        source: &dyn TensorSource,
        precision: WeightPrecision,
        device: &B::Device,
        progress: &mut dyn FnMut(usize, usize),
    ) -> Result<Self> {
        let c = config;
        let loader = WeightLoader::new(source);
        let (h, hd, inter) = (c.hidden_size, c.head_dim, c.intermediate_size);
        let (q_out, kv_out) = (c.num_heads * hd, c.num_kv_heads * hd);
        let total = c.num_layers + 2;

        let linear = |parts, bias| precision::linear::<B>(parts, bias, precision, device);
        let embed_name = "model.embed_tokens.weight";
        // An untied table kept as stored is read in place on the CPU: a request reads a few rows.
        let in_place = !c.tie_word_embeddings
            && precision == WeightPrecision::Auto
            && B::runs_packed_weights();
        let mapped = match in_place {
            true => loader.take_mapped(embed_name, &[c.vocab_size, h])?,
            false => None,
        };
        let (embed, tied_head) = match mapped {
            Some(rows) => (Embedding::Mapped(rows), None),
            None => precision::embedding_and_tied_head::<B>(
                loader.take_stored(embed_name, &[c.vocab_size, h])?,
                c.tie_word_embeddings,
                precision,
                device,
            )?,
        };
        let lm_head = match tied_head {
            Some(head) => head,
            None => linear(
                vec![loader.take_stored("lm_head.weight", &[c.vocab_size, h])?],
                None,
            )?,
        };
        progress(1, total);

        let mut blocks = Vec::with_capacity(c.num_layers);
        for i in 0..c.num_layers {
            let p = format!("model.layers.{i}");
            let norm = |name: &str| -> Result<RmsNorm<B>> {
                Ok(RmsNorm::new(
                    take_vec(&loader, &format!("{p}.{name}.weight"), &[h])?,
                    c.norm_adds_one(),
                    c.rms_norm_eps,
                    device,
                ))
            };
            let (qkv_w, qkv_b): (Vec<StoredTensor>, Option<Vec<f32>>) = if c.family == Family::Phi3
            {
                let w = loader.take_stored(
                    &format!("{p}.self_attn.qkv_proj.weight"),
                    &[q_out + 2 * kv_out, h],
                )?;
                let b = loader.take_optional(
                    &format!("{p}.self_attn.qkv_proj.bias"),
                    &[q_out + 2 * kv_out],
                )?;
                (vec![w], b.map(|b| b.data))
            } else {
                let mut ws = Vec::new();
                let mut bs = Vec::new();
                for (name, out) in [("q_proj", q_out), ("k_proj", kv_out), ("v_proj", kv_out)] {
                    ws.push(
                        loader.take_stored(&format!("{p}.self_attn.{name}.weight"), &[out, h])?,
                    );
                    let bias_name = format!("{p}.self_attn.{name}.bias");
                    if c.attention_bias {
                        bs.extend(take_vec(&loader, &bias_name, &[out])?);
                    }
                }
                (ws, c.attention_bias.then_some(bs))
            };
            let o_w = loader.take_stored(&format!("{p}.self_attn.o_proj.weight"), &[h, q_out])?;
            let o_b = if c.o_proj_bias {
                Some(take_vec(
                    &loader,
                    &format!("{p}.self_attn.o_proj.bias"),
                    &[h],
                )?)
            } else {
                None
            };
            let gate_up_w = if c.family == Family::Phi3 {
                // Phi-3 stores gate first, then up: the fused layout kvb uses anyway.
                vec![loader.take_stored(&format!("{p}.mlp.gate_up_proj.weight"), &[2 * inter, h])?]
            } else {
                vec![
                    loader.take_stored(&format!("{p}.mlp.gate_proj.weight"), &[inter, h])?,
                    loader.take_stored(&format!("{p}.mlp.up_proj.weight"), &[inter, h])?,
                ]
            };
            let down_w = loader.take_stored(&format!("{p}.mlp.down_proj.weight"), &[h, inter])?;
            if c.mlp_bias {
                return Err(ModelError::unsupported(
                    "MLP biases (mlp_bias = true)".into(),
                ));
            }
            blocks.push(Block {
                attn_norm: norm("input_layernorm")?,
                qkv: linear(qkv_w, qkv_b)?,
                o: linear(vec![o_w], o_b)?,
                mlp_norm: norm("post_attention_layernorm")?,
                gate_up: linear(gate_up_w, None)?,
                down: linear(vec![down_w], None)?,
            });
            progress(i + 2, total);
        }
        let norm = RmsNorm::new(
            take_vec(&loader, "model.norm.weight", &[h])?,
            c.norm_adds_one(),
            c.rms_norm_eps,
            device,
        );
        loader.finish()?;
        progress(total, total);
        Ok(Model {
            config: config.clone(),
            rope: Rope::new(config),
            embed,
            blocks,
            norm,
            lm_head,
            precision,
            compute: ComputePrecision::F32,
            activations: ActivationPrecision::F32,
            device: device.clone(),
        })
    }

    /// The model's configuration.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// The model's RoPE (to re-rotate cached keys).
    pub fn rope(&self) -> &Rope {
        &self.rope
    }

    /// The precision the weights were loaded in.
    pub fn weight_precision(&self) -> WeightPrecision {
        self.precision
    }

    /// Whether the layers' projections are held quantized to integers (a GGUF's Q4/Q5/Q6/Q8
    /// blocks, or `--weights q8_0`): then the model's own rounding is far coarser than f16's.
    pub fn has_quantized_weights(&self) -> bool {
        self.blocks.iter().any(|b| {
            [&b.qkv, &b.o, &b.gate_up, &b.down]
                .iter()
                .any(|l| l.is_quantized())
        })
    }

    /// Bytes of the model file read in place rather than held (an untied embedding, see
    /// [`Embedding::Mapped`]); not in [`Self::weight_bytes`].
    pub fn mapped_weight_bytes(&self) -> usize {
        self.embed.mapped_bytes()
    }

    /// Bytes the weights hold in memory of their own (projections and embedding; an embedding
    /// shared with the LM head counted once; a table read from the file's map not at all).
    pub fn weight_bytes(&self) -> usize {
        let blocks: usize = self
            .blocks
            .iter()
            .map(|b| {
                b.qkv.weight_bytes()
                    + b.o.weight_bytes()
                    + b.gate_up.weight_bytes()
                    + b.down.weight_bytes()
            })
            .sum();
        let head = match (&self.embed, self.config.tie_word_embeddings) {
            (Embedding::Packed(_), true) => 0,
            (e @ Embedding::Dense(_), true) if e.head_view().is_some() => 0,
            (Embedding::IntDot(_), true) => 0,
            _ => self.lm_head.weight_bytes(),
        };
        blocks + self.embed.bytes() + head
    }

    /// The device the weights live on.
    pub fn device(&self) -> &B::Device {
        &self.device
    }

    /// An empty K/V cache shaped for this model.
    pub fn new_cache(&self) -> KvCache<B> {
        KvCache::new(
            self.config.num_layers,
            self.config.num_kv_heads,
            self.config.head_dim,
            &self.device,
        )
    }

    /// Runs `tokens` at RoPE `positions`, appending their K/V to `cache` after its current slots.
    /// Each token attends to every earlier slot and to itself.
    ///
    /// Returns logits `[rows, vocab]` for the rows `logits` asks for.
    pub fn forward(
        &self,
        tokens: &[u32],
        positions: &[usize],
        cache: &mut KvCache<B>,
        logits: LogitsFor,
    ) -> Result<Tensor<B, 2>> {
        let start = cache.len();
        cache.reserve(tokens.len());
        let slots: Vec<usize> = (start..start + tokens.len()).collect();
        let out = self.forward_cache_slots(tokens, positions, &slots, cache, logits)?;
        cache.set_len(start + tokens.len())?;
        Ok(out)
    }

    /// Recomputes `tokens` whose K/V already occupy `slots` (increasing, below `cache.len()`),
    /// overwriting them layer by layer. Token `i` attends to slots `0..=slots[i]`: the cached K/V
    /// of the others and the fresh K/V of the recomputed ones (sparse recompute, as CacheBlend).
    pub fn forward_at_slots(
        &self,
        tokens: &[u32],
        positions: &[usize],
        slots: &[usize],
        cache: &mut KvCache<B>,
        logits: LogitsFor,
    ) -> Result<Tensor<B, 2>> {
        check_slots_below(tokens, slots, cache.len())?;
        self.forward_cache_slots(tokens, positions, slots, cache, logits)
    }

    fn forward_cache_slots(
        &self,
        tokens: &[u32],
        positions: &[usize],
        slots: &[usize],
        cache: &mut KvCache<B>,
        logits: LogitsFor,
    ) -> Result<Tensor<B, 2>> {
        let (pool, blocks) = cache.parts();
        let seqs = [SeqRows {
            blocks,
            slots,
            decode: tokens.len() == 1,
        }];
        let batch = ForwardBatch {
            tokens,
            positions,
            seqs: &seqs,
        };
        self.forward_batch(&batch, pool, logits)
    }

    /// Runs `tokens` (already in the cache at `slots`, below `cache.len()`) through layers
    /// `0..layer`, rewriting their K/V there, and returns the fresh keys `[1, hkv, n, hd]` that
    /// layer `layer` computes for them, without writing those.
    ///
    /// CacheBlend uses it: how far these keys are from the cached ones of layer `layer` measures
    /// how much each reused token's K/V depends on the context it now has.
    pub fn probe_keys(
        &self,
        tokens: &[u32],
        positions: &[usize],
        slots: &[usize],
        cache: &mut KvCache<B>,
        layer: usize,
    ) -> Result<Tensor<B, 4>> {
        check_slots_below(tokens, slots, cache.len())?;
        let (pool, blocks) = cache.parts();
        let seqs = [SeqRows {
            blocks,
            slots,
            decode: false,
        }];
        let batch = ForwardBatch {
            tokens,
            positions,
            seqs: &seqs,
        };
        self.probe_keys_batch(&batch, pool, layer)
    }

    /// One forward pass over the rows of several sequences in `pool` (a ragged batch): every row
    /// writes its K/V at its slot in every layer, then attends to its sequence's slots up to its
    /// own. Linear layers see all rows at once (the weights are read once per step, whatever the
    /// number of sequences); attention reads each sequence through its block table.
    ///
    /// Returns logits `[rows, vocab]` for the rows `logits` asks for (indices into the batch).
    pub fn forward_batch(
        &self,
        batch: &ForwardBatch,
        pool: &mut KvPool<B>,
        logits: LogitsFor,
    ) -> Result<Tensor<B, 2>> {
        self.check_inputs(batch.tokens, batch.positions)?;
        let out = B::on_compute_threads(|| {
            let layout = batch.layout(pool)?;
            let rope: RopeTables<B> = self.rope.tables(batch.positions, &self.device);
            let mut x = Residual::new(self.embed(batch.tokens)?);
            for layer in 0..self.blocks.len() {
                x = self.block(layer, x, &rope, &layout, pool)?;
            }
            self.logits(x, logits)
        });
        released_after::<B>(batch.tokens.len());
        out
    }

    /// Runs a batch through layers `0..layer` (writing their K/V) and returns the keys layer
    /// `layer` computes for its rows, `[1, hkv, rows, hd]`, without writing those.
    pub fn probe_keys_batch(
        &self,
        batch: &ForwardBatch,
        pool: &mut KvPool<B>,
        layer: usize,
    ) -> Result<Tensor<B, 4>> {
        self.check_inputs(batch.tokens, batch.positions)?;
        if layer >= self.config.num_layers {
            return Err(ModelError::Forward(format!(
                "layer {layer} of {}",
                self.config.num_layers
            )));
        }
        let out = B::on_compute_threads(|| {
            let layout = batch.layout(pool)?;
            let rope: RopeTables<B> = self.rope.tables(batch.positions, &self.device);
            let mut x = Residual::new(self.embed(batch.tokens)?);
            for l in 0..layer {
                x = self.block(l, x, &rope, &layout, pool)?;
            }
            Ok(self.qkv(layer, x, &rope)?.1 .1)
        });
        released_after::<B>(batch.tokens.len());
        out
    }

    fn check_inputs(&self, tokens: &[u32], positions: &[usize]) -> Result<()> {
        if tokens.is_empty() {
            return Err(ModelError::Forward("no tokens to run".into()));
        }
        if tokens.len() != positions.len() {
            return Err(ModelError::Forward(format!(
                "{} tokens but {} positions",
                tokens.len(),
                positions.len()
            )));
        }
        if let Some(&bad) = tokens
            .iter()
            .find(|&&t| t as usize >= self.config.vocab_size)
        {
            return Err(ModelError::Forward(format!(
                "token id {bad} is outside the vocabulary of {}",
                self.config.vocab_size
            )));
        }
        let max = self.config.max_position_embeddings;
        if let Some(&bad) = positions.iter().find(|&&p| p >= max) {
            return Err(ModelError::Forward(format!(
                "position {bad} is beyond the model's context of {max} tokens"
            )));
        }
        Ok(())
    }

    /// `[n, hidden]` embeddings of `tokens` (scaled for Gemma).
    fn embed(&self, tokens: &[u32]) -> Result<Tensor<B, 2>> {
        let x = self.embed.lookup(tokens, &self.device);
        self.held(match self.config.embedding_scale() {
            Some(scale) => {
                host_work::launched(1);
                x * scale
            }
            None => x,
        })
    }

    /// The residual stream `x` with its pending sublayer output added, and that sum normalised by
    /// `norm`: one launch on backends that fuse them ([`ModelBackend::add_rms_norm`]).
    fn add_norm(&self, norm: &RmsNorm<B>, x: Residual<B>) -> Result<[Tensor<B, 2>; 2]> {
        match x.pending {
            None => {
                let normed = self.held(norm.forward(x.x.clone()))?;
                Ok([x.x, normed])
            }
            // Compute in bf16 rounds the sum before it is normalised, as two ops would.
            Some(delta) if self.compute_precision() == ComputePrecision::Bf16 => {
                host_work::launched(1);
                let sum = self.held(x.x + delta)?;
                let normed = self.held(norm.forward(sum.clone()))?;
                Ok([sum, normed])
            }
            Some(delta) => Ok(norm.forward_residual(x.x, delta)),
        }
    }

    /// Splits fused q/k/v projections of the normalised stream into heads: q `[1, hq, n, hd]` and
    /// k, v `[1, hkv, n, hd]`, with q and k rotated to their positions. Returns the stream (its
    /// pending output added) beside them.
    fn qkv(
        &self,
        layer: usize,
        x: Residual<B>,
        rope: &RopeTables<B>,
    ) -> Result<(Tensor<B, 2>, Heads<B>)> {
        let c = &self.config;
        let block = &self.blocks[layer];
        let [x, normed] = self.add_norm(&block.attn_norm, x)?;
        let qkv = self.held(block.qkv.forward(normed))?; // [n, (hq + 2 hkv) hd]
        host_work::launched(1);
        let [q, k, v] = B::split_heads(qkv, (c.num_heads, c.num_kv_heads, c.head_dim), rope);
        Ok((x, (self.held(q)?, self.held(k)?, self.held(v)?)))
    }

    /// One transformer block over `x` (`[n, hidden]`): writes the rows' K/V at their pool slots,
    /// attends through the block tables, returns the new residual stream.
    fn block(
        &self,
        layer: usize,
        x: Residual<B>,
        rope: &RopeTables<B>,
        layout: &Layout,
        pool: &mut KvPool<B>,
    ) -> Result<Residual<B>> {
        let c = &self.config;
        let (hkv, hd) = (c.num_kv_heads, c.head_dim);
        let n = x.x.dims()[0];
        let block = &self.blocks[layer];
        let (x, (q, k, v)) = self.qkv(layer, x, rope)?;
        pool.write(
            layer,
            &layout.write,
            k.reshape([hkv, n, hd]),
            v.reshape([hkv, n, hd]),
        )?;
        let (keys, values) = pool.layer(layer)?;
        let paged = PagedBatch {
            block_size: pool.block_size(),
            seqs: &layout.paged,
        };
        let scale = (hd as f32).powf(-0.5);
        let att = <B as AttentionBackend>::paged_attention(q, keys, values, &paged, scale)?; // [n, hq hd]
        let att = self.held(block.o.forward(self.held(att)?))?;
        let [x, normed] = self.add_norm(&block.mlp_norm, Residual::with(x, att))?;
        let gu = self.held(block.gate_up.forward(normed))?; // [n, 2 inter]
        host_work::launched(1);
        let act = self.held(B::gated_activation(gu, c.activation))?;
        let mlp = self.held(block.down.forward(act))?;
        Ok(Residual::with(x, mlp))
    }

    /// Logits `[rows, vocab]` of the final residual stream `x` for the rows asked for.
    fn logits(&self, x: Residual<B>, logits: LogitsFor) -> Result<Tensor<B, 2>> {
        let c = &self.config;
        let n = x.x.dims()[0];
        let rows = match logits {
            LogitsFor::Last => Some(vec![n - 1]),
            LogitsFor::All => None,
            LogitsFor::Rows(rows) => {
                if let Some(&bad) = rows.iter().find(|&&r| r >= n) {
                    return Err(ModelError::Forward(format!(
                        "logits row {bad} of {n} tokens"
                    )));
                }
                Some(rows)
            }
            // Zero elements: `empty` launches nothing, where burn-cubecl's `zeros` launches a kernel of
            // zero cubes, which CUDA rejects (CUDA_ERROR_INVALID_VALUE).
            LogitsFor::Nothing => {
                return Ok(Tensor::empty(
                    [0, c.vocab_size],
                    kvb_attn::float_on::<B>(&self.device),
                ))
            }
        };
        let x = match rows {
            Some(rows) if rows.len() == 1 => {
                let r = rows[0];
                x.map(|t| t.slice([r..r + 1, 0..c.hidden_size]))
            }
            Some(rows) => {
                let idx: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
                let m = idx.len();
                let idx = Tensor::<B, 1, Int>::from_data(TensorData::new(idx, [m]), &self.device);
                host_work::uploaded(1);
                x.map(|t| {
                    host_work::launched(1);
                    t.select(0, idx.clone())
                })
            }
            None => x,
        };
        let [_, normed] = self.add_norm(&self.norm, x)?;
        self.held(self.lm_head.forward(normed))
    }
}

/// q, k and v split into heads: `[1, heads, n, head_dim]` each.
type Heads<B> = (Tensor<B, 4>, Tensor<B, 4>, Tensor<B, 4>);

/// The residual stream between sublayers: `x`, and the output of the sublayer before, not yet
/// added to it; the next RMSNorm adds it in the same launch.
struct Residual<B: ModelBackend> {
    x: Tensor<B, 2>,
    pending: Option<Tensor<B, 2>>,
}

impl<B: ModelBackend> Residual<B> {
    fn new(x: Tensor<B, 2>) -> Self {
        Residual { x, pending: None }
    }

    fn with(x: Tensor<B, 2>, pending: Tensor<B, 2>) -> Self {
        Residual {
            x,
            pending: Some(pending),
        }
    }

    /// The same rows of both.
    fn map(self, f: impl Fn(Tensor<B, 2>) -> Tensor<B, 2>) -> Self {
        Residual {
            x: f(self.x),
            pending: self.pending.map(&f),
        }
    }
}

/// A pass of at least this many rows (a prefill slice, not a decode step of a few sequences)
/// frees enough tensors to be worth handing their pages back: a decode step would only fault
/// its next step's buffers in again.
const ROWS_WORTH_RELEASING: usize = 64;

fn released_after<B: ModelBackend>(rows: usize) {
    if rows >= ROWS_WORTH_RELEASING {
        B::release_freed_memory();
    }
}

/// Recompute slots: one per token, increasing, below the cache's length.
fn check_slots_below(tokens: &[u32], slots: &[usize], len: usize) -> Result<()> {
    if slots.len() != tokens.len() {
        return Err(ModelError::Forward(format!(
            "{} slots for {} tokens",
            slots.len(),
            tokens.len()
        )));
    }
    if slots.windows(2).any(|w| w[0] >= w[1]) || slots.last().is_some_and(|&s| s >= len) {
        return Err(ModelError::Forward(format!(
            "recompute slots must increase and lie below the cache length {len}"
        )));
    }
    Ok(())
}
