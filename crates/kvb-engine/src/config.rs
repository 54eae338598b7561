//! Engine and request settings. Every default is defined here, once ([`EngineConfig::default`],
//! [`GenerateOptions::default`]); the command line reads its defaults from them.

use kvb_model::generate::SamplingParams;
use kvb_model::{ActivationPrecision, FloatDtype, Model, ModelBackend, WeightPrecision};
use kvb_quant::{Bits, QuantConfig};
use kvb_repair::RecomputeStrategy;
use kvb_store::{EvictionPolicy, KvFormat, RemoteConfig};
use std::path::PathBuf;

/// The precision of the K/V the chunk store keeps (the pool's own is [`PoolDtype`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvPrecision {
    /// As computed (f32): exact reuse.
    #[default]
    F32,
    /// Halved to f16.
    F16,
    /// Halved to bf16.
    Bf16,
    /// KIVI, 8 bits (keys per channel, values per token, groups of 32).
    Int8,
    /// KIVI, 4 bits.
    Int4,
    /// KIVI, 2 bits.
    Int2,
}

impl KvPrecision {
    /// The name `FromStr` reads back.
    pub fn as_str(self) -> &'static str {
        match self {
            KvPrecision::F32 => "f32",
            KvPrecision::F16 => "f16",
            KvPrecision::Bf16 => "bf16",
            KvPrecision::Int8 => "int8",
            KvPrecision::Int4 => "int4",
            KvPrecision::Int2 => "int2",
        }
    }

    /// The store's format for it.
    pub fn format(self) -> KvFormat {
        let kivi = |bits| {
            KvFormat::Kivi(QuantConfig {
                bits,
                group_size: 32,
            })
        };
        match self {
            KvPrecision::F32 => KvFormat::F32,
            KvPrecision::F16 => KvFormat::F16,
            KvPrecision::Bf16 => KvFormat::Bf16,
            KvPrecision::Int8 => kivi(Bits::Eight),
            KvPrecision::Int4 => kivi(Bits::Four),
            KvPrecision::Int2 => kivi(Bits::Two),
        }
    }
}

impl std::fmt::Display for KvPrecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for KvPrecision {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "f32" | "fp32" => KvPrecision::F32,
            "f16" | "fp16" => KvPrecision::F16,
            "bf16" => KvPrecision::Bf16,
            "int8" | "kivi8" => KvPrecision::Int8,
            "int4" | "kivi4" => KvPrecision::Int4,
            "int2" | "kivi2" => KvPrecision::Int2,
            other => {
                return Err(format!(
                    "unknown K/V precision `{other}` (f32, f16, bf16, int8, int4, int2)"
                ))
            }
        })
    }
}

/// The element type of the engine's K/V pool (what decode reads every step).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PoolDtype {
    /// The backend's float type where it computes in half precision (a GPU with `--dtype
    /// f16` or `bf16`); else f16 where the backend holds it and the weights are quantized to
    /// integers (a GGUF's Q4/Q8 blocks: the model's own rounding dwarfs f16's, and llama.cpp
    /// caches f16 too); f32 otherwise, so an f32 or 16-bit model keeps K/V as computed.
    #[default]
    Auto,
    /// This type, whatever the backend and weights (f16 on the CPU: half the memory and half
    /// the bytes a long decode step reads; bf16 only for a CUDA backend computing in bf16).
    Fixed(FloatDtype),
}

impl PoolDtype {
    /// The names `FromStr` reads.
    pub const NAMES: [&'static str; 4] = ["auto", "f32", "f16", "bf16"];

    /// The precision a pool holds for `model` on backend `B`.
    pub fn resolve<B: ModelBackend>(self, model: &Model<B>) -> FloatDtype {
        match self {
            PoolDtype::Fixed(dtype) => dtype,
            PoolDtype::Auto if FloatDtype::native::<B>() != FloatDtype::F32 => {
                FloatDtype::native::<B>()
            }
            PoolDtype::Auto
                if B::holds_pool_precision(FloatDtype::F16) && model.has_quantized_weights() =>
            {
                FloatDtype::F16
            }
            PoolDtype::Auto => FloatDtype::F32,
        }
    }
}

impl std::fmt::Display for PoolDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PoolDtype::Auto => f.write_str("auto"),
            PoolDtype::Fixed(dtype) => dtype.fmt(f),
        }
    }
}

impl std::str::FromStr for PoolDtype {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(PoolDtype::Auto),
            other => other
                .parse::<FloatDtype>()
                .map(PoolDtype::Fixed)
                .map_err(|_| {
                    format!(
                        "unknown K/V pool precision `{other}` (expected one of {})",
                        PoolDtype::NAMES.join(", ")
                    )
                }),
        }
    }
}

