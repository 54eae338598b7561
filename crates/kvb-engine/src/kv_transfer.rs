//! Moving K/V between the chunk store (host, maybe quantized) and a sequence's pool blocks.

use crate::blocks::BlockId;
use crate::plan::Piece;
use crate::EngineError;
use kvb_model::rope::Rope;
use kvb_model::{HostKv, KvPool, ModelBackend};
use kvb_store::{KvData, KvFormat, LayerKv};
use rayon::prelude::*;

/// Writes `pieces` into the sequence with block table `table`, each at its slots. With `rerotate`
/// (pieces computed at other positions), keys move from their stored positions to their slots
/// (slot = position) on the way. Returns the tokens written.
///
/// An f32 chunk that stays where it was computed is written straight from the store's memory into
/// the pool's (one pass, the layers in parallel on the CPU). Quantized or half chunks are widened
/// (and moved keys rotated) into a per-layer scratch first, the layers in parallel, and written
/// from there the same way: one widening pass and one copy per value.
pub(crate) fn write_pieces<B: ModelBackend>(
    pool: &mut KvPool<B>,
    table: &[BlockId],
    pieces: &[Piece],
    rerotate: Option<&Rope>,
) -> Result<usize, EngineError> {
    let (h, d) = pool.head_shape();
    let layers = pool.num_layers();
    let mut written = 0;
    // Per layer: widened keys and values, reused from piece to piece.
    let mut wide: Vec<(Vec<f32>, Vec<f32>)> = vec![Default::default(); layers];
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
        // An f32 chunk at its own positions: straight from the store's memory.
        let f32s: Option<Vec<(HostKv, HostKv)>> = match rerotate {
            Some(_) => None,
            None => c
                .layers
                .iter()
                .map(|kv| match (&kv.k, &kv.v) {
                    (KvData::F32(k), KvData::F32(v)) => Some((
                        tokens_of(k, t, p.range.start),
                        tokens_of(v, t, p.range.start),
                    )),
                    _ => None,
                })
                .collect(),
        };
        if let Some(srcs) = f32s {
            pool.write_host_all(&slots, &srcs)?;
            written += n;
            continue;
        }
        let moved: Option<(&Rope, Vec<usize>, Vec<usize>)> = rerotate.map(|rope| {
            let from = c.positions[p.range.clone()]
                .iter()
                .map(|&x| x as usize)
                .collect();
            (rope, from, (p.start..p.end()).collect())
        });
        wide.par_iter_mut()
            .zip(c.layers.par_iter())
            .for_each(|((k, v), kv)| {
                widen(&kv.k, k);
                widen(&kv.v, v);
                if let Some((rope, from, to)) = &moved {
                    // Only the piece's keys move: cut them out, then rotate them in place.
                    *k = tokens_of(k, t, p.range.start).rows(h, d, n);
                    rope.rerotate_host(k, from, to);
                }
            });
        let srcs: Vec<(HostKv, HostKv)> = wide
            .iter()
            .map(|(k, v)| match moved {
                Some(_) => (HostKv::all(k, n), tokens_of(v, t, p.range.start)),
                None => (
                    tokens_of(k, t, p.range.start),
                    tokens_of(v, t, p.range.start),
                ),
            })
            .collect();
        pool.write_host_all(&slots, &srcs)?;
        written += n;
    }
    Ok(written)
}

/// Tokens from `first` of a chunk's layer `data` holding `tokens` per head.
fn tokens_of(data: &[f32], tokens: usize, first: usize) -> HostKv<'_> {
    HostKv {
        data,
        tokens,
        first,
    }
}

/// `data` as f32 into `out` (resized to fit).
fn widen(data: &KvData, out: &mut Vec<f32>) {
    out.resize(data.len(), 0.0);
    data.write_f32(out);
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

#[cfg(test)]
mod tests {
    use super::*;
    use kvb_hash::Namespace;
    use kvb_quant::{Bits, QuantConfig};
    use kvb_store::KvChunk;
    use proptest::prelude::*;
    use std::sync::Arc;

    type Cpu = burn::backend::NdArray<f32>;
    const LAYERS: usize = 3;
    const HEADS: usize = 2;
    const DIM: usize = 8;
    const BLOCK: usize = 4;

    /// A stored chunk of `t` tokens in `format`, with values spread per layer and head.
    fn chunk(t: usize, format: KvFormat, seed: u32) -> KvChunk {
        let ns = Namespace::builder().model_fingerprint(b"transfer").build();
        let tokens: Vec<u32> = (0..t as u32).collect();
        let values = |l: usize, which: u32| -> Vec<f32> {
            (0..HEADS * t * DIM)
                .map(|i| {
                    let x = (i as u32 ^ seed).wrapping_mul(2_654_435_761) ^ (l as u32 * 31 + which);
                    (x % 2001) as f32 / 1000.0 - 1.0
                })
                .collect()
        };
        let shape = [HEADS, t, DIM];
        KvChunk {
            prefix_key: ns.prefix_key(&ns.root(), &tokens),
            content_key: ns.content_key(&tokens),
            parent: ns.root(),
            positions: (0..t as u32).collect(),
            kv_heads: HEADS,
            head_dim: DIM,
            layers: (0..LAYERS)
                .map(|l| LayerKv {
                    k: format.encode(values(l, 1), shape, true).unwrap(),
                    v: format.encode(values(l, 2), shape, false).unwrap(),
                })
                .collect(),
            tokens,
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(32))]
        /// Whatever the chunk's format and the piece's range and slot, the pool holds the
        /// chunk's widened values at the piece's slots afterwards: the parallel widening writes
        /// exactly what widening each layer and copying its tokens one by one would.
        #[test]
        fn pieces_land_in_their_slots_as_widened(
            t in 1usize..20, cut in (0usize..20, 0usize..20), start in 0usize..9,
            format in 0usize..3, seed in 0u32..1000,
        ) {
            let format = match format {
                0 => KvFormat::F32,
                1 => KvFormat::F16,
                _ => KvFormat::Kivi(QuantConfig { bits: Bits::Eight, group_size: 4 }),
            };
            let (a, b) = (cut.0 % t, cut.1 % t);
            let range = a.min(b)..a.max(b) + 1;
            let c = Arc::new(chunk(t, format, seed));
            let blocks = (start + range.len()).div_ceil(BLOCK);
            // A block table in reverse pool order: slots of neighbouring blocks are not adjacent.
            let table: Vec<BlockId> = (0..blocks as u32).rev().collect();
            let mut pool = KvPool::<Cpu>::new(LAYERS, (HEADS, DIM), BLOCK, blocks, &Default::default()).unwrap();
            let piece = Piece { start, chunk: c.clone(), range: range.clone() };
            let written = write_pieces(&mut pool, &table, &[piece], None).unwrap();
            prop_assert_eq!(written, range.len());
            let slots = pool.pool_slots(&table, start..start + range.len()).unwrap();
            for (l, kv) in c.layers.iter().enumerate() {
                let (k, v) = pool.read_host(l, &slots).unwrap();
                for (got, data) in [(k, &kv.k), (v, &kv.v)] {
                    let mut wide = vec![0f32; data.len()];
                    data.write_f32(&mut wide);
                    let want = tokens_of(&wide, t, range.start).rows(HEADS, DIM, range.len());
                    prop_assert_eq!(got, want, "layer {}", l);
                }
            }
        }
    }
}
