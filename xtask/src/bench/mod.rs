//! `cargo xtask bench`: the end-to-end benchmark. It writes each workload as a `kvb replay`
//! requests file, replays it once per variant and repetition (a fresh process each, so every
//! repetition starts cold and each variant's peak memory is its own), then reduces the results to
//! medians and writes tables, JSON and plots under `bench/results/<date>/`.

pub mod attn_model;
mod concurrency;
pub mod fidelity;
pub mod peers;
mod plots;
mod report;
mod results;
pub mod server;
mod shape_peers;
pub mod shared;
pub mod soak;
mod workloads;

use anyhow::{bail, Context, Result};
use results::{read_lines, Line};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use workloads::Size;

/// A way of serving the requests: `kvb replay` flags.
pub struct Variant {
    /// Column name in tables and plots.
    pub name: &'static str,
    /// `kvb replay` flags.
    pub flags: &'static [&'static str],
}

/// Every variant, Baseline first (the reference for speedup and agreement).
pub const VARIANTS: [Variant; 6] = [
    Variant {
        name: "Baseline",
        flags: &["--mode", "baseline"],
    },
    Variant {
        name: "PrefixCache",
        flags: &["--mode", "prefix"],
    },
    // The default: blocks stay resident in the pool; moved documents repaired by CacheBlend.
    Variant {
        name: "ChunkReuse",
        flags: &["--mode", "chunk-reuse"],
    },
    Variant {
        name: "ChunkReuse selective",
        flags: &["--mode", "chunk-reuse", "--recompute-strategy", "selective"],
    },
    // Nothing stays resident: every hit is read back from the chunk store's RAM tier.
    Variant {
        name: "ChunkReuse store",
        flags: &["--mode", "chunk-reuse", "--no-resident"],
    },
    Variant {
        name: "ChunkReuse store int8",
        flags: &[
            "--mode",
            "chunk-reuse",
            "--no-resident",
            "--kv-precision",
            "int8",
        ],
    },
];

struct Options {
    quick: bool,
    reps: usize,
    model: Option<PathBuf>,
    out: Option<PathBuf>,
    /// `kvb --activations` for the concurrency workload (`q8`); kvb's default otherwise.
    activations: Option<String>,
}

fn parse(args: &[String]) -> Result<Options> {
    let mut o = Options {
        quick: false,
        reps: 3,
        model: None,
        out: None,
        activations: None,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--quick" => o.quick = true,
            "--reps" => o.reps = value()?.parse().context("--reps")?,
            "--model" => o.model = Some(value()?.into()),
            "--out" => o.out = Some(value()?.into()),
            "--activations" => o.activations = Some(value()?.clone()),
            other => bail!("unknown bench option {other}"),
        }
    }
    if o.quick && !args.iter().any(|a| a == "--reps") {
        o.reps = 1;
    }
    if o.reps == 0 {
        bail!("--reps must be at least 1");
    }
    Ok(o)
}

/// The model's context length, when it is an HF folder with a readable config.
fn context_length(model: &Path) -> Option<usize> {
    let cfg = std::fs::read_to_string(model.join("config.json")).ok()?;
    let v: serde_json::Value = serde_json::from_str(&cfg).ok()?;
    v.get("max_position_embeddings")?
        .as_u64()
        .map(|n| n as usize)
}

/// Today's date (UTC) as `YYYY-MM-DD`, from days since the epoch (proleptic Gregorian).
pub(crate) fn today() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

/// How big the workloads are for these options and model.
fn size_of(o: &Options) -> Size {
    let context = o.model.as_deref().and_then(context_length);
    match context {
        // A tiny test model: the same workloads, cut down to fit its context.
        Some(c) if c < 4096 => Size {
            text: 0.015,
            turns: 4,
            max_new_tokens: 4,
            chatml: false,
            concurrency_new_tokens: 8,
        },
        _ if o.quick => Size {
            text: 0.5,
            turns: 8,
            max_new_tokens: 8,
            chatml: true,
            concurrency_new_tokens: 32,
        },
        _ => Size {
            text: 1.0,
            turns: 8,
            max_new_tokens: 16,
            chatml: true,
            concurrency_new_tokens: 64,
        },
    }
}

