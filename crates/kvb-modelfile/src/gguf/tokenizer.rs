//! A `tokenizer.json` built from GGUF `tokenizer.ggml.*` metadata: byte-level BPE (`gpt2`:
//! Llama 3, Qwen2, SmolLM) or SentencePiece (`llama`: Llama 2, Mistral, Gemma; see [`super::spm`]).
//!
//! The serialised form is the single source of truth of the `tokenizers` crate, so the GGUF path
//! produces that form and both load paths share one tokenizer implementation.

use super::parse::{GgufHeader, GgufValue};
use super::spm;
use crate::error::{FileError, Result};
use serde_json::{json, Map, Value};

/// GGUF token types (llama.cpp's `llama_token_type`).
pub(super) const NORMAL: i64 = 1;
pub(super) const UNKNOWN: i64 = 2;
pub(super) const CONTROL: i64 = 3;
pub(super) const USER_DEFINED: i64 = 4;

/// The vocabulary part of the metadata every tokenizer model has.
pub(super) struct GgufVocab<'a> {
    pub tokens: Vec<&'a str>,
    /// One GGUF token type per token (normal where the file has none).
    pub types: Vec<i64>,
}

impl<'a> GgufVocab<'a> {
    fn read(h: &'a GgufHeader) -> Result<Self> {
        let tokens = h
            .get("tokenizer.ggml.tokens")?
            .as_array()
            .ok_or_else(|| bad(h, "`tokenizer.ggml.tokens` is not an array".into()))?
            .iter()
            .enumerate()
            .map(|(id, t)| {
                t.as_str()
                    .ok_or_else(|| bad(h, format!("token {id} is not a string")))
            })
            .collect::<Result<Vec<_>>>()?;
        let types = match h
            .metadata
            .get("tokenizer.ggml.token_type")
            .and_then(GgufValue::as_array)
        {
            Some(a) => (0..tokens.len())
                .map(|i| match a.get(i) {
                    Some(GgufValue::I64(v)) => *v,
                    Some(GgufValue::U64(v)) => *v as i64,
                    _ => NORMAL,
                })
                .collect(),
            None => vec![NORMAL; tokens.len()],
        };
        Ok(GgufVocab { tokens, types })
    }

    /// Every token by its text.
    pub fn vocab_json(&self) -> Map<String, Value> {
        self.tokens
            .iter()
            .enumerate()
            .map(|(id, t)| (t.to_string(), json!(id)))
            .collect()
    }

    /// Tokens matched whole before the model runs: control tokens (special), user-defined ones
    /// and, for SentencePiece, the unknown token.
    pub fn added_tokens(&self, unknown_too: bool) -> Vec<Value> {
        let mut added = Vec::new();
        for (id, (text, &kind)) in self.tokens.iter().zip(&self.types).enumerate() {
            let unknown = unknown_too && kind == UNKNOWN;
            if kind == CONTROL || kind == USER_DEFINED || unknown {
                added.push(json!({
                    "id": id, "content": text, "single_word": false, "lstrip": false,
                    "rstrip": false, "normalized": false, "special": kind != USER_DEFINED,
                }));
            }
        }
        added
    }
}

/// A metadata error naming the file.
pub(super) fn bad(h: &GgufHeader, reason: String) -> FileError {
    FileError::Gguf {
        path: h.path.clone(),
        reason,
    }
}

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
    let model = h.get("tokenizer.ggml.model")?.as_str().unwrap_or_default();
    let vocab = GgufVocab::read(h)?;
    match model {
        "gpt2" => byte_level_bpe(h, &vocab),
        "llama" => spm::tokenizer_json(h, &vocab),
        other => Err(FileError::Unsupported(format!(
            "GGUF tokenizer model `{other}`: kvb builds byte-level BPE (`gpt2`) and SentencePiece \
             (`llama`) tokenizers from GGUF; use the model's HuggingFace folder with its \
             tokenizer.json"
        ))),
    }
}

fn byte_level_bpe(h: &GgufHeader, vocab: &GgufVocab) -> Result<Value> {
    let pre_name = h
        .metadata
        .get("tokenizer.ggml.pre")
        .and_then(GgufValue::as_str)
        .unwrap_or("default");
    let pre = pre_tokenizer(pre_name).ok_or_else(|| {
        FileError::Unsupported(format!("GGUF pre-tokenizer `{pre_name}` is not supported"))
    })?;
    let merges: Vec<Value> = h
        .get("tokenizer.ggml.merges")?
        .as_array()
        .ok_or_else(|| bad(h, "`tokenizer.ggml.merges` is not an array".into()))?
        .iter()
        .map(|m| m.as_str().map(|s| Value::String(s.to_string())))
        .collect::<Option<_>>()
        .ok_or_else(|| bad(h, "a merge is not a string".into()))?;
    Ok(json!({
        "version": "1.0",
        "truncation": null,
        "padding": null,
        "added_tokens": vocab.added_tokens(false),
        "normalizer": null,
        "pre_tokenizer": pre,
        "post_processor": null,
        "decoder": {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
        "model": {
            "type": "BPE", "dropout": null, "unk_token": null, "continuing_subword_prefix": null,
            "end_of_word_suffix": null, "fuse_unk": false, "byte_fallback": false,
            "ignore_merges": false, "vocab": vocab.vocab_json(), "merges": merges,
        },
    }))
}
