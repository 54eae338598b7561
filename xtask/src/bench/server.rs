//! `cargo xtask bench server`: `kvb serve` on loopback under 1, 16 and 64 concurrent clients,
//! each a multi-turn chat behind one shared ~1,000-token system prompt, spoken over HTTP as an
//! application would (streamed `/v1/chat/completions`, the chat so far resent every turn). Every
//! client count gets a fresh server, so each starts cold. Times are taken by the clients: TTFT is
//! from sending a request to its first streamed token, decode rate from the first token to the
//! last. Requests are bounded (clients x turns) and so is time (`--time-limit`: no turn starts
//! after it; a request that hangs is an error, not a wait).

use super::concurrency::system_prompt;
use super::results::{median, percentile};
use super::workloads::Size;
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use std::fmt::Write as _;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How a run is shaped.
struct Options {
    clients: Vec<usize>,
    turns: usize,
    max_tokens: usize,
    time_limit: Duration,
    model: Option<PathBuf>,
    out: Option<PathBuf>,
    /// The shared system prompt's share of the full one (1.0: ~1,000 tokens).
    text: f64,
    /// `kvb serve --activations` (`q8`); kvb's default otherwise.
    activations: Option<String>,
    /// More `kvb serve` flags, as one whitespace-separated string (`--serve-args "--flag value"`),
    /// to measure a setting against the default.
    serve_args: Vec<String>,
    /// Each client count also runs with every answer constrained to [`answer_schema`], on a
    /// fresh server of its own, to measure what constrained decoding costs.
    json_schema: bool,
    /// Sampling temperature (0: greedy, where a constrained step checks only its best token;
    /// above 0 every constrained step needs the whole mask). Client `c` samples with seed `c`.
    temperature: f64,
}

fn parse(args: &[String]) -> Result<Options> {
    let mut o = Options {
        clients: vec![1, 16, 64],
        turns: 4,
        max_tokens: 32,
        time_limit: Duration::from_secs(600),
        model: None,
        out: None,
        text: 1.0,
        activations: None,
        serve_args: Vec::new(),
        json_schema: false,
        temperature: 0.0,
    };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        let mut value = || it.next().with_context(|| format!("{a} needs a value"));
        match a.as_str() {
            // A smoke run for CI: two small client counts, short chats.
            "--quick" => {
                o.clients = vec![1, 4];
                o.turns = 2;
                o.max_tokens = 8;
                o.text = 0.5;
            }
            "--clients" => {
                o.clients = value()?
                    .split(',')
                    .map(|c| c.trim().parse().context("--clients: a list like 1,16,64"))
                    .collect::<Result<_>>()?
            }
            "--turns" => o.turns = value()?.parse().context("--turns")?,
            "--max-tokens" => o.max_tokens = value()?.parse().context("--max-tokens")?,
            "--time-limit" => {
                o.time_limit = Duration::from_secs(value()?.parse().context("--time-limit (s)")?)
            }
            "--model" => o.model = Some(value()?.into()),
            "--out" => o.out = Some(value()?.into()),
            "--activations" => o.activations = Some(value()?.clone()),
            "--json-schema" => o.json_schema = true,
            "--temperature" => {
                o.temperature = value()?.parse().context("--temperature: 0 to 2")?;
                if !(0.0..=2.0).contains(&o.temperature) {
                    bail!("--temperature must be 0 to 2");
                }
            }
            "--serve-args" => {
                o.serve_args = value()?.split_whitespace().map(String::from).collect()
            }
            other => bail!("unknown bench server option {other}"),
        }
    }
    if o.clients.is_empty() || o.clients.contains(&0) || o.turns == 0 || o.max_tokens == 0 {
        bail!("--clients, --turns and --max-tokens must be at least 1");
    }
    Ok(o)
}

/// A `kvb serve` process on a free loopback port, killed when dropped.
pub(crate) struct ServeProcess {
    child: Child,
    pub base: String,
}