/// Replays the concurrency workload at 1, 4 and 16 clients, `o.reps` times each, and reduces each
/// client count to medians.
fn run_concurrency(
    o: &Options,
    kvb: &Path,
    size: &Size,
    raw: &Path,
) -> Result<Vec<concurrency::ConcurrencyResult>> {
    let mut out = Vec::new();
    for clients in concurrency::CLIENTS {
        let requests = raw.join(format!("concurrency-{clients}.jsonl"));
        let text = concurrency::requests(Path::new("bench/corpus"), size, clients)?;
        std::fs::write(&requests, text)
            .with_context(|| format!("writing {}", requests.display()))?;
        let mut runs = Vec::new();
        for rep in 0..o.reps {
            eprintln!(
                "bench: concurrency, {clients} clients, repetition {}/{}",
                rep + 1,
                o.reps
            );
            let lines = raw.join(format!("concurrency-{clients}-rep{rep}.jsonl"));
            let summary = raw.join(format!("concurrency-{clients}-rep{rep}.summary.json"));
            let mut cmd = std::process::Command::new(kvb);
            cmd.arg("replay")
                .arg("--requests")
                .arg(&requests)
                .arg("--out")
                .arg(&lines)
                .arg("--summary")
                .arg(&summary);
            if let Some(m) = &o.model {
                cmd.arg("--model").arg(m);
            }
            if let Some(a) = &o.activations {
                cmd.arg("--activations").arg(a);
            }
            crate::run(&mut cmd)?;
            let text = std::fs::read_to_string(&summary)
                .with_context(|| format!("reading {}", summary.display()))?;
            runs.push(
                serde_json::from_str(&text)
                    .with_context(|| format!("parsing {}", summary.display()))?,
            );
        }
        out.push(concurrency::reduce(clients, &runs));
    }
    Ok(out)
}

/// `cargo xtask bench concurrency`: only the concurrency workload, its table printed.
pub fn run_concurrency_only(args: &[String], kvb: &Path) -> Result<()> {
    let o = parse(args)?;
    let size = size_of(&o);
    let out = o
        .out
        .clone()
        .unwrap_or_else(|| PathBuf::from("bench/results").join(format!("{}-concurrency", today())));
    let raw = out.join("raw");
    std::fs::create_dir_all(&raw).with_context(|| format!("creating {}", raw.display()))?;
    let results = run_concurrency(&o, kvb, &size, &raw)?;
    let mut md = concurrency::markdown(&results);
    for (what, goal, measured, met) in concurrency::targets(&results) {
        md += &format!(
            "\n{what}: goal {goal}, measured {measured}: {}",
            if met { "met" } else { "not met" }
        );
    }
    std::fs::write(out.join("README.md"), &md)?;
    std::fs::write(
        out.join("concurrency.json"),
        serde_json::to_string_pretty(&results)?,
    )?;
    println!("{md}");
    Ok(())
}

