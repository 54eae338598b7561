//! One scheduler step: a ragged batch over every running sequence, one forward pass, then
//! sampling, streaming, indexing, finishing.

use super::policy::{
    plan_step, preemption_victims, Budgets, Holder, Pending, SeqView, Slice, StepPlan,
};
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
        let mut failed: Vec<(usize, EngineError)> = Vec::new();
        let plan = self.place_reached_runs(&mut running, &mut failed);
        let mut members: Vec<Member> = Vec::new();
        for (i, slice) in plan.slices {
            let s = &mut running[i];
            let rows = match slice {
                Slice::Decode => {
                    members.push(Member {
                        seq: i,
                        slots: vec![s.filled],
                        decode: true,
                        sample: true,
                    });
                    continue;
                }
                Slice::Prefill { rows, .. } => rows,
            };
            let Some(Work::Compute(mut slots)) = s.work.pop_front() else {
                unreachable!("the plan's places are done: a slice computes");
            };
            let rest = slots.split_off(rows);
            if !rest.is_empty() {
                s.work.push_front(Work::Compute(rest));
            }
            s.stats.prefill_passes += 1;
            let last = *slots.last().expect("a slice has rows");
            s.stats.prefill_started.get_or_insert_with(Instant::now);
            members.push(Member {
                seq: i,
                sample: s.work.is_empty() && last + 1 == s.prefill_len && s.run.stop().is_none(),
                slots,
                decode: false,
            });
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

    /// Places the reused runs the policy's plan reaches, oldest first, planning again after
    /// each sequence's (a placed run's repair adds rows to the slice after it), and returns the
    /// plan of the step, every place done. A sequence whose place fails is in `failed` and out
    /// of the plan.
    fn place_reached_runs(
        &mut self,
        running: &mut [Sequence],
        failed: &mut Vec<(usize, EngineError)>,
    ) -> StepPlan {
        let config = &self.shared.config;
        let budgets = Budgets {
            max_batch_tokens: config.max_batch_tokens,
            prefill_tokens_while_decoding: config.prefill_tokens_while_decoding,
        };
        let backlog = !self.waiting.is_empty();
        loop {
            let views: Vec<SeqView> = running
                .iter()
                .enumerate()
                .map(|(i, s)| match failed.iter().any(|(f, _)| *f == i) {
                    true => SeqView {
                        decoding: false,
                        work: Vec::new(),
                    },
                    false => view(s),
                })
                .collect();
            let plan = plan_step(&views, budgets, backlog);
            let first = plan.slices.iter().find_map(|&(i, s)| match s {
                Slice::Prefill { places, .. } if places > 0 => Some((i, places)),
                _ => None,
            });
            let Some((i, places)) = first else {
                return plan;
            };
            let s = &mut running[i];
            for _ in 0..places {
                let Some(Work::Place { pieces, seams }) = s.work.pop_front() else {
                    unreachable!("the plan counts the places at the front");
                };
                if let Err(e) = self.place(s, pieces, seams) {
                    failed.push((i, e));
                    break;
                }
            }
        }
    }

    /// Gives every decoding sequence the block its next token needs, first preempting the
    /// sequences [`preemption_victims`] names (their blocks freed, they wait to be admitted
    /// again). Should the pool give fewer blocks than it counted, the rule runs again with no
    /// room assumed, so at least one more sequence goes.
    fn make_room_for_decoding(&mut self) {
        let mut short = false;
        loop {
            let bs = self.blocks.block_size();
            let views: Vec<Holder> = self
                .running
                .iter()
                .map(|s| Holder {
                    order: s.order,
                    needs_block: needs_block(s, bs),
                    blocks: &s.table,
                })
                .collect();
            let available = if short { 0 } else { self.blocks.available() };
            // A block's references are its tables' and, once indexed, the tree's.
            let tables = |b| {
                let tree = self.blocks.allocator().is_in_tree(b);
                self.blocks.refcount(b).saturating_sub(u32::from(tree))
            };
            let victims = preemption_victims(&views, available, tables);
            self.preempt(&victims);
            short = !self.give_decoders_blocks();
            if !short {
                return;
            }
        }
    }

    /// Preempts the running sequences at `victims` (indices, newest first): indexes and frees
    /// their blocks and puts them at the front of the queue, the oldest first.
    fn preempt(&mut self, victims: &[usize]) {
        for (k, &v) in victims.iter().enumerate() {
            // Where `v` stands once the victims before it have left.
            let shift = victims[..k].iter().filter(|&&p| p < v).count();
            let mut victim = self.running.remove(v - shift);
            self.index_blocks(&mut victim, false);
            self.blocks.release(&victim.table);
            victim.reset_for_readmission();
            self.preemptions += 1;
            self.waiting.push_front(victim);
        }
    }

    /// Allocates the next block of every decoding sequence whose table is full; false when the
    /// pool runs out first.
    fn give_decoders_blocks(&mut self) -> bool {
        let bs = self.blocks.block_size();
        for i in 0..self.running.len() {
            if !needs_block(&self.running[i], bs) {
                continue;
            }
            match self.allocate(1) {
                Some(b) => self.running[i].table.extend(b),
                None => return false,
            }
        }
        true
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

/// `s` as the scheduling policy sees it.
fn view(s: &Sequence) -> SeqView {
    SeqView {
        decoding: s.decoding(),
        work: s
            .work
            .iter()
            .map(|w| match w {
                Work::Place { .. } => Pending::Place,
                Work::Compute(slots) => Pending::Compute(slots.len()),
            })
            .collect(),
    }
}

/// Whether a decoding sequence's table is full: its next token needs a fresh block.
fn needs_block(s: &Sequence, block_size: usize) -> bool {
    s.decoding() && s.filled / block_size >= s.table.len()
}
