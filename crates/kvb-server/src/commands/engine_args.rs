//! Engine flags shared by `generate`, `chat`, `demo` and `replay`. Their defaults are the
//! engine's own ([`EngineConfig::default`]), read here, never restated.

use clap::Args;
use kvb_engine::{
    EngineConfig, GenerationMode, KvPrecision, PoolDtype, RecomputeStrategy, RemoteConfig,
};
use std::path::PathBuf;
use std::time::Duration;

fn defaults() -> EngineConfig {
    EngineConfig::default()
}

/// Cache and scheduling settings of the engine.
#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    /// RAM budget of the chunk store (the K/V pool's second tier), in bytes.
    #[arg(long, default_value_t = defaults().max_cache_bytes)]
    pub max_cache_bytes: usize,
    /// Byte budget of the K/V pool (default: a quarter of the machine's memory).
    #[arg(long)]
    pub max_pool_bytes: Option<usize>,
    /// Token slots per block of the K/V pool (a power of two).
    #[arg(long, default_value_t = defaults().block_size)]
    pub block_size: usize,
    /// Element type of the K/V pool: auto (a GPU's --dtype; on the CPU f16 when the weights are
    /// quantized to integers, as a GGUF's Q4/Q8, f32 otherwise), f32 or f16 (CPU), or the
    /// --dtype of a GPU backend.
    #[arg(long, default_value_t = defaults().pool_dtype)]
    pub pool_dtype: PoolDtype,
    /// Token rows one forward pass runs at most (decode rows, then prefill slices).
    #[arg(long, default_value_t = defaults().max_batch_tokens)]
    pub max_batch_tokens: usize,
    /// While sequences decode, prefill slices take at most this many rows per step (their time
    /// per token is the step's).
    #[arg(long, default_value_t = defaults().prefill_tokens_while_decoding)]
    pub prefill_tokens_while_decoding: usize,
    /// Sequences running at once; further requests wait.
    #[arg(long, default_value_t = defaults().max_running)]
    pub max_running: usize,
    /// Tokens per chunk of the chunk store.
    #[arg(long, default_value_t = defaults().chunk_size)]
    pub chunk_size: usize,
    /// Repair of chunks reused at another position: cacheblend, selective (the tokens after each
    /// seam only) or none.
    #[arg(long, default_value_t = defaults().recompute_strategy)]
    pub recompute_strategy: RecomputeStrategy,
    /// Selective repair: tokens recomputed after each seam.
    #[arg(long, default_value_t = defaults().recompute_overlap)]
    pub recompute_overlap: usize,
    /// CacheBlend: fraction of a reused span recomputed.
    #[arg(long, default_value_t = defaults().recompute_ratio)]
    pub recompute_ratio: f32,
    /// CacheBlend's adaptive budget: recompute each reused token whose keys moved by more than
    /// this share of their squared norm in the new context (then --recompute-ratio is the most
    /// recomputed). Without it, a fixed ratio.
    #[arg(long)]
    pub recompute_threshold: Option<f32>,
    /// CacheBlend: the first layer whose keys measure each reused token's deviation (the layers
    /// before it run over the whole span).
    #[arg(long, default_value_t = defaults().cacheblend_probe_layer)]
    pub cacheblend_probe_layer: usize,
    /// CacheBlend: layers its selection is refined over (1: one selection at the probe layer;
    /// more: gradual filtering, each layer keeping half the share of the one before).
    #[arg(long, default_value_t = defaults().cacheblend_filter_layers)]
    pub cacheblend_filter_layers: usize,
    /// Precision of the K/V the chunk store keeps: f32 (exact), f16, bf16, int8, int4 or int2
    /// (KIVI).
    #[arg(long, default_value_t = defaults().kv_precision)]
    pub kv_precision: KvPrecision,
    /// A disk tier for the chunk store (kept across runs).
    #[arg(long)]
    pub disk_dir: Option<PathBuf>,
    /// A chunk store shared with other kvb processes: redis://HOST:PORT/DB (Redis or Valkey).
    /// Chunks computed here are written there in the background and read from there when no
    /// local tier has them; when it is down or slow, requests go on with the local tiers.
    #[arg(long, value_name = "URL")]
    pub remote_cache: Option<String>,
    /// Timeout of every call to the remote cache (connect, read, write), in milliseconds.
    #[arg(long, default_value_t = RemoteConfig::new("").timeout.as_millis() as u64)]
    pub remote_timeout_ms: u64,
    /// Cut chunks at sentence ends within this many tokens (0 = fixed cuts).
    #[arg(long, default_value_t = defaults().boundary_window)]
    pub boundary_window: usize,
    /// First tokens always computed fresh.
    #[arg(long, default_value_t = defaults().sink_tokens)]
    pub sink_tokens: usize,
    /// Free a sequence's blocks when it ends: every reuse then reads the chunk store.
    #[arg(long)]
    pub no_resident: bool,
    /// Do not keep repaired blocks resident: every moved document is repaired again from the
    /// store.
    #[arg(long)]
    pub no_reuse_repaired: bool,
    /// baseline, prefix or chunk-reuse.
    #[arg(long, default_value = "chunk-reuse")]
    pub mode: GenerationMode,
}

impl EngineArgs {
    /// The engine configuration these flags describe.
    pub fn config(&self, model: &super::generate::ModelArgs) -> EngineConfig {
        EngineConfig {
            max_cache_bytes: self.max_cache_bytes,
            max_pool_bytes: self.max_pool_bytes,
            block_size: self.block_size,
            pool_dtype: self.pool_dtype,
            max_batch_tokens: self.max_batch_tokens,
            prefill_tokens_while_decoding: self.prefill_tokens_while_decoding,
            max_running: self.max_running,
            chunk_size: self.chunk_size,
            recompute_strategy: self.recompute_strategy,
            recompute_overlap: self.recompute_overlap,
            recompute_ratio: self.recompute_ratio,
            recompute_threshold: self.recompute_threshold,
            cacheblend_filter_layers: self.cacheblend_filter_layers,
            cacheblend_probe_layer: self.cacheblend_probe_layer,
            kv_precision: self.kv_precision,
            disk_dir: self.disk_dir.clone(),
            remote_cache: self.remote_cache.as_ref().map(|url| RemoteConfig {
                timeout: Duration::from_millis(self.remote_timeout_ms.max(1)),
                ..RemoteConfig::new(url.clone())
            }),
            boundary_window: self.boundary_window,
            sink_tokens: self.sink_tokens,
            strict: !model.no_strict,
            weights: model.weights,
            activations: model.activations,
            keep_resident: !self.no_resident,
            reuse_repaired: !self.no_reuse_repaired,
            ..defaults()
        }
    }
}
