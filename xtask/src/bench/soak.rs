//! `cargo xtask bench soak`: `kvb serve` under steady mixed load for a bounded time, watched for
//! leaks. Clients loop over a mix of requests until the time is up: streamed chat turns (chats
//! grow to four turns behind the shared system prompt, then start again), whole completions,
//! warms of a document, streams dropped after their first token (the server must cancel them and
//! free their blocks) and malformed bodies (which must get a 400). The server's resident memory
//! is sampled every two seconds. The pool (384 MiB) and the chunk store (128 MiB) get budgets small
//! enough to fill early; warm-up lasts until the pool has been full once, and at least the first
//! third of the run (8 clients on the default model fill it in 150 to 180 s). It passes when no request failed, resident memory grew less
//! than 5% between the end of warm-up and the end, and, once the
//! load stops, the pool holds nothing but the resident cache (no running or waiting sequence,
//! every used block indexed by the radix tree).

use super::concurrency::system_prompt;
use super::server::{turn, ServeProcess};
use super::workloads::Size;
use anyhow::{bail, Context, Result};
use serde_json::{json, Value};
use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Memory may grow this much after warm-up.
const MAX_GROWTH: f64 = 0.05;
/// The K/V pool's budget and the chunk store's RAM tier during the soak.
const POOL_BYTES: usize = 384 << 20;
const CACHE_BYTES: usize = 128 << 20;

struct Options {
    duration: Duration,
    clients: usize,
    max_tokens: usize,
    model: Option<PathBuf>,
    out: PathBuf,
}

fn parse(args: &[String]) -> Result<Options> {
    let mut o = Options {
        duration: Duration::from_secs(600),
        clients: 8,
        max_tokens: 24,
        model: None,
        out: std::env::temp_dir().join("kvb-soak"),
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            "--duration" => {
                o.duration = Duration::from_secs(value()?.parse().context("--duration (s)")?)
            }
            "--clients" => o.clients = value()?.parse().context("--clients")?,
            "--max-tokens" => o.max_tokens = value()?.parse().context("--max-tokens")?,
            "--model" => o.model = Some(value()?.into()),
            "--out" => o.out = value()?.into(),
            other => bail!("unknown bench soak option {other}"),
        }
    }
    if o.clients == 0 || o.max_tokens == 0 || o.duration < Duration::from_secs(10) {
        bail!("--clients and --max-tokens must be at least 1, --duration at least 10 s");
    }
    Ok(o)
}

/// What the clients did, shared between their threads.
#[derive(Default)]
struct Tally {
    by_kind: [AtomicUsize; 5],
    failures: Mutex<Vec<String>>,
}

const KINDS: [&str; 5] = [
    "chat turn",
    "completion",
    "warm",
    "dropped stream",
    "bad body",
];

