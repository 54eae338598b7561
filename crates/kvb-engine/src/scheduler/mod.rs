//! The scheduler: one thread owns the K/V pool, its block manager and every running sequence,
//! and advances them together, one forward pass per step (continuous batching, as vLLM's and
//! SGLang's schedulers do).
//!
//! Each step:
//! 1. commands in (new requests, cancellations, reset, flush);
//! 2. admission: waiting requests are planned (pool tree, store, interior) oldest first; the
//!    policy decides whether each starts, waits for a running prefill or stops admission
//!    ([`policy::admission`]), and those that start get their blocks and cached K/V ([`admit`]);
//! 3. one ragged batch, as the policy plans it from a view of the running sequences
//!    ([`policy`]: pure, tested without a model): one row for each decoding sequence, then the
//!    next slice of each prefilling one, up to the step's token budget (chunked prefill; a slice
//!    is cut to fill a step only where that saves a step); reused runs are placed and repaired
//!    when the plan reaches them ([`place`]);
//! 4. one forward pass; each sequence whose row produced logits samples, streams, and may stop
//!    ([`step`]); finished sequences index their blocks and free their table. Their new chunks
//!    reach the chunk store when the pool evicts them, or when a prompt finds one by content
//!    ([`crate::resident_chunks`]): never two copies of resident K/V.
//!
//! A sequence that needs a block when none can be had preempts the newest running sequence: its
//! blocks are freed (what it had indexed stays resident) and it waits to be admitted again,
//! keeping what it generated.

mod admit;
mod place;
mod policy;
mod step;

use crate::blocks::{BlockManager, Removed};
use crate::request::Event;
use crate::resident_chunks::ResidentChunks;
use crate::result::PoolStats;
use crate::sequence::Sequence;
use crate::shared::Shared;
use crate::store_write::StoreWriter;
use crate::EngineError;
use crossbeam::channel::{Receiver, Sender};
use kvb_hash::{Key, Namespace};
use kvb_model::{KvPool, ModelBackend};
use std::collections::VecDeque;
use std::sync::Arc;

/// What the engine asks of the scheduler thread.
pub(crate) enum Command {
    /// New requests, taken in one step in this order.
    Submit(Vec<Sequence>),
    /// Something changed (a cancel): look at the sequences again.
    Wake,
    /// Forget every resident block and every stored chunk.
    Reset(Sender<Result<(), EngineError>>),
    /// Write every resident exact block the store lacks to the store, and the store to disk.
    Flush(Sender<Result<(), EngineError>>),
    /// Answer once every earlier command is taken and the stats are published.
    Sync(Sender<Result<(), EngineError>>),
    /// Stop: fail what runs or waits, and end the thread.
    Shutdown,
}

pub(crate) struct Scheduler<B: ModelBackend> {
    shared: Arc<Shared<B>>,
    pool: KvPool<B>,
    blocks: BlockManager,
    running: Vec<Sequence>,
    waiting: VecDeque<Sequence>,
    next_order: u64,
    requests: u64,
    preemptions: u64,
    peak_used: usize,
    /// Blocks below this are backed by memory (see [`Scheduler::prefault_ahead`]).
    prefaulted_until: usize,
    /// Finished sequences' chunks that only the pool holds, by content.
    resident: ResidentChunks,
}

/// How much of the pool's never-used blocks an idle scheduler backs with memory ahead of the next
/// requests: a warm request's few new blocks, a few times over, at little resident memory.
const PREFAULT_AHEAD_BYTES: usize = 16 << 20;
/// While sequences run, one block per step is backed until this many are ready: in a service
/// that is never idle, the next request's copy-on-write block then finds its memory mapped (a
/// block's page faults cost ~1 ms here, once, against a decode step's 15 ms or more).
const PREFAULT_WHILE_RUNNING: usize = 2;

