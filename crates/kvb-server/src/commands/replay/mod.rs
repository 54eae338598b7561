//! `kvb replay`: runs the requests of a JSONL file through one engine and writes one JSON result
//! line per request. This is the interface outside harnesses (and `cargo xtask bench`) drive kvb
//! through; its fields are documented in docs/guide.md and kept stable.
//!
//! Requests run in file order; requests tagged with a `client` run in order per client, and the
//! clients run at once, through the engine's scheduler (a concurrency workload). Every line is
//! parsed before the model loads, so a malformed file costs nothing and names its bad line. A
//! request that fails at run time (a prompt longer than the context) gets an `{"id", "error"}`
//! line and the replay goes on; the exit status then says that some failed.

mod outcome;
pub mod requests;
mod summary;

use super::engine_args::EngineArgs;
use super::generate::{ModelArgs, SamplingArgs};
use crate::backend::{probe_device, with_backend};
use crate::model_arg;
use anyhow::{bail, Context as _};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use kvb_engine::{Engine, GenerationResult, Request as EngineRequest};
use kvb_model::{ChatMessage, ModelBackend};
use outcome::{Context, Failure, Outcome};
use requests::{by_client, read_requests, Request};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Instant;
use summary::{percentile, Summary, TokenTrie};

/// Arguments of `kvb replay`.
#[derive(Args, Debug)]
pub struct ReplayArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The requests: one JSON object per line (`id`, `prompt` or `messages`, optional
    /// `max_new_tokens`, `warm`, `reset` and `client`).
    #[arg(long)]
    requests: PathBuf,
    /// Where to write the results (default: stdout).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Where to write a summary of the whole run (JSON): wall time, aggregate tokens/s, TTFT
    /// percentiles, the pool's memory against that of the distinct tokens served.
    #[arg(long)]
    summary: Option<PathBuf>,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    engine: EngineArgs,
}

/// Runs `kvb replay`.
pub fn run(args: ReplayArgs) -> anyhow::Result<()> {
    let requests = read_requests(&args.requests)?;
    let path = model_arg::resolve(args.model.model.as_deref())?;
    with_backend!(
        args.model.backend,
        args.model.dtype,
        |B, device| run_on::<B>(&args, &requests, &path, &device)
    )
}

/// A client's conversation so far: the last prompt and its answer.
#[derive(Default)]
pub(crate) enum Chat {
    #[default]
    None,
    /// Raw text: the prompt with the answer appended.
    Text(String),
    /// Messages, the answer last.
    Messages(Vec<ChatMessage>),
}

/// The chat a turn leaves, made once its answer is known.
pub(crate) type NextChat = Box<dyn FnOnce(&str) -> Chat>;

/// The prompt of `r` (after the client's chat so far, with `continue`), and the chat it leaves
/// once `answer` is known (see [`Chat`]).
pub(crate) fn prompt_text<B: ModelBackend>(
    engine: &Engine<B>,
    r: &Request,
    chat: &Chat,
) -> anyhow::Result<(String, NextChat)> {
    match (&r.prompt, &r.messages) {
        (Some(p), _) => {
            let text = match (r.continue_chat, chat) {
                (true, Chat::Text(before)) => format!("{before}{p}"),
                (true, _) => bail!(
                    "request {}: `continue` with `prompt` after a chat of messages",
                    r.id
                ),
                (false, _) => p.clone(),
            };
            let keep = text.clone();
            Ok((text, Box::new(move |answer| Chat::Text(keep + answer))))
        }
        (None, Some(messages)) => {
            let mut all: Vec<ChatMessage> = match (r.continue_chat, chat) {
                (true, Chat::Messages(before)) => before.clone(),
                (true, _) => bail!(
                    "request {}: `continue` with `messages` after a chat of raw text",
                    r.id
                ),
                (false, _) => Vec::new(),
            };
            all.extend(
                messages
                    .iter()
                    .map(|m| ChatMessage::new(&m.role, m.content.clone())),
            );
            let text = engine.tokenizer().apply_chat_template(&all, true)?;
            Ok((
                text,
                Box::new(move |answer| {
                    all.push(ChatMessage::new("assistant", answer));
                    Chat::Messages(all)
                }),
            ))
        }
        (None, None) => bail!("request {}: no `prompt` or `messages`", r.id),
    }
}

/// What one request produced: warm time, its prompt's tokens, its result.
struct Served {
    warm_ms: Option<f64>,
    prompt: Vec<u32>,
    result: GenerationResult,
}

/// Serves `r`; `chat` is the client's conversation so far, updated with this turn and its answer.
fn serve_one<B: ModelBackend>(
    engine: &Engine<B>,
    args: &ReplayArgs,
    r: &Request,
    chat: &mut Chat,
) -> anyhow::Result<Served> {
    if r.reset {
        engine.reset_cache().context("resetting the cache")?;
    }
    let warm_ms = match &r.warm {
        Some(text) => {
            let t = Instant::now();
            engine.warm(text).context("warming")?;
            Some(t.elapsed().as_secs_f64() * 1e3)
        }
        None => None,
    };
    let (text, next) = prompt_text(engine, r, chat)?;
    let mut options = args.sampling.options(&args.engine);
    if let Some(n) = r.max_new_tokens {
        options.max_new_tokens = n;
    }
    // TTFT counts from here: tokenization included.
    let arrival = Instant::now();
    let prompt = engine.tokenizer().encode(&text, false)?;
    let tokenize = arrival.elapsed();
    let mut result = engine
        .submit(EngineRequest {
            tokens: prompt.clone(),
            options,
            arrival,
        })?
        .wait()?;
    result.stages.tokenize = tokenize;
    *chat = next(&result.output_text);
    Ok(Served {
        warm_ms,
        prompt,
        result,
    })
}

