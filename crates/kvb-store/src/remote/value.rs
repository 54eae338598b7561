//! How chunks sit in the remote store: under `kvb:p:<prefix key>`, the disk tier's checksummed
//! record of the encoded chunk; under `kvb:c:<content key>`, the 32-byte prefix key of a chunk
//! with those tokens (the content index, for chunks reused at another position).

use crate::chunk::KvChunk;
use crate::codec::{decode, encode};
use crate::disk::record::{parse_record, record_bytes, KIND_CHUNK};
use kvb_hash::{ContentKey, Key, PrefixKey};

/// The remote key of a chunk.
pub(crate) fn chunk_key(key: &PrefixKey) -> String {
    format!("kvb:p:{}", key.0.hex())
}

/// The remote key of the content index entry for `key`.
pub(crate) fn content_key(key: &ContentKey) -> String {
    format!("kvb:c:{}", key.0.hex())
}

/// The value stored under [`chunk_key`].
pub(crate) fn chunk_value(chunk: &KvChunk) -> Vec<u8> {
    record_bytes(KIND_CHUNK, &chunk.prefix_key, &encode(chunk))
}

/// The chunk in a value read under `key`'s [`chunk_key`], if the value is whole, its checksum
/// holds, and it is that key's chunk.
pub(crate) fn parse_chunk_value(bytes: &[u8], key: &PrefixKey) -> Result<KvChunk, String> {
    let record = parse_record(bytes, 0).ok_or("not a whole record with a valid checksum")?;
    if record.len != bytes.len() || record.kind != KIND_CHUNK {
        return Err("trailing bytes or not a chunk record".into());
    }
    if record.key != *key {
        return Err(format!("holds chunk {} under key {}", record.key, key));
    }
    let chunk = decode(record.payload)?;
    if chunk.prefix_key != *key {
        return Err(format!(
            "encodes chunk {} under key {}",
            chunk.prefix_key, key
        ));
    }
    chunk.check()?;
    Ok(chunk)
}

/// The prefix key a content index value names.
pub(crate) fn parse_content_value(bytes: &[u8]) -> Result<PrefixKey, String> {
    let key: [u8; 32] = bytes
        .try_into()
        .map_err(|_| format!("a content index value of {} bytes, not 32", bytes.len()))?;
    Ok(PrefixKey(Key(key)))
}
