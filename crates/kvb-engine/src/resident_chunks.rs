//! The chunks a finished sequence left in the pool only: their content keys, and the token path
//! (from slot 0) that finds their blocks in the pool's tree.
//!
//! A finished sequence's K/V stays resident, so copying its chunks into the chunk store at once
//! would hold the same K/V twice (a 2,700-token prompt's f32 K/V is 125 MB). Instead the store
//! gets them when the pool evicts them (write-back) or when a later prompt finds one of them by
//! content: only then does a content lookup need the chunk in the store. This index is what
//! that lookup asks. It holds token ids only, and forgets its oldest paths past a token budget
//! (a forgotten path is still written back when the pool evicts it).

use kvb_hash::ContentKey;
use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

/// Content keys of resident-only chunks, by the path that holds them.
#[derive(Debug)]
pub(crate) struct ResidentChunks {
    /// Which path holds each chunk.
    by_content: HashMap<ContentKey, u64>,
    /// Paths, oldest first: id, tokens, the content keys recorded for it.
    paths: VecDeque<(u64, Arc<[u32]>, Vec<ContentKey>)>,
    next_id: u64,
    tokens: usize,
    max_tokens: usize,
}

impl ResidentChunks {
    /// An empty index that holds at most `max_tokens` path tokens (at least one path).
    pub fn new(max_tokens: usize) -> Self {
        ResidentChunks {
            by_content: HashMap::new(),
            paths: VecDeque::new(),
            next_id: 0,
            tokens: 0,
            max_tokens,
        }
    }

    /// Records that `path`'s tree blocks hold the chunks with `keys` (and the store lacks them).
    pub fn record(&mut self, path: Arc<[u32]>, keys: Vec<ContentKey>) {
        if keys.is_empty() {
            return;
        }
        let id = self.next_id;
        self.next_id += 1;
        for k in &keys {
            self.by_content.insert(*k, id);
        }
        self.tokens += path.len();
        self.paths.push_back((id, path, keys));
        while self.tokens > self.max_tokens && self.paths.len() > 1 {
            let oldest = self.paths[0].0;
            self.remove(oldest);
        }
    }

    /// Whether a recorded path holds a chunk with content `key`.
    #[cfg(test)]
    pub fn contains(&self, key: &ContentKey) -> bool {
        self.by_content.contains_key(key)
    }

    /// Forgets the path that holds the chunk with content `key` (every chunk recorded with it)
    /// and returns its tokens.
    pub fn take_path_of(&mut self, key: &ContentKey) -> Option<Arc<[u32]>> {
        let id = *self.by_content.get(key)?;
        self.remove(id)
    }

    /// Forgets everything (the pool was cleared or written to the store).
    pub fn clear(&mut self) {
        self.by_content.clear();
        self.paths.clear();
        self.tokens = 0;
    }

    /// Path tokens held.
    #[cfg(test)]
    pub fn tokens(&self) -> usize {
        self.tokens
    }

    fn remove(&mut self, id: u64) -> Option<Arc<[u32]>> {
        let at = self.paths.iter().position(|p| p.0 == id)?;
        let (_, path, keys) = self.paths.remove(at)?;
        for k in keys {
            // A later path may have recorded the same content: it keeps the key.
            if self.by_content.get(&k) == Some(&id) {
                self.by_content.remove(&k);
            }
        }
        self.tokens -= path.len();
        Some(path)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kvb_hash::Namespace;
    use proptest::prelude::*;

    fn key(i: u8) -> ContentKey {
        Namespace::builder().build().content_key(&[i as u32])
    }

    #[derive(Debug, Clone)]
    enum Op {
        Record(usize, Vec<u8>),
        Take(u8),
        Clear,
    }

    fn op() -> impl Strategy<Value = Op> {
        let keys = proptest::collection::vec(0u8..12, 0..5);
        prop_oneof![
            4 => (1usize..40, keys).prop_map(|(n, k)| Op::Record(n, k)),
            2 => (0u8..12).prop_map(Op::Take),
            1 => Just(Op::Clear),
        ]
    }

    proptest! {
        /// Against a plain list of paths, oldest first, and which path each key last came with:
        /// taking a key returns the path it last came with and forgets every key that path owns,
        /// and the oldest paths go first once their tokens pass the budget.
        #[test]
        fn behaves_like_a_list_of_paths(
            ops in proptest::collection::vec(op(), 0..60),
            budget in 1usize..100,
        ) {
            let mut index = ResidentChunks::new(budget);
            let mut paths: Vec<(u32, Vec<u32>)> = Vec::new();
            let mut owner: HashMap<u8, u32> = HashMap::new();
            let mut next = 0u32;
            for op in ops {
                match op {
                    Op::Record(n, keys) => {
                        let path: Vec<u32> = (next..next + n as u32).collect();
                        next += n as u32;
                        index.record(path.clone().into(), keys.iter().map(|&k| key(k)).collect());
                        if !keys.is_empty() {
                            for &k in &keys {
                                owner.insert(k, path[0]);
                            }
                            paths.push((path[0], path));
                            while paths.iter().map(|p| p.1.len()).sum::<usize>() > budget
                                && paths.len() > 1
                            {
                                let gone = paths.remove(0).0;
                                owner.retain(|_, o| *o != gone);
                            }
                        }
                    }
                    Op::Take(k) => {
                        let want = owner.get(&k).copied();
                        let got = index.take_path_of(&key(k));
                        let expected = want.map(|id| paths.iter().find(|p| p.0 == id).unwrap().1.clone());
                        prop_assert_eq!(got.as_deref(), expected.as_deref());
                        if let Some(id) = want {
                            paths.retain(|p| p.0 != id);
                            owner.retain(|_, o| *o != id);
                        }
                    }
                    Op::Clear => {
                        index.clear();
                        paths.clear();
                        owner.clear();
                    }
                }
                prop_assert_eq!(index.tokens(), paths.iter().map(|p| p.1.len()).sum::<usize>());
                for k in 0u8..12 {
                    prop_assert_eq!(index.contains(&key(k)), owner.contains_key(&k), "key {}", k);
                }
            }
        }
    }
}
