//! # kvb-modelfile: a Llama-family model's files, without tensors
//!
//! What a runtime needs from the files people download, as host data, with no tensor library:
//! - [`gguf`]: a `.gguf` file parsed (header, metadata, tensor table; truncated or corrupt files
//!   are errors with the byte offset), its block types ([`gguf::GgmlType`]: Q4_0, Q4_1, Q5_0,
//!   Q5_1, Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS, F16, BF16, F32) with their
//!   dequantization to the f32 values llama.cpp's
//!   own code gives, GGUF tensor names turned into HuggingFace names and layout (llama.cpp's
//!   Q/K row permutation undone), the model's config from its metadata, and its tokenizer as a
//!   HuggingFace `tokenizer.json` (byte-level BPE and SentencePiece vocabularies);
//! - [`weights`]: safetensors folders and GGUF files behind one trait, handing out tensors by
//!   HF name as f32, as the file's blocks ([`BlockTensor`]) or read in place from the file's
//!   map a row at a time ([`MappedRows`]: an untied embedding), with a loader that makes a
//!   missing, misshapen or unused tensor an error naming it;
//! - [`config`]: a HuggingFace `config.json` and the check that kvb can serve it (decoder-only,
//!   positions through RoPE alone, the Llama block layout).
//!
//! Promises and the tests that prove them: each block type dequantizes as llama.cpp does
//! (`gguf::dequant` unit tests; `tests/gguf_blocks.rs` against llama.cpp's own dequantization
//! of `fixtures/gguf-blocks/`; whole files from llama.cpp's quantizer through kvb-model's
//! `tests/llama_cpp_files.rs`); a GGUF read here gives the model the
//! transformers logits (kvb-model's golden tests); malformed files are errors, never panics
//! (kvb-model's `tests/malformed_checkpoints.rs` and the fuzz targets of `fuzz/`).
#![warn(missing_docs)]

/// The README's example, run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;

mod block_tensor;
pub mod config;
pub mod error;
pub mod gguf;
mod mapped_rows;
pub mod weights;

pub use block_tensor::BlockTensor;
pub use config::{Family, ModelConfig, RopeScaling};
pub use error::{FileError, Result};
pub use mapped_rows::MappedRows;
