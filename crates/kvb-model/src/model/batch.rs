//! [`ForwardBatch`]: the rows one forward pass runs, from any number of sequences in a pool.

use crate::error::{ModelError, Result};
use crate::model::ModelBackend;
use crate::KvPool;
use kvb_attn::PagedSeq;

/// The rows of one sequence in a [`ForwardBatch`].
#[derive(Debug, Clone)]
pub struct SeqRows<'a> {
    /// The sequence's block table in the pool.
    pub blocks: &'a [u32],
    /// The logical slot of each of its rows, increasing: the row's K/V is written there in every
    /// layer, and the row sees the sequence's slots `0..=slot` (the K/V already there, and that of
    /// its rows at lower slots written in the same pass). A causal prefill chunk, a decode step
    /// and CacheBlend's scattered recompute are all lists of slots.
    pub slots: &'a [usize],
    /// The rows are decode steps (attention may run them by another kernel; see
    /// [`kvb_attn::PagedSeq::decode`]).
    pub decode: bool,
}

/// One forward pass over the rows of several sequences (a ragged batch): the rows of each
/// sequence follow each other in `tokens` and `positions`, in the order of `seqs`.
#[derive(Debug, Clone)]
pub struct ForwardBatch<'a> {
    /// Token of each row.
    pub tokens: &'a [u32],
    /// RoPE position of each row.
    pub positions: &'a [usize],
    /// The sequences, in row order.
    pub seqs: &'a [SeqRows<'a>],
}

/// A batch resolved against its pool: where each row's K/V goes, and the attention view.
pub(crate) struct Layout<'a> {
    /// Pool slot of each row.
    pub write: Vec<usize>,
    pub paged: Vec<PagedSeq<'a>>,
}

impl<'a> ForwardBatch<'a> {
    /// Number of rows.
    pub fn rows(&self) -> usize {
        self.tokens.len()
    }

    /// Checks the batch against `pool` and resolves every row's pool slot.
    pub(crate) fn layout<B: ModelBackend>(&self, pool: &KvPool<B>) -> Result<Layout<'a>> {
        let n: usize = self.seqs.iter().map(|s| s.slots.len()).sum();
        if n != self.tokens.len() {
            return Err(ModelError::Forward(format!(
                "{} tokens for {n} slots of {} sequences",
                self.tokens.len(),
                self.seqs.len()
            )));
        }
        let mut write = Vec::with_capacity(n);
        let mut paged = Vec::with_capacity(self.seqs.len());
        for (i, s) in self.seqs.iter().enumerate() {
            if s.slots.windows(2).any(|w| w[0] >= w[1]) {
                return Err(ModelError::Forward(format!(
                    "the slots of sequence {i} must increase"
                )));
            }
            let start = write.len();
            write.extend(pool.pool_slots(s.blocks, s.slots.iter().copied())?);
            paged.push(PagedSeq {
                blocks: s.blocks,
                rows: start..write.len(),
                last_slot: s.slots,
                decode: s.decode,
            });
        }
        // Shared blocks are only ever read: two rows writing one slot means a block table points
        // into another sequence's blocks.
        let mut sorted = write.clone();
        sorted.sort_unstable();
        if let Some(w) = sorted.windows(2).find(|w| w[0] == w[1]) {
            return Err(ModelError::Forward(format!(
                "two rows of the batch write pool slot {}",
                w[0]
            )));
        }
        Ok(Layout { write, paged })
    }
}
