//! # kvb-blocks: the bookkeeping of a paged K/V pool
//!
//! Which blocks are free, who reads each one, and which token prefixes stay resident, without
//! tensors or any dependency: a runtime that owns its K/V pool (burn, candle, its own) keeps its
//! block tables with it and reuses resident prefixes across requests.
//!
//! - [`BlockAllocator`]: blocks with reference counts under a block budget.
//! - [`BlockTree`]: a radix tree over token blocks (SGLang's RadixAttention, block granular):
//!   every finished or running sequence's blocks stay indexed by their tokens until the pool needs
//!   the room; then the least recently used leaves go first.
//! - [`BlockManager`]: both, kept consistent: a block's count is the number of sequence tables
//!   that hold it plus one if the tree does.
//!
//! Promises (model-based property test, `tests/block_manager.rs`): counts never leak (after every
//! sequence ends and the tree is cleared, every block is free); a block a sequence writes is held
//! by nobody else; the tree returns the longest resident prefix; the budget is never exceeded;
//! eviction never takes a block a sequence holds; a lookup in one [`Scope`] (a tenant) never
//! returns a block indexed in another.
//!
//! ```
//! use kvb_blocks::{BlockManager, IndexCursor, Scope};
//! let mut pool = BlockManager::new(4, 8); // blocks of 4 token slots, at most 8 blocks
//! let prompt: Vec<u32> = (0..10).collect();
//! // A first request: 3 fresh blocks, written with its K/V, then indexed by their tokens.
//! let mut table = pool.allocate(3, &mut |_| {}).unwrap();
//! let mut cursor = IndexCursor::default();
//! pool.index_sequence(&mut cursor, &prompt, &mut table, prompt.len(), prompt.len(), true);
//! pool.release(&table); // the request ends; its blocks stay resident in the tree
//! // A second request with the same first 8 tokens finds 2 full blocks to read in place.
//! let hit = pool.lookup(Scope::SHARED, &[0, 1, 2, 3, 4, 5, 6, 7, 42], false);
//! assert_eq!(hit.blocks, table[..2]);
//! pool.retain(&hit.blocks);
//! assert_eq!(pool.refcount(hit.blocks[0]), 2); // the tree's reference and the new table's
//! ```
#![warn(missing_docs)]

/// The README's example, run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

mod allocator;
mod radix;

pub use allocator::{BlockAllocator, BlockId};
pub use radix::{BlockTree, Insertion, NodeId, Removed, Scope, TreeMatch, ROOT};

/// How far a sequence's blocks are indexed in the tree: the node of its last indexed block and
/// how many blocks of its table are indexed (or were read from the tree), in its scope.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexCursor {
    /// The scope the sequence's path is indexed in.
    pub scope: Scope,
    /// The node of the last indexed block ([`ROOT`] when none is).
    pub node: NodeId,
    /// Blocks of the table indexed (or read from the tree), from the first.
    pub indexed: usize,
}

impl IndexCursor {
    /// Nothing indexed yet: at the root, in `scope`.
    pub fn at_root(scope: Scope) -> Self {
        IndexCursor {
            scope,
            node: ROOT,
            indexed: 0,
        }
    }
}

impl Default for IndexCursor {
    /// Nothing indexed: at the root, in the shared scope.
    fn default() -> Self {
        IndexCursor::at_root(Scope::SHARED)
    }
}

/// Counters of a [`BlockManager`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BlockCounters {
    /// Blocks evicted from the tree for room.
    pub evicted: u64,
}

/// The allocator and the tree, with one reference per tree node.
#[derive(Debug, Clone)]
pub struct BlockManager {
    alloc: BlockAllocator,
    tree: BlockTree,
    block_size: usize,
    counters: BlockCounters,
}

impl BlockManager {
    /// A manager of at most `max_blocks` blocks of `block_size` slots.
    pub fn new(block_size: usize, max_blocks: usize) -> Self {
        BlockManager {
            alloc: BlockAllocator::new(max_blocks),
            tree: BlockTree::new(block_size),
            block_size,
            counters: BlockCounters::default(),
        }
    }

    /// Slots per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// The allocator (read-only).
    pub fn allocator(&self) -> &BlockAllocator {
        &self.alloc
    }

    /// The tree (read-only).
    pub fn tree(&self) -> &BlockTree {
        &self.tree
    }

    /// Counters.
    pub fn counters(&self) -> BlockCounters {
        self.counters
    }

    /// Blocks that can be had now: free ones, room to grow, and tree blocks nobody else reads.
    pub fn available(&self) -> usize {
        self.alloc.free() + self.alloc.tree_only()
    }

    /// `n` fresh blocks, one reference each, evicting least recently used tree leaves when the
    /// free ones do not suffice; `on_evict` sees each evicted node while its K/V is still intact.
    /// `None` (and nothing allocated or evicted) when even eviction cannot make the room.
    pub fn allocate(
        &mut self,
        n: usize,
        on_evict: &mut dyn FnMut(&Removed),
    ) -> Option<Vec<BlockId>> {
        if n > self.available() {
            return None;
        }
        let short = n.saturating_sub(self.alloc.free());
        if short > 0 {
            self.evict(short, on_evict);
        }
        let mut out = Vec::with_capacity(n);
        for _ in 0..n {
            match self.alloc.allocate() {
                Some(b) => out.push(b),
                None => {
                    // Unreachable while `available` counts right; give back what was taken.
                    self.release(&out);
                    return None;
                }
            }
        }
        Some(out)
    }

