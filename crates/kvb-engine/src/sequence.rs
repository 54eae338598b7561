//! [`Sequence`]: one request inside the scheduler, from its arrival to its last token.

use crate::blocks::{BlockId, IndexCursor};
use crate::config::GenerateOptions;
use crate::plan::Piece;
use crate::request::Sink;
use crate::result::{CachedTokens, StageTimes};
use kvb_hash::Namespace;
use kvb_model::generate::{Continuation, TokenLogprobs};
use kvb_model::HostWork;
use std::collections::VecDeque;
use std::time::Instant;

/// Prefill work still to do, in slot order.
#[derive(Debug)]
pub(crate) enum Work {
    /// Compute these slots (increasing) through every layer: live tokens, and the repaired slots
    /// of the reused span before them.
    Compute(Vec<usize>),
    /// Place a run of reused chunks (copy, re-rotate) and pick the slots to repair; `seams` are
    /// where K/V computed in different contexts meets.
    Place {
        pieces: Vec<Piece>,
        seams: Vec<usize>,
    },
}

impl Work {
    /// The first slot the work touches.
    pub fn first_slot(&self) -> usize {
        match self {
            Work::Compute(slots) => slots.first().copied().unwrap_or(usize::MAX),
            Work::Place { pieces, .. } => pieces.first().map_or(usize::MAX, |p| p.start),
        }
    }
}

/// Counters of one sequence, for its result.
#[derive(Debug, Default)]
pub(crate) struct SeqStats {
    pub cached: CachedTokens,
    pub recomputed: usize,
    pub exact_chunks: usize,
    pub approximate_chunks: usize,
    pub preemptions: usize,
    pub stored_chunks: usize,
    pub stored_bytes: usize,
    pub stages: StageTimes,
    pub first_logits: Vec<f32>,
    /// Every generated position's logits, when the request keeps them.
    pub logits: Vec<Vec<f32>>,
    /// Every generated token's log-probabilities, when the request asks.
    pub logprobs: Vec<TokenLogprobs>,
    pub first_token_at: Option<Instant>,
    pub last_token_at: Option<Instant>,
    pub prefill_started: Option<Instant>,
    /// Forward passes that computed some of its prompt rows.
    pub prefill_passes: usize,
    /// Steps in which it decoded, and the host's work for their whole passes.
    pub decode_steps: usize,
    pub decode_host_work: HostWork,
}

/// One request in the scheduler.
pub(crate) struct Sequence {
    /// Order of admission (older first; the newest is preempted first).
    pub order: u64,
    pub sink: Sink,
    pub options: GenerateOptions,
    /// When the request arrived (TTFT counts from here), and when it reached the scheduler.
    pub arrival: Instant,
    pub submitted: Instant,
    /// The prompt, then every generated token.
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    /// Tokens whose K/V must exist before the next token is sampled: the prompt, or after a
    /// preemption the prompt and what was generated so far.
    pub prefill_len: usize,
    /// The block table.
    pub table: Vec<BlockId>,
    /// Slots `0..filled` hold K/V (placed or computed).
    pub filled: usize,
    pub work: VecDeque<Work>,
    /// Slots from here on do not hold exactly what a full prefill computes.
    pub exact_until: usize,
    /// The namespace its cache keys come from (the engine's, or scoped per
    /// [`GenerateOptions::cache_scope`]).
    pub namespace: Namespace,
    /// How far the table is indexed in the radix tree (in the namespace's scope).
    pub cursor: IndexCursor,
    pub run: Continuation,
    pub stats: SeqStats,
}

impl Sequence {
    /// A request waiting for admission.
    pub fn new(
        sink: Sink,
        tokens: Vec<u32>,
        options: GenerateOptions,
        arrival: Instant,
        run: Continuation,
        namespace: Namespace,
    ) -> Self {
        let n = tokens.len();
        Sequence {
            order: 0,
            sink,
            options,
            arrival,
            submitted: Instant::now(),
            tokens,
            prompt_len: n,
            prefill_len: n,
            table: Vec::new(),
            filled: 0,
            work: VecDeque::new(),
            exact_until: usize::MAX,
            namespace,
            cursor: IndexCursor::at_root(crate::plan::pool_scope(&namespace)),
            run,
            stats: SeqStats::default(),
        }
    }

    /// Whether the prefill is done and the sequence generates one token per step.
    pub fn decoding(&self) -> bool {
        self.work.is_empty() && self.filled >= self.prefill_len
    }

    /// Slots below this hold final K/V (no repair pending on them).
    pub fn final_until(&self) -> usize {
        self.work
            .iter()
            .map(Work::first_slot)
            .min()
            .unwrap_or(usize::MAX)
            .min(self.filled)
    }

    /// Slots whose K/V may be kept for reuse (the prompt only, when the request says so).
    pub fn cacheable_until(&self) -> usize {
        match self.options.cacheable_prefix_len {
            Some(limit) => limit.min(self.prompt_len),
            None => usize::MAX,
        }
    }

    /// Forgets the sequence's blocks and progress after a preemption: it will be admitted again
    /// and prefill what it has so far (prompt and generated tokens) before continuing.
    pub fn reset_for_readmission(&mut self) {
        self.table.clear();
        self.filled = 0;
        self.work.clear();
        self.exact_until = usize::MAX;
        self.cursor = IndexCursor::at_root(self.cursor.scope);
        self.prefill_len = self.tokens.len();
        self.stats.preemptions += 1;
    }
}
