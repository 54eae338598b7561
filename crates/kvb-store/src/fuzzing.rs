//! Entry points for fuzzing (cargo feature `fuzzing`; the targets in `fuzz/` at the workspace root
//! call them). Each reads bytes it did not write the way the store does, and checks a property
//! on top of "no panic": what decodes re-encodes to the same thing, and a damaged segment never
//! yields a record that was not written. Where a checksum guards a parser, the entry makes the
//! checksum hold, since a fuzzer could never guess one, so that fuzzing reaches the parser.

use crate::codec::{decode, decode_meta, encode};
use crate::disk::{record, segment_index, DiskConfig, DiskTier};
use kvb_hash::{Key, PrefixKey};
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};

/// The chunk codec on arbitrary bytes: a chunk that decodes encodes to bytes that decode to it
/// again, and its metadata decodes alone to the same values.
pub fn codec(bytes: &[u8]) {
    let meta = decode_meta(bytes);
    let Ok(chunk) = decode(bytes) else {
        return;
    };
    let meta = meta.expect("a chunk that decodes has metadata that decodes");
    assert_eq!(meta.prefix_key, chunk.prefix_key);
    assert_eq!(meta.tokens, chunk.tokens);
    // Compared as bytes: values may be NaN, which no float comparison calls equal.
    let encoded = encode(&chunk);
    let again = decode(&encoded).expect("an encoded chunk decodes");
    assert_eq!(
        encode(&again),
        encoded,
        "decode(encode(chunk)) differs from chunk"
    );
}

/// A segment of raw bytes, scanned as opening the tier scans it; every intact chunk record's
/// payload decoded as reading it does.
pub fn segment(bytes: &[u8]) {
    let (records, _corrupt) = record::scan(bytes);
    for r in records {
        assert!(
            r.offset + r.len <= bytes.len(),
            "a record beyond the segment"
        );
        let _ = decode(r.payload);
    }
}

/// Records written whole (kind, key byte, payload each), then the segment damaged: the byte at
/// `flip.0` (modulo the length) xor-ed with `flip.1`, and `cut` bytes dropped from the end. A
/// scan must return only records among those written, byte for byte.
pub fn damaged_segment(records: &[(u8, u8, Vec<u8>)], flip: (usize, u8), cut: usize) {
    let written: Vec<(u8, PrefixKey, &[u8])> = records
        .iter()
        .map(|(kind, key, payload)| (*kind, PrefixKey(Key([*key; 32])), payload.as_slice()))
        .collect();
    let mut bytes: Vec<u8> = written
        .iter()
        .flat_map(|(kind, key, payload)| record::record_bytes(*kind, key, payload))
        .collect();
    if !bytes.is_empty() {
        let at = flip.0 % bytes.len();
        bytes[at] ^= flip.1;
    }
    bytes.truncate(bytes.len().saturating_sub(cut));
    for r in record::scan(&bytes).0 {
        assert!(
            written.iter().any(|(kind, key, payload)| r.kind == *kind
                && r.key == *key
                && r.payload == *payload),
            "a scan of a damaged segment returned a record never written"
        );
    }
}

/// A segment index body (its checksum appended here): one that parses encodes back to the same
/// bytes, and every entry lies inside the segment.
pub fn segment_index(body: &[u8], segment_len: u64) {
    let mut bytes = body.to_vec();
    bytes.extend_from_slice(blake3::hash(body).as_bytes());
    let Some(entries) = segment_index::parse(&bytes, segment_len) else {
        return;
    };
    for e in &entries {
        assert!(
            e.offset + e.len <= segment_len,
            "an entry beyond its segment"
        );
    }
    assert_eq!(
        segment_index::encode(segment_len, &entries),
        bytes,
        "a parsed index encodes to other bytes"
    );
}

