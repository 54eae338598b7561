//! A `tokenizer.json` built from GGUF `tokenizer.ggml.*` metadata (byte-level BPE).
//!
//! The serialised form is the single source of truth of the `tokenizers` crate, so the GGUF path
//! produces that form and both load paths share one tokenizer implementation.

use super::parse::{GgufHeader, GgufValue};
use crate::error::{ModelError, Result};
use serde_json::{json, Map, Value};

/// GGUF token types (llama.cpp's `llama_token_type`).
const CONTROL: i64 = 3;
const USER_DEFINED: i64 = 4;

/// Pre-tokenizers of the `tokenizer.ggml.pre` values kvb knows.
fn pre_tokenizer(pre: &str) -> Option<Value> {
    let byte_level = |use_regex: bool| json!({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": use_regex});
    let split = |pattern: &str| json!({"type": "Split", "pattern": {"Regex": pattern}, "behavior": "Isolated", "invert": false});
    const LLAMA3: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    const QWEN2: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
    Some(match pre {
        // SmolLM's tokenizer splits every digit before the GPT-2 byte-level split.
        "smollm" => json!({"type": "Sequence", "pretokenizers": [
            {"type": "Digits", "individual_digits": true}, byte_level(true)]}),
        "default" | "gpt2" => byte_level(true),
        "llama-bpe" | "llama3" => {
            json!({"type": "Sequence", "pretokenizers": [split(LLAMA3), byte_level(false)]})
        }
        "qwen2" => json!({"type": "Sequence", "pretokenizers": [split(QWEN2), byte_level(false)]}),
        _ => return None,
    })
}

pub fn tokenizer_json(h: &GgufHeader) -> Result<Value> {
    let bad = |reason: String| ModelError::Gguf {
        path: h.path.clone(),
        reason,
    };
    let model = h.get("tokenizer.ggml.model")?.as_str().unwrap_or_default();
    if model != "gpt2" {
        return Err(ModelError::Unsupported(format!(
            "GGUF tokenizer model `{model}`: kvb builds byte-level BPE (`gpt2`) tokenizers from GGUF; \
             use the model's HuggingFace folder with its tokenizer.json"
        )));
    }
    let pre_name = h
        .metadata
        .get("tokenizer.ggml.pre")
        .and_then(GgufValue::as_str)
        .unwrap_or("default");
    let pre = pre_tokenizer(pre_name).ok_or_else(|| {
        ModelError::Unsupported(format!("GGUF pre-tokenizer `{pre_name}` is not supported"))
    })?;
    let tokens = h
        .get("tokenizer.ggml.tokens")?
        .as_array()
        .ok_or_else(|| bad("`tokenizer.ggml.tokens` is not an array".into()))?;
    let types: Vec<i64> = match h
        .metadata
        .get("tokenizer.ggml.token_type")
        .and_then(GgufValue::as_array)
    {
        Some(a) => a
            .iter()
            .map(|v| match v {
                GgufValue::I64(i) => *i,
                GgufValue::U64(u) => *u as i64,
                _ => 1,
            })
            .collect(),
        None => vec![1; tokens.len()],
    };
    let merges: Vec<Value> = h
        .get("tokenizer.ggml.merges")?
        .as_array()
        .ok_or_else(|| bad("`tokenizer.ggml.merges` is not an array".into()))?
        .iter()
        .map(|m| m.as_str().map(|s| Value::String(s.to_string())))
        .collect::<Option<_>>()
        .ok_or_else(|| bad("a merge is not a string".into()))?;

    let mut vocab = Map::new();
    let mut added = Vec::new();
    for (id, tok) in tokens.iter().enumerate() {
        let text = tok
            .as_str()
            .ok_or_else(|| bad(format!("token {id} is not a string")))?;
        vocab.insert(text.to_string(), json!(id));
        let kind = types.get(id).copied().unwrap_or(1);
        if kind == CONTROL || kind == USER_DEFINED {
            added.push(json!({
                "id": id, "content": text, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": kind == CONTROL,
            }));
        }
    }
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": added,
        "normalizer": null,
        "pre_tokenizer": pre,
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": false, "vocab": vocab, "merges": merges,
        },
    }))
}