/// Runs the benchmark with the `kvb` binary at `kvb`.
pub fn run(args: &[String], kvb: &Path) -> Result<()> {
    let o = parse(args)?;
    let size = size_of(&o);
    let date = today();
    let out = o.out.clone().unwrap_or_else(|| {
        PathBuf::from("bench/results").join(if o.quick {
            format!("{date}-quick")
        } else {
            date.clone()
        })
    });
    let raw = out.join("raw");
    std::fs::create_dir_all(&raw).with_context(|| format!("creating {}", raw.display()))?;

    let all = workloads::all(Path::new("bench/corpus"), Path::new("fixtures/docs"), &size)?;
    let requests = raw.join("requests.jsonl");
    let mut text = String::new();
    for w in &all {
        for r in &w.requests {
            text += &serde_json::to_string(r)?;
            text.push('\n');
        }
    }
    std::fs::write(&requests, text).with_context(|| format!("writing {}", requests.display()))?;

    let mut runs: BTreeMap<String, Vec<Vec<Line>>> = BTreeMap::new();
    // Per variant: (peak RSS, largest RSS after a request).
    let mut peak: BTreeMap<String, (u64, u64)> = BTreeMap::new();
    for rep in 0..o.reps {
        for (vi, v) in VARIANTS.iter().enumerate() {
            eprintln!("bench: repetition {}/{}, {}", rep + 1, o.reps, v.name);
            let file = raw.join(format!("variant{vi}-rep{rep}.jsonl"));
            let mut a: Vec<&str> = vec!["replay", "--requests"];
            let req = requests.to_string_lossy().into_owned();
            let outp = file.to_string_lossy().into_owned();
            a.extend([req.as_str(), "--out", outp.as_str()]);
            let model = o.model.as_ref().map(|m| m.to_string_lossy().into_owned());
            if let Some(m) = &model {
                a.extend(["--model", m.as_str()]);
            }
            a.extend(v.flags);
            crate::run(std::process::Command::new(kvb).args(&a))?;
            let lines = read_lines(&file)?;
            let p = lines
                .iter()
                .filter_map(|l| l.peak_rss_bytes)
                .max()
                .unwrap_or(0);
            let after = lines.iter().filter_map(|l| l.rss_bytes).max().unwrap_or(0);
            let e = peak.entry(v.name.to_string()).or_default();
            *e = (e.0.max(p), e.1.max(after));
            runs.entry(v.name.to_string()).or_default().push(lines);
        }
    }
    let concurrency = run_concurrency(&o, kvb, &size, &raw)?;
    let reduced = results::reduce(&runs, VARIANTS[0].name)?;
    let meta = report::Meta {
        date,
        model: o
            .model
            .as_ref()
            .map(|m| m.display().to_string())
            .unwrap_or_else(|| "SmolLM2-135M-Instruct (default)".into()),
        reps: o.reps,
        quick: o.quick,
        size: format!("{size:?}"),
        cores: std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1),
    };
    let report = report::build(&meta, &all, &reduced, &peak, concurrency)?;
    report::write(&out, &report)?;
    plots::draw_all(&out, &report)?;
    eprintln!("bench: results in {}", out.display());
    if !o.quick && o.model.is_none() {
        report::update_readme(Path::new("docs/benchmarks.md"), &out, &report)?;
        eprintln!("bench: docs/benchmarks.md updated with the latest results");
    }
    Ok(())
}

/// Checks that a benchmark run left well-formed output in `dir`: results for every workload,
/// request and variant, the markdown report and every plot.
pub fn check_output(dir: &Path) -> Result<()> {
    let json = dir.join("results.json");
    let v: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&json).with_context(|| format!("reading {}", json.display()))?,
    )
    .with_context(|| format!("{} is not JSON", json.display()))?;
    let workloads = v["workloads"]
        .as_array()
        .context("results.json: no workloads")?;
    if workloads.len() != 7 {
        bail!("results.json: {} workloads, expected 7", workloads.len());
    }
    for w in workloads {
        let requests = w["requests"]
            .as_array()
            .context("a workload without requests")?;
        if requests.is_empty() {
            bail!("workload {} has no request", w["name"]);
        }
        for r in requests {
            for variant in &VARIANTS {
                let ttft = r["cells"][variant.name]["ttft_ms"].as_f64();
                if !ttft.is_some_and(|t| t.is_finite() && t > 0.0) {
                    bail!("{}: no TTFT for {}", r["id"], variant.name);
                }
            }
        }
    }
    let concurrency = v["concurrency"]
        .as_array()
        .context("results.json: no concurrency results")?;
    if concurrency.len() != concurrency::CLIENTS.len() {
        bail!(
            "results.json: {} client counts, expected {}",
            concurrency.len(),
            concurrency::CLIENTS.len()
        );
    }
    for c in concurrency {
        let ok = |f: &str| c[f].as_f64().is_some_and(|x| x.is_finite() && x > 0.0);
        if !(ok("output_tokens_per_sec") && ok("decode_tokens_per_sec") && ok("pool_peak_mib"))
            || c["failed"] != 0
        {
            bail!("concurrency results incomplete or failed: {c}");
        }
    }
    let md = std::fs::read_to_string(dir.join("README.md")).context("reading the report")?;
    if !md.contains("## Targets") || !md.contains("| workload |") || !md.contains("## Concurrency")
    {
        bail!("the markdown report lacks its tables");
    }
    for plot in [
        "conversation_ttft.svg",
        "ttft_vs_length.svg",
        "speedup.svg",
        "stages.svg",
        "concurrency.svg",
    ] {
        let svg =
            std::fs::read_to_string(dir.join(plot)).with_context(|| format!("reading {plot}"))?;
        if !svg.contains("<svg") || !svg.trim_end().ends_with("</svg>") {
            bail!("{plot} is not a complete SVG");
        }
    }
    Ok(())
}
