//! Helpers shared by kvb-engine's tests on the tiny reference models (no download).
#![allow(dead_code)]

use kvb_engine::{Engine, EngineConfig, GenerateOptions, GenerationMode};
use kvb_model::backends::Cpu;
use std::path::PathBuf;

/// Every tiny reference family in `fixtures/tiny/`.
pub const FAMILIES: [&str; 6] = [
    "llama",
    "llama-rope-llama3",
    "qwen2",
    "mistral",
    "gemma",
    "phi3",
];

pub fn tiny(family: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/tiny")
        .join(family)
}

/// Small chunks and blocks, so short prompts cross many of both.
pub fn config() -> EngineConfig {
    EngineConfig {
        chunk_size: 8,
        min_tail: 2,
        block_size: 4,
        max_pool_bytes: Some(64 << 20),
        ..EngineConfig::new(64 << 20)
    }
}

pub fn engine(family: &str, config: EngineConfig) -> Engine<Cpu> {
    Engine::from_pretrained(&tiny(family), config, &Default::default()).unwrap()
}

pub fn opts(mode: GenerationMode, max_new_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        mode,
        max_new_tokens,
        ..Default::default()
    }
}

/// A deterministic prompt of `n` tokens from a seed (ids 3..503).
pub fn prompt(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (seed * 97 + i * 31 + i * i * 7) % 500 + 3)
        .collect()
}

/// `doc` between a generated preamble and a generated question (`(seed, tokens)` each): the
/// same document at new positions.
pub fn around(before: (u32, usize), doc: &[u32], after: (u32, usize)) -> Vec<u32> {
    let mut p = prompt(before.0, before.1);
    p.extend(doc);
    p.extend(prompt(after.0, after.1));
    p
}

/// The largest difference between two logit vectors; infinite when their lengths differ (a
/// missing vector must not pass as an equal one).
pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    if a.len() != b.len() {
        return f32::INFINITY;
    }
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

pub fn same_bits(a: &[f32], b: &[f32]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.to_bits() == y.to_bits())
}

/// A document moved behind a preamble, stored earlier elsewhere: (first prompt, moved prompt).
pub fn moved_document() -> (Vec<u32>, Vec<u32>) {
    let doc = prompt(10, 40);
    let mut first = doc.clone();
    first.extend(prompt(11, 5));
    let moved = around((12, 21), &doc, (13, 4));
    (first, moved)
}
