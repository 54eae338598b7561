//! Key hashing throughput, in bytes of token ids hashed per second.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kvb_hash::Namespace;
use std::hint::black_box;

fn hashing(c: &mut Criterion) {
    let ns = Namespace::builder()
        .model_fingerprint(b"bench")
        .dtype("f32")
        .kv_bits(16)
        .build();
    let mut group = c.benchmark_group("hash");
    for chunk in [128usize, 4096] {
        let tokens: Vec<u32> = (0..chunk as u32)
            .map(|i| i.wrapping_mul(2_654_435_761))
            .collect();
        group.throughput(Throughput::Bytes((chunk * 4) as u64));
        group.bench_function(format!("prefix_key/{chunk}-token chunk"), |b| {
            b.iter(|| ns.prefix_key(&ns.root(), black_box(&tokens)))
        });
        group.bench_function(format!("content_key/{chunk}-token chunk"), |b| {
            b.iter(|| ns.content_key(black_box(&tokens)))
        });
    }
    group.finish();
}

criterion_group!(benches, hashing);
criterion_main!(benches);