/// What the clients share while they run.
struct Shared<'a> {
    out: Mutex<Box<dyn Write + Send + 'a>>,
    bar: ProgressBar,
    start: Instant,
    trie: Mutex<TokenTrie>,
    ttfts: Mutex<Vec<f64>>,
    decode_rates: Mutex<Vec<f64>>,
    generated: Mutex<usize>,
    failed: Mutex<usize>,
}

fn client<B: ModelBackend>(
    engine: &Engine<B>,
    args: &ReplayArgs,
    requests: &[&Request],
    s: &Shared,
) -> anyhow::Result<()> {
    let mut chat = Chat::None;
    for r in requests {
        let started = s.start.elapsed();
        let line = match serve_one(engine, args, r, &mut chat) {
            Ok(served) => {
                let g = &served.result;
                s.bar.set_message(format!("last TTFT {:.0} ms", g.ttft_ms));
                let mut seq = served.prompt.clone();
                seq.extend(&g.token_ids);
                s.trie.lock().unwrap_or_else(|e| e.into_inner()).add(&seq);
                s.ttfts
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .push(g.ttft_ms);
                if g.token_ids.len() > 1 {
                    let mut rates = s.decode_rates.lock().unwrap_or_else(|e| e.into_inner());
                    rates.push(g.tokens_per_sec);
                }
                *s.generated.lock().unwrap_or_else(|e| e.into_inner()) += g.token_ids.len();
                let context = Context {
                    id: &r.id,
                    client: r.client.as_ref(),
                    mode: args.engine.mode.as_str(),
                    warm_ms: served.warm_ms,
                    started,
                    finished: s.start.elapsed(),
                };
                serde_json::to_string(&Outcome::new(context, g, &engine.paged_stats()))?
            }
            Err(e) => {
                *s.failed.lock().unwrap_or_else(|e| e.into_inner()) += 1;
                s.bar.suspend(|| eprintln!("request {}: {e:#}", r.id));
                serde_json::to_string(&Failure {
                    id: &r.id,
                    client: r.client.as_ref(),
                    error: format!("{e:#}"),
                })?
            }
        };
        // One line per request, flushed at once: a replay cut short keeps every finished result.
        let mut out = s.out.lock().unwrap_or_else(|e| e.into_inner());
        writeln!(out, "{line}")?;
        out.flush()?;
        s.bar.inc(1);
    }
    Ok(())
}

fn run_on<B: ModelBackend>(
    args: &ReplayArgs,
    requests: &[Request],
    path: &Path,
    device: &B::Device,
) -> anyhow::Result<()> {
    probe_device::<B>(device, args.model.backend, args.model.dtype)?;
    let engine = model_arg::load_engine::<B>(
        path,
        args.engine.config(&args.model),
        args.model.chat_template.as_deref(),
        device,
    )?;
    let out: Box<dyn Write + Send> = match &args.out {
        Some(p) => Box::new(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => Box::new(std::io::stdout()),
    };
    let bar = ProgressBar::new(requests.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("replay [{bar:30}] {pos}/{len} requests {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let groups = by_client(requests);
    let shared = Shared {
        out: Mutex::new(out),
        bar,
        start: Instant::now(),
        trie: Mutex::new(TokenTrie::default()),
        ttfts: Mutex::new(Vec::new()),
        decode_rates: Mutex::new(Vec::new()),
        generated: Mutex::new(0),
        failed: Mutex::new(0),
    };
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let workers: Vec<_> = groups
            .iter()
            .map(|g| scope.spawn(|| client(&engine, args, g, &shared)))
            .collect();
        for w in workers {
            w.join()
                .map_err(|_| anyhow::anyhow!("a replay client panicked"))??;
        }
        Ok(())
    })?;
    let wall = shared.start.elapsed();
    shared.bar.finish_and_clear();
    let failed = *shared.failed.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = &args.summary {
        engine.sync()?;
        let pool = engine.paged_stats();
        let distinct = shared.trie.lock().unwrap_or_else(|e| e.into_inner()).len();
        let generated = *shared.generated.lock().unwrap_or_else(|e| e.into_inner());
        let ttfts = shared
            .ttfts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let rates = shared
            .decode_rates
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        let decode_median = percentile(&rates, 50.0);
        let token_bytes = pool.block_bytes / pool.block_size.max(1);
        let peak = pool.peak_blocks_used * pool.block_bytes;
        let summary = Summary {
            requests: requests.len(),
            failed,
            clients: groups.len(),
            wall_ms: wall.as_secs_f64() * 1e3,
            generated_tokens: generated,
            aggregate_tokens_per_sec: generated as f64 / wall.as_secs_f64().max(1e-9),
            decode_tokens_per_sec_median: decode_median,
            aggregate_decode_tokens_per_sec: decode_median * groups.len() as f64,
            ttft_p50_ms: percentile(&ttfts, 50.0),
            ttft_p99_ms: percentile(&ttfts, 99.0),
            distinct_tokens: distinct,
            pool_peak_bytes: peak,
            distinct_token_bytes: distinct * token_bytes,
            pool_memory_ratio: peak as f64 / (distinct * token_bytes).max(1) as f64,
            pool,
        };
        std::fs::write(p, serde_json::to_string_pretty(&summary)?)
            .with_context(|| format!("writing {}", p.display()))?;
    }
    if failed > 0 {
        bail!("{failed} of {} requests failed", requests.len());
    }
    Ok(())
}
