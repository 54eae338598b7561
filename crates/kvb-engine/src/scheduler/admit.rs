//! Admission: a waiting request becomes a running sequence once its blocks fit.

use super::policy::{admission, waits_for_prefill, Admission, Candidate, PrefillView, Room};
use super::Scheduler;
use crate::blocks::{BlockId, BlockManager, IndexCursor};
use crate::config::GenerationMode;
use crate::kv_transfer::write_pieces;
use crate::plan::{runs, Plan, Planner};
use crate::sequence::{Sequence, Work};
use crate::EngineError;
use kvb_hash::ContentKey;
use kvb_model::ModelBackend;
use std::time::Instant;

impl<B: ModelBackend> Scheduler<B> {
    /// Admits waiting requests oldest first, each as [`admission`] decides once its reuse is
    /// planned: a plan reads the pool's tree as the admissions before it left it.
    pub(super) fn admit(&mut self) {
        let mut i = 0;
        while i < self.waiting.len() && self.room().slots > 0 {
            let t = Instant::now();
            let plan = match self.plan_reuse(i) {
                Ok(p) => p,
                Err(e) => {
                    let seq = self.waiting.remove(i).expect("index in range");
                    self.end_failed(seq, e);
                    continue;
                }
            };
            let lookup = t.elapsed();
            let seq = &self.waiting[i];
            let bs = self.blocks.block_size();
            let candidate = Candidate {
                // Blocks for the prompt and the first generated token; later ones come per step.
                needed_blocks: (seq.prefill_len + 1).div_ceil(bs) - plan.pool_blocks.len(),
                waits_for_prefill: self.waits_for_prefill(seq, &plan),
            };
            match admission(&candidate, self.room()) {
                Admission::Wait => i += 1,
                Admission::Stop => break,
                Admission::Start => {
                    let mut seq = self.waiting.remove(i).expect("index in range");
                    seq.stats.stages.lookup += lookup;
                    seq.stats.stages.queue += seq.submitted.elapsed().saturating_sub(lookup);
                    match self.start(&mut seq, plan, candidate.needed_blocks) {
                        Ok(()) => {
                            seq.order = self.next_order;
                            self.next_order += 1;
                            self.running.push(seq);
                        }
                        Err(e) => self.end_failed(seq, e),
                    }
                }
            }
        }
    }

    /// What admission has room for now.
    fn room(&self) -> Room {
        Room {
            slots: (self.shared.config.max_running).saturating_sub(self.running.len()),
            blocks: self.blocks.available(),
        }
    }

    /// The reuse plan of waiting request `i`: what the pool, then the store, hold of its prompt.
    fn plan_reuse(&mut self, i: usize) -> Result<Plan, EngineError> {
        let waiting = &self.waiting[i];
        let planner = Planner {
            store: &self.shared.store,
            namespace: &waiting.namespace,
            chunking: &self.shared.chunking,
            config: &self.shared.config,
        };
        let tokens = &waiting.tokens[..waiting.prefill_len];
        let shared = self.shared.clone();
        let writer = Self::writer(&shared, &waiting.namespace);
        let (pool, resident) = (&self.pool, &mut self.resident);
        let mut store_resident = |key: &ContentKey, blocks: &mut BlockManager| {
            writer.store_resident(pool, resident, key, blocks)
        };
        planner.plan(
            tokens,
            waiting.options.mode,
            &mut self.blocks,
            &mut store_resident,
        )
    }

    /// Whether `seq` should wait for a running prefill of its namespace that will index more of
    /// its prompt than `plan` finds now ([`waits_for_prefill`]).
    fn waits_for_prefill(&self, seq: &Sequence, plan: &Plan) -> bool {
        if seq.options.mode == GenerationMode::Baseline || !self.shared.config.keep_resident {
            return false;
        }
        let bs = self.blocks.block_size();
        let prefills = self.running.iter().filter(|r| {
            r.options.mode != GenerationMode::Baseline
                && !r.decoding()
                && r.namespace == seq.namespace
        });
        waits_for_prefill(
            &seq.tokens[..seq.prefill_len],
            plan.prefix_end(bs) / bs,
            bs,
            prefills.map(|r| PrefillView {
                tokens: &r.tokens[..r.prefill_len.min(r.cacheable_until())],
                final_until: r.final_until(),
            }),
        )
    }

