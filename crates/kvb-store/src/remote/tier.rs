//! [`RemoteTier`]: a [`RemoteBackend`] with outage handling, counters, a background writer, and
//! checked values.

use super::health::Health;
use super::value::{chunk_key, chunk_value, content_key, parse_chunk_value, parse_content_value};
use super::{RemoteBackend, RemoteConfig, RemoteError, RemoteStats};
use crate::chunk::KvChunk;
use crossbeam::channel::{unbounded, Receiver, Sender};
use kvb_hash::{ContentKey, PrefixKey};
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Chunks (and their bytes) the writer sends in one round trip at most.
const WRITE_BATCH_CHUNKS: usize = 32;
const WRITE_BATCH_BYTES: usize = 32 << 20;

enum Job {
    Write(Arc<KvChunk>),
    Delete(Vec<String>),
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    corrupt: AtomicU64,
    skipped_lookups: AtomicU64,
    writes: AtomicU64,
    write_bytes: AtomicU64,
    writes_dropped: AtomicU64,
}

/// Jobs queued and not yet done, and their chunk bytes: the writer's backlog, which
/// [`RemoteTier::wait_idle`] waits on.
#[derive(Default)]
struct Backlog {
    jobs: Mutex<usize>,
    done: Condvar,
    bytes: AtomicUsize,
}

