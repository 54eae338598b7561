//! Chunk reuse given to candle with kvb's burn-free crates: a Llama-family GGUF run by candle
//! ([`model`]), its K/V cache as candle tensors behind kvb's seam ([`cache`]), and the prompt's
//! chunks reused from `kvb-store` ([`reuse`]). `cargo tree -p candle-chunk-reuse` holds no burn
//! (`cargo xtask ci` checks it).
//!
//! Promises, proved by `tests/reuse.rs` on the default model: exact prefix hits decode the same
//! greedy tokens as candle without the cache; a chunk moved to new positions gets layer 0 keys
//! equal to the keys candle computes there; nothing computed after a moved chunk is stored.

pub mod cache;
pub mod chat;
pub mod model;
pub mod reuse;
pub mod texts;

pub use cache::KvCache;
pub use chat::Chat;
pub use model::CandleLlama;
pub use reuse::{argmax, generate, ChunkReuse, Prefill, PrefillStats};

use std::path::PathBuf;

/// The default model's file name (`cargo xtask fetch-model` puts it in the models folder).
pub const DEFAULT_GGUF: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The default model: `$KVB_MODELS_DIR/<DEFAULT_GGUF>`, else `models/` under the workspace.
pub fn default_model_path() -> PathBuf {
    let dir = std::env::var_os("KVB_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models"));
    dir.join(DEFAULT_GGUF)
}

/// Candle's greedy answer without any cache: the whole prompt in one forward pass.
pub fn plain_greedy(
    model: &CandleLlama,
    tokens: &[u32],
    max_new: usize,
) -> anyhow::Result<(Vec<u32>, std::time::Duration)> {
    let started = std::time::Instant::now();
    let mut prefill = Prefill {
        cache: model.new_cache(),
        logits: Vec::new(),
        stats: PrefillStats::default(),
    };
    prefill.logits = model.forward(tokens, &mut prefill.cache)?;
    let ttft = started.elapsed();
    Ok((generate(model, &mut prefill, max_new)?, ttft))
}
