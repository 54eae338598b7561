//! Asking the chunk store's remote tier, in one round trip, for every chunk a prompt could use,
//! on the submitting thread (never the scheduler's, whose other sequences would wait on the
//! network): the prompt's own chunks by prefix key (an exact prefix another engine stored), and
//! in chunk-reuse mode, past the prefix this process already holds, the chunks with its tokens
//! stored anywhere (by content key, at every offset with fixed cuts, as the planner probes the
//! local tiers). What comes back lands in the store's RAM tier, where planning finds it like any
//! local chunk.

use crate::config::GenerationMode;
use crate::EngineError;
use kvb_chunk::{split, ChunkConfig, ChunkStrategy};
use kvb_hash::{ContentKey, Namespace, PrefixKey};
use kvb_store::ChunkStore;

/// Prefetches the remote chunks for `tokens` (the last token stays live: its logits start
/// generation). Returns how many came.
pub(crate) fn prefetch_remote(
    store: &ChunkStore,
    namespace: &Namespace,
    chunking: &ChunkConfig,
    tokens: &[u32],
    mode: GenerationMode,
) -> Result<usize, EngineError> {
    let n = tokens.len();
    if mode == GenerationMode::Baseline || n < 2 || !store.has_remote() {
        return Ok(0);
    }
    let chunks = split(&tokens[..n - 1], chunking, namespace);
    let prefix: Vec<PrefixKey> = chunks
        .iter()
        .filter(|c| c.cacheable)
        .map(|c| c.prefix_key)
        .collect();
    // Where this process's own exact prefix ends: a moved chunk is looked for only after it (a
    // resident chat's history is stored locally too, so its next turn asks only for its tail).
    let from = chunks
        .iter()
        .find(|c| !c.cacheable || !store.contains(&c.prefix_key))
        .map_or(n - 1, |c| c.start);
    let mut content: Vec<ContentKey> = Vec::new();
    if mode == GenerationMode::ChunkReuse {
        match chunking.strategy {
            ChunkStrategy::Fixed => {
                let size = chunking.size;
                let mut i = from;
                while i + size < n {
                    content.push(namespace.content_key(&tokens[i..i + size]));
                    i += 1;
                }
            }
            _ => content.extend(
                chunks
                    .iter()
                    .filter(|c| c.cacheable && c.start >= from)
                    .map(|c| c.content_key),
            ),
        }
    }
    Ok(store.prefetch(&prefix, &content)?)
}
