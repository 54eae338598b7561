//! # kvb-repair: seam repair for reused K/V
//!
//! K/V reused from another context sits in a sequence next to K/V computed in this one. Each
//! reused token's K/V was computed without the context it now follows (and, after re-rotation, at
//! another position), so the next layers' inputs differ from what a full prefill would give. A
//! repair recomputes some of those tokens in place, against the assembled K/V: each recomputed
//! token attends to the final K/V before it and writes fresh K/V for every layer.
//!
//! Strategies ([`RecomputeStrategy`]):
//! - **Selective**: the first `overlap` tokens after each *seam* (where K/V computed in different
//!   contexts meets: the start of a reused span, and inside it wherever two pieces were not stored
//!   next to each other). No probe: it costs only the recomputed tokens, and fixes only what the
//!   seams disturb most.
//! - **CacheBlend** (Yao et al., *CacheBlend: Fast Large Language Model Serving for RAG with Cached
//!   Knowledge Fusion*, EuroSys 2025): run the first layer over the reused tokens in their new
//!   context, compare the keys the next layer computes with the cached ones, and recompute through
//!   every layer only the `ratio` of tokens that deviate most. Its cost is one layer over the span
//!   plus a full forward of the selected tokens.
//! - **None**.
//!
//! Sink tokens (the first slots of a sequence, which attention leans on) are always recomputed when
//! they fall in a repaired span.
//!
//! A repair works on one sequence of a [`KvPool`] through its block table ([`SeqKv`]). The engine
//! usually lets [`select`] pick the slots and recomputes them in the same forward pass as the tokens
//! that follow the span ([`rows`] gives their tokens and positions); [`repair`] does both at once.
//!
//! Promise (tested in kvb-engine against full prefills): recomputing *every* token of a span gives
//! the K/V a full prefill gives, so fidelity rises monotonically with what is recomputed.
#![warn(missing_docs)]

use burn::tensor::Tensor;
use kvb_model::{
    ForwardBatch, KvPool, LogitsFor, Model, ModelBackend, ModelError, Result, SeqRows,
};
use std::ops::Range;

/// Which tokens of a reused span are recomputed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum RecomputeStrategy {
    /// The first `overlap` tokens after each seam.
    Selective,
    /// The most deviating `ratio` of tokens, measured after the first layer.
    #[default]
    CacheBlend,
    /// Nothing.
    None,
}

impl RecomputeStrategy {
    /// The name `FromStr` reads back.
    pub fn as_str(self) -> &'static str {
        match self {
            RecomputeStrategy::Selective => "selective",
            RecomputeStrategy::CacheBlend => "cacheblend",
            RecomputeStrategy::None => "none",
        }
    }
}

impl std::fmt::Display for RecomputeStrategy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for RecomputeStrategy {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "selective" => Ok(RecomputeStrategy::Selective),
            "cacheblend" | "cache-blend" => Ok(RecomputeStrategy::CacheBlend),
            "none" => Ok(RecomputeStrategy::None),
            other => Err(format!(
                "unknown recompute strategy `{other}` (selective, cacheblend, none)"
            )),
        }
    }
}

/// Repair settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RepairConfig {
    /// The strategy.
    pub strategy: RecomputeStrategy,
    /// Selective: tokens recomputed after each seam.
    pub overlap: usize,
    /// CacheBlend: fraction of a span's tokens recomputed.
    pub ratio: f32,
    /// Slots below this are always recomputed when in a span (attention sinks).
    pub sink_tokens: usize,
    /// CacheBlend: the layer whose keys measure deviation (the layers before it run over the
    /// whole span). Layer 1 is the paper's choice and the cheapest.
    pub probe_layer: usize,
}

impl Default for RepairConfig {
    fn default() -> Self {
        RepairConfig {
            strategy: RecomputeStrategy::default(),
            overlap: 16,
            ratio: 0.15,
            sink_tokens: 0,
            probe_layer: 1,
        }
    }
}

/// What a repair did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RepairReport {
    /// Slots recomputed through every layer (increasing).
    pub recomputed_slots: Vec<usize>,
    /// Tokens run through the first layers only to measure deviation (CacheBlend).
    pub probed_tokens: usize,
}

/// One sequence in a pool, as repair sees it: its block table and the token and RoPE position of
/// every logical slot.
#[derive(Debug, Clone, Copy)]
pub struct SeqKv<'a> {
    /// Its block table.
    pub blocks: &'a [u32],
    /// Token of each slot.
    pub tokens: &'a [u32],
    /// Position of each slot.
    pub positions: &'a [usize],
}

/// A span of reused K/V in a sequence, and its seams.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReusedSpan {
    /// The slots filled with reused K/V.
    pub slots: Range<usize>,
    /// Slots where K/V computed in different contexts meets: the span's start, and each piece
    /// boundary inside it where the pieces were not computed together.
    pub seams: Vec<usize>,
}

