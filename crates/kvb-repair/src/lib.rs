//! # kvb-repair: seam repair for reused K/V
//!
//! K/V reused from another context sits in the cache next to K/V computed in this one. Each reused
//! token's K/V was computed without the context it now follows (and, after re-rotation, at another
//! position), so the next layers' inputs differ from what a full prefill would give. A repair
//! recomputes some of those tokens in place, against the assembled cache
//! ([`kvb_model::Model::forward_at_slots`]): each recomputed token attends to the final K/V before it
//! and writes fresh K/V for every layer.
//!
//! Strategies ([`RecomputeStrategy`]):
//! - **Selective**: the first `overlap` tokens after the seam (the ones that lacked context most),
//!   plus `overlap_k` tokens of context before it when asked.
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
//! Promise (tested in kvb-engine against full prefills): recomputing *every* token of a span gives
//! the K/V a full prefill gives, so fidelity rises monotonically with what is recomputed.
#![warn(missing_docs)]

use burn::tensor::Tensor;
use kvb_model::{KvCache, LogitsFor, Model, ModelBackend, Result};
use std::ops::Range;

/// Which tokens of a reused span are recomputed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecomputeStrategy {
    /// The first `overlap` tokens after each seam.
    Selective,
    /// The most deviating `ratio` of tokens, measured after the first layer.
    CacheBlend,
    /// Nothing.
    None,
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
    /// Tokens of context before a seam also re-encoded (selective).
    pub overlap_k: usize,
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
            strategy: RecomputeStrategy::Selective,
            overlap: 16,
            overlap_k: 0,
            ratio: 0.15,
            sink_tokens: 0,
            probe_layer: 1,
        }
    }
}

/// What a repair did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RepairReport {
    /// Slots recomputed through every layer.
    pub recomputed_slots: Vec<usize>,
    /// Tokens run through the first layer only to measure deviation (CacheBlend).
    pub probed_tokens: usize,
}

/// The cache's view of a sequence: the token and RoPE position of every slot.
pub struct SlotMap<'a> {
    /// Token of each slot.
    pub tokens: &'a [u32],
    /// Position of each slot.
    pub positions: &'a [usize],
}

/// Recomputes `slots` (increasing) in place.
pub fn recompute<B: ModelBackend>(
    model: &Model<B>,
    cache: &mut KvCache<B>,
    map: &SlotMap,
    slots: &[usize],
) -> Result<()> {
    if slots.is_empty() {
        return Ok(());
    }
    let tokens: Vec<u32> = slots.iter().map(|&s| map.tokens[s]).collect();
    let positions: Vec<usize> = slots.iter().map(|&s| map.positions[s]).collect();
    model.forward_at_slots(&tokens, &positions, slots, cache, LogitsFor::Nothing)?;
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
        .map_err(|e| kvb_model::ModelError::Forward(format!("reading key deviations: {e:?}")))
}

/// Repairs the reused span `span` of the cache (slots already filled with reused K/V): picks the
/// slots to recompute ([`select`]) and recomputes them.
pub fn repair<B: ModelBackend>(
    model: &Model<B>,
    cache: &mut KvCache<B>,
    map: &SlotMap,
    span: Range<usize>,
    config: &RepairConfig,
) -> Result<RepairReport> {
    let report = select(model, cache, map, span, config)?;
    recompute(model, cache, map, &report.recomputed_slots)?;
    Ok(report)
}

/// Picks the slots of `span` to recompute, without recomputing them (CacheBlend's probe does
/// rewrite the span's K/V below its probe layer). A caller may then recompute them in the same
/// forward pass as the tokens that follow the span: each layer writes every row's K/V before any
/// row attends, so that equals recomputing first, and the weights are read once.
pub fn select<B: ModelBackend>(
    model: &Model<B>,
    cache: &mut KvCache<B>,
    map: &SlotMap,
    span: Range<usize>,
    config: &RepairConfig,
) -> Result<RepairReport> {
    let mut report = RepairReport::default();
    if span.is_empty() {
        return Ok(report);
    }
    let sinks = span.start..span.end.min(config.sink_tokens).max(span.start);
    let mut chosen: Vec<usize> = sinks.collect();
    match config.strategy {
        RecomputeStrategy::None => {}
        RecomputeStrategy::Selective => {
            let before = span.start.saturating_sub(config.overlap_k)..span.start;
            chosen.extend(before);
            chosen.extend(span.start..(span.start + config.overlap).min(span.end));
        }
        RecomputeStrategy::CacheBlend => {
            let slots: Vec<usize> = span.clone().collect();
            let tokens: Vec<u32> = slots.iter().map(|&s| map.tokens[s]).collect();
            let positions: Vec<usize> = slots.iter().map(|&s| map.positions[s]).collect();
            // Layer 1's keys depend on layer 0's attention over the context: the first place a
            // new context shows. Models with one layer have nothing to probe: recompute by ratio.
            let probe_layer = config.probe_layer.min(model.config().num_layers - 1);
            let deviation = if probe_layer == 0 {
                vec![0.0; slots.len()]
            } else {
                let fresh = model.probe_keys(&tokens, &positions, &slots, cache, probe_layer)?;
                let (cached, _) = cache.read(probe_layer, span.clone())?;
                report.probed_tokens = slots.len();
                key_deviation(fresh, cached)?
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
