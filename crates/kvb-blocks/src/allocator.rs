//! [`BlockAllocator`]: reference-counted blocks of a pool with a block budget.

/// A block of the K/V pool.
pub type BlockId = u32;

/// Hands out blocks and counts their readers. A block is free (count 0), held by one owner, or
/// shared (count > 1). The pool behind it grows in steps up to `max_blocks`; freed blocks are
/// reused last-freed first, so recently touched memory is reused while it is still cached.
#[derive(Debug, Clone)]
pub struct BlockAllocator {
    refcount: Vec<u32>,
    /// Free blocks, the next one to hand out last.
    free: Vec<BlockId>,
    max_blocks: usize,
    /// Blocks in use with a count of exactly 1 whose one reference is the tree's (evictable).
    in_tree: Vec<bool>,
    tree_only: usize,
    /// Blocks from here to the capacity have never been handed out (fresh ids go out lowest
    /// first, so the ones handed out are always below this).
    first_unused: usize,
}

/// Blocks the pool holds after its first growth.
const FIRST_GROWTH: usize = 64;

impl BlockAllocator {
    /// An allocator of at most `max_blocks` blocks, none created yet.
    pub fn new(max_blocks: usize) -> Self {
        BlockAllocator {
            refcount: Vec::new(),
            free: Vec::new(),
            max_blocks,
            in_tree: Vec::new(),
            tree_only: 0,
            first_unused: 0,
        }
    }

    /// Blocks created so far (the pool must hold at least this many).
    pub fn capacity(&self) -> usize {
        self.refcount.len()
    }

    /// The budget.
    pub fn max_blocks(&self) -> usize {
        self.max_blocks
    }

    /// Blocks created but never handed out: free, and in a pool that commits memory lazily (kvb's
    /// CPU pool) not yet backed by it. Freed blocks go out before these.
    pub fn never_used(&self) -> std::ops::Range<BlockId> {
        self.first_unused as BlockId..self.capacity() as BlockId
    }

    /// Blocks with at least one reference.
    pub fn used(&self) -> usize {
        self.capacity() - self.free.len()
    }

    /// Blocks that can be handed out without evicting: free ones and room to grow.
    pub fn free(&self) -> usize {
        self.free.len() + (self.max_blocks - self.capacity())
    }

    /// Blocks whose only reference is the radix tree's: they can be evicted.
    pub fn tree_only(&self) -> usize {
        self.tree_only
    }

    /// References to `block`.
    pub fn refcount(&self, block: BlockId) -> u32 {
        self.refcount.get(block as usize).copied().unwrap_or(0)
    }

    /// Blocks read by more than one owner.
    pub fn shared(&self) -> usize {
        self.refcount.iter().filter(|&&c| c > 1).count()
    }

    /// References beyond the first, over all blocks: copies that sharing avoided.
    pub fn extra_references(&self) -> usize {
        self.refcount
            .iter()
            .map(|&c| c.saturating_sub(1) as usize)
            .sum()
    }

    /// A block with one reference, or `None` when the budget is spent. The pool may have grown:
    /// see [`BlockAllocator::capacity`].
    pub fn allocate(&mut self) -> Option<BlockId> {
        if self.free.is_empty() {
            let cap = self.capacity();
            if cap >= self.max_blocks {
                return None;
            }
            let grown = (2 * cap).max(FIRST_GROWTH).min(self.max_blocks);
            self.refcount.resize(grown, 0);
            self.in_tree.resize(grown, false);
            // Lowest id handed out first: a fresh sequence gets consecutive blocks.
            self.free.extend((cap as BlockId..grown as BlockId).rev());
        }
        let b = self.free.pop()?;
        self.refcount[b as usize] = 1;
        self.first_unused = self.first_unused.max(b as usize + 1);
        Some(b)
    }

    /// One more reader of a block in use.
    pub fn retain(&mut self, block: BlockId) {
        let i = block as usize;
        debug_assert!(self.refcount[i] > 0, "retain of free block {block}");
        if self.in_tree[i] && self.refcount[i] == 1 {
            self.tree_only -= 1;
        }
        self.refcount[i] += 1;
    }

    /// One reader fewer; returns whether the block became free.
    pub fn release(&mut self, block: BlockId) -> bool {
        let i = block as usize;
        debug_assert!(self.refcount[i] > 0, "release of free block {block}");
        self.refcount[i] -= 1;
        match self.refcount[i] {
            0 => {
                if self.in_tree[i] {
                    self.in_tree[i] = false;
                    self.tree_only -= 1;
                }
                self.free.push(block);
                true
            }
            1 if self.in_tree[i] => {
                self.tree_only += 1;
                false
            }
            _ => false,
        }
    }

    /// Marks whether one of the block's references is the radix tree's.
    pub fn set_in_tree(&mut self, block: BlockId, in_tree: bool) {
        let i = block as usize;
        if self.in_tree[i] == in_tree {
            return;
        }
        self.in_tree[i] = in_tree;
        if self.refcount[i] == 1 {
            if in_tree {
                self.tree_only += 1;
            } else {
                self.tree_only -= 1;
            }
        }
    }

    /// Whether the radix tree holds the block.
    pub fn is_in_tree(&self, block: BlockId) -> bool {
        self.in_tree.get(block as usize).copied().unwrap_or(false)
    }
}
