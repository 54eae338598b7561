//! The seam through which a runtime that owns its K/V tensors (candle, mistral.rs, its own)
//! stores a chunk of it and writes a hit back into its own cache, with no tensor library.
//!
//! The runtime says how it holds one layer's K or V ([`KvLayout`]: token-major or head-major,
//! f32, f16 or bf16, any number of layers and K/V heads) and implements [`RuntimeKv`]: read the
//! bytes of a run of tokens of one layer's K or V, write them back. [`chunk_from_runtime`] makes a
//! [`KvChunk`] of a run (the store's layout: head-major per layer, in the chosen [`KvFormat`]);
//! [`write_chunk_into`] writes a stored chunk's K/V at any token offset of the runtime's cache.
//! Lookups are the store's own: [`ChunkStore::longest_prefix`](crate::ChunkStore::longest_prefix)
//! for an exact prefix, [`ChunkStore::get_by_content`](crate::ChunkStore::get_by_content) for a
//! chunk seen at another position, whose keys [`rope::rerotate_keys`] turns to the new positions.
//!
//! Promises (`tests/seam.rs`, property tests over orders, dtypes, layers, heads and offsets):
//! storing a run and writing it back gives the runtime the same bytes when the format keeps its
//! dtype (f32 always does); a moved chunk's re-rotated keys equal the keys computed at the new
//! positions within f32 rounding of the angles.
//!
//! A runtime's whole use, reuse before its prefill and storing after it (`examples/
//! candle-chunk-reuse` in kvb's workspace does this for candle):
//!
//! ```
//! # use kvb_store::seam::*;
//! # use std::ops::Range;
//! # struct MyCache { k: Vec<Vec<f32>>, v: Vec<Vec<f32>>, len: usize }
//! # const ROW: usize = 2 * 4; // kv_heads x head_dim
//! # impl RuntimeKv for MyCache {
//! #     fn layout(&self) -> KvLayout {
//! #         KvLayout { layers: 1, kv_heads: 2, head_dim: 4, order: KvOrder::TokenMajor, dtype: KvDtype::F32 }
//! #     }
//! #     fn read(&self, l: usize, p: KvPart, t: Range<usize>) -> Result<Vec<u8>, SeamError> {
//! #         let x = if p == KvPart::K { &self.k[l] } else { &self.v[l] };
//! #         Ok(x[t.start * ROW..t.end * ROW].iter().flat_map(|v| v.to_le_bytes()).collect())
//! #     }
//! #     fn write(&mut self, l: usize, p: KvPart, at: usize, b: &[u8]) -> Result<(), SeamError> {
//! #         let x = if p == KvPart::K { &mut self.k[l] } else { &mut self.v[l] };
//! #         for (i, c) in b.chunks_exact(4).enumerate() { x[at * ROW + i] = f32::from_le_bytes(c.try_into().unwrap()); }
//! #         self.len = self.len.max(at + b.len() / 4 / ROW);
//! #         Ok(())
//! #     }
//! # }
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # let tokens: Vec<u32> = (0..300).collect();
//! # let computed = MyCache { k: vec![(0..300 * ROW).map(|i| i as f32).collect()], v: vec![vec![0.5; 300 * ROW]], len: 300 };
//! # let mut cache = MyCache { k: vec![vec![0.0; 300 * ROW]], v: vec![vec![0.0; 300 * ROW]], len: 0 };
//! use kvb_store::{kvb_hash::Namespace, ChunkStore, KvFormat, StoreConfig};
//! let ns = Namespace::builder().model_fingerprint(b"my-model").build();
//! let (config, store) = (kvb_chunk::ChunkConfig::default(), ChunkStore::new(StoreConfig::ram(1 << 30))?);
//! // After a prefill: store each chunk the runtime computed (`computed` is its cache).
//! let chunks = kvb_chunk::split(&tokens, &config, &ns);
//! for (i, c) in chunks.iter().enumerate().filter(|(_, c)| c.cacheable) {
//!     let parent = if i == 0 { ns.root() } else { chunks[i - 1].prefix_key };
//!     let keys = ChunkKeys { prefix_key: c.prefix_key, content_key: c.content_key, parent };
//!     let positions: Vec<u32> = c.span().map(|p| p as u32).collect();
//!     store.insert(chunk_from_runtime(&computed, c.span(), &c.tokens, &positions, keys, KvFormat::F32)?)?;
//! }
//! // Before the next prefill: write the longest cached prefix into a fresh cache.
//! let hit = store.longest_prefix(ns.root(), &tokens)?.expect("stored above");
//! let mut at = 0;
//! for (chunk, used) in &hit.chunks {
//!     write_chunk_into(chunk, 0..*used, &mut cache, at)?;
//!     at += used;
//! }
//! assert_eq!(at, 300);
//! assert!(cache.read(0, KvPart::K, 0..at)? == computed.read(0, KvPart::K, 0..at)?);
//! // ... and run the model from token `at` on.
//! # Ok(())
//! # }
//! ```

