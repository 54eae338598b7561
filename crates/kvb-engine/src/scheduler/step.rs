//! One scheduler step: a ragged batch over every running sequence, one forward pass, then
//! sampling, streaming, indexing, finishing.

use super::Scheduler;
use crate::config::GenerationMode;
use crate::request::Event;
use crate::result::{GenerationResult, Started};
use crate::sequence::{Sequence, Work};
use crate::EngineError;
use kvb_model::generate::{
    logits_rows_to_vec, logits_to_vec, token_logprobs, top_candidates, Candidates, Next,
    TokenConstraint, MAX_DEVICE_K,
};
use kvb_model::{ForwardBatch, LogitsFor, ModelBackend, SeqRows};
use std::time::Instant;

/// How a step's prefill rows are shared out.
#[derive(Clone, Copy, Debug)]
struct PrefillBudget {
    /// Prefill rows of a whole step.
    step: usize,
    /// Of those, what this step has left.
    left: usize,
}

impl PrefillBudget {
    /// Rows a step takes of a prefill slice of `next` rows, when `queued` rows (that slice's and
    /// those of every prefill after it in this step; at least `next`) are known and `backlog`
    /// says whether requests also wait to be admitted.
    ///
    /// A slice that does not fit what is left is cut to fill it only when that saves a step on
    /// the known work: otherwise it finishes in the same later step either way, and waiting
    /// whole keeps this step shorter for every sequence in it. Measured with `cargo xtask bench
    /// server` (chats behind one system prompt, 2 cores, 3 runs each): at 16 clients, whose turns
    /// often arrive two at a time, always cutting gave warm-turn TTFT p50 165-183 ms (p99
    /// 309-347), this rule 146-149 (280-313), never cutting 147-164 (182-212); at 64 clients
    /// never cutting left every step's tail unused and TTFT p50 went from 1.9 to 3.5 s, where
    /// this rule stays at 1.9. Never more than `left`; never 0 from an untouched step, so the
    /// oldest prefill always advances.
    fn take(&self, next: usize, queued: usize, backlog: bool) -> usize {
        let steps = |rows: usize| rows.div_ceil(self.step.max(1));
        let queued = queued.max(next);
        let waiting_saves_nothing = steps(queued) == steps(queued.saturating_sub(self.left));
        if next > self.left && self.left < self.step && !backlog && waiting_saves_nothing {
            0
        } else {
            next.min(self.left)
        }
    }
}

/// What a step's pass hands back for its sampled rows.
enum Sampled {
    /// Their logits, row after row.
    Logits(Vec<f32>),
    /// Their best tokens, chosen on the device.
    Candidates(Candidates),
    /// Every row's best tokens chosen on the device, and the logits of the sampled rows listed
    /// (by their order among the sampled rows), one after the other.
    Mixed {
        candidates: Candidates,
        logits: Vec<f32>,
        rows: Vec<usize>,
    },
}

/// How a step's sampled rows come back from a GPU: `k` candidates a row, and the logits of
/// `logits_rows` (indices among the sampled rows) besides.
struct DeviceChoice {
    k: usize,
    logits_rows: Vec<usize>,
}

/// Row `row`'s candidates as what a sequence samples from.
fn from_candidates(c: &Candidates, row: usize) -> Next<'_> {
    Next::Candidates {
        ids: c.ids(row),
        values: c.values(row),
    }
}

/// A sequence's rows in this step.
struct Member {
    /// Index into the running sequences.
    seq: usize,
    slots: Vec<usize>,
    decode: bool,
    /// Its last row's logits are sampled.
    sample: bool,
}

