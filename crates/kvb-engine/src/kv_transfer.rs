//! Moving K/V between the chunk store (host, maybe quantized) and a sequence's pool blocks.

use crate::blocks::BlockId;
use crate::plan::Piece;
use crate::EngineError;
use kvb_model::rope::Rope;
use kvb_model::{HostKv, KvPool, ModelBackend};
use kvb_store::{KvData, KvFormat, LayerKv};

/// Writes `pieces` into the sequence with block table `table`, each at its slots. With `rerotate`
/// (pieces computed at other positions), keys move from their stored positions to their slots
/// (slot = position) on the way. Returns the tokens written.
///
/// An f32 chunk that stays where it was computed is written straight from the store's memory into
/// the pool's (one pass, the layers in parallel on the CPU); quantized or half chunks are widened,
/// and moved keys rotated, into a scratch row first.
pub(crate) fn write_pieces<B: ModelBackend>(
    pool: &mut KvPool<B>,
    table: &[BlockId],
    pieces: &[Piece],
    rerotate: Option<&Rope>,
) -> Result<usize, EngineError> {
    let (h, d) = pool.head_shape();
    let layers = pool.num_layers();
    let mut written = 0;
    let (mut wide_k, mut wide_v) = (Vec::new(), Vec::new());
    for p in pieces {
        let c = &p.chunk;
        if (c.kv_heads, c.head_dim) != (h, d) || c.layers.len() != layers {
            return Err(EngineError::Cache(format!(
                "a stored chunk has {} layers of {}x{}; the model {layers} of {h}x{d}",
                c.layers.len(),
                c.kv_heads,
                c.head_dim
            )));
        }
        let t = c.len();
        let n = p.range.len();
        let slots = pool.pool_slots(table, p.start..p.end())?;
        let from: Vec<usize> = c.positions[p.range.clone()]
            .iter()
            .map(|&x| x as usize)
            .collect();
        let to: Vec<usize> = (p.start..p.end()).collect();
        // An f32 chunk at its own positions: straight from the store's memory, every layer at
        // once (in parallel where the backend can).
        let f32s: Option<Vec<(HostKv, HostKv)>> = match rerotate {
            Some(_) => None,
            None => c
                .layers
                .iter()
                .map(|kv| match (&kv.k, &kv.v) {
                    (KvData::F32(k), KvData::F32(v)) => {
                        let src = |data| HostKv {
                            data,
                            tokens: t,
                            first: p.range.start,
                        };
                        Some((src(k), src(v)))
                    }
                    _ => None,
                })
                .collect(),
        };
        if let Some(srcs) = f32s {
            pool.write_host_all(&slots, &srcs)?;
            written += n;
            continue;
        }
        for (l, kv) in c.layers.iter().enumerate() {
            let host = |data: &KvData, wide: &mut Vec<f32>, rotate: bool| -> Vec<f32> {
                // A piece of the chunk, `[h, n, d]`, widened (and rotated) in scratch.
                wide.resize(data.len(), 0.0);
                data.write_f32(wide);
                let mut rows = HostKv {
                    data: wide,
                    tokens: t,
                    first: p.range.start,
                }
                .rows(h, d, n);
                if rotate {
                    if let Some(rope) = rerotate {
                        rope.rerotate_host(&mut rows, &from, &to);
                    }
                }
                rows
            };
            let k = host(&kv.k, &mut wide_k, true);
            let v = host(&kv.v, &mut wide_v, false);
            pool.write_host(l, &slots, HostKv::all(&k, n), HostKv::all(&v, n))?;
        }
        written += n;
    }
    Ok(written)
}

/// The K/V of logical slots `slots` of a sequence (block table `table`) as a chunk's layers, in
/// `format`.
pub(crate) fn read_layers<B: ModelBackend>(
    pool: &KvPool<B>,
    table: &[BlockId],
    slots: std::ops::Range<usize>,
    format: KvFormat,
) -> Result<Vec<LayerKv>, EngineError> {
    let (h, d) = pool.head_shape();
    let shape = [h, slots.len(), d];
    let pool_slots = pool.pool_slots(table, slots)?;
    (0..pool.num_layers())
        .map(|l| {
            let (k, v) = pool.read_host(l, &pool_slots)?;
            let encode = |x: Vec<f32>, is_key: bool| -> Result<KvData, EngineError> {
                format
                    .encode(x, shape, is_key)
                    .map_err(|e| EngineError::Cache(e.to_string()))
            };
            Ok(LayerKv {
                k: encode(k, true)?,
                v: encode(v, false)?,
            })
        })
        .collect()
}