impl<B: ModelBackend> Scheduler<B> {
    pub fn new(shared: Arc<Shared<B>>, pool: KvPool<B>, max_blocks: usize) -> Self {
        let block_size = pool.block_size();
        Scheduler {
            shared,
            pool,
            blocks: BlockManager::new(block_size, max_blocks),
            running: Vec::new(),
            waiting: VecDeque::new(),
            next_order: 0,
            requests: 0,
            preemptions: 0,
            peak_used: 0,
            prefaulted_until: 0,
            // Paths share prefixes; twice the pool's slots is room for what it can hold.
            resident: ResidentChunks::new(2 * max_blocks * block_size),
        }
    }

    /// The thread's loop, until [`Command::Shutdown`] or until every engine handle is gone.
    pub fn run(mut self, commands: Receiver<Command>) {
        loop {
            let idle = self.running.is_empty() && self.waiting.is_empty();
            let first = if idle {
                self.prefault_ahead(&commands);
                match commands.recv() {
                    Ok(c) => Some(c),
                    Err(_) => return self.shutdown(),
                }
            } else {
                None
            };
            for command in first.into_iter().chain(commands.try_iter()) {
                match command {
                    Command::Submit(seqs) => self.waiting.extend(seqs),
                    Command::Wake => {}
                    Command::Reset(reply) => {
                        let _ = reply.send(self.reset());
                    }
                    Command::Flush(reply) => {
                        let _ = reply.send(self.flush());
                    }
                    Command::Sync(reply) => {
                        self.drop_cancelled();
                        self.publish();
                        let _ = reply.send(Ok(()));
                    }
                    Command::Shutdown => return self.shutdown(),
                }
            }
            self.drop_cancelled();
            self.admit();
            if !self.running.is_empty() {
                self.step();
                self.prefault_blocks(PREFAULT_WHILE_RUNNING, 1, None);
            }
            self.publish();
        }
    }

    /// While nothing runs, backs the next blocks the allocator will hand out with memory, one
    /// block at a time until a command arrives: on the CPU a fresh block's first write otherwise
    /// pays a page fault per 4 KiB on a request's path (1.2 ms of a warm request's 1.4 ms
    /// assembly, for the copy-on-write of its partial block).
    fn prefault_ahead(&mut self, commands: &Receiver<Command>) {
        let ahead = (PREFAULT_AHEAD_BYTES / self.pool.block_bytes().max(1)).max(1);
        self.prefault_blocks(ahead, usize::MAX, Some(commands));
    }

    /// Backs at most `most` of the first `ahead` never-used blocks that are not yet backed,
    /// stopping early when a command waits in `commands`.
    fn prefault_blocks(&mut self, ahead: usize, most: usize, commands: Option<&Receiver<Command>>) {
        let unused = self.blocks.allocator().never_used();
        let (first, end) = (unused.start as usize, unused.end as usize);
        let todo = first.max(self.prefaulted_until)..end.min(first + ahead);
        for block in todo.take(most) {
            let waiting = commands.is_some_and(|c| !c.is_empty());
            if waiting || self.pool.prefault(block).is_err() {
                return;
            }
            self.prefaulted_until = block + 1;
        }
    }

    /// Fails every request still queued or running.
    fn shutdown(mut self) {
        for seq in self.running.drain(..).chain(self.waiting.drain(..)) {
            seq.sink.state.finish();
            seq.sink
                .send(Event::Finished(Box::new(Err(EngineError::Stopped))));
        }
    }

    /// Ends cancelled sequences: their blocks are freed at once.
    fn drop_cancelled(&mut self) {
        let cancelled = |s: &Sequence| s.sink.state.is_cancelled();
        for seq in extract(&mut self.waiting, cancelled) {
            self.end_failed(seq, EngineError::Cancelled);
        }
        let mut i = 0;
        while i < self.running.len() {
            if cancelled(&self.running[i]) {
                let seq = self.running.remove(i);
                self.end_failed(seq, EngineError::Cancelled);
            } else {
                i += 1;
            }
        }
    }

