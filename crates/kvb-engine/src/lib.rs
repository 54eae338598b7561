//! # kvb-engine: chunk-level K/V reuse
//!
//! The product: split a prompt into chunks, look their keys up in the store, assemble cached K/V
//! plus the live suffix, repair seams, run the model only where needed, decode, and store the new
//! chunks. Exact prefix reuse gives bit-identical greedy output to a full prefill.
//!
//! Not implemented yet: it is built by the engine issue on top of kvb-model, kvb-store and
//! kvb-repair.
#![warn(missing_docs)]
