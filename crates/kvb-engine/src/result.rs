//! What a request reports.

use std::time::Duration;

/// Time spent in each stage of a request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StageTimes {
    /// Prompt to token ids.
    pub tokenize: Duration,
    /// Chunking, keying and store lookups.
    pub lookup: Duration,
    /// Placing cached K/V in the live cache (decoding, dequantizing, re-rotating, uploading).
    pub assemble: Duration,
    /// Seam repair: probing and recomputing, except the recompute of the last reused run, which
    /// shares the live prefill's forward pass.
    pub repair: Duration,
    /// Running the model over the tokens not covered by the cache.
    pub live_prefill: Duration,
    /// Generating tokens after the first.
    pub decode: Duration,
    /// Storing new chunks.
    pub store: Duration,
}

/// The outcome of [`crate::Engine::generate`].
#[derive(Debug, Clone)]
pub struct GenerationResult {
    /// Generated text (no special tokens, no stop string).
    pub output_text: String,
    /// Generated token ids.
    pub token_ids: Vec<u32>,
    /// From the call of `generate` to the moment the first token id was known: tokenization,
    /// lookup, assembly, dequantization, repair and prefill all included.
    pub ttft_ms: f64,
    /// From the call to the end, storing included.
    pub total_ms: f64,
    /// Generated tokens per second of decoding (after the first token).
    pub tokens_per_sec: f64,
    /// `cached_tokens / prompt_tokens`.
    pub kv_reuse_ratio: f64,
    /// Prompt length.
    pub prompt_tokens: usize,
    /// Prompt tokens whose K/V came from the cache.
    pub cached_tokens: usize,
    /// Of `cached_tokens`, those continued in place from the previous request's resident K/V
    /// (no chunk lookup, no copy).
    pub resident_tokens: usize,
    /// Cached tokens recomputed by repair.
    pub recomputed_tokens: usize,
    /// Chunks reused by prefix key (exact, in context).
    pub exact_chunks: usize,
    /// Chunks reused by content key (re-rotated, repaired).
    pub approximate_chunks: usize,
    /// Per-stage times.
    pub stages: StageTimes,
    /// Logits of the first generated position (for fidelity checks).
    pub first_logits: Vec<f32>,
}

/// The outcome of [`crate::Engine::warm`].
#[derive(Debug, Clone, PartialEq)]
pub struct WarmResult {
    /// Chunks newly stored.
    pub chunks_stored: usize,
    /// Tokens of the text.
    pub tokens: usize,
    /// Bytes newly stored.
    pub bytes: usize,
}
