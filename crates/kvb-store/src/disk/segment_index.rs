//! A sealed segment's index file (`seg-N.idx`): every record the segment holds, in order, with
//! what the store's indexes need of a chunk (keys and tokens), so that opening the tier reads
//! these small files instead of every K/V byte.
//!
//! Layout (little-endian): `b"KVBI"`, version `u8`, three zero bytes, the segment's length `u64`,
//! the entry count `u64`, the entries, then a blake3 checksum `[u8; 32]` of everything before it.
//! An entry: kind `u8`, prefix key `[u8; 32]`, offset `u64`, record length `u64`; a chunk's then
//! adds its content key and parent `[u8; 32]` each, its token count `u32` and tokens `u32`.
//!
//! An index is trusted only if its checksum holds, every entry lies inside the segment and the
//! segment still has the length it records; otherwise the segment is scanned as before. The
//! records themselves are verified when read, as every record is.

use super::record::KIND_CHUNK;
use kvb_hash::{ContentKey, Key, PrefixKey};
use std::io::Write;
use std::path::Path;

const MAGIC: &[u8; 4] = b"KVBI";
const VERSION: u8 = 1;

/// One record of a segment, as the index describes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Entry {
    pub kind: u8,
    pub key: PrefixKey,
    pub offset: u64,
    pub len: u64,
    /// A chunk's content key, parent and tokens (`None` for a tombstone).
    pub chunk: Option<(ContentKey, PrefixKey, Vec<u32>)>,
}

/// Writes the index of a segment of `segment_len` bytes, durably: a temporary file, synced, then
/// renamed over `path` (a crash leaves the old index or none, never half of one).
pub(super) fn write(path: &Path, segment_len: u64, entries: &[Entry]) -> std::io::Result<()> {
    let out = encode(segment_len, entries);
    let tmp = path.with_extension("idx.tmp");
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&out)?;
    f.sync_all()?;
    std::fs::rename(&tmp, path)
}

/// The bytes of the index of a segment of `segment_len` bytes holding `entries`.
pub(crate) fn encode(segment_len: u64, entries: &[Entry]) -> Vec<u8> {
    let mut out = Vec::with_capacity(24 + entries.len() * 160);
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&[VERSION, 0, 0, 0]);
    out.extend_from_slice(&segment_len.to_le_bytes());
    out.extend_from_slice(&(entries.len() as u64).to_le_bytes());
    for e in entries {
        out.push(e.kind);
        out.extend_from_slice(e.key.bytes());
        out.extend_from_slice(&e.offset.to_le_bytes());
        out.extend_from_slice(&e.len.to_le_bytes());
        if let Some((content, parent, tokens)) = &e.chunk {
            out.extend_from_slice(content.bytes());
            out.extend_from_slice(parent.bytes());
            out.extend_from_slice(&(tokens.len() as u32).to_le_bytes());
            for t in tokens {
                out.extend_from_slice(&t.to_le_bytes());
            }
        }
    }
    let sum = blake3::hash(&out);
    out.extend_from_slice(sum.as_bytes());
    out
}

/// The entries of the index at `path` if it is whole, intact and describes a segment of
/// `segment_len` bytes; `None` otherwise (then the caller scans the segment).
pub(super) fn read(path: &Path, segment_len: u64) -> Option<Vec<Entry>> {
    parse(&std::fs::read(path).ok()?, segment_len)
}

/// The entries of the index `bytes`, as [`read`] says.
pub(crate) fn parse(bytes: &[u8], segment_len: u64) -> Option<Vec<Entry>> {
    let body_len = bytes.len().checked_sub(32)?;
    let (body, sum) = bytes.split_at(body_len);
    if blake3::hash(body).as_bytes() != sum {
        return None;
    }
    let mut r = Reader {
        bytes: body,
        pos: 0,
    };
    if r.take(4)? != MAGIC || r.take(4)? != [VERSION, 0, 0, 0] {
        return None;
    }
    if r.u64()? != segment_len {
        return None;
    }
    let count = r.u64()?;
    // Every entry takes at least 49 bytes: a count beyond that is a lie, not an allocation.
    if count > (body.len() / 49) as u64 {
        return None;
    }
    let mut entries = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let kind = r.take(1)?[0];
        let key = PrefixKey(r.key()?);
        let (offset, len) = (r.u64()?, r.u64()?);
        if offset.checked_add(len)? > segment_len {
            return None;
        }
        let chunk = if kind == KIND_CHUNK {
            let content = ContentKey(r.key()?);
            let parent = PrefixKey(r.key()?);
            let n = r.u32()? as usize;
            let raw = r.take(n.checked_mul(4)?)?;
            let tokens = raw
                .chunks_exact(4)
                .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                .collect();
            Some((content, parent, tokens))
        } else {
            None
        };
        entries.push(Entry {
            kind,
            key,
            offset,
            len,
            chunk,
        });
    }
    (r.pos == body.len()).then_some(entries)
}

/// A bounds-checked cursor over the index's bytes.
struct Reader<'a> {
    bytes: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let out = self.bytes.get(self.pos..self.pos.checked_add(n)?)?;
        self.pos += n;
        Some(out)
    }

    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }

    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }

    fn key(&mut self) -> Option<Key> {
        Some(Key(self.take(32)?.try_into().ok()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn entries(seed: u8, n: usize) -> Vec<Entry> {
        (0..n)
            .map(|i| Entry {
                kind: if i % 3 == 2 { 2 } else { KIND_CHUNK },
                key: PrefixKey(Key([seed.wrapping_add(i as u8); 32])),
                offset: 100 * i as u64,
                len: 90,
                chunk: (i % 3 != 2).then(|| {
                    (
                        ContentKey(Key([i as u8; 32])),
                        PrefixKey(Key([7; 32])),
                        (0..i as u32).collect(),
                    )
                }),
            })
            .collect()
    }

    proptest! {
        /// An index reads back as written; any flipped byte, any truncation or a segment of
        /// another length makes it untrusted (`None`), never a wrong entry or a panic.
        #[test]
        fn an_index_reads_back_or_not_at_all(
            seed in any::<u8>(), n in 0usize..12, flip in any::<prop::sample::Index>(), x in 1u8..,
            cut in any::<prop::sample::Index>(),
        ) {
            let dir = tempfile::tempdir().unwrap();
            let path = dir.path().join("seg.idx");
            let want = entries(seed, n);
            let segment_len = 100 * n as u64 + 10;
            write(&path, segment_len, &want).unwrap();
            prop_assert_eq!(read(&path, segment_len), Some(want));
            prop_assert_eq!(read(&path, segment_len + 1), None);
            let bytes = std::fs::read(&path).unwrap();
            let mut flipped = bytes.clone();
            flipped[flip.index(bytes.len())] ^= x;
            std::fs::write(&path, &flipped).unwrap();
            prop_assert_eq!(read(&path, segment_len), None);
            std::fs::write(&path, &bytes[..cut.index(bytes.len())]).unwrap();
            prop_assert_eq!(read(&path, segment_len), None);
        }
    }
}
