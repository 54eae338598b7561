//! The disk tier: append-only segment files of checksummed records.
//!
//! Record layout (little-endian): `b"KVBR"`, version `u8`, kind `u8` (1 chunk, 2 tombstone), two
//! zero bytes, payload length `u64`, prefix key `[u8; 32]`, blake3 checksum `[u8; 32]` of all the
//! header bytes before it and the payload, then the payload (an encoded chunk).
//!
//! Crash safety: records are only appended; the index is rebuilt on open by scanning every segment
//! and verifying every checksum. A torn or corrupt record is skipped and counted (the scan resyncs
//! on the next record magic), never returned. A record is checked again when read. Compaction
//! writes live records to a new segment, syncs it, and only then deletes the old segments; a crash
//! in between leaves duplicates, which the next open resolves (later records win).

use crate::chunk::KvChunk;
use crate::codec::{decode, decode_meta, encode};
use kvb_hash::{ContentKey, PrefixKey};
use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 4] = b"KVBR";
const VERSION: u8 = 1;
const KIND_CHUNK: u8 = 1;
const KIND_TOMBSTONE: u8 = 2;
const HEADER: usize = 80;

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

pub(crate) struct DiskTier {
    config: DiskConfig,
    records: HashMap<PrefixKey, Record>,
    /// Segment id -> bytes in the file.
    segments: BTreeMap<u64, u64>,
    active: Option<(u64, File)>,
    live_bytes: u64,
    /// Torn or corrupt records met (at open or on read).
    pub corrupt_records: u64,
}

fn io_err(path: &Path, e: std::io::Error) -> String {
    format!("{}: {e}", path.display())
}

fn segment_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("seg-{id:010}.kvb"))
}

/// The checksum of a record: its header fields before the checksum, then its payload.
fn checksum(head: &[u8], payload: &[u8]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(&head[..HEADER - 32]);
    h.update(payload);
    *h.finalize().as_bytes()
}

fn record_bytes(kind: u8, key: &PrefixKey, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(HEADER + payload.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[VERSION, kind, 0, 0]);
    out.extend_from_slice(&(payload.len() as u64).to_le_bytes());
    out.extend_from_slice(key.bytes());
    let sum = checksum(&out, payload);
    out.extend_from_slice(&sum);
    out.extend_from_slice(payload);
    out
}

/// A verified record found by a scan.
struct Scanned<'a> {
    kind: u8,
    key: PrefixKey,
    payload: &'a [u8],
    offset: usize,
    len: usize,
}

/// Parses the record at `pos`, if it is whole and its checksum holds.
fn parse_record(bytes: &[u8], pos: usize) -> Option<Scanned<'_>> {
    let header = bytes.get(pos..pos + HEADER)?;
    if &header[..4] != MAGIC || header[4] != VERSION {
        return None;
    }
    let kind = header[5];
    let len = u64::from_le_bytes(header[8..16].try_into().ok()?);
    let end = (pos + HEADER).checked_add(usize::try_from(len).ok()?)?;
    let payload = bytes.get(pos + HEADER..end)?;
    if checksum(header, payload) != header[48..80] {
        return None;
    }
    let mut key = [0u8; 32];
    key.copy_from_slice(&header[16..48]);
    Some(Scanned {
        kind,
        key: PrefixKey(kvb_hash::Key(key)),
        payload,
        offset: pos,
        len: end - pos,
    })
}

/// Every intact record of a segment, in order; the count of corrupt stretches skipped.
fn scan(bytes: &[u8]) -> (Vec<Scanned<'_>>, u64) {
    let mut out = Vec::new();
    let mut corrupt = 0;
    let mut pos = 0;
    while pos < bytes.len() {
        match parse_record(bytes, pos) {
            Some(r) => {
                pos += r.len;
                out.push(r);
            }
            None => {
                corrupt += 1;
                // Resync on the next magic; checksums make a false match harmless.
                match bytes[pos + 1..].windows(4).position(|w| w == MAGIC) {
                    Some(skip) => pos += 1 + skip,
                    None => break,
                }
            }
        }
    }
    (out, corrupt)
}

