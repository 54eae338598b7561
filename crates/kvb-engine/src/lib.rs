//! # kvb-engine: chunk-level K/V reuse
//!
//! The product: an [`Engine`] serves prompts that repeat long context by reusing K/V it has already
//! computed. The path of a request ([`Engine::generate`]):
//!
//! 1. tokenize; split into chunks (kvb-chunk) keyed under the engine's namespace (kvb-hash: model
//!    fingerprint, dtype, chunking, K/V bits), so no key can mix models or settings;
//! 2. look up the longest cached prefix **to the token**: first against the *resident sequence*
//!    (the previous request's K/V, still where the model computed it: a chat's next turn or another
//!    question on the same file continues it in place, with no copy), then in kvb-store's radix
//!    index (chunks stored from earlier prefills *in context*, so their K/V is exactly what a
//!    prefill computes); with `ChunkReuse`, also look up the remaining chunks by content key
//!    anywhere in the store;
//! 3. assemble: the exact prefix as is; a chunk found elsewhere is re-rotated from its stored
//!    positions to its new ones (RoPE) and repaired (kvb-repair: selective or CacheBlend; a chunk
//!    found by content always gets CacheBlend);
//! 4. run the model only over the tokens not covered (at least the last one), decode;
//! 5. store the new chunks of the prompt *and of the generated tokens* from this request's own
//!    K/V, so the next turn of a chat hits without `warm`.
//!
//! Promises (tested in `tests/`): with exact prefix reuse, greedy output is identical to Baseline
//! and first-token logits agree within float tolerance (not bit for bit: GEMM blocking differs
//! with the number of rows computed); interior reuse with repair stays within stated fidelity
//! bounds; a prompt longer than the context is an error; TTFT is measured from the call of
//! `generate` to the moment the first token id is known, everything included (tokenization,
//! lookup, dequantization, re-rotation, repair, prefill).
#![warn(missing_docs)]

pub mod blocks;
mod config;
mod engine;
mod fidelity;
mod fingerprint;
mod kv_transfer;
mod result;

pub use config::{EngineConfig, GenerateOptions, GenerationMode};
pub use engine::Engine;
pub use fidelity::{kl_divergence, token_agreement, FidelityReport};
pub use fingerprint::model_fingerprint;
pub use kvb_repair::RecomputeStrategy;
pub use kvb_store::{EvictionPolicy, StoreStats};
pub use result::{GenerationResult, StageTimes, WarmResult};

/// Everything that can go wrong in the engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// Loading or running the model failed.
    #[error(transparent)]
    Model(#[from] kvb_model::ModelError),
    /// The chunk store failed.
    #[error(transparent)]
    Store(#[from] kvb_store::StoreError),
    /// Invalid settings.
    #[error("engine config: {0}")]
    Config(String),
    /// The prompt does not fit the model's context.
    #[error("the prompt has {tokens} tokens; the model's context holds {context}")]
    PromptTooLong {
        /// Prompt length.
        tokens: usize,
        /// The model's context.
        context: usize,
    },
    /// Cached K/V does not fit the model or could not be read.
    #[error("cache: {0}")]
    Cache(String),
    /// A file could not be read.
    #[error("{0}")]
    Io(String),
}
