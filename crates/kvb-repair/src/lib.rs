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
//!   context, compare the keys the next layer computes with the cached ones, and keep the tokens
//!   that deviate most. With *gradual filtering* (the paper's scheme, `filter_layers` > 1) the
//!   kept tokens run one layer further, their keys are compared again at that layer, and a smaller
//!   set is kept, layer after layer (each stage keeps half the share of the one before, down to
//!   `ratio`): a token whose deviation at the first probe came from a context the next layer
//!   corrects drops out, one that keeps deviating stays. The last set is recomputed through every
//!   layer. Its cost is the probe's layers over the shrinking sets plus a full forward of the last.
//!   With a `threshold` the budget adapts to the prompt: every token whose keys moved by more than
//!   that share of their norm is kept, the others are left (the deviation left is below the
//!   threshold), each stage's share at most.
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
use kvb_model::{ForwardBatch, KvPool, LogitsFor, Model, ModelBackend, Result, SeqRows};
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
    /// CacheBlend: fraction of a span's tokens recomputed (with a `threshold`: at most).
    pub ratio: f32,
    /// CacheBlend's adaptive budget: recompute the tokens whose relative key deviation at the
    /// probe layer, `|k_fresh - k_cached|^2 / |k_fresh|^2`, exceeds this; `None`: a fixed `ratio`.
    pub threshold: Option<f32>,
    /// Slots below this are always recomputed when in a span (attention sinks).
    pub sink_tokens: usize,
    /// CacheBlend: the first layer whose keys measure deviation (the layers before it run over
    /// the whole span). Layer 1 is the paper's choice and the cheapest.
    pub probe_layer: usize,
    /// CacheBlend: layers the selection is refined over, from `probe_layer` on (1: one selection
    /// at the probe layer; more: gradual filtering).
    pub filter_layers: usize,
}

impl Default for RepairConfig {
    fn default() -> Self {
        RepairConfig {
            strategy: RecomputeStrategy::default(),
            overlap: 16,
            ratio: 0.15,
            threshold: None,
            sink_tokens: 0,
            probe_layer: 1,
            filter_layers: 1,
        }
    }
}

/// What a repair did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RepairReport {
    /// Slots recomputed through every layer (increasing).
    pub recomputed_slots: Vec<usize>,
    /// Token rows CacheBlend's probes ran (each through the layers below its probe layer):
    /// the span at the first probe, the kept tokens at each further one.
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

/// Calls `f` with the forward batch that runs `slots` (increasing) of `seq` as prefill rows.
fn with_batch<R>(
    seq: &SeqKv,
    slots: &[usize],
    f: impl FnOnce(&ForwardBatch) -> Result<R>,
) -> Result<R> {
    let (tokens, positions) = rows(seq, slots);
    let seqs = [SeqRows {
        blocks: seq.blocks,
        slots,
        decode: false,
    }];
    f(&ForwardBatch {
        tokens: &tokens,
        positions: &positions,
        seqs: &seqs,
    })
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
    with_batch(seq, slots, |batch| {
        model.forward_batch(batch, pool, LogitsFor::Nothing)
    })?;
    Ok(())
}

/// How far each token's keys moved in its new context: the squared distance between fresh and
/// cached keys (`[1, hkv, n, hd]` each), absolute and relative to the fresh keys' squared norm.
pub(crate) struct KeyDeviation {
    absolute: Vec<f32>,
    relative: Vec<f32>,
}

fn key_deviation<B: ModelBackend>(
    fresh: Tensor<B, 4>,
    cached: Tensor<B, 4>,
) -> Result<KeyDeviation> {
    let [_, _, n, _] = fresh.dims();
    let per_token = |t: Tensor<B, 4>| {
        kvb_model::to_host_f32((t.clone() * t).sum_dim(3).sum_dim(1).reshape([n]))
    };
    let absolute = per_token(fresh.clone() - cached);
    let norm = per_token(fresh);
    let relative = absolute
        .iter()
        .zip(&norm)
        .map(|(d, k)| if *k > 0.0 { d / k } else { *d })
        .collect();
    Ok(KeyDeviation { absolute, relative })
}