impl DiskTier {
    /// Opens (or creates) the tier, rebuilding its index from the segments.
    pub fn open(config: DiskConfig) -> Result<Self, String> {
        std::fs::create_dir_all(&config.dir).map_err(|e| io_err(&config.dir, e))?;
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
            corrupt_records: 0,
        };
        for id in ids {
            let path = segment_path(&tier.config.dir, id);
            let bytes = std::fs::read(&path).map_err(|e| io_err(&path, e))?;
            let (records, corrupt) = scan(&bytes);
            tier.corrupt_records += corrupt;
            tier.segments.insert(id, bytes.len() as u64);
            for r in records {
                tier.forget(&r.key);
                if r.kind != KIND_CHUNK {
                    continue; // a tombstone: the key stays forgotten
                }
                match decode_meta(r.payload) {
                    Ok(meta) if meta.prefix_key == r.key => {
                        tier.live_bytes += r.len as u64;
                        tier.records.insert(
                            r.key,
                            Record {
                                segment: id,
                                offset: r.offset as u64,
                                len: r.len as u64,
                                content_key: meta.content_key,
                                parent: meta.parent,
                                tokens: meta.tokens,
                                last_access: 0,
                            },
                        );
                    }
                    _ => tier.corrupt_records += 1,
                }
            }
        }
        Ok(tier)
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

    fn append(&mut self, bytes: &[u8]) -> Result<(u64, u64), String> {
        let needs_new = match &self.active {
            None => true,
            Some((id, _)) => {
                self.segments.get(id).copied().unwrap_or(0) >= self.config.segment_bytes
            }
        };
        if needs_new {
            let id = self.segments.keys().next_back().map_or(0, |m| m + 1);
            let path = segment_path(&self.config.dir, id);
            let file = OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                .map_err(|e| io_err(&path, e))?;
            self.segments.insert(id, 0);
            self.active = Some((id, file));
        }
        let (id, file) = self.active.as_mut().ok_or("no active segment")?;
        let offset = self.segments[id];
        file.write_all(bytes)
            .map_err(|e| io_err(&segment_path(&self.config.dir, *id), e))?;
        let id = *id;
        *self.segments.get_mut(&id).ok_or("segment vanished")? += bytes.len() as u64;
        Ok((id, offset))
    }

    /// Writes `chunk`, dropping least recently used records to stay within the budget. Returns the
    /// (prefix, content) keys dropped, or `None` if the chunk alone exceeds the budget.
    pub fn put(
        &mut self,
        chunk: &KvChunk,
        now: u64,
    ) -> Result<Option<Vec<(PrefixKey, ContentKey)>>, String> {
        if self.records.contains_key(&chunk.prefix_key) {
            return Ok(Some(Vec::new()));
        }
        let bytes = record_bytes(KIND_CHUNK, &chunk.prefix_key, &encode(chunk));
        let len = bytes.len() as u64;
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
            if let Some(r) = self.forget(&victim) {
                dropped.push((victim, r.content_key));
            }
        }
        let (segment, offset) = self.append(&bytes)?;
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
            (rec.key == *key && c.prefix_key == *key).then_some(c)
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

    /// Forgets `key` durably (a tombstone record), if present.
    pub fn remove(&mut self, key: &PrefixKey) -> Result<bool, String> {
        if self.forget(key).is_none() {
            return Ok(false);
        }
        self.append(&record_bytes(KIND_TOMBSTONE, key, &[]))?;
        Ok(true)
    }

    /// Forgets every record and deletes the segment files.
    pub fn clear(&mut self) -> Result<(), String> {
        self.active = None;
        for id in std::mem::take(&mut self.segments).into_keys() {
            let p = segment_path(&self.config.dir, id);
            std::fs::remove_file(&p).map_err(|e| io_err(&p, e))?;
        }
        self.records.clear();
        self.live_bytes = 0;
        Ok(())
    }

    /// Rewrites live records into a fresh segment, syncs it, then deletes the older segments.
    pub fn compact(&mut self) -> Result<(), String> {
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
        for key in keys {
            let r = self.records[&key].clone();
            match self
                .read_raw(&r)
                .ok()
                .filter(|raw| parse_record(raw, 0).is_some())
            {
                Some(raw) => {
                    file.write_all(&raw).map_err(|e| io_err(&path, e))?;
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
        let old: Vec<u64> = self.segments.keys().copied().collect();
        for (key, off) in moved {
            if let Some(r) = self.records.get_mut(&key) {
                r.segment = new_id;
                r.offset = off;
            }
        }
        self.active = Some((new_id, file));
        self.segments = BTreeMap::from([(new_id, offset)]);
        for id in old {
            let p = segment_path(&self.config.dir, id);
            std::fs::remove_file(&p).map_err(|e| io_err(&p, e))?;
        }
        Ok(())
    }
}
