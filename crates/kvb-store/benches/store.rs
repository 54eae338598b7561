//! Store lookup latency with 100k chunks in RAM, and disk tier write/read throughput.

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use kvb_hash::Namespace;
use kvb_store::{ChunkStore, DiskConfig, EvictionPolicy, KvChunk, KvData, LayerKv, StoreConfig};
use std::hint::black_box;

/// A chunk of `n` tokens with `layers` layers of one 8-wide head (small: lookups are about keys).
fn chunk(ns: &Namespace, i: u32, n: usize, layers: usize, width: usize) -> KvChunk {
    let tokens: Vec<u32> = (0..n as u32)
        .map(|t| t ^ i.wrapping_mul(2_654_435_761))
        .collect();
    KvChunk {
        prefix_key: ns.prefix_key(&ns.root(), &tokens),
        content_key: ns.content_key(&tokens),
        parent: ns.root(),
        positions: (0..n as u32).collect(),
        kv_heads: 1,
        head_dim: width,
        layers: (0..layers)
            .map(|_| LayerKv {
                k: KvData::F32(vec![0.5; n * width]),
                v: KvData::F32(vec![0.25; n * width]),
            })
            .collect(),
        tokens,
    }
}

fn lookups(c: &mut Criterion) {
    let ns = Namespace::builder().model_fingerprint(b"bench").build();
    let store = ChunkStore::new(StoreConfig {
        max_ram_bytes: 1 << 34,
        eviction: EvictionPolicy::Lru,
        disk: None,
        min_prefix_len: 1,
        remote: None,
    })
    .unwrap();
    let chunks: Vec<KvChunk> = (0..100_000).map(|i| chunk(&ns, i, 16, 1, 8)).collect();
    let keys: Vec<_> = chunks
        .iter()
        .map(|c| (c.prefix_key, c.content_key, c.tokens.clone()))
        .collect();
    for c in chunks {
        store.insert(c).unwrap();
    }
    let mut group = c.benchmark_group("store/100k chunks");
    let mut i = 0usize;
    group.bench_function("get by prefix key", |b| {
        b.iter(|| {
            i = (i + 7919) % keys.len();
            black_box(store.get(&keys[i].0).unwrap())
        })
    });
    group.bench_function("lookup by content key", |b| {
        b.iter(|| {
            i = (i + 7919) % keys.len();
            black_box(store.get_by_content(&keys[i].1).unwrap())
        })
    });
    group.bench_function("longest prefix", |b| {
        b.iter(|| {
            i = (i + 7919) % keys.len();
            black_box(store.longest_prefix(ns.root(), &keys[i].2).unwrap())
        })
    });
    group.finish();
}

fn disk(c: &mut Criterion) {
    let ns = Namespace::builder()
        .model_fingerprint(b"bench-disk")
        .build();
    // SmolLM2-shaped: 30 layers x 3 heads x 64, 128 tokens, f32: ~5.9 MB per chunk.
    let sample = chunk(&ns, 0, 128, 30, 192);
    let bytes = sample.bytes() as u64;
    let mut group = c.benchmark_group("store/disk tier");
    group.throughput(Throughput::Bytes(bytes));
    group.sample_size(10);
    group.bench_function("write (RAM eviction to disk)", |b| {
        b.iter_batched(
            || {
                let dir = tempfile::tempdir().unwrap();
                let cfg = StoreConfig {
                    max_ram_bytes: 1,
                    eviction: EvictionPolicy::Lru,
                    disk: Some(DiskConfig::new(dir.path(), 1 << 32)),
                    min_prefix_len: 1,
                    remote: None,
                };
                (ChunkStore::new(cfg).unwrap(), dir)
            },
            |(store, _dir)| store.insert(sample.clone()).unwrap(),
            BatchSize::PerIteration,
        )
    });
    let dir = tempfile::tempdir().unwrap();
    let cfg = StoreConfig {
        max_ram_bytes: 1,
        eviction: EvictionPolicy::Lru,
        disk: Some(DiskConfig::new(dir.path(), 1 << 32)),
        min_prefix_len: 1,
        remote: None,
    };
    let store = ChunkStore::new(cfg).unwrap();
    store.insert(sample.clone()).unwrap();
    group.bench_function("read (checksum + decode)", |b| {
        b.iter(|| black_box(store.get(&sample.prefix_key).unwrap()))
    });
    group.finish();
}

criterion_group!(benches, lookups, disk);
criterion_main!(benches);
