//! `cargo xtask bench shared`: two `kvb serve` replicas sharing one Redis on loopback, and a
//! Baseline server beside them. Documents are spread over the replicas: the one that reads a
//! document first (a cold request) publishes its chunks; then the other replica's first request
//! for that document (another question) reads them from Redis. Reported per workload: the TTFT
//! of that first request against Baseline's and against a local hit (the same replica's next
//! question), and the share of its prompt served from the shared tier. Each repetition starts a
//! fresh Redis and fresh servers for each workload. Times are taken by the client, from sending to the first
//! streamed token.

use super::results::median;
use super::server::{turn, ServeProcess};
use anyhow::{bail, Context, Result};
use kvb_store::remote::test_server::RedisServer;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

struct Options {
    reps: usize,
    max_tokens: usize,
    quick: bool,
    model: Option<PathBuf>,
    out: Option<PathBuf>,
}

fn parse(args: &[String]) -> Result<Options> {
    let mut o = Options {
        reps: 3,
        max_tokens: 8,
        quick: false,
        model: None,
        out: None,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            // A smoke run for CI: the short documents only, once.
            "--quick" => {
                o.quick = true;
                o.reps = 1;
            }
            "--reps" => o.reps = value()?.parse().context("--reps")?,
            "--max-tokens" => o.max_tokens = value()?.parse().context("--max-tokens")?,
            "--model" => o.model = Some(value()?.into()),
            "--out" => o.out = Some(value()?.into()),
            other => bail!("unknown bench shared option {other}"),
        }
    }
    if o.reps == 0 || o.max_tokens == 0 {
        bail!("--reps and --max-tokens must be at least 1");
    }
    Ok(o)
}

/// Documents and the three questions asked about each.
struct Workload {
    name: &'static str,
    title: &'static str,
    documents: Vec<String>,
}

const QUESTIONS: [&str; 3] = [
    "Summarise the document in one sentence.",
    "Which numbers does the document mention?",
    "What is the second topic of the document?",
];

fn read(path: &str) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| format!("reading {path}"))
}

fn workloads(quick: bool) -> Result<Vec<Workload>> {
    let docs = ["amazon", "printing", "photosynthesis"]
        .iter()
        .map(|d| read(&format!("fixtures/docs/{d}.txt")))
        .collect::<Result<Vec<_>>>()?;
    let mut out = vec![Workload {
        name: "rag",
        title: "RAG: three short documents (~350-500 tokens each)",
        documents: docs,
    }];
    if !quick {
        // Two long documents that share no text with each other (nor, as each workload gets
        // fresh servers, with the short ones): the corpus's long document, and its other texts
        // (code, few-shot examples, a system prompt, a conversation) one after the other.
        let others = [
            "code_sample.rs",
            "few_shot.txt",
            "system_prompt.txt",
            "conversation.json",
        ]
        .iter()
        .map(|f| read(&format!("bench/corpus/{f}")))
        .collect::<Result<Vec<_>>>()?;
        out.push(Workload {
            name: "long_document",
            title: "Long documents: two of ~2,300-2,700 tokens",
            documents: vec![read("bench/corpus/long_document.md")?, others.join("\n\n")],
        });
    }
    Ok(out)
}

/// One document's requests.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct DocumentRow {
    pub workload: String,
    pub document: usize,
    pub rep: usize,
    /// The replica that read it first (0: A, 1: B).
    pub reader: usize,
    pub prompt_tokens: u64,
    /// The reader's first request: nothing cached anywhere.
    pub cold_ttft_ms: f64,
    /// The other replica's first request: the document from the shared tier.
    pub shared_ttft_ms: f64,
    pub shared_cached_tokens: u64,
    /// The other replica's next question: the document resident there.
    pub local_ttft_ms: f64,
    /// The Baseline server, the first request's question.
    pub baseline_ttft_ms: f64,
    /// The shared answer equals Baseline's.
    pub same_answer: bool,
}

fn ask(s: &ServeProcess, doc: &str, q: &str, max_tokens: usize) -> Result<(f64, String, Value)> {
    let http = reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(600))
        .build()?;
    let messages = [
        json!({"role": "system", "content": "Answer using only the document."}),
        json!({"role": "user", "content": format!("Document:\n{doc}\n\nQuestion: {q}")}),
    ];
    let url = format!("{}/v1/chat/completions", s.base);
    let (ttft, _, text, usage) = turn(&http, &url, &messages, max_tokens, &json!({}))?;
    Ok((ttft, text, usage))
}

