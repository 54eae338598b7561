//! kvb-model's integration tests as one binary: each file below is a module. One binary links
//! and instantiates the crate's generic code (every backend) once, not once a file.

mod common;

mod batched;
mod bf16_compute;
mod cube_ops;
mod device_sampling;
mod gguf;
mod gguf_families;
mod gguf_tokenizer;
mod golden_smollm2;
mod golden_tiny;
mod incremental;
mod llama_cpp_files;
mod malformed_checkpoints;
mod packed_weights;
mod q8_activations;
mod wgpu_backend;
