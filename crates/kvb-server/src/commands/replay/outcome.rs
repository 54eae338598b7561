//! One JSON result line per request.

use crate::peak_memory::{peak_rss_bytes, rss_bytes};
use kvb_engine::{GenerationResult, PoolStats, StageTimes};
use serde::Serialize;
use serde_json::Value;
use std::time::Duration;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// Stage times in milliseconds.
#[derive(Serialize)]
struct StagesMs {
    tokenize_ms: f64,
    queue_ms: f64,
    lookup_ms: f64,
    assemble_ms: f64,
    repair_ms: f64,
    live_prefill_ms: f64,
    decode_ms: f64,
    store_ms: f64,
}

impl From<&StageTimes> for StagesMs {
    fn from(s: &StageTimes) -> Self {
        StagesMs {
            tokenize_ms: ms(s.tokenize),
            queue_ms: ms(s.queue),
            lookup_ms: ms(s.lookup),
            assemble_ms: ms(s.assemble),
            repair_ms: ms(s.repair),
            live_prefill_ms: ms(s.live_prefill),
            decode_ms: ms(s.decode),
            store_ms: ms(s.store),
        }
    }
}

/// The pool as the request left it.
#[derive(Serialize)]
struct PoolMs {
    blocks_used: usize,
    blocks_shared: usize,
    blocks_resident: usize,
    peak_blocks_used: usize,
    block_bytes: usize,
    block_size: usize,
    bytes_saved_by_sharing: usize,
}

/// One result line.
#[derive(Serialize)]
pub struct Outcome<'a> {
    id: &'a Value,
    client: Option<&'a Value>,
    mode: &'static str,
    ttft_ms: f64,
    total_ms: f64,
    warm_ms: Option<f64>,
    /// When the request was sent and when its result came, from the replay's start.
    started_ms: f64,
    finished_ms: f64,
    prompt_tokens: usize,
    cached_tokens: usize,
    pool_tokens: usize,
    store_tokens: usize,
    interior_tokens: usize,
    approximate_tokens: usize,
    recomputed_tokens: usize,
    /// Forward passes its prompt's rows were computed in (chunked prefill).
    prefill_passes: usize,
    kv_reuse_ratio: f64,
    exact_chunks: usize,
    approximate_chunks: usize,
    preemptions: usize,
    tokens_per_sec: f64,
    /// The host's work per decode step it took part in (0 without one): kernel launches,
    /// host-to-device uploads, device-to-host reads and their bytes.
    launches_per_decode_step: f64,
    uploads_per_decode_step: f64,
    reads_per_decode_step: f64,
    read_bytes_per_decode_step: f64,
    stages: StagesMs,
    output_text: &'a str,
    token_ids: &'a [u32],
    pool: PoolMs,
    rss_bytes: Option<u64>,
    peak_rss_bytes: Option<u64>,
}

/// Where a request sits in the replay.
pub struct Context<'a> {
    pub id: &'a Value,
    pub client: Option<&'a Value>,
    pub mode: &'static str,
    pub warm_ms: Option<f64>,
    pub started: Duration,
    pub finished: Duration,
}

impl<'a> Outcome<'a> {
    /// The line of a finished request.
    pub fn new(c: Context<'a>, g: &'a GenerationResult, p: &PoolStats) -> Self {
        Outcome {
            id: c.id,
            client: c.client,
            mode: c.mode,
            ttft_ms: g.ttft_ms,
            total_ms: g.total_ms,
            warm_ms: c.warm_ms,
            started_ms: ms(c.started),
            finished_ms: ms(c.finished),
            prompt_tokens: g.prompt_tokens,
            cached_tokens: g.cached_tokens,
            pool_tokens: g.cached.pool,
            store_tokens: g.cached.store,
            interior_tokens: g.cached.interior,
            approximate_tokens: g.cached.approximate,
            recomputed_tokens: g.recomputed_tokens,
            prefill_passes: g.prefill_passes,
            kv_reuse_ratio: g.kv_reuse_ratio,
            exact_chunks: g.exact_chunks,
            approximate_chunks: g.approximate_chunks,
            preemptions: g.preemptions,
            tokens_per_sec: g.tokens_per_sec,
            launches_per_decode_step: per_step(g.decode_host_work.launches, g.decode_steps),
            uploads_per_decode_step: per_step(g.decode_host_work.uploads, g.decode_steps),
            reads_per_decode_step: per_step(g.decode_host_work.reads, g.decode_steps),
            read_bytes_per_decode_step: per_step(g.decode_host_work.read_bytes, g.decode_steps),
            stages: (&g.stages).into(),
            output_text: &g.output_text,
            token_ids: &g.token_ids,
            pool: PoolMs {
                blocks_used: p.blocks_used,
                blocks_shared: p.blocks_shared,
                blocks_resident: p.blocks_resident,
                peak_blocks_used: p.peak_blocks_used,
                block_bytes: p.block_bytes,
                block_size: p.block_size,
                bytes_saved_by_sharing: p.bytes_saved_by_sharing,
            },
            rss_bytes: rss_bytes(),
            peak_rss_bytes: peak_rss_bytes(),
        }
    }
}

/// A failed request's line.
#[derive(Serialize)]
pub struct Failure<'a> {
    pub id: &'a Value,
    pub client: Option<&'a Value>,
    pub error: String,
}

/// `count` over `steps` (0 without steps).
fn per_step(count: u64, steps: usize) -> f64 {
    if steps == 0 {
        0.0
    } else {
        count as f64 / steps as f64
    }
}
