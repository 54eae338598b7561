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
    for l in 0..layers {
        let mut k = Vec::with_capacity(h * total * d);
        let mut v = Vec::with_capacity(h * total * d);
        let decoded: Vec<(Vec<f32>, Vec<f32>)> = pieces
            .iter()
            .map(|p| (p.chunk.layers[l].k.to_f32(), p.chunk.layers[l].v.to_f32()))
            .collect();
        for head in 0..h {
            for (p, (pk, pv)) in pieces.iter().zip(&decoded) {
                let t = p.chunk.len();
                let from = (head * t + p.range.start) * d;
                let to = (head * t + p.range.end) * d;
                k.extend_from_slice(&pk[from..to]);
                v.extend_from_slice(&pv[from..to]);
            }
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
