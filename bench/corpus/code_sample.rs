//! Helpers over chunk K/V along the token axis: merge consecutive chunks, slice a token range.

use crate::chunk::{KvChunk, KvData, LayerKv};

/// Per-layer (K, V) as f32, each `[kv_heads, tokens, head_dim]`.
pub type LayersF32 = Vec<(Vec<f32>, Vec<f32>)>;

/// Number of tokens of per-layer K/V with `kv_heads` x `head_dim` heads.
pub fn kv_seq_len(layers: &LayersF32, kv_heads: usize, head_dim: usize) -> usize {
    layers
        .first()
        .map_or(0, |(k, _)| k.len() / (kv_heads * head_dim).max(1))
}

/// Concatenates `[h, t_i, d]` blocks along the token axis.
fn cat_tokens(blocks: &[&[f32]], lens: &[usize], h: usize, d: usize) -> Vec<f32> {
    let total: usize = lens.iter().sum();
    let mut out = Vec::with_capacity(h * total * d);
    for head in 0..h {
        for (b, &t) in blocks.iter().zip(lens) {
            out.extend_from_slice(&b[head * t * d..(head + 1) * t * d]);
        }
    }
    out
}

/// The K/V of consecutive chunks joined into one sequence (as f32).
pub fn merge_kv(chunks: &[&KvChunk]) -> LayersF32 {
    let Some(first) = chunks.first() else {
        return Vec::new();
    };
    let (h, d) = (first.kv_heads, first.head_dim);
    let lens: Vec<usize> = chunks.iter().map(|c| c.len()).collect();
    (0..first.layers.len())
        .map(|l| {
            let ks: Vec<Vec<f32>> = chunks.iter().map(|c| c.layers[l].k.to_f32()).collect();
            let vs: Vec<Vec<f32>> = chunks.iter().map(|c| c.layers[l].v.to_f32()).collect();
            let kr: Vec<&[f32]> = ks.iter().map(Vec::as_slice).collect();
            let vr: Vec<&[f32]> = vs.iter().map(Vec::as_slice).collect();
            (cat_tokens(&kr, &lens, h, d), cat_tokens(&vr, &lens, h, d))
        })
        .collect()
}

/// Tokens `start..end` of a chunk's K/V (as f32), or `None` if the range is outside the chunk.
pub fn slice_kv(chunk: &KvChunk, start: usize, end: usize) -> Option<LayersF32> {
    if start > end || end > chunk.len() {
        return None;
    }
    let (h, t, d) = (chunk.kv_heads, chunk.len(), chunk.head_dim);
    Some(
        chunk
            .layers
            .iter()
            .map(|LayerKv { k, v }| {
                (
                    slice_block(&k.to_f32(), h, t, d, start, end),
                    slice_block(&v.to_f32(), h, t, d, start, end),
                )
            })
            .collect(),
    )
}