    /// Ends a sequence with an error, freeing its blocks.
    fn end_failed(&mut self, seq: Sequence, error: EngineError) {
        self.blocks.release(&seq.table);
        self.requests += 1;
        self.publish();
        seq.sink.state.finish();
        seq.sink.send(Event::Finished(Box::new(Err(error))));
    }

    /// Writes the exact paths the tree evicts that the store lacks (evicted blocks go to the
    /// store's tiers instead of being lost).
    fn write_back(shared: &Shared<B>, pool: &KvPool<B>, shape: (usize, usize), removed: &Removed) {
        if removed.approximate {
            return;
        }
        let namespace = Namespace::from_id(Key(removed.scope.0));
        let writer = Self::writer(shared, &namespace);
        // Best effort: the store refusing a chunk (its budget) only loses a cache entry.
        let _ = writer.store_sequence(pool, &removed.path_blocks, &removed.path_tokens, shape);
    }

    /// A writer of chunks keyed under `namespace` (a sequence's, or the scope of a tree path:
    /// [`crate::plan::pool_scope`] holds its namespace's key).
    fn writer<'a>(shared: &'a Shared<B>, namespace: &'a Namespace) -> StoreWriter<'a> {
        StoreWriter {
            store: &shared.store,
            namespace,
            chunking: &shared.chunking,
            format: shared.store_format,
        }
    }

    fn reset(&mut self) -> Result<(), EngineError> {
        self.blocks.clear(&mut |_| {});
        self.resident.clear();
        self.shared.store.clear()?;
        // Running sequences keep their blocks; they no longer extend tree paths.
        for s in &mut self.running {
            s.cursor = crate::blocks::IndexCursor::at_root(s.cursor.scope);
        }
        Ok(())
    }

    fn flush(&mut self) -> Result<(), EngineError> {
        let shared = self.shared.clone();
        let shape = self.pool.head_shape();
        let mut result = Ok(());
        // Every leaf's path covers its ancestors: storing the leaves stores everything.
        let mut tree = self.blocks.tree().clone();
        self.resident.clear();
        for r in tree.clear() {
            if !r.approximate && result.is_ok() {
                let namespace = Namespace::from_id(Key(r.scope.0));
                result = Self::writer(&shared, &namespace)
                    .store_sequence(&self.pool, &r.path_blocks, &r.path_tokens, shape)
                    .map(|_| ());
            }
        }
        result?;
        Ok(self.shared.store.flush()?)
    }

    /// Updates the stats the engine reads (after each step, and before a request's last event,
    /// so its caller sees the pool as the request left it).
    pub(super) fn publish(&mut self) {
        let a = self.blocks.allocator();
        self.peak_used = self.peak_used.max(a.used());
        let tree = self.blocks.tree();
        let stats = PoolStats {
            block_size: self.pool.block_size(),
            block_bytes: self.pool.block_bytes(),
            blocks_total: a.max_blocks(),
            blocks_used: a.used(),
            blocks_shared: a.shared(),
            blocks_resident: tree.len(),
            blocks_approximate: tree.approximate(),
            peak_blocks_used: self.peak_used,
            bytes_saved_by_sharing: a.extra_references() * self.pool.block_bytes(),
            resident_sequences: tree.leaves(),
            running: self.running.len(),
            waiting: self.waiting.len(),
            evictions: self.blocks.counters().evicted,
            preemptions: self.preemptions,
            requests: self.requests,
        };
        *self.shared.stats.lock().unwrap_or_else(|e| e.into_inner()) = stats;
    }
}

/// Removes and returns the items of `queue` that `pick` selects, keeping the others in order.
fn extract(queue: &mut VecDeque<Sequence>, pick: impl Fn(&Sequence) -> bool) -> Vec<Sequence> {
    let mut out = Vec::new();
    let mut keep = VecDeque::with_capacity(queue.len());
    for s in queue.drain(..) {
        if pick(&s) {
            out.push(s);
        } else {
            keep.push_back(s);
        }
    }
    *queue = keep;
    out
}
