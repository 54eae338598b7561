//! The disk tier: append-only segment files of checksummed records ([`record`]).
//!
//! # What it promises
//! - **Acknowledged means durable.** [`DiskTier::sync`] makes every record appended before it
//!   durable (the segment's data, and the folder's entry for a new segment file). The chunk store
//!   calls it at the end of every operation that wrote to disk (an insert and the evictions it
//!   caused, a flush, an invalidation): a batch is acknowledged when that call returns.
//! - **Whole or ignored.** A record torn by a crash, or damaged later, fails its checksum: it is
//!   skipped at open and dropped (and counted) when read, never returned.
//! - **Dropped stays dropped.** A record dropped to stay within the budget, or invalidated, is
//!   followed by a tombstone in the same batch; a later record of a key always wins over an
//!   earlier one, so nothing comes back after a restart.
//! - **The budget holds across restarts.** Live records never exceed `max_bytes`; opening with
//!   a smaller budget drops the oldest records (with tombstones) first.
//! - **One process at a time.** The tier holds an advisory lock on `LOCK` in its folder while
//!   open; a second opener gets a clear error.
//! - **Opening reads the indexes, not the K/V.** A segment is sealed when the next one starts
//!   (and when the tier closes): its index file ([`segment_index`]) lists its records with their
//!   keys and tokens. Opening reads those; only a segment without a valid index (the one a crash
//!   left open, at most `segment_bytes`) is scanned. Records are verified when read.
//!
//! Compaction writes live records to a new segment, syncs it and its index, and only then deletes
//! the old segments, oldest first; a crash in between leaves duplicates that the next open
//! resolves (later records win), and a tombstone is never deleted before the record it hides.

pub(crate) mod record;
pub(crate) mod segment_index;

use crate::chunk::KvChunk;
use crate::codec::{decode, decode_meta, encode};
use kvb_hash::{ContentKey, PrefixKey};
use record::{parse_record, record_bytes, scan, KIND_CHUNK, KIND_TOMBSTONE};
use segment_index::Entry;
use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

/// Settings of the disk tier.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiskConfig {
    /// The folder holding the segment files (created if absent).
    pub dir: PathBuf,
    /// Budget for live records, in bytes; least recently used records are dropped beyond it.
    pub max_bytes: u64,
    /// A new segment is started when the active one reaches this size.
    pub segment_bytes: u64,
}

impl DiskConfig {
    /// A disk tier in `dir` with a byte budget and 64 MiB segments.
    pub fn new(dir: impl Into<PathBuf>, max_bytes: u64) -> Self {
        DiskConfig {
            dir: dir.into(),
            max_bytes,
            segment_bytes: 64 << 20,
        }
    }
}

/// Where a live record is, and what the store's indexes need of it.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    segment: u64,
    offset: u64,
    len: u64,
    pub content_key: ContentKey,
    pub parent: PrefixKey,
    pub tokens: Vec<u32>,
    last_access: u64,
}

/// The segment being appended to: its file, and the index entries of what it holds.
struct Active {
    id: u64,
    file: File,
    entries: Vec<Entry>,
}

pub(crate) struct DiskTier {
    config: DiskConfig,
    records: HashMap<PrefixKey, Record>,
    /// Segment id -> bytes in the file.
    segments: BTreeMap<u64, u64>,
    active: Option<Active>,
    live_bytes: u64,
    /// Appended since the last [`DiskTier::sync`]: the active segment's data, the folder.
    unsynced_data: bool,
    unsynced_dir: bool,
    /// Held while the tier is open (the advisory lock is released with the file).
    _lock: File,
    /// Torn or corrupt records met (at open or on read).
    pub corrupt_records: u64,
}

fn io_err(path: &Path, e: std::io::Error) -> String {
    format!("{}: {e}", path.display())
}

fn segment_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("seg-{id:010}.kvb"))
}

fn index_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("seg-{id:010}.idx"))
}

/// Syncs a folder, so that files created, renamed or deleted in it stay so after a crash.
fn sync_dir(dir: &Path) -> Result<(), String> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_err(dir, e))
}

/// Takes the tier's advisory lock, or says who holds it.
fn lock(dir: &Path) -> Result<File, String> {
    let path = dir.join("LOCK");
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| io_err(&path, e))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(format!(
            "{}: the disk tier is in use by another process (it holds {}); give each process \
             its own --disk-dir",
            dir.display(),
            path.display()
        )),
        Err(std::fs::TryLockError::Error(e)) => Err(io_err(&path, e)),
    }
}

