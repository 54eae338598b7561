//! [`Engine`]: a model, its tokenizer, a K/V pool and a chunk store, serving requests from any
//! number of threads through one scheduler.

use crate::config::{EngineConfig, GenerateOptions, GenerationMode, KvPrecision};
use crate::fingerprint::model_fingerprint;
use crate::grammar::Grammars;
use crate::remote_prefetch::prefetch_remote;
use crate::request::{EventSink, Request, RequestHandle, RequestState, RequestTicket, Sink};
use crate::result::{GenerationResult, PoolStats, WarmResult};
use crate::scheduler::{Command, Scheduler};
use crate::sequence::Sequence;
use crate::shared::Shared;
use crate::EngineError;
use crossbeam::channel::{unbounded, Sender};
use kvb_chunk::{boundary_tokens, ChunkConfig, ChunkStrategy};
use kvb_hash::Namespace;
use kvb_model::generate::{eos_ids, Continuation, GenerateParams, StreamEvent};
use kvb_model::{
    load_pretrained, ActivationPrecision, FloatDtype, KvPool, LoadOptions, Model, ModelBackend,
    Tokenizer,
};
use kvb_store::{ChunkStore, DiskConfig, KvFormat, StoreConfig, StoreStats};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

/// A model with a K/V pool and a chunk store: the kvb engine.
///
/// `Engine` is `Send + Sync`: any number of threads may submit requests at once; one scheduler
/// thread runs them together (continuous batching) and streams each its events.
pub struct Engine<B: ModelBackend> {
    shared: Arc<Shared<B>>,
    commands: Sender<Command>,
    worker: Option<JoinHandle<()>>,
    next_id: AtomicU64,
    max_blocks: usize,
    /// What the pool holds, and so what one block of it weighs.
    pool_precision: FloatDtype,
    block_bytes: usize,
}

impl<B: ModelBackend> Engine<B> {
    /// Loads the model at `path` (a HuggingFace folder or a `.gguf` file) and opens its store.
    pub fn from_pretrained(
        path: &Path,
        config: EngineConfig,
        device: &B::Device,
    ) -> Result<Self, EngineError> {
        let m = load_pretrained::<B>(
            path,
            LoadOptions {
                strict: config.strict,
                weights: config.weights,
                activations: config.activations,
            },
            device,
            &mut |_, _| {},
        )?;
        let fingerprint =
            model_fingerprint(path, m.format, m.model.config(), m.model.weight_precision())?;
        Self::new(m.model, m.tokenizer, &fingerprint, config)
    }

