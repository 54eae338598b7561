//! A token-level K/V cache for long live contexts: one entry per (layer, token), optionally
//! quantized, with eviction down to a budget by H2O, PyramidKV or a sliding window with sinks.
//!
//! Entries arrive one token at a time, so KIVI's per-channel key groups (which span tokens) are not
//! available: keys and values are both quantized per token, in groups of `group_size` channels.

use kvb_quant::packing::packed_len;
use kvb_quant::{quantize, Bits, QuantAxis, QuantConfig, QuantizedKv};

/// How [`TokenKvCache::evict`] chooses what stays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenEviction {
    /// H2O (Zhang et al., 2023): keep the `recent` newest tokens and, beyond them, the heavy hitters
    /// with the largest cumulative attention ([`TokenKvCache::update_attention_scores`]).
    H2o {
        /// Newest tokens always kept.
        recent: usize,
    },
    /// PyramidKV (Cai et al., 2024): H2O per layer, with budgets that shrink from the lowest layer
    /// to the highest ([`TokenKvCache::pyramid_budget`]).
    PyramidKv {
        /// Newest tokens always kept, per layer.
        recent: usize,
    },
    /// StreamingLLM-style: the first `sink_tokens` (attention sinks) and the newest tokens.
    SlidingWindow {
        /// Oldest tokens always kept.
        sink_tokens: usize,
    },
}

/// Settings of a [`TokenKvCache`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenCacheConfig {
    /// Heads per entry.
    pub num_heads: usize,
    /// Width of a head.
    pub head_dim: usize,
    /// Code width, or `None` to keep f32.
    pub bits: Option<Bits>,
    /// Channels per quantization group.
    pub group_size: usize,
    /// Nominal context length (PyramidKV's mean per-layer budget).
    pub max_seq_len: usize,
    /// Layers (for PyramidKV).
    pub num_layers: usize,
    /// Eviction policy.
    pub eviction: TokenEviction,
}

#[derive(Debug, Clone)]
enum Stored {
    F32(Vec<f32>),
    Quantized(QuantizedKv),
}

impl Stored {
    fn values(&self) -> Vec<f32> {
        match self {
            Stored::F32(v) => v.clone(),
            Stored::Quantized(q) => q.dequantize(),
        }
    }
    fn bytes(&self) -> usize {
        match self {
            Stored::F32(v) => v.len() * 4,
            Stored::Quantized(q) => q.memory_bytes(),
        }
    }
}

#[derive(Debug, Clone)]
struct Entry {
    position: usize,
    layer: usize,
    key: Stored,
    value: Stored,
    score: f64,
}

/// Bytes of bookkeeping per entry counted by [`TokenKvCache::memory_bytes`]: position, layer, score.
pub const ENTRY_OVERHEAD: usize = 24;

/// A token-level, optionally quantized K/V cache.
#[derive(Debug, Clone)]
pub struct TokenKvCache {
    config: TokenCacheConfig,
    entries: Vec<Entry>,
    next_position: usize,
}

impl TokenKvCache {
    /// A cache with `config`; sizes must be positive.
    pub fn new(config: TokenCacheConfig) -> Result<Self, String> {
        if config.num_heads == 0
            || config.head_dim == 0
            || config.group_size == 0
            || config.num_layers == 0
        {
            return Err(format!("every size in {config:?} must be positive"));
        }
        Ok(TokenKvCache {
            config,
            entries: Vec::new(),
            next_position: 0,
        })
    }

    fn dim(&self) -> usize {
        self.config.num_heads * self.config.head_dim
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// Whether the cache is empty.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    fn store(&self, x: &[f32]) -> Result<Stored, String> {
        match self.config.bits {
            None => Ok(Stored::F32(x.to_vec())),
            Some(bits) => {
                let cfg = QuantConfig {
                    bits,
                    group_size: self.config.group_size,
                };
                quantize(x, [1, 1, x.len()], QuantAxis::PerToken, cfg)
                    .map(Stored::Quantized)
                    .map_err(|e| e.to_string())
            }
        }
    }

    /// Appends one token's key and value (each `num_heads * head_dim`) for `layer_idx`; returns its
    /// logical position.
    pub fn append(
        &mut self,
        key: &[f32],
        value: &[f32],
        layer_idx: usize,
    ) -> Result<usize, String> {
        if key.len() != self.dim() || value.len() != self.dim() {
            return Err(format!(
                "key/value of {}/{} values, expected {}",
                key.len(),
                value.len(),
                self.dim()
            ));
        }
        if layer_idx >= self.config.num_layers {
            return Err(format!("layer {layer_idx} of {}", self.config.num_layers));
        }
        let entry = Entry {
            position: self.next_position,
            layer: layer_idx,
            key: self.store(key)?,
            value: self.store(value)?,
            score: 0.0,
        };
        self.next_position += 1;
        self.entries.push(entry);
        Ok(self.next_position - 1)
    }

