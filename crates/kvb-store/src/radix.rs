//! A token radix index over chunk chains, for longest-prefix lookup to the token.
//!
//! Each stored chunk is an edge from its parent's prefix key, labelled by its tokens. A lookup walks
//! a prompt's tokens from the namespace root, following the child that shares the most tokens, and
//! stops inside a chunk when the prompt diverges, so a partially matching chunk still serves its
//! first tokens (their K/V were computed causally, without the tokens after them).

use kvb_hash::PrefixKey;
use std::collections::HashMap;

#[derive(Debug, Clone)]
struct Node {
    parent: PrefixKey,
    tokens: Vec<u32>,
}

/// The index: nodes by prefix key, and children by (parent key, first token), so a step of the walk
/// looks only at the children that can match at all (a cache of 100k first chunks all hang off the
/// root). A child whose parent is absent stays listed, and becomes reachable again when the parent
/// is stored again under the same key.
#[derive(Debug, Default, Clone)]
pub struct RadixIndex {
    nodes: HashMap<PrefixKey, Node>,
    children: HashMap<(PrefixKey, u32), Vec<PrefixKey>>,
}

/// The longest cached prefix of a prompt: the chain of chunks and how many tokens of each it uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixPath {
    /// (chunk, tokens of it that match), from the root; all but the last are used whole.
    pub chunks: Vec<(PrefixKey, usize)>,
    /// Total matched tokens.
    pub matched: usize,
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

impl RadixIndex {
    /// Adds a chunk (idempotent; an empty chunk is ignored).
    pub fn insert(&mut self, key: PrefixKey, parent: PrefixKey, tokens: &[u32]) {
        if self.nodes.contains_key(&key) {
            return;
        }
        let Some(&first) = tokens.first() else { return };
        self.nodes.insert(
            key,
            Node {
                parent,
                tokens: tokens.to_vec(),
            },
        );
        self.children.entry((parent, first)).or_default().push(key);
    }

    /// Removes a chunk; its children stay listed under its key.
    pub fn remove(&mut self, key: &PrefixKey) {
        if let Some(node) = self.nodes.remove(key) {
            let slot = (node.parent, node.tokens[0]);
            if let Some(siblings) = self.children.get_mut(&slot) {
                siblings.retain(|k| k != key);
                if siblings.is_empty() {
                    self.children.remove(&slot);
                }
            }
        }
    }

    /// Whether `key` is indexed.
    pub fn contains(&self, key: &PrefixKey) -> bool {
        self.nodes.contains_key(key)
    }

    /// Number of indexed chunks.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether the index is empty.
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// The longest prefix of `tokens` covered by chunks chained from `root`.
    pub fn longest_prefix(&self, root: PrefixKey, tokens: &[u32]) -> PrefixPath {
        let mut path = PrefixPath {
            chunks: Vec::new(),
            matched: 0,
        };
        let mut current = root;
        while path.matched < tokens.len() {
            let rest = &tokens[path.matched..];
            let best = self
                .children
                .get(&(current, rest[0]))
                .into_iter()
                .flatten()
                .filter_map(|k| {
                    self.nodes
                        .get(k)
                        .map(|n| (k, n, common_prefix(&n.tokens, rest)))
                })
                .filter(|(_, _, m)| *m > 0)
                // The longest match; among equals, a whole chunk (to keep walking), then the key.
                .max_by_key(|(k, n, m)| (*m, *m == n.tokens.len(), std::cmp::Reverse(**k)));
            let Some((key, node, m)) = best else { break };
            path.chunks.push((*key, m));
            path.matched += m;
            if m < node.tokens.len() {
                break;
            }
            current = *key;
        }
        path
    }
}
