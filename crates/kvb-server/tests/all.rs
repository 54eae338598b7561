//! kvb-server's integration tests as one binary: each file below is a module. One binary links
//! and instantiates the crate's generic code (every backend) once, not once a file.

mod common;

mod bad_inputs;
mod chat_tiny;
mod launch_counts;
mod replay_tiny;
mod serve_clients;
mod serve_requests;
mod serve_smollm2;
mod serve_structured;
mod serve_tenants;
mod serve_tiny;
mod serve_tools;
mod shared_tier;
mod verify_tiny;
