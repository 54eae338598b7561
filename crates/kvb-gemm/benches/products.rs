//! Decode-step products by packed weights: 1, 4 and 16 rows by a Llama-3.2-1B layer's matrices
//! (2048 x 2048, 2048 x 8192, 8192 x 2048) in each stored format, with f32 activations
//! (`packed_rows`, the default) and 8-bit ones (`int8`). Prints milliseconds per product
//! (median of `KVB_REPS`, default 15), weight bytes streamed per second and weights per second,
//! on all of rayon's threads. `KVB_CPU_ISA` caps the kernels (avx2, portable; avx512f: no VBMI, VNNI) to compare.
//! `KVB_ROWS` (`1,4,16` by default) sets the row counts; above 16, f32 rows run the blocked
//! GEMM a prefill runs. `KVB_ON_WORKER=1` times from a worker of rayon's pool, as the engine
//! calls the products: from the main thread each product also pays two thread wake-ups, which
//! dominate shapes that fit the caches.
//!
//! `cargo bench -p kvb-gemm --bench products [-- FILTER]` (FILTER: a format name or `int8`).

use kvb_gemm::int8::{self, IntDotMatrix};
use kvb_gemm::packed_rows;
use kvb_gemm::test_values::{packed_matrix, spread};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// [`packed_matrix`]'s formats worth timing, by name.
const FORMATS: [(usize, &str); 15] = [
    (5, "Q4_K"),
    (6, "Q5_K"),
    (2, "Q6_K"),
    (12, "Q3_K"),
    (10, "Q2_K"),
    (11, "IQ4_XS"),
    (13, "Q3_K beside Q6_K"),
    (7, "Q8_0"),
    (0, "requantized q8_0"),
    (8, "Q4_0"),
    (14, "IQ4_NL"),
    (1, "Q4_1"),
    (15, "Q5_0"),
    (9, "Q5_1"),
    (4, "F16"),
];

/// `(k, n)`: the reduction and output widths of a Llama-3.2-1B layer's products (`KVB_SHAPES`,
/// as `2048x512,...`, times others: one that fits the caches measures the arithmetic alone).
fn shapes() -> Vec<(usize, usize)> {
    let given = std::env::var("KVB_SHAPES").ok().map(|v| {
        v.split(',')
            .filter_map(|s| s.split_once('x'))
            .filter_map(|(k, n)| Some((k.trim().parse().ok()?, n.trim().parse().ok()?)))
            .collect::<Vec<_>>()
    });
    given.unwrap_or_else(|| vec![(2048, 2048), (2048, 8192), (8192, 2048)])
}

/// Row counts to time (`KVB_ROWS`, as `1,4,16`).
fn row_counts() -> Vec<usize> {
    std::env::var("KVB_ROWS")
        .ok()
        .map(|v| v.split(',').filter_map(|m| m.trim().parse().ok()).collect())
        .unwrap_or_else(|| vec![1, 4, 16])
}

/// Bytes of weights a timed pass streams, well over any last-level cache (`KVB_STREAMED_MB`
/// changes it: 0 times one matrix, from the cache where it fits).
fn streamed() -> usize {
    std::env::var("KVB_STREAMED_MB")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .unwrap_or(512)
        << 20
}

/// Streaming read rate of this machine, bytes/s, on rayon's threads: the ceiling of a product
/// whose weights come from memory (best of 5 passes over [`streamed`] bytes).
fn read_bandwidth() -> f64 {
    use rayon::prelude::*;
    let words: Vec<u64> = (0..(streamed().max(64 << 20) / 8) as u64).collect();
    let pass = || {
        let t = Instant::now();
        let sum: u64 = words
            .par_chunks(1 << 16)
            .map(|c| c.iter().fold(0u64, |a, v| a.wrapping_add(*v)))
            .reduce(|| 0, u64::wrapping_add);
        std::hint::black_box(sum);
        (words.len() * 8) as f64 / t.elapsed().as_secs_f64()
    };
    (0..5).map(|_| pass()).fold(0.0, f64::max)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn time(reps: usize, mut f: impl FnMut()) -> Duration {
    f();
    median(
        (0..reps)
            .map(|_| {
                let t = Instant::now();
                f();
                t.elapsed()
            })
            .collect(),
    )
}

fn main() {
    if std::env::var("KVB_ON_WORKER").is_ok() {
        return rayon::scope(|_| time_all());
    }
    time_all()
}

fn time_all() {
    let filter: Option<String> = std::env::args().skip(1).find(|a| !a.starts_with('-'));
    let reps: usize = std::env::var("KVB_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(15);
    println!(
        "isa {:?}, {} threads, int8 kernel {}",
        kvb_gemm::isa(),
        rayon::current_num_threads(),
        int8::kernel_name()
    );
    println!("streaming read: {:.1} GB/s", read_bandwidth() / 1e9);
    println!("| format | activations | rows | k x n | ms | GB/s | G weights/s |");
    println!("|---|---|---:|---|---:|---:|---:|");
    for (format, name) in FORMATS {
        for (k, n) in shapes() {
            // Copies enough to overflow the caches, cycled through: a decode step streams its
            // weights from memory.
            let (first, k) = packed_matrix(format, k / 32, n, 11);
            let copies = (streamed() / first.bytes()).max(1);
            let packed: Vec<Arc<_>> = (0..copies)
                .map(|c| Arc::new(packed_matrix(format, k / 32, n, 11 + c as u32).0))
                .collect();
            let int: Option<Vec<IntDotMatrix>> =
                packed.iter().map(IntDotMatrix::from_packed).collect();
            for m in row_counts() {
                let x: Vec<f32> = (0..m * k).map(|i| spread(i, 3, 700.0)).collect();
                let report = |acts: &str, bytes: usize, d: Duration| {
                    let s = d.as_secs_f64() / copies as f64;
                    println!(
                        "| {name} | {acts} | {m} | {k} x {n} | {:.3} | {:.1} | {:.1} |",
                        s * 1e3,
                        bytes as f64 / s / 1e9,
                        (k * n) as f64 / s / 1e9
                    );
                };
                let wanted = |what: &str| filter.as_ref().is_none_or(|f| what.contains(f.as_str()));
                if wanted(&format!("{name} f32")) && packed_rows::matmul(&x, m, &first).is_some() {
                    let d = time(reps, || {
                        for w in &packed {
                            std::hint::black_box(packed_rows::matmul(&x, m, w));
                        }
                    });
                    report("f32", first.bytes(), d);
                } else if wanted(&format!("{name} f32")) {
                    let d = time(reps, || {
                        for w in &packed {
                            std::hint::black_box(kvb_gemm::blocked::matmul(&x, m, k, n, &**w));
                        }
                    });
                    report("f32 blocked", first.bytes(), d);
                }
                if let Some(ws) = int.as_ref().filter(|_| wanted(&format!("{name} int8"))) {
                    let d = time(reps, || {
                        for w in ws {
                            std::hint::black_box(int8::matmul(&x, m, w));
                        }
                    });
                    report("int8", ws[0].bytes(), d);
                }
            }
        }
    }
}