pub fn run(args: &[String], kvb: &Path) -> Result<()> {
    let o = parse(args)?;
    std::fs::create_dir_all(&o.out).with_context(|| format!("creating {}", o.out.display()))?;
    // Small budgets, so that the pool's resident cache and the chunk store are full by the end
    // of warm-up: memory that grows after that is a leak, not a cache filling up.
    let server = ServeProcess::start(
        kvb,
        o.model.as_deref(),
        &[
            "--max-pool-bytes",
            &POOL_BYTES.to_string(),
            "--max-cache-bytes",
            &CACHE_BYTES.to_string(),
        ],
        &o.out.join("serve.log"),
    )?;
    let corpus = Path::new("bench/corpus");
    let size = Size {
        text: 1.0,
        turns: 4,
        max_new_tokens: o.max_tokens,
        chatml: true,
        concurrency_new_tokens: o.max_tokens,
    };
    let system = system_prompt(corpus, &size)?;
    let document: String = std::fs::read_to_string(corpus.join("long_document.md"))
        .context("reading bench/corpus/long_document.md")?
        .chars()
        .skip(3_400)
        .take(2_000)
        .collect();
    let tally = Tally::default();
    let start = Instant::now();
    let deadline = start + o.duration;
    let mut samples: Vec<(f64, u64)> = Vec::new();
    let mut pool_full_at: Option<f64> = None;
    std::thread::scope(|s| {
        for c in 0..o.clients {
            let (base, system, document, tally) = (&server.base, &system, &document, &tally);
            let max_tokens = o.max_tokens;
            s.spawn(move || client(c, base, system, document, max_tokens, deadline, tally));
        }
        let http = reqwest::blocking::Client::new();
        while Instant::now() < deadline {
            if let Some(rss) = resident_bytes(server.pid()) {
                samples.push((start.elapsed().as_secs_f64(), rss));
            }
            if pool_full_at.is_none() && pool_has_been_full(&http, &server.base) {
                pool_full_at = Some(start.elapsed().as_secs_f64());
            }
            std::thread::sleep(Duration::from_secs(2));
        }
    });
    let served_secs = start.elapsed().as_secs_f64();
    let pool = settle(&server.base)?;
    if let Some(rss) = resident_bytes(server.pid()) {
        samples.push((start.elapsed().as_secs_f64(), rss));
    }
    server.stop()?;

    // Warm-up lasts until the pool has been full once (its resident cache at its budget), and
    // at least a third of the run.
    let Some(full_at) = pool_full_at else {
        bail!("the pool never filled: run longer (--duration) or with more clients");
    };
    let warm_end = full_at.max(o.duration.as_secs_f64() / 3.0);
    let after_warmup = samples
        .iter()
        .find(|(t, _)| *t >= warm_end)
        .map(|s| s.1)
        .context("no memory sample after warm-up")?;
    let last = samples.last().map(|s| s.1).context("no memory sample")?;
    let peak = samples.iter().map(|s| s.1).max().unwrap_or(last);
    let growth = last as f64 / after_warmup as f64 - 1.0;
    let counts: Vec<usize> = tally
        .by_kind
        .iter()
        .map(|n| n.load(Ordering::Relaxed))
        .collect();
    let failures = tally
        .failures
        .into_inner()
        .unwrap_or_else(|e| e.into_inner());
    let leaked = pool["blocks_used"].as_u64().unwrap_or(0) as i64
        - pool["blocks_resident"].as_u64().unwrap_or(0) as i64;
    let mut report = format!(
        "# kvb serve soak\n\n{} clients for {:.0} s (pool {} MiB, chunk store {} MiB): {} requests \
         ({}), {} failed.\n\n\
         Resident memory: {:.1} MB after warm-up ({:.0} s: the pool full, a third of the run), {:.1} MB at the end, peak {:.1} MB: \
         growth {:+.2}% (limit {:.0}%).\n\nPool after the load: {} running, {} waiting, \
         {} blocks used, {} of them resident (blocks held by no sequence and no tree: {leaked}).\n",
        o.clients,
        served_secs,
        POOL_BYTES >> 20,
        CACHE_BYTES >> 20,
        counts.iter().sum::<usize>(),
        KINDS
            .iter()
            .zip(&counts)
            .map(|(k, n)| format!("{n} {k}"))
            .collect::<Vec<_>>()
            .join(", "),
        failures.len(),
        after_warmup as f64 / 1e6,
        warm_end,
        last as f64 / 1e6,
        peak as f64 / 1e6,
        growth * 100.0,
        MAX_GROWTH * 100.0,
        pool["running"],
        pool["waiting"],
        pool["blocks_used"],
        pool["blocks_resident"],
    );
    for f in failures.iter().take(10) {
        report.push_str(&format!("\n- failure: {f}"));
    }
    report.push_str("\n\n| seconds | resident MB |\n|---:|---:|\n");
    for (t, rss) in &samples {
        report.push_str(&format!("| {t:.0} | {:.1} |\n", *rss as f64 / 1e6));
    }
    let path = o.out.join("soak.md");
    std::fs::write(&path, &report).with_context(|| format!("writing {}", path.display()))?;
    println!("{report}");
    eprintln!("written to {}", path.display());
    if !failures.is_empty() {
        bail!("{} requests failed", failures.len());
    }
    if growth >= MAX_GROWTH {
        bail!("resident memory grew {:.2}% after warm-up", growth * 100.0);
    }
    if pool["running"] != 0 || pool["waiting"] != 0 || leaked != 0 {
        bail!("the pool did not return to its resident cache: {pool}");
    }
    Ok(())
}

/// The server's resident set, from /proc (Linux).
fn resident_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()?;
    Some(kb * 1024)
}

/// The pool's part of `GET /v1/stats`.
fn pool_stats(http: &reqwest::blocking::Client, base: &str) -> Result<Value> {
    let stats: Value = http
        .get(format!("{base}/v1/stats"))
        .send()
        .and_then(|r| r.json())
        .context("reading /v1/stats")?;
    Ok(stats["pool"].clone())
}

