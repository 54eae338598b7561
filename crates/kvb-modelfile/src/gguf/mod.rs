//! Reading a model straight from a `.gguf` file: config, weights (dequantized to f32, in the HF
//! layout and naming) and tokenizer.

pub mod blocks;
mod dequant;
mod hf_names;
mod parse;
mod spm;
mod tokenizer;

pub use dequant::dequantize;
pub use parse::{GgmlType, GgufHeader, GgufValue, TensorInfo};

use crate::config::ModelConfig;
use crate::error::{FileError, Result};
use crate::weights::{HostTensor, StoredTensor, TensorSource};
use crate::{BlockTensor, MappedRows};
use memmap2::Mmap;
use std::collections::BTreeMap;
use std::fs::File;
use std::path::Path;
use std::sync::Arc;

/// The tensor of per-frequency RoPE divisors (part of the configuration, not a weight).
const ROPE_FREQS: &str = "rope_freqs.weight";

/// A memory-mapped GGUF model file.
pub struct GgufModel {
    header: GgufHeader,
    mmap: Arc<Mmap>,
    /// Whether the map is of a file (whose pages can be given back and read again).
    file_backed: bool,
    /// The GGUF `general.architecture` (e.g. `llama`).
    arch: String,
    /// HF tensor name -> GGUF tensor name.
    hf_to_gguf: BTreeMap<String, String>,
}

