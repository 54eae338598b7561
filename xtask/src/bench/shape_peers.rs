//! `cargo xtask bench peers --model-shape NAME --quant Q4_K_M`: kvb (its default f32
//! activations and `--activations q8`) beside llama.cpp (without and with its prompt cache) on
//! a real-shaped model with random weights, made the way users' files are made
//! (`xtask/shapes/make_shape.py`: an F16 GGUF from the `gguf` package, quantized by llama.cpp's
//! own quantizer), same file, same threads, in one run: load time, peak resident memory,
//! weights held, prefill of ~512 and ~2,048 tokens, decode after each, a warm question on the
//! repeated document, and this machine's streaming read bandwidth with the decode step's
//! share of it. The engines run in rounds with the bandwidth measured before each, and the
//! report shows each round's decode beside its bandwidth.
//!
//! The models are cached outside the clone (`$KVB_SHAPES_DIR`, else `~/.cache/kvb/shapes`),
//! and the Python that makes them and runs llama.cpp lives in `$KVB_SHAPES_VENV` (else
//! `~/.cache/kvb/shapes-venv`), pip-installed on first use. Never in CI.

use super::peers::{
    cache_dir, in_rounds, run_kvb, run_peer, venv_python, Measured, Options, Workload,
};
use super::results::median;
use super::workloads::cut;
use anyhow::{bail, Context, Result};
use serde_json::json;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What the shapes' Python must hold.
const PACKAGES: [&str; 3] = ["gguf==0.19.0", "numpy", "llama-cpp-python==0.3.36"];
/// The shapes `make_shape.py` knows (its `SHAPES`).
const SHAPES: [&str; 5] = [
    "smollm2-135m",
    "smollm2-1.7b",
    "llama3.2-1b",
    "qwen2.5-1.5b",
    "llama3-8b",
];
/// The document's fractions that make prompts of about 512 and 2,048 tokens in SmolLM2's
/// tokenizer (all of it is ~2,300; its start is denser in words).
const NEAR_512: f64 = 0.27;
const NEAR_2048: f64 = 0.83;

/// The Python with `gguf` and llama-cpp-python (made and filled on first use).
fn shapes_python() -> Result<PathBuf> {
    venv_python(
        cache_dir("KVB_SHAPES_VENV", "shapes-venv")?,
        "gguf, numpy, llama_cpp",
        &PACKAGES,
    )
}