/// Settings of an [`crate::Engine`], after kvboost's `from_pretrained` keywords.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Tokens per cached chunk in the chunk store.
    pub chunk_size: usize,
    /// A last chunk shorter than this is not stored.
    pub min_tail: usize,
    /// RAM budget of the chunk store in bytes (required, > 0).
    pub max_cache_bytes: usize,
    /// Which chunk leaves the store's RAM first.
    pub eviction: EvictionPolicy,
    /// How reused chunks found at another position are repaired.
    pub recompute_strategy: RecomputeStrategy,
    /// Selective: tokens recomputed after each seam.
    pub recompute_overlap: usize,
    /// CacheBlend: the layer whose keys pick the tokens to recompute (1, as in the paper).
    pub cacheblend_probe_layer: usize,
    /// CacheBlend: layers its selection is refined over from the probe layer on (1: one
    /// selection; more: the paper's gradual filtering, each layer keeping half the share of the
    /// one before, down to the ratio).
    pub cacheblend_filter_layers: usize,
    /// CacheBlend: fraction of a reused chunk's tokens recomputed (with a threshold: at most).
    pub recompute_ratio: f32,
    /// CacheBlend's adaptive budget: recompute every token whose keys at the probe layer moved
    /// by more than this share of their squared norm in the new context (`None`: a fixed ratio).
    pub recompute_threshold: Option<f32>,
    /// Precision of the K/V the chunk store keeps.
    pub kv_precision: KvPrecision,
    /// A disk tier for chunks evicted from RAM (survives restarts).
    pub disk_dir: Option<PathBuf>,
    /// Disk budget in bytes.
    pub disk_max_bytes: u64,
    /// A remote tier that several engines share (Redis or Valkey): every chunk stored is also
    /// written there in the background, and each request's chunks are looked up there (one round
    /// trip) when neither the pool nor the local tiers have them.
    pub remote_cache: Option<RemoteConfig>,
    /// Cut chunks at sentence ends within this many tokens of the fixed size (0 = fixed cuts).
    pub boundary_window: usize,
    /// The first tokens of a prompt are always computed fresh (attention sinks).
    pub sink_tokens: usize,
    /// Refuse unknown architectures.
    pub strict: bool,
    /// The precision the model's weights are held in.
    pub weights: WeightPrecision,
    /// How the model's products quantize their input rows (`Q8`: faster, slightly lossy).
    pub activations: ActivationPrecision,
    /// Token slots per block of the K/V pool (a power of two).
    pub block_size: usize,
    /// The element type of the K/V pool.
    pub pool_dtype: PoolDtype,
    /// Byte budget of the K/V pool (`None`: a quarter of the machine's memory, see
    /// [`default_pool_bytes`]).
    pub max_pool_bytes: Option<usize>,
    /// Keep finished sequences' blocks in the pool (indexed by their tokens) until it needs the
    /// room; without it a sequence's blocks are freed when it ends, and every reuse reads the
    /// chunk store.
    pub keep_resident: bool,
    /// Keep repaired (approximate) blocks resident too, so the next request behind the same
    /// preamble and document continues them instead of repairing again. Without it, every
    /// approximate hit is re-assembled from the store and repaired.
    pub reuse_repaired: bool,
    /// Token rows one forward pass runs at most: the next slice of each prefilling sequence
    /// (chunked prefill) after one row for each decoding sequence.
    pub max_batch_tokens: usize,
    /// While sequences are decoding, prefill slices take at most this many rows per step: a
    /// step's time is every decoding sequence's time per token, and a 512-row slice would stall
    /// them for over a second on two cores (measured: 16 chats decoding at 4 tokens/s each behind
    /// other chats' prefills). Prefill alone still uses `max_batch_tokens`.
    pub prefill_tokens_while_decoding: usize,
    /// Sequences running at once; further requests wait.
    pub max_running: usize,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            chunk_size: 128,
            min_tail: 32,
            max_cache_bytes: 2 << 30,
            eviction: EvictionPolicy::default(),
            recompute_strategy: RecomputeStrategy::CacheBlend,
            recompute_overlap: 16,
            cacheblend_probe_layer: 1,
            cacheblend_filter_layers: 1,
            recompute_ratio: 0.15,
            recompute_threshold: None,
            kv_precision: KvPrecision::F32,
            disk_dir: None,
            disk_max_bytes: 4 << 30,
            remote_cache: None,
            boundary_window: 0,
            sink_tokens: 0,
            strict: true,
            weights: WeightPrecision::Auto,
            activations: ActivationPrecision::F32,
            block_size: 32,
            pool_dtype: PoolDtype::Auto,
            max_pool_bytes: None,
            keep_resident: true,
            reuse_repaired: true,
            max_batch_tokens: 512,
            prefill_tokens_while_decoding: 64,
            max_running: 64,
        }
    }
}

impl EngineConfig {
    /// The defaults with a chunk-store RAM budget.
    pub fn new(max_cache_bytes: usize) -> Self {
        EngineConfig {
            max_cache_bytes,
            ..Default::default()
        }
    }

