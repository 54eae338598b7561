//! `kvb replay`: runs the requests of a JSONL file, in order, through one engine and writes one
//! JSON result line per request. This is the interface outside harnesses (and `cargo xtask
//! bench`) drive kvb through; its fields are documented in the README and kept stable.
//!
//! Every line is parsed before the model loads, so a malformed file costs nothing and names its
//! bad line. A request that fails at run time (a prompt longer than the context) gets an
//! `{"id", "error"}` line and the replay goes on; the exit status then says that some failed.

use super::engine_args::EngineArgs;
use super::generate::{ModelArgs, SamplingArgs};
use crate::backend::{probe_device, with_backend};
use crate::model_arg;
use crate::peak_memory::{peak_rss_bytes, rss_bytes};
use anyhow::{bail, Context};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use kvb_engine::{Engine, GenerationResult, StageTimes};
use kvb_model::{ChatMessage, ModelBackend};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// Arguments of `kvb replay`.
#[derive(Args, Debug)]
pub struct ReplayArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The requests: one JSON object per line (`id`, `prompt` or `messages`, optional
    /// `max_new_tokens`, `warm` and `reset`).
    #[arg(long)]
    requests: PathBuf,
    /// Where to write the results (default: stdout).
    #[arg(long)]
    out: Option<PathBuf>,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    engine: EngineArgs,
}

/// One request line.
#[derive(Deserialize, Debug)]
struct Request {
    /// Echoed back as is: a string, a number, anything JSON.
    id: Value,
    /// Raw prompt text, used as given.
    prompt: Option<String>,
    /// Chat messages, rendered with the model's chat template.
    messages: Option<Vec<Message>>,
    /// Overrides `--max-new-tokens`.
    max_new_tokens: Option<usize>,
    /// Text warmed into the cache before the request (its time is `warm_ms`, not part of TTFT).
    warm: Option<String>,
    /// Forget every cached chunk first (the request opens an independent workload).
    #[serde(default)]
    reset: bool,
}

#[derive(Deserialize, Debug)]
struct Message {
    role: String,
    content: String,
}

/// Stage times in milliseconds.
#[derive(Serialize)]
struct StagesMs {
    tokenize_ms: f64,
    lookup_ms: f64,
    assemble_ms: f64,
    repair_ms: f64,
    live_prefill_ms: f64,
    decode_ms: f64,
    store_ms: f64,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

impl From<&StageTimes> for StagesMs {
    fn from(s: &StageTimes) -> Self {
        StagesMs {
            tokenize_ms: ms(s.tokenize),
            lookup_ms: ms(s.lookup),
            assemble_ms: ms(s.assemble),
            repair_ms: ms(s.repair),
            live_prefill_ms: ms(s.live_prefill),
            decode_ms: ms(s.decode),
            store_ms: ms(s.store),
        }
    }
}

/// One result line.
#[derive(Serialize)]
struct Outcome<'a> {
    id: &'a Value,
    mode: &'static str,
    ttft_ms: f64,
    total_ms: f64,
    warm_ms: Option<f64>,
    prompt_tokens: usize,
    cached_tokens: usize,
    resident_tokens: usize,
    recomputed_tokens: usize,
    kv_reuse_ratio: f64,
    exact_chunks: usize,
    approximate_chunks: usize,
    tokens_per_sec: f64,
    stages: StagesMs,
    output_text: &'a str,
    token_ids: &'a [u32],
    rss_bytes: Option<u64>,
    peak_rss_bytes: Option<u64>,
}

/// A failed request's line.
#[derive(Serialize)]
struct Failure<'a> {
    id: &'a Value,
    error: String,
}

/// Reads and checks every request line (blank lines are skipped).
fn read_requests(path: &Path) -> anyhow::Result<Vec<Request>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("reading the requests file {}", path.display()))?;
    let mut requests = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = || format!("{} line {}", path.display(), i + 1);
        let r: Request = serde_json::from_str(line).with_context(at)?;
        match (&r.prompt, &r.messages) {
            (Some(_), Some(_)) => bail!("{}: give `prompt` or `messages`, not both", at()),
            (None, None) => bail!("{}: a request needs `prompt` or `messages`", at()),
            (None, Some(m)) if m.is_empty() => bail!("{}: `messages` is empty", at()),
            _ => {}
        }
        requests.push(r);
    }
    if requests.is_empty() {
        bail!("{} holds no request", path.display());
    }
    Ok(requests)
}

