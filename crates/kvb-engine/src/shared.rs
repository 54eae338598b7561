//! What the engine and its scheduler thread share: the model, the tokenizer, the chunk store
//! and the settings, read by both; the pool's stats, written by the scheduler.

use crate::config::EngineConfig;
use crate::grammar::Grammars;
use crate::result::PoolStats;
use kvb_chunk::ChunkConfig;
use kvb_hash::Namespace;
use kvb_model::{Model, ModelBackend, Tokenizer};
use kvb_store::{ChunkStore, KvFormat};
use std::sync::Mutex;

/// What the engine and its scheduler thread share.
pub(crate) struct Shared<B: ModelBackend> {
    pub model: Model<B>,
    pub tokenizer: Tokenizer,
    pub store: ChunkStore,
    pub namespace: Namespace,
    pub chunking: ChunkConfig,
    pub config: EngineConfig,
    /// How the store keeps K/V ([`EngineConfig::kv_precision`], or f16 for "as computed" from
    /// an f16 pool: the same values at half the bytes).
    pub store_format: KvFormat,
    pub eos: Vec<u32>,
    /// The weights' identity the namespace was built from (a sibling engine reuses it).
    pub fingerprint: Vec<u8>,
    /// Written by the scheduler after each step.
    pub stats: Mutex<PoolStats>,
    /// Grammars compile against this.
    pub grammars: Grammars,
}
