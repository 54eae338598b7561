//! What the cache offers a prompt, decided before anything is copied or computed: resident blocks
//! of the pool (read in place), the chunk store's longest prefix (written into fresh blocks), and
//! chunks stored elsewhere whose tokens reappear later in the prompt (re-rotated and repaired).
//! Pure over the block manager and the store (no model, no tensors), but for one callback: a
//! chunk found by content that only the pool holds is written to the store first.

use crate::blocks::{BlockId, BlockManager, NodeId, Scope, ROOT};
use crate::config::{EngineConfig, GenerationMode};
use crate::EngineError;
use kvb_chunk::{split, ChunkConfig, ChunkStrategy};
use kvb_hash::{ContentKey, Namespace};
use kvb_store::{ChunkStore, KvChunk};
use std::ops::Range;
use std::sync::Arc;

/// Tokens `range` of a stored chunk, to place at slot `start` of the prompt.
#[derive(Debug, Clone)]
pub(crate) struct Piece {
    pub start: usize,
    pub chunk: Arc<KvChunk>,
    pub range: Range<usize>,
}

impl Piece {
    /// One past the last slot it fills.
    pub fn end(&self) -> usize {
        self.start + self.range.len()
    }
}

/// Neighbouring tokens shorter than this are not worth a piece of their own.
const MIN_EXTENSION: usize = 4;

/// What the cache holds for a prompt.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    /// Resident full blocks from slot 0, read in place.
    pub pool_blocks: Vec<BlockId>,
    /// The radix tree node of the last of them (the root without any).
    pub pool_node: NodeId,
    /// A resident block matched in part after them: copied (the sequence will write the rest).
    pub pool_partial: Option<(BlockId, usize)>,
    /// Slots from here on, among the pool's, hold repaired (approximate) K/V.
    pub pool_approximate_from: Option<usize>,
    /// Exact store chunks continuing the pool's prefix, in order.
    pub store: Vec<Piece>,
    /// Chunks found by content after the prefix, in order, without overlap.
    pub interior: Vec<Piece>,
}

impl Plan {
    /// Slots the pool covers.
    pub fn pool_tokens(&self, block_size: usize) -> usize {
        self.pool_blocks.len() * block_size + self.pool_partial.map_or(0, |p| p.1)
    }

    /// Slots covered from 0, by the pool and the store's prefix.
    pub fn prefix_end(&self, block_size: usize) -> usize {
        self.store
            .last()
            .map_or(self.pool_tokens(block_size), Piece::end)
    }
}

/// Writes to the store the chunks a resident sequence holds with this content, if one does
/// (see [`crate::resident_chunks`]); returns whether the store now has that content.
pub(crate) type StoreResident<'a> = &'a mut dyn FnMut(&ContentKey, &mut BlockManager) -> bool;

/// The pool tree's scope of the requests keyed under `namespace`: a tenant's blocks are found
/// only by its own requests, as its store entries are.
pub(crate) fn pool_scope(namespace: &Namespace) -> Scope {
    Scope(namespace.id().0)
}

/// The engine's view for planning.
pub(crate) struct Planner<'a> {
    pub store: &'a ChunkStore,
    pub namespace: &'a Namespace,
    pub chunking: &'a ChunkConfig,
    pub config: &'a EngineConfig,
}