/// A disk folder holding `segment` as its one segment, with `index` (its checksum appended
/// here) as that segment's index when given: opening it is an error or a tier whose every
/// record reads back as a chunk under its own key or as nothing, within the budget.
pub fn disk_folder(segment: &[u8], index: Option<&[u8]>, max_bytes: u64) {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let dir: PathBuf = std::env::temp_dir().join(format!(
        "kvb-fuzz-disk-{}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch folder");
    std::fs::write(dir.join("seg-0000000000.kvb"), segment).expect("writing the segment");
    if let Some(body) = index {
        let mut bytes = body.to_vec();
        bytes.extend_from_slice(blake3::hash(body).as_bytes());
        std::fs::write(dir.join("seg-0000000000.idx"), bytes).expect("writing the index");
    }
    if let Ok(mut tier) = DiskTier::open(DiskConfig::new(&dir, max_bytes)) {
        assert!(tier.live_bytes() <= max_bytes, "the budget does not hold");
        let keys: Vec<PrefixKey> = tier.records().map(|(k, _)| *k).collect();
        for key in keys {
            if let Some(chunk) = tier.get(&key, 0) {
                assert_eq!(chunk.prefix_key, key, "a chunk read under another key");
            }
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Seed inputs for the store's targets, made by the writers the tier itself uses: `(target,
/// file name, bytes)`. Two chunks (f32, and KIVI 4-bit), their records in a segment with a
/// tombstone, the segment's index, and folders holding both (with and without the index).
pub fn seeds() -> Vec<(&'static str, &'static str, Vec<u8>)> {
    use crate::chunk::{KvChunk, KvFormat, LayerKv};
    use kvb_hash::ContentKey;
    use kvb_quant::{Bits, QuantConfig};

    let chunk = |n: u8, format: KvFormat| -> KvChunk {
        let (tokens, kv_heads, head_dim) = (3usize, 2usize, 4usize);
        let shape = [kv_heads, tokens, head_dim];
        let values = |salt: usize| -> Vec<f32> {
            (0..tokens * kv_heads * head_dim)
                .map(|i| ((i * 7 + salt * 13) % 17) as f32 / 8.0 - 1.0)
                .collect()
        };
        let layer = |l: usize| LayerKv {
            k: format
                .encode(values(2 * l), shape, true)
                .expect("a seed encodes"),
            v: format
                .encode(values(2 * l + 1), shape, false)
                .expect("a seed encodes"),
        };
        KvChunk {
            prefix_key: PrefixKey(Key([n; 32])),
            content_key: ContentKey(Key([n + 100; 32])),
            parent: PrefixKey(Key([n.wrapping_sub(1); 32])),
            tokens: (0..tokens as u32).map(|t| t + u32::from(n) * 10).collect(),
            positions: (0..tokens as u32).collect(),
            kv_heads,
            head_dim,
            layers: (0..2).map(layer).collect(),
        }
    };
    let kivi = KvFormat::Kivi(QuantConfig {
        bits: Bits::Four,
        group_size: 2,
    });
    let chunks = [chunk(1, KvFormat::F32), chunk(2, kivi)];
    let mut segment = Vec::new();
    let mut entries = Vec::new();
    for c in &chunks {
        let bytes = record::record_bytes(record::KIND_CHUNK, &c.prefix_key, &encode(c));
        entries.push(segment_index::Entry {
            kind: record::KIND_CHUNK,
            key: c.prefix_key,
            offset: segment.len() as u64,
            len: bytes.len() as u64,
            chunk: Some((c.content_key, c.parent, c.tokens.clone())),
        });
        segment.extend_from_slice(&bytes);
    }
    let tombstone = record::record_bytes(record::KIND_TOMBSTONE, &chunks[0].prefix_key, &[]);
    entries.push(segment_index::Entry {
        kind: record::KIND_TOMBSTONE,
        key: chunks[0].prefix_key,
        offset: segment.len() as u64,
        len: tombstone.len() as u64,
        chunk: None,
    });
    segment.extend_from_slice(&tombstone);
    let index = segment_index::encode(segment.len() as u64, &entries);
    let index_body = index[..index.len() - 32].to_vec();

    let mut index_input = (segment.len() as u64).to_le_bytes().to_vec();
    index_input.extend_from_slice(&index_body);
    // The store_folder target's input: the budget (u32), the index body's length (u32; all ones
    // for no index), the index body, then the segment.
    let folder = |with_index: bool| -> Vec<u8> {
        let mut out = 1_000_000u32.to_le_bytes().to_vec();
        if with_index {
            out.extend_from_slice(&(index_body.len() as u32).to_le_bytes());
            out.extend_from_slice(&index_body);
        } else {
            out.extend_from_slice(&u32::MAX.to_le_bytes());
        }
        out.extend_from_slice(&segment);
        out
    };
    vec![
        ("store_codec", "f32.chunk", encode(&chunks[0])),
        ("store_codec", "kivi4.chunk", encode(&chunks[1])),
        (
            "store_segment",
            "two-chunks-and-a-tombstone.kvb",
            segment.clone(),
        ),
        ("store_index", "two-chunks-and-a-tombstone.idx", index_input),
        ("store_folder", "with-index.bin", folder(true)),
        ("store_folder", "without-index.bin", folder(false)),
    ]
}