    /// An engine over a loaded model; `fingerprint` must identify its weights (see
    /// [`crate::model_fingerprint`]).
    pub fn new(
        model: Model<B>,
        tokenizer: Tokenizer,
        fingerprint: &[u8],
        config: EngineConfig,
    ) -> Result<Self, EngineError> {
        check_config(&config)?;
        let strategy = if config.boundary_window == 0 {
            ChunkStrategy::Fixed
        } else {
            let vocab = tokenizer.inner().get_vocab(true);
            ChunkStrategy::BoundaryWindow {
                window: config.boundary_window,
                boundary_tokens: boundary_tokens(vocab.iter().map(|(t, &id)| (id, t.as_str()))),
            }
        };
        let chunking = ChunkConfig {
            size: config.chunk_size,
            min_tail: config.min_tail,
            strategy,
        };
        // The pool's precision decides the K/V every sequence computes (attention reads it back),
        // so two precisions never share a key.
        let precision = config.pool_dtype.resolve(&model);
        let mut namespace = Namespace::builder()
            .model_fingerprint(fingerprint)
            .dtype(precision.as_str())
            .chunking(&chunking.describe())
            .extra("kv_precision", config.kv_precision.as_str());
        // 8-bit activations compute other K/V than the f32 products (f32 keeps the namespace it
        // always had, so caches written before this setting existed stay valid); their tag
        // names the revision of their arithmetic.
        if model.activation_precision() != ActivationPrecision::F32 {
            namespace = namespace.extra("activations", &model.activation_precision().cache_tag());
        }
        // So does a backend computing in half precision (a GPU's `--dtype`), whatever the pool
        // holds: an f16 pool filled by f32 arithmetic is not one filled by f16 arithmetic.
        let float = FloatDtype::native::<B>();
        if float != FloatDtype::F32 {
            namespace = namespace.extra("float", float.as_str());
        }
        let namespace = namespace.build();
        let store = ChunkStore::new(StoreConfig {
            max_ram_bytes: config.max_cache_bytes,
            eviction: config.eviction,
            disk: config.disk_dir.as_ref().map(|d| {
                DiskConfig::new(d.join(format!("{}", namespace.id())), config.disk_max_bytes)
            }),
            min_prefix_len: 1,
            remote: config.remote_cache.clone(),
        })?;
        let c = model.config();
        let shape = (c.num_kv_heads, c.head_dim);
        let block_bytes =
            KvPool::<B>::bytes_per_block(c.num_layers, shape, config.block_size, precision);
        let max_blocks = config.pool_bytes() / block_bytes;
        if max_blocks == 0 {
            return Err(EngineError::Config(format!(
                "a pool of {} bytes holds no block of {} bytes ({} tokens)",
                config.pool_bytes(),
                block_bytes,
                config.block_size
            )));
        }
        // Made whole where that costs only what is written (the CPU), up to the machine's
        // memory: the kernel refuses a larger mapping outright (a budget beyond it grows in
        // steps from there, as elsewhere).
        let reserved = if B::pool_reserves_budget() {
            max_blocks.min(crate::config::physical_memory().unwrap_or(usize::MAX) / block_bytes)
        } else {
            0
        };
        let pool = KvPool::<B>::with_precision(
            precision,
            c.num_layers,
            shape,
            config.block_size,
            reserved,
            model.device(),
        )?;
        let eos = eos_ids(&c.eos_token_ids, &tokenizer);
        let store_format = match (config.kv_precision, precision) {
            (KvPrecision::F32, FloatDtype::F16) => KvFormat::F16,
            (KvPrecision::F32, FloatDtype::Bf16) => KvFormat::Bf16,
            (stored, _) => stored.format(),
        };
        let shared = Arc::new(Shared {
            model,
            tokenizer,
            store,
            namespace,
            chunking,
            config,
            store_format,
            eos,
            fingerprint: fingerprint.to_vec(),
            stats: Mutex::new(PoolStats::default()),
            grammars: Grammars::default(),
        });
        let (commands, inbox) = unbounded();
        let scheduler = Scheduler::new(shared.clone(), pool, max_blocks);
        let worker = std::thread::Builder::new()
            .name("kvb-scheduler".into())
            .spawn(move || scheduler.run(inbox))
            .map_err(|e| EngineError::Io {
                what: "starting the scheduler thread".into(),
                source: e,
            })?;
        Ok(Engine {
            shared,
            commands,
            worker: Some(worker),
            next_id: AtomicU64::new(1),
            max_blocks,
            pool_precision: precision,
            block_bytes,
        })
    }

    /// A new engine over the same weights (shared, not copied) with other settings and an
    /// empty cache: to compare settings side by side without loading the model again.
    pub fn sibling(&self, config: EngineConfig) -> Result<Self, EngineError> {
        Self::new(
            self.shared.model.clone(),
            self.shared.tokenizer.clone(),
            &self.shared.fingerprint,
            config,
        )
    }

    /// An engine over `model`, a variant of this one's (its weights rounded, say), with other
    /// settings; `variant` names the change and keeps its keys apart from this engine's.
    pub fn variant(
        &self,
        model: Model<B>,
        variant: &str,
        config: EngineConfig,
    ) -> Result<Self, EngineError> {
        let mut fingerprint = self.shared.fingerprint.clone();
        fingerprint.extend_from_slice(b"\0variant:");
        fingerprint.extend_from_slice(variant.as_bytes());
        Self::new(model, self.shared.tokenizer.clone(), &fingerprint, config)
    }

    /// The model.
    pub fn model(&self) -> &Model<B> {
        &self.shared.model
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.shared.tokenizer
    }

    /// The engine's settings.
    pub fn config(&self) -> &EngineConfig {
        &self.shared.config
    }

    /// The element type of the K/V pool (the configured [`crate::PoolDtype`], resolved).
    pub fn pool_precision(&self) -> FloatDtype {
        self.pool_precision
    }