fn remote_stats(s: &ServeProcess) -> Result<Value> {
    let v: Value = reqwest::blocking::get(format!("{}/v1/stats", s.base))?.json()?;
    Ok(v["store"]["remote"].clone())
}

/// Waits until `s` has written what it queued for the shared tier.
fn writes_landed(s: &ServeProcess) -> Result<()> {
    let end = Instant::now() + Duration::from_secs(120);
    while Instant::now() < end {
        let r = remote_stats(s)?;
        if r["writes_pending"] == 0 {
            return Ok(());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    bail!("the shared tier's writes never landed")
}

/// One workload on a fresh Redis and fresh servers, so no document finds another's text.
fn run_rep(
    kvb: &Path,
    o: &Options,
    w: &Workload,
    rep: usize,
    raw: &Path,
) -> Result<Vec<DocumentRow>> {
    let redis = RedisServer::start().map_err(anyhow::Error::msg)?;
    let url = redis.url();
    let shared = ["--remote-cache", url.as_str()];
    let model = o.model.as_deref();
    let log = |name: &str| raw.join(format!("{}-{name}-rep{}.log", w.name, rep + 1));
    let replicas = [
        ServeProcess::start(kvb, model, &shared, &log("replica-a"))?,
        ServeProcess::start(kvb, model, &shared, &log("replica-b"))?,
    ];
    let baseline = ServeProcess::start(kvb, model, &["--mode", "baseline"], &log("baseline"))?;
    let mut rows = Vec::new();
    for (d, doc) in w.documents.iter().enumerate() {
        let (reader, other) = (d % 2, 1 - d % 2);
        eprintln!(
            "bench shared: {} document {} (rep {}), read by replica {}",
            w.name,
            d + 1,
            rep + 1,
            ["A", "B"][reader]
        );
        let (cold, _, _) = ask(&replicas[reader], doc, QUESTIONS[0], o.max_tokens)?;
        writes_landed(&replicas[reader])?;
        let (shared_ttft, answer, usage) = ask(&replicas[other], doc, QUESTIONS[1], o.max_tokens)?;
        let (local, _, _) = ask(&replicas[other], doc, QUESTIONS[2], o.max_tokens)?;
        let (base, base_answer, _) = ask(&baseline, doc, QUESTIONS[1], o.max_tokens)?;
        rows.push(DocumentRow {
            workload: w.name.to_string(),
            document: d + 1,
            rep: rep + 1,
            reader,
            prompt_tokens: usage["prompt_tokens"].as_u64().unwrap_or(0),
            cold_ttft_ms: cold,
            shared_ttft_ms: shared_ttft,
            shared_cached_tokens: usage["prompt_tokens_details"]["cached_tokens"]
                .as_u64()
                .unwrap_or(0),
            local_ttft_ms: local,
            baseline_ttft_ms: base,
            same_answer: answer == base_answer,
        });
    }
    for (name, r) in ["A", "B"].iter().zip(&replicas) {
        let st = remote_stats(r)?;
        eprintln!("bench shared: replica {name}'s shared tier: {st}");
        if st["corrupt"] != 0 || st["outages"] != 0 {
            bail!("replica {name}'s shared tier had corrupt values or outages: {st}");
        }
    }
    for r in replicas {
        r.stop()?;
    }
    baseline.stop()?;
    Ok(rows)
}

/// Per-workload medians: (workload, title, rows).
fn summary(rows: &[DocumentRow], titles: &[(&str, &str)]) -> String {
    let mut md = String::from(
        "| workload | requests | prompt tokens | Baseline TTFT | cold (reader) | shared-tier first hit | local hit | shared / Baseline | tokens from the shared tier | answers = Baseline |\n|---|---|---|---|---|---|---|---|---|---|\n",
    );
    for (name, title) in titles {
        let w: Vec<&DocumentRow> = rows.iter().filter(|r| r.workload == *name).collect();
        if w.is_empty() {
            continue;
        }
        let m = |f: fn(&DocumentRow) -> f64| median(&w.iter().map(|r| f(r)).collect::<Vec<_>>());
        let (base, shared) = (m(|r| r.baseline_ttft_ms), m(|r| r.shared_ttft_ms));
        let cached: u64 = w.iter().map(|r| r.shared_cached_tokens).sum();
        let prompt: u64 = w.iter().map(|r| r.prompt_tokens).sum();
        let _ = writeln!(
            md,
            "| {title} | {} | {:.0} | {base:.0} ms | {:.0} ms | {shared:.0} ms | {:.0} ms | {:.3} | {:.1}% | {}/{} |",
            w.len(),
            m(|r| r.prompt_tokens as f64),
            m(|r| r.cold_ttft_ms),
            m(|r| r.local_ttft_ms),
            shared / base,
            100.0 * cached as f64 / prompt.max(1) as f64,
            w.iter().filter(|r| r.same_answer).count(),
            w.len()
        );
    }
    md
}

/// `cargo xtask bench shared [--quick] [--reps N] [--max-tokens N] [--model PATH] [--out DIR]`.
pub fn run(args: &[String], kvb: &Path) -> Result<()> {
    let o = parse(args)?;
    let out = o.out.clone().unwrap_or_else(|| {
        PathBuf::from("bench/results").join(format!("{}-shared", super::today()))
    });
    let raw = out.join("raw");
    std::fs::create_dir_all(&raw).with_context(|| format!("creating {}", raw.display()))?;
    let mut rows = Vec::new();
    for rep in 0..o.reps {
        for w in workloads(o.quick)? {
            rows.extend(run_rep(kvb, &o, &w, rep, &raw)?);
        }
    }
    let titles: Vec<(&str, &str)> = workloads(o.quick)?
        .iter()
        .map(|w| (w.name, w.title))
        .collect();
    let mut md = format!(
        "# The shared K/V tier: two replicas and one Redis\n\n\
         Two `kvb serve` replicas with `--remote-cache` on one Redis (loopback), a Baseline server \
         beside them; each document is read first by one replica (cold), then asked about on the \
         other (its first request: the document comes from Redis), then again there (a local \
         hit). Medians over documents and {} repetition(s) (fresh Redis and servers for each workload and repetition); TTFT \
         from sending a streamed chat request to its first token; {} tokens per answer; {} cores.\n\n",
        o.reps,
        o.max_tokens,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    md += &summary(&rows, &titles);
    if let Some(long) = titles.iter().find(|(n, _)| *n == "long_document") {
        let w: Vec<&DocumentRow> = rows.iter().filter(|r| r.workload == long.0).collect();
        let ratio = median(&w.iter().map(|r| r.shared_ttft_ms).collect::<Vec<_>>())
            / median(&w.iter().map(|r| r.baseline_ttft_ms).collect::<Vec<_>>());
        let _ = write!(
            md,
            "\n## Target\n\n| target | goal | measured | met |\n|---|---|---|---|\n\
             | another replica's first request for a long document, TTFT vs Baseline | <= 0.25 | {ratio:.3} | {} |\n",
            if ratio <= 0.25 { "yes" } else { "no" }
        );
    }
    std::fs::write(out.join("README.md"), &md)?;
    std::fs::write(
        out.join("shared.json"),
        serde_json::to_string_pretty(&rows)?,
    )?;
    println!("{md}");
    eprintln!("bench shared: results in {}", out.display());
    Ok(())
}

/// Checks a run's output: every document measured, something read from the shared tier, and
/// every such answer equal to Baseline's.
pub fn check_output(dir: &Path) -> Result<()> {
    let p = dir.join("shared.json");
    let rows: Vec<DocumentRow> = serde_json::from_str(
        &std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?,
    )
    .with_context(|| format!("parsing {}", p.display()))?;
    if rows.is_empty() {
        bail!("{}: no documents measured", p.display());
    }
    if let Some(r) = rows.iter().find(|r| r.shared_cached_tokens == 0) {
        bail!("bench shared: nothing came from the shared tier for {r:?}");
    }
    // A shared-tier hit is an exact prefix: its greedy answer is Baseline's.
    if let Some(r) = rows.iter().find(|r| !r.same_answer) {
        bail!("bench shared: an answer from the shared tier differs from Baseline's: {r:?}");
    }
    Ok(())
}
