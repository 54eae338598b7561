//! What a request reports, and what the pool reports.

use kvb_model::generate::{StopReason, TokenLogprobs};
use kvb_model::HostWork;
use std::time::Duration;

/// Time spent in each stage of a request.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StageTimes {
    /// Prompt to token ids.
    pub tokenize: Duration,
    /// Waiting for the scheduler to admit it (room in the pool, a free running slot).
    pub queue: Duration,
    /// Planning: the pool's radix tree, the chunk store's prefix and content lookups.
    pub lookup: Duration,
    /// Placing cached K/V in the sequence's blocks (copy-on-write of a partly matched block,
    /// store chunks decoded, dequantized and re-rotated into fresh blocks).
    pub assemble: Duration,
    /// Seam repair: probing; the recompute itself shares the live prefill's forward passes.
    pub repair: Duration,
    /// Forward passes that computed the sequence's prompt rows, from its first to its last (other
    /// sequences' rows ran in the same passes).
    pub live_prefill: Duration,
    /// From the first token to the last.
    pub decode: Duration,
    /// Writing the sequence's new exact chunks to the chunk store.
    pub store: Duration,
}

/// Where the cached part of a prompt came from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CachedTokens {
    /// Resident blocks of the pool, read in place (no copy); a block matched in part is copied.
    pub pool: usize,
    /// The chunk store's prefix (RAM or disk tier), written into fresh blocks.
    pub store: usize,
    /// Chunks found anywhere in the prompt by content, re-rotated and repaired.
    pub interior: usize,
    /// Of all these, tokens whose K/V is not what a full prefill computes (interior chunks, and
    /// repaired blocks continued from the pool).
    pub approximate: usize,
}

impl CachedTokens {
    /// All cached tokens.
    pub fn total(&self) -> usize {
        self.pool + self.store + self.interior
    }
}

/// The outcome of [`crate::Engine::generate`].
#[derive(Debug, Clone)]
pub struct GenerationResult {
    /// Generated text (no special tokens, no stop string).
    pub output_text: String,
    /// Generated token ids.
    pub token_ids: Vec<u32>,
    /// From the request's arrival to the moment the first token id was known: tokenization,
    /// queueing, lookup, assembly, dequantization, repair and prefill all included.
    pub ttft_ms: f64,
    /// From the arrival to the end, storing included.
    pub total_ms: f64,
    /// Generated tokens per second of decoding (after the first token).
    pub tokens_per_sec: f64,
    /// `cached_tokens / prompt_tokens`.
    pub kv_reuse_ratio: f64,
    /// Prompt length.
    pub prompt_tokens: usize,
    /// Prompt tokens whose K/V came from the cache.
    pub cached_tokens: usize,
    /// Where they came from.
    pub cached: CachedTokens,
    /// Cached tokens recomputed by repair.
    pub recomputed_tokens: usize,
    /// Forward passes that computed some of the prompt's rows: chunked prefill spreads a prompt
    /// longer than a step's budget over several, each shared with other sequences' rows.
    pub prefill_passes: usize,
    /// Store chunks reused by prefix key (exact, in context).
    pub exact_chunks: usize,
    /// Store chunks reused by content key (re-rotated, repaired).
    pub approximate_chunks: usize,
    /// Times the sequence was preempted (its blocks given up for room, recomputed later).
    pub preemptions: usize,
    /// Chunks the request added to the chunk store when it finished. Zero where its blocks stay
    /// resident: the store gets those later, on eviction or on a content hit, so that the same
    /// K/V is not held twice (a warm, which generates nothing, stores at once).
    pub stored_chunks: usize,
    /// Bytes of those chunks.
    pub stored_bytes: usize,
    /// Per-stage times.
    pub stages: StageTimes,
    /// Logits of the first generated position (for fidelity checks; empty without generation).
    pub first_logits: Vec<f32>,
    /// Logits of every generated position, in order, with [`crate::GenerateOptions::keep_logits`]
    /// (empty otherwise).
    pub logits: Vec<Vec<f32>>,
    /// Each generated token's log-probability and most likely alternatives, when
    /// [`crate::GenerateOptions::logprobs`] asks (empty otherwise).
    pub logprobs: Vec<TokenLogprobs>,
    /// Why generation ended (`None` when nothing was to be generated).
    pub stop_reason: Option<StopReason>,
    /// Forward passes in which it decoded a token.
    pub decode_steps: usize,
    /// The host's work for those passes (kernel launches, uploads, reads), each pass whole:
    /// shared with the other sequences in it. Per step it is what a GPU decode step waits on.
    pub decode_host_work: HostWork,
}

/// What is known of a request once its first token is: sent as [`crate::Event::Started`] just
/// before that token, so a server can report TTFT and reuse before the answer ends.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Started {
    /// From the request's arrival to the first token id.
    pub ttft_ms: f64,
    /// Prompt length.
    pub prompt_tokens: usize,
    /// Prompt tokens whose K/V came from the cache, and where from.
    pub cached: CachedTokens,
    /// Cached tokens recomputed by repair.
    pub recomputed_tokens: usize,
}

impl Started {
    /// Cached prompt tokens (at most the prompt).
    pub fn cached_tokens(&self) -> usize {
        self.cached.total().min(self.prompt_tokens)
    }

    /// `cached_tokens / prompt_tokens`.
    pub fn kv_reuse_ratio(&self) -> f64 {
        self.cached_tokens() as f64 / self.prompt_tokens.max(1) as f64
    }
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

/// The pool's state ([`crate::Engine::paged_stats`]).
#[derive(Debug, Clone, Default, PartialEq)]
#[cfg_attr(feature = "schema", derive(serde::Serialize, utoipa::ToSchema))]
pub struct PoolStats {
    /// Token slots per block.
    pub block_size: usize,
    /// Bytes of K/V one block holds (every layer).
    pub block_bytes: usize,
    /// The budget in blocks.
    pub blocks_total: usize,
    /// Blocks held by sequences or the radix tree.
    pub blocks_used: usize,
    /// Blocks read by more than one holder (sequences, the tree).
    pub blocks_shared: usize,
    /// Blocks indexed by the radix tree (resident).
    pub blocks_resident: usize,
    /// Of those, blocks holding repaired (approximate) K/V.
    pub blocks_approximate: usize,
    /// Most blocks in use at once so far.
    pub peak_blocks_used: usize,
    /// Bytes that sharing saves: every reference to a block beyond its first is a copy not made.
    pub bytes_saved_by_sharing: usize,
    /// Resident sequences: leaves of the radix tree.
    pub resident_sequences: usize,
    /// Sequences running now.
    pub running: usize,
    /// Requests waiting to be admitted.
    pub waiting: usize,
    /// Blocks evicted from the tree for room.
    pub evictions: u64,
    /// Sequences preempted for room.
    pub preemptions: u64,
    /// Requests served (finished, failed or cancelled).
    pub requests: u64,
}

impl PoolStats {
    /// Bytes of K/V the pool holds now.
    pub fn bytes_used(&self) -> usize {
        self.blocks_used * self.block_bytes
    }

    /// The budget in bytes.
    pub fn bytes_total(&self) -> usize {
        self.blocks_total * self.block_bytes
    }
}
