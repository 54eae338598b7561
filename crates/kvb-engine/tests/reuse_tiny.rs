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
    // With the resident sequence, requests alternate between continuing it in place and reading
    // the store (when the store's prefix is longer); without it, every hit reads the store.
    for keep_resident in [true, false] {
        for family in [
            "llama",
            "llama-rope-llama3",
            "qwen2",
            "mistral",
            "gemma",
            "phi3",
        ] {
            let e = engine(
                family,
                EngineConfig {
                    keep_resident,
                    ..config()
                },
            );
            let history = prompt(1, 60);
            e.generate_tokens(&history, &opts(GenerationMode::ChunkReuse, 4), &mut |_| {})
                .unwrap();
            // New prompts sharing 10..60 tokens with the stored one, cut anywhere (mid-chunk
            // included).
            for (k, shared) in [10usize, 17, 24, 33, 59, 60].into_iter().enumerate() {
                let mut p = history[..shared].to_vec();
                p.extend(prompt(100 + k as u32, 9));
                let base = e
                    .generate_tokens(&p, &opts(GenerationMode::Baseline, 12), &mut |_| {})
                    .unwrap();
                let reuse = e
                    .generate_tokens(&p, &opts(GenerationMode::ChunkReuse, 12), &mut |_| {})
                    .unwrap();
                let what = format!("{family}, resident {keep_resident}, {shared} shared");
                assert!(
                    reuse.cached_tokens >= shared,
                    "{what}: {} cached",
                    reuse.cached_tokens
                );
                if !keep_resident {
                    assert_eq!(reuse.resident_tokens, 0, "{what}");
                }
                assert_eq!(reuse.approximate_chunks, 0);
                assert_eq!(reuse.token_ids, base.token_ids, "{what}: greedy tokens");
                let d = max_abs_diff(&reuse.first_logits, &base.first_logits);
                assert!(d < 1e-4, "{what}: first-token logits differ by {d}");
            }
        }
    }
}

/// A chat's second turn: the history (prompt and answer) plus a new message.
fn second_turn(e: &Engine<Cpu>) -> (Vec<u32>, usize) {
    let turn1 = prompt(2, 40);
    let r1 = e
        .generate_tokens(&turn1, &opts(GenerationMode::ChunkReuse, 10), &mut |_| {})
        .unwrap();
    let mut turn2 = turn1.clone();
    turn2.extend(&r1.token_ids);
    turn2.extend(prompt(3, 7));
    // Tokens whose K/V was computed last turn: all but the last answer token.
    (turn2, turn1.len() + r1.token_ids.len() - 1)
}

#[test]
fn the_next_chat_turn_reuses_the_previous_answer_from_the_store() {
    let e = engine(
        "llama",
        EngineConfig {
            keep_resident: false,
            ..config()
        },
    );
    let (turn2, computed) = second_turn(&e);
    let r2 = e
        .generate_tokens(&turn2, &opts(GenerationMode::ChunkReuse, 10), &mut |_| {})
        .unwrap();
    // Every stored token is reused; a last chunk shorter than min_tail is not stored.
    let tail = computed % 8;
    let stored = if tail >= 2 { computed } else { computed - tail };
    assert_eq!(r2.cached_tokens, stored);
    assert_eq!(r2.resident_tokens, 0);
    assert!(r2.cached_tokens > 40, "the answer's K/V is reused");
    let base = e
        .generate_tokens(&turn2, &opts(GenerationMode::Baseline, 10), &mut |_| {})
        .unwrap();
    assert_eq!(r2.token_ids, base.token_ids);
}

#[test]
fn the_next_chat_turn_continues_the_resident_sequence_in_place() {
    let e = engine("llama", config());
    let (turn2, computed) = second_turn(&e);
    let r2 = e
        .generate_tokens(&turn2, &opts(GenerationMode::ChunkReuse, 10), &mut |_| {})
        .unwrap();
    // All of last turn's K/V, the short tail included, without reading a chunk.
    assert_eq!(r2.cached_tokens, computed);
    assert_eq!(r2.resident_tokens, computed);
    assert_eq!(r2.exact_chunks, 0);
    let base = e
        .generate_tokens(&turn2, &opts(GenerationMode::Baseline, 10), &mut |_| {})
        .unwrap();
    assert_eq!(r2.token_ids, base.token_ids);
    let d = max_abs_diff(&r2.first_logits, &base.first_logits);
    assert!(d < 1e-4, "first-token logits differ by {d}");
    // After a reset nothing is reused, resident or stored.
    e.reset_cache().unwrap();
    let r3 = e
        .generate_tokens(&turn2, &opts(GenerationMode::ChunkReuse, 10), &mut |_| {})
        .unwrap();
    assert_eq!(r3.cached_tokens, 0);
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

#[test]
fn a_batch_groups_shared_prefixes_and_answers_in_order() {
    let e = engine("llama", config());
    let tok = e.tokenizer();
    // Three questions on one document and one unrelated prompt, interleaved.
    let doc = "the quick brown fox jumps over the lazy dog near the river bank today";
    let prompts = [
        format!("{doc} first question"),
        "something else entirely".to_string(),
        format!("{doc} second question"),
        format!("{doc} third one"),
    ];
    let refs: Vec<&str> = prompts.iter().map(String::as_str).collect();
    let batch = e.generate_batch(&refs, &opts(GenerationMode::ChunkReuse, 6));
    assert_eq!(batch.len(), 4);
    let shared = tok.encode(doc, false).unwrap().len();
    let mut reused = 0;
    for (p, r) in prompts.iter().zip(&batch) {
        let r = r.as_ref().unwrap();
        let base = e
            .generate(p, &opts(GenerationMode::Baseline, 6), &mut |_| {})
            .unwrap();
        assert_eq!(
            r.token_ids, base.token_ids,
            "{p}: answered in order, as Baseline"
        );
        if r.cached_tokens >= shared {
            reused += 1;
        }
    }
    // The document's questions run back to back: all but the first reuse the document.
    assert_eq!(reused, 2);
}

#[test]
fn a_moved_document_is_reused_whole_even_off_the_chunk_grid() {
    // Stored after a 3-token preamble, the 42-token document starts and ends mid-chunk (chunks of
    // 8): its full chunks are found by content, its partial first and last chunks through their
    // neighbours in the store.
    let cfg = EngineConfig {
        recompute_strategy: RecomputeStrategy::CacheBlend,
        recompute_ratio: 1.0,
        ..config()
    };
    let e = engine("llama", cfg);
    let doc = prompt(20, 42);
    let mut first = prompt(21, 3);
    first.extend(&doc);
    first.extend(prompt(22, 5));
    e.generate_tokens(&first, &opts(GenerationMode::ChunkReuse, 2), &mut |_| {})
        .unwrap();
    let mut moved = prompt(23, 13);
    moved.extend(&doc);
    moved.extend(prompt(24, 6));
    let reuse = e
        .generate_tokens(&moved, &opts(GenerationMode::ChunkReuse, 8), &mut |_| {})
        .unwrap();
    assert_eq!(reuse.cached_tokens, doc.len(), "the whole document");
    assert_eq!(reuse.recomputed_tokens, doc.len());
    let base = e
        .generate_tokens(&moved, &opts(GenerationMode::Baseline, 8), &mut |_| {})
        .unwrap();
    assert_eq!(reuse.token_ids, base.token_ids);
}
