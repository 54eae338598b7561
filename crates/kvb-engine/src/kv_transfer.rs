//! Moving K/V between store chunks (host) and the live cache (device).

use crate::EngineError;
use burn::tensor::{Tensor, TensorData};
use kvb_model::rope::Rope;
use kvb_model::{KvCache, ModelBackend};
use kvb_store::{KvChunk, KvData, KvFormat, LayerKv};
use std::ops::Range;

/// A piece of a stored chunk to place in the cache: its tokens `range`.
pub struct Piece<'a> {
    /// The chunk.
    pub chunk: &'a KvChunk,
    /// Which of its tokens.
    pub range: Range<usize>,
}

/// Appends the pieces' K/V, in order, to the cache (one upload per layer). With `rerotate_to`,
/// keys are moved from their stored positions to these new ones (one per appended token).
pub fn append_pieces<B: ModelBackend>(
    cache: &mut KvCache<B>,
    pieces: &[Piece],
    rerotate_to: Option<(&Rope, &[usize])>,
) -> Result<usize, EngineError> {
    let Some(first) = pieces.first() else {
        return Ok(0);
    };
    let (h, d) = (first.chunk.kv_heads, first.chunk.head_dim);
    let total: usize = pieces.iter().map(|p| p.range.len()).sum();
    let layers = first.chunk.layers.len();
    if (h, d) != cache.head_shape() || layers != cache.num_layers() {
        return Err(EngineError::Cache(format!(
            "stored chunk has {layers} layers of {h}x{d}, the model {} of {:?}",
            cache.num_layers(),
            cache.head_shape()
        )));
    }
    let device = cache.device().clone();
    let stored_positions: Vec<usize> = pieces
        .iter()
        .flat_map(|p| {
            p.chunk.positions[p.range.clone()]
                .iter()
                .map(|&x| x as usize)
        })
        .collect();
    let rerotation =
        rerotate_to.map(|(rope, to)| rope.rerotation_tables::<B>(&stored_positions, to, &device));
    let mut per_layer = Vec::with_capacity(layers);
    // Quantized and half-precision chunks are widened into these, once per chunk and layer; f32
    // chunks are copied straight from the store. Each piece lands in the `[heads, total, dim]`
    // layout of the upload, one contiguous run per head.
    let (mut wide_k, mut wide_v) = (Vec::new(), Vec::new());
    for l in 0..layers {
        let mut k = vec![0f32; h * total * d];
        let mut v = vec![0f32; h * total * d];
        let mut offset = 0;
        for p in pieces {
            let t = p.chunk.len();
            let kv = &p.chunk.layers[l];
            for (dst, data, wide) in [(&mut k, &kv.k, &mut wide_k), (&mut v, &kv.v, &mut wide_v)] {
                let src: &[f32] = match data {
                    KvData::F32(x) => x,
                    other => {
                        wide.resize(other.len(), 0.0);
                        other.write_f32(wide);
                        wide
                    }
                };
                for head in 0..h {
                    let from = (head * t + p.range.start) * d;
                    let to = (head * t + p.range.end) * d;
                    let at = (head * total + offset) * d;
                    dst[at..at + (to - from)].copy_from_slice(&src[from..to]);
                }
            }
            offset += p.range.len();
        }
        let kt = Tensor::<B, 4>::from_data(TensorData::new(k, [1, h, total, d]), &device);
        let vt = Tensor::<B, 4>::from_data(TensorData::new(v, [1, h, total, d]), &device);
        let kt = match &rerotation {
            Some(tables) => tables.apply(kt),
            None => kt,
        };
        per_layer.push((kt, vt));
    }
    cache.append(per_layer).map_err(EngineError::Model)?;
    Ok(total)
}

fn host(t: Tensor<impl burn::tensor::backend::Backend, 4>) -> Result<Vec<f32>, EngineError> {
    t.into_data()
        .convert::<f32>()
        .to_vec::<f32>()
        .map_err(|e| EngineError::Cache(format!("reading K/V: {e:?}")))
}

/// The K/V of cache slots `range` as a chunk's layers, in `format`.
pub fn read_layers<B: ModelBackend>(
    cache: &KvCache<B>,
    range: Range<usize>,
    format: KvFormat,
) -> Result<Vec<LayerKv>, EngineError> {
    let (h, d) = cache.head_shape();
    let shape = [h, range.len(), d];
    (0..cache.num_layers())
        .map(|l| {
            let (k, v) = cache.read(l, range.clone()).map_err(EngineError::Model)?;
            let encode = |x: Vec<f32>, is_key: bool| -> Result<KvData, EngineError> {
                format
                    .encode(x, shape, is_key)
                    .map_err(|e| EngineError::Cache(e.to_string()))
            };
            Ok(LayerKv {
                k: encode(host(k)?, true)?,
                v: encode(host(v)?, false)?,
            })
        })
        .collect()
}
