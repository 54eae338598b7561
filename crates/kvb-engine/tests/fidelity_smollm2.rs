//! Fidelity of reuse on the default model (SmolLM2-135M-Instruct): documents warmed alone, then
//! placed behind other preambles (interior reuse: re-rotated and repaired), compared with Baseline
//! teacher-forced over its 32-token answers (top-1 agreement and KL at every position, identical
//! free answers, the share of reused tokens recomputed), beside the noise floor (KIVI int8/int4
//! stored K/V, a bf16 forward). Also exact prefix reuse and int8/int4 stored K/V.
//!
//! The model is fetched on first use (`cargo xtask ci` fetches it before the tests).

use kvb_engine::{
    kl_divergence, Compared, Engine, EngineConfig, FidelityReport, GenerateOptions, GenerationMode,
    KvPrecision, NoiseFloor, RecomputeStrategy,
};
use kvb_model::backends::Cpu;
use kvb_model::fetch::{ensure_default_model, models_dir_in};
use kvb_model::ChatMessage;
use std::path::PathBuf;
use std::sync::OnceLock;

fn model_path() -> PathBuf {
    static PATH: OnceLock<PathBuf> = OnceLock::new();
    PATH.get_or_init(|| {
        let dir = models_dir_in(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.."));
        ensure_default_model(&dir, &mut |l| eprintln!("{l}"))
            .expect("the default model")
            .hf_dir
    })
    .clone()
}

fn doc(name: &str) -> String {
    std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR"))
            .join("../../fixtures/docs")
            .join(format!("{name}.txt")),
    )
    .unwrap()
}

const CASES: [(&str, &str, &str); 6] = [
    (
        "amazon",
        "Read this text.",
        "Which country holds most of the forest?",
    ),
    (
        "amazon",
        "You are a careful geography tutor. Answer briefly, using the text below.",
        "Where does the Amazon River rise?",
    ),
    (
        "photosynthesis",
        "Here is a passage from a biology textbook.",
        "What gas does photosynthesis release?",
    ),
    (
        "photosynthesis",
        "Use the following notes to answer.",
        "Where does the Calvin cycle take place?",
    ),
    (
        "printing",
        "Below is an article about history.",
        "Who developed the printing press?",
    ),
    (
        "printing",
        "Answer from the text.",
        "How many copies of the Gutenberg Bible were printed?",
    ),
];

fn prompt_of(e: &Engine<Cpu>, (name, preamble, question): (&str, &str, &str)) -> Vec<u32> {
    let text = e
        .tokenizer()
        .apply_chat_template(
            &[ChatMessage::new(
                "user",
                format!("{preamble}\n\n{}\n\n{question}", doc(name).trim()),
            )],
            true,
        )
        .unwrap();
    e.tokenizer().encode(&text, false).unwrap()
}

/// Reuse of the warmed documents under `config`, and with `noise_floor` the noise floor, over
/// every case, teacher-forced on Baseline's 32-token answers.
fn measure(config: EngineConfig, noise_floor: bool) -> FidelityReport {
    let e: Engine<Cpu> =
        Engine::from_pretrained(&model_path(), config, &Default::default()).unwrap();
    let floor = noise_floor.then(|| NoiseFloor::new(&e).unwrap());
    let mut rows = Vec::new();
    for case in CASES {
        // Each case starts from the documents warmed alone (a reuse run keeps its repaired
        // blocks resident, which the next case behind another preamble must not continue).
        e.reset_cache().unwrap();
        for name in ["amazon", "photosynthesis", "printing"] {
            e.warm(&doc(name)).unwrap();
        }
        let reference = e.reference(&prompt_of(&e, case), 32).unwrap();
        let reuse = e
            .compare_with(&reference, GenerationMode::ChunkReuse, Compared::Reuse)
            .unwrap();
        assert!(
            reuse.cached_tokens > reuse.prompt_tokens / 2,
            "{}: the warmed document must be found ({reuse:?})",
            case.0
        );
        let mut row = vec![reuse];
        if let Some(floor) = &floor {
            row.extend(floor.compare(&reference).unwrap());
        }
        rows.push(row);
    }
    FidelityReport::new(rows)
}

