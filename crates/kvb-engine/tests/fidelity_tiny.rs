//! The fidelity measures themselves, on the tiny reference models (no download): teacher forcing
//! feeds exactly the given tokens and scores them as decoding would, the comparisons see what
//! they should (nothing for exact reuse, something for moved documents and lower precisions),
//! and the noise floor's engines never share keys with the engine they measure.

use crate::common::{around, config, engine, opts, prompt, same_bits, FAMILIES};
use kvb_engine::{
    compare_positions, Compared, EngineConfig, FidelityReport, GenerateOptions, GenerationMode,
    KvPrecision, NoiseFloor, RecomputeStrategy,
};
use kvb_model::{ActivationPrecision, WeightPrecision};
use proptest::prelude::*;

/// Feeding Baseline's own answer reproduces its logits bit for bit at every position, and
/// feeding other tokens emits exactly those tokens, whatever the model predicts.
#[test]
fn teacher_forcing_scores_the_given_tokens_as_decoding_would() {
    for family in FAMILIES {
        let e = engine(family, config());
        let p = prompt(7, 23);
        let base = e
            .generate_tokens(
                &p,
                &GenerateOptions {
                    keep_logits: true,
                    ..opts(GenerationMode::Baseline, 9)
                },
                &mut |_| {},
            )
            .unwrap();
        assert_eq!(base.logits.len(), base.token_ids.len(), "{family}");
        assert!(same_bits(&base.logits[0], &base.first_logits), "{family}");
        let forced = e
            .generate_tokens(
                &p,
                &GenerateOptions {
                    forced_tokens: base.token_ids.clone(),
                    keep_logits: true,
                    ..opts(GenerationMode::Baseline, base.token_ids.len())
                },
                &mut |_| {},
            )
            .unwrap();
        assert_eq!(forced.token_ids, base.token_ids, "{family}");
        for (i, (a, b)) in base.logits.iter().zip(&forced.logits).enumerate() {
            assert!(same_bits(a, b), "{family}: position {i}");
        }

        // Other tokens: emitted as given; the logits after the first one differ from Baseline's.
        let other: Vec<u32> = base.token_ids.iter().map(|t| (t + 1) % 500 + 3).collect();
        let steered = e
            .generate_tokens(
                &p,
                &GenerateOptions {
                    forced_tokens: other.clone(),
                    keep_logits: true,
                    ..opts(GenerationMode::Baseline, other.len())
                },
                &mut |_| {},
            )
            .unwrap();
        assert_eq!(steered.token_ids, other, "{family}");
        assert!(same_bits(&steered.logits[0], &base.logits[0]), "{family}");
        assert!(!same_bits(&steered.logits[1], &base.logits[1]), "{family}");
    }
}

#[test]
fn forced_tokens_outside_the_vocabulary_are_refused() {
    let e = engine("llama", config());
    let vocab = e.model().config().vocab_size as u32;
    let err = e
        .generate_tokens(
            &prompt(1, 9),
            &GenerateOptions {
                forced_tokens: vec![3, vocab],
                ..opts(GenerationMode::Baseline, 2)
            },
            &mut |_| {},
        )
        .unwrap_err();
    assert!(err.to_string().contains("outside the vocabulary"), "{err}");
}

