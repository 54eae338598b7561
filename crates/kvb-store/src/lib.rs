//! # kvb-store: the home of cached chunks
//!
//! A [`ChunkStore`] holds [`KvChunk`]s, the K (after RoPE) and V of every layer for one chunk of
//! tokens, with its positions, tokens and keys, in f32, f16, bf16 or KIVI-quantized form.
//!
//! - **Lookups**: by prefix key (exact), by content key (approximate, flagged), both in one
//!   two-tier [`ChunkStore::lookup`], every chunk of a chunked prompt in order
//!   ([`ChunkStore::find_matching_chunks`]), and the longest cached prefix of a prompt *to the
//!   token* through a token radix index ([`ChunkStore::longest_prefix`]), a partial last chunk
//!   included, with a minimum prefix length.
//! - **RAM tier** with a byte budget and pluggable eviction ([`EvictionPolicy`]): frequency with a
//!   recency window (every hit counts), LRU, and pinned chunks that are never evicted.
//! - **Disk tier** ([`DiskConfig`]): RAM evictions go to append-only segment files of checksummed
//!   records and come back on a hit. Every store operation that wrote to disk ends with one sync:
//!   once it returns, its records survive a crash. A record torn by a crash or damaged later is
//!   skipped and counted, never returned; a dropped or invalidated record is tombstoned and stays
//!   gone; live records stay within the disk budget, across restarts too; one process at a time
//!   (an advisory lock); opening reads each sealed segment's small index, not its K/V, and
//!   records are verified when read. Space is reclaimed by compaction.
//! - **Remote tier** ([`RemoteConfig`], module [`remote`]): a store several processes share
//!   (Redis or Valkey through `RedisBackend` with the default `redis` feature, or any
//!   [`RemoteBackend`]). Every chunk inserted is also written there by a background thread; [`ChunkStore::prefetch`] reads a prompt's chunks
//!   in one round trip into RAM. Values are checksummed records checked against their key; a
//!   remote that is down, slow, full or babbling costs a miss, never an error.
//! - **Thread safety**: RAM hits take a shared lock (many readers at once, crossbeam's
//!   `ShardedLock`); usage counters are atomics.
//! - [`kv_ops`]: merge and slice K/V along the token axis.
//! - [`seam`]: for a runtime that owns its K/V tensors: store a run of its cache as a chunk, write
//!   a hit back into it (token- or head-major, f32/f16/bf16), re-rotate a moved chunk's keys.
//! - [`token_cache`]: a token-level quantized KV cache with H2O, PyramidKV and sliding-window
//!   eviction, for long live contexts (kvboost's `CacheManager`). It lives here, not in
//!   kvb-quant, because it is a cache with eviction policies that merely *uses* quantization.
//!
//! Promises (proved by `tests/`): RAM bytes never exceed the budget; each policy evicts in its
//! stated order and never a pinned chunk; after any sequence of operations the store answers like
//! a plain map (model-based test); the disk tier survives a restart; truncated or bit-flipped
//! segment files never yield a wrong chunk or a panic; a writer killed with SIGKILL at random
//! points (50 rounds, `tests/crash.rs`) never leaves a wrong chunk, loses no acknowledged one and
//! keeps the budget; a writer whose disk fills gets errors naming the file and keeps every
//! acknowledged chunk; concurrent readers and writers are safe; chunks one store writes to a
//! shared Redis are read by another, a damaged remote value is never used (proptest over every
//! byte), another namespace's entries are never read, and a Redis killed, silent or answering
//! garbage fails no store operation (`tests/remote_tier.rs`, against a real redis-server). The cargo feature `fuzzing`
//! exposes the disk tier's parsers to the fuzz targets of `fuzz/` (module `fuzzing`).
//!
//! ```
//! use kvb_hash::Namespace;
//! use kvb_store::{ChunkStore, KvChunk, KvData, LayerKv, StoreConfig};
//! let ns = Namespace::builder().model_fingerprint(b"m").build();
//! let tokens = vec![5u32, 6, 7];
//! let chunk = KvChunk {
//!     prefix_key: ns.prefix_key(&ns.root(), &tokens),
//!     content_key: ns.content_key(&tokens),
//!     parent: ns.root(),
//!     positions: vec![0, 1, 2],
//!     kv_heads: 1,
//!     head_dim: 2,
//!     layers: vec![LayerKv { k: KvData::F32(vec![0.0; 6]), v: KvData::F32(vec![1.0; 6]) }],
//!     tokens,
//! };
//! let store = ChunkStore::new(StoreConfig::ram(1 << 20)).unwrap();
//! store.insert(chunk).unwrap();
//! let hit = store.longest_prefix(ns.root(), &[5, 6, 9]).unwrap().unwrap();
//! assert_eq!(hit.matched_tokens, 2); // a partial chunk: its first two tokens match
//! ```
#![warn(missing_docs)]

/// The README's example, run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

mod chunk;
pub mod codec;
mod disk;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod kv_ops;
mod policy;
mod radix;
pub mod remote;
pub mod seam;
mod store;
pub mod token_cache;

pub use chunk::{KvChunk, KvData, KvFormat, LayerKv};
pub use disk::DiskConfig;
/// The key types (namespaces, prefix and content keys) this crate's API takes.
pub use kvb_hash;
/// The KIVI settings ([`KvFormat::Kivi`]) and quantized data this crate's API takes.
pub use kvb_quant;
pub use policy::EvictionPolicy;
pub use radix::{PrefixPath, RadixIndex};
#[cfg(feature = "redis")]
pub use remote::RedisBackend;
pub use remote::{RemoteBackend, RemoteConfig, RemoteError, RemoteStats};
pub use store::{
    ChunkMatch, ChunkStore, Inserted, PrefixMatch, StoreConfig, StoreStats, REMOTE_FLUSH_WAIT,
};

/// Everything that can go wrong in the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// Invalid settings.
    #[error("store config: {0}")]
    Config(String),
    /// A chunk whose K/V does not match its shape.
    #[error("malformed chunk: {0}")]
    BadChunk(String),
    /// The disk tier failed (an I/O error, with the file).
    #[error("disk tier: {0}")]
    Disk(String),
}