/// Runs `kvb replay`.
pub fn run(args: ReplayArgs) -> anyhow::Result<()> {
    let requests = read_requests(&args.requests)?;
    let path = model_arg::resolve(args.model.model.as_deref())?;
    with_backend!(args.model.backend, |B, device| run_on::<B>(
        &args, &requests, &path, &device
    ))
}

fn prompt_text<B: ModelBackend>(engine: &Engine<B>, r: &Request) -> anyhow::Result<String> {
    match (&r.prompt, &r.messages) {
        (Some(p), _) => Ok(p.clone()),
        (None, Some(messages)) => {
            let messages: Vec<ChatMessage> = messages
                .iter()
                .map(|m| ChatMessage::new(&m.role, m.content.clone()))
                .collect();
            Ok(engine.tokenizer().apply_chat_template(&messages, true)?)
        }
        (None, None) => bail!("request {}: no `prompt` or `messages`", r.id),
    }
}

fn serve_one<B: ModelBackend>(
    engine: &Engine<B>,
    args: &ReplayArgs,
    r: &Request,
) -> anyhow::Result<(Option<f64>, GenerationResult)> {
    if r.reset {
        engine.reset_cache().context("resetting the cache")?;
    }
    let warm_ms = match &r.warm {
        Some(text) => {
            let t = Instant::now();
            engine.warm(text).context("warming")?;
            Some(ms(t.elapsed()))
        }
        None => None,
    };
    let prompt = prompt_text(engine, r)?;
    let mut options = args.sampling.options(&args.engine);
    if let Some(n) = r.max_new_tokens {
        options.max_new_tokens = n;
    }
    let result = engine.generate(&prompt, &options, &mut |_| {})?;
    Ok((warm_ms, result))
}

fn run_on<B: ModelBackend>(
    args: &ReplayArgs,
    requests: &[Request],
    path: &Path,
    device: &B::Device,
) -> anyhow::Result<()> {
    probe_device::<B>(device, args.model.backend)?;
    let engine =
        model_arg::load_engine::<B>(path, args.engine.config(!args.model.no_strict), device)?;
    let mut out: Box<dyn Write> = match &args.out {
        Some(p) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => Box::new(std::io::stdout().lock()),
    };
    let bar = ProgressBar::new(requests.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("replay [{bar:30}] {pos}/{len} requests {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let mut failed = 0;
    for r in requests {
        let line = match serve_one(&engine, args, r) {
            Ok((warm_ms, g)) => {
                bar.set_message(format!("last TTFT {:.0} ms", g.ttft_ms));
                serde_json::to_string(&Outcome {
                    id: &r.id,
                    mode: args.engine.mode.as_str(),
                    ttft_ms: g.ttft_ms,
                    total_ms: g.total_ms,
                    warm_ms,
                    prompt_tokens: g.prompt_tokens,
                    cached_tokens: g.cached_tokens,
                    resident_tokens: g.resident_tokens,
                    recomputed_tokens: g.recomputed_tokens,
                    kv_reuse_ratio: g.kv_reuse_ratio,
                    exact_chunks: g.exact_chunks,
                    approximate_chunks: g.approximate_chunks,
                    tokens_per_sec: g.tokens_per_sec,
                    stages: (&g.stages).into(),
                    output_text: &g.output_text,
                    token_ids: &g.token_ids,
                    rss_bytes: rss_bytes(),
                    peak_rss_bytes: peak_rss_bytes(),
                })?
            }
            Err(e) => {
                failed += 1;
                bar.suspend(|| eprintln!("request {}: {e:#}", r.id));
                serde_json::to_string(&Failure {
                    id: &r.id,
                    error: format!("{e:#}"),
                })?
            }
        };
        // One line per request, flushed at once: a replay cut short keeps every finished result.
        writeln!(out, "{line}")?;
        out.flush()?;
        bar.inc(1);
    }
    bar.finish_and_clear();
    if failed > 0 {
        bail!("{failed} of {} requests failed", requests.len());
    }
    Ok(())
}