/// The tokens and positions of `slots` of a sequence: the rows that recompute them.
pub fn rows(seq: &SeqKv, slots: &[usize]) -> (Vec<u32>, Vec<usize>) {
    (
        slots.iter().map(|&s| seq.tokens[s]).collect(),
        slots.iter().map(|&s| seq.positions[s]).collect(),
    )
}

/// Recomputes `slots` (increasing) of `seq` in place, through every layer.
pub fn recompute<B: ModelBackend>(
    model: &Model<B>,
    pool: &mut KvPool<B>,
    seq: &SeqKv,
    slots: &[usize],
) -> Result<()> {
    if slots.is_empty() {
        return Ok(());
    }
    let (tokens, positions) = rows(seq, slots);
    let seqs = [SeqRows {
        blocks: seq.blocks,
        slots,
        decode: false,
    }];
    let batch = ForwardBatch {
        tokens: &tokens,
        positions: &positions,
        seqs: &seqs,
    };
    model.forward_batch(&batch, pool, LogitsFor::Nothing)?;
    Ok(())
}

/// Per-token squared distance between fresh and cached keys, `[1, hkv, n, hd]` each.
fn key_deviation<B: ModelBackend>(fresh: Tensor<B, 4>, cached: Tensor<B, 4>) -> Result<Vec<f32>> {
    let [_, _, n, _] = fresh.dims();
    let d = fresh - cached;
    let per_token = (d.clone() * d).sum_dim(3).sum_dim(1).reshape([n]);
    per_token
        .into_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .map_err(|e| ModelError::Forward(format!("reading key deviations: {e:?}")))
}

/// Repairs `span` of `seq` (slots already filled with reused K/V): picks the slots to recompute
/// ([`select`]) and recomputes them.
pub fn repair<B: ModelBackend>(
    model: &Model<B>,
    pool: &mut KvPool<B>,
    seq: &SeqKv,
    span: &ReusedSpan,
    config: &RepairConfig,
) -> Result<RepairReport> {
    let report = select(model, pool, seq, span, config)?;
    recompute(model, pool, seq, &report.recomputed_slots)?;
    Ok(report)
}

/// Picks the slots of `span` to recompute, without recomputing them (CacheBlend's probe does
/// rewrite the span's K/V below its probe layer). A caller may then recompute them in the same
/// forward pass as the tokens that follow the span: each layer writes every row's K/V before any
/// row attends, so that equals recomputing first, and the weights are read once.
pub fn select<B: ModelBackend>(
    model: &Model<B>,
    pool: &mut KvPool<B>,
    seq: &SeqKv,
    span: &ReusedSpan,
    config: &RepairConfig,
) -> Result<RepairReport> {
    let mut report = RepairReport::default();
    let range = span.slots.clone();
    if range.is_empty() {
        return Ok(report);
    }
    let mut chosen: Vec<usize> =
        (range.start..range.end.min(config.sink_tokens).max(range.start)).collect();
    match config.strategy {
        RecomputeStrategy::None => {}
        RecomputeStrategy::Selective => {
            for &seam in span.seams.iter().filter(|s| range.contains(s)) {
                chosen.extend(seam..(seam + config.overlap).min(range.end));
            }
        }
        RecomputeStrategy::CacheBlend => {
            let slots: Vec<usize> = range.clone().collect();
            // Layer 1's keys depend on layer 0's attention over the context: the first place a
            // new context shows. Models with one layer have nothing to probe: recompute by ratio.
            let probe_layer = config.probe_layer.min(model.config().num_layers - 1);
            let deviation = if probe_layer == 0 {
                vec![0.0; slots.len()]
            } else {
                let (tokens, positions) = rows(seq, &slots);
                let seqs = [SeqRows {
                    blocks: seq.blocks,
                    slots: &slots,
                    decode: false,
                }];
                let batch = ForwardBatch {
                    tokens: &tokens,
                    positions: &positions,
                    seqs: &seqs,
                };
                let fresh = model.probe_keys_batch(&batch, pool, probe_layer)?;
                let pool_slots = pool.pool_slots(seq.blocks, slots.iter().copied())?;
                let (cached, _) = pool.read(probe_layer, &pool_slots)?;
                report.probed_tokens = slots.len();
                key_deviation(fresh, cached.unsqueeze::<4>())?
            };
            let take = ((config.ratio.clamp(0.0, 1.0) * slots.len() as f32).ceil() as usize)
                .min(slots.len());
            let mut order: Vec<usize> = (0..slots.len()).collect();
            order.sort_by(|&a, &b| deviation[b].total_cmp(&deviation[a]).then(a.cmp(&b)));
            chosen.extend(order[..take].iter().map(|&i| slots[i]));
        }
    }
    chosen.sort_unstable();
    chosen.dedup();
    report.recomputed_slots = chosen;
    Ok(report)
}
