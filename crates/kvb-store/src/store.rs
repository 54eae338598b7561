//! [`ChunkStore`]: the RAM tier, the optional disk tier, and the indexes over both, behind one lock.

use crate::chunk::KvChunk;
use crate::disk::{DiskConfig, DiskTier};
use crate::policy::{EvictionPolicy, Usage};
use crate::radix::RadixIndex;
use crate::remote::{RemoteBackend, RemoteConfig, RemoteStats, RemoteTier};
use crate::StoreError;
use crossbeam::sync::ShardedLock;
use kvb_hash::{ContentKey, PrefixKey};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// How long [`ChunkStore::flush`] waits for the remote tier's backlog: a process that stops
/// publishes what it computed, unless the remote store is too slow to take it.
pub const REMOTE_FLUSH_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Settings of a [`ChunkStore`].
#[derive(Debug, Clone)]
pub struct StoreConfig {
    /// RAM budget in bytes (must be > 0); the RAM tier never holds more.
    pub max_ram_bytes: usize,
    /// Which RAM chunk leaves first.
    pub eviction: EvictionPolicy,
    /// An optional disk tier: RAM evictions go there and come back on a hit.
    pub disk: Option<DiskConfig>,
    /// [`ChunkStore::longest_prefix`] reports no match shorter than this many tokens.
    pub min_prefix_len: usize,
    /// An optional remote tier that several processes share (Redis or Valkey): every stored
    /// chunk is also written there in the background, and [`ChunkStore::prefetch`] reads from it.
    pub remote: Option<RemoteConfig>,
}

impl StoreConfig {
    /// A RAM-only store with the default eviction policy.
    pub fn ram(max_ram_bytes: usize) -> Self {
        StoreConfig {
            max_ram_bytes,
            eviction: EvictionPolicy::default(),
            disk: None,
            min_prefix_len: 1,
            remote: None,
        }
    }
}

/// A chunk found by a lookup, and whether it was found by content only.
#[derive(Debug, Clone)]
pub struct ChunkMatch {
    /// The chunk.
    pub chunk: Arc<KvChunk>,
    /// `true` when found by content key: its K/V was computed in another context (and maybe at
    /// other positions), so it needs re-rotation and repair before use.
    pub approximate: bool,
}

/// The longest cached prefix of a prompt.
#[derive(Debug, Clone)]
pub struct PrefixMatch {
    /// Tokens covered, from the start of the prompt.
    pub matched_tokens: usize,
    /// The chunks in order, with how many of each one's tokens are used (all but maybe the last).
    pub chunks: Vec<(Arc<KvChunk>, usize)>,
}

/// What happened to an inserted chunk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Inserted {
    /// Now in RAM.
    Ram,
    /// Too large for RAM, written to disk.
    Disk,
    /// Already stored under this prefix key (its usage was refreshed).
    AlreadyStored,
    /// Neither tier could take it within its budget (or every RAM chunk is pinned).
    Rejected,
}

/// Counters and sizes of a store.
#[derive(Debug, Clone, Default, PartialEq)]
#[cfg_attr(feature = "schema", derive(serde::Serialize, utoipa::ToSchema))]
pub struct StoreStats {
    /// Lookups answered by prefix key.
    pub hits: u64,
    /// Lookups answered by content key only.
    pub approximate_hits: u64,
    /// Lookups that found nothing.
    pub misses: u64,
    /// `(hits + approximate_hits) / lookups`, 0 before any lookup.
    pub hit_rate: f64,
    /// Chunks that left RAM for lack of room (to disk, or dropped without a disk tier).
    pub evictions: u64,
    /// Chunks read back from disk into RAM.
    pub promotions: u64,
    /// Inserts refused for lack of room.
    pub budget_rejections: u64,
    /// Chunks in RAM, and their bytes.
    pub ram_chunks: usize,
    /// Bytes held in RAM.
    pub ram_bytes: usize,
    /// Chunks on disk.
    pub disk_chunks: usize,
    /// Bytes of live records on disk.
    pub disk_bytes: u64,
    /// Torn or corrupt disk records skipped.
    pub corrupt_records: u64,
    /// The remote tier's counters, when there is one.
    pub remote: Option<RemoteStats>,
}