impl<B: ModelBackend> Scheduler<B> {
    /// Runs one step over the running sequences.
    pub(super) fn step(&mut self) {
        self.make_room_for_decoding();
        let mut running = std::mem::take(&mut self.running);
        let mut members: Vec<Member> = Vec::new();
        let mut failed: Vec<(usize, EngineError)> = Vec::new();
        let config = &self.shared.config;
        let decoding = running.iter().filter(|s| s.decoding()).count();
        let mut budget = if decoding > 0 {
            config
                .prefill_tokens_while_decoding
                .min(config.max_batch_tokens.saturating_sub(decoding))
        } else {
            config.max_batch_tokens
        };
        for (i, s) in running.iter().enumerate() {
            if s.decoding() {
                members.push(Member {
                    seq: i,
                    slots: vec![s.filled],
                    decode: true,
                    sample: true,
                });
            }
        }
        // Prefill slices, oldest first, within what the step has left (chunked prefill).
        let step_budget = budget;
        let backlog = !self.waiting.is_empty();
        // Rows of each prefill and of every prefill after it.
        let mut queued: Vec<usize> = running.iter().map(|s| s.prefill_rows_left()).collect();
        for i in (0..queued.len().saturating_sub(1)).rev() {
            queued[i] += queued[i + 1];
        }
        for (i, s) in running.iter_mut().enumerate() {
            if s.decoding() {
                continue;
            }
            while budget > 0 {
                match s.work.pop_front() {
                    Some(Work::Place { pieces, seams }) => {
                        if let Err(e) = self.place(s, pieces, seams) {
                            failed.push((i, e));
                            break;
                        }
                    }
                    Some(Work::Compute(mut slots)) => {
                        let b = PrefillBudget {
                            step: step_budget,
                            left: budget,
                        };
                        let take = b.take(slots.len(), queued[i], backlog);
                        let rest = slots.split_off(take);
                        if !rest.is_empty() {
                            s.work.push_front(Work::Compute(rest));
                        }
                        budget -= take;
                        if slots.is_empty() {
                            if take == 0 {
                                break; // waits for a step with room for all of it
                            }
                            continue;
                        }
                        s.stats.prefill_passes += 1;
                        let last = *slots.last().expect("not empty");
                        s.stats.prefill_started.get_or_insert_with(Instant::now);
                        members.push(Member {
                            seq: i,
                            sample: s.work.is_empty()
                                && last + 1 == s.prefill_len
                                && s.run.stop().is_none(),
                            slots,
                            decode: false,
                        });
                        break;
                    }
                    None => break,
                }
            }
        }
        // Grammar masks that sampling needs are worked out on another thread while the forward
        // pass runs (greedy decoding checks its best token alone, after it).
        let mut constraints: Vec<(usize, Box<dyn TokenConstraint>)> = Vec::new();
        for m in members.iter().filter(|m| m.sample) {
            let run = &mut running[m.seq].run;
            if let Some(c) = run.needs_mask().then(|| run.take_constraint()).flatten() {
                constraints.push((m.seq, c));
            }
        }
        let (result, work) = std::thread::scope(|scope| {
            let masks = (!constraints.is_empty()).then(|| {
                scope.spawn(|| {
                    for (_, c) in constraints.iter_mut() {
                        // A failure shows again, with its message, when the step masks.
                        let _ = c.prepare();
                    }
                })
            });
            let out = kvb_model::host_work::counted(|| self.forward(&running, &members));
            if let Some(masks) = masks {
                let _ = masks.join();
            }
            out
        });
        for (seq, c) in constraints {
            running[seq].run.restore_constraint(c);
        }
        kvb_model::host_work::add(work);
        let decoders = members.iter().filter(|m| m.decode).count();
        if !members.is_empty() {
            tracing::debug!(
                rows = members.iter().map(|m| m.slots.len()).sum::<usize>(),
                decoding = decoders,
                launches = work.launches,
                uploads = work.uploads,
                reads = work.reads,
                read_bytes = work.read_bytes,
                "forward pass"
            );
        }
        for m in members.iter().filter(|m| m.decode) {
            let st = &mut running[m.seq].stats;
            st.decode_steps += 1;
            st.decode_host_work += work;
        }
        let mut done: Vec<usize> = Vec::new();
        match result {
            Err(e) => {
                // A failed pass fails every sequence in it; the others go on.
                let message = e.to_string();
                for m in &members {
                    failed.push((m.seq, EngineError::Internal(message.clone())));
                }
            }
            Ok(sampled) => {
                let vocab = self.shared.model.config().vocab_size;
                let mut row = 0;
                for m in &members {
                    let s = &mut running[m.seq];
                    let last = *m.slots.last().expect("members have rows");
                    s.filled = s.filled.max(last + 1);
                    if !m.decode && s.work.is_empty() && s.filled >= s.prefill_len {
                        if let Some(t0) = s.stats.prefill_started {
                            s.stats.stages.live_prefill += t0.elapsed();
                        }
                    }
                    if m.sample {
                        let next = match &sampled {
                            Sampled::Logits(l) => Next::Logits(&l[row * vocab..(row + 1) * vocab]),
                            Sampled::Candidates(c) => from_candidates(c, row),
                            Sampled::Mixed {
                                candidates,
                                logits,
                                rows,
                            } => match rows.iter().position(|&r| r == row) {
                                Some(i) => Next::Logits(&logits[i * vocab..(i + 1) * vocab]),
                                None => from_candidates(candidates, row),
                            },
                        };
                        row += 1;
                        match self.sample(s, next) {
                            Ok(true) => done.push(m.seq),
                            Ok(false) => {}
                            Err(e) => failed.push((m.seq, e)),
                        }
                    } else if !m.decode && s.decoding() && s.run.stop().is_some() {
                        // Prefill only (a warm request): done once the prompt is in.
                        done.push(m.seq);
                    }
                }
            }
        }
        for s in running.iter_mut() {
            self.index_blocks(s, false);
        }
        // End what finished or failed, highest index first so indices stay valid.
        let mut ends: Vec<(usize, Option<EngineError>)> =
            done.into_iter().map(|i| (i, None)).collect();
        ends.extend(failed.into_iter().map(|(i, e)| (i, Some(e))));
        ends.sort_by_key(|e| std::cmp::Reverse(e.0));
        ends.dedup_by_key(|e| e.0);
        for (i, error) in ends {
            let seq = running.remove(i);
            match error {
                None => self.finish(seq),
                Some(e) => self.end_failed(seq, e),
            }
        }
        self.running = running;
    }