impl ServeProcess {
    /// Starts `kvb serve` with `extra` flags after the benchmark's own.
    pub(crate) fn start(
        kvb: &Path,
        model: Option<&Path>,
        extra: &[&str],
        log: &Path,
    ) -> Result<Self> {
        let mut cmd = Command::new(kvb);
        cmd.args(["serve", "--port", "0", "--served-model-name", "bench"])
            .args(extra)
            // Every client is admitted: the benchmark measures batching, not the queue's bound.
            .args(["--max-queue", "4096"]);
        if let Some(m) = model {
            cmd.arg("--model").arg(m);
        }
        let mut child = cmd
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .with_context(|| format!("starting {} serve", kvb.display()))?;
        let stderr = child.stderr.take().context("kvb serve's stderr")?;
        let mut sink =
            std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
        let (tx, rx) = std::sync::mpsc::channel();
        // The log goes to a file; the address is read off the line that announces it.
        std::thread::spawn(move || {
            use std::io::Write;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if let Some(rest) = line.split("listening on ").nth(1) {
                    let _ = tx.send(rest.split_whitespace().next().unwrap_or("").to_string());
                }
                let _ = writeln!(sink, "{line}");
            }
        });
        match rx.recv_timeout(Duration::from_secs(300)) {
            Ok(base) => Ok(Self { child, base }),
            Err(_) => {
                let _ = child.kill();
                bail!("kvb serve did not start; its log is {}", log.display())
            }
        }
    }

    /// The process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// SIGTERM, then a kill if it has not exited within a minute.
    pub(crate) fn stop(mut self) -> Result<()> {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let end = Instant::now() + Duration::from_secs(60);
        while Instant::now() < end {
            if let Some(status) = self.child.try_wait()? {
                if !status.success() {
                    bail!("kvb serve exited with {status} after SIGTERM");
                }
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        bail!("kvb serve did not exit within a minute of SIGTERM")
    }
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// What one request saw.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct RequestTiming {
    pub client: usize,
    pub turn: usize,
    pub ttft_ms: f64,
    pub tokens: usize,
    /// Tokens after the first per second, `None` for answers of one token.
    pub decode_tokens_per_sec: Option<f64>,
    pub cached_tokens: u64,
    pub prompt_tokens: u64,
}

/// One client count's run.
#[derive(Serialize, Deserialize, Clone, Debug)]
pub struct ServerResult {
    pub clients: usize,
    /// Every answer constrained to a JSON schema (`--json-schema`).
    #[serde(default)]
    pub constrained: bool,
    pub requests: usize,
    pub errors: usize,
    /// The first errors, as the clients saw them.
    pub error_samples: Vec<String>,
    pub wall_ms: f64,
    pub output_tokens_per_sec: f64,
    /// The median request's decode rate times the number of clients.
    pub decode_tokens_per_sec: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    /// Turns after the first: the system prompt and the chat so far are cached.
    pub warm_ttft_p50_ms: f64,
    pub warm_ttft_p99_ms: f64,
    pub cached_share: f64,
    pub timings: Vec<RequestTiming>,
}

/// The user messages of the chats (the conversation corpus's questions).
fn questions(corpus: &Path) -> Result<Vec<String>> {
    let p = corpus.join("conversation.json");
    let v: Value = serde_json::from_str(
        &std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?,
    )
    .with_context(|| format!("parsing {}", p.display()))?;
    let turns = v["turns"]
        .as_array()
        .context("conversation.json: no turns")?;
    Ok(turns
        .iter()
        .filter_map(|t| t["user"].as_str().map(str::to_string))
        .collect())
}

/// The schema of a constrained run's answers: an object whose free-text answer runs to the
/// token limit, so a turn decodes as many tokens as a free one.
fn answer_schema() -> Value {
    json!({
        "type": "json_schema",
        "json_schema": {"name": "answer", "strict": true, "schema": {
            "type": "object",
            "properties": {
                "answer": {"type": "string"},
                "confidence": {"type": "number", "minimum": 0, "maximum": 1},
                "sources": {"type": "array", "items": {"type": "string"}},
            },
            "required": ["answer", "confidence", "sources"],
            "additionalProperties": false,
        }},
    })
}

/// One streamed chat turn, greedy unless `fields` (more request fields: `response_format`,
/// `temperature`, `seed` ...) say otherwise: its timing and the answer's text.
pub(super) fn turn(
    http: &reqwest::blocking::Client,
    url: &str,
    messages: &[Value],
    max_tokens: usize,
    fields: &Value,
) -> Result<(f64, Vec<f64>, String, Value)> {
    let mut body = json!({
        "model": "bench",
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    for (k, v) in fields.as_object().into_iter().flatten() {
        body[k] = v.clone();
    }
    let sent = Instant::now();
    let resp = http.post(url).json(&body).send().context("sending")?;
    let status = resp.status();
    if !status.is_success() {
        bail!("HTTP {status}: {}", resp.text().unwrap_or_default());
    }
    let mut token_ms = Vec::new();
    let mut text = String::new();
    let mut usage = Value::Null;
    let mut first_event_ms = None;
    let mut done = false;
    for line in BufReader::new(resp).lines() {
        let line = line.context("reading the stream")?;
        let Some(data) = line.strip_prefix("data:").map(str::trim_start) else {
            continue;
        };
        let at = sent.elapsed().as_secs_f64() * 1e3;
        first_event_ms.get_or_insert(at);
        if data == "[DONE]" {
            done = true;
            break;
        }
        let v: Value = serde_json::from_str(data).context("an event that is not JSON")?;
        if let Some(e) = v.get("error") {
            bail!("error event: {e}");
        }
        if let Some(c) = v["choices"][0]["delta"]["content"].as_str() {
            token_ms.push(at);
            text.push_str(c);
        }
        if !v["usage"].is_null() {
            usage = v["usage"].clone();
        }
    }
    if !done {
        bail!("the stream ended without [DONE]");
    }
    let ttft = token_ms.first().copied().or(first_event_ms).unwrap_or(0.0);
    Ok((ttft, token_ms, text, usage))
}

/// Shared by the client threads.
struct Collected {
    timings: Mutex<Vec<RequestTiming>>,
    errors: Mutex<Vec<String>>,
}

/// What every client of a run says: the system prompt, the questions, the answers' format.
struct Script<'a> {
    system: &'a str,
    questions: &'a [String],
    format: Option<&'a Value>,
}

fn client(
    c: usize,
    base: &str,
    script: &Script<'_>,
    o: &Options,
    deadline: Instant,
    out: &Collected,
) {
    let Script {
        system,
        questions,
        format,
    } = *script;
    let http = match reqwest::blocking::Client::builder()
        // Far beyond any turn's time: a request this late means the server hangs.
        .timeout(Duration::from_secs(300))
        .build()
    {
        Ok(h) => h,
        Err(e) => {
            out.errors.lock().unwrap().push(format!("client {c}: {e}"));
            return;
        }
    };
    let url = format!("{base}/v1/chat/completions");
    let mut messages = vec![json!({"role": "system", "content": system})];
    for t in 0..o.turns {
        if Instant::now() >= deadline {
            return;
        }
        let q = questions[t % questions.len()].clone();
        let q = if t == 0 {
            format!(
                "Hello, this is customer {} of store {}. {q}",
                1000 + 37 * c,
                c % 7
            )
        } else {
            q
        };
        messages.push(json!({"role": "user", "content": q}));
        let mut fields = json!({"temperature": o.temperature, "seed": c});
        if let Some(f) = format {
            fields["response_format"] = f.clone();
        }
        match turn(&http, &url, &messages, o.max_tokens, &fields) {
            Ok((ttft_ms, token_ms, text, usage)) => {
                let decode = match (token_ms.first(), token_ms.last()) {
                    (Some(a), Some(b)) if token_ms.len() > 1 && b > a => {
                        Some((token_ms.len() - 1) as f64 / ((b - a) / 1e3))
                    }
                    _ => None,
                };
                out.timings.lock().unwrap().push(RequestTiming {
                    client: c,
                    turn: t + 1,
                    ttft_ms,
                    tokens: token_ms.len(),
                    decode_tokens_per_sec: decode,
                    cached_tokens: usage["prompt_tokens_details"]["cached_tokens"]
                        .as_u64()
                        .unwrap_or(0),
                    prompt_tokens: usage["prompt_tokens"].as_u64().unwrap_or(0),
                });
                messages.push(json!({"role": "assistant", "content": text}));
            }
            Err(e) => {
                // The chat cannot go on without its answer: this client stops.
                out.errors
                    .lock()
                    .unwrap()
                    .push(format!("client {c} turn {}: {e:#}", t + 1));
                return;
            }
        }
    }
}

fn measure(
    kvb: &Path,
    o: &Options,
    clients: usize,
    constrained: bool,
    raw: &Path,
) -> Result<ServerResult> {
    let log = raw.join(format!(
        "serve-{clients}{}.log",
        if constrained { "-json" } else { "" }
    ));
    let format = constrained.then(answer_schema);
    let mut extra: Vec<&str> = match &o.activations {
        Some(a) => vec!["--activations", a],
        None => Vec::new(),
    };
    extra.extend(o.serve_args.iter().map(String::as_str));
    let server = ServeProcess::start(kvb, o.model.as_deref(), &extra, &log)?;
    let size = Size {
        text: o.text,
        turns: o.turns,
        max_new_tokens: o.max_tokens,
        chatml: true,
        concurrency_new_tokens: o.max_tokens,
    };
    let corpus = Path::new("bench/corpus");
    let system = system_prompt(corpus, &size)?;
    let questions = questions(corpus)?;
    let out = Collected {
        timings: Mutex::new(Vec::new()),
        errors: Mutex::new(Vec::new()),
    };
    let start = Instant::now();
    let deadline = start + o.time_limit;
    std::thread::scope(|s| {
        for c in 0..clients {
            let script = Script {
                system: &system,
                questions: &questions,
                format: format.as_ref(),
            };
            let (base, out) = (&server.base, &out);
            s.spawn(move || client(c, base, &script, o, deadline, out));
        }
    });
    let wall = start.elapsed().as_secs_f64();
    server.stop()?;
    let timings = out.timings.into_inner().unwrap_or_else(|e| e.into_inner());
    let errors = out.errors.into_inner().unwrap_or_else(|e| e.into_inner());
    let ttft: Vec<f64> = timings.iter().map(|t| t.ttft_ms).collect();
    let warm: Vec<f64> = timings
        .iter()
        .filter(|t| t.turn > 1)
        .map(|t| t.ttft_ms)
        .collect();
    let rates: Vec<f64> = timings
        .iter()
        .filter_map(|t| t.decode_tokens_per_sec)
        .collect();
    let prompt: u64 = timings.iter().map(|t| t.prompt_tokens).sum();
    let cached: u64 = timings.iter().map(|t| t.cached_tokens).sum();
    let generated: usize = timings.iter().map(|t| t.tokens).sum();
    Ok(ServerResult {
        clients,
        constrained,
        requests: timings.len() + errors.len(),
        errors: errors.len(),
        error_samples: errors.into_iter().take(5).collect(),
        wall_ms: wall * 1e3,
        output_tokens_per_sec: generated as f64 / wall.max(1e-9),
        decode_tokens_per_sec: median(&rates) * clients as f64,
        ttft_p50_ms: percentile(&ttft, 50.0),
        ttft_p99_ms: percentile(&ttft, 99.0),
        warm_ttft_p50_ms: percentile(&warm, 50.0),
        warm_ttft_p99_ms: percentile(&warm, 99.0),
        cached_share: cached as f64 / prompt.max(1) as f64,
        timings,
    })
}

fn markdown(results: &[ServerResult]) -> String {
    let first = results.first();
    let base_decode = first.map_or(1.0, |r| r.decode_tokens_per_sec.max(1e-9));
    let base_output = first.map_or(1.0, |r| r.output_tokens_per_sec.max(1e-9));
    let mut s = String::from(
        "| clients | answers | requests | errors | wall | output tokens/s | vs 1st | decode tokens/s | vs 1st | TTFT p50 | TTFT p99 | warm TTFT p50 | warm TTFT p99 | prompt tokens cached |\n\
         |---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in results {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} | {:.1} s | {:.1} | {:.1}x | {:.1} | {:.1}x | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms | {:.0}% |",
            r.clients,
            if r.constrained { "JSON schema" } else { "free" },
            r.requests,
            r.errors,
            r.wall_ms / 1e3,
            r.output_tokens_per_sec,
            r.output_tokens_per_sec / base_output,
            r.decode_tokens_per_sec,
            r.decode_tokens_per_sec / base_decode,
            r.ttft_p50_ms,
            r.ttft_p99_ms,
            r.warm_ttft_p50_ms,
            r.warm_ttft_p99_ms,
            r.cached_share * 100.0
        );
    }
    s
}

/// The targets: (what, goal, measured, met).
fn targets(results: &[ServerResult]) -> Vec<(String, String, String, bool)> {
    let at = |n: usize| results.iter().find(|r| r.clients == n && !r.constrained);
    let mut out = Vec::new();
    for json in results.iter().filter(|r| r.constrained) {
        if let Some(free) = at(json.clients) {
            let ratio = json.decode_tokens_per_sec / free.decode_tokens_per_sec.max(1e-9);
            out.push((
                format!(
                    "decode tokens/s with a JSON schema vs free, {} clients",
                    json.clients
                ),
                ">= 0.9x".to_string(),
                format!(
                    "{ratio:.2}x ({:.1} vs {:.1} tokens/s)",
                    json.decode_tokens_per_sec, free.decode_tokens_per_sec
                ),
                ratio >= 0.9,
            ));
        }
    }
    if let Some(most) = results.iter().max_by_key(|r| r.clients) {
        out.push((
            format!("{} clients: no errors, no deadlock", most.clients),
            "0 errors".to_string(),
            format!(
                "{} errors in {} requests",
                results.iter().map(|r| r.errors).sum::<usize>(),
                results.iter().map(|r| r.requests).sum::<usize>()
            ),
            results.iter().all(|r| r.errors == 0),
        ));
    }
    if let (Some(one), Some(sixteen)) = (at(1), at(16)) {
        let ttft = sixteen.warm_ttft_p50_ms / one.warm_ttft_p50_ms.max(1e-9);
        out.push((
            "p50 TTFT of warm turns, 16 clients vs 1".to_string(),
            "<= 3x".to_string(),
            format!(
                "{ttft:.1}x ({:.0} vs {:.0} ms)",
                sixteen.warm_ttft_p50_ms, one.warm_ttft_p50_ms
            ),
            ttft <= 3.0,
        ));
        let decode = sixteen.decode_tokens_per_sec / one.decode_tokens_per_sec.max(1e-9);
        out.push((
            "aggregate decode tokens/s, 16 clients vs 1".to_string(),
            ">= 6x".to_string(),
            format!(
                "{decode:.1}x ({:.1} vs {:.1} tokens/s)",
                sixteen.decode_tokens_per_sec, one.decode_tokens_per_sec
            ),
            decode >= 6.0,
        ));
    }
    out
}

/// `cargo xtask bench server [--quick] [--clients 1,16,64] [--turns N] [--max-tokens N]
/// [--time-limit S] [--model PATH] [--out DIR] [--json-schema] [--temperature T]`.
pub fn run(args: &[String], kvb: &Path) -> Result<()> {
    let o = parse(args)?;
    let out = o.out.clone().unwrap_or_else(|| {
        let name = format!("{}-server", super::today());
        PathBuf::from("bench/results").join(name)
    });
    let raw = out.join("raw");
    std::fs::create_dir_all(&raw).with_context(|| format!("creating {}", raw.display()))?;
    let mut results = Vec::new();
    for &clients in &o.clients {
        eprintln!(
            "bench server: {clients} clients x {} turns of {} tokens",
            o.turns, o.max_tokens
        );
        for constrained in [false, true] {
            if constrained && !o.json_schema {
                continue;
            }
            let r = measure(kvb, &o, clients, constrained, &raw)?;
            for e in &r.error_samples {
                eprintln!("bench server: {e}");
            }
            results.push(r);
        }
    }
    let mut md = format!(
        "# `kvb serve` under concurrent chats\n\n{} turns per client, {} tokens per answer, a shared system prompt ({}x the full one), \
         streamed `/v1/chat/completions` at temperature {}; a fresh server per client count; times taken by the clients; {} cores.\n\n",
        o.turns,
        o.max_tokens,
        o.text,
        o.temperature,
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    md += &markdown(&results);
    md += "\n## Targets\n\n| target | goal | measured | met |\n|---|---|---|---|\n";
    for (what, goal, measured, met) in targets(&results) {
        let _ = writeln!(
            md,
            "| {what} | {goal} | {measured} | {} |",
            if met { "yes" } else { "no" }
        );
    }
    md += "\n![TTFT](ttft.svg)\n![tokens per second](throughput.svg)\n";
    std::fs::write(out.join("README.md"), &md)?;
    std::fs::write(
        out.join("server.json"),
        serde_json::to_string_pretty(&results)?,
    )?;
    super::plots::server(&out, &results)?;
    println!("{md}");
    eprintln!("bench server: results in {}", out.display());
    Ok(())
}

/// Checks that a run left its report, JSON and plots, with every request answered.
pub fn check_output(dir: &Path) -> Result<()> {
    let p = dir.join("server.json");
    let results: Vec<ServerResult> = serde_json::from_str(
        &std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?,
    )
    .with_context(|| format!("parsing {}", p.display()))?;
    if results.is_empty() {
        bail!("{}: no client counts", p.display());
    }
    for r in &results {
        if r.errors > 0 || r.requests == 0 || r.timings.iter().any(|t| t.tokens == 0) {
            bail!(
                "bench server, {} clients: {} errors in {} requests: {:?}",
                r.clients,
                r.errors,
                r.requests,
                r.error_samples
            );
        }
    }
    for plot in ["ttft.svg", "throughput.svg"] {
        let svg =
            std::fs::read_to_string(dir.join(plot)).with_context(|| format!("reading {plot}"))?;
        if !svg.trim_end().ends_with("</svg>") {
            bail!("{plot} is not a complete SVG");
        }
    }
    Ok(())
}
