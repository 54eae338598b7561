//! Quantize and dequantize throughput (GB/s of f32 input) on one layer's K of a 128-token chunk
//! shaped like SmolLM2's (3 kv heads x 64).

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use kvb_quant::{quantize, Bits, QuantAxis, QuantConfig};
use std::hint::black_box;

fn quant(c: &mut Criterion) {
    let shape = [3usize, 128, 64];
    let data: Vec<f32> = (0..shape.iter().product::<usize>())
        .map(|i| ((i * 7919) % 1000) as f32 / 250.0 - 2.0)
        .collect();
    let mut group = c.benchmark_group("kivi");
    group.throughput(Throughput::Bytes((data.len() * 4) as u64));
    for bits in [Bits::Eight, Bits::Four, Bits::Two] {
        for axis in [QuantAxis::PerChannel, QuantAxis::PerToken] {
            let cfg = QuantConfig {
                bits,
                group_size: 32,
            };
            group.bench_function(format!("quantize/{}bit/{axis:?}", bits.count()), |b| {
                b.iter(|| quantize(black_box(&data), shape, axis, cfg).unwrap())
            });
            let q = quantize(&data, shape, axis, cfg).unwrap();
            let mut out = vec![0f32; data.len()];
            group.bench_function(format!("dequantize/{}bit/{axis:?}", bits.count()), |b| {
                b.iter(|| q.dequantize_into(black_box(&mut out)))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, quant);
criterion_main!(benches);
