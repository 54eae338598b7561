//! A disk record: `b"KVBR"`, version `u8`, kind `u8` (1 chunk, 2 tombstone), two zero bytes,
//! payload length `u64`, prefix key `[u8; 32]`, blake3 checksum `[u8; 32]` of all the header
//! bytes before it and the payload, then the payload (an encoded chunk; empty for a tombstone).
//! Little-endian. A record is whole and intact or it is not a record: [`parse_record`] checks
//! its checksum, and [`scan`] resynchronises past anything else.

use kvb_hash::PrefixKey;

pub(super) const MAGIC: &[u8; 4] = b"KVBR";
pub(super) const VERSION: u8 = 1;
pub(crate) const KIND_CHUNK: u8 = 1;
pub(crate) const KIND_TOMBSTONE: u8 = 2;
pub(super) const HEADER: usize = 80;

/// The checksum of a record: its header fields before the checksum, then its payload.
fn checksum(head: &[u8], payload: &[u8]) -> [u8; 32] {
    let mut h = blake3::Hasher::new();
    h.update(&head[..HEADER - 32]);
    h.update(payload);
    *h.finalize().as_bytes()
}

pub(crate) fn record_bytes(kind: u8, key: &PrefixKey, payload: &[u8]) -> Vec<u8> {
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
pub(crate) struct Scanned<'a> {
    pub kind: u8,
    pub key: PrefixKey,
    pub payload: &'a [u8],
    pub offset: usize,
    pub len: usize,
}

/// Parses the record at `pos`, if it is whole and its checksum holds.
pub(crate) fn parse_record(bytes: &[u8], pos: usize) -> Option<Scanned<'_>> {
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
pub(crate) fn scan(bytes: &[u8]) -> (Vec<Scanned<'_>>, u64) {
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