struct RamEntry {
    chunk: Arc<KvChunk>,
    bytes: usize,
    hits: AtomicU64,
    last_access: AtomicU64,
    pinned: bool,
}

struct Inner {
    ram: HashMap<PrefixKey, RamEntry>,
    ram_bytes: usize,
    disk: Option<DiskTier>,
    /// Both tiers' chunks by content key.
    by_content: HashMap<ContentKey, Vec<PrefixKey>>,
    /// Both tiers' chunks as token paths.
    radix: RadixIndex,
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    approximate_hits: AtomicU64,
    misses: AtomicU64,
    evictions: AtomicU64,
    promotions: AtomicU64,
    budget_rejections: AtomicU64,
}

/// The home of cached chunks. Safe to share between threads: lookups that hit RAM take a shared
/// (read) lock, so many readers proceed at once; inserts, evictions and disk reads take the
/// exclusive lock.
pub struct ChunkStore {
    config: StoreConfig,
    inner: ShardedLock<Inner>,
    remote: Option<RemoteTier>,
    clock: AtomicU64,
    counters: Counters,
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::Relaxed);
}

impl Inner {
    /// Makes what this operation wrote to disk durable: one sync per store operation (an insert
    /// and every eviction or drop it caused, a promotion's evictions, a flush, an invalidation).
    fn sync_disk(&mut self) -> Result<(), StoreError> {
        match self.disk.as_mut() {
            Some(d) => d.sync().map_err(StoreError::Disk),
            None => Ok(()),
        }
    }

    fn index(&mut self, key: PrefixKey, content: ContentKey, parent: PrefixKey, tokens: &[u32]) {
        self.radix.insert(key, parent, tokens);
        let keys = self.by_content.entry(content).or_default();
        if !keys.contains(&key) {
            keys.push(key);
        }
    }

    /// Drops `key` from the indexes unless one of the tiers still holds it.
    fn unindex_if_gone(&mut self, key: &PrefixKey, content: &ContentKey) {
        if self.ram.contains_key(key) || self.disk.as_ref().is_some_and(|d| d.contains(key)) {
            return;
        }
        self.radix.remove(key);
        if let Some(keys) = self.by_content.get_mut(content) {
            keys.retain(|k| k != key);
            if keys.is_empty() {
                self.by_content.remove(content);
            }
        }
    }

    fn disk_content_of(&self, key: &PrefixKey) -> Option<ContentKey> {
        self.disk
            .as_ref()?
            .records()
            .find(|(k, _)| *k == key)
            .map(|(_, r)| r.content_key)
    }
}

/// The Redis backend of the remote tier `r`.
#[cfg(feature = "redis")]
fn redis_backend(r: &RemoteConfig) -> Result<Arc<dyn RemoteBackend>, StoreError> {
    let backend = crate::remote::RedisBackend::open(&r.url, r.timeout);
    Ok(Arc::new(backend.map_err(StoreError::Config)?))
}

/// Without the `redis` feature there is no backend for a URL.
#[cfg(not(feature = "redis"))]
fn redis_backend(r: &RemoteConfig) -> Result<Arc<dyn RemoteBackend>, StoreError> {
    Err(StoreError::Config(format!(
        "a remote tier at {} needs kvb-store's `redis` feature (or give a backend with \
         ChunkStore::with_remote_backend)",
        r.url
    )))
}

impl ChunkStore {
    /// Opens a store; with a disk tier, its existing records are indexed (so the cache survives a
    /// restart). A remote tier is reached through the Redis protocol (nothing is connected until
    /// the first call; a store that is down is an outage, not an error); without the `redis`
    /// feature a remote tier's URL is a [`StoreError::Config`] naming the feature.
    pub fn new(config: StoreConfig) -> Result<Self, StoreError> {
        let backend: Option<Arc<dyn RemoteBackend>> = match &config.remote {
            Some(r) => Some(redis_backend(r)?),
            None => None,
        };
        Self::open(config, backend)
    }