/// Whether the pool has used every block of its budget at some point.
fn pool_has_been_full(http: &reqwest::blocking::Client, base: &str) -> bool {
    pool_stats(http, base).is_ok_and(|pool| {
        pool["blocks_total"].as_u64() > Some(0)
            && pool["peak_blocks_used"].as_u64() >= pool["blocks_total"].as_u64()
    })
}

/// The pool's stats once nothing runs or waits (dropped streams are cancelled at the engine's
/// next step), waiting at most a minute.
fn settle(base: &str) -> Result<Value> {
    let http = reqwest::blocking::Client::new();
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let pool = pool_stats(&http, base)?;
        if (pool["running"] == 0 && pool["waiting"] == 0) || Instant::now() > end {
            return Ok(pool);
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// One client: the request mix in a fixed rotation until the deadline.
fn client(
    c: usize,
    base: &str,
    system: &str,
    document: &str,
    max_tokens: usize,
    deadline: Instant,
    tally: &Tally,
) {
    let fail = |what: String| {
        tally
            .failures
            .lock()
            .unwrap()
            .push(format!("client {c}: {what}"))
    };
    let http = match reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(300))
        .build()
    {
        Ok(h) => h,
        Err(e) => return fail(e.to_string()),
    };
    let chat_url = format!("{base}/v1/chat/completions");
    let mut messages = Vec::new();
    let mut round = 0usize;
    while Instant::now() < deadline {
        // Mostly chat, as a service sees it; one of each other kind per rotation.
        let kind = [0, 0, 1, 0, 2, 0, 3, 0, 4][(round + c) % 9];
        round += 1;
        let result = match kind {
            0 => {
                if messages.len() >= 9 || messages.is_empty() {
                    messages = vec![json!({"role": "system", "content": system})];
                }
                messages.push(json!({"role": "user", "content":
                    format!("Customer {c}, question {round}: what should I do next?")}));
                turn(&http, &chat_url, &messages, max_tokens, &json!({})).map(|(_, _, text, _)| {
                    messages.push(json!({"role": "assistant", "content": text}));
                })
            }
            1 => post_ok(
                &http,
                &format!("{base}/v1/completions"),
                &json!({"model": "bench", "prompt": format!("{document}\n\nIn short,"),
                        "max_tokens": max_tokens, "temperature": 0.7, "seed": round}),
            ),
            2 => post_ok(
                &http,
                &format!("{base}/v1/warm"),
                &json!({"text": format!("{system}\n\n{document}")}),
            ),
            3 => dropped_stream(&http, &chat_url, system, c),
            _ => bad_body(&http, &chat_url),
        };
        match result {
            Ok(()) => {
                tally.by_kind[kind].fetch_add(1, Ordering::Relaxed);
            }
            Err(e) => fail(format!("{}: {e:#}", KINDS[kind])),
        }
    }
}

fn post_ok(http: &reqwest::blocking::Client, url: &str, body: &Value) -> Result<()> {
    let r = http.post(url).json(body).send().context("sending")?;
    let status = r.status();
    let text = r.text().context("reading the answer")?;
    if !status.is_success() {
        bail!("HTTP {status}: {text}");
    }
    serde_json::from_str::<Value>(&text).context("an answer that is not JSON")?;
    Ok(())
}

/// A streamed request read up to its first event, then dropped.
fn dropped_stream(
    http: &reqwest::blocking::Client,
    url: &str,
    system: &str,
    c: usize,
) -> Result<()> {
    let body = json!({"model": "bench", "stream": true, "max_tokens": 200, "messages": [
        {"role": "system", "content": system},
        {"role": "user", "content": format!("Customer {c}: tell me everything, at length.")}]});
    let mut r = http.post(url).json(&body).send().context("sending")?;
    if !r.status().is_success() {
        bail!("HTTP {}", r.status());
    }
    let mut first = [0u8; 64];
    let n = r.read(&mut first).context("reading the first event")?;
    if n == 0 {
        bail!("the stream ended before its first event");
    }
    Ok(())
}

/// A malformed body: must be answered 400 with an OpenAI error object.
fn bad_body(http: &reqwest::blocking::Client, url: &str) -> Result<()> {
    let r = http
        .post(url)
        .header("content-type", "application/json")
        .body(r#"{"model": "bench", "messages": [{"role": "user", "content": 7}"#)
        .send()
        .context("sending")?;
    let status = r.status();
    let v: Value = r.json().context("an error that is not JSON")?;
    if status.as_u16() != 400 || !v["error"]["message"].is_string() {
        bail!("a malformed body got {status}: {v}");
    }
    Ok(())
}