fn config(strategy: RecomputeStrategy, ratio: f32, threshold: Option<f32>) -> EngineConfig {
    EngineConfig {
        recompute_strategy: strategy,
        recompute_ratio: ratio,
        recompute_threshold: threshold,
        ..EngineConfig::new(1 << 30)
    }
}

/// Teacher-forced fidelity of the moved documents (6 cases, Baseline's 32-token answers), with
/// the bounds this data defends. Measured on this machine kind, 2026-11-24:
///
/// | compared | identical | top-1 (forced) | mean KL | max KL | recomputed |
/// |---|---:|---:|---:|---:|---:|
/// | reuse, no repair | 1 of 6 | 93.4% | 0.091 | 2.54 | 0% |
/// | reuse, CacheBlend 15% | 3 | 97.6% | 0.023 | 0.55 | 15.2% |
/// | reuse, CacheBlend adaptive (threshold 3e-5) | 2 | 97.6% | 0.0052 | 0.19 | 46.9% |
/// | K/V stored int8 (KIVI) | 6 | 100% | 4.1e-5 | 1.1e-3 | 0% |
/// | K/V stored int4 (KIVI) | 3 | 97.6% | 0.011 | 0.79 | 0% |
/// | bf16 forward | 4 | 98.8% | 8.7e-4 | 8.7e-3 | 0% |
///
/// (The adaptive budget spends 47% on these short preambles but 14% over the bench's 21 prompts:
/// it follows how far each prompt's keys moved, which is its point.)
///
/// No setting reaches the target here (top-1 >= 99% and mean KL <= the bf16 forward's
/// at <= 15% recompute): on a 135M model a moved document's K/V deviates in deep layers that a
/// layer-1 probe sees only faintly (see `cargo xtask bench fidelity` for the 21-prompt curve).

#[test]
fn cacheblend_repairs_moved_documents_within_bounds() {
    let none = measure(config(RecomputeStrategy::None, 0.0, None), false);
    let adaptive = measure(
        config(RecomputeStrategy::CacheBlend, 1.0, Some(3e-5)),
        false,
    );
    let floor = measure(config(RecomputeStrategy::CacheBlend, 0.15, None), true);
    let none = none.summary(Compared::Reuse).unwrap();
    let adaptive = adaptive.summary(Compared::Reuse).unwrap();
    let blend = floor.summary(Compared::Reuse).unwrap();
    let bf16 = floor.summary(Compared::Bf16Forward).unwrap();
    let int8 = floor
        .summary(Compared::StoredKv(KvPrecision::Int8))
        .unwrap();
    let int4 = floor
        .summary(Compared::StoredKv(KvPrecision::Int4))
        .unwrap();
    for s in [none, blend, adaptive, int8, int4, bf16] {
        eprintln!("{s:?}");
    }
    // Repair at 15% at least halves what reuse moves, and agrees more.
    assert!(blend.recompute_share <= 0.16, "{blend:?}");
    assert!(blend.mean_kl < 0.5 * none.mean_kl, "{blend:?} vs {none:?}");
    assert!(
        blend.top1_agreement > none.top1_agreement,
        "{blend:?} vs {none:?}"
    );
    assert!(
        blend.top1_agreement >= 0.95 && blend.mean_kl < 0.04,
        "{blend:?}"
    );
    // The adaptive budget recomputes what moved: more here, and the KL falls with it.
    assert!(
        adaptive.mean_kl < 0.5 * blend.mean_kl,
        "{adaptive:?} vs {blend:?}"
    );
    assert!(adaptive.recompute_share < 0.6, "{adaptive:?}");
    // The noise floor: int8 K/V is far below a bf16 forward, int4 above it.
    assert!(
        int8.top1_agreement >= 0.99 && int8.mean_kl < 2e-4,
        "{int8:?}"
    );
    assert!(
        int8.mean_kl < bf16.mean_kl && bf16.mean_kl < int4.mean_kl,
        "{bf16:?} {int4:?}"
    );
    assert!(
        bf16.mean_kl < 3e-3 && bf16.top1_agreement >= 0.97,
        "{bf16:?}"
    );
    // Every row read what it should: reuse and stored K/V most of the prompt (the store holds
    // whole chunks only: 77% of these short prompts), bf16 nothing.
    assert!(
        blend.reuse_ratio > 0.8 && int8.reuse_ratio > 0.7,
        "{blend:?} {int8:?}"
    );
    assert_eq!(bf16.reuse_ratio, 0.0);
}