    /// The namespace every key of this engine is derived from.
    pub fn namespace(&self) -> &Namespace {
        &self.shared.namespace
    }

    /// The chunk store's counters and sizes.
    pub fn cache_stats(&self) -> StoreStats {
        self.shared.store.stats()
    }

    /// The K/V pool's state, as of the scheduler's last step.
    pub fn paged_stats(&self) -> PoolStats {
        let mut s = self
            .shared
            .stats
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        // Before the first step nothing is published yet; the shape is known.
        if s.blocks_total == 0 {
            s.block_size = self.shared.config.block_size;
            s.block_bytes = self.block_bytes;
            s.blocks_total = self.max_blocks;
        }
        s
    }

    fn round_trip(
        &self,
        make: impl FnOnce(Sender<Result<(), EngineError>>) -> Command,
    ) -> Result<(), EngineError> {
        let (tx, rx) = crossbeam::channel::bounded(1);
        self.commands
            .send(make(tx))
            .map_err(|_| EngineError::Stopped)?;
        rx.recv().map_err(|_| EngineError::Stopped)?
    }

    /// Forgets every resident block and every stored chunk (running requests finish on their own
    /// blocks).
    pub fn reset_cache(&self) -> Result<(), EngineError> {
        self.round_trip(Command::Reset)
    }

    /// Writes every resident exact block the chunk store lacks to it, and the store's RAM tier to
    /// its disk tier when it has one: what the engine learned survives the process.
    pub fn flush(&self) -> Result<(), EngineError> {
        self.round_trip(Command::Flush)
    }

    /// Queues a request and returns its handle once it is queued. Bad requests are refused here,
    /// before they queue: an empty prompt, one longer than the context, one the pool could never
    /// hold. With a remote tier, the prompt's chunks are first fetched from it on this thread
    /// (one round trip; a remote that is down costs nothing, see [`kvb_store::remote`]).
    pub fn submit(&self, request: Request) -> Result<RequestHandle, EngineError> {
        let (events_tx, events) = unbounded();
        let ticket = self.submit_to(request, events_tx)?;
        Ok(RequestHandle { ticket, events })
    }

    /// [`Engine::submit`] with the events pushed to `sink` as they happen (a server's async
    /// channel: no thread waits per request). The ticket cancels the request when dropped; a
    /// sink whose listener is gone cancels it too. If the engine stops, the sink is dropped
    /// without a `Finished` event.
    pub fn submit_to(
        &self,
        request: Request,
        sink: impl EventSink + 'static,
    ) -> Result<RequestTicket, EngineError> {
        let (seq, ticket) = self.prepare(request, Box::new(sink))?;
        self.commands
            .send(Command::Submit(vec![seq]))
            .map_err(|_| EngineError::Stopped)?;
        Ok(ticket)
    }

    /// Queues several requests at once: the scheduler takes them in one step, in order, so they
    /// are admitted together where the pool has room (one request per [`Engine::submit`] call
    /// may reach the scheduler a step apart). Each is checked as [`Engine::submit`] checks it; a
    /// bad one gets its error and the others still queue.
    pub fn submit_batch(&self, requests: Vec<Request>) -> Vec<Result<RequestHandle, EngineError>> {
        let mut queued = Vec::new();
        let handles: Vec<Result<RequestHandle, EngineError>> = requests
            .into_iter()
            .map(|r| {
                let (events_tx, events) = unbounded();
                let (seq, ticket) = self.prepare(r, Box::new(events_tx))?;
                queued.push(seq);
                Ok(RequestHandle { ticket, events })
            })
            .collect();
        if !queued.is_empty() && self.commands.send(Command::Submit(queued)).is_err() {
            return handles
                .into_iter()
                .map(|h| h.and(Err(EngineError::Stopped)))
                .collect();
        }
        handles
    }