impl Backlog {
    fn add(&self, bytes: usize) {
        *self.jobs.lock().unwrap_or_else(|p| p.into_inner()) += 1;
        self.bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    fn finish(&self, bytes: usize) {
        self.bytes.fetch_sub(bytes, Ordering::Relaxed);
        let mut jobs = self.jobs.lock().unwrap_or_else(|p| p.into_inner());
        *jobs -= 1;
        if *jobs == 0 {
            self.done.notify_all();
        }
    }
}

struct Shared {
    backend: Arc<dyn RemoteBackend>,
    health: Health,
    counters: Counters,
    backlog: Backlog,
    /// Set when the tier is dropped: the writer drops what is left instead of writing it (the
    /// store's flush has already waited for it as long as it would).
    closing: AtomicBool,
}

/// The remote tier of a [`crate::ChunkStore`].
pub(crate) struct RemoteTier {
    shared: Arc<Shared>,
    config: RemoteConfig,
    jobs: Option<Sender<Job>>,
    writer: Option<JoinHandle<()>>,
}

/// Chunks one lookup found.
pub(crate) struct Found {
    pub chunks: Vec<KvChunk>,
}

fn bump(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

impl RemoteTier {
    /// A tier over `backend` (the writer thread starts now; nothing is connected yet).
    pub fn new(backend: Arc<dyn RemoteBackend>, config: RemoteConfig) -> Result<Self, String> {
        let shared = Arc::new(Shared {
            health: Health::new(backend.describe(), config.retry_interval),
            backend,
            counters: Counters::default(),
            backlog: Backlog::default(),
            closing: AtomicBool::new(false),
        });
        let (jobs, inbox) = unbounded();
        let writer_shared = shared.clone();
        let writer = std::thread::Builder::new()
            .name("kvb-remote-writer".into())
            .spawn(move || write_loop(&writer_shared, &inbox))
            .map_err(|e| format!("starting the remote cache writer: {e}"))?;
        Ok(RemoteTier {
            shared,
            config,
            jobs: Some(jobs),
            writer: Some(writer),
        })
    }

    /// Queues `chunk` to be written, unless the backlog is over its byte budget (then the write
    /// is dropped and counted). Returns at once.
    pub fn put(&self, chunk: Arc<KvChunk>) {
        let bytes = chunk.bytes();
        let s = &self.shared;
        if s.backlog.bytes.load(Ordering::Relaxed) + bytes > self.config.max_pending_bytes {
            bump(&s.counters.writes_dropped, 1);
            return;
        }
        self.send(Job::Write(chunk), bytes);
    }

    fn send(&self, job: Job, bytes: usize) {
        let Some(jobs) = &self.jobs else { return };
        self.shared.backlog.add(bytes);
        if jobs.send(job).is_err() {
            // The writer is gone (it only stops when the tier is dropped).
            self.shared.backlog.finish(bytes);
        }
    }

    /// Chunks stored under `prefix_keys`, and chunks that the content index names for
    /// `content_keys` (unless `is_local` says this process has them), checked. One round trip,
    /// and a second for chunks found through the content index. Failures are misses.
    pub fn fetch(
        &self,
        prefix_keys: &[PrefixKey],
        content_keys: &[ContentKey],
        is_local: &dyn Fn(&PrefixKey) -> bool,
    ) -> Found {
        let mut found = Found { chunks: Vec::new() };
        if prefix_keys.is_empty() && content_keys.is_empty() {
            return found;
        }
        let names: Vec<String> = prefix_keys
            .iter()
            .map(chunk_key)
            .chain(content_keys.iter().map(content_key))
            .collect();
        let Some(values) = self.get_many(&names) else {
            return found;
        };
        let (chunk_values, index_values) = values.split_at(prefix_keys.len());
        self.take_chunks(prefix_keys, chunk_values, None, &mut found);
        let mut seen: HashSet<PrefixKey> = prefix_keys.iter().copied().collect();
        let mut targets = Vec::new();
        let mut wanted_content = Vec::new();
        for ((content, value), name) in content_keys
            .iter()
            .zip(index_values)
            .zip(&names[prefix_keys.len()..])
        {
            let Some(bytes) = value else {
                bump(&self.shared.counters.misses, 1);
                continue;
            };
            match parse_content_value(bytes) {
                Ok(target) if !is_local(&target) && seen.insert(target) => {
                    targets.push(target);
                    wanted_content.push(*content);
                }
                Ok(_) => {}
                Err(why) => self.corrupt(name, &why),
            }
        }
        if !targets.is_empty() {
            let names: Vec<String> = targets.iter().map(chunk_key).collect();
            if let Some(values) = self.get_many(&names) {
                self.take_chunks(&targets, &values, Some(&wanted_content), &mut found);
            }
        }
        found
    }

    fn get_many(&self, names: &[String]) -> Option<Vec<Option<Vec<u8>>>> {
        let s = &self.shared;
        if !s.health.may_call() {
            bump(&s.counters.skipped_lookups, 1);
            return None;
        }
        match s.backend.get_many(names) {
            Ok(v) => {
                s.health.succeeded();
                Some(v)
            }
            Err(e) => {
                s.health.failed(&e);
                None
            }
        }
    }

    /// Checks each value against its key (and, through the content index, its content key).
    fn take_chunks(
        &self,
        keys: &[PrefixKey],
        values: &[Option<Vec<u8>>],
        contents: Option<&[ContentKey]>,
        found: &mut Found,
    ) {
        for (i, (key, value)) in keys.iter().zip(values).enumerate() {
            let Some(bytes) = value else {
                bump(&self.shared.counters.misses, 1);
                continue;
            };
            let checked = parse_chunk_value(bytes, key).and_then(|c| match contents {
                Some(want) if c.content_key != want[i] => Err(format!(
                    "the content index named chunk {key}, whose tokens are not those of {}",
                    want[i]
                )),
                _ => Ok(c),
            });
            match checked {
                Ok(c) => {
                    bump(&self.shared.counters.hits, 1);
                    found.chunks.push(c);
                }
                Err(why) => self.corrupt(&chunk_key(key), &why),
            }
        }
    }

    /// Deletes the chunk stored under `key`, in the background.
    pub fn forget(&self, key: &PrefixKey) {
        self.send(Job::Delete(vec![chunk_key(key)]), 0);
    }

    /// A value that failed its checks: counted, logged, deleted in the background.
    fn corrupt(&self, name: &str, why: &str) {
        bump(&self.shared.counters.corrupt, 1);
        tracing::warn!("remote cache: dropped the value of {name}: {why}");
        self.send(Job::Delete(vec![name.to_string()]), 0);
    }

    /// Waits until every queued write is done, or `timeout` has passed; `true` if done.
    pub fn wait_idle(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        let backlog = &self.shared.backlog;
        let mut jobs = backlog.jobs.lock().unwrap_or_else(|p| p.into_inner());
        while *jobs > 0 {
            let now = Instant::now();
            if now >= deadline {
                return false;
            }
            jobs = backlog
                .done
                .wait_timeout(jobs, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        true
    }

    /// The counters.
    pub fn stats(&self) -> RemoteStats {
        let s = &self.shared;
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        RemoteStats {
            url: s.backend.describe(),
            connected: s.health.is_up(),
            hits: get(&s.counters.hits),
            misses: get(&s.counters.misses),
            corrupt: get(&s.counters.corrupt),
            errors: get(&s.health.errors),
            outages: get(&s.health.outages),
            skipped_lookups: get(&s.counters.skipped_lookups),
            writes: get(&s.counters.writes),
            write_bytes: get(&s.counters.write_bytes),
            writes_dropped: get(&s.counters.writes_dropped),
            writes_pending: *s.backlog.jobs.lock().unwrap_or_else(|p| p.into_inner()) as u64,
        }
    }
}

impl Drop for RemoteTier {
    fn drop(&mut self) {
        // The writer finishes the call under way (bounded by the timeout), drops the rest, and
        // stops.
        self.shared.closing.store(true, Ordering::Release);
        self.jobs = None;
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

/// The writer thread: takes jobs in batches until the tier is dropped.
fn write_loop(s: &Shared, inbox: &Receiver<Job>) {
    while let Ok(first) = inbox.recv() {
        let mut chunks = Vec::new();
        let mut batch_bytes = 0;
        let mut next = Some(first);
        while let Some(job) = next.take() {
            match job {
                Job::Write(c) => {
                    batch_bytes += c.bytes();
                    chunks.push(c);
                }
                Job::Delete(names) => {
                    if s.health.may_call() && !s.closing.load(Ordering::Acquire) {
                        match s.backend.delete(&names) {
                            Ok(()) => s.health.succeeded(),
                            Err(e) => s.health.failed(&e),
                        }
                    }
                    s.backlog.finish(0);
                }
            }
            if chunks.len() < WRITE_BATCH_CHUNKS && batch_bytes < WRITE_BATCH_BYTES {
                next = inbox.try_recv().ok();
            }
        }
        write_chunks(s, &chunks);
        for c in &chunks {
            s.backlog.finish(c.bytes());
        }
    }
}

/// Writes a batch of chunks and their content index entries in one round trip.
fn write_chunks(s: &Shared, chunks: &[Arc<KvChunk>]) {
    if chunks.is_empty() {
        return;
    }
    let n = chunks.len() as u64;
    if !s.health.may_call() || s.closing.load(Ordering::Acquire) {
        bump(&s.counters.writes_dropped, n);
        return;
    }
    let mut entries = Vec::with_capacity(2 * chunks.len());
    for c in chunks {
        entries.push((chunk_key(&c.prefix_key), chunk_value(c)));
        entries.push((content_key(&c.content_key), c.prefix_key.bytes().to_vec()));
    }
    let bytes: usize = entries.iter().map(|(_, v)| v.len()).sum();
    match s.backend.put_many(&entries) {
        Ok(()) => {
            s.health.succeeded();
            bump(&s.counters.writes, n);
            bump(&s.counters.write_bytes, bytes as u64);
        }
        Err(e) => {
            s.health.failed(&e);
            bump(&s.counters.writes_dropped, n);
            if let RemoteError::Refused(why) = e {
                tracing::debug!("remote cache refused {n} chunks: {why}");
            }
        }
    }
}
