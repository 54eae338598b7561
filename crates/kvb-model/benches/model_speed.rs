//! Prefill and decode speed of the default model on the CPU backend, set against the f32 matmul
//! rate this machine reaches at the model's own shapes, measured in the same run (machines are
//! noisy: read the ratio, not the absolute numbers). Medians of several runs.
//!
//! Run with `cargo xtask bench model [--activations q8] [--batched-only]`: `--activations q8`
//! loads the model with 8-bit activations; `--batched-only` runs only the decode-step table;
//! `--step SEQUENCES,SHARED,OWN[,PREFILL]` repeats one step 200 times (a target for a profiler):
//! SEQUENCES decoding, each after SHARED tokens shared by all and OWN of its own, and with PREFILL
//! one more sequence's next PREFILL prompt tokens after the shared ones (a warm request's
//! prefill in a server's step; 0 for none, SEQUENCES may be 0 then).

use burn::tensor::{Distribution, Tensor};
use kvb_model::backends::Cpu;
use kvb_model::fetch::{ensure_default_model, models_dir_in};
use kvb_model::generate::{decode, logits_to_vec, GenerateParams};
use kvb_model::{
    load_pretrained, ActivationPrecision, FloatDtype, ForwardBatch, HostKv, KvPool, LoadOptions,
    LogitsFor, Model, ModelConfig, SeqRows,
};
use std::path::PathBuf;
use std::time::{Duration, Instant};

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// FLOPs of the linear layers for one token (q/k/v, o, gate/up, down, in every layer).
fn linear_flops_per_token(c: &ModelConfig) -> f64 {
    let (h, i) = (c.hidden_size as f64, c.intermediate_size as f64);
    let q = (c.num_heads * c.head_dim) as f64;
    let kv = c.kv_dim() as f64;
    2.0 * c.num_layers as f64 * (h * (q + 2.0 * kv) + q * h + h * 2.0 * i + i * h)
}

/// FLOPs of causal attention (QK^T and PV) over a prompt of `n` tokens.
fn attention_flops(c: &ModelConfig, n: usize) -> f64 {
    let pairs = (n * (n + 1) / 2) as f64;
    4.0 * pairs * (c.num_heads * c.head_dim) as f64 * c.num_layers as f64
}

/// GFLOP/s of `[rows, k] x [k, n]` products at the model's linear shapes, weighted by their FLOPs.
fn matmul_rate(c: &ModelConfig, rows: usize) -> f64 {
    let dev = Default::default();
    let (h, i) = (c.hidden_size, c.intermediate_size);
    let shapes = [
        (h, c.num_heads * c.head_dim + 2 * c.kv_dim()),
        (c.num_heads * c.head_dim, h),
        (h, 2 * i),
        (i, h),
    ];
    let (mut flops, mut secs) = (0.0, 0.0);
    for (k, n) in shapes {
        let x = Tensor::<Cpu, 2>::random([rows, k], Distribution::Default, &dev);
        let w = Tensor::<Cpu, 2>::random([k, n], Distribution::Default, &dev);
        let _ = x.clone().matmul(w.clone()).into_data();
        let runs: Vec<Duration> = (0..7)
            .map(|_| {
                let t = Instant::now();
                let _ = x.clone().matmul(w.clone()).into_data();
                t.elapsed()
            })
            .collect();
        flops += 2.0 * (rows * k * n) as f64;
        secs += median(runs).as_secs_f64();
    }
    flops / secs / 1e9
}