/// The records of segment `id` (`len` bytes): from its index when that is valid, else by
/// scanning the segment (then the index is written for next time, if the folder allows).
/// Returns the entries and the corrupt stretches met.
fn segment_entries(dir: &Path, id: u64, len: u64) -> Result<(Vec<Entry>, u64), String> {
    let index = index_path(dir, id);
    if let Some(entries) = segment_index::read(&index, len) {
        return Ok((entries, 0));
    }
    let path = segment_path(dir, id);
    let bytes = std::fs::read(&path).map_err(|e| io_err(&path, e))?;
    let (scanned, mut corrupt) = scan(&bytes);
    let mut entries = Vec::with_capacity(scanned.len());
    for r in scanned {
        let chunk = if r.kind == KIND_CHUNK {
            match decode_meta(r.payload) {
                Ok(meta) if meta.prefix_key == r.key => {
                    Some((meta.content_key, meta.parent, meta.tokens))
                }
                _ => {
                    corrupt += 1;
                    continue;
                }
            }
        } else {
            None
        };
        entries.push(Entry {
            kind: r.kind,
            key: r.key,
            offset: r.offset as u64,
            len: r.len as u64,
            chunk,
        });
    }
    // Best effort: without it the next open scans this segment again.
    let _ = segment_index::write(&index, bytes.len() as u64, &entries);
    Ok((entries, corrupt))
}