    /// Opens a store whose remote tier is `backend` (another store than Redis, say), with the
    /// settings of `config.remote` but for its URL (defaults without one).
    pub fn with_remote_backend(
        mut config: StoreConfig,
        backend: Arc<dyn RemoteBackend>,
    ) -> Result<Self, StoreError> {
        config
            .remote
            .get_or_insert_with(|| RemoteConfig::new(backend.describe()));
        Self::open(config, Some(backend))
    }

    fn open(
        config: StoreConfig,
        backend: Option<Arc<dyn RemoteBackend>>,
    ) -> Result<Self, StoreError> {
        if config.max_ram_bytes == 0 {
            return Err(StoreError::Config(
                "max_ram_bytes must be greater than 0".into(),
            ));
        }
        let disk = match &config.disk {
            Some(d) => Some(DiskTier::open(d.clone()).map_err(StoreError::Disk)?),
            None => None,
        };
        let mut inner = Inner {
            ram: HashMap::new(),
            ram_bytes: 0,
            disk,
            by_content: HashMap::new(),
            radix: RadixIndex::default(),
        };
        let on_disk: Vec<_> = inner
            .disk
            .iter()
            .flat_map(|d| {
                d.records()
                    .map(|(k, r)| (*k, r.content_key, r.parent, r.tokens.clone()))
            })
            .collect();
        for (k, c, p, t) in on_disk {
            inner.index(k, c, p, &t);
        }
        let remote = match (backend, &config.remote) {
            (Some(b), Some(r)) => Some(RemoteTier::new(b, r.clone()).map_err(StoreError::Config)?),
            _ => None,
        };
        Ok(ChunkStore {
            config,
            inner: ShardedLock::new(inner),
            remote,
            clock: AtomicU64::new(1),
            counters: Counters::default(),
        })
    }

    fn tick(&self) -> u64 {
        self.clock.fetch_add(1, Ordering::Relaxed)
    }

