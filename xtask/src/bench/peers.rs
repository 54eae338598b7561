//! `cargo xtask bench peers`: kvb beside PyTorch/transformers (f32 and bf16) and llama.cpp
//! (llama-cpp-python, without and with its prompt cache), in one run, on the same weights (the
//! default model's Q4_1 GGUF for kvb and llama.cpp, its f32 conversion for transformers), the
//! same threads, greedy, plain-text prompts. Optional and never in CI: it pip-installs its peers
//! into a virtual environment of its own (`$KVB_PEERS_DIR`, else `~/.cache/kvb/peers`).
//!
//! Every figure is a median over repetitions, each a fresh process, run in rounds (each round
//! every engine once: [`in_rounds`]), and every comparison is a ratio of two figures of this one
//! run: machines differ, ratios travel.

use super::results::median;
use super::workloads::cut;
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The peers, as `peers.py` names them.
const PEERS: [&str; 4] = [
    "pytorch-f32",
    "pytorch-bf16",
    "llama.cpp",
    "llama.cpp+cache",
];
/// The packages of the llama.cpp peers, and those the PyTorch peers add.
const LLAMA_CPP_PACKAGES: [&str; 2] = ["numpy", "llama-cpp-python==0.3.36"];
const PYTORCH_PACKAGES: [&str; 2] = ["torch", "transformers"];

pub(super) struct Options {
    pub(super) reps: usize,
    pub(super) threads: usize,
    pub(super) out: Option<PathBuf>,
    peers: Vec<String>,
    /// `kvb --activations` (`q8`: llama.cpp's arithmetic); kvb's default (f32) otherwise.
    pub(super) activations: Option<String>,
    /// A real-shaped model with random weights instead of the default model
    /// ([`super::shape_peers`]), and its quantization.
    pub(super) model_shape: Option<String>,
    pub(super) quant: String,
}

fn parse(args: &[String]) -> Result<Options> {
    let mut o = Options {
        reps: 3,
        threads: std::thread::available_parallelism().map_or(2, |n| n.get()),
        out: None,
        peers: PEERS.iter().map(|p| p.to_string()).collect(),
        activations: None,
        model_shape: None,
        quant: "Q4_K_M".into(),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--reps" => o.reps = value()?.parse().context("--reps: a count")?,
            "--threads" => o.threads = value()?.parse().context("--threads: a count")?,
            "--out" => o.out = Some(PathBuf::from(value()?)),
            "--activations" => o.activations = Some(value()?.clone()),
            "--model-shape" => o.model_shape = Some(value()?.clone()),
            "--quant" => o.quant = value()?.to_ascii_uppercase(),
            "--peers" => {
                o.peers = value()?.split(',').map(|p| p.trim().to_string()).collect();
                if let Some(p) = o.peers.iter().find(|p| !PEERS.contains(&p.as_str())) {
                    bail!("--peers: unknown peer `{p}` (known: {})", PEERS.join(", "));
                }
            }
            other => bail!("bench peers: unknown option `{other}`"),
        }
    }
    if o.reps == 0 || o.threads == 0 {
        bail!("--reps and --threads must be at least 1");
    }
    Ok(o)
}

/// A workload: requests run in order in one process; the last one is timed.
pub(super) struct Workload {
    pub(super) name: &'static str,
    pub(super) title: &'static str,
    /// Whether its last request follows requests sharing its context (a prompt cache's case).
    pub(super) warm: bool,
    /// (prompt, tokens to generate).
    pub(super) requests: Vec<(String, usize)>,
}

fn workloads(corpus: &Path) -> Result<Vec<Workload>> {
    let read = |name: &str| {
        std::fs::read_to_string(corpus.join(name))
            .with_context(|| format!("reading {}", corpus.join(name).display()))
    };
    let doc = read("long_document.md")?;
    let code = read("code_sample.rs")?;
    let question = |context: &str, q: &str| format!("{context}\n\nQuestion: {q}\nAnswer:");
    Ok(vec![
        Workload {
            name: "prefill-500",
            title: "full prefill of a document's start, then 32 tokens",
            warm: false,
            requests: vec![(cut(&doc, 0.28), 32)],
        },
        Workload {
            name: "prefill-2700",
            title: "full prefill of the whole document, then 32 tokens",
            warm: false,
            requests: vec![(doc.trim().to_string(), 32)],
        },
        Workload {
            name: "warm-code",
            title: "a second question on a code file",
            warm: true,
            requests: vec![
                (question(&code, "What does this code do?"), 16),
                (
                    question(&code, "Which function should a caller use first?"),
                    16,
                ),
            ],
        },
        Workload {
            name: "warm-doc",
            title: "a second question on the whole document",
            warm: true,
            requests: vec![
                (question(&doc, "What is this document about?"), 16),
                (question(&doc, "Who is it written for?"), 16),
            ],
        },
    ])
}

