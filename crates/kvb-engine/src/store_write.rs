//! Writing exact K/V from the pool to the chunk store: a finished sequence's new chunks
//! (write-through, so a document first read inside a prompt is found by content later, and the
//! disk tier keeps what was learned), and a path the pool evicts (write-back of what the store
//! lacks).

use crate::blocks::BlockId;
use crate::kv_transfer::read_layers;
use crate::EngineError;
use kvb_chunk::{split, ChunkConfig};
use kvb_hash::{Namespace, PrefixKey};
use kvb_model::{KvPool, ModelBackend};
use kvb_store::{ChunkStore, Inserted, KvChunk, KvFormat};

/// Where to store, and how.
pub(crate) struct StoreWriter<'a> {
    pub store: &'a ChunkStore,
    pub namespace: &'a Namespace,
    pub chunking: &'a ChunkConfig,
    pub format: KvFormat,
}

impl StoreWriter<'_> {
    /// Stores the chunks of `tokens` (the tokens of a sequence's slots `0..tokens.len()`, whose
    /// K/V is exact and sits in `pool` through `table`) that the store lacks. Returns (chunks,
    /// bytes) stored.
    pub fn store_sequence<B: ModelBackend>(
        &self,
        pool: &KvPool<B>,
        table: &[BlockId],
        tokens: &[u32],
        (kv_heads, head_dim): (usize, usize),
    ) -> Result<(usize, usize), EngineError> {
        let mut parent: PrefixKey = self.namespace.root();
        let (mut count, mut bytes) = (0, 0);
        for c in split(tokens, self.chunking, self.namespace) {
            let key = c.prefix_key;
            if c.cacheable && !self.store.contains(&key) {
                let chunk = KvChunk {
                    prefix_key: key,
                    content_key: c.content_key,
                    parent,
                    positions: (c.start as u32..c.end as u32).collect(),
                    kv_heads,
                    head_dim,
                    layers: read_layers(pool, table, c.span(), self.format)?,
                    tokens: c.tokens,
                };
                let size = chunk.bytes();
                if self.store.insert(chunk)? != Inserted::Rejected {
                    count += 1;
                    bytes += size;
                }
            }
            parent = key;
        }
        Ok((count, bytes))
    }
}