    fn write(&self) -> crossbeam::sync::ShardedLockWriteGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the maps half-updated in a way that returns
        // wrong data (every update is one map operation), so a poisoned lock is taken over.
        self.inner.write().unwrap_or_else(|p| p.into_inner())
    }

    fn read(&self) -> crossbeam::sync::ShardedLockReadGuard<'_, Inner> {
        self.inner.read().unwrap_or_else(|p| p.into_inner())
    }

    /// Stores a chunk (RAM first, evicting by policy; disk if it is too large for RAM), and
    /// queues it for the remote tier if there is one.
    pub fn insert(&self, chunk: KvChunk) -> Result<Inserted, StoreError> {
        chunk.check().map_err(StoreError::BadChunk)?;
        let chunk = Arc::new(chunk);
        let inserted = self.insert_local(chunk.clone())?;
        if let Some(remote) = &self.remote {
            // A chunk this store already had was written when it first came (or read from there).
            if inserted != Inserted::AlreadyStored {
                remote.put(chunk);
            }
        }
        Ok(inserted)
    }

    fn insert_local(&self, chunk: Arc<KvChunk>) -> Result<Inserted, StoreError> {
        let now = self.tick();
        let mut inner = self.write();
        let inserted = self.insert_locked(&mut inner, chunk, now)?;
        inner.sync_disk()?;
        Ok(inserted)
    }

    fn insert_locked(
        &self,
        inner: &mut Inner,
        chunk: Arc<KvChunk>,
        now: u64,
    ) -> Result<Inserted, StoreError> {
        if let Some(e) = inner.ram.get(&chunk.prefix_key) {
            e.last_access.store(now, Ordering::Relaxed);
            return Ok(Inserted::AlreadyStored);
        }
        let bytes = chunk.bytes();
        if bytes > self.config.max_ram_bytes {
            return self.insert_on_disk_only(inner, chunk, now);
        }
        if !self.make_room(inner, bytes, now)? {
            bump(&self.counters.budget_rejections);
            return Ok(Inserted::Rejected);
        }
        let (key, content, parent) = (chunk.prefix_key, chunk.content_key, chunk.parent);
        inner.index(key, content, parent, &chunk.tokens);
        inner.ram.insert(
            key,
            RamEntry {
                chunk,
                bytes,
                hits: AtomicU64::new(0),
                last_access: AtomicU64::new(now),
                pinned: false,
            },
        );
        inner.ram_bytes += bytes;
        Ok(Inserted::Ram)
    }

    fn insert_on_disk_only(
        &self,
        inner: &mut Inner,
        chunk: Arc<KvChunk>,
        now: u64,
    ) -> Result<Inserted, StoreError> {
        let Some(disk) = inner.disk.as_mut() else {
            bump(&self.counters.budget_rejections);
            return Ok(Inserted::Rejected);
        };
        match disk.put(&chunk, now).map_err(StoreError::Disk)? {
            None => {
                bump(&self.counters.budget_rejections);
                Ok(Inserted::Rejected)
            }
            Some(dropped) => {
                self.after_disk_drops(inner, dropped);
                inner.index(
                    chunk.prefix_key,
                    chunk.content_key,
                    chunk.parent,
                    &chunk.tokens,
                );
                Ok(Inserted::Disk)
            }
        }
    }

    fn after_disk_drops(&self, inner: &mut Inner, dropped: Vec<(PrefixKey, ContentKey)>) {
        for (k, c) in dropped {
            inner.unindex_if_gone(&k, &c);
        }
    }

    /// Evicts RAM chunks until `bytes` more fit; `false` if pinned chunks leave no room.
    fn make_room(&self, inner: &mut Inner, bytes: usize, now: u64) -> Result<bool, StoreError> {
        while inner.ram_bytes + bytes > self.config.max_ram_bytes {
            let usages = inner.ram.iter().map(|(k, e)| {
                (
                    *k,
                    Usage {
                        hits: e.hits.load(Ordering::Relaxed),
                        last_access: e.last_access.load(Ordering::Relaxed),
                        pinned: e.pinned,
                    },
                )
            });
            let Some(victim) = self.config.eviction.victim(usages, now) else {
                return Ok(false);
            };
            let Some(entry) = inner.ram.remove(&victim) else {
                return Ok(false);
            };
            inner.ram_bytes -= entry.bytes;
            bump(&self.counters.evictions);
            let content = entry.chunk.content_key;
            if let Some(disk) = inner.disk.as_mut() {
                if let Some(dropped) = disk
                    .put(&entry.chunk, entry.last_access.load(Ordering::Relaxed))
                    .map_err(StoreError::Disk)?
                {
                    self.after_disk_drops(inner, dropped);
                }
            }
            inner.unindex_if_gone(&victim, &content);
        }
        Ok(true)
    }

    /// Gets a chunk from RAM or disk (promoting it to RAM) without touching the counters.
    fn fetch(&self, key: &PrefixKey) -> Result<Option<Arc<KvChunk>>, StoreError> {
        let now = self.tick();
        {
            let inner = self.read();
            if let Some(e) = inner.ram.get(key) {
                e.hits.fetch_add(1, Ordering::Relaxed);
                e.last_access.store(now, Ordering::Relaxed);
                return Ok(Some(e.chunk.clone()));
            }
            if !inner.disk.as_ref().is_some_and(|d| d.contains(key)) {
                return Ok(None);
            }
        }
        let mut inner = self.write();
        if let Some(e) = inner.ram.get(key) {
            return Ok(Some(e.chunk.clone())); // promoted by another thread meanwhile
        }
        let content = inner.disk_content_of(key);
        let Some(chunk) = inner.disk.as_mut().and_then(|d| d.get(key, now)) else {
            if let Some(c) = content {
                inner.unindex_if_gone(key, &c);
            }
            return Ok(None);
        };
        bump(&self.counters.promotions);
        let bytes = chunk.bytes();
        let chunk = Arc::new(chunk);
        if bytes <= self.config.max_ram_bytes && self.make_room(&mut inner, bytes, now)? {
            inner.ram.insert(
                *key,
                RamEntry {
                    chunk: chunk.clone(),
                    bytes,
                    hits: AtomicU64::new(1),
                    last_access: AtomicU64::new(now),
                    pinned: false,
                },
            );
            inner.ram_bytes += bytes;
        }
        inner.sync_disk()?;
        Ok(Some(chunk))
    }

    /// The chunk stored under `key` (exact match), counting a hit or a miss.
    pub fn get(&self, key: &PrefixKey) -> Result<Option<Arc<KvChunk>>, StoreError> {
        let found = self.fetch(key)?;
        bump(if found.is_some() {
            &self.counters.hits
        } else {
            &self.counters.misses
        });
        Ok(found)
    }

    fn fetch_by_content(&self, content: &ContentKey) -> Result<Option<Arc<KvChunk>>, StoreError> {
        let keys = self
            .read()
            .by_content
            .get(content)
            .cloned()
            .unwrap_or_default();
        for k in keys {
            if let Some(c) = self.fetch(&k)? {
                return Ok(Some(c));
            }
        }
        Ok(None)
    }

    /// A chunk with the same tokens stored in any context (approximate), counting the outcome.
    pub fn get_by_content(&self, content: &ContentKey) -> Result<Option<ChunkMatch>, StoreError> {
        let found = self.fetch_by_content(content)?;
        bump(if found.is_some() {
            &self.counters.approximate_hits
        } else {
            &self.counters.misses
        });
        Ok(found.map(|chunk| ChunkMatch {
            chunk,
            approximate: true,
        }))
    }

    /// Two-tier lookup: by prefix key (exact), else by content key (approximate).
    pub fn lookup(
        &self,
        prefix: &PrefixKey,
        content: &ContentKey,
    ) -> Result<Option<ChunkMatch>, StoreError> {
        if let Some(chunk) = self.fetch(prefix)? {
            bump(&self.counters.hits);
            return Ok(Some(ChunkMatch {
                chunk,
                approximate: false,
            }));
        }
        self.get_by_content(content)
    }

    /// Looks up every chunk of a chunked prompt; returns `(chunk start, match)` for those found, in
    /// order, each flagged exact or approximate.
    pub fn find_matching_chunks(
        &self,
        chunks: &[kvb_chunk::Chunk],
    ) -> Result<Vec<(usize, ChunkMatch)>, StoreError> {
        let mut out = Vec::new();
        for c in chunks {
            if let Some(m) = self.lookup(&c.prefix_key, &c.content_key)? {
                out.push((c.start, m));
            }
        }
        Ok(out)
    }

    /// Brings into RAM, from the remote tier, the chunks stored there under `prefix_keys` and
    /// those its content index names for `content_keys`, where this store lacks them: one round
    /// trip (two with content hits), after which the lookups above see them. Returns how many
    /// chunks came. Without a remote tier, or when it is down, slow or answers garbage: 0, and
    /// never an error from the remote side.
    pub fn prefetch(
        &self,
        prefix_keys: &[PrefixKey],
        content_keys: &[ContentKey],
    ) -> Result<usize, StoreError> {
        let Some(remote) = &self.remote else {
            return Ok(0);
        };
        let (prefix, content): (Vec<PrefixKey>, Vec<ContentKey>) = {
            let inner = self.read();
            let local = |k: &PrefixKey| {
                inner.ram.contains_key(k) || inner.disk.as_ref().is_some_and(|d| d.contains(k))
            };
            let mut prefix: Vec<PrefixKey> =
                prefix_keys.iter().filter(|k| !local(k)).copied().collect();
            prefix.dedup();
            let mut content: Vec<ContentKey> = content_keys
                .iter()
                .filter(|c| !inner.by_content.contains_key(c))
                .copied()
                .collect();
            content.sort_unstable();
            content.dedup();
            (prefix, content)
        };
        let started = std::time::Instant::now();
        let found = remote.fetch(&prefix, &content, &|k| self.contains(k));
        let fetched = started.elapsed();
        let count = found.chunks.len();
        let bytes: usize = found.chunks.iter().map(KvChunk::bytes).sum();
        for chunk in found.chunks {
            // Not queued for the remote tier again: it came from there.
            self.insert_local(Arc::new(chunk))?;
        }
        tracing::debug!(
            "remote cache: asked {} keys, got {count} chunks ({:.1} MB) in {:.1} ms \
             (fetched and checked in {:.1} ms)",
            prefix.len() + content.len(),
            bytes as f64 / 1e6,
            started.elapsed().as_secs_f64() * 1e3,
            fetched.as_secs_f64() * 1e3
        );
        Ok(count)
    }

    /// Whether this store has a remote tier.
    pub fn has_remote(&self) -> bool {
        self.remote.is_some()
    }

    /// Waits until the chunks queued for the remote tier are written (or dropped), at most
    /// `timeout`; `true` if none is left (and without a remote tier).
    pub fn wait_remote_writes(&self, timeout: std::time::Duration) -> bool {
        self.remote.as_ref().is_none_or(|r| r.wait_idle(timeout))
    }

    /// The longest cached prefix of `tokens` (to the token, a partial last chunk included), from
    /// chunks chained from `root` (the namespace root); `None` below `min_prefix_len` tokens.
    pub fn longest_prefix(
        &self,
        root: PrefixKey,
        tokens: &[u32],
    ) -> Result<Option<PrefixMatch>, StoreError> {
        let path = self.read().radix.longest_prefix(root, tokens);
        let mut chunks = Vec::with_capacity(path.chunks.len());
        let mut matched = 0;
        for (key, used) in path.chunks {
            // A chunk can vanish between the index walk and the fetch (eviction, corruption):
            // the prefix then ends before it.
            match self.fetch(&key)? {
                Some(c) => {
                    matched += used;
                    chunks.push((c, used));
                }
                None => break,
            }
        }
        if matched == 0 || matched < self.config.min_prefix_len {
            bump(&self.counters.misses);
            return Ok(None);
        }
        bump(&self.counters.hits);
        Ok(Some(PrefixMatch {
            matched_tokens: matched,
            chunks,
        }))
    }

    /// Whether some chunk with these tokens is stored (without counting a lookup): a cheap probe
    /// for scanning a prompt at every offset.
    pub fn has_content(&self, content: &ContentKey) -> bool {
        self.read().by_content.contains_key(content)
    }

    /// Whether `key` is stored in either tier (without counting a lookup).
    pub fn contains(&self, key: &PrefixKey) -> bool {
        let inner = self.read();
        inner.ram.contains_key(key) || inner.disk.as_ref().is_some_and(|d| d.contains(key))
    }

    /// Removes `key` from every tier (durably on disk; from the remote tier in the background).
    pub fn invalidate(&self, key: &PrefixKey) -> Result<bool, StoreError> {
        if let Some(remote) = &self.remote {
            remote.forget(key);
        }
        let mut inner = self.write();
        let mut content = inner.disk_content_of(key);
        let mut found = false;
        if let Some(e) = inner.ram.remove(key) {
            inner.ram_bytes -= e.bytes;
            content = Some(e.chunk.content_key);
            found = true;
        }
        if let Some(d) = inner.disk.as_mut() {
            found |= d.remove(key).map_err(StoreError::Disk)?;
        }
        if let Some(c) = content {
            inner.unindex_if_gone(key, &c);
        }
        inner.sync_disk()?;
        Ok(found)
    }

    /// Pins a chunk in RAM (promoting it from disk): it is never evicted until unpinned.
    pub fn pin(&self, key: &PrefixKey) -> Result<bool, StoreError> {
        if self.fetch(key)?.is_none() {
            return Ok(false);
        }
        Ok(self.set_pinned(key, true))
    }

    /// Lets a pinned chunk be evicted again.
    pub fn unpin(&self, key: &PrefixKey) -> bool {
        self.set_pinned(key, false)
    }

    fn set_pinned(&self, key: &PrefixKey, pinned: bool) -> bool {
        match self.write().ram.get_mut(key) {
            Some(e) => {
                e.pinned = pinned;
                true
            }
            None => false,
        }
    }

    /// Forgets every chunk in RAM and on disk and resets the counters. The remote tier is shared
    /// with other processes and keeps its chunks.
    pub fn clear(&self) -> Result<(), StoreError> {
        let mut inner = self.write();
        inner.ram.clear();
        inner.ram_bytes = 0;
        inner.by_content.clear();
        inner.radix = RadixIndex::default();
        if let Some(d) = inner.disk.as_mut() {
            d.clear().map_err(StoreError::Disk)?;
        }
        for c in [
            &self.counters.hits,
            &self.counters.approximate_hits,
            &self.counters.misses,
            &self.counters.evictions,
            &self.counters.promotions,
            &self.counters.budget_rejections,
        ] {
            c.store(0, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Counters and sizes.
    pub fn stats(&self) -> StoreStats {
        let inner = self.read();
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        let (hits, approx, misses) = (
            get(&self.counters.hits),
            get(&self.counters.approximate_hits),
            get(&self.counters.misses),
        );
        let lookups = hits + approx + misses;
        StoreStats {
            hits,
            approximate_hits: approx,
            misses,
            hit_rate: if lookups == 0 {
                0.0
            } else {
                (hits + approx) as f64 / lookups as f64
            },
            evictions: get(&self.counters.evictions),
            promotions: get(&self.counters.promotions),
            budget_rejections: get(&self.counters.budget_rejections),
            ram_chunks: inner.ram.len(),
            ram_bytes: inner.ram_bytes,
            disk_chunks: inner.disk.as_ref().map_or(0, |d| d.len()),
            disk_bytes: inner.disk.as_ref().map_or(0, |d| d.live_bytes()),
            corrupt_records: inner.disk.as_ref().map_or(0, |d| d.corrupt_records),
            remote: self.remote.as_ref().map(RemoteTier::stats),
        }
    }

    /// The configuration.
    pub fn config(&self) -> &StoreConfig {
        &self.config
    }

    /// Writes every RAM chunk that the disk tier lacks to disk, durably (no-op without a disk
    /// tier), so a restart finds them, and waits (at most [`REMOTE_FLUSH_WAIT`]) for the chunks
    /// queued for the remote tier. Called on drop; call it yourself to bound what a crash can
    /// lose.
    pub fn flush(&self) -> Result<(), StoreError> {
        if !self.wait_remote_writes(REMOTE_FLUSH_WAIT) {
            tracing::warn!(
                "remote cache: chunks still queued after {} s; not waiting longer",
                REMOTE_FLUSH_WAIT.as_secs()
            );
        }
        let mut inner = self.write();
        let Inner { ram, disk, .. } = &mut *inner;
        let Some(disk) = disk.as_mut() else {
            return Ok(());
        };
        let mut pending: Vec<&RamEntry> = ram
            .values()
            .filter(|e| !disk.contains(&e.chunk.prefix_key))
            .collect();
        // Most recently used last, so that if the disk budget is short the freshest chunks stay.
        pending.sort_by_key(|e| e.last_access.load(Ordering::Relaxed));
        let mut dropped = Vec::new();
        for e in pending {
            if let Some(d) = disk
                .put(&e.chunk, e.last_access.load(Ordering::Relaxed))
                .map_err(StoreError::Disk)?
            {
                dropped.extend(d);
            }
        }
        for (k, c) in dropped {
            inner.unindex_if_gone(&k, &c);
        }
        inner.sync_disk()
    }
}

impl Drop for ChunkStore {
    fn drop(&mut self) {
        // Best effort: an I/O error here has nowhere to go, and the records already on disk stay
        // valid whatever happens to this write.
        let _ = self.flush();
    }
}
