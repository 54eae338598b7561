//! The remote tier: a store that several kvb processes share (Redis or Valkey), below RAM and
//! disk.
//!
//! # What it promises
//! - **Never on the critical path for writes.** A stored chunk is queued and written by a
//!   background thread; a queue over its byte budget drops the write (counted), never blocks.
//! - **One round trip per lookup.** [`crate::ChunkStore::prefetch`] asks for every chunk a prompt
//!   could use at once (a chunk found through the content index costs a second one).
//! - **Degrade, never fail.** Down, slow, full or answering garbage: every store operation still
//!   succeeds with the local tiers. Every call has a timeout; after a failure the tier waits
//!   [`RemoteConfig::retry_interval`] before trying again (so an outage costs one timeout, not one
//!   per request), logs one warning per outage and one line when it is back, and counts it all in
//!   [`RemoteStats`].
//! - **Never a wrong chunk.** Values are the disk tier's checksummed records, named by the chunk's
//!   prefix key; a value whose checksum, key or shape does not hold is dropped, counted and
//!   deleted. Keys are the namespace's chunk keys, so two models or settings never share one.
//!
//! The store behind it is a [`RemoteBackend`]: get many keys, put many, delete. `RedisBackend`
//! speaks the Redis protocol (Redis and Valkey); another store needs only those three calls.

mod health;
#[cfg(feature = "redis")]
mod redis_backend;
#[cfg(feature = "test-support")]
pub mod test_server;
mod tier;
mod value;

#[cfg(feature = "redis")]
pub use redis_backend::RedisBackend;
pub(crate) use tier::RemoteTier;

use std::time::Duration;

/// Settings of the remote tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteConfig {
    /// Where it is: `redis://HOST:PORT/DB` (also `redis+unix:///path`).
    pub url: String,
    /// Every connect, read and write gives up after this long.
    pub timeout: Duration,
    /// After a failure, no call is tried for this long (requests go on with the local tiers).
    pub retry_interval: Duration,
    /// Bytes of chunks waiting to be written at most; a write beyond it is dropped.
    pub max_pending_bytes: usize,
}

impl RemoteConfig {
    /// A remote tier at `url` with a 200 ms timeout, a 1 s retry interval and 256 MiB of
    /// pending writes.
    pub fn new(url: impl Into<String>) -> Self {
        RemoteConfig {
            url: url.into(),
            timeout: Duration::from_millis(200),
            retry_interval: Duration::from_secs(1),
            max_pending_bytes: 256 << 20,
        }
    }
}

/// Why a call to the remote store failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RemoteError {
    /// Not reachable, timed out, or the connection broke: an outage, retried later.
    #[error("unavailable: {0}")]
    Unavailable(String),
    /// It answered with an error (out of memory, say); the connection is fine.
    #[error("refused: {0}")]
    Refused(String),
}

/// A key-value store that several processes share: the small interface the remote tier needs.
/// Every call returns within the backend's timeout.
pub trait RemoteBackend: Send + Sync {
    /// The values of `keys`, in order (`None` where absent), in one round trip.
    fn get_many(&self, keys: &[String]) -> Result<Vec<Option<Vec<u8>>>, RemoteError>;
    /// Stores every `(key, value)`, in one round trip.
    fn put_many(&self, entries: &[(String, Vec<u8>)]) -> Result<(), RemoteError>;
    /// Deletes `keys` (absent ones are ignored).
    fn delete(&self, keys: &[String]) -> Result<(), RemoteError>;
    /// Where it is, for logs (never a password).
    fn describe(&self) -> String;
}

/// Counters of the remote tier, since the store opened.
#[derive(Debug, Clone, Default, PartialEq)]
#[cfg_attr(feature = "schema", derive(serde::Serialize, utoipa::ToSchema))]
pub struct RemoteStats {
    /// Where it is (no password).
    pub url: String,
    /// `false` during an outage (from a failed call until one succeeds again).
    pub connected: bool,
    /// Chunks read from it.
    pub hits: u64,
    /// Keys asked for and not there (never written, or evicted by the store).
    pub misses: u64,
    /// Values dropped because their checksum, key or shape did not hold.
    pub corrupt: u64,
    /// Calls that failed (timeouts, refused connections, error answers).
    pub errors: u64,
    /// Outages begun (each logged once).
    pub outages: u64,
    /// Lookups not sent because an outage's retry interval had not passed.
    pub skipped_lookups: u64,
    /// Chunks written.
    pub writes: u64,
    /// Bytes of values written.
    pub write_bytes: u64,
    /// Chunks not written: the queue was over budget, or the store was down or refused them.
    pub writes_dropped: u64,
    /// Chunks queued and not yet written.
    pub writes_pending: u64,
}