    /// Which sampled rows of the step choose their token on the device (a decode row whose
    /// request keeps no logits, asks no log-probabilities and samples greedily or from a top-k
    /// of at most [`MAX_DEVICE_K`]), with candidates per row (1 when all of those are greedy,
    /// else [`MAX_DEVICE_K`]); the others read their logits, and only theirs. `None` (the CPU,
    /// or no row that can) reads every row's logits.
    fn device_candidates(&self, running: &[Sequence], members: &[Member]) -> Option<DeviceChoice> {
        if !B::samples_on_device() {
            return None;
        }
        let mut k = 1;
        let mut logits_rows = Vec::new();
        for (row, m) in members.iter().filter(|m| m.sample).enumerate() {
            let s = &running[m.seq];
            let sampler = s.run.sampler();
            let needs_logits = s.options.keep_logits
                || s.options.logprobs.is_some()
                || s.stats.first_token_at.is_none()
                || !s.run.fits_candidates(MAX_DEVICE_K);
            if needs_logits {
                logits_rows.push(row);
            } else if sampler.candidates_needed() > 1 {
                k = MAX_DEVICE_K;
            }
        }
        let sampled = members.iter().filter(|m| m.sample).count();
        (logits_rows.len() < sampled).then_some(DeviceChoice { k, logits_rows })
    }

