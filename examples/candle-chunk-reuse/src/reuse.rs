//! Chunk reuse for the candle runtime, with kvb's burn-free crates only: the prompt's segments
//! (messages, documents) cut by `kvb-chunk`, keyed by `kvb-hash`, looked up in `kvb-store`
//! (longest exact prefix, then chunks seen at other positions), written into the runtime's cache
//! through the seam (moved keys re-rotated on the host), and the model run only on the rest.

use crate::cache::KvCache;
use crate::model::CandleLlama;
use kvb_chunk::{split, ChunkConfig, ChunkStrategy};
use kvb_hash::{ContentKey, Namespace, PrefixKey};
use kvb_store::seam::rope::{rerotate_chunk, RopePairs, RopeScaling, RopeSpec};
use kvb_store::seam::{chunk_from_runtime, write_chunk_into, ChunkKeys};
use kvb_store::{ChunkStore, KvFormat, StoreConfig};
use std::ops::Range;
use std::time::{Duration, Instant};

/// One chunk of a prompt as planned: a piece of one segment.
struct Planned {
    span: Range<usize>,
    keys: ChunkKeys,
}

/// Where a prefill's tokens came from, and how long to the first token.
#[derive(Debug, Clone, Default)]
pub struct PrefillStats {
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// Tokens written from the longest cached prefix (exact: the same bits a prefill computes).
    pub exact_tokens: usize,
    /// Tokens written from chunks cached at other positions, keys re-rotated (approximate:
    /// their K/V saw another context; no repair in this example).
    pub moved_tokens: usize,
    /// Tokens the model ran on.
    pub computed_tokens: usize,
    /// From the prompt's tokens to the first token's logits.
    pub ttft: Duration,
}

impl PrefillStats {
    /// Share of the prompt not recomputed.
    pub fn reuse(&self) -> f64 {
        (self.exact_tokens + self.moved_tokens) as f64 / self.prompt_tokens.max(1) as f64
    }
}

/// A prompt read into a cache: what to decode from.
pub struct Prefill {
    /// The runtime's K/V of the whole prompt.
    pub cache: KvCache,
    /// The last prompt token's logits.
    pub logits: Vec<f32>,
    /// Where the tokens came from.
    pub stats: PrefillStats,
}

/// kvb's chunk store, attached to one model.
pub struct ChunkReuse {
    store: ChunkStore,
    namespace: Namespace,
    chunking: ChunkConfig,
    rope: RopeSpec,
    /// Shorter chunks are computed, not taken from another position (a message's three-token
    /// header is not worth an approximate context).
    min_moved_tokens: usize,
}

impl ChunkReuse {
    /// A store of `ram_bytes` for `model`, chunks of `chunk_tokens` within each segment.
    /// `fingerprint` names the model file (two models must never share keys).
    pub fn new(
        model: &CandleLlama,
        fingerprint: &[u8],
        chunk_tokens: usize,
        ram_bytes: usize,
    ) -> anyhow::Result<Self> {
        let c = &model.config;
        anyhow::ensure!(
            matches!(c.rope_scaling, kvb_modelfile::RopeScaling::None),
            "this example re-rotates plain RoPE only, not {:?}",
            c.rope_scaling
        );
        let chunking = ChunkConfig {
            size: chunk_tokens,
            min_tail: 1,
            strategy: ChunkStrategy::Fixed,
        };
        let namespace = Namespace::builder()
            .model_fingerprint(fingerprint)
            .dtype("f32")
            .chunking(&format!("segments:{}", chunking.describe()))
            .build();
        Ok(ChunkReuse {
            store: ChunkStore::new(StoreConfig::ram(ram_bytes))?,
            namespace,
            min_moved_tokens: chunk_tokens.div_ceil(4),
            chunking,
            rope: RopeSpec {
                head_dim: c.head_dim,
                theta: c.rope_theta,
                scaling: RopeScaling::None,
                // llama.cpp permutes Q/K rows so that RoPE pairs neighbours.
                pairs: RopePairs::Interleaved,
            },
        })
    }

    /// Cuts each segment into chunks, keys chained across the whole prompt.
    fn plan(&self, segments: &[Vec<u32>]) -> (Vec<u32>, Vec<Planned>) {
        let mut tokens = Vec::new();
        let mut planned = Vec::new();
        let mut parent = self.namespace.root();
        for segment in segments {
            let base = tokens.len();
            for chunk in split(segment, &self.chunking, &self.namespace) {
                let prefix_key: PrefixKey = self.namespace.prefix_key(&parent, &chunk.tokens);
                let content_key: ContentKey = chunk.content_key;
                planned.push(Planned {
                    span: base + chunk.start..base + chunk.end,
                    keys: ChunkKeys {
                        prefix_key,
                        content_key,
                        parent,
                    },
                });
                parent = prefix_key;
            }
            tokens.extend_from_slice(segment);
        }
        (tokens, planned)
    }

