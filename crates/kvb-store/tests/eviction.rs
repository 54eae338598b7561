//! The RAM budget holds under any operations, and each policy evicts in its stated order; pinned
//! chunks are never evicted.

mod common;

use common::{distinct_chunks, ns};
use kvb_store::{ChunkStore, EvictionPolicy, Inserted, StoreConfig};
use proptest::prelude::*;

fn store(chunks_fit: usize, chunk_bytes: usize, eviction: EvictionPolicy) -> ChunkStore {
    ChunkStore::new(StoreConfig {
        max_ram_bytes: chunks_fit * chunk_bytes,
        eviction,
        disk: None,
        min_prefix_len: 1,
        remote: None,
    })
    .unwrap()
}

#[derive(Debug, Clone)]
enum Op {
    Insert(usize),
    Get(usize),
    Pin(usize),
    Unpin(usize),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    proptest::collection::vec(
        prop_oneof![
            4 => (0usize..30).prop_map(Op::Insert),
            4 => (0usize..30).prop_map(Op::Get),
            1 => (0usize..30).prop_map(Op::Pin),
            1 => (0usize..30).prop_map(Op::Unpin),
        ],
        1..150,
    )
}

proptest! {
    #[test]
    fn ram_bytes_never_exceed_the_budget(ops in ops(), budget in 1usize..20_000, lru in any::<bool>()) {
        let n = ns();
        let chunks: Vec<_> = (0..30).map(|i| common::chunk(&n, &(0..(1 + i * 7 % 40) as u32).map(|t| t + 100 * i as u32).collect::<Vec<_>>())).collect();
        let policy = if lru { EvictionPolicy::Lru } else { EvictionPolicy::Frequency { recency_window: 5 } };
        let s = ChunkStore::new(StoreConfig { max_ram_bytes: budget, eviction: policy, disk: None, min_prefix_len: 1, remote: None }).unwrap();
        let mut pinned = std::collections::HashSet::new();
        for op in ops {
            match op {
                Op::Insert(i) => { s.insert(chunks[i].clone()).unwrap(); }
                Op::Get(i) => { s.get(&chunks[i].prefix_key).unwrap(); }
                Op::Pin(i) => if s.pin(&chunks[i].prefix_key).unwrap() { pinned.insert(i); },
                Op::Unpin(i) => if s.unpin(&chunks[i].prefix_key) { pinned.remove(&i); },
            }
            let st = s.stats();
            prop_assert!(st.ram_bytes <= budget, "{} > {budget}", st.ram_bytes);
            for &p in &pinned {
                prop_assert!(s.contains(&chunks[p].prefix_key), "pinned chunk {p} was evicted");
            }
        }
    }

    #[test]
    fn lru_evicts_the_least_recently_used(touch in proptest::collection::vec(0usize..4, 0..20)) {
        let n = ns();
        let chunks = distinct_chunks(&n, 5, 8);
        let s = store(4, chunks[0].bytes(), EvictionPolicy::Lru);
        for c in &chunks[..4] { s.insert(c.clone()).unwrap(); }
        let mut last = [0usize, 1, 2, 3];
        for (t, &i) in touch.iter().enumerate() {
            s.get(&chunks[i].prefix_key).unwrap();
            last[i] = 4 + t;
        }
        let oldest = (0..4).min_by_key(|&i| last[i]).unwrap();
        prop_assert_eq!(s.insert(chunks[4].clone()).unwrap(), Inserted::Ram);
        for (i, c) in chunks[..4].iter().enumerate() {
            prop_assert_eq!(s.contains(&c.prefix_key), i != oldest, "chunk {}", i);
        }
    }

    #[test]
    fn frequency_evicts_the_least_hit_outside_the_recency_window(hits in proptest::collection::vec(0u64..6, 4)) {
        let n = ns();
        let chunks = distinct_chunks(&n, 6, 8);
        let s = store(4, chunks[0].bytes(), EvictionPolicy::Frequency { recency_window: 1 });
        for c in &chunks[..4] { s.insert(c.clone()).unwrap(); }
        for (i, &h) in hits.iter().enumerate() {
            for _ in 0..h { s.get(&chunks[i].prefix_key).unwrap(); }
        }
        // Every hit counts: the chunk with the fewest (the least recent among equals) goes.
        let last_touch = |i: usize| if hits[i] > 0 { 100 + (0..=i).map(|j| hits[j]).sum::<u64>() } else { i as u64 };
        let victim = (0..4).min_by_key(|&i| (hits[i], last_touch(i))).unwrap();
        s.insert(chunks[4].clone()).unwrap();
        for (i, c) in chunks[..4].iter().enumerate() {
            prop_assert_eq!(s.contains(&c.prefix_key), i != victim, "chunk {} (hits {:?})", i, hits);
        }
    }
}

#[test]
fn a_chunk_just_stored_is_protected_by_the_recency_window() {
    let n = ns();
    let chunks = distinct_chunks(&n, 6, 8);
    let s = store(
        3,
        chunks[0].bytes(),
        EvictionPolicy::Frequency { recency_window: 2 },
    );
    for c in &chunks[..3] {
        s.insert(c.clone()).unwrap();
    }
    for _ in 0..3 {
        s.get(&chunks[0].prefix_key).unwrap();
        s.get(&chunks[1].prefix_key).unwrap();
    }
    // Chunk 2 has no hits but chunk 0 and 1 were used recently... chunk 2 is outside the window.
    s.insert(chunks[3].clone()).unwrap();
    assert!(!s.contains(&chunks[2].prefix_key));
    // Chunk 3 (0 hits, just stored) is inside the window: chunk 0 or 1 leaves instead.
    s.insert(chunks[4].clone()).unwrap();
    assert!(s.contains(&chunks[3].prefix_key) && s.contains(&chunks[4].prefix_key));
}

#[test]
fn pinned_chunks_fill_the_budget_and_new_ones_are_rejected() {
    let n = ns();
    let chunks = distinct_chunks(&n, 3, 8);
    let s = store(2, chunks[0].bytes(), EvictionPolicy::Lru);
    for c in &chunks[..2] {
        s.insert(c.clone()).unwrap();
        assert!(s.pin(&c.prefix_key).unwrap());
    }
    assert_eq!(s.insert(chunks[2].clone()).unwrap(), Inserted::Rejected);
    assert_eq!(s.stats().budget_rejections, 1);
    assert!(s.unpin(&chunks[0].prefix_key));
    assert_eq!(s.insert(chunks[2].clone()).unwrap(), Inserted::Ram);
    assert!(!s.contains(&chunks[0].prefix_key) && s.contains(&chunks[1].prefix_key));
}

#[test]
fn a_zero_budget_is_a_config_error() {
    assert!(ChunkStore::new(StoreConfig::ram(0)).is_err());
}
