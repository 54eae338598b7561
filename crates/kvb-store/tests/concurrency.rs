//! Many threads reading and writing one store: every read returns the right chunk or nothing, and
//! the budget holds.

mod common;

use common::{distinct_chunks, ns};
use kvb_store::{ChunkStore, DiskConfig, EvictionPolicy, StoreConfig};
use std::sync::Arc;

#[test]
fn concurrent_readers_and_writers_see_consistent_chunks() {
    let chunks = Arc::new(distinct_chunks(&ns(), 64, 16));
    let dir = tempfile::tempdir().unwrap();
    let budget = 16 * chunks[0].bytes();
    let store = Arc::new(
        ChunkStore::new(StoreConfig {
            max_ram_bytes: budget,
            eviction: EvictionPolicy::default(),
            disk: Some(DiskConfig::new(dir.path(), 1 << 30)),
            min_prefix_len: 1,
            remote: None,
        })
        .unwrap(),
    );
    let threads: Vec<_> = (0..8)
        .map(|t| {
            let (store, chunks) = (store.clone(), chunks.clone());
            std::thread::spawn(move || {
                for round in 0..400usize {
                    let i = (round * 31 + t * 17) % chunks.len();
                    if (round + t) % 3 == 0 {
                        store.insert(chunks[i].clone()).unwrap();
                    } else if let Some(got) = store.get(&chunks[i].prefix_key).unwrap() {
                        assert_eq!(*got, chunks[i]);
                    }
                    if let Some(m) = store
                        .longest_prefix(ns().root(), &chunks[i].tokens)
                        .unwrap()
                    {
                        assert_eq!(*m.chunks[0].0, chunks[i]);
                    }
                    assert!(store.stats().ram_bytes <= budget);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("a worker thread panicked");
    }
    // Everything inserted is still somewhere (RAM or disk).
    for (i, c) in chunks.iter().enumerate() {
        let inserted =
            (0..8).any(|t| (0..400usize).any(|r| (r * 31 + t * 17) % 64 == i && (r + t) % 3 == 0));
        assert_eq!(store.contains(&c.prefix_key), inserted, "chunk {i}");
    }
}
