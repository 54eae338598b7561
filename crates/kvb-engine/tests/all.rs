//! kvb-engine's integration tests as one binary: each file below is a module. One binary links
//! and instantiates the crate's generic code (every backend) once, not once a file.

mod common;

mod batch_smollm2;
mod every_backend;
mod fidelity_smollm2;
mod fidelity_tiny;
mod reuse_tiny;
mod scheduler;
