//! Placing a run of reused chunks when a prefill reaches it: the K/V is copied into the
//! sequence's blocks and re-rotated to its slots, then kvb-repair picks the slots to recompute.
//! Those slots join the next computed slice, in the same forward pass as the tokens after the run
//! (exact: each layer writes every row's K/V before any row attends, so this equals repairing
//! first, and the weights are read once).

use super::Scheduler;
use crate::kv_transfer::write_pieces;
use crate::plan::Piece;
use crate::sequence::{Sequence, Work};
use crate::EngineError;
use kvb_model::ModelBackend;
use kvb_repair::{select, RecomputeStrategy, RepairConfig, ReusedSpan, SeqKv};
use std::time::Instant;

impl<B: ModelBackend> Scheduler<B> {
    fn repair_config(&self) -> RepairConfig {
        let c = &self.shared.config;
        RepairConfig {
            strategy: c.recompute_strategy,
            overlap: c.recompute_overlap,
            ratio: c.recompute_ratio,
            threshold: c.recompute_threshold,
            sink_tokens: c.sink_tokens,
            probe_layer: c.cacheblend_probe_layer,
            filter_layers: c.cacheblend_filter_layers,
        }
    }

    /// Places `pieces` (one run) in `seq` and schedules its repair.
    pub(super) fn place(
        &mut self,
        seq: &mut Sequence,
        pieces: Vec<Piece>,
        seams: Vec<usize>,
    ) -> Result<(), EngineError> {
        let span = pieces[0].start..pieces[pieces.len() - 1].end();
        let t = Instant::now();
        write_pieces(
            &mut self.pool,
            &seq.table,
            &pieces,
            Some(self.shared.model.rope()),
        )?;
        seq.stats.stages.assemble += t.elapsed();
        let t = Instant::now();
        let positions: Vec<usize> = (0..seq.tokens.len()).collect();
        let view = SeqKv {
            blocks: &seq.table,
            tokens: &seq.tokens,
            positions: &positions,
        };
        let config = self.repair_config();
        let report = if config.strategy == RecomputeStrategy::None {
            Default::default()
        } else {
            select(
                &self.shared.model,
                &mut self.pool,
                &view,
                &ReusedSpan {
                    slots: span.clone(),
                    seams,
                },
                &config,
            )?
        };
        seq.stats.stages.repair += t.elapsed();
        // The repaired slots go first in the next computed slice (there always is one: at least
        // the last token stays live).
        match seq.work.front_mut() {
            Some(Work::Compute(next)) => {
                let mut slots = report.recomputed_slots.clone();
                slots.append(next);
                slots.sort_unstable();
                slots.dedup();
                *next = slots;
            }
            _ => seq
                .work
                .push_front(Work::Compute(report.recomputed_slots.clone())),
        }
        seq.filled = seq.filled.max(span.end);
        seq.exact_until = seq.exact_until.min(span.start);
        seq.stats.cached.interior += span.len();
        seq.stats.cached.approximate += span.len();
        seq.stats.recomputed += report.recomputed_slots.len();
        seq.stats.approximate_chunks += pieces.len();
        Ok(())
    }
}