/// Which of `n` probed tokens a CacheBlend stage keeps (indices into them): with no threshold the
/// `most` that deviate most (the paper's choice); with a threshold every token whose relative
/// deviation exceeds it, most deviating first, `most` of them at most.
pub fn pick(absolute: &[f32], relative: &[f32], most: usize, threshold: Option<f32>) -> Vec<usize> {
    let n = absolute.len();
    let most = most.min(n);
    let by = |d: &[f32]| {
        let mut order: Vec<usize> = (0..n).collect();
        order.sort_by(|&a, &b| d[b].total_cmp(&d[a]).then(a.cmp(&b)));
        order
    };
    match threshold {
        None => by(absolute)[..most].to_vec(),
        Some(t) => by(relative)
            .into_iter()
            .take(most)
            .take_while(|&i| relative[i] > t)
            .collect(),
    }
}

/// How many of a span's `n` tokens stage `stage` of `stages` keeps: `ratio` at the last, twice
/// that the stage before, and so on (at most all).
pub fn stage_keeps(n: usize, ratio: f32, stage: usize, stages: usize) -> usize {
    let share = ratio.clamp(0.0, 1.0) * 2f32.powi((stages - 1 - stage.min(stages - 1)) as i32);
    ((share.min(1.0) * n as f32).ceil() as usize).min(n)
}

/// Runs `slots` of `seq` through the layers below `layer` (rewriting their K/V there) and measures
/// how far the keys they compute at `layer` are from the cached ones.
fn probe<B: ModelBackend>(
    model: &Model<B>,
    pool: &mut KvPool<B>,
    seq: &SeqKv,
    slots: &[usize],
    layer: usize,
) -> Result<KeyDeviation> {
    let fresh = with_batch(seq, slots, |batch| {
        model.probe_keys_batch(batch, pool, layer)
    })?;
    let pool_slots = pool.pool_slots(seq.blocks, slots.iter().copied())?;
    let (cached, _) = pool.read(layer, &pool_slots)?;
    key_deviation(fresh, cached.unsqueeze::<4>())
}

/// CacheBlend's selection over `slots` (a reused span): the probe at `probe_layer`, then gradual
/// filtering over the next layers. Returns the slots to recompute and the rows the probes ran.
fn cacheblend<B: ModelBackend>(
    model: &Model<B>,
    pool: &mut KvPool<B>,
    seq: &SeqKv,
    slots: &[usize],
    config: &RepairConfig,
) -> Result<(Vec<usize>, usize)> {
    filter(slots, model.config().num_layers, config, |kept, layer| {
        probe(model, pool, seq, kept, layer)
    })
}

/// Gradual filtering over `slots` in a model of `layers` layers, `probe(kept, layer)` measuring
/// the kept slots' deviation at `layer`. Returns the slots kept last (increasing) and the rows
/// probed.
pub(crate) fn filter(
    slots: &[usize],
    layers: usize,
    config: &RepairConfig,
    mut probe: impl FnMut(&[usize], usize) -> Result<KeyDeviation>,
) -> Result<(Vec<usize>, usize)> {
    let n = slots.len();
    // Layer 1's keys depend on layer 0's attention over the context: the first place a new
    // context shows. Models with one layer have nothing to probe: recompute by ratio.
    let first = config.probe_layer.min(layers.saturating_sub(1));
    if first == 0 {
        return Ok((slots[..stage_keeps(n, config.ratio, 0, 1)].to_vec(), 0));
    }
    let stages = config.filter_layers.clamp(1, layers - first);
    let mut kept: Vec<usize> = slots.to_vec();
    let mut probed = 0;
    for stage in 0..stages {
        if kept.is_empty() {
            break;
        }
        let deviation = probe(&kept, first + stage)?;
        probed += kept.len();
        let most = stage_keeps(n, config.ratio, stage, stages);
        let picked = pick(
            &deviation.absolute,
            &deviation.relative,
            most,
            config.threshold,
        );
        let mut next: Vec<usize> = picked.into_iter().map(|i| kept[i]).collect();
        next.sort_unstable();
        kept = next;
    }
    Ok((kept, probed))
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
            let (picked, probed) = cacheblend(model, pool, seq, &slots, config)?;
            report.probed_tokens = probed;
            chosen.extend(picked);
        }
    }
    chosen.sort_unstable();
    chosen.dedup();
    report.recomputed_slots = chosen;
    Ok(report)
}

/// The model runtime whose models and K/V pools this crate's API takes.
pub use kvb_model;