    /// Checks a request and makes its sequence and handle (see [`Engine::submit`]).
    fn prepare(
        &self,
        request: Request,
        events: Box<dyn EventSink>,
    ) -> Result<(Sequence, RequestTicket), EngineError> {
        let n = request.tokens.len();
        if n == 0 {
            return Err(EngineError::EmptyPrompt);
        }
        let context = self.shared.model.config().max_position_embeddings;
        if n >= context {
            return Err(EngineError::PromptTooLong { tokens: n, context });
        }
        let vocab = self.shared.model.config().vocab_size;
        let forced = &request.options.forced_tokens;
        if let Some(&bad) = request
            .tokens
            .iter()
            .chain(forced)
            .find(|&&t| t as usize >= vocab)
        {
            return Err(EngineError::Config(format!(
                "token id {bad} is outside the vocabulary of {vocab}"
            )));
        }
        // Its largest footprint: the prompt and every token it may generate, within the context.
        let tokens = (n + request.options.max_new_tokens).min(context) + 1;
        let needed = tokens.div_ceil(self.shared.config.block_size);
        if needed > self.max_blocks {
            return Err(EngineError::PoolTooSmall {
                tokens,
                needed_blocks: needed,
                pool_blocks: self.max_blocks,
            });
        }
        let shared = &self.shared;
        // Compiled before the remote round trip: a schema that cannot be followed fails fast.
        let constraint = match &request.options.grammar {
            Some(grammar) => Some(shared.grammars.constraint(
                grammar,
                &shared.tokenizer,
                &shared.eos,
                vocab,
            )?),
            None => None,
        };
        let namespace = match &request.options.cache_scope {
            Some(scope) => shared.namespace.scoped(scope),
            None => shared.namespace,
        };
        prefetch_remote(
            &shared.store,
            &namespace,
            &shared.chunking,
            &request.tokens,
            request.options.mode,
        )?;
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let state = Arc::new(RequestState::default());
        let params = GenerateParams {
            max_new_tokens: request.options.max_new_tokens,
            sampling: request.options.sampling.clone(),
            stop_strings: request.options.stop_strings.clone(),
            stop_at_eos: true,
        };
        let mut run = Continuation::new(params, self.shared.eos.clone())
            .with_prompt(&request.tokens)
            .forcing(request.options.forced_tokens.clone());
        if let Some(constraint) = constraint {
            run = run.constrained(constraint);
        }
        let sink = Sink {
            events,
            state: state.clone(),
        };
        let seq = Sequence::new(
            sink,
            request.tokens,
            request.options,
            request.arrival,
            run,
            namespace,
        );
        let wake = self.commands.clone();
        let ticket = RequestTicket {
            id,
            state,
            wake: Box::new(move || {
                let _ = wake.send(Command::Wake);
            }),
        };
        Ok((seq, ticket))
    }

