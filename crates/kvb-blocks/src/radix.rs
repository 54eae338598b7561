//! [`BlockTree`]: a radix tree over token blocks, indexing the K/V blocks that stay resident.
//!
//! Each node is one block of the pool and the tokens whose K/V it holds: `block_size` tokens, or
//! fewer for a *partial* block (a sequence's last, unfinished one), which is always a leaf. The
//! path from the root spells a token prefix; a new prompt walks it block by block (SGLang's
//! RadixAttention, at block granularity). A node is *approximate* when its K/V is not what a full
//! prefill computes (reused from another context and repaired, or after such K/V); its
//! descendants are approximate too, and exact-only lookups do not follow it.
//!
//! The tree only indexes; references are counted by the caller (one per node, see
//! [`crate::BlockManager`]).

use crate::allocator::BlockId;
use std::collections::HashMap;

/// A node of the tree; the root is [`ROOT`]. Ids are never reused, so a sequence holding the id
/// of a node that was since removed finds it gone instead of finding another node.
pub type NodeId = u64;

/// The root: no block, no tokens.
pub const ROOT: NodeId = 0;

/// Whose blocks a path holds: prefixes are shared only within a scope, so one tenant's lookups
/// never reach blocks another tenant's requests wrote. An opaque 32-byte tag (kvb uses its
/// cache namespace's key); [`Scope::SHARED`] for a pool with one tenant.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Scope(pub [u8; 32]);

impl Scope {
    /// The scope of callers that name none.
    pub const SHARED: Scope = Scope([0; 32]);
}

#[derive(Debug, Clone)]
struct Node {
    parent: NodeId,
    /// The scope of the path: the root's children are told apart by it, and every other node
    /// inherits its parent's.
    scope: Scope,
    block: BlockId,
    tokens: Vec<u32>,
    approximate: bool,
    last_access: u64,
    children: usize,
}

/// The longest resident prefix of a prompt.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TreeMatch {
    /// Full blocks matched, from the root, and their nodes.
    pub blocks: Vec<BlockId>,
    /// Their nodes.
    pub nodes: Vec<NodeId>,
    /// A block matched in part after them: its node, its block, and how many of its tokens match.
    pub partial: Option<(NodeId, BlockId, usize)>,
    /// Of `blocks`, how many from the start are exact (the rest are approximate).
    pub exact_blocks: usize,
    /// Whether the partial block is approximate.
    pub partial_approximate: bool,
}

impl TreeMatch {
    /// Tokens covered, the partial block included.
    pub fn tokens(&self, block_size: usize) -> usize {
        self.blocks.len() * block_size + self.partial.map_or(0, |p| p.2)
    }
}

/// What inserting a block did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Insertion {
    /// A new node holds the block (the caller adds the tree's reference).
    Added(NodeId),
    /// A node with the same tokens already exists: the block was not taken.
    Exists(NodeId),
    /// A node already holds these tokens and more: the (partial) block was not taken.
    Covered(NodeId),
    /// The parent is gone (the tree was cleared): nothing was taken.
    Orphan,
}

/// A node removed by eviction or replacement: its block's tree reference is to be released.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Removed {
    /// The scope of its path.
    pub scope: Scope,
    /// The node's block.
    pub block: BlockId,
    /// Its path from the root: every block (its own last) ...
    pub path_blocks: Vec<BlockId>,
    /// ... and every token.
    pub path_tokens: Vec<u32>,
    /// Whether its K/V is approximate.
    pub approximate: bool,
}

