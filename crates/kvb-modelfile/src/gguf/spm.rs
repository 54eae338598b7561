//! SentencePiece vocabularies (`tokenizer.ggml.model = "llama"`: Llama 2, Mistral, Gemma) as
//! a `tokenizer.json`: BPE with byte fallback whose merges come from the pieces' scores.
//!
//! llama.cpp tokenizes such a vocabulary by joining, again and again, the adjacent pair whose
//! joined text is the highest-scoring piece (the leftmost on ties), and spells a character that
//! is no piece as its UTF-8 bytes (`<0xXX>` pieces). BPE with one merge per way of cutting a
//! piece in two pieces, ranked by the whole piece's score, makes the same choices; transformers
//! converts SentencePiece models the same way. Spaces become `▁`, and a `▁` goes in front of the
//! text unless the file says `tokenizer.ggml.add_space_prefix = false` (Gemma).

use super::parse::{GgufHeader, GgufValue};
use super::tokenizer::{bad, GgufVocab, NORMAL, UNKNOWN};
use crate::error::Result;
use serde_json::{json, Value};
use std::collections::HashMap;

/// SentencePiece's word boundary, which stands for a space.
const SPACE: &str = "\u{2581}";

pub(super) fn tokenizer_json(h: &GgufHeader, vocab: &GgufVocab) -> Result<Value> {
    let scores: Vec<f32> = h
        .get("tokenizer.ggml.scores")?
        .as_array()
        .ok_or_else(|| bad(h, "`tokenizer.ggml.scores` is not an array".into()))?
        .iter()
        .map(|s| s.as_f64().map(|s| s as f32))
        .collect::<Option<_>>()
        .ok_or_else(|| bad(h, "a token score is not a number".into()))?;
    if scores.len() != vocab.tokens.len() {
        return Err(bad(
            h,
            format!(
                "{} token scores for {} tokens",
                scores.len(),
                vocab.tokens.len()
            ),
        ));
    }
    let add_prefix = !matches!(
        h.metadata.get("tokenizer.ggml.add_space_prefix"),
        Some(GgufValue::Bool(false))
    );
    let unknown = vocab
        .types
        .iter()
        .position(|&t| t == UNKNOWN)
        .map(|id| vocab.tokens[id]);
    let to_space = json!({"type": "Replace", "pattern": {"String": " "}, "content": SPACE});
    let normalizer = if add_prefix {
        json!({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": SPACE}, to_space]})
    } else {
        to_space
    };
    let mut decoders = vec![
        json!({"type": "Replace", "pattern": {"String": SPACE}, "content": " "}),
        json!({"type": "ByteFallback"}),
        json!({"type": "Fuse"}),
    ];
    if add_prefix {
        decoders.push(json!({"type": "Strip", "content": " ", "start": 1, "stop": 0}));
    }
    let merges: Vec<Value> = merges(vocab, &scores)
        .into_iter()
        .map(|(l, r)| json!([vocab.tokens[l], vocab.tokens[r]]))
        .collect();
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": vocab.added_tokens(true),
        "normalizer": normalizer,
        "pre_tokenizer": null,
        "post_processor": null,
        "decoder": {"type": "Sequence", "decoders": decoders},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": unknown, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": true, "byte_fallback": true,
            "ignore_merges": false, "vocab": vocab.vocab_json(), "merges": merges,
        },
    }))
}

/// Every way of joining two normal pieces into a normal piece, best whole-piece score first;
/// among the cuts of one piece, by the ids of its two parts.
fn merges(vocab: &GgufVocab, scores: &[f32]) -> Vec<(usize, usize)> {
    let normal = |id: usize| vocab.types[id] == NORMAL;
    let mut ids: HashMap<&str, usize> = HashMap::new();
    for (id, t) in vocab.tokens.iter().enumerate() {
        if normal(id) {
            ids.entry(t).or_insert(id);
        }
    }
    let mut merges: Vec<(f32, usize, usize)> = Vec::new();
    for (id, piece) in vocab.tokens.iter().enumerate() {
        if !normal(id) {
            continue;
        }
        let mut cuts: Vec<(usize, usize)> = piece
            .char_indices()
            .skip(1)
            .filter_map(|(at, _)| Some((*ids.get(&piece[..at])?, *ids.get(&piece[at..])?)))
            .collect();
        cuts.sort_unstable();
        merges.extend(cuts.into_iter().map(|(l, r)| (scores[id], l, r)));
    }
    // Stable: equal scores keep the order above.
    merges.sort_by(|a, b| b.0.total_cmp(&a.0));
    merges.into_iter().map(|(_, l, r)| (l, r)).collect()
}
