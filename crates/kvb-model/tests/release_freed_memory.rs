//! The CPU backend hands freed host memory back after a long pass: pages that glibc would keep
//! in its heap, between blocks still in use, leave the process. Its own binary, so no other
//! test allocates while resident memory is read.

#![cfg(all(target_os = "linux", target_env = "gnu"))]

use burn::backend::NdArray;
use kvb_model::model::ModelBackend;

/// Resident memory now, from `/proc/self/statm` (pages of 4 KiB).
fn resident_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap();
    let pages: u64 = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
    pages * 4096
}

#[test]
fn freed_tensors_pages_leave_the_process() {
    // 96 KiB pieces sit under glibc's mmap threshold: they come from the heap, as a pass's
    // tensors do once the threshold has grown. Keeping every eighth leaves the freed ones
    // between live blocks, where the heap cannot shrink from its top.
    const PIECE: usize = 96 << 10;
    let mut pieces: Vec<Vec<u8>> = (0..1500).map(|i| vec![i as u8 | 1; PIECE]).collect();
    let kept: Vec<Vec<u8>> = pieces
        .iter_mut()
        .enumerate()
        .filter(|(i, _)| i % 8 == 0)
        .map(|(_, p)| std::mem::take(p))
        .collect();
    drop(pieces);
    let before = resident_bytes();
    <NdArray<f32> as ModelBackend>::release_freed_memory();
    let after = resident_bytes();
    let freed = (1500 - kept.len()) * PIECE;
    assert!(
        before.saturating_sub(after) as usize > freed / 2,
        "resident {before} -> {after} bytes after freeing {freed}"
    );
    assert!(kept.iter().all(|p| p.iter().all(|&b| b & 1 == 1)));
}