/// One timed request.
pub(super) struct Run {
    pub(super) prompt_tokens: usize,
    pub(super) ttft_ms: f64,
    /// Tokens/s after the first token.
    pub(super) decode: Option<f64>,
    /// The greedy tokens generated.
    tokens: Vec<u64>,
}

impl Run {
    pub(super) fn from_json(v: &Value, ids: &str) -> Result<Run> {
        Ok(Run {
            prompt_tokens: v["prompt_tokens"].as_u64().context("prompt_tokens")? as usize,
            ttft_ms: v["ttft_ms"].as_f64().context("ttft_ms")?,
            decode: v[if ids == "token_ids" {
                "tokens_per_sec"
            } else {
                "decode_tokens_per_sec"
            }]
            .as_f64(),
            tokens: v[ids]
                .as_array()
                .map(|a| a.iter().filter_map(Value::as_u64).collect())
                .unwrap_or_default(),
        })
    }
}

/// Medians of a peer's runs per workload, and its peak resident memory.
#[derive(Default)]
pub(super) struct Measured {
    pub(super) runs: BTreeMap<String, Vec<Run>>,
    pub(super) peak_rss_bytes: Vec<f64>,
    /// For kvb: the K/V pool bytes of the longest workload's request.
    pub(super) kv_bytes: Option<f64>,
    /// Each process's (or peer's) load time, ms.
    pub(super) load_ms: Vec<f64>,
    /// For kvb: the weights it holds and the file's matrices, bytes (its load line).
    pub(super) weights: Option<(f64, f64)>,
}

impl Measured {
    /// Adds another repetition's measurements to these.
    pub(super) fn absorb(&mut self, other: Measured) {
        for (w, runs) in other.runs {
            self.runs.entry(w).or_default().extend(runs);
        }
        self.peak_rss_bytes.extend(other.peak_rss_bytes);
        self.load_ms.extend(other.load_ms);
        self.kv_bytes = self.kv_bytes.or(other.kv_bytes);
        self.weights = self.weights.or(other.weights);
    }

    pub(super) fn ttft(&self, w: &str) -> Option<f64> {
        let v: Vec<f64> = self.runs.get(w)?.iter().map(|r| r.ttft_ms).collect();
        (!v.is_empty()).then(|| median(&v))
    }
    pub(super) fn decode(&self, w: &str) -> Option<f64> {
        let v: Vec<f64> = self.runs.get(w)?.iter().filter_map(|r| r.decode).collect();
        (!v.is_empty()).then(|| median(&v))
    }
    pub(super) fn prompt_tokens(&self, w: &str) -> Option<usize> {
        self.runs.get(w)?.first().map(|r| r.prompt_tokens)
    }
}

/// The virtual environment with `peers` installed (created and filled on first use). PyTorch
/// only where a PyTorch peer is asked for: a run of llama.cpp alone (say, one built for another
/// instruction set through pip's `CMAKE_ARGS` in its own `KVB_PEERS_DIR`) needs none of it.
fn peer_python(peers: &[String]) -> Result<PathBuf> {
    let mut packages = LLAMA_CPP_PACKAGES.to_vec();
    let mut imports = "numpy, llama_cpp".to_string();
    if peers.iter().any(|p| p.starts_with("pytorch")) {
        packages.extend(PYTORCH_PACKAGES);
        imports.push_str(", torch, transformers");
    }
    venv_python(cache_dir("KVB_PEERS_DIR", "peers")?, &imports, &packages)
}

/// Whether a peer died of SIGILL: a llama.cpp that pip built with `-march=native` does where
/// the CPU lists an extension its hypervisor does not run (AMX tiles in some KVM guests,
/// bench/results/2026-12-06-peers-llama3.2-1b-q4_k_m-emr).
fn illegal_instruction(status: &std::process::ExitStatus) -> bool {
    use std::os::unix::process::ExitStatusExt;
    status.signal() == Some(4)
}

