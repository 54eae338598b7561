//! After any sequence of operations, a store with a disk tier large enough to keep everything
//! answers exactly like a plain map of what was inserted and not invalidated, while RAM stays in
//! budget; and the longest-prefix lookup equals a naive scan of the stored chains.

mod common;

use common::{chunk_after, ns};
use kvb_hash::PrefixKey;
use kvb_store::{ChunkStore, DiskConfig, EvictionPolicy, KvChunk, StoreConfig};
use proptest::prelude::*;
use std::collections::HashMap;

#[derive(Debug, Clone)]
enum Op {
    Insert(usize),
    Get(usize),
    GetByContent(usize),
    Invalidate(usize),
    Reopen,
}

/// A pool of chunks forming chains: chunk i follows chunk parent(i) (or the root).
fn pool() -> Vec<KvChunk> {
    let n = ns();
    let mut out: Vec<KvChunk> = Vec::new();
    for i in 0..24u32 {
        let tokens: Vec<u32> = (0..(3 + i % 5)).map(|t| (t * 7 + i * 3) % 11).collect();
        let (parent, start) = if i % 3 == 0 {
            (n.root(), 0)
        } else {
            let p = &out[(i as usize * 5) % out.len()];
            (p.prefix_key, p.positions.last().map_or(0, |x| x + 1))
        };
        out.push(chunk_after(&n, parent, &tokens, start));
    }
    out
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    proptest::collection::vec(
        prop_oneof![
            5 => (0usize..24).prop_map(Op::Insert),
            4 => (0usize..24).prop_map(Op::Get),
            2 => (0usize..24).prop_map(Op::GetByContent),
            2 => (0usize..24).prop_map(Op::Invalidate),
            1 => Just(Op::Reopen),
        ],
        1..80,
    )
}

/// The naive longest prefix: the best chain of stored chunks matching the tokens.
fn naive_longest(model: &HashMap<PrefixKey, KvChunk>, root: PrefixKey, tokens: &[u32]) -> usize {
    let mut best = 0;
    for c in model.values().filter(|c| c.parent == root) {
        let m = c
            .tokens
            .iter()
            .zip(tokens)
            .take_while(|(a, b)| a == b)
            .count();
        let total = if m == c.tokens.len() {
            m + naive_longest(model, c.prefix_key, &tokens[m..])
        } else {
            m
        };
        best = best.max(total);
    }
    best
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn the_store_behaves_like_a_map(ops in ops(), ram_chunks in 1usize..6, lru in any::<bool>()) {
        let chunks = pool();
        let dir = tempfile::tempdir().unwrap();
        let budget = ram_chunks * chunks[0].bytes();
        let policy = if lru { EvictionPolicy::Lru } else { EvictionPolicy::default() };
        let config = StoreConfig { max_ram_bytes: budget, eviction: policy, disk: Some(DiskConfig::new(dir.path(), 1 << 30)), min_prefix_len: 1, remote: None };
        let mut store = ChunkStore::new(config.clone()).unwrap();
        let mut model: HashMap<PrefixKey, KvChunk> = HashMap::new();
        for op in ops {
            match op {
                Op::Insert(i) => {
                    store.insert(chunks[i].clone()).unwrap();
                    model.insert(chunks[i].prefix_key, chunks[i].clone());
                }
                Op::Get(i) => {
                    let got = store.get(&chunks[i].prefix_key).unwrap();
                    prop_assert_eq!(got.as_deref(), model.get(&chunks[i].prefix_key));
                }
                Op::GetByContent(i) => {
                    let got = store.get_by_content(&chunks[i].content_key).unwrap();
                    let expected = model.values().any(|c| c.content_key == chunks[i].content_key);
                    prop_assert_eq!(got.is_some(), expected);
                    if let Some(m) = got {
                        prop_assert!(m.approximate);
                        prop_assert_eq!(m.chunk.tokens.clone(), chunks[i].tokens.clone());
                    }
                }
                Op::Invalidate(i) => {
                    let was = store.invalidate(&chunks[i].prefix_key).unwrap();
                    prop_assert_eq!(was, model.remove(&chunks[i].prefix_key).is_some());
                }
                Op::Reopen => {
                    drop(store);
                    store = ChunkStore::new(config.clone()).unwrap();
                }
            }
            prop_assert!(store.stats().ram_bytes <= budget);
            for c in &chunks {
                prop_assert_eq!(store.contains(&c.prefix_key), model.contains_key(&c.prefix_key));
            }
            // Longest prefix of each chain's tokens, against the naive scan.
            for c in chunks.iter().step_by(5) {
                let mut tokens = c.tokens.clone();
                tokens.extend([99, 98]);
                let want = naive_longest(&model, ns().root(), &tokens);
                let got = store.longest_prefix(ns().root(), &tokens).unwrap().map_or(0, |m| m.matched_tokens);
                prop_assert_eq!(got, want);
            }
        }
    }
}

#[test]
fn longest_prefix_uses_a_partial_last_chunk_and_respects_the_minimum() {
    let n = ns();
    let a = common::chunk(&n, &[1, 2, 3, 4]);
    let b = chunk_after(&n, a.prefix_key, &[5, 6, 7, 8], 4);
    let store = ChunkStore::new(StoreConfig {
        min_prefix_len: 6,
        remote: None,
        ..StoreConfig::ram(1 << 20)
    })
    .unwrap();
    store.insert(a.clone()).unwrap();
    store.insert(b.clone()).unwrap();
    let m = store
        .longest_prefix(n.root(), &[1, 2, 3, 4, 5, 6, 0])
        .unwrap()
        .unwrap();
    assert_eq!(m.matched_tokens, 6);
    assert_eq!(
        m.chunks
            .iter()
            .map(|(c, used)| (c.prefix_key, *used))
            .collect::<Vec<_>>(),
        vec![(a.prefix_key, 4), (b.prefix_key, 2)]
    );
    assert!(
        store
            .longest_prefix(n.root(), &[1, 2, 3, 4, 5, 0])
            .unwrap()
            .is_none(),
        "5 < min_prefix_len"
    );
    let st = store.stats();
    assert_eq!((st.hits, st.misses), (1, 1));
}

#[test]
fn find_matching_chunks_flags_exact_and_approximate() {
    use kvb_chunk::{split, ChunkConfig, ChunkStrategy};
    let n = ns();
    let cfg = ChunkConfig {
        size: 4,
        min_tail: 0,
        strategy: ChunkStrategy::Fixed,
    };
    let doc: Vec<u32> = (10..18).collect();
    // Stored in context: the document at the start of a prompt.
    let first = split(&doc, &cfg, &n);
    let store = ChunkStore::new(StoreConfig::ram(1 << 20)).unwrap();
    for c in &first {
        let parent = if c.start == 0 {
            n.root()
        } else {
            first[c.start / 4 - 1].prefix_key
        };
        store
            .insert(chunk_after(&n, parent, &c.tokens, c.start as u32))
            .unwrap();
    }
    // A new prompt: the same document after a different preamble.
    let prompt: Vec<u32> = [1, 2, 3, 4]
        .iter()
        .copied()
        .chain(doc.iter().copied())
        .collect();
    let found = store
        .find_matching_chunks(&split(&prompt, &cfg, &n))
        .unwrap();
    assert_eq!(
        found
            .iter()
            .map(|(s, m)| (*s, m.approximate))
            .collect::<Vec<_>>(),
        vec![(4, true), (8, true)]
    );
    let again = store.find_matching_chunks(&first).unwrap();
    assert!(again.iter().all(|(_, m)| !m.approximate) && again.len() == 2);
}
