//! Reuse on the tiny reference models (no download): exact prefix reuse gives Baseline's tokens
//! and logits; the next turn of a chat continues the previous one's resident blocks, or reads its
//! answer from the store; selective repair recomputes only after seams; repaired blocks stay
//! resident; settings and prompts are checked. (Interior reuse with every token recomputed, and
//! repair reducing a moved document's error, are in `every_backend.rs`, run on every backend.)

use crate::common::{
    around, config, engine, max_abs_diff, moved_document, opts, prompt, same_bits, tiny, FAMILIES,
};
use kvb_engine::{
    Engine, EngineConfig, EngineError, GenerationMode, KvPrecision, PoolDtype, RecomputeStrategy,
};
use kvb_model::backends::Cpu;
use kvb_model::{ActivationPrecision, FloatDtype, WeightPrecision};

#[test]
fn prefix_reuse_is_bit_identical_to_baseline_on_every_family() {
    // Resident: hits come from the pool's blocks (a block matched in part is copied). Not
    // resident: every hit reads the chunk store. An f16 pool rounds every K/V it holds, Baseline's
    // too, so reuse stays exact within it (the store keeps its values as f16).
    // 8-bit activations (`--weights q8_0 --activations q8`) compute other K/V than f32, but
    // their products are as batch- and chunk-invariant, so reuse stays exact within them.
    let q8 = (WeightPrecision::Q8_0, ActivationPrecision::Q8);
    let f32 = (WeightPrecision::Auto, ActivationPrecision::F32);
    for (keep_resident, pool_dtype, (weights, activations)) in [
        (true, PoolDtype::Fixed(FloatDtype::F32), f32),
        (false, PoolDtype::Fixed(FloatDtype::F32), f32),
        (true, PoolDtype::Fixed(FloatDtype::F16), f32),
        (false, PoolDtype::Fixed(FloatDtype::F16), f32),
        (true, PoolDtype::Fixed(FloatDtype::F32), q8),
        (false, PoolDtype::Fixed(FloatDtype::F16), q8),
    ] {
        for family in FAMILIES {
            let e = engine(
                family,
                EngineConfig {
                    keep_resident,
                    pool_dtype,
                    weights,
                    activations,
                    ..config()
                },
            );
            let history = prompt(1, 60);
            e.generate_tokens(&history, &opts(GenerationMode::ChunkReuse, 4), &mut |_| {})
                .unwrap();
            // New prompts sharing 10..60 tokens with the stored one, cut anywhere (mid-block and
            // mid-chunk included).
            for (k, shared) in [10usize, 17, 24, 33, 59, 60].into_iter().enumerate() {
                let mut p = history[..shared].to_vec();
                p.extend(prompt(100 + k as u32, 9));
                let base = e
                    .generate_tokens(&p, &opts(GenerationMode::Baseline, 12), &mut |_| {})
                    .unwrap();
                let reuse = e
                    .generate_tokens(&p, &opts(GenerationMode::ChunkReuse, 12), &mut |_| {})
                    .unwrap();
                let what = format!(
                    "{family}, {pool_dtype} pool, {activations} activations, resident \
                     {keep_resident}, {shared} shared"
                );
                assert!(
                    reuse.cached_tokens >= shared,
                    "{what}: {} cached",
                    reuse.cached_tokens
                );
                if keep_resident {
                    assert!(reuse.cached.pool >= shared, "{what}: {:?}", reuse.cached);
                } else {
                    assert_eq!(reuse.cached.pool, 0, "{what}: nothing stays resident");
                }
                assert_eq!(reuse.approximate_chunks, 0);
                assert_eq!(reuse.cached.approximate, 0);
                assert_eq!(reuse.token_ids, base.token_ids, "{what}: greedy tokens");
                // The cached K/V came from prefills of the same tokens: with batch- and
                // chunk-invariant kernels it is the same bits a full prefill computes.
                assert!(
                    same_bits(&reuse.first_logits, &base.first_logits),
                    "{what}: first-token logits differ by {}",
                    max_abs_diff(&reuse.first_logits, &base.first_logits)
                );
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
fn the_next_chat_turn_reads_the_previous_answer_from_the_store() {
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
    assert_eq!(r2.cached.store, stored);
    assert_eq!(r2.cached.pool, 0);
    assert!(r2.cached_tokens > 40, "the answer's K/V is reused");
    let base = e
        .generate_tokens(&turn2, &opts(GenerationMode::Baseline, 10), &mut |_| {})
        .unwrap();
    assert_eq!(r2.token_ids, base.token_ids);
}

#[test]
fn the_next_chat_turn_continues_the_resident_blocks() {
    let e = engine("llama", config());
    let (turn2, computed) = second_turn(&e);
    let r2 = e
        .generate_tokens(&turn2, &opts(GenerationMode::ChunkReuse, 10), &mut |_| {})
        .unwrap();
    // All of last turn's K/V, its partial last block included (copied), none from the store.
    assert_eq!(r2.cached_tokens, computed);
    assert_eq!(r2.cached.pool, computed);
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
fn prefix_cache_mode_reuses_whole_blocks_and_chunks_only() {
    let history = prompt(4, 40);
    let mut p = history[..21].to_vec();
    p.extend(prompt(5, 6));
    for (keep_resident, whole) in [(true, 20), (false, 16)] {
        // Two engines with the same history, so one request's own blocks cannot serve the other.
        let cfg = || EngineConfig {
            keep_resident,
            ..config()
        };
        let (e1, e2) = (engine("llama", cfg()), engine("llama", cfg()));
        for e in [&e1, &e2] {
            e.generate_tokens(&history, &opts(GenerationMode::ChunkReuse, 2), &mut |_| {})
                .unwrap();
        }
        let pc = e1
            .generate_tokens(&p, &opts(GenerationMode::PrefixCache, 4), &mut |_| {})
            .unwrap();
        let cr = e2
            .generate_tokens(&p, &opts(GenerationMode::ChunkReuse, 4), &mut |_| {})
            .unwrap();
        // Resident: five whole blocks of 4; from the store: two whole chunks of 8.
        assert_eq!(pc.cached_tokens, whole, "resident {keep_resident}");
        assert_eq!(cr.cached_tokens, 21, "to the token");
        assert_eq!(pc.token_ids, cr.token_ids);
    }
}

#[test]
fn selective_repair_recomputes_only_the_tokens_after_each_seam() {
    let (first, moved) = moved_document();
    let overlap = 5;
    let e = engine(
        "llama",
        EngineConfig {
            recompute_strategy: RecomputeStrategy::Selective,
            recompute_overlap: overlap,
            ..config()
        },
    );
    e.generate_tokens(&first, &opts(GenerationMode::ChunkReuse, 1), &mut |_| {})
        .unwrap();
    let reuse = e
        .generate_tokens(&moved, &opts(GenerationMode::ChunkReuse, 1), &mut |_| {})
        .unwrap();
    // The document was stored as one chain of chunks: its only seam is where it starts here.
    assert_eq!(reuse.cached.interior, 40, "{:?}", reuse.cached);
    assert_eq!(reuse.recomputed_tokens, overlap);
    // CacheBlend at the same budget costs a probe besides.
    let blend = engine(
        "llama",
        EngineConfig {
            recompute_strategy: RecomputeStrategy::CacheBlend,
            ..config()
        },
    );
    blend
        .generate_tokens(&first, &opts(GenerationMode::ChunkReuse, 1), &mut |_| {})
        .unwrap();
    let b = blend
        .generate_tokens(&moved, &opts(GenerationMode::ChunkReuse, 1), &mut |_| {})
        .unwrap();
    assert_eq!(b.recomputed_tokens, 6, "15% of 40, rounded up");
    assert!(b.stages.repair > std::time::Duration::ZERO);
}

#[test]
fn repaired_blocks_stay_resident_unless_told_otherwise() {
    let (first, moved) = moved_document();
    for reuse_repaired in [true, false] {
        let e = engine(
            "llama",
            EngineConfig {
                reuse_repaired,
                ..config()
            },
        );
        e.generate_tokens(&first, &opts(GenerationMode::ChunkReuse, 1), &mut |_| {})
            .unwrap();
        let a = e
            .generate_tokens(&moved, &opts(GenerationMode::ChunkReuse, 6), &mut |_| {})
            .unwrap();
        assert!(a.recomputed_tokens > 0);
        // The next question behind the same preamble and document.
        let mut next = moved[..moved.len() - 4].to_vec();
        next.extend(prompt(14, 5));
        let b = e
            .generate_tokens(&next, &opts(GenerationMode::ChunkReuse, 6), &mut |_| {})
            .unwrap();
        if reuse_repaired {
            assert!(
                b.cached.pool >= moved.len() - 4 - 3,
                "continued in place: {:?}",
                b.cached
            );
            assert!(b.cached.approximate >= 40 - 3, "{:?}", b.cached);
            assert_eq!(b.recomputed_tokens, 0, "nothing is repaired again");
            assert!(e.paged_stats().blocks_approximate > 0);
        } else {
            assert!(
                b.cached.interior >= 40,
                "repaired again from the store: {:?}",
                b.cached
            );
            assert!(b.recomputed_tokens > 0);
            assert_eq!(e.paged_stats().blocks_approximate, 0);
        }
        // Exact-only requests never read repaired blocks.
        let pc = e
            .generate_tokens(&next, &opts(GenerationMode::PrefixCache, 1), &mut |_| {})
            .unwrap();
        assert_eq!(pc.cached.approximate, 0);
    }
}

#[test]
fn bad_settings_and_prompts_are_clear_errors() {
    assert!(matches!(
        Engine::<Cpu>::from_pretrained(&tiny("llama"), EngineConfig::new(0), &Default::default()),
        Err(EngineError::Config(_))
    ));
    for bad in [
        EngineConfig {
            block_size: 3,
            ..config()
        },
        EngineConfig {
            block_size: 0,
            ..config()
        },
        EngineConfig {
            max_batch_tokens: 0,
            ..config()
        },
        EngineConfig {
            max_pool_bytes: Some(10),
            ..config()
        },
        EngineConfig {
            recompute_ratio: 1.5,
            ..config()
        },
    ] {
        let r = Engine::<Cpu>::from_pretrained(&tiny("llama"), bad.clone(), &Default::default());
        assert!(matches!(r, Err(EngineError::Config(_))), "{bad:?}");
    }
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
    let err = e
        .generate_tokens(&[], &opts(GenerationMode::ChunkReuse, 4), &mut |_| {})
        .unwrap_err();
    assert!(matches!(err, EngineError::EmptyPrompt), "{err}");
    let err = e
        .generate_tokens(
            &[1_000_000],
            &opts(GenerationMode::ChunkReuse, 4),
            &mut |_| {},
        )
        .unwrap_err();
    assert!(err.to_string().contains("vocabulary"), "{err}");
    e.sync().unwrap();
    assert_eq!(
        e.cache_stats().ram_chunks,
        0,
        "nothing stored by failed requests"
    );
    assert_eq!(
        e.paged_stats().blocks_used,
        0,
        "nothing held by failed requests"
    );
    // The engine still serves after them.
    e.generate_tokens(
        &prompt(2, 10),
        &opts(GenerationMode::ChunkReuse, 2),
        &mut |_| {},
    )
    .unwrap();
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
    e.sync().unwrap();
    assert!(
        e.paged_stats().blocks_resident > 0,
        "warmed text stays resident"
    );
    let other = engine(
        "llama",
        EngineConfig {
            chunk_size: 16,
            ..config()
        },
    );
    assert_ne!(e.namespace().id(), other.namespace().id());
    for precision in [KvPrecision::Int8, KvPrecision::F16, KvPrecision::Bf16] {
        let q = engine(
            "llama",
            EngineConfig {
                kv_precision: precision,
                ..config()
            },
        );
        assert_ne!(e.namespace().id(), q.namespace().id(), "{precision}");
    }
    // The tiny models' weights are f32: `auto` keeps an f32 pool. An f16 pool holds other K/V
    // (other keys) in half the bytes per block.
    let half = engine(
        "llama",
        EngineConfig {
            pool_dtype: PoolDtype::Fixed(FloatDtype::F16),
            ..config()
        },
    );
    assert_eq!(e.pool_precision(), FloatDtype::F32);
    assert_eq!(half.pool_precision(), FloatDtype::F16);
    assert_ne!(e.namespace().id(), half.namespace().id());
    // 8-bit activations: other K/V, other keys (beside the q8_0 weights' own).
    let weights = WeightPrecision::Q8_0;
    let q8_weights = engine(
        "llama",
        EngineConfig {
            weights,
            ..config()
        },
    );
    let q8 = engine(
        "llama",
        EngineConfig {
            weights,
            activations: ActivationPrecision::Q8,
            ..config()
        },
    );
    assert_eq!(q8.model().activation_precision(), ActivationPrecision::Q8);
    assert_ne!(q8_weights.namespace().id(), q8.namespace().id());
    assert_ne!(e.namespace().id(), q8_weights.namespace().id());
    assert_eq!(
        2 * half.paged_stats().block_bytes,
        e.paged_stats().block_bytes
    );
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
    let moved = around((23, 13), &doc, (24, 6));
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

#[test]
fn resident_kv_is_held_once_and_reaches_the_store_when_needed() {
    // A finished sequence's chunks stay in the pool only; the store gets them when a prompt finds
    // one by content (the moved document), when asked to flush, or at once where nothing stays
    // resident.
    let e = engine("llama", config());
    let doc = prompt(30, 40);
    let mut first = prompt(31, 3);
    first.extend(&doc);
    e.generate_tokens(&first, &opts(GenerationMode::ChunkReuse, 2), &mut |_| {})
        .unwrap();
    e.sync().unwrap();
    assert!(e.paged_stats().blocks_resident > 0);
    assert_eq!(e.cache_stats().ram_chunks, 0, "resident K/V is not copied");

    let moved = around((32, 11), &doc, (33, 4));
    let reuse = e
        .generate_tokens(&moved, &opts(GenerationMode::ChunkReuse, 4), &mut |_| {})
        .unwrap();
    assert!(reuse.cached_tokens >= 32, "found by content: {reuse:?}");
    e.sync().unwrap();
    let after_hit = e.cache_stats().ram_chunks;
    assert!(
        after_hit >= 4,
        "the first path went to the store on its hit: {after_hit}"
    );

    e.flush().unwrap();
    assert!(
        e.cache_stats().ram_chunks > after_hit,
        "flush stores what only the pool held"
    );

    let gone = engine(
        "llama",
        EngineConfig {
            keep_resident: false,
            ..config()
        },
    );
    let r = gone
        .generate_tokens(&first, &opts(GenerationMode::ChunkReuse, 2), &mut |_| {})
        .unwrap();
    assert!(r.stored_chunks >= 5, "stored at once: {r:?}");
}

#[test]
fn a_scoped_request_reuses_only_its_own_scopes_kv() {
    let scoped = |scope: Option<&[u8]>, max_new_tokens| kvb_engine::GenerateOptions {
        cache_scope: scope.map(<[u8]>::to_vec),
        ..opts(GenerationMode::ChunkReuse, max_new_tokens)
    };
    let doc = prompt(40, 40);
    let mut first = prompt(41, 3);
    first.extend(&doc);
    let moved = around((42, 11), &doc, (43, 4));
    for keep_resident in [true, false] {
        // Resident: hits come from the pool's tree (and, found by content, from the store once
        // the resident path is written there); not resident: from the store only.
        let e = engine(
            "llama",
            EngineConfig {
                keep_resident,
                ..config()
            },
        );
        let run = |tokens: &[u32], scope: Option<&[u8]>| {
            let r = e
                .generate_tokens(tokens, &scoped(scope, 3), &mut |_| {})
                .unwrap();
            e.sync().unwrap();
            r
        };
        let a = run(&first, Some(b"a"));
        assert_eq!(a.cached_tokens, 0);
        let again = run(&first, Some(b"a"));
        assert!(again.cached_tokens >= first.len() - 1, "{again:?}");
        assert_eq!(again.token_ids, a.token_ids);
        for other in [Some(&b"b"[..]), None] {
            let r = run(&first, other);
            assert_eq!(r.cached_tokens, 0, "{other:?} reached scope a: {r:?}");
            assert_eq!(
                r.token_ids, a.token_ids,
                "the cache never changes the answer"
            );
        }
        // Found by content, at new positions, within the scope only.
        let r = run(&moved, Some(b"a"));
        assert!(
            r.cached_tokens >= 32,
            "keep_resident {keep_resident}: {r:?}"
        );
        // Everything the pool holds goes to the store under its own scope's keys.
        e.flush().unwrap();
        let r = run(&moved, Some(b"c"));
        assert_eq!(r.cached_tokens, 0, "{r:?}");
    }
}

/// A pool budget far beyond the machine's memory (1 PiB) starts and serves the tokens a small
/// one does: on the CPU the pool is made whole only up to the machine's memory (the kernel
/// refuses a larger mapping outright) and grows past it in steps.
#[test]
fn a_pool_budget_beyond_the_machines_memory_serves_as_a_small_one() {
    let huge = EngineConfig {
        max_pool_bytes: Some(1 << 50),
        ..config()
    };
    let p = prompt(7, 150);
    let o = opts(GenerationMode::ChunkReuse, 8);
    let tokens = |config: EngineConfig| {
        engine("llama", config)
            .generate_tokens(&p, &o, &mut |_| {})
            .unwrap()
            .token_ids
    };
    assert_eq!(tokens(huge), tokens(config()));
}