/// How to rebuild the llama.cpp of the environment of `python` for what this CPU runs.
fn rebuild_hint(python: &Path) -> String {
    format!(
        "rebuild its llama-cpp-python without the extension at fault, e.g. AMX: \
         CMAKE_ARGS=\"-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
         -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON\" {} -m pip install \
         --force-reinstall --no-deps --no-cache-dir {}",
        python.display(),
        LLAMA_CPP_PACKAGES[1]
    )
}

/// `$var`, else `~/.cache/kvb/<leaf>`.
pub(super) fn cache_dir(var: &str, leaf: &str) -> Result<PathBuf> {
    std::env::var_os(var)
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/kvb").join(leaf))
        })
        .with_context(|| format!("set {var} (no HOME to put {leaf} under)"))
}

/// The Python of the virtual environment at `dir` that imports `imports`, made and filled with
/// `packages` by pip where it does not yet.
pub(super) fn venv_python(dir: PathBuf, imports: &str, packages: &[&str]) -> Result<PathBuf> {
    let python = dir.join("bin/python");
    let ready = |py: &Path| {
        Command::new(py)
            .args(["-c", &format!("import {imports}")])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if python.is_file() && ready(&python) {
        return Ok(python);
    }
    eprintln!(
        "bench peers: installing {} into {} with pip (once; llama-cpp-python compiles \
         llama.cpp, ~15 min on 2 cores)",
        packages.join(", "),
        dir.display()
    );
    if !python.is_file() {
        crate::run(Command::new("python3").arg("-m").arg("venv").arg(&dir))?;
    }
    crate::run(
        Command::new(&python)
            .args(["-m", "pip", "install", "--quiet"])
            .args(packages),
    )?;
    if !ready(&python) {
        bail!(
            "the environment at {} still cannot import {imports}",
            dir.display()
        );
    }
    Ok(python)
}

/// Every engine of `names` measured `reps` times, in rounds: each round runs each engine once, in
/// order (`measure(engine, round)`), after `before_round(round)`. On a shared host a spell of
/// load then slows one repetition of every engine, where blocks of one engine's repetitions
/// put it on one engine alone (bench/results/2026-12-05-peers-llama3.2-1b-q4_k_m-zen4).
pub(super) fn in_rounds(
    names: &[String],
    reps: usize,
    mut before_round: impl FnMut(usize),
    mut measure: impl FnMut(usize, usize) -> Result<Measured>,
) -> Result<Vec<(String, Measured)>> {
    let mut all: Vec<(String, Measured)> = names
        .iter()
        .map(|n| (n.clone(), Measured::default()))
        .collect();
    for round in 0..reps {
        before_round(round);
        for (engine, (name, m)) in all.iter_mut().enumerate() {
            eprintln!("bench peers: {name}, round {}/{reps}", round + 1);
            m.absorb(measure(engine, round)?);
        }
    }
    Ok(all)
}

/// kvb: one `kvb replay` process per workload, `threads` threads, with `--activations
/// activations` where given; its outputs named for repetition `round`.
pub(super) fn run_kvb(
    kvb: &Path,
    gguf: &Path,
    o: &Options,
    activations: Option<&str>,
    ws: &[Workload],
    raw: &Path,
    round: usize,
) -> Result<Measured> {
    let mut m = Measured::default();
    let tag = activations.map_or(String::new(), |a| format!("-{a}"));
    for w in ws {
        let requests = raw.join(format!("kvb{tag}-{}.jsonl", w.name));
        let lines: Vec<String> = w
            .requests
            .iter()
            .enumerate()
            .map(|(i, (prompt, n))| {
                json!({"id": format!("{}/{i}", w.name), "prompt": prompt,
                       "max_new_tokens": n, "reset": i == 0})
                .to_string()
            })
            .collect();
        std::fs::write(&requests, lines.join("\n") + "\n")?;
        let out = raw.join(format!("kvb{tag}-{}-rep{round}.out.jsonl", w.name));
        let mut cmd = Command::new(kvb);
        cmd.env("RAYON_NUM_THREADS", o.threads.to_string())
            .args(["replay", "--model"])
            .arg(gguf)
            .arg("--requests")
            .arg(&requests)
            .arg("--out")
            .arg(&out);
        if let Some(a) = activations {
            cmd.arg("--activations").arg(a);
        }
        let started = std::time::Instant::now();
        let done = cmd
            .stderr(std::process::Stdio::piped())
            .output()
            .with_context(|| format!("starting {cmd:?}"))?;
        let wall_ms = started.elapsed().as_secs_f64() * 1e3;
        let stderr = String::from_utf8_lossy(&done.stderr);
        eprint!("{stderr}");
        if !done.status.success() {
            bail!("{cmd:?} failed with {}", done.status);
        }
        m.weights = m.weights.or(weights_line(&stderr));
        let text = std::fs::read_to_string(&out)?;
        let last: Value = text
            .lines()
            .last()
            .context("kvb replay wrote no result")
            .and_then(|l| serde_json::from_str(l).context("a kvb replay result line"))?;
        let run = Run::from_json(&last, "token_ids")
            .with_context(|| format!("a result in {}", out.display()))?;
        m.runs.entry(w.name.to_string()).or_default().push(run);
        m.peak_rss_bytes
            .push(last["peak_rss_bytes"].as_f64().context("peak_rss_bytes")?);
        // The process's time before its first request: the load (and its exit, small).
        if let Some(first) = text
            .lines()
            .next()
            .and_then(|l| serde_json::from_str::<Value>(l).ok())
        {
            let served = last["finished_ms"].as_f64().unwrap_or(0.0)
                - first["started_ms"].as_f64().unwrap_or(0.0);
            m.load_ms.push(wall_ms - served);
        }
        if w.name == "prefill-2700" || w.name == "prefill-2048" {
            let pool = &last["pool"];
            let blocks = pool["peak_blocks_used"].as_f64().unwrap_or(0.0);
            m.kv_bytes = Some(blocks * pool["block_bytes"].as_f64().unwrap_or(0.0));
        }
    }
    Ok(m)
}

/// kvb's load line, `weights: H MB (...; the file's matrices: F MB)`: (H, F) in bytes (F is H
/// where the line has no file figure).
pub(super) fn weights_line(stderr: &str) -> Option<(f64, f64)> {
    let line = stderr.lines().find(|l| l.starts_with("weights: "))?;
    let mb = |after: &str| -> Option<f64> {
        let rest = &line[line.find(after)? + after.len()..];
        rest.split_whitespace()
            .next()?
            .parse::<f64>()
            .ok()
            .map(|v| v * 1e6)
    };
    let held = mb("weights: ")?;
    Some((held, mb("the file's matrices: ").unwrap_or(held)))
}

/// A peer through `xtask/peers/peers.py`, once through `job` (whose `reps` is 1), its output
/// named for repetition `round`.
pub(super) fn run_peer(
    python: &Path,
    peer: &str,
    job: &Path,
    raw: &Path,
    round: usize,
) -> Result<Measured> {
    let out = raw.join(format!("{peer}-rep{round}.json"));
    let mut cmd = Command::new(python);
    cmd.arg(Path::new("xtask/peers/peers.py"))
        .arg(job)
        .arg(peer)
        .arg(&out);
    eprintln!("$ {cmd:?}");
    let status = cmd.status().with_context(|| format!("starting {cmd:?}"))?;
    if illegal_instruction(&status) {
        bail!(
            "{cmd:?} died on an illegal instruction: {}",
            rebuild_hint(python)
        );
    }
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&out)?)
        .with_context(|| format!("parsing {}", out.display()))?;
    let mut m = Measured {
        peak_rss_bytes: v["peak_rss_bytes"].as_f64().into_iter().collect(),
        ..Measured::default()
    };
    for l in v["load_ms"].as_array().into_iter().flatten() {
        m.load_ms.extend(l.as_f64());
    }
    for r in v["runs"].as_array().context("peers.py: runs")? {
        let w = r["workload"].as_str().context("peers.py: workload")?;
        let run = Run::from_json(r, "tokens").context("a peers.py record")?;
        m.runs.entry(w.to_string()).or_default().push(run);
    }
    Ok(m)
}