pub mod rope;

use crate::chunk::{KvChunk, KvData, KvFormat, LayerKv};
use half::{bf16, f16};
use kvb_hash::{ContentKey, PrefixKey};
use std::ops::Range;

/// The axis order of one layer's K (or V) in a runtime's cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvOrder {
    /// `[tokens, kv_heads, head_dim]` (llama.cpp, most paged caches).
    TokenMajor,
    /// `[kv_heads, tokens, head_dim]` (HF transformers, candle's `KvCache`; the store's order).
    HeadMajor,
}

/// The element type of a runtime's cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvDtype {
    /// 32-bit floats.
    F32,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    Bf16,
}

impl KvDtype {
    /// Bytes per value.
    pub fn bytes(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 | KvDtype::Bf16 => 2,
        }
    }
}

/// How a runtime holds its K/V: the same for every layer, K and V alike. Values are
/// little-endian.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KvLayout {
    /// Layers.
    pub layers: usize,
    /// K/V heads per layer.
    pub kv_heads: usize,
    /// Width of a head.
    pub head_dim: usize,
    /// Axis order of a layer's K or V.
    pub order: KvOrder,
    /// Element type.
    pub dtype: KvDtype,
}

impl KvLayout {
    /// Bytes of `tokens` tokens of one layer's K (or V).
    pub fn run_bytes(&self, tokens: usize) -> usize {
        tokens * self.kv_heads * self.head_dim * self.dtype.bytes()
    }
}

/// K or V.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KvPart {
    /// Keys (after RoPE, as attention reads them).
    K,
    /// Values.
    V,
}

/// Why the seam could not move K/V.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SeamError {
    /// The runtime refused a read or a write (out of range, say).
    #[error("the runtime's cache: {0}")]
    Runtime(String),
    /// A chunk, a run or a byte count that does not fit the layout.
    #[error("layout: {0}")]
    Layout(String),
    /// The store's format could not encode the values.
    #[error("encoding: {0}")]
    Encode(String),
}

/// A runtime's K/V cache as the seam sees it: runs of tokens of one layer's K or V, as bytes in
/// the runtime's [`KvLayout`] (for a token-major layout a run is `tokens x kv_heads x head_dim`
/// values; head-major, `kv_heads x tokens x head_dim`, the run's tokens of each head together).
pub trait RuntimeKv {
    /// How the cache holds K/V.
    fn layout(&self) -> KvLayout;
    /// The bytes of `tokens` of layer `layer`'s `part` ([`KvLayout::run_bytes`] of them).
    fn read(&self, layer: usize, part: KvPart, tokens: Range<usize>) -> Result<Vec<u8>, SeamError>;
    /// Overwrites the run of `layer`'s `part` that starts at token `at` with `bytes`.
    fn write(
        &mut self,
        layer: usize,
        part: KvPart,
        at: usize,
        bytes: &[u8],
    ) -> Result<(), SeamError>;
}

/// What names a chunk in the store (see `kvb_hash::Namespace`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkKeys {
    /// The chunk in its context.
    pub prefix_key: PrefixKey,
    /// Its tokens alone.
    pub content_key: ContentKey,
    /// The chunk before it (the namespace root for a first chunk).
    pub parent: PrefixKey,
}

