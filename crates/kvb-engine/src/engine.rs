//! [`Engine`]: a model, its tokenizer and a chunk store, serving requests with K/V reuse.

use crate::config::{EngineConfig, GenerateOptions, GenerationMode};
use crate::fingerprint::model_fingerprint;
use crate::kv_transfer::{append_pieces, read_layers, Piece};
use crate::result::{GenerationResult, StageTimes, WarmResult};
use crate::EngineError;
use kvb_chunk::{boundary_tokens, split, ChunkConfig, ChunkStrategy};
use kvb_hash::{Namespace, PrefixKey};
use kvb_model::generate::{decode, logits_to_vec, Sampler, StreamEvent};
use kvb_model::{load_pretrained, KvCache, LoadOptions, LogitsFor, Model, ModelBackend, Tokenizer};
use kvb_quant::{Bits, QuantConfig};
use kvb_repair::{repair, select, RecomputeStrategy, RepairConfig, SlotMap};
use kvb_store::{ChunkStore, DiskConfig, KvChunk, KvFormat, StoreConfig, StoreStats};
use std::ops::Range;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Tokens `range` of a chunk computed elsewhere (found by content key, or next to one that was),
/// to place at `start` of this prompt.
#[derive(Clone)]
struct Interior {
    start: usize,
    chunk: Arc<KvChunk>,
    range: Range<usize>,
}

impl Interior {
    fn end(&self) -> usize {
        self.start + self.range.len()
    }
}

/// Neighbouring tokens shorter than this are not worth a piece of their own.
const MIN_EXTENSION: usize = 4;

/// What the cache offers a prompt.
#[derive(Default)]
struct Plan {
    /// Exact, in-context chunks from position 0, with the tokens of each used.
    prefix: Vec<(Arc<KvChunk>, usize)>,
    /// Tokens covered from position 0, by the resident sequence or by `prefix`.
    prefix_tokens: usize,
    /// Of those, the tokens continued in place in the resident sequence's cache.
    resident_tokens: usize,
    interior: Vec<Interior>,
}

/// The K/V of the last request's sequence, kept where the model computed it. The next request
/// that extends it (a chat's next turn, another question about the same file) continues it in
/// place: no lookup of chunks, no copy. vLLM and llama.cpp keep a sequence's K/V resident the same
/// way; the chunk store serves everything else.
struct Resident<B: ModelBackend> {
    /// The tokens of slots `0..tokens.len()`, all exact (what a full prefill computes).
    tokens: Vec<u32>,
    cache: KvCache<B>,
}

/// How a prompt's cache was filled.
#[derive(Default)]
struct Prefill {
    cached_tokens: usize,
    recomputed_tokens: usize,
    exact_chunks: usize,
    approximate_chunks: usize,
    /// Slots from here on hold K/V that is not exactly what a full prefill gives.
    exact_until: usize,
}

/// A model with a chunk store: the kvb engine.
pub struct Engine<B: ModelBackend> {
    model: Model<B>,
    tokenizer: Tokenizer,
    store: ChunkStore,
    namespace: Namespace,
    chunking: ChunkConfig,
    format: KvFormat,
    config: EngineConfig,
    resident: Mutex<Option<Resident<B>>>,
}

