//! The disk tier keeps chunks across restarts, never returns a damaged chunk, and stays within its
//! budget.

mod common;

use common::{distinct_chunks, ns};
use kvb_store::{ChunkStore, DiskConfig, EvictionPolicy, KvChunk, StoreConfig};
use proptest::prelude::*;
use std::path::Path;

fn config(dir: &Path, ram_chunks: usize, disk_bytes: u64, chunk_bytes: usize) -> StoreConfig {
    StoreConfig {
        max_ram_bytes: ram_chunks * chunk_bytes,
        eviction: EvictionPolicy::Lru,
        disk: Some(DiskConfig {
            dir: dir.to_path_buf(),
            max_bytes: disk_bytes,
            segment_bytes: 4096,
        }),
        min_prefix_len: 1,
        remote: None,
    }
}

/// The tier's segment files and their index files (not its empty `LOCK`).
fn segments(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().is_some_and(|n| n != "LOCK"))
        .collect();
    v.sort();
    v
}

/// The segment files alone.
fn segment_files(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut v = segments(dir);
    v.retain(|p| p.extension().is_some_and(|e| e == "kvb"));
    v
}

#[test]
fn evicted_chunks_come_back_from_disk_and_survive_a_restart() {
    let n = ns();
    let chunks = distinct_chunks(&n, 10, 12);
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 2, 1 << 30, chunks[0].bytes());
    {
        let s = ChunkStore::new(cfg.clone()).unwrap();
        for c in &chunks {
            s.insert(c.clone()).unwrap();
        }
        let st = s.stats();
        assert_eq!((st.ram_chunks, st.disk_chunks, st.evictions), (2, 8, 8));
        assert_eq!(
            s.get(&chunks[0].prefix_key).unwrap().as_deref(),
            Some(&chunks[0])
        );
        assert_eq!(s.stats().promotions, 1);
        s.invalidate(&chunks[5].prefix_key).unwrap();
    }
    let s = ChunkStore::new(cfg).unwrap();
    for (i, c) in chunks.iter().enumerate() {
        let got = s.get(&c.prefix_key).unwrap();
        if i == 5 {
            assert!(
                got.is_none(),
                "an invalidated chunk must stay gone after a restart"
            );
        } else {
            // Evicted chunks were on disk already; the ones still in RAM were flushed on drop.
            assert_eq!(got.as_deref(), Some(c), "chunk {i}");
        }
    }
    assert_eq!(s.stats().corrupt_records, 0);
}

#[test]
fn the_disk_budget_holds_and_compaction_reclaims_space() {
    let n = ns();
    let chunks = distinct_chunks(&n, 40, 12);
    let dir = tempfile::tempdir().unwrap();
    let record = chunks[0].bytes() as u64 + 200;
    let s = ChunkStore::new(config(dir.path(), 1, 5 * record, chunks[0].bytes())).unwrap();
    for c in &chunks {
        s.insert(c.clone()).unwrap();
        let st = s.stats();
        assert!(st.disk_bytes <= 5 * record);
        let files: u64 = segment_files(dir.path())
            .iter()
            .map(|p| std::fs::metadata(p).unwrap().len())
            .sum();
        assert!(
            files <= 2 * 5 * record + record + 4096,
            "files hold {files} bytes"
        );
    }
    // The newest chunks survive; the oldest were dropped.
    assert!(s.contains(&chunks[39].prefix_key));
    assert!(!s.contains(&chunks[0].prefix_key));
    // Flushing moves the chunk still in RAM to disk, which drops the oldest there.
    s.flush().unwrap();
    let held: Vec<bool> = chunks.iter().map(|c| s.contains(&c.prefix_key)).collect();
    drop(s);
    // Dropped records stay dropped after a restart (tombstones), even under a budget that
    // would have room for them.
    let s = ChunkStore::new(config(dir.path(), 1, 1 << 30, chunks[0].bytes())).unwrap();
    for (i, c) in chunks.iter().enumerate() {
        assert_eq!(
            s.contains(&c.prefix_key),
            held[i],
            "chunk {i} after a restart"
        );
    }
    assert!(s.stats().disk_bytes <= 5 * record);
}

#[test]
fn a_second_opener_of_the_same_folder_gets_a_clear_error() {
    let chunks = distinct_chunks(&ns(), 2, 10);
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), 1, 1 << 30, chunks[0].bytes());
    let first = ChunkStore::new(cfg.clone()).unwrap();
    let err = ChunkStore::new(cfg.clone())
        .err()
        .expect("a second opener is refused");
    assert!(
        err.to_string().contains("in use by another process"),
        "{err}"
    );
    drop(first);
    // Released with the first store.
    assert!(ChunkStore::new(cfg).is_ok());
}