impl Planner<'_> {
    /// What the cache offers `tokens` under `mode`. The last token is always left to compute,
    /// since its logits start generation.
    pub fn plan(
        &self,
        tokens: &[u32],
        mode: GenerationMode,
        blocks: &mut BlockManager,
        store_resident: StoreResident,
    ) -> Result<Plan, EngineError> {
        let n = tokens.len();
        let mut plan = Plan::default();
        if mode == GenerationMode::Baseline || n < 2 {
            return Ok(plan);
        }
        let bs = blocks.block_size();
        let whole_only = mode == GenerationMode::PrefixCache;
        let allow_approximate = mode == GenerationMode::ChunkReuse && self.config.reuse_repaired;
        let m = blocks.lookup(
            pool_scope(self.namespace),
            &tokens[..n - 1],
            allow_approximate,
        );
        plan.pool_blocks = m.blocks.clone();
        let node_of = |k: usize| if k == 0 { ROOT } else { m.nodes[k - 1] };
        if whole_only {
            plan.pool_blocks.truncate(m.exact_blocks);
        } else {
            plan.pool_partial = m.partial.map(|(_, b, used)| (b, used));
            if m.exact_blocks < m.blocks.len() || m.partial_approximate {
                plan.pool_approximate_from = Some(m.exact_blocks * bs);
            }
        }

        // The store's exact prefix, when it reaches further than the pool: then only the pool's
        // exact blocks are kept (exact K/V beats repaired K/V of the same tokens).
        if let Some(sm) = self
            .store
            .longest_prefix(self.namespace.root(), &tokens[..n - 1])?
        {
            let mut chunks = sm.chunks;
            if whole_only {
                while chunks.last().is_some_and(|(c, used)| *used < c.len()) {
                    chunks.pop();
                }
            }
            let store_end: usize = chunks.iter().map(|(_, used)| used).sum();
            if store_end > plan.pool_tokens(bs) {
                let exact = if let Some(from) = plan.pool_approximate_from {
                    from / bs
                } else {
                    plan.pool_blocks.len()
                };
                plan.pool_blocks.truncate(exact);
                plan.pool_partial = None;
                plan.pool_approximate_from = None;
                let from = plan.pool_tokens(bs);
                let mut at = 0;
                for (chunk, used) in chunks {
                    let (c0, c1) = (at, at + used);
                    at = c1;
                    if c1 <= from {
                        continue;
                    }
                    let skip = from.saturating_sub(c0);
                    plan.store.push(Piece {
                        start: c0 + skip,
                        range: skip..used,
                        chunk,
                    });
                }
            }
        }
        plan.pool_node = node_of(plan.pool_blocks.len());
        if mode == GenerationMode::ChunkReuse {
            plan.interior =
                self.find_interior(tokens, plan.prefix_end(bs), blocks, store_resident)?;
        }
        Ok(plan)
    }

    /// Chunks stored elsewhere whose tokens reappear in `tokens[from..n-1]`, in order, without
    /// overlap. With fixed chunking a moved document rarely starts on this prompt's chunk grid, so
    /// every offset is probed (one content key and one index probe each: ~1 us per position);
    /// content-defined cuts (boundary window, semantic) shift with the text, so there the prompt's
    /// own chunks are looked up.
    fn find_interior(
        &self,
        tokens: &[u32],
        from: usize,
        blocks: &mut BlockManager,
        store_resident: StoreResident,
    ) -> Result<Vec<Piece>, EngineError> {
        let n = tokens.len();
        let mut found = Vec::new();
        let mut stored = |key: &ContentKey| -> Result<bool, EngineError> {
            Ok(self.store.has_content(key) || store_resident(key, blocks))
        };
        let take =
            |start: usize, window: &[u32], found: &mut Vec<Piece>| -> Result<bool, EngineError> {
                let key = self.namespace.content_key(window);
                match self.store.get_by_content(&key)? {
                    Some(m) if m.chunk.tokens == window => {
                        found.push(Piece {
                            start,
                            range: 0..m.chunk.len(),
                            chunk: m.chunk,
                        });
                        Ok(true)
                    }
                    _ => Ok(false),
                }
            };
        match self.chunking.strategy {
            ChunkStrategy::Fixed => {
                let size = self.chunking.size;
                let mut i = from;
                // The last token stays live: its logits start generation.
                while i + size < n {
                    let window = &tokens[i..i + size];
                    if stored(&self.namespace.content_key(window))? && take(i, window, &mut found)?
                    {
                        i += size;
                    } else {
                        i += 1;
                    }
                }
            }
            _ => {
                for c in split(tokens, self.chunking, self.namespace) {
                    if c.start >= from && c.end < n && c.cacheable && stored(&c.content_key)? {
                        take(c.start, &c.tokens, &mut found)?;
                    }
                }
            }
        }
        self.extend_runs(tokens, from, found)
    }

    /// Widens each run of chunks found by content with the neighbours they had where they were
    /// computed: the end of the chunk before (the first one's parent) and the chunks after (the
    /// last one's children), as far as their tokens match this prompt. A moved document rarely
    /// sits on the chunk grid it was stored on; without this its partial first and last chunks
    /// would be recomputed.
    fn extend_runs(
        &self,
        tokens: &[u32],
        from: usize,
        found: Vec<Piece>,
    ) -> Result<Vec<Piece>, EngineError> {
        let n = tokens.len();
        let mut out: Vec<Piece> = Vec::with_capacity(found.len() + 2);
        let mut i = 0;
        while i < found.len() {
            let mut j = i + 1;
            while j < found.len() && found[j].start == found[j - 1].end() {
                j += 1;
            }
            let floor = out.last().map_or(from, Piece::end);
            let first = &found[i];
            if first.start > floor {
                // The store has no chunk under the root key: a run from position 0 stops here.
                if let Some(parent) = self.store.get(&first.chunk.parent)? {
                    let m = parent
                        .tokens
                        .iter()
                        .rev()
                        .zip(tokens[floor..first.start].iter().rev())
                        .take_while(|(a, b)| a == b)
                        .count();
                    if m >= MIN_EXTENSION {
                        out.push(Piece {
                            start: first.start - m,
                            range: parent.len() - m..parent.len(),
                            chunk: parent,
                        });
                    }
                }
            }
            out.extend(found[i..j].iter().cloned());
            let last = &found[j - 1];
            // Up to the next run, and the last token stays live.
            let limit = found.get(j).map_or(n - 1, |next| next.start);
            let mut at = last.end();
            if at < limit {
                if let Some(m) = self
                    .store
                    .longest_prefix(last.chunk.prefix_key, &tokens[at..limit])?
                {
                    for (chunk, used) in m.chunks {
                        if used < MIN_EXTENSION {
                            break;
                        }
                        out.push(Piece {
                            start: at,
                            range: 0..used,
                            chunk,
                        });
                        at += used;
                    }
                }
            }
            i = j;
        }
        Ok(out)
    }
}

/// Groups adjacent pieces into runs, each placed and repaired as one span, with its seams: the
/// run's first slot, and every piece boundary where the two pieces were not computed together
/// (the second is not the stored continuation of the first).
pub(crate) fn runs(pieces: &[Piece]) -> Vec<(Vec<Piece>, Vec<usize>)> {
    let mut out: Vec<(Vec<Piece>, Vec<usize>)> = Vec::new();
    for p in pieces {
        match out.last_mut() {
            Some((run, seams)) if run.last().is_some_and(|l| l.end() == p.start) => {
                let prev = run.last().expect("a run is never empty");
                let continues = p.chunk.parent == prev.chunk.prefix_key
                    && prev.range.end == prev.chunk.len()
                    && p.range.start == 0;
                if !continues {
                    seams.push(p.start);
                }
                run.push(p.clone());
            }
            _ => out.push((vec![p.clone()], vec![p.start])),
        }
    }
    out
}