/// The tree.
#[derive(Debug, Clone)]
pub struct BlockTree {
    block_size: usize,
    nodes: HashMap<NodeId, Node>,
    next_id: NodeId,
    /// Children by (parent, scope, first token).
    children: HashMap<(NodeId, Scope, u32), Vec<NodeId>>,
    clock: u64,
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl BlockTree {
    /// An empty tree of blocks of `block_size` tokens.
    pub fn new(block_size: usize) -> Self {
        let root = Node {
            parent: ROOT,
            scope: Scope::SHARED,
            block: BlockId::MAX,
            tokens: Vec::new(),
            approximate: false,
            last_access: 0,
            children: 0,
        };
        BlockTree {
            block_size,
            nodes: HashMap::from([(ROOT, root)]),
            next_id: ROOT + 1,
            children: HashMap::new(),
            clock: 0,
        }
    }

    fn node(&self, id: NodeId) -> &Node {
        self.nodes.get(&id).expect("a live node id")
    }

    fn node_mut(&mut self, id: NodeId) -> &mut Node {
        self.nodes.get_mut(&id).expect("a live node id")
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Nodes (blocks) in the tree.
    pub fn len(&self) -> usize {
        self.nodes.len() - 1
    }

    /// Whether the tree holds no block.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Leaves: the ends of resident sequences.
    pub fn leaves(&self) -> usize {
        self.live().filter(|(_, n)| n.children == 0).count()
    }

    /// Approximate nodes.
    pub fn approximate(&self) -> usize {
        self.live().filter(|(_, n)| n.approximate).count()
    }

    fn live(&self) -> impl Iterator<Item = (NodeId, &Node)> {
        self.nodes
            .iter()
            .filter(|(&i, _)| i != ROOT)
            .map(|(&i, n)| (i, n))
    }

    /// Whether `id` is a live node (the root included).
    pub fn contains(&self, id: NodeId) -> bool {
        self.nodes.contains_key(&id)
    }

    /// The block of a node.
    pub fn block(&self, id: NodeId) -> BlockId {
        self.node(id).block
    }

    /// Whether a node is partial (fewer tokens than a block).
    pub fn is_partial(&self, id: NodeId) -> bool {
        id != ROOT && self.node(id).tokens.len() < self.block_size
    }

    /// The longest resident prefix of `tokens` in `scope`, block by block, then in part into one
    /// more block. Approximate nodes are followed only with `allow_approximate`; among equal
    /// candidates the exact one wins. Marks what it matched as just used.
    pub fn lookup(&mut self, scope: Scope, tokens: &[u32], allow_approximate: bool) -> TreeMatch {
        let bs = self.block_size;
        let mut m = TreeMatch::default();
        let mut at = ROOT;
        let mut pos = 0;
        let now = self.tick();
        let mut all_exact = true;
        while pos < tokens.len() {
            let next = &tokens[pos..(pos + bs).min(tokens.len())];
            let Some(candidates) = self.children.get(&(at, scope, next[0])) else {
                break;
            };
            // Best candidate: a full match of a full block (exact first), else the longest
            // partial match.
            let mut full: Option<NodeId> = None;
            let mut part: Option<(NodeId, usize, bool)> = None;
            for &c in candidates {
                let n = self.node(c);
                if n.approximate && !allow_approximate {
                    continue;
                }
                let common = common_prefix(&n.tokens, next);
                if common == bs && n.tokens.len() == bs {
                    if full.is_none_or(|f| self.node(f).approximate && !n.approximate) {
                        full = Some(c);
                    }
                } else if common > 0 {
                    let better = match part {
                        None => true,
                        Some((_, len, approx)) => {
                            common > len || (common == len && approx && !n.approximate)
                        }
                    };
                    if better {
                        part = Some((c, common, n.approximate));
                    }
                }
            }
            match (full, part) {
                (Some(f), _) => {
                    let n = self.node_mut(f);
                    n.last_access = now;
                    all_exact &= !n.approximate;
                    if all_exact {
                        m.exact_blocks += 1;
                    }
                    m.blocks.push(n.block);
                    m.nodes.push(f);
                    at = f;
                    pos += bs;
                }
                (None, Some((p, len, approx))) => {
                    let n = self.node_mut(p);
                    n.last_access = now;
                    m.partial = Some((p, n.block, len));
                    m.partial_approximate = approx || !all_exact;
                    break;
                }
                (None, None) => break,
            }
        }
        m
    }

    /// Adds `block` holding `tokens` (1 to `block_size` of them) under `parent`, which must be the
    /// root (then `scope` says whose path it starts) or a full node (of `scope`). A full block
    /// replaces a partial sibling whose tokens it extends (the replaced node is returned through
    /// `removed`); a partial block that an existing node already covers is not taken; a parent
    /// that is gone takes nothing.
    pub fn insert(
        &mut self,
        scope: Scope,
        parent: NodeId,
        tokens: &[u32],
        block: BlockId,
        approximate: bool,
        removed: &mut Vec<Removed>,
    ) -> Insertion {
        assert!(
            !tokens.is_empty() && tokens.len() <= self.block_size,
            "a node holds 1 to block_size tokens"
        );
        if !self.contains(parent) {
            return Insertion::Orphan;
        }
        assert!(!self.is_partial(parent), "a partial node has no children");
        assert!(
            parent == ROOT || self.node(parent).scope == scope,
            "a path keeps its scope"
        );
        let approximate = approximate || (parent != ROOT && self.node(parent).approximate);
        let now = self.tick();
        let key = (parent, scope, tokens[0]);
        let siblings = self.children.get(&key).cloned().unwrap_or_default();
        for &s in &siblings {
            let n = self.node(s);
            if n.approximate != approximate {
                continue;
            }
            if n.tokens == tokens {
                self.node_mut(s).last_access = now;
                return Insertion::Exists(s);
            }
            if n.tokens.len() > tokens.len() && n.tokens.starts_with(tokens) {
                self.node_mut(s).last_access = now;
                return Insertion::Covered(s);
            }
        }
        for &s in &siblings {
            let n = self.node(s);
            if n.approximate == approximate
                && n.tokens.len() < tokens.len()
                && tokens.starts_with(&n.tokens)
                && n.children == 0
            {
                removed.push(self.remove(s));
            }
        }
        let node = Node {
            parent,
            scope,
            block,
            tokens: tokens.to_vec(),
            approximate,
            last_access: now,
            children: 0,
        };
        let id = self.next_id;
        self.next_id += 1;
        self.nodes.insert(id, node);
        self.children.entry(key).or_default().push(id);
        self.node_mut(parent).children += 1;
        Insertion::Added(id)
    }

    /// The path of a node: its blocks and tokens from the root.
    fn path(&self, id: NodeId) -> (Vec<BlockId>, Vec<u32>) {
        let mut chain = Vec::new();
        let mut at = id;
        while at != ROOT {
            chain.push(at);
            at = self.node(at).parent;
        }
        chain.reverse();
        let blocks = chain.iter().map(|&c| self.node(c).block).collect();
        let tokens = chain
            .iter()
            .flat_map(|&c| self.node(c).tokens.iter().copied())
            .collect();
        (blocks, tokens)
    }

    /// Removes a leaf.
    fn remove(&mut self, id: NodeId) -> Removed {
        let (path_blocks, path_tokens) = self.path(id);
        let n = self.nodes.remove(&id).expect("a live node id");
        debug_assert_eq!(n.children, 0, "only leaves are removed");
        let key = (n.parent, n.scope, n.tokens[0]);
        if let Some(list) = self.children.get_mut(&key) {
            list.retain(|&c| c != id);
            if list.is_empty() {
                self.children.remove(&key);
            }
        }
        self.node_mut(n.parent).children -= 1;
        Removed {
            scope: n.scope,
            block: n.block,
            path_blocks,
            path_tokens,
            approximate: n.approximate,
        }
    }

    /// Removes up to `want` least recently used leaves whose block `evictable` says only the tree
    /// holds, leaf first (a parent becomes a candidate once its children are gone).
    pub fn evict(&mut self, want: usize, evictable: impl Fn(BlockId) -> bool) -> Vec<Removed> {
        use std::cmp::Reverse;
        use std::collections::BinaryHeap;
        let mut heap: BinaryHeap<Reverse<(u64, NodeId)>> = self
            .live()
            .filter(|(_, n)| n.children == 0 && evictable(n.block))
            .map(|(i, n)| Reverse((n.last_access, i)))
            .collect();
        let mut out = Vec::new();
        while out.len() < want {
            let Some(Reverse((_, id))) = heap.pop() else {
                break;
            };
            let parent = self.node(id).parent;
            out.push(self.remove(id));
            if parent != ROOT {
                let p = self.node(parent);
                if p.children == 0 && evictable(p.block) {
                    heap.push(Reverse((p.last_access, parent)));
                }
            }
        }
        out
    }

    /// Removes every node, deepest first; returns them.
    pub fn clear(&mut self) -> Vec<Removed> {
        self.evict(usize::MAX, |_| true)
    }

    /// Every node: its scope, its block, its path from the root (tokens) and whether it is
    /// approximate. What the tree holds, for tests and checks.
    pub fn entries(&self) -> Vec<(Scope, BlockId, Vec<u32>, bool)> {
        self.live()
            .map(|(i, n)| (n.scope, n.block, self.path(i).1, n.approximate))
            .collect()
    }
}