/// A chunk of the runtime's K/V over cache slots `slots` (holding `tokens`, computed at
/// `positions`), in the store's layout and `format`.
pub fn chunk_from_runtime(
    kv: &dyn RuntimeKv,
    slots: Range<usize>,
    tokens: &[u32],
    positions: &[u32],
    keys: ChunkKeys,
    format: KvFormat,
) -> Result<KvChunk, SeamError> {
    let layout = kv.layout();
    if slots.start > slots.end {
        return Err(SeamError::Layout(format!("slots {slots:?} run backwards")));
    }
    let n = slots.len();
    if tokens.len() != n || positions.len() != n {
        return Err(SeamError::Layout(format!(
            "{} slots, {} tokens and {} positions: a chunk needs one of each per slot",
            n,
            tokens.len(),
            positions.len()
        )));
    }
    let shape = [layout.kv_heads, n, layout.head_dim];
    let mut layers = Vec::with_capacity(layout.layers);
    for layer in 0..layout.layers {
        let [k, v] = [KvPart::K, KvPart::V].map(|part| -> Result<KvData, SeamError> {
            let bytes = kv.read(layer, part, slots.clone())?;
            check_run(&layout, n, bytes.len(), layer, part)?;
            let head_major = to_head_major(&layout, n, &bytes);
            encode(head_major, format, shape, part == KvPart::K)
        });
        layers.push(LayerKv { k: k?, v: v? });
    }
    Ok(KvChunk {
        prefix_key: keys.prefix_key,
        content_key: keys.content_key,
        parent: keys.parent,
        tokens: tokens.to_vec(),
        positions: positions.to_vec(),
        kv_heads: layout.kv_heads,
        head_dim: layout.head_dim,
        layers,
    })
}

/// Writes tokens `range` of `chunk` (all of them: `0..chunk.len()`) into the runtime's cache
/// from slot `at`, converted to its layout; the chunk's positions are the runtime's business
/// (re-rotate a moved chunk's keys first: [`rope::rerotate_chunk`]).
pub fn write_chunk_into(
    chunk: &KvChunk,
    range: Range<usize>,
    kv: &mut dyn RuntimeKv,
    at: usize,
) -> Result<(), SeamError> {
    let layout = kv.layout();
    if chunk.kv_heads != layout.kv_heads
        || chunk.head_dim != layout.head_dim
        || chunk.layers.len() != layout.layers
    {
        return Err(SeamError::Layout(format!(
            "a chunk of {} layers x {} K/V heads x {} does not fit a cache of {} x {} x {}",
            chunk.layers.len(),
            chunk.kv_heads,
            chunk.head_dim,
            layout.layers,
            layout.kv_heads,
            layout.head_dim
        )));
    }
    if range.start > range.end || range.end > chunk.len() {
        return Err(SeamError::Layout(format!(
            "tokens {range:?} of a chunk of {}",
            chunk.len()
        )));
    }
    chunk.check().map_err(SeamError::Layout)?;
    for (layer, kvs) in chunk.layers.iter().enumerate() {
        for (part, data) in [(KvPart::K, &kvs.k), (KvPart::V, &kvs.v)] {
            let bytes = from_head_major(&layout, chunk.len(), range.clone(), data);
            kv.write(layer, part, at, &bytes)?;
        }
    }
    Ok(())
}

fn check_run(
    layout: &KvLayout,
    tokens: usize,
    got: usize,
    layer: usize,
    part: KvPart,
) -> Result<(), SeamError> {
    let want = layout.run_bytes(tokens);
    if got == want {
        return Ok(());
    }
    Err(SeamError::Layout(format!(
        "layer {layer} {part:?}: the runtime gave {got} bytes for {tokens} tokens, the layout \
         needs {want}"
    )))
}

/// A run's values in the runtime's dtype, head-major: `[kv_heads, tokens, head_dim]`.
enum Values {
    F32(Vec<f32>),
    F16(Vec<f16>),
    Bf16(Vec<bf16>),
}

