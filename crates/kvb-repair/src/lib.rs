//! # kvb-repair: seam repair for reused K/V
//!
//! When K/V computed for one context is reused in another, the tokens right after each seam (and
//! any chunk moved to a new position) were encoded without the context they now follow. This crate
//! will hold the strategies that fix that against the assembled cache:
//! - **selective**: recompute the first tokens after every seam;
//! - **CacheBlend**: find the tokens whose K deviates most in the first layer and recompute only those
//!   through the remaining layers;
//! - **none**.
//!
//! Not implemented yet: the engine issue builds it on `kvb_model::Model::forward_at_slots`.
#![warn(missing_docs)]
