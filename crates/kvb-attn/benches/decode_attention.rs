//! Decode attention over a long cache, set against this machine's streaming read rate measured in
//! the same run: a decode step is memory-bound, so the ratio (attention's K/V bytes per second over
//! a plain parallel sum's) says how close the kernel gets to the limit. SmolLM2-135M's shapes
//! (9 q heads over 3 kv heads, head_dim 64, 30 layers), one decode row, 16-token blocks; the pool
//! in f32 and in f16 (half the bytes; kvb-model's CPU pool holds f16 bits in a `u16` array).
//!
//! `KVB_ATTN_SHAPE=layers,q_heads,kv_heads,head_dim,block_size` takes another model's shapes:
//! `24,32,32,64,32` is SmolLM2-1.7B's (no grouping: each key serves one query head),
//! `16,32,8,64,32` Llama-3.2-1B's.
//!
//! Run with `cargo bench -p kvb-attn --bench decode_attention` (threads: `RAYON_NUM_THREADS`).

use burn::tensor::{Distribution, Tensor, TensorData, TensorPrimitive};
use burn_ndarray::{NdArray, NdArrayTensor};
use kvb_attn::{AttentionBackend, PagedBatch, PagedSeq};
use rayon::prelude::*;
use std::time::{Duration, Instant};

type B = NdArray<f32>;

/// Layers, q heads, kv heads, head_dim and block size: SmolLM2-135M's, or `KVB_ATTN_SHAPE`.
fn shape() -> [usize; 5] {
    let Ok(text) = std::env::var("KVB_ATTN_SHAPE") else {
        return [30, 9, 3, 64, 16];
    };
    let v: Vec<usize> = text
        .split(',')
        .map(|x| x.trim().parse().expect("KVB_ATTN_SHAPE: five counts"))
        .collect();
    v.try_into().expect("KVB_ATTN_SHAPE: five counts")
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Seconds per pass of a parallel sum over `bytes` of f32 (the machine's read rate).
fn stream_rate(data: &[f32]) -> f64 {
    let run = || {
        let t = Instant::now();
        // Eight independent lanes so that the sum vectorises (a float sum in order does not).
        let s: f32 = data
            .par_chunks(1 << 16)
            .map(|c| {
                let mut lanes = [0f32; 8];
                for row in c.chunks_exact(8) {
                    lanes.iter_mut().zip(row).for_each(|(l, x)| *l += x);
                }
                lanes.iter().sum::<f32>()
            })
            .sum();
        std::hint::black_box(s);
        t.elapsed()
    };
    run();
    let t = median((0..7).map(|_| run()).collect());
    std::mem::size_of_val(data) as f64 / t.as_secs_f64()
}

fn main() {
    let dev = Default::default();
    let [layers, q_heads, kv_heads, head_dim, block] = shape();
    println!(
        "{layers} layers, {q_heads} q heads over {kv_heads} kv heads, head_dim {head_dim}, \
         blocks of {block}"
    );
    for keys in [1_024usize, 2_706] {
        let blocks = keys.div_ceil(block);
        let shape = [kv_heads, blocks * block, head_dim];
        // One pool per layer, as in the model: the whole cache does not fit in any cache level.
        let pools: Vec<(Tensor<B, 3>, Tensor<B, 3>)> = (0..layers)
            .map(|_| {
                let k = Tensor::random(shape, Distribution::Normal(0.0, 1.0), &dev);
                let v = Tensor::random(shape, Distribution::Normal(0.0, 1.0), &dev);
                (k, v)
            })
            .collect();
        let q = Tensor::<B, 4>::random([1, q_heads, 1, head_dim], Distribution::Default, &dev);
        let table: Vec<u32> = (0..blocks as u32).collect();
        let last = [keys - 1];
        let seqs = [PagedSeq {
            blocks: &table,
            rows: 0..1,
            last_slot: &last,
            decode: true,
        }];
        let batch = PagedBatch {
            block_size: block,
            seqs: &seqs,
        };
        // The same values as f16 bits.
        let to_f16 = |t: &Tensor<B, 3>| {
            let bits: Vec<u16> = t
                .to_data()
                .to_vec::<f32>()
                .expect("f32")
                .iter()
                .map(|&x| half::f16::from_f32(x).to_bits())
                .collect();
            let primitive = NdArrayTensor::from_data(TensorData::new(bits, shape));
            Tensor::<B, 3>::from_primitive(TensorPrimitive::Float(primitive))
        };
        let half_pools: Vec<(Tensor<B, 3>, Tensor<B, 3>)> =
            pools.iter().map(|(k, v)| (to_f16(k), to_f16(v))).collect();
        let step = |pools: &[(Tensor<B, 3>, Tensor<B, 3>)]| {
            let t = Instant::now();
            for (k, v) in pools {
                let out = B::paged_attention(q.clone(), k, v, &batch, 0.125).expect("shapes fit");
                std::hint::black_box(out);
            }
            t.elapsed()
        };
        let f32_bytes = (2 * layers * kv_heads * keys * head_dim * 4) as f64;
        // Any values will do: the sum only reads them.
        let flat: Vec<f32> = (0..f32_bytes as usize / 4)
            .map(|i| (i % 7) as f32)
            .collect();
        let stream = stream_rate(&flat);
        let mut times = Vec::new();
        for (name, pools, bytes) in [
            ("f32", &pools, f32_bytes),
            ("f16", &half_pools, f32_bytes / 2.0),
        ] {
            step(pools);
            let t = median((0..25).map(|_| step(pools)).collect());
            let rate = bytes / t.as_secs_f64();
            println!(
                "{keys:>5} keys, {name} pool: {:.2} ms per step ({layers} layers), K/V read at \
                 {:.1} GB/s; streaming sum {:.1} GB/s; ratio {:.2}",
                t.as_secs_f64() * 1e3,
                rate / 1e9,
                stream / 1e9,
                rate / stream
            );
            times.push(t);
        }
        println!(
            "{keys:>5} keys: f16 pool step time / f32 pool step time {:.2}",
            times[1].as_secs_f64() / times[0].as_secs_f64()
        );
    }
}
