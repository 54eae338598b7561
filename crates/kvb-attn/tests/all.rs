//! kvb-attn's integration tests as one binary: each file below is a module. One binary links
//! and instantiates the crate's generic code (every backend) once, not once a file.

mod common;

mod attention_matches_naive;
mod cube_matches_naive;
mod paged_matches_naive;
mod pool_memory;
