//! Writing a GGUF model out as an equivalent HuggingFace folder (f32 safetensors).

use crate::error::{ModelError, Result};
use crate::gguf::GgufModel;
use crate::weights::TensorSource;
use safetensors::tensor::TensorView;
use safetensors::Dtype;
use std::path::Path;

/// Writes `config.json`, `model.safetensors` (f32, HF layout), `tokenizer.json`,
/// `tokenizer_config.json` (with the chat template) and `generation_config.json` into `out`.
/// Files are written under a temporary name and renamed, so `out` never holds a half-written set.
pub fn gguf_to_hf_folder(gguf_path: &Path, out: &Path) -> Result<()> {
    let gguf = GgufModel::open(gguf_path)?;
    let config = gguf.config(true)?;
    let tmp = out.with_extension("partial");
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).map_err(|e| ModelError::io(&tmp, e))?;
    }
    std::fs::create_dir_all(&tmp).map_err(|e| ModelError::io(&tmp, e))?;
    let write = |name: &str, text: String| -> Result<()> {
        let p = tmp.join(name);
        std::fs::write(&p, text).map_err(|e| ModelError::io(&p, e))
    };
    let pretty = |v: &serde_json::Value| serde_json::to_string_pretty(v).unwrap_or_default();

    write("config.json", pretty(&config.to_hf_json()))?;
    write("tokenizer.json", pretty(&gguf.tokenizer_json()?))?;
    let bos = gguf.special_token("tokenizer.ggml.bos_token_id");
    let eos = gguf.special_token("tokenizer.ggml.eos_token_id");
    write(
        "tokenizer_config.json",
        pretty(&serde_json::json!({
            "add_bos_token": false,
            "add_eos_token": false,
            "bos_token": bos,
            "eos_token": eos,
            "chat_template": gguf.chat_template(),
            "model_max_length": config.max_position_embeddings,
            "tokenizer_class": "GPT2Tokenizer",
        })),
    )?;
    write(
        "generation_config.json",
        pretty(&serde_json::json!({
            "bos_token_id": config.bos_token_id,
            "eos_token_id": config.eos_token_ids.first(),
        })),
    )?;

    let mut names = gguf.names();
    names.sort();
    let mut tensors = Vec::with_capacity(names.len());
    for name in names {
        let t = gguf.read(&name)?;
        let bytes: Vec<u8> = t.data.iter().flat_map(|v| v.to_le_bytes()).collect();
        tensors.push((name, t.shape, bytes));
    }
    let views = tensors
        .iter()
        .map(|(name, shape, bytes)| {
            TensorView::new(Dtype::F32, shape.clone(), bytes)
                .map(|v| (name.clone(), v))
                .map_err(|e| ModelError::weights(format!("tensor `{name}`: {e}")))
        })
        .collect::<Result<Vec<_>>>()?;
    let st = tmp.join("model.safetensors");
    let mut meta = std::collections::HashMap::new();
    meta.insert("format".to_string(), "pt".to_string());
    safetensors::serialize_to_file(views, Some(meta), &st)
        .map_err(|e| ModelError::weights(format!("{}: {e}", st.display())))?;

    if out.exists() {
        std::fs::remove_dir_all(out).map_err(|e| ModelError::io(out, e))?;
    }
    std::fs::rename(&tmp, out).map_err(|e| ModelError::io(out, e))
}