impl DiskTier {
    /// Opens (or creates) the tier: takes its lock, rebuilds its index from the segments'
    /// indexes (scanning a segment only where its index is missing or invalid), and drops the
    /// oldest records if they exceed the budget.
    pub fn open(config: DiskConfig) -> Result<Self, String> {
        std::fs::create_dir_all(&config.dir).map_err(|e| io_err(&config.dir, e))?;
        let lock = lock(&config.dir)?;
        let mut ids: Vec<u64> = std::fs::read_dir(&config.dir)
            .map_err(|e| io_err(&config.dir, e))?
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.strip_prefix("seg-")?
                    .strip_suffix(".kvb")?
                    .parse()
                    .ok()
            })
            .collect();
        ids.sort_unstable();
        let mut tier = DiskTier {
            config,
            records: HashMap::new(),
            segments: BTreeMap::new(),
            active: None,
            live_bytes: 0,
            unsynced_data: false,
            unsynced_dir: false,
            _lock: lock,
            corrupt_records: 0,
        };
        for id in ids {
            let path = segment_path(&tier.config.dir, id);
            let len = std::fs::metadata(&path)
                .map_err(|e| io_err(&path, e))?
                .len();
            let (entries, corrupt) = segment_entries(&tier.config.dir, id, len)?;
            tier.corrupt_records += corrupt;
            tier.segments.insert(id, len);
            for e in entries {
                tier.forget(&e.key);
                // A tombstone: the key stays forgotten.
                let Some((content_key, parent, tokens)) = e.chunk else {
                    continue;
                };
                tier.live_bytes += e.len;
                tier.records.insert(
                    e.key,
                    Record {
                        segment: id,
                        offset: e.offset,
                        len: e.len,
                        content_key,
                        parent,
                        tokens,
                        last_access: 0,
                    },
                );
            }
        }
        tier.trim_to_budget()?;
        tier.sync()?;
        Ok(tier)
    }

    /// Drops the oldest records (by position: the order they were written) with tombstones
    /// until the live records fit the budget (a budget smaller than when they were written).
    fn trim_to_budget(&mut self) -> Result<(), String> {
        if self.live_bytes <= self.config.max_bytes {
            return Ok(());
        }
        let mut by_age: Vec<(u64, u64, PrefixKey)> = self
            .records
            .iter()
            .map(|(k, r)| (r.segment, r.offset, *k))
            .collect();
        by_age.sort_unstable();
        for (_, _, key) in by_age {
            if self.live_bytes <= self.config.max_bytes {
                break;
            }
            self.remove(&key)?;
        }
        Ok(())
    }

    fn forget(&mut self, key: &PrefixKey) -> Option<Record> {
        let r = self.records.remove(key)?;
        self.live_bytes -= r.len;
        Some(r)
    }

    /// Live records' keys and index data.
    pub fn records(&self) -> impl Iterator<Item = (&PrefixKey, &Record)> {
        self.records.iter()
    }

    pub fn contains(&self, key: &PrefixKey) -> bool {
        self.records.contains_key(key)
    }

    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn live_bytes(&self) -> u64 {
        self.live_bytes
    }

    /// Bytes of every segment file, dead records included.
    pub fn file_bytes(&self) -> u64 {
        self.segments.values().sum()
    }

    /// Makes every record appended so far durable (see the module's promises).
    pub fn sync(&mut self) -> Result<(), String> {
        if self.unsynced_data {
            if let Some(a) = &self.active {
                let path = segment_path(&self.config.dir, a.id);
                a.file.sync_data().map_err(|e| io_err(&path, e))?;
            }
            self.unsynced_data = false;
        }
        if self.unsynced_dir {
            sync_dir(&self.config.dir)?;
            self.unsynced_dir = false;
        }
        Ok(())
    }

    /// Seals the active segment: its data synced, its index written. The next append starts a
    /// new segment.
    fn seal(&mut self) -> Result<(), String> {
        let Some(a) = self.active.take() else {
            return Ok(());
        };
        let path = segment_path(&self.config.dir, a.id);
        a.file.sync_data().map_err(|e| io_err(&path, e))?;
        let len = self.segments.get(&a.id).copied().unwrap_or(0);
        let index = index_path(&self.config.dir, a.id);
        segment_index::write(&index, len, &a.entries).map_err(|e| io_err(&index, e))?;
        self.unsynced_data = false;
        self.unsynced_dir = true;
        Ok(())
    }

    /// Appends a record; returns where it landed.
    fn append(
        &mut self,
        kind: u8,
        key: &PrefixKey,
        payload: &[u8],
        chunk: Option<&KvChunk>,
    ) -> Result<(u64, u64), String> {
        let full = self.active.as_ref().is_some_and(|a| {
            self.segments.get(&a.id).copied().unwrap_or(0) >= self.config.segment_bytes
        });
        if full {
            self.seal()?;
        }
        if self.active.is_none() {
            let id = self.segments.keys().next_back().map_or(0, |m| m + 1);
            let path = segment_path(&self.config.dir, id);
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(|e| io_err(&path, e))?;
            self.segments.insert(id, 0);
            self.active = Some(Active {
                id,
                file,
                entries: Vec::new(),
            });
            self.unsynced_dir = true;
        }
        let bytes = record_bytes(kind, key, payload);
        let a = self.active.as_mut().ok_or("no active segment")?;
        let offset = self.segments[&a.id];
        if let Err(e) = a.file.write_all(&bytes) {
            // A partial write (a full disk) is a torn record: the next open skips it. Appends
            // go on after it, so the offsets below stay true.
            let written = a.file.metadata().map(|m| m.len()).unwrap_or(offset);
            if let Some(n) = self.segments.get_mut(&a.id) {
                *n = written.max(offset);
            }
            return Err(io_err(&segment_path(&self.config.dir, a.id), e));
        }
        a.entries.push(Entry {
            kind,
            key: *key,
            offset,
            len: bytes.len() as u64,
            chunk: chunk.map(|c| (c.content_key, c.parent, c.tokens.clone())),
        });
        let id = a.id;
        *self.segments.get_mut(&id).ok_or("segment vanished")? += bytes.len() as u64;
        self.unsynced_data = true;
        Ok((id, offset))
    }

    /// Writes `chunk`, dropping least recently used records (with tombstones) to stay within the
    /// budget. Returns the (prefix, content) keys dropped, or `None` if the chunk alone exceeds
    /// the budget. Durable after the next [`DiskTier::sync`].
    pub fn put(
        &mut self,
        chunk: &KvChunk,
        now: u64,
    ) -> Result<Option<Vec<(PrefixKey, ContentKey)>>, String> {
        if self.records.contains_key(&chunk.prefix_key) {
            return Ok(Some(Vec::new()));
        }
        let payload = encode(chunk);
        let len = (record::HEADER + payload.len()) as u64;
        if len > self.config.max_bytes {
            return Ok(None);
        }
        let mut dropped = Vec::new();
        while self.live_bytes + len > self.config.max_bytes {
            let Some(victim) = self
                .records
                .iter()
                .min_by_key(|(_, r)| r.last_access)
                .map(|(k, _)| *k)
            else {
                break;
            };
            let content = self.records[&victim].content_key;
            self.remove(&victim)?;
            dropped.push((victim, content));
        }
        let (segment, offset) =
            self.append(KIND_CHUNK, &chunk.prefix_key, &payload, Some(chunk))?;
        self.live_bytes += len;
        self.records.insert(
            chunk.prefix_key,
            Record {
                segment,
                offset,
                len,
                content_key: chunk.content_key,
                parent: chunk.parent,
                tokens: chunk.tokens.clone(),
                last_access: now,
            },
        );
        // Reclaim space once dead records make up half of the files.
        if self.file_bytes() > 2 * self.config.max_bytes.max(self.live_bytes) {
            self.compact()?;
        }
        Ok(Some(dropped))
    }

    fn read_raw(&self, r: &Record) -> Result<Vec<u8>, String> {
        let path = segment_path(&self.config.dir, r.segment);
        let mut f = File::open(&path).map_err(|e| io_err(&path, e))?;
        f.seek(SeekFrom::Start(r.offset))
            .map_err(|e| io_err(&path, e))?;
        let mut buf = vec![0u8; r.len as usize];
        f.read_exact(&mut buf).map_err(|e| io_err(&path, e))?;
        Ok(buf)
    }

    /// Reads a chunk, re-verifying its record; a record gone bad is dropped and counted.
    pub fn get(&mut self, key: &PrefixKey, now: u64) -> Option<KvChunk> {
        let r = self.records.get(key)?.clone();
        let chunk = self.read_raw(&r).ok().and_then(|raw| {
            let rec = parse_record(&raw, 0)?;
            let c = decode(rec.payload).ok()?;
            let same = rec.key == *key && c.prefix_key == *key && c.content_key == r.content_key;
            same.then_some(c)
        });
        match chunk {
            Some(c) => {
                if let Some(rec) = self.records.get_mut(key) {
                    rec.last_access = now;
                }
                Some(c)
            }
            None => {
                self.corrupt_records += 1;
                self.forget(key);
                None
            }
        }
    }

    /// Forgets `key` durably (a tombstone record, durable after the next sync), if present.
    pub fn remove(&mut self, key: &PrefixKey) -> Result<bool, String> {
        if self.forget(key).is_none() {
            return Ok(false);
        }
        self.append(KIND_TOMBSTONE, key, &[], None)?;
        Ok(true)
    }

    /// Forgets every record and deletes the segment files and their indexes.
    pub fn clear(&mut self) -> Result<(), String> {
        self.active = None;
        for id in std::mem::take(&mut self.segments).into_keys() {
            self.delete_segment(id)?;
        }
        self.records.clear();
        self.live_bytes = 0;
        self.unsynced_data = false;
        sync_dir(&self.config.dir)
    }

    /// Deletes a segment's index, then the segment (an index never outlives its segment).
    fn delete_segment(&self, id: u64) -> Result<(), String> {
        let index = index_path(&self.config.dir, id);
        match std::fs::remove_file(&index) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(io_err(&index, e)),
            _ => {}
        }
        let p = segment_path(&self.config.dir, id);
        std::fs::remove_file(&p).map_err(|e| io_err(&p, e))
    }

    /// Rewrites live records into a fresh, sealed segment, then deletes the older segments.
    pub fn compact(&mut self) -> Result<(), String> {
        self.seal()?;
        let new_id = self.segments.keys().next_back().map_or(0, |m| m + 1);
        let path = segment_path(&self.config.dir, new_id);
        let mut file = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|e| io_err(&path, e))?;
        let mut keys: Vec<PrefixKey> = self.records.keys().copied().collect();
        keys.sort_by_key(|k| (self.records[k].segment, self.records[k].offset));
        let mut offset = 0u64;
        let mut moved = Vec::new();
        let mut entries = Vec::new();
        for key in keys {
            let r = self.records[&key].clone();
            match self
                .read_raw(&r)
                .ok()
                .filter(|raw| parse_record(raw, 0).is_some())
            {
                Some(raw) => {
                    file.write_all(&raw).map_err(|e| io_err(&path, e))?;
                    entries.push(Entry {
                        kind: KIND_CHUNK,
                        key,
                        offset,
                        len: raw.len() as u64,
                        chunk: Some((r.content_key, r.parent, r.tokens.clone())),
                    });
                    moved.push((key, offset));
                    offset += raw.len() as u64;
                }
                None => {
                    self.corrupt_records += 1;
                    self.forget(&key);
                }
            }
        }
        file.sync_all().map_err(|e| io_err(&path, e))?;
        let index = index_path(&self.config.dir, new_id);
        segment_index::write(&index, offset, &entries).map_err(|e| io_err(&index, e))?;
        sync_dir(&self.config.dir)?;
        let old: Vec<u64> = self.segments.keys().copied().collect();
        for (key, off) in moved {
            if let Some(r) = self.records.get_mut(&key) {
                r.segment = new_id;
                r.offset = off;
            }
        }
        self.segments = BTreeMap::from([(new_id, offset)]);
        // Oldest first: a tombstone is never deleted before the record it hides.
        for id in old {
            self.delete_segment(id)?;
        }
        sync_dir(&self.config.dir)
    }
}

impl Drop for DiskTier {
    /// Seals the active segment, so the next open reads its index instead of scanning it.
    fn drop(&mut self) {
        // Best effort: without it the next open scans one segment, nothing is lost.
        let _ = self.seal();
        let _ = self.sync();
    }
}
