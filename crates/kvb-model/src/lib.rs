//! # kvb-model: Llama-family RoPE models over burn
//!
//! A forward pass that kvb's cache can work with: it runs tokens at **explicit positions** against a
//! given [`KvCache`], computes logits only for the rows asked for, and leaves the K (after RoPE) and
//! V of every layer readable and writable per token range, so an engine can save, splice, re-rotate
//! and restore them.
//!
//! | what | where |
//! |---|---|
//! | configs (Llama, Qwen2, Mistral, Gemma, Phi-3) and the compatibility check | [`config`] (from [`kvb_modelfile`]) |
//! | weights from safetensors (single or sharded; f32/f16/bf16) | [`weights`] (from [`kvb_modelfile`]) |
//! | weights, config and tokenizer from GGUF (F32/F16/BF16/Q8_0/Q4_0/Q4_1/Q4_K/Q5_K/Q6_K) | [`gguf`] (from [`kvb_modelfile`], a crate without tensors) |
//! | weights kept packed in their stored precision (every GGUF quantized type; K-quants at the file's bits), `--weights` | [`packed`], [`WeightPrecision`] |
//! | products with 8-bit activations, as llama.cpp computes (`--activations q8`, CPU) | `model::int8`, [`ActivationPrecision`] |
//! | a projection's weight in any format behind one trait (f32, packed, 8-bit layouts, stacks, or another crate's): its product, size and conversions | [`LinearWeight`] |
//! | tokenizer and chat templates | [`tokenizer`] |
//! | RoPE at arbitrary positions, re-rotation of cached keys | [`rope`] |
//! | the transformer and its forward pass over ragged batches | [`model`] |
//! | K/V in blocks shared by many sequences (f32, or f16 on the CPU; a GPU backend's own float type); one sequence's cache | [`kv_pool`], [`FloatDtype`], [`kv_cache`] |
//! | greedy and sampled generation with streaming | [`generate`] |
//! | the embedded default model (SmolLM2-135M-Instruct) | [`fetch`] |
//!
//! Backends are cargo features: `ndarray` (default), `wgpu`, `cuda`; the code is one generic path.
//! A backend overrides a row operation only where it has a measured reason to ([`ModelBackend`]):
//! burn-ndarray with fused CPU passes, the CubeCL backends with one kernel each for RMSNorm, the
//! head split with RoPE and the gated activation, and a decode step's projections (up to 16 rows)
//! over weights held `[out, in]` (`tests/cube_ops.rs`). A GPU backend may hold f16 or bf16
//! ([`FloatDtype`], `--dtype`): its kernels sum in f32 and round once on write, and every
//! tensor kvb creates names the backend's float type ([`float_on`]; `tests/wgpu_backend.rs` runs the
//! tiny families in f16 against f32).
//!
//! Promises, each proved by a test:
//! - logits match HuggingFace transformers (golden files) for every supported family, from a
//!   folder and from GGUF (`tests/golden_*.rs`);
//! - prefilling in parts at explicit positions, or decoding token by token, equals one prefill
//!   (`tests/incremental.rs`);
//! - a sequence run in a ragged batch with others, its K/V anywhere in a pool, gives the same
//!   logits as run alone, bit for bit on the CPU (`tests/batched.rs`);
//! - a GGUF's K-quant matrices (Q2_K, Q3_K_M, Q4_K_M, Q5_K_M, Q6_K files) take within 5% of the
//!   file's bytes
//!   (`tests/llama_cpp_files.rs`);
//! - weights kept packed compute the bits their f32 expansion computes (`tests/packed_weights.rs`,
//!   and SmolLM2's GGUF against its converted folder in `tests/golden_smollm2.rs`);
//! - with 8-bit activations, a row's result does not depend on the rows beside it (vector and
//!   portable kernels give the same bits, `model::int8`'s tests; batches in `tests/batched.rs`),
//!   and rounding the activations moves the logits no more than it moves llama.cpp's
//!   (`tests/q8_activations.rs`); a loaded model nothing else holds takes them without a copy
//!   of its K-quant matrices beside them (`tests/q8_in_place.rs`);
//! - an f16 pool gives back exactly what was written, rounded to nearest even, and attention over
//!   it equals attention over those values widened to f32, bit for bit ([`kv_pool`]'s tests,
//!   kvb-attn's `paged_matches_naive.rs`);
//! - re-rotating keys from position p to q equals encoding them at q ([`rope`]);
//! - the CubeCL row kernels give the reference ops' values within f32 rounding
//!   (`tests/cube_ops.rs`, on lavapipe in CI);
//! - malformed configs, checkpoints and GGUF files are errors naming the problem, never panics.
//!
//! ```no_run
//! use kvb_model::{load_pretrained, LoadOptions, generate::{generate, GenerateParams}};
//! type B = burn::backend::NdArray<f32>;
//! let m = load_pretrained::<B>("models/SmolLM2-135M-Instruct".as_ref(), LoadOptions::default(),
//!                              &Default::default(), &mut |_, _| {}).unwrap();
//! let ids = m.tokenizer.encode("The capital of France is", false).unwrap();
//! let out = generate(&m.model, &m.tokenizer, &ids, &GenerateParams::default(), &mut |_| {}).unwrap();
//! println!("{}", out.decoded.text);
//! ```
#![warn(missing_docs)]

pub mod backends;
mod chat_tokens;
pub mod convert;
mod error;
pub mod fetch;
pub mod generate;
mod host_ids;
mod host_memory;
pub mod kv_cache;
pub mod model;
pub use kvb_gemm::packed;
mod pretrained;
pub mod rope;
pub mod tokenizer;

pub use config::{Family, ModelConfig, RopeScaling};
pub use error::{ModelError, Result};
pub use host_memory::release_freed_host_memory;
pub use kv_cache::KvCache;
/// Creation options naming a backend's float type, the K/V pool, host reads (see kvb-attn).
pub use kvb_attn::{
    float_dtype, float_on, host_work, pool as kv_pool, to_host_f32, FloatDtype, HostKv, HostWork,
    KvPool,
};
pub use kvb_modelfile::{config, gguf, weights};
pub use model::{
    ActivationPrecision, ComputePrecision, ForwardBatch, LinearWeight, LogitsFor, Model,
    ModelBackend, SeqRows, WeightPrecision,
};
pub use pretrained::{
    detect_format, load_config, load_pretrained, LoadOptions, ModelFormat, Pretrained,
};
pub use tokenizer::{ChatFunctionCall, ChatMessage, ChatToolCall, Tokenizer};

/// burn, whose `Backend` and tensors this crate's API takes.
pub use burn;
/// Attention and its backend trait ([`ModelBackend`]'s supertrait).
pub use kvb_attn;
/// The tokenizer library [`tokenizer::Tokenizer`] wraps.
pub use tokenizers;

/// The README's example, run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