    /// Reads a prompt (its segments in order) into a new cache: the longest cached prefix, then
    /// each chunk cached elsewhere or computed; stores every chunk computed in an exact context.
    pub fn prefill(&self, model: &CandleLlama, segments: &[Vec<u32>]) -> anyhow::Result<Prefill> {
        let started = Instant::now();
        let (tokens, planned) = self.plan(segments);
        let n = tokens.len();
        anyhow::ensure!(n > 0, "an empty prompt");
        let mut cache = model.new_cache();
        let mut stats = PrefillStats {
            prompt_tokens: n,
            ..Default::default()
        };

        // The longest exact prefix, short of the last token (its logits are needed).
        if let Some(hit) = self.store.longest_prefix(self.namespace.root(), &tokens)? {
            for (chunk, used) in &hit.chunks {
                let take = (*used).min(n - 1 - cache.len());
                let at = cache.len();
                write_chunk_into(chunk, 0..take, &mut cache, at)?;
            }
        }
        stats.exact_tokens = cache.len();

        // The rest chunk by chunk: a chunk seen at another position is re-rotated and written;
        // runs of other chunks are computed in one pass each. Only chunks computed after an
        // exact context are stored (a moved chunk's K/V, and all after it, are approximate).
        let mut logits = Vec::new();
        let mut exact_context = true;
        let mut to_store = Vec::new();
        let mut compute_to = cache.len();
        for p in &planned {
            if p.span.end <= cache.len() {
                continue;
            }
            let whole = p.span.start >= cache.len();
            let found = if whole && p.span.len() >= self.min_moved_tokens {
                self.store.get_by_content(&p.keys.content_key)?
            } else {
                None
            };
            let Some(found) = found else {
                compute_to = p.span.end;
                if exact_context && !self.store.contains(&p.keys.prefix_key) {
                    to_store.push(p);
                }
                continue;
            };
            if compute_to > cache.len() {
                logits = self.compute(model, &tokens, compute_to, &mut cache, &mut stats)?;
            }
            let mut chunk = (*found.chunk).clone();
            let positions: Vec<u32> = (p.span.start as u32..p.span.end as u32).collect();
            if chunk.positions != positions {
                rerotate_chunk(&mut chunk, &self.rope, &positions)?;
            }
            let take = p.span.len() - usize::from(p.span.end == n);
            write_chunk_into(&chunk, 0..take, &mut cache, p.span.start)?;
            stats.moved_tokens += take;
            exact_context = false;
            compute_to = cache.len();
        }
        if n > cache.len() {
            logits = self.compute(model, &tokens, n, &mut cache, &mut stats)?;
        }
        stats.ttft = started.elapsed();

        for p in to_store {
            let positions: Vec<u32> = (p.span.start as u32..p.span.end as u32).collect();
            let chunk = chunk_from_runtime(
                &cache,
                p.span.clone(),
                &tokens[p.span.clone()],
                &positions,
                p.keys,
                KvFormat::F32,
            )?;
            self.store.insert(chunk)?;
        }
        Ok(Prefill {
            cache,
            logits,
            stats,
        })
    }

    /// Runs the model from the end of the cache to token `to`.
    fn compute(
        &self,
        model: &CandleLlama,
        tokens: &[u32],
        to: usize,
        cache: &mut KvCache,
        stats: &mut PrefillStats,
    ) -> anyhow::Result<Vec<f32>> {
        let from = cache.len();
        stats.computed_tokens += to - from;
        model.forward(&tokens[from..to], cache)
    }

    /// The store (for its statistics).
    pub fn store(&self) -> &ChunkStore {
        &self.store
    }
}

/// Greedy decoding from a prefill: up to `max_new` tokens, stopping after an end token.
pub fn generate(
    model: &CandleLlama,
    prefill: &mut Prefill,
    max_new: usize,
) -> anyhow::Result<Vec<u32>> {
    let mut out = Vec::with_capacity(max_new);
    let mut logits = prefill.logits.clone();
    for _ in 0..max_new {
        let next = argmax(&logits);
        out.push(next);
        if model.config.eos_token_ids.contains(&next) {
            break;
        }
        logits = model.forward(&[next], &mut prefill.cache)?;
    }
    Ok(out)
}

/// The index of the largest logit (the first of equals).
pub fn argmax(logits: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &l) in logits.iter().enumerate() {
        if l > logits[best] {
            best = i;
        }
    }
    best as u32
}
