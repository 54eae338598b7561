//! Reuse on the tiny reference models (no download): exact prefix reuse gives Baseline's greedy
//! tokens; the next turn of a chat reuses the previous answer's K/V; interior reuse with every
//! token recomputed equals a full prefill; settings and prompts are checked.

use kvb_engine::{
    Engine, EngineConfig, EngineError, GenerateOptions, GenerationMode, RecomputeStrategy,
};
use kvb_model::backends::Cpu;
use std::path::PathBuf;

fn tiny(family: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/tiny")
        .join(family)
}

fn config() -> EngineConfig {
    EngineConfig {
        chunk_size: 8,
        min_tail: 2,
        ..EngineConfig::new(64 << 20)
    }
}

fn engine(family: &str, config: EngineConfig) -> Engine<Cpu> {
    Engine::from_pretrained(&tiny(family), config, &Default::default()).unwrap()
}

fn opts(mode: GenerationMode, max_new_tokens: usize) -> GenerateOptions {
    GenerateOptions {
        mode,
        max_new_tokens,
        ..Default::default()
    }
}

fn prompt(seed: u32, n: usize) -> Vec<u32> {
    (0..n as u32)
        .map(|i| (seed * 97 + i * 31 + i * i * 7) % 500 + 3)
        .collect()
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

#[test]
fn prefix_reuse_is_greedy_identical_to_baseline_on_every_family() {
    for family in [
        "llama",
        "llama-rope-llama3",
        "qwen2",
        "mistral",
        "gemma",
        "phi3",
    ] {
        let e = engine(family, config());
        let history = prompt(1, 60);
        e.generate_tokens(&history, &opts(GenerationMode::ChunkReuse, 4), &mut |_| {})
            .unwrap();
        // New prompts sharing 10..60 tokens with the stored one, cut anywhere (mid-chunk included).
        for (k, shared) in [10usize, 17, 24, 33, 59, 60].into_iter().enumerate() {
            let mut p = history[..shared].to_vec();
            p.extend(prompt(100 + k as u32, 9));
            let base = e
                .generate_tokens(&p, &opts(GenerationMode::Baseline, 12), &mut |_| {})
                .unwrap();
            let reuse = e
                .generate_tokens(&p, &opts(GenerationMode::ChunkReuse, 12), &mut |_| {})
                .unwrap();
            assert!(
                reuse.cached_tokens >= shared,
                "{family}: {shared} shared, {} cached",
                reuse.cached_tokens
            );
            assert_eq!(reuse.approximate_chunks, 0);
            assert_eq!(
                reuse.token_ids, base.token_ids,
                "{family}: greedy tokens, {shared} shared"
            );
            let d = max_abs_diff(&reuse.first_logits, &base.first_logits);
            assert!(d < 1e-4, "{family}: first-token logits differ by {d}");
        }
    }
}

#[test]
fn the_next_chat_turn_reuses_the_previous_answer() {
    let e = engine("llama", config());
    let turn1 = prompt(2, 40);
    let r1 = e
        .generate_tokens(&turn1, &opts(GenerationMode::ChunkReuse, 10), &mut |_| {})
        .unwrap();
    // The next prompt is the history (prompt and answer) plus a new message.
    let mut turn2 = turn1.clone();
    turn2.extend(&r1.token_ids);
    turn2.extend(prompt(3, 7));
    let r2 = e
        .generate_tokens(&turn2, &opts(GenerationMode::ChunkReuse, 10), &mut |_| {})
        .unwrap();
    // Every token whose K/V was computed last turn (all but the last answer token) is reused,
    // except a last chunk shorter than min_tail, which is not stored.
    let computed = turn1.len() + r1.token_ids.len() - 1;
    let tail = computed % 8;
    let stored = if tail >= 2 { computed } else { computed - tail };
    assert_eq!(r2.cached_tokens, stored);
    assert!(r2.cached_tokens > turn1.len(), "the answer's K/V is reused");
    let base = e
        .generate_tokens(&turn2, &opts(GenerationMode::Baseline, 10), &mut |_| {})
        .unwrap();
    assert_eq!(r2.token_ids, base.token_ids);
}

#[test]
fn prefix_cache_mode_reuses_whole_chunks_only() {
    // Two engines with the same history: each request stores its own chunks, which would
    // otherwise serve the second one.
    let history = prompt(4, 40);
    let (e1, e2) = (engine("llama", config()), engine("llama", config()));
    for e in [&e1, &e2] {
        e.generate_tokens(&history, &opts(GenerationMode::ChunkReuse, 2), &mut |_| {})
            .unwrap();
    }
    let mut p = history[..21].to_vec();
    p.extend(prompt(5, 6));
    let pc = e1
        .generate_tokens(&p, &opts(GenerationMode::PrefixCache, 4), &mut |_| {})
        .unwrap();
    let cr = e2
        .generate_tokens(&p, &opts(GenerationMode::ChunkReuse, 4), &mut |_| {})
        .unwrap();
    assert_eq!(pc.cached_tokens, 16, "two whole chunks of 8");
    assert_eq!(cr.cached_tokens, 21, "to the token");
    assert_eq!(pc.token_ids, cr.token_ids);
}

#[test]
fn interior_reuse_with_everything_recomputed_equals_a_prefill() {
    let cfg = EngineConfig {
        recompute_strategy: RecomputeStrategy::CacheBlend,
        recompute_ratio: 1.0,
        ..config()
    };
    let e = engine("qwen2", cfg);
    let doc = prompt(6, 32);
    // Store the document at the start of one prompt...
    let mut first = doc.clone();
    first.extend(prompt(7, 5));
    e.generate_tokens(&first, &opts(GenerationMode::ChunkReuse, 2), &mut |_| {})
        .unwrap();
    // ...and reuse it after a different preamble, at new positions.
    let mut moved = prompt(8, 13);
    moved.extend(&doc);
    moved.extend(prompt(9, 6));
    let base = e
        .generate_tokens(&moved, &opts(GenerationMode::Baseline, 12), &mut |_| {})
        .unwrap();
    let reuse = e
        .generate_tokens(&moved, &opts(GenerationMode::ChunkReuse, 12), &mut |_| {})
        .unwrap();
    assert!(
        reuse.approximate_chunks >= 3,
        "{} approximate chunks",
        reuse.approximate_chunks
    );
    assert_eq!(reuse.recomputed_tokens, reuse.cached_tokens);
    let d = max_abs_diff(&reuse.first_logits, &base.first_logits);
    assert!(d < 1e-3, "logits differ by {d}");
    assert_eq!(reuse.token_ids, base.token_ids);
}

#[test]
fn repair_reduces_the_error_of_moved_chunks() {
    let doc = prompt(10, 40);
    let mut first = doc.clone();
    first.extend(prompt(11, 5));
    let mut moved = prompt(12, 21);
    moved.extend(&doc);
    moved.extend(prompt(13, 4));
    let mut errors = Vec::new();
    for (strategy, ratio) in [
        (RecomputeStrategy::None, 0.0),
        (RecomputeStrategy::CacheBlend, 0.5),
        (RecomputeStrategy::CacheBlend, 1.0),
    ] {
        let e = engine(
            "llama",
            EngineConfig {
                recompute_strategy: strategy,
                recompute_ratio: ratio,
                ..config()
            },
        );
        e.generate_tokens(&first, &opts(GenerationMode::ChunkReuse, 1), &mut |_| {})
            .unwrap();
        let base = e
            .generate_tokens(&moved, &opts(GenerationMode::Baseline, 1), &mut |_| {})
            .unwrap();
        let reuse = e
            .generate_tokens(&moved, &opts(GenerationMode::ChunkReuse, 1), &mut |_| {})
            .unwrap();
        assert!(reuse.approximate_chunks > 0);
        errors.push(max_abs_diff(&reuse.first_logits, &base.first_logits));
    }
    assert!(
        errors[0] > errors[1] && errors[1] > errors[2],
        "error must fall as more is recomputed: {errors:?}"
    );
    assert!(errors[2] < 1e-3);
}

#[test]
fn bad_settings_and_prompts_are_clear_errors() {
    assert!(matches!(
        Engine::<Cpu>::from_pretrained(&tiny("llama"), EngineConfig::new(0), &Default::default()),
        Err(EngineError::Config(_))
    ));
    assert!(Engine::<Cpu>::from_pretrained(
        &tiny("llama"),
        EngineConfig {
            kv_bits: 3,
            ..config()
        },
        &Default::default()
    )
    .is_err());
    let e = engine("llama", config());
    let long = prompt(1, 300); // the tiny models' context is 256
    let err = e
        .generate_tokens(&long, &opts(GenerationMode::ChunkReuse, 4), &mut |_| {})
        .unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::PromptTooLong {
                tokens: 300,
                context: 256
            }
        ),
        "{err}"
    );
    assert!(e
        .generate_tokens(&[], &opts(GenerationMode::ChunkReuse, 4), &mut |_| {})
        .is_err());
    assert_eq!(
        e.cache_stats().ram_chunks,
        0,
        "nothing stored by failed requests"
    );
}

#[test]
fn warm_stores_in_context_chunks_and_keys_never_mix_settings() {
    let e = engine("llama", config());
    let text =
        "Paris is the capital of France. The quick brown fox jumps over the lazy dog. ".repeat(3);
    let w = e.warm(&text).unwrap();
    assert!(w.chunks_stored >= 2 && w.bytes > 0, "{w:?}");
    assert_eq!(
        e.warm(&text).unwrap().chunks_stored,
        0,
        "warming twice stores nothing new"
    );
    let other = engine(
        "llama",
        EngineConfig {
            chunk_size: 16,
            ..config()
        },
    );
    assert_ne!(e.namespace().id(), other.namespace().id());
    let int8 = engine(
        "llama",
        EngineConfig {
            kv_bits: 8,
            ..config()
        },
    );
    assert_ne!(e.namespace().id(), int8.namespace().id());
}
