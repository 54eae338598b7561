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
use kvb_repair::{repair, RecomputeStrategy, RepairConfig, SlotMap};
use kvb_store::{ChunkStore, DiskConfig, KvChunk, KvFormat, StoreConfig, StoreStats};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A chunk found elsewhere (by content key) to place at `start` of this prompt.
struct Interior {
    start: usize,
    chunk: Arc<KvChunk>,
}

/// What the cache offers a prompt.
#[derive(Default)]
struct Plan {
    /// Exact, in-context chunks from position 0, with the tokens of each used.
    prefix: Vec<(Arc<KvChunk>, usize)>,
    prefix_tokens: usize,
    interior: Vec<Interior>,
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

    /// Forgets every cached chunk.
    pub fn reset_cache(&self) -> Result<(), EngineError> {
        Ok(self.store.clear()?)
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
        }
    }

    /// What the cache holds for `tokens` under `mode`. The last token is always left to compute,
    /// since its logits start generation.
    fn plan(&self, tokens: &[u32], mode: GenerationMode) -> Result<Plan, EngineError> {
        let n = tokens.len();
        let mut plan = Plan::default();
        if mode == GenerationMode::Baseline || n < 2 {
            return Ok(plan);
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
        if mode == GenerationMode::ChunkReuse {
            plan.interior = self.find_interior(tokens, plan.prefix_tokens)?;
        }
        Ok(plan)
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
        Ok(found)
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
        out.cached_tokens += append_pieces(cache, &pieces, None)?;
        out.exact_chunks = plan.prefix.len();
        stages.assemble += t.elapsed();
        let mut pos = plan.prefix_tokens;
        out.exact_until = n;
        // Adjacent reused chunks form one span: placed, and repaired, in one pass. A CacheBlend
        // pass costs one probe and one forward of the selected tokens; chunk by chunk, those
        // fixed costs were paid per chunk (measured: 3 chunks of a moved document, 500 ms).
        let mut i = 0;
        while i < plan.interior.len() {
            let mut j = i + 1;
            while j < plan.interior.len()
                && plan.interior[j].start
                    == plan.interior[j - 1].start + plan.interior[j - 1].chunk.len()
            {
                j += 1;
            }
            let run = &plan.interior[i..j];
            let last = &run[run.len() - 1];
            let span = run[0].start..last.start + last.chunk.len();
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
                    range: 0..it.chunk.len(),
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
            let report = repair(
                &self.model,
                cache,
                &map,
                span.clone(),
                &self.repair_config(true),
            )?;
            stages.repair += t.elapsed();
            out.cached_tokens += span.len();
            out.recomputed_tokens += report.recomputed_slots.len();
            out.approximate_chunks += run.len();
            out.exact_until = out.exact_until.min(span.start);
            pos = span.end;
            i = j;
        }
        let t = Instant::now();
        let last = self
            .model
            .forward(&tokens[pos..], &positions[pos..], cache, logits)?;
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
        let plan = self.plan(&tokens, GenerationMode::PrefixCache)?;
        let mut cache = self.model.new_cache();
        let mut stages = StageTimes::default();
        self.prefill(&tokens, &plan, &mut cache, &mut stages, LogitsFor::Nothing)?;
        let (chunks_stored, bytes) = self.store_chunks(&tokens, tokens.len(), &cache)?;
        Ok(WarmResult {
            chunks_stored,
            tokens: tokens.len(),
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
        let plan = self.plan(tokens, options.mode)?;
        stages.lookup = t.elapsed();
        let mut cache = self.model.new_cache();
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
            self.store_chunks(&sequence, limit.min(exact_end), &cache)?;
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
            recomputed_tokens: filled.recomputed_tokens,
            exact_chunks: filled.exact_chunks,
            approximate_chunks: filled.approximate_chunks,
            stages,
            first_logits,
        })
    }
}
