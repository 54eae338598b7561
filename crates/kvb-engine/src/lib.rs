//! # kvb-engine: K/V reuse, paged and batched
//!
//! The product: an [`Engine`] serves prompts that repeat long context by reusing K/V it has already
//! computed, for many requests at once. Its K/V lives in a *pool* of fixed-size blocks that
//! sequences share: one system prompt behind a hundred chats is held once.
//!
//! The path of a request ([`Engine::submit`], or [`Engine::generate`] on top of it):
//!
//! 1. tokenize; with a shared remote tier ([`EngineConfig::remote_cache`]: Redis or Valkey), ask
//!    it on the submitting thread, in one round trip, for the prompt's chunks the local tiers
//!    lack; the scheduler admits it when its blocks fit ([`scheduler`] order: oldest first);
//! 2. plan what the cache offers ([`plan`]): the longest prefix *resident in the pool*, block by
//!    block through a radix tree over token blocks (read in place: no copy, no dequantization; a
//!    block matched in part is copied, since the request will write the rest of it); then the
//!    chunk store's longest prefix to the token (kvb-store, RAM then disk; keys under the
//!    engine's namespace, so no key can mix models or settings), written into fresh blocks; then,
//!    with `ChunkReuse`, chunks stored anywhere else whose tokens reappear later in the prompt;
//! 3. prefill in slices under a per-step token budget (chunked prefill), batched with every other
//!    running sequence: one forward pass per step advances all of them, one decode row each plus
//!    the next slice of each prefill. A reused run is copied into the sequence's blocks and
//!    re-rotated when the prefill reaches it, and repaired (kvb-repair: CacheBlend or selective),
//!    its repaired slots computed in the same pass as the tokens after it;
//! 4. sample, stream, stop, per sequence;
//! 5. its blocks stay resident, indexed by their tokens (repaired ones flagged approximate), until
//!    the pool needs the room: then least recently used leaves go first, their exact K/V written
//!    back to the store (with a remote tier: at once, so that other engines read them). Its new
//!    exact chunks are indexed by content meanwhile, so a document first read inside a prompt is
//!    found by content later: the first prompt that finds one copies that path into the store
//!    then. Resident K/V is never held twice (but with a remote tier, which needs the copy).
//!
//! Promises (tested in `tests/`):
//! - exact reuse gives greedy output identical to Baseline, with first-token logits equal within
//!   float tolerance (GEMM blocking differs with the rows computed);
//! - a batch does not change what a sequence generates: on the CPU its logits are the same bits
//!   run alone or among others (kvb-model's and kvb-attn's batch-invariant kernels);
//! - the block manager never leaks a block, never lets a sequence write a block another reads,
//!   never exceeds its budget, never evicts a block in use (`tests/block_manager.rs`);
//! - interior reuse with repair stays within stated fidelity bounds;
//! - a resident sequence's chunks are not copied to the store until eviction, a content hit or a
//!   flush (`tests/reuse_tiny.rs`);
//! - the scheduling policy (a step's decode rows and prefill slices, the preemption victim, and
//!   admission) is made of pure functions of the running set, the queue and the pool's room:
//!   every decoder runs, the step's budget holds, the oldest prefill always advances, a younger
//!   prefill never takes rows an older one fits, a full pool preempts the newest, admission keeps
//!   its slots and blocks and lets nothing younger pass a request that waits for room (property
//!   tests in `scheduler/policy/`, no model);
//! - bad requests (an empty prompt, one longer than the context, one the pool could never hold,
//!   a second cancel) are clear errors, and a request's failure never stops the others;
//! - TTFT runs from the request's arrival to the moment its first token id is known: queueing,
//!   tokenization, lookup, copies, dequantization, re-rotation, repair and prefill included.
#![warn(missing_docs)]

/// The paged pool's bookkeeping, from [`kvb_blocks`] (a crate of its own: it needs no tensors).
pub use kvb_blocks as blocks;
mod config;
mod engine;
mod fidelity;
mod fingerprint;
mod grammar;
mod kv_transfer;
pub mod plan;
mod remote_prefetch;
mod request;
mod resident_chunks;
mod result;
pub mod scheduler;
mod sequence;
mod shared;
mod store_write;

pub use config::{
    default_pool_bytes, EngineConfig, GenerateOptions, GenerationMode, KvPrecision, PoolDtype,
};
pub use engine::Engine;
pub use fidelity::{
    compare_positions, kl_divergence, token_agreement, Compared, FidelityReport, FidelitySummary,
    NoiseFloor, PromptFidelity, Reference, VerifyOptions,
};
pub use fingerprint::model_fingerprint;
pub use kvb_constrain::{json_layout, lark_json_schema, Grammar};
pub use kvb_model::generate::{StopReason, TokenLogprobs};
pub use kvb_repair::RecomputeStrategy;
pub use kvb_store::{EvictionPolicy, RemoteConfig, RemoteStats, StoreStats};
pub use request::{Event, EventSink, Request, RequestHandle, RequestTicket};
pub use result::{CachedTokens, GenerationResult, PoolStats, StageTimes, Started, WarmResult};

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
    /// The request's grammar or JSON schema cannot be followed (malformed, unsupported,
    /// unsatisfiable), or this model's tokenizer cannot be constrained.
    #[error("grammar: {0}")]
    Grammar(String),
    /// The prompt has no token.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// The prompt does not fit the model's context.
    #[error("the prompt has {tokens} tokens; the model's context holds {context}")]
    PromptTooLong {
        /// Prompt length.
        tokens: usize,
        /// The model's context.
        context: usize,
    },
    /// The request could never fit the K/V pool.
    #[error(
        "the request may need {tokens} tokens of K/V ({needed_blocks} blocks); the pool holds \
         {pool_blocks} blocks: raise --max-pool-bytes or lower max_new_tokens"
    )]
    PoolTooSmall {
        /// Prompt and generated tokens at most.
        tokens: usize,
        /// Blocks they need.
        needed_blocks: usize,
        /// Blocks the pool's budget holds.
        pool_blocks: usize,
    },
    /// The request was cancelled.
    #[error("the request was cancelled")]
    Cancelled,
    /// `cancel` was called on a request already cancelled.
    #[error("the request was already cancelled")]
    AlreadyCancelled,
    /// `cancel` was called on a request that had finished.
    #[error("the request had already finished")]
    AlreadyFinished,
    /// The engine is shutting down (or its scheduler is gone).
    #[error("the engine has stopped")]
    Stopped,
    /// Cached K/V does not fit the model or could not be read.
    #[error("cache: {0}")]
    Cache(String),
    /// A step failed inside the engine; the requests in it fail, the others go on.
    #[error("internal error: {0}")]
    Internal(String),
    /// A file could not be read, or a thread started.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

/// The K/V pool's and attention's errors, as the model errors they are.
impl From<kvb_model::kvb_attn::AttnError> for EngineError {
    fn from(e: kvb_model::kvb_attn::AttnError) -> Self {
        EngineError::Model(e.into())
    }
}

/// The crates whose types this crate's API takes or returns.
pub use {crossbeam, kvb_chunk, kvb_hash, kvb_model, kvb_repair, kvb_store};

/// The README's example, run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