    /// The (dequantized) keys and values at the given logical positions, in the order asked;
    /// positions no longer cached are skipped.
    pub fn get(&self, positions: &[usize]) -> (Vec<Vec<f32>>, Vec<Vec<f32>>) {
        positions
            .iter()
            .filter_map(|p| self.entries.iter().find(|e| e.position == *p))
            .map(|e| (e.key.values(), e.value.values()))
            .unzip()
    }

    /// The logical positions still cached, oldest first.
    pub fn positions(&self) -> Vec<usize> {
        self.entries.iter().map(|e| e.position).collect()
    }

    /// Adds attention received (one score per current entry, in order) to each entry's total.
    pub fn update_attention_scores(&mut self, scores: &[f64]) -> Result<(), String> {
        if scores.len() != self.entries.len() {
            return Err(format!(
                "{} scores for {} entries",
                scores.len(),
                self.entries.len()
            ));
        }
        self.entries
            .iter_mut()
            .zip(scores)
            .for_each(|(e, s)| e.score += s);
        Ok(())
    }

    /// PyramidKV's budget of `layer_idx`: linearly decreasing with depth, averaging `max_seq_len`
    /// over the layers (`2 * max_seq_len * (L - l) / (L + 1)`, rounded up).
    pub fn pyramid_budget(&self, layer_idx: usize, total_layers: usize) -> usize {
        let l = total_layers.max(1);
        let remaining = l.saturating_sub(layer_idx);
        (2 * self.config.max_seq_len * remaining).div_ceil(l + 1)
    }

    /// Indices (into `idx`) to keep: the `recent` newest, then the highest scores.
    fn h2o_keep(&self, idx: &[usize], budget: usize, recent: usize) -> Vec<usize> {
        if idx.len() <= budget {
            return idx.to_vec();
        }
        let recent = recent.min(budget);
        let (old, new) = idx.split_at(idx.len() - recent);
        let mut old: Vec<usize> = old.to_vec();
        // Heaviest first; among equal scores the newer token stays.
        old.sort_by(|&a, &b| {
            self.entries[b]
                .score
                .total_cmp(&self.entries[a].score)
                .then(b.cmp(&a))
        });
        old.truncate(budget - recent);
        old.extend_from_slice(new);
        old
    }

    /// Evicts until at most `budget` entries remain (PyramidKV: each layer keeps its pyramid share
    /// of `budget`, `budget * pyramid_budget(l) / sum of all layers' pyramid budgets`, rounded down
    /// so that the shares never add up to more than `budget`).
    pub fn evict(&mut self, budget: usize) {
        let all: Vec<usize> = (0..self.entries.len()).collect();
        let mut keep: Vec<usize> = match self.config.eviction {
            TokenEviction::SlidingWindow { sink_tokens } => {
                if all.len() <= budget {
                    all
                } else {
                    let sinks = sink_tokens.min(budget);
                    let mut k: Vec<usize> = all[..sinks].to_vec();
                    k.extend_from_slice(&all[all.len() - (budget - sinks)..]);
                    k
                }
            }
            TokenEviction::H2o { recent } => self.h2o_keep(&all, budget, recent),
            TokenEviction::PyramidKv { recent } => {
                let layers = self.config.num_layers;
                let total: usize = (0..layers).map(|l| self.pyramid_budget(l, layers)).sum();
                let mut k = Vec::new();
                for layer in 0..layers {
                    let idx: Vec<usize> = all
                        .iter()
                        .copied()
                        .filter(|&i| self.entries[i].layer == layer)
                        .collect();
                    let share = budget * self.pyramid_budget(layer, layers) / total.max(1);
                    k.extend(self.h2o_keep(&idx, share, recent));
                }
                k
            }
        };
        keep.sort_unstable();
        let mut it = keep.into_iter().peekable();
        let mut i = 0;
        self.entries.retain(|_| {
            let kept = it.peek() == Some(&i);
            if kept {
                it.next();
            }
            i += 1;
            kept
        });
    }

    /// f32 bytes of one entry's key and value over the bytes they are stored in.
    pub fn compression_ratio(&self) -> f64 {
        let dim = self.dim();
        let stored = match self.config.bits {
            None => dim * 4,
            Some(bits) => packed_len(dim, bits) + 4 * dim.div_ceil(self.config.group_size),
        };
        (dim * 4) as f64 / stored as f64
    }

    /// Bytes held: every stored key and value plus [`ENTRY_OVERHEAD`] per entry.
    pub fn memory_bytes(&self) -> usize {
        self.entries
            .iter()
            .map(|e| e.key.bytes() + e.value.bytes() + ENTRY_OVERHEAD)
            .sum()
    }
}