/// Exact prefix reuse compares as identical (KL 0 to float noise); a moved document without repair
/// does not, and repairing every reused token takes the KL down by orders of magnitude. (The tiny
/// random models lean little on context: unrepaired KL is ~1e-9 here, ~0.1 on SmolLM2.)
#[test]
fn verify_sees_exact_reuse_as_exact_and_moved_documents_as_approximate() {
    let doc = prompt(11, 40);
    let moved = around((3, 13), &doc, (5, 9));
    for family in ["llama", "qwen2", "mistral"] {
        let run = |strategy, ratio| {
            let e = engine(
                family,
                kvb_engine::EngineConfig {
                    recompute_strategy: strategy,
                    recompute_ratio: ratio,
                    ..config()
                },
            );
            e.warm_tokens(&doc).unwrap();
            let reference = e.reference(&moved, 8).unwrap();
            let row = e
                .compare_with(&reference, GenerationMode::ChunkReuse, Compared::Reuse)
                .unwrap();
            assert!(row.cached_tokens >= 32, "{family}: the document is found");
            assert_eq!((row.answer_tokens, row.kl.len()), (8, 8));

            // Exact reuse: the same prompt again continues resident blocks.
            let again = e
                .compare_with(
                    &e.reference(&doc, 6).unwrap(),
                    GenerationMode::ChunkReuse,
                    Compared::Reuse,
                )
                .unwrap();
            assert!(again.cached_tokens >= 32, "{family}");
            assert!(again.identical && again.top1_agreement() == 1.0, "{family}");
            assert!(again.max_kl() < 1e-12, "{family}: {again:?}");
            row
        };
        let none = run(RecomputeStrategy::None, 0.0);
        let all = run(RecomputeStrategy::CacheBlend, 1.0);
        eprintln!(
            "{family}: KL unrepaired {:.2e}, all repaired {:.2e}",
            none.max_kl(),
            all.max_kl()
        );
        assert_eq!(none.recomputed_tokens, 0);
        assert!(all.recomputed_tokens >= 32, "{family}: {all:?}");
        assert!(
            none.max_kl() > 1e-11,
            "{family}: unrepaired reuse is approximate: {none:?}"
        );
        assert!(
            all.max_kl() < none.max_kl() / 100.0,
            "{family}: {all:?} vs {none:?}"
        );
        assert_eq!(all.top1_agreement(), 1.0, "{family}");
    }
}

/// The noise floor on a tiny model: int8 K/V stays closer to Baseline than int4, the bf16
/// forward moves the distributions, and each row reads the right things (the stored runs find
/// the prompt in their own store; the bf16 run reuses nothing).
#[test]
fn the_noise_floor_orders_its_precisions() {
    let e = engine("llama", config());
    let floor = NoiseFloor::new(&e).unwrap();
    let mut rows = Vec::new();
    for seed in 0..4 {
        let reference = e.reference(&prompt(seed, 37), 8).unwrap();
        rows.push(floor.compare(&reference).unwrap());
    }
    let report = FidelityReport::new(rows);
    let int8 = report
        .summary(Compared::StoredKv(KvPrecision::Int8))
        .unwrap();
    let int4 = report
        .summary(Compared::StoredKv(KvPrecision::Int4))
        .unwrap();
    let bf16 = report.summary(Compared::Bf16Forward).unwrap();
    eprintln!("{int8:?}\n{int4:?}\n{bf16:?}");
    assert_eq!(int8.prompts, 4);
    assert_eq!(int8.positions, 32);
    assert!(
        int8.reuse_ratio > 0.8 && int4.reuse_ratio > 0.8,
        "{int8:?} {int4:?}"
    );
    assert_eq!(bf16.reuse_ratio, 0.0);
    assert!(
        int8.mean_kl > 0.0 && int8.mean_kl < int4.mean_kl,
        "{int8:?} {int4:?}"
    );
    assert!(bf16.mean_kl > 0.0, "{bf16:?}");
    // f32 weights: no 8-bit activation row (it needs integer weights).
    assert!(report.summary(Compared::Q8Activations).is_none());
    // The engine measured keeps its own cache: nothing of the floor's runs reached it.
    assert_eq!(e.cache_stats().ram_chunks, 0);
}

