//! # kvb-chunk: splitting prompts into cacheable chunks
//!
//! A prompt's token ids are cut into consecutive [`Chunk`]s, each carrying its span, its tokens,
//! its prefix key (which names it in context) and its content key (which names its tokens alone).
//!
//! Strategies ([`ChunkStrategy`]):
//! - **Fixed**: chunks of `size` tokens (default 128);
//! - **BoundaryWindow**: each cut moves to the boundary token (sentence end, newline; the set comes
//!   from the tokenizer, see [`boundary_tokens`]) closest to the fixed target within `window`
//!   tokens, cutting after it, else stays at the target;
//! - **Semantic**: paragraphs (given as token offsets where paragraphs start) packed into chunks of
//!   at most `size` tokens; a paragraph longer than `size` is cut at fixed size;
//! - **Document**: the whole prompt is one chunk.
//!
//! A last chunk shorter than `min_tail` (default 32) is still part of the partition but is marked
//! not [`Chunk::cacheable`]: storing K/V for a few tokens costs more than recomputing them.
//!
//! Promises (proved by `tests/chunk_properties.rs`):
//! - chunks partition the prompt exactly: no gap, no overlap, in order;
//! - sizes stay within the strategy's bounds (fixed: exactly `size` but the last; boundary window:
//!   `size ± window` but the last; semantic: at most `size`);
//! - the same prompt always chunks the same way;
//! - two prompts that share their first k full chunks share their first k prefix keys.
//!
//! ```
//! use kvb_chunk::{split, ChunkConfig};
//! use kvb_hash::Namespace;
//! let ns = Namespace::builder().model_fingerprint(b"m").build();
//! let tokens: Vec<u32> = (0..300).collect();
//! let chunks = split(&tokens, &ChunkConfig::default(), &ns);
//! assert_eq!(chunks.iter().map(|c| c.len()).collect::<Vec<_>>(), vec![128, 128, 44]);
//! assert!(chunks[2].cacheable); // 44 >= the default minimum tail of 32
//! ```
#![warn(missing_docs)]

/// The README's example, run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

use kvb_hash::{ContentKey, Namespace, PrefixKey};
use std::collections::HashSet;
use std::ops::Range;

/// How to place chunk boundaries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChunkStrategy {
    /// Every `size` tokens.
    Fixed,
    /// Near every `size` tokens, moved to the closest boundary token within `window`.
    BoundaryWindow {
        /// How far (in tokens) a cut may move from its fixed target.
        window: usize,
        /// Tokens after which a cut is natural (sentence ends, newlines).
        boundary_tokens: HashSet<u32>,
    },
    /// Paragraphs packed into chunks of at most `size` tokens.
    Semantic {
        /// Token offsets where paragraphs start (any order; 0 and out-of-range offsets ignored).
        paragraph_starts: Vec<usize>,
    },
    /// The whole prompt as one chunk.
    Document,
}

/// Chunking settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChunkConfig {
    /// Target chunk size in tokens (at least 1).
    pub size: usize,
    /// A last chunk shorter than this is not cached.
    pub min_tail: usize,
    /// Where cuts go.
    pub strategy: ChunkStrategy,
}

impl Default for ChunkConfig {
    fn default() -> Self {
        ChunkConfig {
            size: 128,
            min_tail: 32,
            strategy: ChunkStrategy::Fixed,
        }
    }
}

impl ChunkConfig {
    /// A short description of the settings that decide where cuts fall, for the key namespace:
    /// chunks cut differently must never share keys.
    pub fn describe(&self) -> String {
        match &self.strategy {
            ChunkStrategy::Fixed => format!("fixed:{}:{}", self.size, self.min_tail),
            ChunkStrategy::BoundaryWindow {
                window,
                boundary_tokens,
            } => {
                let mut b: Vec<u32> = boundary_tokens.iter().copied().collect();
                b.sort_unstable();
                format!("window:{}:{}:{}:{b:?}", self.size, self.min_tail, window)
            }
            ChunkStrategy::Semantic { .. } => format!("semantic:{}:{}", self.size, self.min_tail),
            ChunkStrategy::Document => format!("document:{}", self.min_tail),
        }
    }
}