/// The README's example, run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Gradual filtering's stages shrink to the ratio: the last keeps `ceil(ratio n)`, each
        /// keeps at least the next and at most twice it (and never more than the span).
        #[test]
        fn stages_shrink_to_the_ratio(n in 0usize..400, ratio in 0f32..=1.0, stages in 1usize..6) {
            let keeps: Vec<usize> = (0..stages).map(|s| stage_keeps(n, ratio, s, stages)).collect();
            prop_assert_eq!(keeps[stages - 1], ((ratio * n as f32).ceil() as usize).min(n));
            for w in keeps.windows(2) {
                prop_assert!(w[0] >= w[1] && w[0] <= (2 * w[1] + 1).min(n), "{:?}", keeps);
            }
        }

        /// Gradual filtering probes layer after layer from the probe layer, each time only what
        /// the stage before kept, keeps each stage's share of the most deviating, and returns
        /// the last stage's pick: a subset of every earlier one.
        #[test]
        fn gradual_filtering_narrows_layer_by_layer(
            n in 1usize..80,
            ratio in 0.01f32..=1.0,
            stages in 1usize..5,
            layers in 2usize..8,
            seed in any::<u64>(),
        ) {
            let slots: Vec<usize> = (100..100 + n).collect();
            // A fixed pseudo-random deviation per slot and layer.
            let dev = |slot: usize, layer: usize| {
                let h = (slot as u64 * 0x9E37_79B9 + layer as u64 * 0x85EB_CA6B) ^ seed;
                (h.wrapping_mul(0xC2B2_AE35) >> 40) as f32
            };
            let config = RepairConfig { ratio, filter_layers: stages, ..Default::default() };
            let mut calls: Vec<(Vec<usize>, usize)> = Vec::new();
            let (kept, probed) = filter(&slots, layers, &config, |k, layer| {
                calls.push((k.to_vec(), layer));
                let absolute: Vec<f32> = k.iter().map(|&s| dev(s, layer)).collect();
                Ok(KeyDeviation { relative: absolute.clone(), absolute })
            }).unwrap();
            let stages = stages.min(layers - 1);
            prop_assert_eq!(calls.len(), stages);
            prop_assert_eq!(&calls[0].0, &slots);
            prop_assert_eq!(probed, calls.iter().map(|c| c.0.len()).sum::<usize>());
            for (i, (rows, layer)) in calls.iter().enumerate() {
                prop_assert_eq!(*layer, 1 + i);
                let keep = stage_keeps(n, ratio, i, stages);
                let next = calls.get(i + 1).map_or(&kept, |c| &c.0);
                prop_assert_eq!(next.len(), keep.min(rows.len()));
                prop_assert!(next.iter().all(|s| rows.contains(s)), "kept a slot not probed");
                // Nothing left behind deviates more than what was kept at this layer.
                let least = next.iter().map(|&s| dev(s, *layer)).fold(f32::INFINITY, f32::min);
                for s in rows.iter().filter(|s| !next.contains(s)) {
                    prop_assert!(dev(*s, *layer) <= least);
                }
            }
            prop_assert_eq!(kept.len(), stage_keeps(n, ratio, stages - 1, stages));
        }

        /// A fixed ratio takes exactly its share, the most deviating first; a threshold takes
        /// exactly the tokens above it (within the ratio's cap), so what is left deviates less.
        #[test]
        fn pick_takes_what_the_budget_says(
            dev in prop::collection::vec((0f32..10.0, 0f32..1.0), 1..64),
            ratio in 0f32..=1.0,
            threshold in prop::option::of(0f32..1.0),
        ) {
            let (absolute, relative): (Vec<f32>, Vec<f32>) = dev.into_iter().unzip();
            let n = absolute.len();
            let picked = pick(&absolute, &relative, stage_keeps(n, ratio, 0, 1), threshold);
            let most = ((ratio * n as f32).ceil() as usize).min(n);
            let mut sorted = picked.clone();
            sorted.sort_unstable();
            sorted.dedup();
            prop_assert_eq!(sorted.len(), picked.len(), "no token twice");
            match threshold {
                None => {
                    prop_assert_eq!(picked.len(), most);
                    let least_taken = picked.iter().map(|&i| absolute[i]).fold(f32::INFINITY, f32::min);
                    for i in (0..n).filter(|i| !picked.contains(i)) {
                        prop_assert!(absolute[i] <= least_taken);
                    }
                }
                Some(t) => {
                    let above = relative.iter().filter(|&&d| d > t).count();
                    prop_assert_eq!(picked.len(), above.min(most));
                    prop_assert!(picked.iter().all(|&i| relative[i] > t));
                    if above <= most {
                        for i in (0..n).filter(|i| !picked.contains(i)) {
                            prop_assert!(relative[i] <= t);
                        }
                    }
                }
            }
        }
    }
}