/// `bytes` (a run of `tokens` in `layout`) as head-major values of the runtime's dtype.
fn to_head_major(layout: &KvLayout, tokens: usize, bytes: &[u8]) -> Values {
    let (heads, dim, width) = (layout.kv_heads, layout.head_dim, layout.dtype.bytes());
    // The value at (head h, token t, element e) in the runtime's run.
    let at = |h: usize, t: usize, e: usize| match layout.order {
        KvOrder::TokenMajor => ((t * heads + h) * dim + e) * width,
        KvOrder::HeadMajor => ((h * tokens + t) * dim + e) * width,
    };
    let order =
        (0..heads).flat_map(|h| (0..tokens).flat_map(move |t| (0..dim).map(move |e| (h, t, e))));
    match layout.dtype {
        KvDtype::F32 => Values::F32(
            order
                .map(|(h, t, e)| f32::from_le_bytes(bytes[at(h, t, e)..][..4].try_into().unwrap()))
                .collect(),
        ),
        KvDtype::F16 => Values::F16(
            order
                .map(|(h, t, e)| f16::from_le_bytes([bytes[at(h, t, e)], bytes[at(h, t, e) + 1]]))
                .collect(),
        ),
        KvDtype::Bf16 => Values::Bf16(
            order
                .map(|(h, t, e)| bf16::from_le_bytes([bytes[at(h, t, e)], bytes[at(h, t, e) + 1]]))
                .collect(),
        ),
    }
}

/// The store's form of `values`: kept in their dtype where `format` is that dtype, otherwise
/// through f32 (widening is exact).
fn encode(
    values: Values,
    format: KvFormat,
    shape: [usize; 3],
    is_key: bool,
) -> Result<KvData, SeamError> {
    Ok(match (values, format) {
        (Values::F16(v), KvFormat::F16) => KvData::F16(v),
        (Values::Bf16(v), KvFormat::Bf16) => KvData::Bf16(v),
        (values, format) => {
            let wide = match values {
                Values::F32(v) => v,
                Values::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
                Values::Bf16(v) => v.iter().map(|x| x.to_f32()).collect(),
            };
            format
                .encode(wide, shape, is_key)
                .map_err(|e| SeamError::Encode(e.to_string()))?
        }
    })
}

/// Tokens `range` of `data` (a chunk of `tokens`, head-major) as bytes of the runtime's layout.
fn from_head_major(
    layout: &KvLayout,
    tokens: usize,
    range: Range<usize>,
    data: &KvData,
) -> Vec<u8> {
    let (heads, dim, width) = (layout.kv_heads, layout.head_dim, layout.dtype.bytes());
    let n = range.len();
    let mut out = vec![0u8; layout.run_bytes(n)];
    // 16-bit values bound for the same type are copied, not rounded through f32 and back.
    let wide = match (data, layout.dtype) {
        (KvData::F16(_), KvDtype::F16) | (KvData::Bf16(_), KvDtype::Bf16) => None,
        _ => Some(data.to_f32()),
    };
    for h in 0..heads {
        for (i, t) in range.clone().enumerate() {
            for e in 0..dim {
                let from = (h * tokens + t) * dim + e;
                let to = match layout.order {
                    KvOrder::TokenMajor => ((i * heads + h) * dim + e) * width,
                    KvOrder::HeadMajor => ((h * n + i) * dim + e) * width,
                };
                let dst = &mut out[to..to + width];
                match (&wide, data, layout.dtype) {
                    (None, KvData::F16(v), _) => dst.copy_from_slice(&v[from].to_le_bytes()),
                    (None, KvData::Bf16(v), _) => dst.copy_from_slice(&v[from].to_le_bytes()),
                    (Some(w), _, KvDtype::F32) => dst.copy_from_slice(&w[from].to_le_bytes()),
                    (Some(w), _, KvDtype::F16) => {
                        dst.copy_from_slice(&f16::from_f32(w[from]).to_le_bytes())
                    }
                    (Some(w), _, KvDtype::Bf16) => {
                        dst.copy_from_slice(&bf16::from_f32(w[from]).to_le_bytes())
                    }
                    (None, _, _) => unreachable!("only 16-bit data is copied as it is"),
                }
            }
        }
    }
    out
}