    /// The forward pass of a step; returns what its sampled rows need, row after row.
    fn forward(
        &mut self,
        running: &[Sequence],
        members: &[Member],
    ) -> Result<Sampled, EngineError> {
        if members.is_empty() {
            return Ok(Sampled::Logits(Vec::new()));
        }
        let candidates = self.device_candidates(running, members);
        let mut tokens = Vec::new();
        let mut positions = Vec::new();
        let mut rows = Vec::new();
        let mut sampled = Vec::new();
        for m in members {
            let s = &running[m.seq];
            tokens.extend(m.slots.iter().map(|&slot| s.tokens[slot]));
            positions.extend(m.slots.iter().copied());
            rows.push(SeqRows {
                blocks: &s.table,
                slots: &m.slots,
                decode: m.decode,
            });
            if m.sample {
                sampled.push(tokens.len() - 1);
            }
        }
        let batch = ForwardBatch {
            tokens: &tokens,
            positions: &positions,
            seqs: &rows,
        };
        let logits = if sampled.is_empty() {
            LogitsFor::Nothing
        } else {
            LogitsFor::Rows(sampled)
        };
        let shared = self.shared.clone();
        // A panic inside a kernel must not take the engine down: it fails this step's sequences.
        let out = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            shared.model.forward_batch(&batch, &mut self.pool, logits)
        }))
        .map_err(|_| EngineError::Internal("the forward pass panicked".into()))??;
        Ok(match candidates {
            Some(c) if c.logits_rows.is_empty() && out.dims()[0] > 0 => {
                Sampled::Candidates(top_candidates(out, c.k)?)
            }
            Some(c) if out.dims()[0] > 0 => Sampled::Mixed {
                candidates: top_candidates(out.clone(), c.k)?,
                logits: logits_rows_to_vec(out, &c.logits_rows)?,
                rows: c.logits_rows,
            },
            _ => Sampled::Logits(logits_to_vec(out)?),
        })
    }

    /// Samples the next token of `s` from `next`, streams it; returns whether `s` is done.
    /// Logits are there whenever the request keeps them, asks for log-probabilities, or this is
    /// its first token ([`Self::device_candidates`]).
    fn sample(&mut self, s: &mut Sequence, next: Next<'_>) -> Result<bool, EngineError> {
        let max = self.shared.model.config().max_position_embeddings;
        let first = s.stats.first_token_at.is_none();
        let step = s
            .run
            .step_from(&self.shared.tokenizer, next, s.tokens.len(), max)?;
        let logits: &[f32] = match next {
            Next::Logits(l) => l,
            Next::Candidates { .. } => &[],
        };
        let now = Instant::now();
        if first {
            s.stats.first_token_at = Some(now);
            s.stats.first_logits = logits.to_vec();
            s.sink.send(Event::Started(Started {
                ttft_ms: ms(now.duration_since(s.arrival)),
                prompt_tokens: s.prompt_len,
                cached: s.stats.cached,
                recomputed_tokens: s.stats.recomputed,
            }));
        }
        if s.options.keep_logits {
            s.stats.logits.push(logits.to_vec());
        }
        s.stats.last_token_at = Some(now);
        s.tokens.push(step.token);
        let logprobs = s
            .options
            .logprobs
            .map(|top| token_logprobs(logits, step.token, top));
        if let Some(l) = &logprobs {
            s.stats.logprobs.push(l.clone());
        }
        s.sink.send(Event::Token {
            token: step.token,
            text: step.text,
            logprobs,
        });
        Ok(step.stop.is_some())
    }

    /// Gives every decoding sequence the block its next token needs, preempting the newest
    /// sequences (theirs freed, they wait to be admitted again) when none can be had.
    fn make_room_for_decoding(&mut self) {
        let bs = self.blocks.block_size();
        let mut i = 0;
        while i < self.running.len() {
            let s = &self.running[i];
            if !(s.decoding() && s.filled / bs >= s.table.len()) {
                i += 1;
                continue;
            }
            match self.allocate(1) {
                Some(b) => {
                    self.running[i].table.extend(b);
                    i += 1;
                }
                None => {
                    let newest = (0..self.running.len())
                        .max_by_key(|&j| self.running[j].order)
                        .expect("a sequence runs");
                    let mut victim = self.running.remove(newest);
                    self.index_blocks(&mut victim, false);
                    self.blocks.release(&victim.table);
                    victim.reset_for_readmission();
                    self.preemptions += 1;
                    self.waiting.push_front(victim);
                    if newest < i {
                        i -= 1;
                    }
                }
            }
        }
    }

    /// Indexes the sequence's final full blocks in the radix tree (and with `finish`, its last
    /// partial one), so other requests read them.
    pub(super) fn index_blocks(&mut self, s: &mut Sequence, finish: bool) {
        let config = &self.shared.config;
        if s.options.mode == GenerationMode::Baseline || !config.keep_resident {
            return;
        }
        let mut limit = s.final_until().min(s.cacheable_until());
        if !config.reuse_repaired {
            limit = limit.min(s.exact_until);
        }
        self.blocks.index_sequence(
            &mut s.cursor,
            &s.tokens,
            &mut s.table,
            limit,
            s.exact_until,
            finish,
        );
    }

    /// Ends a sequence that generated what it should: indexes its blocks, records or stores its
    /// new exact chunks, frees its table and sends its result.
    ///
    /// Chunks the pool's tree now holds are only recorded by content ([`crate::resident_chunks`]): the
    /// store gets them on eviction or on a content hit, so resident K/V is never held twice. A
    /// warm (a request that generates nothing, made to fill the cache), a sequence whose blocks
    /// will not stay resident, and every sequence of an engine with a remote tier store theirs
    /// now.
    fn finish(&mut self, mut s: Sequence) {
        let rest = s.run.finish();
        if !rest.is_empty() {
            let token = *s.run.tokens().last().unwrap_or(&0);
            s.sink.send(Event::Token {
                token,
                text: rest,
                logprobs: None,
            });
        }
        self.index_blocks(&mut s, true);
        let t = Instant::now();
        if s.options.mode != GenerationMode::Baseline {
            let exact = s.filled.min(s.exact_until).min(s.cacheable_until());
            let tokens = &s.tokens[..exact];
            let shared = self.shared.clone();
            let writer = Self::writer(&shared, &s.namespace);
            // With a remote tier the store publishes what it gets to other engines, so a
            // sequence's chunks go there now even when its blocks stay resident.
            let resident = shared.config.keep_resident
                && !shared.store.has_remote()
                && s.options.max_new_tokens > 0
                && self
                    .blocks
                    .lookup(crate::plan::pool_scope(&s.namespace), tokens, false)
                    .tokens(self.blocks.block_size())
                    >= exact;
            let stored = if resident {
                self.resident
                    .record(tokens.into(), writer.missing_chunks(tokens));
                Ok((0, 0))
            } else {
                writer.store_sequence(&self.pool, &s.table, tokens, self.pool.head_shape())
            };
            match stored {
                Ok((chunks, bytes)) => {
                    s.stats.stored_chunks = chunks;
                    s.stats.stored_bytes = bytes;
                }
                Err(e) => return self.end_failed(s, e),
            }
        }
        s.stats.stages.store = t.elapsed();
        self.blocks.release(&s.table);
        self.requests += 1;
        let result = result_of(&mut s);
        self.publish();
        s.sink.state.finish();
        s.sink.send(Event::Finished(Box::new(Ok(result))));
    }
}

