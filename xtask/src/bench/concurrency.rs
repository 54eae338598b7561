//! The concurrency workload: 1, 4 and 16 clients at once, each an 8-turn chat behind one shared
//! ~1,000-token system prompt, served by one `kvb replay` process per client count (the clients
//! are concurrent threads; the engine batches them). Each turn continues the chat with the
//! model's own previous answer (`"continue": true`), as a chat service sees it. It reports what a service sees: output
//! tokens per second of wall time over all clients, TTFT percentiles, and the pool's peak memory
//! against the memory of the distinct tokens served (the shared prompt counted once).

use super::results::median;
use super::workloads::{chat_continuation, chat_prompt, Size};
use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::Path;

/// Client counts measured.
pub const CLIENTS: [usize; 3] = [1, 4, 16];

/// One request line of the workload.
#[derive(Serialize)]
struct Line {
    id: String,
    client: usize,
    prompt: String,
    max_new_tokens: usize,
    /// After the client's previous prompt and the model's answer to it.
    #[serde(rename = "continue")]
    continue_chat: bool,
}

/// The conversation corpus (its own system prompt is not used: the workload's is longer).
#[derive(Deserialize)]
struct Conversation {
    turns: Vec<Turn>,
}

#[derive(Deserialize)]
struct Turn {
    user: String,
}

fn read(corpus: &Path, name: &str) -> Result<String> {
    let p = corpus.join(name);
    std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))
}

/// The shared system prompt: the support assistant's instructions and a handbook excerpt
/// (~1,000 tokens on the default model; cut down for a tiny model's context).
pub(super) fn system_prompt(corpus: &Path, size: &Size) -> Result<String> {
    let rules = read(corpus, "system_prompt.txt")?;
    let handbook: String = read(corpus, "long_document.md")?
        .chars()
        .take(3_400)
        .collect();
    let text = format!(
        "{}\n\nReference handbook:\n{}",
        rules.trim(),
        handbook.trim()
    );
    Ok(super::workloads::cut(&text, size.text))
}

/// The requests of `clients` chats: client `c` asks the conversation's questions (its first
/// message names it), each turn after the first continuing from the model's own answer; chats
/// share the system prompt and nothing after it.
pub fn requests(corpus: &Path, size: &Size, clients: usize) -> Result<String> {
    let conv: Conversation = serde_json::from_str(&read(corpus, "conversation.json")?)
        .context("parsing bench/corpus/conversation.json")?;
    let system = system_prompt(corpus, size)?;
    let turns = size.turns.min(conv.turns.len());
    let mut out = String::new();
    for c in 0..clients {
        for (t, turn) in conv.turns[..turns].iter().enumerate() {
            let user = super::workloads::cut(&turn.user, size.text);
            let prompt = if t == 0 {
                let user = format!(
                    "Hello, this is customer {} of store {}. {user}",
                    1000 + 37 * c,
                    c % 7
                );
                chat_prompt(size, &[("system", system.clone()), ("user", user)])
            } else {
                chat_continuation(size, &user)
            };
            let line = Line {
                id: format!("client{c}/turn{}", t + 1),
                client: c,
                prompt,
                max_new_tokens: size.concurrency_new_tokens,
                continue_chat: t > 0,
            };
            out += &serde_json::to_string(&line)?;
            out.push('\n');
        }
    }
    Ok(out)
}

/// The replay's `--summary`, as far as the report reads it.
#[derive(Deserialize, Serialize, Debug, Clone)]
pub struct RunSummary {
    pub requests: usize,
    pub failed: usize,
    pub clients: usize,
    pub wall_ms: f64,
    pub generated_tokens: usize,
    pub aggregate_tokens_per_sec: f64,
    pub aggregate_decode_tokens_per_sec: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    pub distinct_tokens: usize,
    pub pool_peak_bytes: usize,
    pub distinct_token_bytes: usize,
    pub pool_memory_ratio: f64,
}

/// Medians over repetitions, per client count.
#[derive(Serialize, Debug, Clone)]
pub struct ConcurrencyResult {
    pub clients: usize,
    pub requests: usize,
    pub failed: usize,
    pub wall_ms: f64,
    pub output_tokens_per_sec: f64,
    pub decode_tokens_per_sec: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    pub pool_peak_mib: f64,
    pub distinct_tokens_mib: f64,
    pub pool_memory_ratio: f64,
}