fn elapsed_ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
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
            },
            device,
            &mut |_, _| {},
        )?;
        let fingerprint = model_fingerprint(path, m.format, m.model.config())?;
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
        if config.max_cache_bytes == 0 {
            return Err(EngineError::Config(
                "max_cache_bytes must be greater than 0".into(),
            ));
        }
        if config.chunk_size == 0 {
            return Err(EngineError::Config("chunk_size must be at least 1".into()));
        }
        let format = match config.kv_bits {
            16 | 32 => KvFormat::F32,
            8 => KvFormat::Kivi(QuantConfig {
                bits: Bits::Eight,
                group_size: 32,
            }),
            4 => KvFormat::Kivi(QuantConfig {
                bits: Bits::Four,
                group_size: 32,
            }),
            2 => KvFormat::Kivi(QuantConfig {
                bits: Bits::Two,
                group_size: 32,
            }),
            b => {
                return Err(EngineError::Config(format!(
                    "kv_bits {b}: use 16, 8, 4 or 2"
                )))
            }
        };
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
        let namespace = Namespace::builder()
            .model_fingerprint(fingerprint)
            .dtype("f32")
            .chunking(&chunking.describe())
            .kv_bits(config.kv_bits)
            .build();
        let store = ChunkStore::new(StoreConfig {
            max_ram_bytes: config.max_cache_bytes,
            eviction: config.eviction,
            disk: config.disk_dir.as_ref().map(|d| {
                DiskConfig::new(d.join(format!("{}", namespace.id())), config.disk_max_bytes)
            }),
            min_prefix_len: 1,
        })?;
        Ok(Engine {
            model,
            tokenizer,
            store,
            namespace,
            chunking,
            format,
            config,
            resident: Mutex::new(None),
        })
    }

    /// The model.
    pub fn model(&self) -> &Model<B> {
        &self.model
    }

    /// The tokenizer.
    pub fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    /// The engine's settings.
    pub fn config(&self) -> &EngineConfig {
        &self.config
    }

    /// The namespace every key of this engine is derived from.
    pub fn namespace(&self) -> &Namespace {
        &self.namespace
    }

    /// Store counters and sizes.
    pub fn cache_stats(&self) -> StoreStats {
        self.store.stats()
    }

    /// Forgets every cached chunk and the resident sequence.
    pub fn reset_cache(&self) -> Result<(), EngineError> {
        self.set_resident(None);
        Ok(self.store.clear()?)
    }

    fn set_resident(&self, r: Option<Resident<B>>) {
        // A poisoned lock only means a request panicked holding it; the slot is still valid.
        let mut slot = self.resident.lock().unwrap_or_else(|e| e.into_inner());
        *slot = r;
    }

    /// An empty cache for a request that will replace the resident sequence: the resident's own
    /// storage when there is one (a fresh allocation costs page faults, ~0.4 ms per MB here).
    fn recycled_cache(&self) -> KvCache<B> {
        let mut slot = self.resident.lock().unwrap_or_else(|e| e.into_inner());
        match slot.take() {
            Some(mut r) if self.config.keep_resident => {
                r.cache.clear();
                r.cache
            }
            _ => self.model.new_cache(),
        }
    }

    /// Takes the resident sequence's cache when it covers at least as much of `tokens` as
    /// `store_prefix` (continuing in place beats copying the same K/V from the store),
    /// truncated to the common prefix (at most `limit` tokens, whole chunks with `whole_chunks`).
    fn take_resident(
        &self,
        tokens: &[u32],
        limit: usize,
        whole_chunks: bool,
        store_prefix: usize,
    ) -> Option<(KvCache<B>, usize)> {
        if !self.config.keep_resident {
            return None;
        }
        let mut slot = self.resident.lock().unwrap_or_else(|e| e.into_inner());
        let r = slot.as_ref()?;
        let mut common = r
            .tokens
            .iter()
            .zip(&tokens[..limit])
            .take_while(|(a, b)| a == b)
            .count();
        if whole_chunks {
            common -= common % self.chunking.size;
        }
        if common == 0 || common < store_prefix {
            return None;
        }
        let mut r = slot.take()?;
        r.cache.truncate(common);
        Some((r.cache, common))
    }

    fn repair_config(&self, approximate: bool) -> RepairConfig {
        RepairConfig {
            // A chunk found by content was computed in another context: boundary-only repair
            // cannot fix what it lacks throughout, so it always gets CacheBlend, unless repair is off.
            strategy: match self.config.recompute_strategy {
                RecomputeStrategy::None => RecomputeStrategy::None,
                _ if approximate => RecomputeStrategy::CacheBlend,
                s => s,
            },
            overlap: self.config.recompute_overlap,
            overlap_k: self.config.overlap_k,
            ratio: self.config.recompute_ratio,
            sink_tokens: self.config.sink_tokens,
            probe_layer: self.config.cacheblend_probe_layer,
        }
    }

    /// What the cache holds for `tokens` under `mode`. The last token is always left to compute,
    /// since its logits start generation.
    ///
    /// Returns the cache to start from: the resident sequence's, when it covers the longest
    /// prefix, else a new one.
    fn plan(
        &self,
        tokens: &[u32],
        mode: GenerationMode,
    ) -> Result<(Plan, KvCache<B>), EngineError> {
        let n = tokens.len();
        let mut plan = Plan::default();
        if mode == GenerationMode::Baseline || n < 2 {
            return Ok((plan, self.model.new_cache()));
        }
        if let Some(m) = self
            .store
            .longest_prefix(self.namespace.root(), &tokens[..n - 1])?
        {
            let mut chunks = m.chunks;
            let mut matched = m.matched_tokens;
            if mode == GenerationMode::PrefixCache {
                // Whole chunks only, like block-granular prefix caching.
                while let Some((c, used)) = chunks.last() {
                    if *used == c.len() {
                        break;
                    }
                    matched -= used;
                    chunks.pop();
                }
            }
            plan.prefix = chunks;
            plan.prefix_tokens = matched;
        }
        let whole_chunks = mode == GenerationMode::PrefixCache;
        let cache = match self.take_resident(tokens, n - 1, whole_chunks, plan.prefix_tokens) {
            Some((cache, covered)) => {
                plan.prefix.clear();
                plan.prefix_tokens = covered;
                plan.resident_tokens = covered;
                cache
            }
            None => self.recycled_cache(),
        };
        if mode == GenerationMode::ChunkReuse {
            plan.interior = self.find_interior(tokens, plan.prefix_tokens)?;
        }
        Ok((plan, cache))
    }

    /// Chunks stored elsewhere whose tokens reappear in `tokens[from..n-1]`, in order, without
    /// overlap. With fixed chunking a moved document rarely starts on this prompt's chunk grid, so
    /// every offset is probed (one content key and one index probe each: ~1 us per position);
    /// content-defined cuts (boundary window, semantic) shift with the text, so there the prompt's
    /// own chunks are looked up.
    fn find_interior(&self, tokens: &[u32], from: usize) -> Result<Vec<Interior>, EngineError> {
        let n = tokens.len();
        let mut found = Vec::new();
        let take = |start: usize,
                    window: &[u32],
                    found: &mut Vec<Interior>|
         -> Result<bool, EngineError> {
            let key = self.namespace.content_key(window);
            if !self.store.has_content(&key) {
                return Ok(false);
            }
            match self.store.get_by_content(&key)? {
                Some(m) if m.chunk.tokens == window => {
                    found.push(Interior {
                        start,
                        range: 0..m.chunk.len(),
                        chunk: m.chunk,
                    });
                    Ok(true)
                }
                _ => Ok(false),
            }
        };
        match self.chunking.strategy {
            ChunkStrategy::Fixed => {
                let size = self.chunking.size;
                let mut i = from;
                // The last token stays live: its logits start generation.
                while i + size < n {
                    if take(i, &tokens[i..i + size], &mut found)? {
                        i += size;
                    } else {
                        i += 1;
                    }
                }
            }
            _ => {
                for c in split(tokens, &self.chunking, &self.namespace) {
                    if c.start >= from && c.end < n && c.cacheable {
                        take(c.start, &c.tokens, &mut found)?;
                    }
                }
            }
        }
        self.extend_runs(tokens, from, found)
    }

    /// Widens each run of chunks found by content with the neighbours they had where they were
    /// computed: the end of the chunk before (the first one's parent) and the chunks after (the
    /// last one's children), as far as their tokens match this prompt. A moved document rarely
    /// sits on the chunk grid it was stored on; without this its partial first and last chunks
    /// would be recomputed.
    fn extend_runs(
        &self,
        tokens: &[u32],
        from: usize,
        found: Vec<Interior>,
    ) -> Result<Vec<Interior>, EngineError> {
        let n = tokens.len();
        let mut out: Vec<Interior> = Vec::with_capacity(found.len() + 2);
        let mut i = 0;
        while i < found.len() {
            let mut j = i + 1;
            while j < found.len() && found[j].start == found[j - 1].end() {
                j += 1;
            }
            let floor = out.last().map_or(from, Interior::end);
            let first = &found[i];
            if first.start > floor {
                // The store has no chunk under the root key: a run from position 0 stops here.
                if let Some(parent) = self.store.get(&first.chunk.parent)? {
                    let m = parent
                        .tokens
                        .iter()
                        .rev()
                        .zip(tokens[floor..first.start].iter().rev())
                        .take_while(|(a, b)| a == b)
                        .count();
                    if m >= MIN_EXTENSION {
                        out.push(Interior {
                            start: first.start - m,
                            range: parent.len() - m..parent.len(),
                            chunk: parent,
                        });
                    }
                }
            }
            out.extend(found[i..j].iter().cloned());
            let last = &found[j - 1];
            // Up to the next run, and the last token stays live.
            let limit = found.get(j).map_or(n - 1, |next| next.start);
            let mut at = last.end();
            if at < limit {
                if let Some(m) = self
                    .store
                    .longest_prefix(last.chunk.prefix_key, &tokens[at..limit])?
                {
                    for (chunk, used) in m.chunks {
                        if used < MIN_EXTENSION {
                            break;
                        }
                        out.push(Interior {
                            start: at,
                            range: 0..used,
                            chunk,
                        });
                        at += used;
                    }
                }
            }
            i = j;
        }
        Ok(out)
    }

    /// Fills `cache` with the K/V of `tokens` (positions `0..n`) from the plan and the model, and
    /// returns the logits of the last token.
    fn prefill(
        &self,
        tokens: &[u32],
        plan: &Plan,
        cache: &mut KvCache<B>,
        stages: &mut StageTimes,
        logits: LogitsFor,
    ) -> Result<(Vec<f32>, Prefill), EngineError> {
        let n = tokens.len();
        let positions: Vec<usize> = (0..n).collect();
        let mut out = Prefill::default();
        let t = Instant::now();
        let pieces: Vec<Piece> = plan
            .prefix
            .iter()
            .map(|(c, used)| Piece {
                chunk: c,
                range: 0..*used,
            })
            .collect();
        out.cached_tokens += plan.resident_tokens + append_pieces(cache, &pieces, None)?;
        out.exact_chunks = plan.prefix.len();
        stages.assemble += t.elapsed();
        let mut pos = plan.prefix_tokens;
        out.exact_until = n;
        let mut deferred: Vec<usize> = Vec::new();
        // Adjacent reused chunks form one span: placed, and repaired, in one pass. A CacheBlend
        // pass costs one probe and one forward of the selected tokens; chunk by chunk, those
        // fixed costs were paid per chunk (measured: 3 chunks of a moved document, 500 ms).
        let mut i = 0;
        while i < plan.interior.len() {
            let mut j = i + 1;
            while j < plan.interior.len() && plan.interior[j].start == plan.interior[j - 1].end() {
                j += 1;
            }
            let run = &plan.interior[i..j];
            let span = run[0].start..run[run.len() - 1].end();
            if span.start > pos {
                let t = Instant::now();
                self.model.forward(
                    &tokens[pos..span.start],
                    &positions[pos..span.start],
                    cache,
                    LogitsFor::Nothing,
                )?;
                stages.live_prefill += t.elapsed();
            }
            let t = Instant::now();
            let pieces: Vec<Piece> = run
                .iter()
                .map(|it| Piece {
                    chunk: &it.chunk,
                    range: it.range.clone(),
                })
                .collect();
            append_pieces(
                cache,
                &pieces,
                Some((self.model.rope(), &positions[span.clone()])),
            )?;
            stages.assemble += t.elapsed();
            let t = Instant::now();
            let map = SlotMap {
                tokens,
                positions: &positions,
            };
            let config = self.repair_config(true);
            // The last run's recompute joins the live suffix's forward pass below.
            let report = if j == plan.interior.len() {
                let r = select(&self.model, cache, &map, span.clone(), &config)?;
                deferred.clone_from(&r.recomputed_slots);
                r
            } else {
                repair(&self.model, cache, &map, span.clone(), &config)?
            };
            stages.repair += t.elapsed();
            out.cached_tokens += span.len();
            out.recomputed_tokens += report.recomputed_slots.len();
            out.approximate_chunks += run.len();
            out.exact_until = out.exact_until.min(span.start);
            pos = span.end;
            i = j;
        }
        let t = Instant::now();
        let last = if deferred.is_empty() {
            self.model
                .forward(&tokens[pos..], &positions[pos..], cache, logits)?
        } else {
            // One pass over the repaired slots and the live suffix (see kvb_repair::select):
            // the suffix sees the repaired K/V as if the repair had run first.
            let slots: Vec<usize> = deferred.iter().copied().chain(pos..n).collect();
            let run_tokens: Vec<u32> = slots.iter().map(|&s| tokens[s]).collect();
            let run_positions: Vec<usize> = slots.iter().map(|&s| positions[s]).collect();
            cache.reserve(n - cache.len());
            cache.set_len(n)?;
            self.model
                .forward_at_slots(&run_tokens, &run_positions, &slots, cache, logits)?
        };
        stages.live_prefill += t.elapsed();
        Ok((logits_to_vec(last)?, out))
    }

    /// Stores the chunks of `sequence` (the tokens of cache slots `0..limit`) that are not stored
    /// yet, from the cache's own K/V (computed in context). Returns (chunks, bytes) stored.
    fn store_chunks(
        &self,
        sequence: &[u32],
        limit: usize,
        cache: &KvCache<B>,
    ) -> Result<(usize, usize), EngineError> {
        let limit = limit.min(sequence.len()).min(cache.len());
        let mut parent: PrefixKey = self.namespace.root();
        let (mut count, mut bytes) = (0, 0);
        for c in split(&sequence[..limit], &self.chunking, &self.namespace) {
            let key = c.prefix_key;
            if c.cacheable && !self.store.contains(&key) {
                let chunk = KvChunk {
                    prefix_key: key,
                    content_key: c.content_key,
                    parent,
                    positions: (c.start as u32..c.end as u32).collect(),
                    kv_heads: self.model.config().num_kv_heads,
                    head_dim: self.model.config().head_dim,
                    layers: read_layers(cache, c.span(), self.format)?,
                    tokens: c.tokens,
                };
                bytes += chunk.bytes();
                if self.store.insert(chunk)? != kvb_store::Inserted::Rejected {
                    count += 1;
                }
            }
            parent = key;
        }
        Ok((count, bytes))
    }

    /// Computes `text` in context and stores its chunks, so later prompts that start with it reuse
    /// them (a prefix already cached is reused, not recomputed).
    pub fn warm(&self, text: &str) -> Result<WarmResult, EngineError> {
        let tokens = self.tokenizer.encode(text, false)?;
        if tokens.is_empty() {
            return Ok(WarmResult {
                chunks_stored: 0,
                tokens: 0,
                bytes: 0,
            });
        }
        self.check_length(tokens.len())?;
        let (plan, mut cache) = self.plan(&tokens, GenerationMode::PrefixCache)?;
        cache.reserve(tokens.len() - cache.len());
        let mut stages = StageTimes::default();
        self.prefill(&tokens, &plan, &mut cache, &mut stages, LogitsFor::Nothing)?;
        let (chunks_stored, bytes) = self.store_chunks(&tokens, tokens.len(), &cache)?;
        let count = tokens.len();
        self.set_resident(Some(Resident { tokens, cache }));
        Ok(WarmResult {
            chunks_stored,
            tokens: count,
            bytes,
        })
    }

    fn check_length(&self, n: usize) -> Result<(), EngineError> {
        let max = self.model.config().max_position_embeddings;
        if n >= max {
            return Err(EngineError::PromptTooLong {
                tokens: n,
                context: max,
            });
        }
        Ok(())
    }

    /// Generates from `prompt` with K/V reuse per `options.mode`, streaming through `on_token`.
    pub fn generate(
        &self,
        prompt: &str,
        options: &GenerateOptions,
        on_token: &mut dyn FnMut(StreamEvent<'_>),
    ) -> Result<GenerationResult, EngineError> {
        let start = Instant::now();
        let tokens = self.tokenizer.encode(prompt, false)?;
        let tokenize = start.elapsed();
        self.generate_from(start, tokenize, &tokens, options, on_token)
    }

    /// Serves several prompts as one batch. They run one after another, ordered so that prompts
    /// sharing a prefix run back to back (each continues the previous one's resident K/V, or
    /// reads the chunks it stored); results come back in the given order. TTFT is counted from the
    /// batch's arrival, so it includes the wait behind earlier prompts of the batch.
    pub fn generate_batch(
        &self,
        prompts: &[&str],
        options: &GenerateOptions,
    ) -> Vec<Result<GenerationResult, EngineError>> {
        let start = Instant::now();
        let encoded: Vec<Result<Vec<u32>, EngineError>> = prompts
            .iter()
            .map(|p| Ok(self.tokenizer.encode(p, false)?))
            .collect();
        let tokenize = start.elapsed();
        let mut order: Vec<usize> = (0..prompts.len()).collect();
        // Lexicographic order puts the prompts with the longest common prefixes next to each other.
        order.sort_by(|&a, &b| match (&encoded[a], &encoded[b]) {
            (Ok(x), Ok(y)) => x.cmp(y),
            (x, y) => x.is_ok().cmp(&y.is_ok()),
        });
        let mut served: Vec<(usize, Result<GenerationResult, EngineError>)> = order
            .into_iter()
            .map(|i| {
                let r = match &encoded[i] {
                    Ok(tokens) => self.generate_from(start, tokenize, tokens, options, &mut |_| {}),
                    Err(e) => Err(EngineError::Config(format!("prompt {i}: {e}"))),
                };
                (i, r)
            })
            .collect();
        served.sort_by_key(|(i, _)| *i);
        served.into_iter().map(|(_, r)| r).collect()
    }

    /// As [`Engine::generate`], from token ids.
    pub fn generate_tokens(
        &self,
        tokens: &[u32],
        options: &GenerateOptions,
        on_token: &mut dyn FnMut(StreamEvent<'_>),
    ) -> Result<GenerationResult, EngineError> {
        self.generate_from(Instant::now(), Duration::ZERO, tokens, options, on_token)
    }

    fn generate_from(
        &self,
        start: Instant,
        tokenize: Duration,
        tokens: &[u32],
        options: &GenerateOptions,
        on_token: &mut dyn FnMut(StreamEvent<'_>),
    ) -> Result<GenerationResult, EngineError> {
        let n = tokens.len();
        if n == 0 {
            return Err(EngineError::Config("the prompt is empty".into()));
        }
        self.check_length(n)?;
        let mut stages = StageTimes {
            tokenize,
            ..Default::default()
        };
        let t = Instant::now();
        let (plan, mut cache) = self.plan(tokens, options.mode)?;
        stages.lookup = t.elapsed();
        let t = Instant::now();
        // Room for the whole request at once, since growing a cache copies it; when it must grow,
        // leave headroom for the next request that extends this one (a chat's next turn).
        let needed = n + options.max_new_tokens;
        if cache.capacity() < needed {
            cache.reserve(needed + needed / 4 + 256 - cache.len());
        }
        stages.assemble += t.elapsed();
        let (first_logits, filled) =
            self.prefill(tokens, &plan, &mut cache, &mut stages, LogitsFor::Last)?;

        let params = kvb_model::generate::GenerateParams {
            max_new_tokens: options.max_new_tokens,
            sampling: options.sampling.clone(),
            stop_strings: options.stop_strings.clone(),
            stop_at_eos: true,
        };
        let mut sampler = Sampler::new(options.sampling.clone());
        let mut ttft = None;
        let decoded = decode(
            &self.model,
            &self.tokenizer,
            &mut cache,
            first_logits.clone(),
            n,
            &params,
            &mut sampler,
            &mut |e| {
                ttft.get_or_insert_with(|| start.elapsed());
                on_token(e)
            },
        )?;
        let ttft = ttft.unwrap_or_else(|| start.elapsed());
        stages.decode = decoded.decode_time;

        if options.mode != GenerationMode::Baseline {
            let t = Instant::now();
            let mut sequence = tokens.to_vec();
            sequence.extend_from_slice(&decoded.tokens);
            // Only K/V that equals a full prefill's may be stored under prefix keys: everything
            // after the first approximately reused chunk depends on its repaired K/V.
            let exact_end = if filled.approximate_chunks > 0 {
                filled.exact_until
            } else {
                cache.len()
            };
            let limit = match options.cacheable_prefix_len {
                Some(l) => l.min(n),
                None => cache.len(),
            };
            let keep = limit.min(exact_end).min(cache.len());
            self.store_chunks(&sequence, keep, &cache)?;
            if keep > 0 {
                sequence.truncate(keep);
                self.set_resident(Some(Resident {
                    tokens: sequence,
                    cache,
                }));
            }
            stages.store = t.elapsed();
        }
        let decode_steps = decoded.tokens.len().saturating_sub(1);
        Ok(GenerationResult {
            output_text: decoded.text,
            token_ids: decoded.tokens,
            ttft_ms: elapsed_ms(ttft),
            total_ms: elapsed_ms(start.elapsed()),
            tokens_per_sec: if decoded.decode_time.is_zero() {
                0.0
            } else {
                decode_steps as f64 / decoded.decode_time.as_secs_f64()
            },
            kv_reuse_ratio: filled.cached_tokens as f64 / n as f64,
            prompt_tokens: n,
            cached_tokens: filled.cached_tokens,
            resident_tokens: plan.resident_tokens,
            recomputed_tokens: filled.recomputed_tokens,
            exact_chunks: filled.exact_chunks,
            approximate_chunks: filled.approximate_chunks,
            stages,
            first_logits,
        })
    }
}