/// The shape's file in `quant`, made (F16, then quantized) where the cache lacks it.
fn shape_file(
    python: &Path,
    shape: &str,
    quant: &str,
    kvb: &Path,
    threads: usize,
) -> Result<PathBuf> {
    if !SHAPES.contains(&shape) {
        bail!(
            "--model-shape: unknown shape `{shape}` (known: {})",
            SHAPES.join(", ")
        );
    }
    let dir = cache_dir("KVB_SHAPES_DIR", "shapes")?;
    let file = dir.join(format!("{shape}.{}.gguf", quant.to_ascii_lowercase()));
    if file.is_file() {
        return Ok(file);
    }
    // The tokenizer comes from the default model's file.
    let models = std::env::var_os("KVB_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("models"));
    let tokenizer = std::path::absolute(models.join("SmolLM2-135M-Instruct.Q4_1.gguf"))?;
    if !tokenizer.is_file() {
        crate::run(Command::new(kvb).arg("fetch-model"))?;
    }
    crate::run(
        Command::new(python)
            .arg("xtask/shapes/make_shape.py")
            .args(["--shape", shape, "--quant", quant, "--threads"])
            .arg(threads.to_string())
            .arg("--tokenizer-from")
            .arg(&tokenizer)
            .arg("--out")
            .arg(&dir),
    )?;
    if !file.is_file() {
        bail!("make_shape.py did not write {}", file.display());
    }
    Ok(file)
}

/// Bytes [`read_bandwidth`] streams: far beyond any cache.
const STREAMED: usize = 1 << 30;

/// Streaming read bandwidth with `threads` threads, bytes/s: each thread sums its share of a
/// buffer of `bytes`, best of 5 passes.
fn read_bandwidth(threads: usize, bytes: usize) -> f64 {
    let words = bytes / 8;
    let buffer: Vec<u64> = (0..words as u64).collect();
    let share = words.div_ceil(threads);
    let mut best = 0f64;
    for _ in 0..5 {
        let started = std::time::Instant::now();
        std::thread::scope(|s| {
            for part in buffer.chunks(share) {
                s.spawn(move || {
                    // Four independent sums so that the adds never wait on each other.
                    let mut sums = [0u64; 4];
                    for quad in part.chunks_exact(4) {
                        for (s, v) in sums.iter_mut().zip(quad) {
                            *s = s.wrapping_add(*v);
                        }
                    }
                    std::hint::black_box(sums)
                });
            }
        });
        best = best.max((words * 8) as f64 / started.elapsed().as_secs_f64());
    }
    best
}

fn workloads(corpus: &Path) -> Result<Vec<Workload>> {
    let doc = std::fs::read_to_string(corpus.join("long_document.md"))
        .with_context(|| format!("reading {}", corpus.join("long_document.md").display()))?;
    let long = cut(&doc, NEAR_2048);
    let question = |q: &str| format!("{long}\n\nQuestion: {q}\nAnswer:");
    Ok(vec![
        Workload {
            name: "prefill-512",
            title: "prefill of ~512 tokens",
            warm: false,
            requests: vec![(cut(&doc, NEAR_512), 32)],
        },
        Workload {
            name: "prefill-2048",
            title: "prefill of ~2,048 tokens",
            warm: false,
            requests: vec![(long.clone(), 32)],
        },
        Workload {
            name: "warm-doc",
            title: "a second question on the ~2,048-token document",
            warm: true,
            requests: vec![
                (question("What is this document about?"), 16),
                (question("Who is it written for?"), 16),
            ],
        },
    ])
}

/// `cargo xtask bench peers --model-shape SHAPE`.
pub fn run(o: &Options, shape: &str, kvb: &Path) -> Result<()> {
    let python = shapes_python()?;
    let gguf = std::path::absolute(shape_file(&python, shape, &o.quant, kvb, o.threads)?)?;
    let out = o.out.clone().unwrap_or_else(|| {
        PathBuf::from("bench/results").join(format!(
            "{}-peers-{shape}-{}",
            super::today(),
            o.quant.to_ascii_lowercase()
        ))
    });
    let raw = out.join("raw");
    std::fs::create_dir_all(&raw).with_context(|| format!("creating {}", raw.display()))?;
    let ws = workloads(Path::new("bench/corpus"))?;
    let job = raw.join("job.json");
    let job_json = json!({
        "hf_folder": null, "gguf": gguf, "threads": o.threads, "reps": 1, "context": 4096,
        "workloads": ws.iter().map(|w| json!({
            "name": w.name, "warm": w.warm,
            "requests": w.requests.iter().map(|(p, n)| json!({"prompt": p, "max_new_tokens": n})).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    });
    std::fs::write(&job, serde_json::to_string_pretty(&job_json)?)?;

    // The bandwidth before each round and after the last: a round that ran on a loaded host
    // shows beside its figures.
    let mut bandwidth = Vec::new();
    let mut measure_bandwidth = || {
        eprintln!(
            "bench peers: streaming read bandwidth, {} threads",
            o.threads
        );
        bandwidth.push(read_bandwidth(o.threads, STREAMED));
    };
    let names = ["kvb", "kvb q8", "llama.cpp", "llama.cpp+cache"].map(String::from);
    let m = in_rounds(
        &names,
        o.reps,
        |_| measure_bandwidth(),
        |engine, round| match engine {
            0 => run_kvb(kvb, &gguf, o, None, &ws, &raw, round),
            1 => run_kvb(kvb, &gguf, o, Some("q8"), &ws, &raw, round),
            _ => run_peer(&python, &names[engine], &job, &raw, round),
        },
    )?;
    measure_bandwidth();
    let file_bytes = std::fs::metadata(&gguf)?.len() as f64;
    let md = markdown(o, shape, &ws, &m, &bandwidth, file_bytes);
    std::fs::write(out.join("README.md"), &md)?;
    println!("{md}");
    Ok(())
}

/// Each round's bandwidth (measured before it) and each engine's decode after ~512 tokens in
/// it: whether a round ran on a loaded host, and whether the engines' ratio held across rounds.
fn by_round(m: &[(String, Measured)], rounds_bandwidth: &[f64]) -> String {
    let mut s = String::from("\nBy round: the streaming read before it, GB/s, and each engine's decode after ~512 tokens, ms/token:\n\n| round | GB/s |");
    for (name, _) in m {
        let _ = write!(s, " {name} |");
    }
    s += "\n|---:|---:|";
    s += &"---:|".repeat(m.len());
    s += "\n";
    let rounds = m
        .iter()
        .map(|(_, e)| e.runs.get("prefill-512").map_or(0, Vec::len))
        .max()
        .unwrap_or(0);
    for round in 0..rounds {
        let gbs = rounds_bandwidth.get(round).map(|b| b / 1e9);
        let _ = write!(s, "| {} | {} |", round + 1, cell(gbs, 1));
        for (_, e) in m {
            let run = e.runs.get("prefill-512").and_then(|runs| runs.get(round));
            let _ = write!(
                s,
                " {} |",
                cell(run.and_then(|r| r.decode).map(|r| 1e3 / r), 1)
            );
        }
        s += "\n";
    }
    s
}

fn cell(v: Option<f64>, digits: usize) -> String {
    v.map_or("-".into(), |v| format!("{v:.digits$}"))
}

/// The report: one table of every engine's figures, and the targets from them.
fn markdown(
    o: &Options,
    shape: &str,
    ws: &[Workload],
    m: &[(String, Measured)],
    rounds_bandwidth: &[f64],
    file_bytes: f64,
) -> String {
    let bandwidth = median(rounds_bandwidth);
    let get = |name: &str| m.iter().find(|(n, _)| n == name).map(|(_, m)| m);
    let ms_per_token = |e: &Measured, w: &str| e.decode(w).map(|r| 1e3 / r);
    let tokens = |w: &str| {
        m.first()
            .and_then(|(_, e)| e.prompt_tokens(w))
            .map_or("?".into(), |t| t.to_string())
    };
    let mut s = format!(
        "# kvb beside llama.cpp on a {shape}-shaped {} file\n\n`cargo xtask bench peers \
         --model-shape {shape} --quant {}`: a real-shaped model with random weights \
         (`xtask/shapes/make_shape.py`; {:.0} MB), {} threads, greedy, median of {} \
         repetitions, all in one run, in rounds (each round runs every engine once). Streaming read \
         bandwidth measured in the same run (the median of before each round and after the \
         last): {:.1} GB/s.\n\n",
        o.quant,
        o.quant,
        file_bytes / 1e6,
        o.threads,
        o.reps,
        bandwidth / 1e9
    );
    let _ = writeln!(
        s,
        "| engine | load ms | weights MB | peak RSS MB | TTFT {} tokens ms | decode after ms/token \
         | TTFT {} tokens ms | decode after ms/token | warm question ms |",
        tokens("prefill-512"),
        tokens("prefill-2048")
    );
    s += "|---|---:|---:|---:|---:|---:|---:|---:|---:|\n";
    for (name, e) in m {
        let peak = e.peak_rss_bytes.iter().cloned().fold(0.0, f64::max);
        let load = (!e.load_ms.is_empty()).then(|| median(&e.load_ms));
        let _ = writeln!(
            s,
            "| {name} | {} | {} | {:.0} | {} | {} | {} | {} | {} |",
            cell(load, 0),
            cell(e.weights.map(|w| w.0 / 1e6), 0),
            peak / 1e6,
            cell(e.ttft("prefill-512"), 0),
            cell(ms_per_token(e, "prefill-512"), 1),
            cell(e.ttft("prefill-2048"), 0),
            cell(ms_per_token(e, "prefill-2048"), 1),
            cell(e.ttft("warm-doc"), 0),
        );
    }
    // A decode step reads every weight once: its bytes over the step's time, against the
    // machine's bandwidth.
    s += "\nDecode's share of the streaming bandwidth (weights read per token / ms per token / \
          bandwidth), after ~512 tokens:\n\n";
    for (name, e) in m {
        let bytes = e.weights.map_or(file_bytes, |w| w.0);
        if let Some(t) = ms_per_token(e, "prefill-512") {
            let _ = writeln!(
                s,
                "- {name}: {:.0} MB a token in {t:.1} ms = {:.1} GB/s, {:.0}% of {:.1} GB/s \
                 (the floor: {:.1} ms)",
                bytes / 1e6,
                bytes / t / 1e6,
                100.0 * bytes / (t / 1e3) / bandwidth,
                bandwidth / 1e9,
                bytes / bandwidth * 1e3
            );
        }
    }
    let _ = ws;
    s += &by_round(m, rounds_bandwidth);
    s += "\n## Targets (issue 40)\n\n";
    let verdict = |ok: Option<bool>| match ok {
        Some(true) => "met",
        Some(false) => "not met",
        None => "not measured",
    };
    let (kvb, q8, llama, cache) = (
        get("kvb"),
        get("kvb q8"),
        get("llama.cpp"),
        get("llama.cpp+cache"),
    );
    for w in ["prefill-512", "prefill-2048"] {
        for (label, e) in [("kvb", kvb), ("kvb q8", q8)] {
            let r = e
                .and_then(|e| ms_per_token(e, w))
                .zip(llama.and_then(|l| ms_per_token(l, w)));
            let _ = writeln!(
                s,
                "- {label}, decode after {w} at or under llama.cpp's ms/token: {} vs {} ({})",
                cell(r.map(|r| r.0), 1),
                cell(r.map(|r| r.1), 1),
                verdict(r.map(|(k, l)| k <= l))
            );
            let t = e.and_then(|e| e.ttft(w)).zip(llama.and_then(|l| l.ttft(w)));
            let _ = writeln!(
                s,
                "- {label}, prefill of {w} at or under llama.cpp's: {} vs {} ms ({})",
                cell(t.map(|t| t.0), 0),
                cell(t.map(|t| t.1), 0),
                verdict(t.map(|(k, l)| k <= l))
            );
        }
    }
    if let (Some(q8), Some(llama)) = (q8, llama) {
        let w = "prefill-512";
        if let (Some(k), Some(l)) = (q8.decode(w), llama.decode(w)) {
            let _ = writeln!(
                s,
                "- kvb q8 decode at least 1.2x llama.cpp's tokens/s: {:.2}x ({})",
                k / l,
                verdict(Some(k >= 1.2 * l))
            );
            let bytes = q8.weights.map_or(file_bytes, |w| w.0);
            let share = bytes * k / bandwidth;
            let _ = writeln!(
                s,
                "- kvb q8 decode at least 70% of the bandwidth limit: {:.0}% ({})",
                100.0 * share,
                verdict(Some(share >= 0.7))
            );
        }
    }
    for (label, e) in [("kvb", kvb), ("kvb q8", q8)] {
        let t = e
            .and_then(|e| e.ttft("warm-doc"))
            .zip(cache.and_then(|c| c.ttft("warm-doc")));
        let _ = writeln!(
            s,
            "- {label}, warm question at or under llama.cpp's with its prompt cache: {} vs {} ms ({})",
            cell(t.map(|t| t.0), 0),
            cell(t.map(|t| t.1), 0),
            verdict(t.map(|(k, c)| k <= c))
        );
        if let Some((held, file)) = e.and_then(|e| e.weights) {
            let _ = writeln!(
                s,
                "- {label}, weights within 5% of the file's matrices: {:.0} vs {:.0} MB, {:.3}x ({})",
                held / 1e6,
                file / 1e6,
                held / file,
                verdict(Some(held <= 1.05 * file))
            );
        }
        if let Some(e) = e {
            let peak = e.peak_rss_bytes.iter().cloned().fold(0.0, f64::max);
            let kv = e.kv_bytes.unwrap_or(0.0);
            let limit = file_bytes + kv + 200e6;
            let _ = writeln!(
                s,
                "- {label}, peak RSS at most file + K/V in use + 200 MB ({:.0} MB): {:.0} MB ({})",
                limit / 1e6,
                peak / 1e6,
                verdict(Some(peak <= limit))
            );
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_rounds_decode_stands_beside_its_bandwidth() {
        let engine = |rates: &[f64]| {
            let mut m = Measured::default();
            for &r in rates {
                let v = json!({"prompt_tokens": 521, "ttft_ms": 1.0, "decode_tokens_per_sec": r});
                let run = super::super::peers::Run::from_json(&v, "tokens").unwrap();
                m.runs.entry("prefill-512".into()).or_default().push(run);
            }
            m
        };
        let m = [
            ("a".to_string(), engine(&[20.0, 40.0])),
            ("b".to_string(), engine(&[25.0])),
        ];
        let s = by_round(&m, &[50e9, 60e9, 55e9]);
        assert!(s.contains("| round | GB/s | a | b |"), "{s}");
        assert!(s.contains("| 1 | 50.0 | 50.0 | 40.0 |"), "{s}");
        assert!(s.contains("| 2 | 60.0 | 25.0 | - |"), "{s}");
        assert!(!s.contains("| 3 |"), "{s}");
    }

    #[test]
    fn the_bandwidth_is_a_plausible_rate() {
        let b = read_bandwidth(2, 1 << 24);
        assert!(b > 1e8 && b < 1e13, "{b}");
    }

    #[test]
    fn unknown_shapes_are_errors_naming_the_known_ones() {
        let e = shape_file(Path::new("python3"), "gpt-5", "Q4_K_M", Path::new("kvb"), 1)
            .unwrap_err()
            .to_string();
        assert!(e.contains("gpt-5") && e.contains("llama3.2-1b"), "{e}");
    }
}