/// Reduces the repetitions of one client count to medians.
pub fn reduce(clients: usize, runs: &[RunSummary]) -> ConcurrencyResult {
    let m = |f: fn(&RunSummary) -> f64| median(&runs.iter().map(f).collect::<Vec<_>>());
    fn mib(b: usize) -> f64 {
        b as f64 / (1u64 << 20) as f64
    }
    ConcurrencyResult {
        clients,
        requests: runs.first().map_or(0, |r| r.requests),
        failed: runs.iter().map(|r| r.failed).sum(),
        wall_ms: m(|r| r.wall_ms),
        output_tokens_per_sec: m(|r| r.aggregate_tokens_per_sec),
        decode_tokens_per_sec: m(|r| r.aggregate_decode_tokens_per_sec),
        ttft_p50_ms: m(|r| r.ttft_p50_ms),
        ttft_p99_ms: m(|r| r.ttft_p99_ms),
        pool_peak_mib: m(|r| mib(r.pool_peak_bytes)),
        distinct_tokens_mib: m(|r| mib(r.distinct_token_bytes)),
        pool_memory_ratio: m(|r| r.pool_memory_ratio),
    }
}

/// The markdown table.
pub fn markdown(results: &[ConcurrencyResult]) -> String {
    let first = results.first();
    let base = first.map_or(1.0, |r| r.output_tokens_per_sec.max(1e-9));
    let base_decode = first.map_or(1.0, |r| r.decode_tokens_per_sec.max(1e-9));
    let mut s = String::from(
        "| clients | requests | wall | output tokens/s | vs 1 client | decode tokens/s | vs 1 client | TTFT p50 | TTFT p99 | pool peak | distinct tokens | pool / distinct |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in results {
        let _ = writeln!(
            s,
            "| {} | {} | {:.1} s | {:.1} | {:.1}x | {:.1} | {:.1}x | {:.0} ms | {:.0} ms | {:.1} MiB | {:.1} MiB | {:.2} |",
            r.clients,
            r.requests,
            r.wall_ms / 1e3,
            r.output_tokens_per_sec,
            r.output_tokens_per_sec / base,
            r.decode_tokens_per_sec,
            r.decode_tokens_per_sec / base_decode,
            r.ttft_p50_ms,
            r.ttft_p99_ms,
            r.pool_peak_mib,
            r.distinct_tokens_mib,
            r.pool_memory_ratio
        );
    }
    s
}

/// The concurrency targets: (what, goal, measured, met).
pub fn targets(results: &[ConcurrencyResult]) -> Vec<(String, String, String, bool)> {
    let at = |n: usize| results.iter().find(|r| r.clients == n);
    let mut out = Vec::new();
    if let (Some(one), Some(sixteen)) = (at(1), at(16)) {
        let ratio = sixteen.decode_tokens_per_sec / one.decode_tokens_per_sec.max(1e-9);
        let output = sixteen.output_tokens_per_sec / one.output_tokens_per_sec.max(1e-9);
        out.push((
            "concurrency: aggregate decode tokens/s, 16 clients vs 1".to_string(),
            ">= 8x".to_string(),
            format!(
                "{ratio:.1}x ({:.1} vs {:.1} tokens/s; output over the whole run {output:.1}x)",
                sixteen.decode_tokens_per_sec, one.decode_tokens_per_sec
            ),
            ratio >= 8.0,
        ));
        out.push((
            "concurrency: pool memory of the 16 chats vs their distinct tokens".to_string(),
            "<= 1.2x".to_string(),
            format!(
                "{:.2}x ({:.1} MiB peak, {:.1} MiB of distinct tokens)",
                sixteen.pool_memory_ratio, sixteen.pool_peak_mib, sixteen.distinct_tokens_mib
            ),
            sixteen.pool_memory_ratio <= 1.2,
        ));
        out.push((
            "concurrency: no request fails".to_string(),
            "0 errors".to_string(),
            format!("{} errors", results.iter().map(|r| r.failed).sum::<usize>()),
            results.iter().all(|r| r.failed == 0),
        ));
    }
    out
}