impl GgufModel {
    /// Opens and validates `path`.
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|e| FileError::io(path, e))?;
        // SAFETY: read-only map; every offset is checked against the map's length at parse time.
        let mmap = unsafe { Mmap::map(&file) }.map_err(|e| FileError::io(path, e))?;
        let mut model = Self::from_map(path, mmap)?;
        model.file_backed = true;
        Ok(model)
    }

    /// A GGUF file held in memory (`name` appears in errors), read as [`Self::open`] reads a file.
    pub fn from_bytes(name: &Path, bytes: &[u8]) -> Result<Self> {
        let mmap = crate::weights::map_bytes(bytes).map_err(|e| FileError::io(name, e))?;
        Self::from_map(name, mmap)
    }

    fn from_map(path: &Path, mmap: Mmap) -> Result<Self> {
        let header = GgufHeader::parse(&mmap, path)?;
        let arch = header
            .get("general.architecture")?
            .as_str()
            .unwrap_or_default()
            .to_string();
        if !hf_names::SUPPORTED_ARCHS.contains(&arch.as_str()) {
            return Err(FileError::Unsupported(format!(
                "GGUF architecture `{arch}`: kvb reads GGUF files of {:?}; convert other models to a \
                 HuggingFace folder",
                hf_names::SUPPORTED_ARCHS
            )));
        }
        let hf_to_gguf = header
            .tensors
            .keys()
            .filter(|g| g.as_str() != ROPE_FREQS)
            .map(|g| (hf_names::to_hf(g).unwrap_or_else(|| g.clone()), g.clone()))
            .collect();
        Ok(GgufModel {
            header,
            mmap: Arc::new(mmap),
            file_backed: false,
            arch,
            hf_to_gguf,
        })
    }

    /// The parsed header (metadata and tensor infos).
    pub fn header(&self) -> &GgufHeader {
        &self.header
    }

    /// The model configuration, from GGUF metadata (and the `rope_freqs` tensor, with which
    /// llama.cpp stores Llama 3.1/3.2's RoPE scaling).
    pub fn config(&self, strict: bool) -> Result<ModelConfig> {
        let rope_freqs = self
            .header
            .tensors
            .get(ROPE_FREQS)
            .map(|info| dequantize(info.ggml_type, &self.mmap[info.range.clone()]));
        let json = hf_names::config_json(&self.header, &self.arch, rope_freqs)?;
        ModelConfig::from_json(&json.to_string(), strict)
    }

    /// A `tokenizer.json` equivalent to the GGUF's `tokenizer.ggml.*` metadata.
    pub fn tokenizer_json(&self) -> Result<serde_json::Value> {
        tokenizer::tokenizer_json(&self.header)
    }

    /// How many tokens `tokenizer.ggml.tokens` lists (0 where it lists none), known before the
    /// tokenizer is built.
    pub fn vocabulary_len(&self) -> usize {
        self.header
            .metadata
            .get("tokenizer.ggml.tokens")
            .and_then(|v| v.as_array())
            .map_or(0, |tokens| tokens.len())
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
            .ok_or_else(|| FileError::Gguf {
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
        let (info, g) = self.info(name)?;
        let mut data = dequantize(info.ggml_type, &self.mmap[info.range.clone()]);
        self.release(&info.range);
        if self.arch == "gemma" && g.ends_with("norm.weight") {
            // llama.cpp stores Gemma's RMSNorm weights as 1 + w; kvb's Gemma multiplies by
            // 1 + w itself. For a stored value s >= 0, s - 1 is exact, so 1 + w gives s back
            // bit for bit.
            data.iter_mut().for_each(|x| *x -= 1.0);
        }
        Ok(HostTensor {
            shape: info.shape.clone(),
            data: self.unpermute(g, &info.shape, data)?,
        })
    }

    /// A 2-d tensor of a mapped file, read in place, where its rows are the file's as they are
    /// (not q/k, whose rows llama.cpp permutes) and its type one a model keeps as stored.
    fn read_mapped(&self, name: &str) -> Result<Option<MappedRows>> {
        let (info, g) = self.info(name)?;
        let permuted = self.arch == "llama" && (g.contains("attn_q.") || g.contains("attn_k."));
        if !self.file_backed
            || permuted
            || info.shape.len() != 2
            || !BlockTensor::packable(info.ggml_type)
        {
            return Ok(None);
        }
        let (rows, cols) = (info.shape[0], info.shape[1]);
        let rows = MappedRows::new(
            self.mmap.clone(),
            info.range.clone(),
            info.ggml_type,
            rows,
            cols,
        )?;
        Ok(Some(rows))
    }

    /// A 2-d quantized tensor as its blocks (rows in the HF order), anything else as f32.
    fn read_stored(&self, name: &str) -> Result<StoredTensor> {
        let (info, g) = self.info(name)?;
        if info.shape.len() != 2 || !BlockTensor::packable(info.ggml_type) {
            return self.read(name).map(StoredTensor::F32);
        }
        let bytes = self.mmap[info.range.clone()].to_vec();
        self.release(&info.range);
        Ok(StoredTensor::Blocks(BlockTensor {
            ggml_type: info.ggml_type,
            rows: info.shape[0],
            cols: info.shape[1],
            bytes: self.unpermute(g, &info.shape, bytes)?,
        }))
    }
}

impl GgufModel {
    /// Gives the pages of a tensor already copied back to the page cache, so that loading does
    /// not hold the file mapped beside the weights built from it (peak memory: the weights,
    /// not the weights plus the file). A file's pages are read again if touched again.
    fn release(&self, range: &std::ops::Range<usize>) {
        #[cfg(unix)]
        if self.file_backed {
            // SAFETY: a read-only map of a file: dropped pages are read back from the file on
            // the next access, so no value seen through the map changes. (An in-memory map would
            // come back zeroed, hence `file_backed`.) A failure only keeps the pages.
            let _ = unsafe {
                self.mmap.unchecked_advise_range(
                    memmap2::UncheckedAdvice::DontNeed,
                    range.start,
                    range.len(),
                )
            };
        }
    }

    fn info(&self, name: &str) -> Result<(&TensorInfo, &str)> {
        let g = self
            .hf_to_gguf
            .get(name)
            .ok_or_else(|| FileError::Weights(format!("tensor `{name}` is missing")))?;
        Ok((&self.header.tensors[g], g))
    }

    /// Rows of a GGUF tensor in the HF order: llama.cpp interleaves the two RoPE halves of each
    /// q/k head for the llama architecture. `data` holds whole rows (values or block bytes).
    fn unpermute<T: Copy + Default>(
        &self,
        g: &str,
        shape: &[usize],
        data: Vec<T>,
    ) -> Result<Vec<T>> {
        if self.arch != "llama" {
            return Ok(data);
        }
        if g.ends_with("attn_q.weight") || g.ends_with("attn_q.bias") {
            hf_names::unpermute_rows(&data, shape, self.head_count("attention.head_count")?)
        } else if g.ends_with("attn_k.weight") || g.ends_with("attn_k.bias") {
            let kv = self
                .head_count("attention.head_count_kv")
                .or_else(|_| self.head_count("attention.head_count"))?;
            hf_names::unpermute_rows(&data, shape, kv)
        } else {
            Ok(data)
        }
    }
}
