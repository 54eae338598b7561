//! A projection's product on a GPU backend at Llama-3.2-1B's projection shapes and 1, 4, 16 and
//! 512 rows: burn's matmul with the weight held `[in, out]` contiguous or as the transposed view
//! of `[out, in]` (what [`ModelBackend::weights_out_in`] chooses), and the product kvb runs
//! ([`ModelBackend::linear_matmul`]: its own kernel up to 16 rows). A decode step reads every
//! weight once, so its products should stream the weights at the memory's bandwidth.
//!
//! Prints a table (median time, weight bytes read per second) and writes it to
//! `$KVB_BENCH_OUT/results.md` when that is set. `KVB_BENCH_BACKEND` (wgpu, cuda) and
//! `KVB_BENCH_DTYPE` (f32, f16, bf16) pick the backend; `KVB_BENCH_QUICK` takes small shapes
//! (lavapipe, where only the run's success means anything).

use burn::tensor::{Distribution, Tensor};
use kvb_model::ModelBackend;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// (name, in, out).
const SHAPES: [(&str, usize, usize); 5] = [
    ("q, k, v", 2048, 3072),
    ("o", 2048, 2048),
    ("gate, up", 2048, 16384),
    ("down", 8192, 2048),
    ("LM head", 2048, 128_256),
];

const QUICK_SHAPES: [(&str, usize, usize); 2] = [("q, k, v", 64, 96), ("down", 256, 64)];

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

/// Median of `reps` products of `m` rows: burn's matmul with the weight in each layout, then
/// [`ModelBackend::linear_matmul`] (kvb's kernel where it takes the shape) on `[out, in]`.
fn time_shape<B: ModelBackend>(
    m: usize,
    k: usize,
    n: usize,
    reps: usize,
    dev: &B::Device,
) -> [Duration; 3] {
    let x = Tensor::<B, 2>::random([m, k], Distribution::Default, dev);
    let in_out = Tensor::<B, 2>::random([k, n], Distribution::Default, dev);
    let out_in = Tensor::<B, 2>::random([n, k], Distribution::Default, dev).transpose();
    type Product<B> = fn(Tensor<B, 2>, Tensor<B, 2>) -> Tensor<B, 2>;
    let burn: Product<B> = |x, w| x.matmul(w);
    let ways: [(Tensor<B, 2>, Product<B>); 3] = [
        (in_out, burn),
        (out_in.clone(), burn),
        (out_in, B::linear_matmul),
    ];
    ways.map(|(w, product)| {
        let run = || {
            let t = Instant::now();
            let y = product(x.clone(), w.clone());
            B::sync(dev).expect("sync");
            drop(y);
            t.elapsed()
        };
        run();
        run(); // autotune
        median((0..reps).map(|_| run()).collect())
    })
}

fn report<B: ModelBackend>(backend: &str, quick: bool, dev: &B::Device) -> String {
    let dtype = <B::FloatElem as burn::tensor::Element>::dtype();
    let reps = if quick { 3 } else { 20 };
    let mut out = format!(
        "# Projection products ({backend}, {dtype:?})\n\nMedian of {reps}, each timed from the \
         host through a sync; GB/s counts the weight's bytes once per product.\n\n\
         | projection | in x out | rows | burn, [in, out] | GB/s | burn, [out, in]^T | GB/s | \
         kvb, [out, in]^T | GB/s |\n|---|---|---:|---:|---:|---:|---:|---:|---:|\n"
    );
    let shapes: &[(&str, usize, usize)] = if quick { &QUICK_SHAPES } else { &SHAPES };
    for &(name, k, n) in shapes {
        for m in [1, 4, 16, 512] {
            let times = time_shape::<B>(m, k, n, reps, dev);
            let gbs = |t: Duration| (k * n * dtype.size()) as f64 / t.as_secs_f64() / 1e9;
            let mut row = format!("| {name} | {k} x {n} | {m} |");
            for t in times {
                let _ = write!(row, " {:.1} us | {:.0} |", t.as_secs_f64() * 1e6, gbs(t));
            }
            row.push('\n');
            eprint!("{row}");
            out.push_str(&row);
        }
    }
    out
}

fn main() {
    let quick = std::env::var_os("KVB_BENCH_QUICK").is_some();
    let backend = std::env::var("KVB_BENCH_BACKEND").unwrap_or_else(|_| "wgpu".into());
    let dtype = std::env::var("KVB_BENCH_DTYPE").unwrap_or_else(|_| "f32".into());
    let text = match (backend.as_str(), dtype.as_str()) {
        #[cfg(feature = "wgpu")]
        ("wgpu", "f32") => report::<kvb_model::backends::Wgpu>("wgpu", quick, &Default::default()),
        #[cfg(feature = "wgpu")]
        ("wgpu", "f16") => {
            report::<kvb_model::backends::WgpuF16>("wgpu", quick, &Default::default())
        }
        #[cfg(feature = "cuda")]
        ("cuda", "f32") => report::<kvb_model::backends::Cuda>("cuda", quick, &Default::default()),
        #[cfg(feature = "cuda")]
        ("cuda", "f16") => {
            report::<kvb_model::backends::CudaF16>("cuda", quick, &Default::default())
        }
        #[cfg(feature = "cuda")]
        ("cuda", "bf16") => {
            report::<kvb_model::backends::CudaBf16>("cuda", quick, &Default::default())
        }
        (backend, dtype) => {
            eprintln!("backend `{backend}` in `{dtype}` is not compiled in (features wgpu, cuda)");
            std::process::exit(2);
        }
    };
    if let Some(dir) = std::env::var_os("KVB_BENCH_OUT") {
        let dir = std::path::PathBuf::from(dir);
        std::fs::create_dir_all(&dir).expect("results folder");
        let mut text = text;
        let _ = writeln!(text);
        std::fs::write(dir.join("results.md"), text).expect("write results");
    }
}