/// Exact prefix reuse on the real model: a growing chat, each turn answered from cached history,
/// gives Baseline's greedy tokens at every turn, with f32, and first-token top-1 and small KL with
/// KIVI int8 and int4 stored K/V.
#[test]
fn chat_history_reuse_is_exact_and_kivi_stays_close() {
    let questions = [
        "What is the capital of France?",
        "Name a famous landmark there.",
        "How old is it?",
        "Who built it?",
    ];
    // The pool keeps f32 K/V; quantized K/V is only read from the store, so the KIVI runs free
    // each sequence's blocks when it ends. f32 runs both ways.
    for (precision, keep_resident) in [
        (KvPrecision::F32, true),
        (KvPrecision::F32, false),
        (KvPrecision::Int8, false),
        (KvPrecision::Int4, false),
    ] {
        let bits = match precision {
            KvPrecision::Int8 => 8,
            KvPrecision::Int4 => 4,
            _ => 16,
        };
        let e: Engine<Cpu> = Engine::from_pretrained(
            &model_path(),
            EngineConfig {
                kv_precision: precision,
                keep_resident,
                ..EngineConfig::new(1 << 30)
            },
            &Default::default(),
        )
        .unwrap();
        let opts = |mode| GenerateOptions {
            max_new_tokens: 24,
            mode,
            ..Default::default()
        };
        let mut messages = Vec::new();
        let (mut worst_kl, mut reused) = (0f64, 0usize);
        for q in questions {
            messages.push(ChatMessage::new("user", q));
            let prompt = e.tokenizer().apply_chat_template(&messages, true).unwrap();
            let base = e
                .generate(&prompt, &opts(GenerationMode::Baseline), &mut |_| {})
                .unwrap();
            let reuse = e
                .generate(&prompt, &opts(GenerationMode::ChunkReuse), &mut |_| {})
                .unwrap();
            assert_eq!(reuse.approximate_chunks, 0);
            if !keep_resident {
                assert_eq!(reuse.cached.pool, 0, "nothing stays resident");
            }
            reused += reuse.cached_tokens;
            let top1 = |l: &[f32]| kvb_model::generate::argmax(l);
            assert_eq!(
                top1(&reuse.first_logits),
                top1(&base.first_logits),
                "{bits}-bit: first token"
            );
            worst_kl = worst_kl.max(kl_divergence(&base.first_logits, &reuse.first_logits));
            if bits == 16 {
                assert_eq!(
                    reuse.token_ids, base.token_ids,
                    "f32 reuse must give Baseline's tokens"
                );
            }
            messages.push(ChatMessage::new("assistant", base.output_text));
        }
        eprintln!("{bits}-bit stored K/V (resident {keep_resident}): {reused} tokens reused over 4 turns, worst first-token KL {worst_kl:.2e}");
        assert!(reused > 100, "{bits}-bit: history must be reused");
        let bound = match bits {
            16 => 1e-6,
            8 => 1e-3,
            _ => 2e-2,
        };
        assert!(worst_kl < bound, "{bits}-bit: KL {worst_kl} >= {bound}");
    }
}