/// One chunk of a prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Chunk {
    /// First token index (inclusive).
    pub start: usize,
    /// Last token index (exclusive).
    pub end: usize,
    /// The chunk's token ids.
    pub tokens: Vec<u32>,
    /// Names the chunk in its context (chained from the namespace root).
    pub prefix_key: PrefixKey,
    /// Names the chunk's tokens alone.
    pub content_key: ContentKey,
    /// Whether the chunk is worth storing (a short last chunk is not).
    pub cacheable: bool,
}

impl Chunk {
    /// Number of tokens.
    pub fn len(&self) -> usize {
        self.end - self.start
    }

    /// Whether the chunk is empty (never true for chunks from [`split`]).
    pub fn is_empty(&self) -> bool {
        self.end == self.start
    }

    /// The span of token indices.
    pub fn span(&self) -> Range<usize> {
        self.start..self.end
    }
}

/// Token ids whose text ends a sentence or a line, from `(id, text)` pairs of a vocabulary.
pub fn boundary_tokens<'a>(vocab: impl IntoIterator<Item = (u32, &'a str)>) -> HashSet<u32> {
    vocab
        .into_iter()
        .filter(|(_, text)| {
            let t = text.trim_end_matches([' ', '\t']);
            t.ends_with(['.', '!', '?', '\n']) || t.ends_with("Ċ") // byte-level BPE's newline
        })
        .map(|(id, _)| id)
        .collect()
}

/// The end of each chunk, in order; the last is `n`.
fn cut_points(n: usize, config: &ChunkConfig, tokens: &[u32]) -> Vec<usize> {
    let size = config.size.max(1);
    let mut cuts = Vec::new();
    match &config.strategy {
        // An empty prompt has no chunk, not one empty chunk.
        ChunkStrategy::Document if n > 0 => cuts.push(n),
        ChunkStrategy::Document => {}
        ChunkStrategy::Fixed => {
            let mut at = 0;
            while at < n {
                at = (at + size).min(n);
                cuts.push(at);
            }
        }
        ChunkStrategy::BoundaryWindow {
            window,
            boundary_tokens,
        } => {
            let window = (*window).min(size - 1);
            let mut start = 0;
            while start < n {
                let target = start + size;
                if target >= n {
                    cuts.push(n);
                    break;
                }
                // A cut at c falls after token c - 1; candidates closest to the target first,
                // the earlier one on a tie.
                let best = (0..=window)
                    .flat_map(|d| [target - d, target + d])
                    .filter(|&c| c > start && c <= n)
                    .find(|&c| boundary_tokens.contains(&tokens[c - 1]));
                let cut = best.unwrap_or(target);
                cuts.push(cut);
                start = cut;
            }
        }
        ChunkStrategy::Semantic { paragraph_starts } => {
            let mut starts: Vec<usize> = paragraph_starts
                .iter()
                .copied()
                .filter(|&s| s > 0 && s < n)
                .collect();
            starts.sort_unstable();
            starts.dedup();
            starts.push(n);
            let mut chunk_start = 0;
            let mut para_start = 0;
            for &para_end in &starts {
                // Close the current chunk if this paragraph would overflow it.
                if para_end - chunk_start > size && para_start > chunk_start {
                    cuts.push(para_start);
                    chunk_start = para_start;
                }
                // A paragraph longer than `size` is cut at fixed size.
                while para_end - chunk_start > size {
                    chunk_start += size;
                    cuts.push(chunk_start);
                }
                para_start = para_end;
            }
            if chunk_start < n {
                cuts.push(n);
            }
        }
    }
    cuts
}

/// Splits `tokens` into chunks and keys them under `namespace`.
pub fn split(tokens: &[u32], config: &ChunkConfig, namespace: &Namespace) -> Vec<Chunk> {
    let mut parent = namespace.root();
    let mut start = 0;
    let cuts = cut_points(tokens.len(), config, tokens);
    let count = cuts.len();
    cuts.into_iter()
        .enumerate()
        .map(|(i, end)| {
            let t = &tokens[start..end];
            let prefix_key = namespace.prefix_key(&parent, t);
            parent = prefix_key;
            let is_last = i + 1 == count;
            let chunk = Chunk {
                start,
                end,
                tokens: t.to_vec(),
                prefix_key,
                content_key: namespace.content_key(t),
                cacheable: !is_last || t.len() >= config.min_tail,
            };
            start = end;
            chunk
        })
        .collect()
}