/// `cargo xtask bench peers`.
pub fn run(args: &[String], kvb: &Path) -> Result<()> {
    let o = parse(args)?;
    if let Some(shape) = &o.model_shape {
        return super::shape_peers::run(&o, shape, kvb);
    }
    let models = std::env::var_os("KVB_MODELS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("models"));
    let gguf = std::path::absolute(models.join("SmolLM2-135M-Instruct.Q4_1.gguf"))?;
    let hf = std::path::absolute(models.join("SmolLM2-135M-Instruct"))?;
    if !gguf.is_file() || !hf.join("model.safetensors").is_file() {
        crate::run(Command::new(kvb).arg("fetch-model"))?;
    }
    let python = peer_python(&o.peers)?;
    let out = o.out.clone().unwrap_or_else(|| {
        PathBuf::from("bench/results").join(format!("{}-peers", super::today()))
    });
    let raw = out.join("raw");
    std::fs::create_dir_all(&raw).with_context(|| format!("creating {}", raw.display()))?;
    let ws = workloads(Path::new("bench/corpus"))?;
    let job = raw.join("job.json");
    let job_json = json!({
        "hf_folder": hf, "gguf": gguf, "threads": o.threads, "reps": 1, "context": 4096,
        "workloads": ws.iter().map(|w| json!({
            "name": w.name, "warm": w.warm,
            "requests": w.requests.iter().map(|(p, n)| json!({"prompt": p, "max_new_tokens": n})).collect::<Vec<_>>(),
        })).collect::<Vec<_>>(),
    });
    std::fs::write(&job, serde_json::to_string_pretty(&job_json)?)?;

    let names: Vec<String> = std::iter::once("kvb".to_string())
        .chain(o.peers.iter().cloned())
        .collect();
    let measured = in_rounds(
        &names,
        o.reps,
        |_| {},
        |engine, round| match engine {
            0 => run_kvb(kvb, &gguf, &o, o.activations.as_deref(), &ws, &raw, round),
            _ => run_peer(&python, &names[engine], &job, &raw, round),
        },
    )?;
    let gguf_bytes = std::fs::metadata(&gguf)?.len() as f64;
    let md = markdown(&o, &ws, &measured, gguf_bytes);
    std::fs::write(out.join("README.md"), &md)?;
    println!("{md}");
    Ok(())
}

fn ms(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.0} ms"))
}

