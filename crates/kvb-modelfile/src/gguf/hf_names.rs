//! GGUF names, layout and metadata mapped to their HuggingFace equivalents.

use super::parse::{GgufHeader, GgufValue};
use crate::error::{FileError, Result};

/// GGUF architectures whose tensors map onto the Llama layout kvb runs.
pub const SUPPORTED_ARCHS: [&str; 3] = ["llama", "qwen2", "gemma"];

/// The HF name of a GGUF tensor, or `None` for a name kvb does not know.
pub fn to_hf(gguf: &str) -> Option<String> {
    let fixed = match gguf {
        "token_embd.weight" => Some("model.embed_tokens.weight"),
        "output_norm.weight" => Some("model.norm.weight"),
        "output.weight" => Some("lm_head.weight"),
        _ => None,
    };
    if let Some(f) = fixed {
        return Some(f.to_string());
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, tail) = rest.split_once('.')?;
    let layer: usize = layer.parse().ok()?;
    let (part, kind) = tail.rsplit_once('.')?;
    let hf = match part {
        "attn_norm" => "input_layernorm",
        "ffn_norm" => "post_attention_layernorm",
        "attn_q" => "self_attn.q_proj",
        "attn_k" => "self_attn.k_proj",
        "attn_v" => "self_attn.v_proj",
        "attn_output" => "self_attn.o_proj",
        "ffn_gate" => "mlp.gate_proj",
        "ffn_up" => "mlp.up_proj",
        "ffn_down" => "mlp.down_proj",
        _ => return None,
    };
    Some(format!("model.layers.{layer}.{hf}.{kind}"))
}

/// Undoes llama.cpp's q/k row permutation: GGUF rows are ordered `[heads, head_dim/2, 2]`, HF rows
/// `[heads, 2, head_dim/2]` (the two RoPE halves of each head).
pub fn unpermute_rows<T: Copy + Default>(
    data: &[T],
    shape: &[usize],
    heads: usize,
) -> Result<Vec<T>> {
    let rows = shape[0];
    // Elements per row: a quantized row is its run of block bytes.
    let cols = data.len() / rows.max(1);
    if heads == 0 || !rows.is_multiple_of(heads * 2) || cols * rows != data.len() {
        return Err(FileError::Weights(format!(
            "cannot undo the RoPE row permutation of a {shape:?} tensor over {heads} heads"
        )));
    }
    let half = rows / heads / 2;
    let mut out = vec![T::default(); data.len()];
    for h in 0..heads {
        for i in 0..half {
            for s in 0..2 {
                let src = (h * half * 2 + i * 2 + s) * cols;
                let dst = (h * 2 * half + s * half + i) * cols;
                out[dst..dst + cols].copy_from_slice(&data[src..src + cols]);
            }
        }
    }
    Ok(out)
}

/// A transformers-style `config.json` built from GGUF metadata, and the file's `rope_freqs`
/// tensor (per-frequency RoPE divisors) when it has one.
pub fn config_json(
    h: &GgufHeader,
    arch: &str,
    rope_freqs: Option<Vec<f32>>,
) -> Result<serde_json::Value> {
    let meta = |key: &str| h.metadata.get(&format!("{arch}.{key}"));
    let int = |key: &str| -> Result<u64> {
        meta(key)
            .and_then(GgufValue::as_u64)
            .ok_or_else(|| FileError::Gguf {
                path: h.path.clone(),
                reason: format!("metadata `{arch}.{key}` is missing or not an integer"),
            })
    };
    let heads = int("attention.head_count")?;
    let hidden = int("embedding_length")?;
    let kv_heads = int("attention.head_count_kv").unwrap_or(heads);
    let head_dim = int("rope.dimension_count")
        .or_else(|_| int("attention.key_length"))
        .unwrap_or(hidden / heads.max(1));
    let embed = h
        .tensors
        .get("token_embd.weight")
        .ok_or_else(|| FileError::Gguf {
            path: h.path.clone(),
            reason: "tensor `token_embd.weight` is missing".into(),
        })?;
    let rope_scaling = match meta("rope.scaling.type").and_then(GgufValue::as_str) {
        Some("none") | None if rope_freqs.is_some() => {
            serde_json::json!({"rope_type": "freq_factors", "factors": rope_freqs})
        }
        Some("linear") if rope_freqs.is_some() => {
            return Err(FileError::Unsupported(
                "a GGUF with both linear rope scaling and a `rope_freqs` tensor".into(),
            ))
        }
        Some("linear") => serde_json::json!({
            "rope_type": "linear",
            "factor": meta("rope.scaling.factor").and_then(GgufValue::as_f64).unwrap_or(1.0),
        }),
        Some("none") | None => serde_json::Value::Null,
        Some(other) => {
            return Err(FileError::Unsupported(format!(
                "GGUF rope scaling `{other}` is not supported"
            )))
        }
    };
    let token_id = |key: &str| h.metadata.get(key).and_then(GgufValue::as_u64);
    let architecture = match arch {
        "qwen2" => "Qwen2ForCausalLM",
        "gemma" => "GemmaForCausalLM",
        _ => "LlamaForCausalLM",
    };
    Ok(serde_json::json!({
        "architectures": [architecture],
        "hidden_size": hidden,
        "intermediate_size": int("feed_forward_length")?,
        "num_hidden_layers": int("block_count")?,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": head_dim,
        "vocab_size": embed.shape[0],
        "max_position_embeddings": int("context_length").unwrap_or(2048),
        "rms_norm_eps": meta("attention.layer_norm_rms_epsilon").and_then(GgufValue::as_f64).unwrap_or(1e-5),
        "rope_theta": meta("rope.freq_base").and_then(GgufValue::as_f64).unwrap_or(10_000.0),
        "rope_scaling": rope_scaling,
        "tie_word_embeddings": !h.tensors.contains_key("output.weight"),
        "bos_token_id": token_id("tokenizer.ggml.bos_token_id"),
        "eos_token_id": token_id("tokenizer.ggml.eos_token_id"),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_to_hf() {
        assert_eq!(
            to_hf("blk.3.attn_q.weight").unwrap(),
            "model.layers.3.self_attn.q_proj.weight"
        );
        assert_eq!(
            to_hf("blk.0.ffn_norm.weight").unwrap(),
            "model.layers.0.post_attention_layernorm.weight"
        );
        assert_eq!(to_hf("output.weight").unwrap(), "lm_head.weight");
        assert_eq!(to_hf("rope_freqs.weight"), None);
    }

    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        // 2 heads of head_dim 4, 1 column; HF rows (h, s, i) hold value 100h + 10s + i.
        let hf: Vec<f32> = (0..2)
            .flat_map(|h| {
                (0..2).flat_map(move |s| (0..2).map(move |i| (100 * h + 10 * s + i) as f32))
            })
            .collect();
        // llama.cpp orders rows (h, i, s).
        let gguf: Vec<f32> = (0..2)
            .flat_map(|h| {
                (0..2).flat_map(move |i| (0..2).map(move |s| (100 * h + 10 * s + i) as f32))
            })
            .collect();
        assert_eq!(unpermute_rows(&gguf, &[8, 1], 2).unwrap(), hf);
    }
}
