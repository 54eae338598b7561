//! Engine and request settings.

use kvb_model::generate::SamplingParams;
use kvb_repair::RecomputeStrategy;
use kvb_store::EvictionPolicy;
use std::path::PathBuf;

/// Settings of an [`crate::Engine`], after kvboost's `from_pretrained` keywords.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Tokens per cached chunk.
    pub chunk_size: usize,
    /// A last chunk shorter than this is not cached.
    pub min_tail: usize,
    /// RAM budget of the chunk store in bytes (required, > 0).
    pub max_cache_bytes: usize,
    /// Which chunk leaves RAM first.
    pub eviction: EvictionPolicy,
    /// How reused chunks found at another position are repaired.
    pub recompute_strategy: RecomputeStrategy,
    /// Selective: tokens recomputed after each seam.
    pub recompute_overlap: usize,
    /// CacheBlend: the layer whose keys pick the tokens to recompute (1, as in the paper).
    pub cacheblend_probe_layer: usize,
    /// CacheBlend: fraction of a reused chunk's tokens recomputed.
    pub recompute_ratio: f32,
    /// Bits of stored K/V: 16 keeps f32 (exact), 8 or 4 use KIVI.
    pub kv_bits: u8,
    /// A disk tier for chunks evicted from RAM (survives restarts).
    pub disk_dir: Option<PathBuf>,
    /// Disk budget in bytes.
    pub disk_max_bytes: u64,
    /// Cut chunks at sentence ends within this many tokens of the fixed size (0 = fixed cuts).
    pub boundary_window: usize,
    /// Tokens of context before a seam also re-encoded (selective repair).
    pub overlap_k: usize,
    /// The first tokens of a prompt are always computed fresh (attention sinks).
    pub sink_tokens: usize,
    /// Refuse unknown architectures.
    pub strict: bool,
    /// Keep the last request's K/V where it was computed, so a request that extends it continues
    /// in place without copying (one sequence's K/V: at most the context length's worth).
    pub keep_resident: bool,
}

impl EngineConfig {
    /// Defaults (chunk 128, selective repair, f32 K/V) with a RAM budget.
    pub fn new(max_cache_bytes: usize) -> Self {
        EngineConfig {
            chunk_size: 128,
            min_tail: 32,
            max_cache_bytes,
            eviction: EvictionPolicy::default(),
            recompute_strategy: RecomputeStrategy::Selective,
            recompute_overlap: 16,
            cacheblend_probe_layer: 1,
            recompute_ratio: 0.15,
            kv_bits: 16,
            disk_dir: None,
            disk_max_bytes: 4 << 30,
            boundary_window: 0,
            overlap_k: 0,
            sink_tokens: 0,
            strict: true,
            keep_resident: true,
        }
    }
}

/// How a request uses the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GenerationMode {
    /// A full prefill; the cache is neither read nor written.
    Baseline,
    /// Only the longest cached prefix in whole chunks, like vLLM's prefix caching.
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
    /// Only the first this many prompt tokens are stored for reuse (`None`: the whole prompt and
    /// the generated tokens).
    pub cacheable_prefix_len: Option<usize>,
}

impl Default for GenerateOptions {
    fn default() -> Self {
        GenerateOptions {
            max_new_tokens: 64,
            mode: GenerationMode::ChunkReuse,
            sampling: SamplingParams::default(),
            stop_strings: Vec::new(),
            cacheable_prefix_len: None,
        }
    }
}