#[test]
fn opening_reads_segment_indexes_and_records_are_verified_when_read() {
    let chunks = distinct_chunks(&ns(), 12, 10);
    let dir = tempfile::tempdir().unwrap();
    write_store(dir.path(), &chunks);
    // Every segment was sealed with an index when the store closed.
    let files = segment_files(dir.path());
    assert!(files.len() > 1);
    for f in &files {
        assert!(
            f.with_extension("idx").exists(),
            "{} has no index",
            f.display()
        );
    }
    // Overwrite every K/V byte of the segments, keeping their lengths: an open that trusts the
    // indexes still lists every chunk (it did not read the records), and a read catches each.
    for f in &files {
        let len = std::fs::metadata(f).unwrap().len() as usize;
        std::fs::write(f, vec![0x5a; len]).unwrap();
    }
    let s = ChunkStore::new(config(dir.path(), 1, 1 << 30, chunks[0].bytes())).unwrap();
    assert_eq!(s.stats().disk_chunks, 12);
    for c in &chunks {
        assert!(s.get(&c.prefix_key).unwrap().is_none());
    }
    assert_eq!(s.stats().corrupt_records, 12);
    assert_eq!(s.stats().disk_chunks, 0);
}

fn write_store(dir: &Path, chunks: &[KvChunk]) {
    let s = ChunkStore::new(config(dir, 1, 1 << 30, chunks[0].bytes())).unwrap();
    for c in chunks {
        s.insert(c.clone()).unwrap();
    }
}

/// Reopens and checks that whatever comes back is exactly what was stored.
fn check_nothing_wrong(dir: &Path, chunks: &[KvChunk]) -> Result<usize, TestCaseError> {
    let s = ChunkStore::new(config(dir, 1, 1 << 30, chunks[0].bytes())).unwrap();
    let mut intact = 0;
    for c in chunks {
        if let Some(got) = s.get(&c.prefix_key).unwrap() {
            prop_assert_eq!(&*got, c);
            intact += 1;
        }
        if let Some(m) = s.get_by_content(&c.content_key).unwrap() {
            prop_assert_eq!(&*m.chunk, c);
        }
    }
    Ok(intact)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn truncated_segments_lose_only_their_tail(cut in any::<prop::sample::Index>()) {
        let chunks = distinct_chunks(&ns(), 12, 10);
        let dir = tempfile::tempdir().unwrap();
        write_store(dir.path(), &chunks);
        let files = segments(dir.path());
        let victim = &files[cut.index(files.len())];
        let len = std::fs::metadata(victim).unwrap().len();
        let f = std::fs::OpenOptions::new().write(true).open(victim).unwrap();
        f.set_len(len / 2).unwrap();
        check_nothing_wrong(dir.path(), &chunks)?;
    }

    #[test]
    fn flipped_bytes_are_detected_and_skipped(flips in proptest::collection::vec((any::<prop::sample::Index>(), any::<prop::sample::Index>(), 1u8..), 1..6)) {
        let chunks = distinct_chunks(&ns(), 12, 10);
        let dir = tempfile::tempdir().unwrap();
        write_store(dir.path(), &chunks);
        let files = segments(dir.path());
        for (file, at, x) in flips {
            let p = &files[file.index(files.len())];
            let mut bytes = std::fs::read(p).unwrap();
            let i = at.index(bytes.len());
            bytes[i] ^= x;
            std::fs::write(p, bytes).unwrap();
        }
        let intact = check_nothing_wrong(dir.path(), &chunks)?;
        prop_assert!(intact >= 12 - 6 - 1, "more chunks lost ({}) than records damaged", 12 - intact);
    }
}

#[test]
fn corruption_after_open_is_caught_on_read() {
    let chunks = distinct_chunks(&ns(), 4, 10);
    let dir = tempfile::tempdir().unwrap();
    let s = ChunkStore::new(config(dir.path(), 1, 1 << 30, chunks[0].bytes())).unwrap();
    for c in &chunks {
        s.insert(c.clone()).unwrap();
    }
    for p in segments(dir.path()) {
        let mut bytes = std::fs::read(&p).unwrap();
        let mid = bytes.len() / 2;
        bytes[mid] ^= 0xff;
        std::fs::write(&p, bytes).unwrap();
    }
    for c in &chunks {
        if let Some(got) = s.get(&c.prefix_key).unwrap() {
            assert_eq!(&*got, c);
        }
    }
    assert!(s.stats().corrupt_records >= 1);
}