    /// The pool budget in bytes: the configured one, or [`default_pool_bytes`].
    pub fn pool_bytes(&self) -> usize {
        self.max_pool_bytes.unwrap_or_else(default_pool_bytes)
    }
}

/// A quarter of the machine's physical memory (Linux `MemTotal`; 4 GiB where it cannot be read),
/// at least 256 MiB. The pool's memory is taken as blocks are first written, so an idle engine
/// costs nothing; the budget only bounds what many long sequences may hold at once.
pub fn default_pool_bytes() -> usize {
    let total = physical_memory().unwrap_or(16 << 30);
    (total / 4).max(256 << 20)
}

/// The machine's physical memory in bytes (Linux `MemTotal`), where it can be read.
pub(crate) fn physical_memory() -> Option<usize> {
    let info = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = info.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: usize = kib.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

/// How a request uses the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GenerationMode {
    /// A full prefill; the cache is neither read nor written.
    Baseline,
    /// Only the longest cached prefix in whole blocks and chunks, exact only, like vLLM's prefix
    /// caching.
    PrefixCache,
    /// The longest cached prefix to the token, plus chunks found anywhere else in the prompt
    /// (re-rotated and repaired).
    ChunkReuse,
}

impl GenerationMode {
    /// The name `FromStr` reads back: `baseline`, `prefix` or `chunk-reuse`.
    pub fn as_str(self) -> &'static str {
        match self {
            GenerationMode::Baseline => "baseline",
            GenerationMode::PrefixCache => "prefix",
            GenerationMode::ChunkReuse => "chunk-reuse",
        }
    }
}

impl std::fmt::Display for GenerationMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for GenerationMode {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "baseline" => Ok(GenerationMode::Baseline),
            "prefix" | "prefix-cache" | "prefixcache" => Ok(GenerationMode::PrefixCache),
            "chunk-reuse" | "chunkreuse" | "reuse" => Ok(GenerationMode::ChunkReuse),
            other => Err(format!(
                "unknown mode `{other}` (baseline, prefix, chunk-reuse)"
            )),
        }
    }
}

/// Settings of one request.
#[derive(Debug, Clone)]
pub struct GenerateOptions {
    /// Upper bound on generated tokens.
    pub max_new_tokens: usize,
    /// Cache use.
    pub mode: GenerationMode,
    /// Greedy (temperature 0) or sampled.
    pub sampling: SamplingParams,
    /// Generation stops at any of these.
    pub stop_strings: Vec<String>,
    /// Only the first this many prompt tokens are kept for reuse (`None`: the whole prompt and
    /// the generated tokens).
    pub cacheable_prefix_len: Option<usize>,
    /// Teacher forcing: generate exactly these tokens, whatever the model predicts (sampling
    /// resumes if `max_new_tokens` goes past them). With [`GenerateOptions::keep_logits`] this
    /// scores a reference answer position by position, as [`crate::Engine::verify`] does.
    pub forced_tokens: Vec<u32>,
    /// Return the logits of every generated position ([`crate::GenerationResult::logits`]), not
    /// only the first's: a vocabulary's worth of floats per token.
    pub keep_logits: bool,
    /// Report each generated token's log-probability and this many of the most likely tokens at
    /// its position (OpenAI's `logprobs` / `top_logprobs`), on every token event and in
    /// [`crate::GenerationResult::logprobs`]. `None`: nothing.
    pub logprobs: Option<usize>,
    /// Structured output: only text this grammar (a JSON schema, a regex, a Lark grammar)
    /// allows is generated, and generation ends once it is complete.
    pub grammar: Option<kvb_constrain::Grammar>,
    /// Whose cache the request uses (a tenant, a cache salt): its K/V is keyed under the
    /// engine's namespace scoped by these bytes, in the store's tiers and in the pool's tree, so
    /// it is reused only by requests that name the same scope. `None`: the engine's shared cache.
    pub cache_scope: Option<Vec<u8>>,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_new_tokens: 64,
            mode: GenerationMode::ChunkReuse,
            sampling: SamplingParams::default(),
            stop_strings: Vec::new(),
            cacheable_prefix_len: None,
            forced_tokens: Vec::new(),
            keep_logits: false,
            logprobs: None,
            grammar: None,
            cache_scope: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_pool_dtype_name_reads_back() {
        for name in PoolDtype::NAMES {
            let dtype: PoolDtype = name.parse().unwrap();
            assert_eq!(dtype.to_string(), name);
        }
        assert_eq!("auto".parse(), Ok(PoolDtype::Auto));
        assert_eq!("F16".parse(), Ok(PoolDtype::Fixed(FloatDtype::F16)));
        let err = "f8".parse::<PoolDtype>().unwrap_err();
        assert!(err.contains("f8") && err.contains("auto"), "{err}");
    }
}
