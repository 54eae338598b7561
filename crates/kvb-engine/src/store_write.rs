//! Writing exact K/V from the pool to the chunk store: a path the pool evicts (write-back of
//! what the store lacks), a resident path when a prompt finds one of its chunks by content, and
//! a finished sequence's new chunks where they will not stay resident (or a warm asks for them).

use crate::blocks::{BlockId, BlockManager};
use crate::kv_transfer::read_layers;
use crate::resident_chunks::ResidentChunks;
use crate::EngineError;
use kvb_chunk::{split, ChunkConfig};
use kvb_hash::{ContentKey, Namespace, PrefixKey};
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

    /// Content keys of the chunks of `tokens` the store lacks (what [`Self::store_sequence`]
    /// would write), for [`ResidentChunks::record`].
    pub fn missing_chunks(&self, tokens: &[u32]) -> Vec<ContentKey> {
        split(tokens, self.chunking, self.namespace)
            .into_iter()
            .filter(|c| c.cacheable && !self.store.contains(&c.prefix_key))
            .map(|c| c.content_key)
            .collect()
    }

    /// Writes the chunks of the resident path that holds content `key` (if `resident` has one)
    /// from the pool's tree blocks to the store, as far as the tree still holds the path exactly.
    /// Best effort: a chunk the store refuses is only a cache entry lost. Returns whether the
    /// store now has that content.
    pub fn store_resident<B: ModelBackend>(
        &self,
        pool: &KvPool<B>,
        resident: &mut ResidentChunks,
        key: &ContentKey,
        blocks: &mut BlockManager,
    ) -> bool {
        let Some(path) = resident.take_path_of(key) else {
            return false;
        };
        let bs = blocks.block_size();
        let m = blocks.lookup(crate::plan::pool_scope(self.namespace), &path, false);
        let mut table = m.blocks[..m.exact_blocks].to_vec();
        let mut covered = m.exact_blocks * bs;
        // The partial block counts only after an all-exact run of full ones.
        let all_exact = m.exact_blocks == m.blocks.len() && !m.partial_approximate;
        if let Some((_, block, used)) = m.partial.filter(|_| all_exact) {
            table.push(block);
            covered += used;
        }
        let covered = covered.min(path.len());
        let _ = self.store_sequence(pool, &table, &path[..covered], pool.head_shape());
        self.store.has_content(key)
    }
}