    /// Gives `seq` its blocks and cached K/V, and its prefill work.
    fn start(&mut self, seq: &mut Sequence, plan: Plan, needed: usize) -> Result<(), EngineError> {
        let t = Instant::now();
        let bs = self.blocks.block_size();
        // Hold the resident blocks before allocating, so eviction cannot take them.
        self.blocks.retain(&plan.pool_blocks);
        let partial: Vec<BlockId> = plan.pool_partial.iter().map(|p| p.0).collect();
        self.blocks.retain(&partial);
        let fresh = self.allocate(needed);
        let Some(fresh) = fresh else {
            self.blocks.release(&partial);
            self.blocks.release(&plan.pool_blocks);
            return Err(EngineError::Cache(
                "the pool's free blocks went to another request".into(),
            ));
        };
        seq.table = plan.pool_blocks.clone();
        seq.table.extend(fresh);
        seq.cursor = IndexCursor {
            scope: seq.cursor.scope,
            node: plan.pool_node,
            indexed: plan.pool_blocks.len(),
        };
        let mut filled = plan.pool_blocks.len() * bs;
        if let Some((block, used)) = plan.pool_partial {
            // Copy-on-write: the sequence writes the rest of this block, so it gets its own copy.
            let from: Vec<usize> = (0..used).map(|s| block as usize * bs + s).collect();
            let to = self.pool.pool_slots(&seq.table, filled..filled + used)?;
            let copied = self.pool.copy_slots(&from, &to);
            self.blocks.release(&partial);
            copied?;
            filled += used;
        }
        seq.stats.cached.pool = filled;
        if let Some(from) = plan.pool_approximate_from {
            seq.exact_until = from;
            seq.stats.cached.approximate += filled.saturating_sub(from);
        }
        if !plan.store.is_empty() {
            let written = write_pieces(&mut self.pool, &seq.table, &plan.store, None)?;
            seq.stats.cached.store = written;
            seq.stats.exact_chunks = plan.store.len();
            filled += written;
        }
        seq.filled = filled;
        seq.work = build_work(&plan, filled, seq.prefill_len);
        seq.stats.stages.assemble += t.elapsed();
        Ok(())
    }

    /// `n` fresh blocks (evicting for room, evicted exact paths written back to the store), the
    /// pool grown to hold them.
    pub(super) fn allocate(&mut self, n: usize) -> Option<Vec<BlockId>> {
        let shared = self.shared.clone();
        let shape = self.pool.head_shape();
        let pool = &self.pool;
        let got = self.blocks.allocate(n, &mut |removed| {
            Self::write_back(&shared, pool, shape, removed)
        });
        let capacity = self.blocks.allocator().capacity();
        if capacity > self.pool.blocks() {
            self.pool.grow(capacity);
        }
        got
    }
}

/// The prefill work after the cached prefix: live gaps to compute and reused runs to place, in
/// slot order, ending with the live suffix (at least the last token, whose logits start
/// generation).
fn build_work(plan: &Plan, filled: usize, prefill_len: usize) -> std::collections::VecDeque<Work> {
    let mut work = std::collections::VecDeque::new();
    let mut pos = filled;
    for (pieces, seams) in runs(&plan.interior) {
        let start = pieces[0].start;
        let end = pieces[pieces.len() - 1].end();
        if start < pos || end >= prefill_len {
            continue; // never over the prefix, never the last token
        }
        if start > pos {
            work.push_back(Work::Compute((pos..start).collect()));
        }
        work.push_back(Work::Place { pieces, seams });
        pos = end;
    }
    work.push_back(Work::Compute((pos..prefill_len).collect()));
    work
}