/// How many times faster kvb is (above 1: kvb is faster).
fn ratio(v: Option<f64>) -> String {
    v.map_or("-".into(), |v| format!("{v:.2}"))
}

/// A table's header: the `leading` columns (the first one left-aligned), then a figure and kvb's
/// ratio to it per peer.
fn table_header(leading: &[&str], peers: &[(String, Measured)]) -> String {
    let mut s = format!("| {} |", leading.join(" | "));
    for (p, _) in peers {
        let _ = write!(s, " {p} | kvb vs {p} |");
    }
    s += "\n|---|";
    s += &"---:|".repeat(leading.len() - 1 + 2 * peers.len());
    s + "\n"
}

fn markdown(o: &Options, ws: &[Workload], m: &[(String, Measured)], gguf_bytes: f64) -> String {
    let kvb = &m[0].1;
    let peers = &m[1..];
    let mut s = format!(
        "# kvb beside its peers\n\n`cargo xtask bench peers`: SmolLM2-135M-Instruct (kvb and \
         llama.cpp on its Q4_1 GGUF, PyTorch on the same weights in f32), {} threads, greedy, \
         plain-text prompts, median of {} repetitions. Ratios are kvb's speed over the peer's \
         (above 1: kvb is faster), each from figures of this one run.{}\n\n",
        o.threads,
        o.reps,
        match &o.activations {
            Some(a) => format!(" kvb ran with `--activations {a}`."),
            None => String::new(),
        }
    );
    s += "## Time to first token\n\n";
    s += &table_header(&["workload", "prompt tokens", "kvb"], peers);
    for w in ws {
        let k = kvb.ttft(w.name);
        let _ = write!(
            s,
            "| {} | {} | {} |",
            w.title,
            kvb.prompt_tokens(w.name)
                .map_or("-".into(), |t| t.to_string()),
            ms(k)
        );
        for (_, p) in peers {
            let t = p.ttft(w.name);
            let _ = write!(s, " {} | {} |", ms(t), ratio(t.zip(k).map(|(t, k)| t / k)));
        }
        s += "\n";
    }
    s += "\n## Decode (tokens/s after the first token)\n\n";
    s += &table_header(&["context", "kvb"], peers);
    for w in ws.iter().filter(|w| !w.warm) {
        let k = kvb.decode(w.name);
        let _ = write!(
            s,
            "| {} | {} |",
            w.title,
            k.map_or("-".into(), |v| format!("{v:.1}"))
        );
        for (_, p) in peers {
            let d = p.decode(w.name);
            let _ = write!(
                s,
                " {} | {} |",
                d.map_or("-".into(), |v| format!("{v:.1}")),
                ratio(k.zip(d).map(|(k, d)| k / d))
            );
        }
        s += "\n";
    }
    s += "\n## Greedy tokens identical to kvb's (first repetition, whole answer)\n\n";
    for (name, p) in peers {
        let same = ws
            .iter()
            .filter(|w| {
                let first = |m: &Measured| {
                    m.runs
                        .get(w.name)
                        .and_then(|r| r.first())
                        .map(|r| r.tokens.clone())
                };
                first(p).is_some() && first(p) == first(kvb)
            })
            .count();
        let ran = ws.iter().filter(|w| p.runs.contains_key(w.name)).count();
        let _ = writeln!(s, "- {name}: {same} of {ran} workloads");
    }
    s += "\n## Peak resident memory (whole process, largest over its runs)\n\n| | peak |\n|---|---:|\n";
    for (name, p) in m {
        let peak = p.peak_rss_bytes.iter().cloned().fold(0.0, f64::max);
        let _ = writeln!(s, "| {name} | {:.0} MB |", peak / 1e6);
    }
    // The targets, each from this run's figures.
    let peer = |name: &str| peers.iter().find(|(p, _)| p == name).map(|(_, m)| m);
    // kvb's speed over the peer's: a time's ratio is the peer's over kvb's, a rate's the reverse.
    let ttft = |name: &str, w: &str| {
        peer(name)
            .and_then(|p| p.ttft(w))
            .zip(kvb.ttft(w))
            .map(|(p, k)| p / k)
    };
    let decode = |name: &str, w: &str| {
        peer(name)
            .and_then(|p| p.decode(w))
            .zip(kvb.decode(w))
            .map(|(p, k)| k / p)
    };
    let mut targets: Vec<(String, Option<f64>)> = Vec::new();
    for w in ["prefill-500", "prefill-2700"] {
        targets.push((
            format!("{w}: TTFT at least PyTorch f32's (ratio >= 1)"),
            ttft("pytorch-f32", w),
        ));
    }
    for w in ["prefill-500", "prefill-2700"] {
        targets.push((
            format!("decode after {w}: tokens/s at least llama.cpp's (ratio >= 1)"),
            decode("llama.cpp", w),
        ));
    }
    for w in ["warm-code", "warm-doc"] {
        targets.push((
            format!("{w}: TTFT at most llama.cpp's with its prompt cache (ratio >= 1)"),
            ttft("llama.cpp+cache", w),
        ));
    }
    s += "\n## Targets\n\n";
    for (what, r) in targets {
        let verdict = match r {
            Some(r) if r >= 1.0 => "met",
            Some(_) => "not met",
            None => "not measured",
        };
        let _ = writeln!(s, "- {what}: {} ({verdict})", ratio(r));
    }
    let kvb_peak = kvb.peak_rss_bytes.iter().cloned().fold(0.0, f64::max);
    if let Some(kv) = kvb.kv_bytes {
        let limit = gguf_bytes + kv + 150e6;
        let _ = writeln!(
            s,
            "- peak resident memory at most the GGUF ({:.0} MB) + the K/V of the whole \
             document's request ({:.0} MB) + 150 MB = {:.0} MB: {:.0} MB ({})",
            gguf_bytes / 1e6,
            kv / 1e6,
            limit / 1e6,
            kvb_peak / 1e6,
            if kvb_peak <= limit { "met" } else { "not met" }
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_run_every_engine_once_each_in_order_and_keep_round_order() {
        let names = ["a", "b", "c"].map(String::from);
        let (mut calls, mut rounds) = (Vec::new(), Vec::new());
        let all = in_rounds(
            &names,
            2,
            |round| rounds.push(round),
            |engine, round| {
                calls.push((engine, round));
                Ok(Measured {
                    load_ms: vec![(10 * engine + round) as f64],
                    ..Measured::default()
                })
            },
        )
        .unwrap();
        assert_eq!(rounds, [0, 1]);
        assert_eq!(calls, [(0, 0), (1, 0), (2, 0), (0, 1), (1, 1), (2, 1)]);
        let loads: Vec<(&str, Vec<f64>)> = all
            .iter()
            .map(|(n, m)| (n.as_str(), m.load_ms.clone()))
            .collect();
        assert_eq!(
            loads,
            [
                ("a", vec![0.0, 1.0]),
                ("b", vec![10.0, 11.0]),
                ("c", vec![20.0, 21.0])
            ]
        );
    }

    #[test]
    fn only_a_death_by_sigill_reads_as_an_illegal_instruction() {
        let status = |script: &str| Command::new("sh").args(["-c", script]).status().unwrap();
        assert!(illegal_instruction(&status("kill -ILL $$")));
        assert!(!illegal_instruction(&status("kill -SEGV $$")));
        assert!(!illegal_instruction(&status("exit 4")));
        assert!(!illegal_instruction(&status("exit 0")));
    }

    #[test]
    fn a_failed_round_is_an_error() {
        let names = ["a".to_string()];
        let r = in_rounds(
            &names,
            3,
            |_| {},
            |_, round| {
                if round == 1 {
                    anyhow::bail!("round {round} failed")
                }
                Ok(Measured::default())
            },
        );
        let Err(e) = r else {
            panic!("a failed round was not an error")
        };
        assert!(e.to_string().contains("round 1 failed"), "{e}");
    }

    fn measured(ttft: &[(&str, f64)], decode: f64, peak: f64) -> Measured {
        Measured {
            runs: ttft
                .iter()
                .map(|&(w, t)| {
                    let run = Run {
                        prompt_tokens: 10,
                        ttft_ms: t,
                        decode: Some(decode),
                        tokens: vec![1, 2, 3],
                    };
                    (w.to_string(), vec![run])
                })
                .collect(),
            peak_rss_bytes: vec![peak],
            kv_bytes: Some(100e6),
            load_ms: vec![1000.0],
            weights: None,
        }
    }

    /// Each target's ratio and verdict come from the right two figures: prefill against PyTorch
    /// f32's TTFT, decode against llama.cpp's rate, warm TTFT against the prompt cache's.
    #[test]
    fn targets_compare_kvb_with_the_right_peer() {
        let o = parse(&[]).unwrap();
        let ws = workloads(Path::new("../bench/corpus")).unwrap();
        let all = [
            ("prefill-500", 100.0),
            ("prefill-2700", 400.0),
            ("warm-code", 50.0),
            ("warm-doc", 80.0),
        ];
        let m = vec![
            ("kvb".to_string(), measured(&all, 40.0, 300e6)),
            ("pytorch-f32".to_string(), measured(&all[..2], 10.0, 2e9)),
            ("llama.cpp".to_string(), measured(&all, 50.0, 3e8)),
            (
                "llama.cpp+cache".to_string(),
                measured(&[("warm-code", 100.0), ("warm-doc", 40.0)], 50.0, 3e8),
            ),
        ];
        let md = markdown(&o, &ws, &m, 100e6);
        assert!(
            md.contains("prefill-500: TTFT at least PyTorch f32's (ratio >= 1): 1.00 (met)"),
            "{md}"
        );
        assert!(md.contains("decode after prefill-2700: tokens/s at least llama.cpp's (ratio >= 1): 0.80 (not met)"), "{md}");
        assert!(md.contains("warm-code: TTFT at most llama.cpp's with its prompt cache (ratio >= 1): 2.00 (met)"), "{md}");
        assert!(md.contains("warm-doc: TTFT at most llama.cpp's with its prompt cache (ratio >= 1): 0.50 (not met)"), "{md}");
        // 300 MB against 100 (GGUF) + 100 (K/V) + 150.
        assert!(md.contains("= 350 MB: 300 MB (met)"), "{md}");
        assert!(md.contains("- pytorch-f32: 2 of 2 workloads"), "{md}");
    }

    #[test]
    fn unknown_peers_and_zero_counts_are_errors() {
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(parse(&args(&["--peers", "vllm"])).is_err());
        assert!(parse(&args(&["--reps", "0"])).is_err());
        assert_eq!(
            parse(&args(&["--peers", "llama.cpp"])).unwrap().peers,
            ["llama.cpp"]
        );
    }
}
