//! Reading a model straight from a `.gguf` file: config, weights (dequantized to f32, in the HF
//! layout and naming) and tokenizer.

mod dequant;
mod hf_names;
mod parse;
mod tokenizer;

pub use dequant::dequantize;
pub use parse::{GgmlType, GgufHeader, GgufValue, TensorInfo};

use crate::config::ModelConfig;
use crate::error::{ModelError, Result};
use crate::weights::{HostTensor, TensorSource};
use memmap2::Mmap;
use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;

/// A memory-mapped GGUF model file.
pub struct GgufModel {
    header: GgufHeader,
    mmap: Mmap,
    /// The GGUF `general.architecture` (e.g. `llama`).
    arch: String,
    /// HF tensor name -> GGUF tensor name.
    hf_to_gguf: BTreeMap<String, String>,
}

impl GgufModel {
    /// Opens and validates `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| ModelError::io(path, e))?;
        // SAFETY: read-only map; every offset is checked against the map's length at parse time.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| ModelError::io(path, e))?;
        let header = GgufHeader::parse(&mmap, path)?;
        let arch = header
            .get("general.architecture")?
            .as_str()
            .unwrap_or_default()
            .to_string();
        if !hf_names::SUPPORTED_ARCHS.contains(&arch.as_str()) {
            return Err(ModelError::Unsupported(format!(
                "GGUF architecture `{arch}`: kvb reads GGUF files of {:?}; convert other models to a \
                 HuggingFace folder",
                hf_names::SUPPORTED_ARCHS
            )));
        }
        if header.tensors.contains_key("rope_freqs.weight") {
            return Err(ModelError::Unsupported(
                "GGUF with a `rope_freqs` tensor (Llama 3.1 rope scaling): load the HuggingFace folder instead"
                    .into(),
            ));
        }
        let hf_to_gguf = header
            .tensors
            .keys()
            .map(|g| (hf_names::to_hf(g).unwrap_or_else(|| g.clone()), g.clone()))
            .collect();
        Ok(GgufModel {
            header,
            mmap,
            arch,
            hf_to_gguf,
        })
    }

    /// The parsed header (metadata and tensor infos).
    pub fn header(&self) -> &GgufHeader {
        &self.header
    }

    /// The model configuration, from GGUF metadata.
    pub fn config(&self, strict: bool) -> Result<ModelConfig> {
        let json = hf_names::config_json(&self.header, &self.arch)?;
        ModelConfig::from_json(&json.to_string(), strict)
    }

    /// A `tokenizer.json` equivalent to the GGUF's `tokenizer.ggml.*` metadata.
    pub fn tokenizer_json(&self) -> Result<serde_json::Value> {
        tokenizer::tokenizer_json(&self.header)
    }

    /// The chat template stored in the file, if any.
    pub fn chat_template(&self) -> Option<String> {
        self.header
            .metadata
            .get("tokenizer.chat_template")
            .and_then(|v| v.as_str())
            .map(String::from)
    }

    /// The text of a special token by its metadata id key (e.g. `tokenizer.ggml.eos_token_id`).
    pub fn special_token(&self, id_key: &str) -> Option<String> {
        let id = self.header.metadata.get(id_key)?.as_u64()? as usize;
        let tokens = self
            .header
            .metadata
            .get("tokenizer.ggml.tokens")?
            .as_array()?;
        tokens.get(id)?.as_str().map(String::from)
    }

    fn head_count(&self, key: &str) -> Result<usize> {
        let k = format!("{}.{key}", self.arch);
        self.header
            .get(&k)?
            .as_u64()
            .map(|v| v as usize)
            .ok_or_else(|| ModelError::Gguf {
                path: self.header.path.clone(),
                reason: format!("`{k}` is not an integer"),
            })
    }
}

impl TensorSource for GgufModel {
    fn names(&self) -> Vec<String> {
        self.hf_to_gguf.keys().cloned().collect()
    }

    fn shape(&self, name: &str) -> Option<Vec<usize>> {
        let g = self.hf_to_gguf.get(name)?;
        self.header.tensors.get(g).map(|t| t.shape.clone())
    }

    fn read(&self, name: &str) -> Result<HostTensor> {
        let g = self
            .hf_to_gguf
            .get(name)
            .ok_or_else(|| ModelError::Weights(format!("tensor `{name}` is missing")))?;
        let info = &self.header.tensors[g];
        let mut data = dequantize(info.ggml_type, &self.mmap[info.range.clone()]);
        // llama.cpp interleaves the two RoPE halves of each q/k head for the llama architecture.
        if self.arch == "llama" {
            if g.ends_with("attn_q.weight") || g.ends_with("attn_q.bias") {
                data = hf_names::unpermute_rows(
                    &data,
                    &info.shape,
                    self.head_count("attention.head_count")?,
                )?;
            } else if g.ends_with("attn_k.weight") || g.ends_with("attn_k.bias") {
                let kv = self
                    .head_count("attention.head_count_kv")
                    .or_else(|_| self.head_count("attention.head_count"))?;
                data = hf_names::unpermute_rows(&data, &info.shape, kv)?;
            }
        }
        Ok(HostTensor {
            shape: info.shape.clone(),
            data,
        })
    }
}
