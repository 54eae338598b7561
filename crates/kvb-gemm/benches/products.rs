//! Decode-step products by packed weights: 1, 4 and 16 rows by a Llama-3.2-1B layer's matrices
//! (2048 x 2048, 2048 x 8192, 8192 x 2048) in each stored format, with f32 activations
//! (`packed_rows`, the default) and 8-bit ones (`int8`). Prints milliseconds per product
//! (median of `KVB_REPS`, default 15), weight bytes streamed per second and weights per second,
//! on all of rayon's threads. `KVB_CPU_ISA` caps the kernels (avx2, portable; avx512f: no VBMI, VNNI) to compare.
//! `KVB_ROWS` (`1,4,16` by default) sets the row counts; above 16, f32 rows run the blocked
//! GEMM a prefill runs. `KVB_ON_WORKER=1` times from a worker of rayon's pool, as the engine
//! calls the products: from the main thread each product also pays two thread wake-ups, which
//! dominate shapes that fit the caches. `KVB_PAIRED=1` runs a plain streaming read before each
//! timed run and adds each product's share of it (the median over the runs): that ratio holds
//! while the host's read rate swings.
//!
//! `cargo bench -p kvb-gemm --bench products [-- FILTER]` (FILTER: a format name, `int8`, or
//! both as `"Q4_K int8"`; only the formats it names are built).

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

/// A buffer whose plain parallel sum gives this machine's streaming read rate, the ceiling of a
/// product whose weights come from memory.
struct Stream(Vec<u64>);

impl Stream {
    fn new() -> Stream {
        Stream((0..(streamed().max(64 << 20) / 8) as u64).collect())
    }

    /// One pass over the buffer on rayon's threads, bytes/s.
    fn pass(&self) -> f64 {
        use rayon::prelude::*;
        let t = Instant::now();
        let sum: u64 = self
            .0
            .par_chunks(1 << 16)
            .map(|c| c.iter().fold(0u64, |a, v| a.wrapping_add(*v)))
            .reduce(|| 0, u64::wrapping_add);
        std::hint::black_box(sum);
        (self.0.len() * 8) as f64 / t.elapsed().as_secs_f64()
    }
}

fn median<T: PartialOrd + Copy>(mut v: Vec<T>) -> T {
    v.sort_by(|a, b| a.partial_cmp(b).expect("no NaN"));
    v[v.len() / 2]
}

/// The median time of `f` over `reps` runs, and with `paired` the median over the runs of the
/// bytes/s each run read (`bytes` a run) over a [`Stream`] pass's just before it. The host's
/// read rate swings within seconds (28-55 GB/s on a shared Zen 4), so a product's share of it
/// means something only beside a pass taken in the same moment.
fn time(
    reps: usize,
    paired: Option<(&Stream, usize)>,
    mut f: impl FnMut(),
) -> (Duration, Option<f64>) {
    f();
    let runs: Vec<(Duration, Option<f64>)> = (0..reps)
        .map(|_| {
            let rate = paired.map(|(stream, _)| stream.pass());
            let t = Instant::now();
            f();
            let d = t.elapsed();
            let share = paired
                .zip(rate)
                .map(|((_, bytes), rate)| bytes as f64 / d.as_secs_f64() / rate);
            (d, share)
        })
        .collect();
    let shares: Option<Vec<f64>> = runs.iter().map(|r| r.1).collect();
    (
        median(runs.iter().map(|r| r.0).collect()),
        shares.map(median),
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
    let stream = Stream::new();
    let best = (0..5).map(|_| stream.pass()).fold(0.0, f64::max);
    println!("streaming read: {:.1} GB/s (best of 5)", best / 1e9);
    let paired = std::env::var("KVB_PAIRED").is_ok_and(|v| v == "1");
    println!("| format | activations | rows | k x n | ms | GB/s | G weights/s | of stream |");
    println!("|---|---|---:|---|---:|---:|---:|---:|");
    let wanted = |what: &str| filter.as_ref().is_none_or(|f| what.contains(f.as_str()));
    for (format, name) in FORMATS {
        // Building the copies takes longer than timing them: only for formats timed.
        if !wanted(&format!("{name} f32")) && !wanted(&format!("{name} int8")) {
            continue;
        }
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
                let report = |acts: &str, bytes: usize, (d, share): (Duration, Option<f64>)| {
                    let s = d.as_secs_f64() / copies as f64;
                    let share = share.map_or("-".into(), |r| format!("{:.0}%", r * 100.0));
                    println!(
                        "| {name} | {acts} | {m} | {k} x {n} | {:.3} | {:.1} | {:.1} | {share} |",
                        s * 1e3,
                        bytes as f64 / s / 1e9,
                        (k * n) as f64 / s / 1e9
                    );
                };
                let pass = |bytes: usize| paired.then_some((&stream, bytes * copies));
                if wanted(&format!("{name} f32")) && packed_rows::matmul(&x, m, &first).is_some() {
                    let d = time(reps, pass(first.bytes()), || {
                        for w in &packed {
                            std::hint::black_box(packed_rows::matmul(&x, m, w));
                        }
                    });
                    report("f32", first.bytes(), d);
                } else if wanted(&format!("{name} f32")) {
                    let d = time(reps, pass(first.bytes()), || {
                        for w in &packed {
                            std::hint::black_box(kvb_gemm::blocked::matmul(&x, m, k, n, &**w));
                        }
                    });
                    report("f32 blocked", first.bytes(), d);
                }
                if let Some(ws) = int.as_ref().filter(|_| wanted(&format!("{name} int8"))) {
                    let d = time(reps, pass(ws[0].bytes()), || {
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