    /// Generates from `prompt` with K/V reuse per `options.mode`, streaming through `on_token`.
    pub fn generate(
        &self,
        prompt: &str,
        options: &GenerateOptions,
        on_token: &mut dyn FnMut(StreamEvent<'_>),
    ) -> Result<GenerationResult, EngineError> {
        let arrival = Instant::now();
        let tokens = self.shared.tokenizer.encode(prompt, false)?;
        let tokenize = arrival.elapsed();
        let mut r = self
            .submit(Request {
                tokens,
                options: options.clone(),
                arrival,
            })?
            .wait_streaming(on_token)?;
        r.stages.tokenize = tokenize;
        Ok(r)
    }

    /// As [`Engine::generate`], from token ids.
    pub fn generate_tokens(
        &self,
        tokens: &[u32],
        options: &GenerateOptions,
        on_token: &mut dyn FnMut(StreamEvent<'_>),
    ) -> Result<GenerationResult, EngineError> {
        self.submit(Request::new(tokens.to_vec(), options.clone()))?
            .wait_streaming(on_token)
    }

    /// Serves several prompts as one batch: all are submitted at once and run together (those
    /// sharing a prefix share its blocks); results come back in the given order. TTFT counts
    /// from the batch's arrival.
    pub fn generate_batch(
        &self,
        prompts: &[&str],
        options: &GenerateOptions,
    ) -> Vec<Result<GenerationResult, EngineError>> {
        let arrival = Instant::now();
        // Prompts that tokenize go in one batch; the others keep their error in their place.
        let mut requests = Vec::new();
        let mut errors: Vec<Option<EngineError>> = Vec::new();
        for p in prompts {
            match self.shared.tokenizer.encode(p, false) {
                Ok(tokens) => {
                    requests.push(Request {
                        tokens,
                        options: options.clone(),
                        arrival,
                    });
                    errors.push(None);
                }
                Err(e) => errors.push(Some(e.into())),
            }
        }
        let mut handles = self.submit_batch(requests).into_iter();
        errors
            .into_iter()
            .map(|error| match error {
                Some(e) => Err(e),
                None => match handles.next() {
                    Some(handle) => handle?.wait(),
                    None => Err(EngineError::Internal("a batch lost a request".into())),
                },
            })
            .collect()
    }

    /// Computes `text` in context and keeps its K/V: resident in the pool, and its chunks in the
    /// chunk store, so later prompts that start with it (or hold it anywhere, by content) reuse
    /// it. A prefix already cached is reused, not recomputed.
    pub fn warm(&self, text: &str) -> Result<WarmResult, EngineError> {
        self.warm_tokens(&self.shared.tokenizer.encode(text, false)?)
    }

    /// As [`Engine::warm`], from token ids.
    pub fn warm_tokens(&self, tokens: &[u32]) -> Result<WarmResult, EngineError> {
        self.warm_tokens_in(tokens, None)
    }

    /// As [`Engine::warm_tokens`], cached under `cache_scope` ([`GenerateOptions::cache_scope`]):
    /// only requests of that scope reuse it.
    pub fn warm_tokens_in(
        &self,
        tokens: &[u32],
        cache_scope: Option<Vec<u8>>,
    ) -> Result<WarmResult, EngineError> {
        if tokens.is_empty() {
            return Ok(WarmResult {
                chunks_stored: 0,
                tokens: 0,
                bytes: 0,
            });
        }
        let count = tokens.len();
        let options = GenerateOptions {
            max_new_tokens: 0,
            mode: GenerationMode::PrefixCache,
            cache_scope,
            ..Default::default()
        };
        let r = self
            .submit(Request::new(tokens.to_vec(), options))?
            .wait()?;
        Ok(WarmResult {
            chunks_stored: r.stored_chunks,
            tokens: count,
            bytes: r.stored_bytes,
        })
    }

    /// Waits until the scheduler has taken every command sent so far and published its stats.
    pub fn sync(&self) -> Result<(), EngineError> {
        self.round_trip(Command::Sync)
    }
}

impl<B: ModelBackend> Drop for Engine<B> {
    fn drop(&mut self) {
        let _ = self.commands.send(Command::Shutdown);
        if let Some(worker) = self.worker.take() {
            let _ = worker.join();
        }
    }
}

fn check_config(c: &EngineConfig) -> Result<(), EngineError> {
    let bad = |what: String| Err(EngineError::Config(what));
    if c.max_cache_bytes == 0 {
        return bad("max_cache_bytes must be greater than 0".into());
    }
    if c.chunk_size == 0 {
        return bad("chunk_size must be at least 1".into());
    }
    if c.block_size == 0 || !c.block_size.is_power_of_two() {
        return bad(format!(
            "block_size {} must be a power of two",
            c.block_size
        ));
    }
    if c.max_batch_tokens == 0 || c.prefill_tokens_while_decoding == 0 {
        return bad("max_batch_tokens and prefill_tokens_while_decoding must be at least 1".into());
    }
    if c.max_running == 0 {
        return bad("max_running must be at least 1".into());
    }
    if !(0.0..=1.0).contains(&c.recompute_ratio) {
        return bad(format!(
            "recompute_ratio {} is not in 0..=1",
            c.recompute_ratio
        ));
    }
    if c.cacheblend_filter_layers == 0 {
        return bad("cacheblend_filter_layers must be at least 1".into());
    }
    if let Some(t) = c.recompute_threshold {
        if !(t >= 0.0 && t.is_finite()) {
            return bad(format!(
                "recompute_threshold {t} must be a finite number >= 0"
            ));
        }
    }
    Ok(())
}

/// `Engine` is shared between threads (a server's request handlers).
#[allow(dead_code)]
fn engine_is_send_and_sync() {
    fn assert<T: Send + Sync>() {}
    #[cfg(feature = "ndarray")]
    assert::<Engine<kvb_model::backends::Cpu>>();
}