    /// One more reference to each block (a sequence's table takes resident blocks).
    pub fn retain(&mut self, blocks: &[BlockId]) {
        for &b in blocks {
            self.alloc.retain(b);
        }
    }

    /// One reference fewer to each block, last first (so a table's blocks come back in order and
    /// the next sequence gets them consecutively).
    pub fn release(&mut self, blocks: &[BlockId]) {
        for &b in blocks.iter().rev() {
            self.alloc.release(b);
        }
    }

    /// References to a block.
    pub fn refcount(&self, block: BlockId) -> u32 {
        self.alloc.refcount(block)
    }

    /// The longest resident prefix of `tokens` in `scope` (nothing is retained: see
    /// [`BlockManager::retain`]).
    pub fn lookup(&mut self, scope: Scope, tokens: &[u32], allow_approximate: bool) -> TreeMatch {
        self.tree.lookup(scope, tokens, allow_approximate)
    }

    /// Indexes a sequence's block `*block` (holding `tokens`, its K/V final) under `parent` (in
    /// `scope`), and
    /// returns the node it is now indexed as, for the next block's `parent` (`None`: the tokens
    /// are covered already, or `parent` is gone).
    ///
    /// If the tree already holds the same tokens there (two requests computed the same prefix at
    /// once), the sequence's table switches to the tree's block and its own is released: the
    /// prefix is then held once, and the node a sequence builds on is always one it holds, so it
    /// cannot be evicted under it. Only full, final blocks may be swapped: nothing writes them.
    pub fn index(
        &mut self,
        scope: Scope,
        parent: NodeId,
        tokens: &[u32],
        block: &mut BlockId,
        approximate: bool,
    ) -> Option<NodeId> {
        match self.insert(scope, parent, tokens, *block, approximate) {
            Insertion::Added(n) => Some(n),
            Insertion::Exists(n) => {
                let theirs = self.tree.block(n);
                if theirs != *block {
                    self.alloc.retain(theirs);
                    self.alloc.release(*block);
                    *block = theirs;
                }
                Some(n)
            }
            Insertion::Covered(_) | Insertion::Orphan => None,
        }
    }

    /// Indexes a sequence's blocks in the tree, from where it stands (`cursor`) up to token
    /// `limit`: every full block, and with `finish` the partial last one too. Blocks reaching
    /// past `exact_until` are flagged approximate. A table entry may switch to the tree's copy of
    /// the same tokens (see [`BlockManager::index`]). If the tree was cleared under the sequence,
    /// indexing starts again from the root.
    pub fn index_sequence(
        &mut self,
        cursor: &mut IndexCursor,
        tokens: &[u32],
        table: &mut [BlockId],
        limit: usize,
        exact_until: usize,
        finish: bool,
    ) {
        let bs = self.block_size;
        let limit = limit.min(tokens.len());
        while cursor.indexed * bs < limit && cursor.indexed < table.len() {
            let from = cursor.indexed * bs;
            let to = (from + bs).min(limit);
            if to - from < bs && !finish {
                break;
            }
            let approximate = to > exact_until;
            let node = self.index(
                cursor.scope,
                cursor.node,
                &tokens[from..to],
                &mut table[cursor.indexed],
                approximate,
            );
            match node {
                Some(n) => cursor.node = n,
                None if !self.tree.contains(cursor.node) => {
                    *cursor = IndexCursor::at_root(cursor.scope);
                    continue;
                }
                None => break,
            }
            if to - from < bs {
                break;
            }
            cursor.indexed += 1;
        }
    }

    /// Indexes `block` (holding `tokens`, its K/V final) under `parent` in `scope`; on
    /// [`Insertion::Added`] the tree takes a reference. Partial nodes it replaces are released.
    pub fn insert(
        &mut self,
        scope: Scope,
        parent: NodeId,
        tokens: &[u32],
        block: BlockId,
        approximate: bool,
    ) -> Insertion {
        let mut removed = Vec::new();
        let r = self
            .tree
            .insert(scope, parent, tokens, block, approximate, &mut removed);
        for old in removed {
            self.drop_tree_reference(old.block);
        }
        if let Insertion::Added(_) = r {
            self.alloc.retain(block);
            self.alloc.set_in_tree(block, true);
        }
        r
    }

    fn drop_tree_reference(&mut self, block: BlockId) {
        self.alloc.set_in_tree(block, false);
        self.alloc.release(block);
    }

    /// Evicts up to `n` least recently used leaves that no sequence reads; returns how many.
    pub fn evict(&mut self, n: usize, on_evict: &mut dyn FnMut(&Removed)) -> usize {
        let alloc = &self.alloc;
        let removed = self.tree.evict(n, |b| alloc.refcount(b) == 1);
        for r in &removed {
            on_evict(r);
            self.drop_tree_reference(r.block);
        }
        self.counters.evicted += removed.len() as u64;
        removed.len()
    }

    /// Empties the tree (each node seen by `on_remove` first); blocks sequences hold stay theirs.
    pub fn clear(&mut self, on_remove: &mut dyn FnMut(&Removed)) {
        for r in self.tree.clear() {
            on_remove(&r);
            self.drop_tree_reference(r.block);
        }
    }
}