fn ms(d: std::time::Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// The result a finished sequence reports.
fn result_of(s: &mut Sequence) -> GenerationResult {
    let now = Instant::now();
    let st = &mut s.stats;
    let first = st.first_token_at;
    // From the first token to the last: storing comes after and is timed on its own.
    st.stages.decode = match (first, st.last_token_at) {
        (Some(f), Some(l)) => l.duration_since(f),
        _ => Default::default(),
    };
    let steps = s.run.tokens().len().saturating_sub(1);
    let cached = st.cached.total().min(s.prompt_len);
    GenerationResult {
        output_text: s.run.text().to_string(),
        token_ids: s.run.tokens().to_vec(),
        ttft_ms: ms(first.unwrap_or(now).duration_since(s.arrival)),
        total_ms: ms(now.duration_since(s.arrival)),
        tokens_per_sec: if steps == 0 || st.stages.decode.is_zero() {
            0.0
        } else {
            steps as f64 / st.stages.decode.as_secs_f64()
        },
        kv_reuse_ratio: cached as f64 / s.prompt_len as f64,
        prompt_tokens: s.prompt_len,
        cached_tokens: cached,
        cached: st.cached,
        recomputed_tokens: st.recomputed,
        prefill_passes: st.prefill_passes,
        exact_chunks: st.exact_chunks,
        approximate_chunks: st.approximate_chunks,
        preemptions: st.preemptions,
        stored_chunks: st.stored_chunks,
        stored_bytes: st.stored_bytes,
        stages: st.stages.clone(),
        first_logits: std::mem::take(&mut st.first_logits),
        logits: std::mem::take(&mut st.logits),
        logprobs: std::mem::take(&mut st.logprobs),
        stop_reason: s.run.stop(),
        decode_steps: st.decode_steps,
        decode_host_work: st.decode_host_work,
    }
}

#[cfg(test)]
mod tests {
    use super::PrefillBudget;
    use proptest::prelude::*;

    proptest! {
        /// Within what is left; whole when it fits; all that is left with a backlog; a slice
        /// waits only when waiting costs no step on the known work, and is cut only when cutting
        /// saves one; an untouched step always advances a prefill.
        #[test]
        fn a_slice_is_cut_only_when_that_saves_a_step(
            next in 1usize..300,
            after in 0usize..400,
            step in 1usize..130,
            used in 0usize..130,
            backlog: bool,
        ) {
            let b = PrefillBudget { step, left: step.saturating_sub(used).max(1) };
            let queued = next + after;
            let take = b.take(next, queued, backlog);
            prop_assert!(take == 0 || take == next.min(b.left));
            let steps = |rows: usize| rows.div_ceil(step);
            let saves_a_step = steps(queued) > steps(queued - b.left.min(queued));
            if next <= b.left || backlog || b.left == step {
                prop_assert_eq!(take, next.min(b.left));
            } else if saves_a_step {
                prop_assert_eq!(take, b.left, "waited, though cutting saves a step");
            } else {
                prop_assert_eq!(take, 0, "cut, though waiting costs no step");
            }
        }
    }
}
