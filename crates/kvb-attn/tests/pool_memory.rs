//! The CPU pool's memory is what its blocks hold once written, not its size: the engine makes
//! it at its whole budget ([`PoolBackend::pool_reserves_budget`]) on that promise.

use burn::backend::NdArray;
use kvb_attn::{FloatDtype, HostKv, KvPool, PoolBackend};

/// This process's resident memory in bytes (Linux `VmRSS`).
fn resident_bytes() -> usize {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let kib: usize = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("a VmRSS line");
    kib * 1024
}

/// A 2 GiB f16 pool shaped like a 1.7B model's (24 layers, 32 kv heads of 64), two blocks
/// written: resident memory grows by about those blocks (12.6 MB), far under the pool's size;
/// written values read back, and an unwritten slot reads zero. Other tests of this binary run
/// beside it, allocating a few MB each, hence the 256 MiB bound. Linux only: it reads
/// `/proc`; and where the kernel refuses to overcommit the pool is grown, not reserved.
#[test]
#[cfg(target_os = "linux")]
fn a_reserved_cpu_pool_costs_what_its_written_blocks_hold() {
    let strict =
        std::fs::read_to_string("/proc/sys/vm/overcommit_memory").is_ok_and(|m| m.trim() == "2");
    assert_eq!(
        <NdArray as PoolBackend>::pool_reserves_budget(),
        !strict,
        "the CPU reserves the pool's budget where the kernel overcommits"
    );
    if strict {
        eprintln!("vm.overcommit_memory is 2: the pool is not reserved here, nothing to measure");
        return;
    }
    let (layers, heads, dim, block) = (24, 32, 64, 32);
    let block_bytes =
        KvPool::<NdArray>::bytes_per_block(layers, (heads, dim), block, FloatDtype::F16);
    let blocks = (2usize << 30) / block_bytes;
    let before = resident_bytes();
    let mut pool = KvPool::<NdArray>::with_precision(
        FloatDtype::F16,
        layers,
        (heads, dim),
        block,
        blocks,
        &Default::default(),
    )
    .unwrap();
    let values: Vec<f32> = (0..heads * block * dim)
        .map(|i| (i % 251) as f32 * 0.25)
        .collect();
    let slots = |b: usize| (b * block..(b + 1) * block).collect::<Vec<_>>();
    let written = [0, blocks / 2];
    for &b in &written {
        let kv = (HostKv::all(&values, block), HostKv::all(&values, block));
        pool.write_host_all(&slots(b), &vec![kv; layers]).unwrap();
    }
    let grown = resident_bytes().saturating_sub(before);
    assert!(
        grown < 256 << 20,
        "a pool of {} MiB with 2 blocks written took {} MiB",
        blocks * block_bytes >> 20,
        grown >> 20
    );
    for &b in &written {
        let (k, v) = pool.read_host(layers - 1, &slots(b)).unwrap();
        assert_eq!(k, values);
        assert_eq!(v, values);
    }
    let (k, _) = pool.read_host(3, &[blocks / 4 * block + 5]).unwrap();
    assert!(k.iter().all(|&x| x == 0.0));
}
