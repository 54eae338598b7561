//! # kvb-server: the `kvb` command line and its HTTP server, as a library
//!
//! The binary (`src/main.rs`) only parses the command line and calls into these modules; they are
//! a library so that the server can be embedded and so that what reads outside input (request
//! bodies, replay request files) can be fuzzed directly (`fuzz/` at the workspace root).

pub mod allocator;
pub mod backend;
pub mod commands;
pub mod model_arg;
mod peak_memory;
pub mod serve;
mod stop_signal;

/// The crates whose types this crate's API takes or returns.
pub use {anyhow, axum, kvb_engine, kvb_model, serde_json, tokio};

/// The README's example, run as a doctest.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
