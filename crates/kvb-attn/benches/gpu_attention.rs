//! The CubeCL kernel against the reference attention in burn tensor ops, on the same device:
//! a causal prefill, a suffix after cached K/V, CacheBlend's scattered 15% of rows, and a batch
//! of decode steps, all through the paged entry point the engine calls (16-token blocks).
//! Prints a table (median time, FLOP/s, kernel/reference speed-up) and writes it to
//! `$KVB_BENCH_OUT/results.md` when that is set.
//!
//! Run with `cargo xtask bench attn [--backend wgpu|cuda] [--dtype f32|f16|bf16] [--quick]`,
//! which sets `KVB_ATTN_BACKEND`, `KVB_ATTN_DTYPE` and `KVB_BENCH_QUICK`. The tensors (q, the
//! K/V pool, the output) hold the dtype; both paths compute in it as they do in the engine (the
//! kernel accumulates in f32). On lavapipe (wgpu on a CPU) only the ratios mean anything;
//! `--quick` keeps the shapes small enough for it.

use burn::tensor::{Distribution, Tensor};
use kvb_attn::{paged_attention, AttentionBackend, PagedBatch, PagedSeq};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

const BLOCK: usize = 16;

/// Heads, head dim and context of one run.
struct Shape {
    q_heads: usize,
    kv_heads: usize,
    head_dim: usize,
    context: usize,
    reps: usize,
}

/// One case: its sequences as (rows' last slots, decode).
struct Case {
    name: &'static str,
    seqs: Vec<(Vec<usize>, bool)>,
    /// Multiply-adds of the attention, times 2 (QK^T and PV each 2 per element pair).
    flops: f64,
}

