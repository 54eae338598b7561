//! Engine flags shared by `generate`, `chat`, `demo` (and later `replay`).

use clap::Args;
use kvb_engine::{EngineConfig, GenerationMode, RecomputeStrategy};
use std::path::PathBuf;

/// Cache settings of the engine.
#[derive(Args, Debug, Clone)]
pub struct EngineArgs {
    /// RAM budget of the K/V chunk store, in bytes.
    #[arg(long, default_value_t = 2 << 30)]
    pub max_cache_bytes: usize,
    /// Tokens per cached chunk.
    #[arg(long, default_value_t = 128)]
    pub chunk_size: usize,
    /// Repair of chunks reused at another position: selective, cacheblend or none.
    #[arg(long, default_value = "selective")]
    pub recompute_strategy: RecomputeStrategy,
    /// Selective repair: tokens recomputed after each seam.
    #[arg(long, default_value_t = 16)]
    pub recompute_overlap: usize,
    /// CacheBlend: fraction of a reused chunk recomputed.
    #[arg(long, default_value_t = 0.15)]
    pub recompute_ratio: f32,
    /// Bits of stored K/V: 16 (exact), 8 or 4 (KIVI).
    #[arg(long, default_value_t = 16)]
    pub kv_bits: u8,
    /// A disk tier for the cache (kept across runs).
    #[arg(long)]
    pub disk_dir: Option<PathBuf>,
    /// Cut chunks at sentence ends within this many tokens (0 = fixed cuts).
    #[arg(long, default_value_t = 0)]
    pub boundary_window: usize,
    /// Tokens of context re-encoded before each seam.
    #[arg(long, default_value_t = 0)]
    pub overlap_k: usize,
    /// First tokens always computed fresh.
    #[arg(long, default_value_t = 0)]
    pub sink_tokens: usize,
    /// Do not keep the last request's K/V resident: every reuse then reads the chunk store.
    #[arg(long)]
    pub no_resident: bool,
    /// baseline, prefix or chunk-reuse.
    #[arg(long, default_value = "chunk-reuse")]
    pub mode: GenerationMode,
}

impl EngineArgs {
    /// The engine configuration these flags describe.
    pub fn config(&self, strict: bool) -> EngineConfig {
        EngineConfig {
            chunk_size: self.chunk_size,
            recompute_strategy: self.recompute_strategy,
            recompute_overlap: self.recompute_overlap,
            recompute_ratio: self.recompute_ratio,
            kv_bits: self.kv_bits,
            disk_dir: self.disk_dir.clone(),
            boundary_window: self.boundary_window,
            overlap_k: self.overlap_k,
            sink_tokens: self.sink_tokens,
            strict,
            keep_resident: !self.no_resident,
            ..EngineConfig::new(self.max_cache_bytes)
        }
    }
}
