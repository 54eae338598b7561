//! Chunk builders shared by the store's tests.
#![allow(dead_code)]

use kvb_hash::{Namespace, PrefixKey};
use kvb_store::{KvChunk, KvData, LayerKv};

pub fn ns() -> Namespace {
    Namespace::builder()
        .model_fingerprint(b"store-tests")
        .build()
}

/// A chunk of `tokens` following `parent`, with 2 layers of one 4-wide head whose values encode
/// the tokens (so a wrong chunk is detectable by its data).
pub fn chunk_after(ns: &Namespace, parent: PrefixKey, tokens: &[u32], start_pos: u32) -> KvChunk {
    let n = tokens.len();
    let vals = |salt: f32| -> Vec<f32> {
        tokens
            .iter()
            .flat_map(|&t| (0..4).map(move |j| t as f32 + salt + j as f32 * 0.01))
            .collect::<Vec<_>>()
    };
    KvChunk {
        prefix_key: ns.prefix_key(&parent, tokens),
        content_key: ns.content_key(tokens),
        parent,
        tokens: tokens.to_vec(),
        positions: (start_pos..start_pos + n as u32).collect(),
        kv_heads: 1,
        head_dim: 4,
        layers: vec![
            LayerKv {
                k: KvData::F32(vals(0.0)),
                v: KvData::F32(vals(0.5)),
            },
            LayerKv {
                k: KvData::F32(vals(1.0)),
                v: KvData::F32(vals(1.5)),
            },
        ],
    }
}

/// A first chunk of a prompt.
pub fn chunk(ns: &Namespace, tokens: &[u32]) -> KvChunk {
    chunk_after(ns, ns.root(), tokens, 0)
}

/// `count` distinct first chunks of `len` tokens each.
pub fn distinct_chunks(ns: &Namespace, count: usize, len: usize) -> Vec<KvChunk> {
    (0..count)
        .map(|i| {
            chunk(
                ns,
                &(0..len as u32)
                    .map(|t| t + 1000 * i as u32)
                    .collect::<Vec<_>>(),
            )
        })
        .collect()
}