fn cases(s: &Shape) -> Vec<Case> {
    let (l, hq, d) = (s.context, s.q_heads as f64, s.head_dim as f64);
    let per_key = 4.0 * hq * d;
    let suffix = 128.min(l);
    let sparse: Vec<usize> = (0..l).step_by(7).collect(); // ~15% of the rows, scattered
    let decode_seqs = 8;
    vec![
        Case {
            name: "prefill, causal",
            seqs: vec![((0..l).collect(), false)],
            flops: per_key * (l * (l + 1) / 2) as f64,
        },
        Case {
            name: "suffix of 128 after cached K/V",
            seqs: vec![((l - suffix..l).collect(), false)],
            flops: per_key * (l - suffix..l).map(|x| x + 1).sum::<usize>() as f64,
        },
        Case {
            name: "scattered 15% of rows (CacheBlend)",
            flops: per_key * sparse.iter().map(|x| x + 1).sum::<usize>() as f64,
            seqs: vec![(sparse, false)],
        },
        Case {
            name: "decode, 8 sequences",
            seqs: (0..decode_seqs).map(|_| (vec![l - 1], true)).collect(),
            flops: per_key * (decode_seqs * l) as f64,
        },
    ]
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Median time of `kernel` and of the reference on one case.
fn time_case<B: AttentionBackend>(s: &Shape, case: &Case, dev: &B::Device) -> [Duration; 2] {
    let blocks_per_seq = s.context.div_ceil(BLOCK);
    let n_seqs = case.seqs.len();
    let pool = [s.kv_heads, n_seqs * blocks_per_seq * BLOCK, s.head_dim];
    let k = Tensor::<B, 3>::random(pool, Distribution::Normal(0.0, 1.0), dev);
    let v = Tensor::<B, 3>::random(pool, Distribution::Normal(0.0, 1.0), dev);
    let rows: usize = case.seqs.iter().map(|(r, _)| r.len()).sum();
    let q = Tensor::<B, 4>::random([1, s.q_heads, rows, s.head_dim], Distribution::Default, dev);
    let tables: Vec<Vec<u32>> = (0..n_seqs)
        .map(|i| ((i * blocks_per_seq) as u32..((i + 1) * blocks_per_seq) as u32).collect())
        .collect();
    let mut next = 0;
    let seqs: Vec<PagedSeq> = case
        .seqs
        .iter()
        .zip(&tables)
        .map(|((last, decode), blocks)| {
            let rows = next..next + last.len();
            next = rows.end;
            PagedSeq {
                blocks,
                rows,
                last_slot: last,
                decode: *decode,
            }
        })
        .collect();
    let batch = PagedBatch {
        block_size: BLOCK,
        seqs: &seqs,
    };
    let scale = (s.head_dim as f32).powf(-0.5);
    type Paged<B> = fn(
        Tensor<B, 4>,
        &Tensor<B, 3>,
        &Tensor<B, 3>,
        &PagedBatch,
        f32,
    ) -> Result<Tensor<B, 2>, kvb_attn::AttnError>;
    let fs: [Paged<B>; 2] = [
        <B as AttentionBackend>::paged_attention,
        paged_attention::<B>,
    ];
    fs.map(|f| {
        let run = || {
            let t = Instant::now();
            let out = f(q.clone(), &k, &v, &batch, scale).expect("attention");
            B::sync(dev).expect("sync");
            drop(out);
            t.elapsed()
        };
        run(); // compiles the kernel variant, autotunes the reference's products
        median((0..s.reps).map(|_| run()).collect())
    })
}

/// burn's own attention op on the causal prefill (dense q/k/v, the kv heads repeated for every q
/// head): on CubeCL backends CubeCL's flash attention on tensor cores or burn's fallback ops,
/// whichever its autotune picks. A yardstick for the paged kernels, not a path kvb takes.
fn time_burn_attention<B: AttentionBackend>(s: &Shape, dev: &B::Device) -> Duration {
    use burn::tensor::module::attention;
    use burn::tensor::ops::AttentionModuleOptions;
    let (l, group) = (s.context, s.q_heads / s.kv_heads);
    let q = Tensor::<B, 4>::random([1, s.q_heads, l, s.head_dim], Distribution::Default, dev);
    let kv = |_| {
        Tensor::<B, 4>::random([1, s.kv_heads, l, s.head_dim], Distribution::Default, dev)
            .unsqueeze_dim::<5>(2)
            .repeat_dim(2, group)
            .reshape([1, s.q_heads, l, s.head_dim])
    };
    let (k, v) = (kv(0), kv(1));
    let options = AttentionModuleOptions {
        is_causal: true,
        ..Default::default()
    };
    let run = || {
        let t = Instant::now();
        let out = attention(q.clone(), k.clone(), v.clone(), None, None, options);
        B::sync(dev).expect("sync");
        drop(out);
        t.elapsed()
    };
    run();
    run(); // autotune
    median((0..s.reps).map(|_| run()).collect())
}

fn report<B: AttentionBackend>(backend: &str, s: &Shape, dev: &B::Device) -> String {
    let dtype = format!("{:?}", <B::FloatElem as burn::tensor::Element>::dtype()).to_lowercase();
    let mut out = format!(
        "# Attention kernel vs reference ({backend}, {dtype})\n\n{} q heads over {} kv heads, \
         head dim {}, context {}, {dtype}, 16-token blocks, median of {}.\n\n\
         | case | kernel | reference | kernel GFLOP/s | reference GFLOP/s | speed-up |\n\
         |---|---:|---:|---:|---:|---:|\n",
        s.q_heads, s.kv_heads, s.head_dim, s.context, s.reps
    );
    for case in cases(s) {
        let [kernel, reference] = time_case::<B>(s, &case, dev);
        let gflops = |t: Duration| case.flops / t.as_secs_f64() / 1e9;
        let row = format!(
            "| {} | {:.2} ms | {:.2} ms | {:.1} | {:.1} | {:.2}x |\n",
            case.name,
            kernel.as_secs_f64() * 1e3,
            reference.as_secs_f64() * 1e3,
            gflops(kernel),
            gflops(reference),
            reference.as_secs_f64() / kernel.as_secs_f64()
        );
        eprint!("{row}");
        out.push_str(&row);
    }
    let prefill = &cases(s)[0];
    let burn = time_burn_attention::<B>(s, dev);
    let row = format!(
        "\nburn's attention op on the same causal prefill (dense, kv heads repeated): {:.2} ms, \
         {:.1} GFLOP/s\n",
        burn.as_secs_f64() * 1e3,
        prefill.flops / burn.as_secs_f64() / 1e9
    );
    eprint!("{row}");
    out.push_str(&row);
    out
}

fn main() {
    // `cargo bench` passes `--bench`; this harness takes no arguments.
    let quick = std::env::var_os("KVB_BENCH_QUICK").is_some();
    let shape = if quick {
        // SmolLM2-135M's heads at a context lavapipe gets through in seconds.
        Shape {
            q_heads: 9,
            kv_heads: 3,
            head_dim: 64,
            context: 512,
            reps: 3,
        }
    } else {
        // The target shape: Llama-style 32/8 heads, head dim 128, 4,096 tokens.
        Shape {
            q_heads: 32,
            kv_heads: 8,
            head_dim: 128,
            context: 4096,
            reps: 10,
        }
    };
    let backend = std::env::var("KVB_ATTN_BACKEND").unwrap_or_else(|_| "wgpu".into());
    let dtype = std::env::var("KVB_ATTN_DTYPE").unwrap_or_else(|_| "f32".into());
    let text = match (backend.as_str(), dtype.as_str()) {
        #[cfg(feature = "wgpu")]
        ("wgpu", "f32") => {
            report::<burn::backend::Wgpu<f32, i32>>("wgpu", &shape, &Default::default())
        }
        #[cfg(feature = "wgpu")]
        ("wgpu", "f16") => {
            report::<burn::backend::Wgpu<half::f16, i32>>("wgpu", &shape, &Default::default())
        }
        #[cfg(feature = "cuda")]
        ("cuda", "f32") => {
            report::<burn::backend::Cuda<f32, i32>>("cuda", &shape, &Default::default())
        }
        #[cfg(feature = "cuda")]
        ("cuda", "f16") => {
            report::<burn::backend::Cuda<half::f16, i32>>("cuda", &shape, &Default::default())
        }
        #[cfg(feature = "cuda")]
        ("cuda", "bf16") => {
            report::<burn::backend::Cuda<half::bf16, i32>>("cuda", &shape, &Default::default())
        }
        (backend, dtype) => {
            eprintln!(
                "backend `{backend}` in `{dtype}` is not compiled in (features wgpu, cuda; wgpu \
                 takes f32 or f16, cuda f32, f16 or bf16)"
            );
            std::process::exit(2);
        }
    };
    let mut text = text;
    let _ = writeln!(text);
    if let Some(dir) = std::env::var_os("KVB_BENCH_OUT") {
        let dir = std::path::PathBuf::from(dir);
        std::fs::create_dir_all(&dir).expect("create the results folder");
        std::fs::write(dir.join("results.md"), &text).expect("write results.md");
        eprintln!("wrote {}", dir.join("results.md").display());
    }
}