/// With integer weights the floor also runs the products with 8-bit activations: they move the
/// distributions (it ran) and reuse nothing. An engine already on 8-bit activations gets
/// neither that row (it would compare a model with itself) nor a bf16 forward (a change of f32
/// products), only its stored K/V.
#[test]
fn the_noise_floor_has_q8_activations_for_integer_weights() {
    let weights = WeightPrecision::Q8_0;
    let e = engine(
        "llama",
        EngineConfig {
            weights,
            ..config()
        },
    );
    let floor = NoiseFloor::new(&e).unwrap();
    let rows = (0..3)
        .map(|seed| {
            floor
                .compare(&e.reference(&prompt(seed, 37), 8).unwrap())
                .unwrap()
        })
        .collect();
    let report = FidelityReport::new(rows);
    let q8 = report.summary(Compared::Q8Activations).unwrap();
    eprintln!("{q8:?}");
    assert_eq!(q8.prompts, 3);
    assert_eq!(q8.reuse_ratio, 0.0);
    assert!(q8.mean_kl > 0.0 && q8.mean_kl < 0.05, "{q8:?}");

    let already = engine(
        "llama",
        EngineConfig {
            weights,
            activations: ActivationPrecision::Q8,
            ..config()
        },
    );
    let floor = NoiseFloor::new(&already).unwrap();
    let row = floor
        .compare(&already.reference(&prompt(9, 37), 8).unwrap())
        .unwrap();
    let kinds: Vec<Compared> = row.iter().map(|r| r.compared).collect();
    assert_eq!(
        kinds,
        [
            Compared::StoredKv(KvPrecision::Int8),
            Compared::StoredKv(KvPrecision::Int4)
        ]
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Agreement counts the positions whose top tokens match; KL is zero exactly where the
    /// distributions are equal and positive elsewhere.
    #[test]
    fn position_comparison_counts_what_it_says(
        rows in prop::collection::vec(prop::collection::vec((-8i32..8).prop_map(|v| v as f32), 5), 1..12),
        shifted in prop::collection::vec(any::<bool>(), 12),
    ) {
        let other: Vec<Vec<f32>> = rows
            .iter()
            .zip(&shifted)
            .map(|(r, &s)| {
                let mut o = r.clone();
                if s {
                    // Swap the top value with another: a different distribution.
                    let top = kvb_model::generate::argmax(r);
                    let j = (top + 1) % r.len();
                    o.swap(top, j);
                }
                o
            })
            .collect();
        let (agree, kls) = compare_positions(&rows, &other);
        let mut want_agree = 0;
        for (i, (r, o)) in rows.iter().zip(&other).enumerate() {
            let moved = r != o;
            prop_assert_eq!(kls[i] > 1e-12, moved, "position {}", i);
            want_agree += usize::from(kvb_model::generate::argmax(r) == kvb_model::generate::argmax(o));
        }
        prop_assert_eq!(agree, want_agree);
        prop_assert_eq!(kls.len(), rows.len());
    }
}

/// The noise floor asks the model, not the weights' format, whether 8-bit activations apply
/// (it failed outright on a model that could not take them): a Q6_K file's K-quant cells take
/// them, so its floor has the q8 row; an F16 file's weights do not, so its floor has none.
#[test]
fn the_noise_floor_has_q8_activations_where_the_weights_take_them() {
    let floor_kinds = |file: &str| {
        let gguf = std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../fixtures/llama-cpp")
            .join(file);
        let e = kvb_engine::Engine::<kvb_model::backends::Cpu>::from_pretrained(
            &gguf,
            config(),
            &Default::default(),
        )
        .unwrap();
        let floor = NoiseFloor::new(&e).unwrap();
        let tokens: Vec<u32> = (0..20).map(|i| (i * 7 + 3) % 200).collect();
        let rows = floor.compare(&e.reference(&tokens, 4).unwrap()).unwrap();
        let kinds: Vec<Compared> = rows.iter().map(|r| r.compared).collect();
        (e.model().takes_q8_activations(), kinds)
    };
    let (takes, kinds) = floor_kinds("model.q6_k.gguf");
    assert!(takes);
    assert!(kinds.contains(&Compared::Bf16Forward), "{kinds:?}");
    assert!(kinds.contains(&Compared::Q8Activations), "{kinds:?}");
    let (takes, kinds) = floor_kinds("model.f16.gguf");
    assert!(!takes);
    assert!(kinds.contains(&Compared::Bf16Forward), "{kinds:?}");
    assert!(!kinds.contains(&Compared::Q8Activations), "{kinds:?}");
}