fn main() {
    let dir = models_dir_in(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.."));
    let paths = ensure_default_model(&dir, &mut |l| eprintln!("{l}")).expect("the default model");
    let args: Vec<String> = std::env::args().collect();
    let activations = match args.iter().position(|a| a == "--activations") {
        Some(i) => match args.get(i + 1).map(|v| v.parse::<ActivationPrecision>()) {
            Some(Ok(a)) => a,
            Some(Err(e)) => {
                eprintln!("--activations: {e}");
                std::process::exit(2);
            }
            None => {
                eprintln!("--activations takes f32 or q8");
                std::process::exit(2);
            }
        },
        None => ActivationPrecision::F32,
    };
    // The default model as shipped: its Q4_1 weights stay packed (the f32 folder computes the
    // same bits, slower).
    let m = load_pretrained::<Cpu>(
        &paths.gguf,
        LoadOptions {
            activations,
            ..LoadOptions::default()
        },
        &Default::default(),
        &mut |_, _| {},
    )
    .expect("loading the default model");
    println!("activations: {activations:?}");
    if let Some(i) = args.iter().position(|a| a == "--step") {
        // Every field must be a number: one dropped silently would shift the others.
        let shape: Vec<usize> = args
            .get(i + 1)
            .and_then(|v| v.split(',').map(|x| x.trim().parse().ok()).collect())
            .unwrap_or_default();
        let (batch, shared, own, prefill) = match shape[..] {
            [b, s, o] => (b, s, o, 0),
            [b, s, o, p] => (b, s, o, p),
            _ => {
                eprintln!("--step takes SEQUENCES,SHARED,OWN[,PREFILL] (three or four numbers)");
                std::process::exit(2);
            }
        };
        if batch + prefill == 0 {
            eprintln!("--step: nothing to run (SEQUENCES and PREFILL are both 0)");
            std::process::exit(2);
        }
        let ms = step(&m.model, batch, (shared, own), prefill, 200);
        println!(
            "{batch} sequences, {shared} shared + {own} own tokens, {prefill} prefill rows: \
             {ms:.2} ms per step (median of 200)"
        );
        return;
    }
    if args.iter().any(|a| a == "--batched-only") {
        batched_decode(&m.model);
        return;
    }
    let c = m.model.config().clone();
    let text =
        std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src/model/mod.rs"))
            .expect("source text to tokenize");
    let corpus = m
        .tokenizer
        .encode(&text.repeat(8), false)
        .expect("tokenize");

    let matmul = matmul_rate(&c, 512);
    println!("f32 matmul at the model's shapes ([512, k] x [k, n]): {matmul:.1} GFLOP/s");
    println!();
    println!(
        "| prompt tokens | prefill median | tokens/s | model GFLOP/s | share of matmul rate |"
    );
    println!("|---:|---:|---:|---:|---:|");
    for (n, reps) in [(128usize, 7usize), (512, 5), (2048, 3)] {
        let toks = &corpus[..n];
        let pos: Vec<usize> = (0..n).collect();
        let runs: Vec<Duration> = (0..reps)
            .map(|_| {
                let mut cache = m.model.new_cache();
                let t = Instant::now();
                let out = m
                    .model
                    .forward(toks, &pos, &mut cache, LogitsFor::Last)
                    .expect("prefill");
                let _ = logits_to_vec(out).expect("logits");
                t.elapsed()
            })
            .collect();
        let t = median(runs).as_secs_f64();
        let flops = linear_flops_per_token(&c) * n as f64 + attention_flops(&c, n);
        let rate = flops / t / 1e9;
        println!(
            "| {n} | {:.0} ms | {:.0} | {rate:.1} | {:.0}% |",
            t * 1e3,
            n as f64 / t,
            100.0 * rate / matmul
        );
    }

    // A warm request's shape: a few new tokens after a long cached prefix. The prefix is
    // prefilled once, and each run truncates back to it before computing the suffix.
    println!();
    println!("| cached prefix | new tokens | suffix prefill median | ms per new token |");
    println!("|---:|---:|---:|---:|");
    for (p, n) in [
        (1024usize, 16usize),
        (1024, 32),
        (1024, 64),
        (1024, 160),
        (3000, 16),
    ] {
        let pos: Vec<usize> = (0..p + n).collect();
        let mut cache = m.model.new_cache();
        cache.reserve(p + n);
        m.model
            .forward(&corpus[..p], &pos[..p], &mut cache, LogitsFor::Nothing)
            .expect("prefix");
        let runs: Vec<Duration> = (0..5)
            .map(|_| {
                cache.truncate(p);
                let t = Instant::now();
                let out = m
                    .model
                    .forward(&corpus[p..p + n], &pos[p..], &mut cache, LogitsFor::Last)
                    .expect("suffix");
                let _ = logits_to_vec(out).expect("logits");
                t.elapsed()
            })
            .collect();
        let t = median(runs).as_secs_f64();
        println!(
            "| {p} | {n} | {:.0} ms | {:.2} |",
            t * 1e3,
            t * 1e3 / n as f64
        );
    }

    let prompt = &corpus[..128];
    let pos: Vec<usize> = (0..128).collect();
    let params = GenerateParams {
        max_new_tokens: 65,
        stop_at_eos: false,
        ..Default::default()
    };
    let runs: Vec<Duration> = (0..3)
        .map(|_| {
            let mut cache = m.model.new_cache();
            let logits = logits_to_vec(
                m.model
                    .forward(prompt, &pos, &mut cache, LogitsFor::Last)
                    .expect("prefill"),
            )
            .expect("logits");
            let d = decode(
                &m.model,
                &m.tokenizer,
                &mut cache,
                logits,
                128,
                &params,
                &mut |_| {},
            )
            .expect("decode");
            d.decode_time / (d.tokens.len() as u32 - 1)
        })
        .collect();
    let step = median(runs).as_secs_f64();
    println!();
    println!("decode after a 128-token prompt: {:.1} ms/token, {:.1} tokens/s (median of 3 runs of 64 steps)", step * 1e3, 1.0 / step);

    batched_decode(&m.model);
}

/// One decode step of `batch` sequences that share a `shared`-token prefix (one copy of its
/// blocks) and each hold `own` tokens of their own: milliseconds per step, median of 5. The K/V
/// is filled with arbitrary values (attention costs the same whatever they are).
fn decode_step(model: &Model<Cpu>, batch: usize, shared: usize, own: usize, reps: usize) -> f64 {
    step(model, batch, (shared, own), 0, reps)
}

/// The median time of one forward pass over `batch` decoding sequences (`shared` tokens shared by
/// all, then `own` each) and, when `prefill > 0`, one more sequence's next `prefill` prompt rows
/// after the shared tokens.
fn step(
    model: &Model<Cpu>,
    batch: usize,
    (shared, own): (usize, usize),
    prefill: usize,
    reps: usize,
) -> f64 {
    let c = model.config();
    let bs = 32;
    let (h, d) = (c.num_kv_heads, c.head_dim);
    let blocks_of = |n: usize| n.div_ceil(bs);
    let shared_blocks = shared / bs;
    let per_seq = blocks_of(shared + own + 1) - shared_blocks;
    let prefill_blocks = blocks_of(shared + prefill) - shared_blocks;
    let total = shared_blocks + batch * per_seq + prefill_blocks;
    // f16, as the engine holds K/V for a model with quantized weights.
    let mut pool = KvPool::<Cpu>::with_precision(
        FloatDtype::F16,
        c.num_layers,
        (h, d),
        bs,
        total,
        &Default::default(),
    )
    .expect("pool");
    let fill: Vec<f32> = (0..h * total * bs * d)
        .map(|i| ((i * 7919) % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let all: Vec<usize> = (0..total * bs).collect();
    for l in 0..c.num_layers {
        pool.write_host(
            l,
            &all,
            HostKv::all(&fill, total * bs),
            HostKv::all(&fill, total * bs),
        )
        .expect("fill");
    }
    let tables: Vec<Vec<u32>> = (0..batch)
        .map(|b| {
            (0..shared_blocks as u32)
                .chain((0..per_seq).map(|i| (shared_blocks + b * per_seq + i) as u32))
                .collect()
        })
        .collect();
    let prefill_table: Vec<u32> = (0..(shared_blocks + prefill_blocks) as u32)
        .map(|i| match i as usize {
            i if i < shared_blocks => i as u32,
            i => (i + batch * per_seq) as u32,
        })
        .collect();
    let prefill_slots: Vec<usize> = (shared..shared + prefill).collect();
    let slot = shared + own;
    let slots = vec![slot];
    let mut tokens: Vec<u32> = (0..batch as u32).map(|b| 100 + b).collect();
    let mut positions = vec![slot; batch];
    tokens.extend((0..prefill as u32).map(|i| 200 + i));
    positions.extend(prefill_slots.iter().copied());
    // What the engine samples: every decode row, and a prefill's last row.
    let mut sampled: Vec<usize> = (0..batch).collect();
    if prefill > 0 {
        sampled.push(batch + prefill - 1);
    }
    let runs: Vec<Duration> = (0..reps)
        .map(|_| {
            let mut seqs: Vec<SeqRows> = tables
                .iter()
                .map(|t| SeqRows {
                    blocks: t,
                    slots: &slots,
                    decode: true,
                })
                .collect();
            if prefill > 0 {
                seqs.push(SeqRows {
                    blocks: &prefill_table,
                    slots: &prefill_slots,
                    decode: false,
                });
            }
            let batch_in = ForwardBatch {
                tokens: &tokens,
                positions: &positions,
                seqs: &seqs,
            };
            let t = Instant::now();
            let out = model
                .forward_batch(&batch_in, &mut pool, LogitsFor::Rows(sampled.clone()))
                .expect("step");
            let _ = logits_to_vec(out).expect("logits");
            t.elapsed()
        })
        .collect();
    median(runs).as_secs_f64() * 1e3
}

/// Decode steps of several sequences at once (continuous batching): the weights are read once
/// per step for every row, and a shared prefix's blocks once for every sequence reading them.
fn batched_decode(model: &Model<Cpu>) {
    println!();
    println!("| sequences | shared prefix | own tokens each | step | tokens/s | vs one sequence |");
    println!("|---:|---:|---:|---:|---:|---:|");
    for (shared, own) in [(0usize, 32usize), (1024, 128), (1024, 1024)] {
        let one = decode_step(model, 1, shared, own, 5);
        for batch in [1usize, 4, 16] {
            let ms = if batch == 1 {
                one
            } else {
                decode_step(model, batch, shared, own, 5)
            };
            println!(
                "| {batch} | {shared} | {own} | {ms:.1} ms | {:.1} | {:.1}x |",
                batch as f64 * 1e3 / ms,
                batch as f64 * one / ms
            );
        }
    }
}
