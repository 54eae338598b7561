//! On the default model (SmolLM2-135M-Instruct): sixteen chat prompts of mixed lengths, several
//! behind one system prompt, generate the same greedy tokens, and the same first-token logits,
//! run in batches of 1, 4 and 16 as run one at a time on a fresh engine.
//!
//! The model is fetched on first use (`cargo xtask ci` fetches it before the tests).

use kvb_engine::{
    model_fingerprint, Engine, EngineConfig, GenerateOptions, GenerationMode, GenerationResult,
    Request,
};
use kvb_model::backends::Cpu;
use kvb_model::fetch::{ensure_default_model, models_dir_in};
use kvb_model::{load_pretrained, ChatMessage, LoadOptions, Pretrained};
use std::path::PathBuf;
use std::sync::OnceLock;

/// The model, loaded once (a fresh engine per run only needs a fresh pool and store).
fn loaded() -> &'static (Pretrained<Cpu>, [u8; 32]) {
    static MODEL: OnceLock<(Pretrained<Cpu>, [u8; 32])> = OnceLock::new();
    MODEL.get_or_init(|| {
        let dir = models_dir_in(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.."));
        let path = ensure_default_model(&dir, &mut |l| eprintln!("{l}"))
            .expect("the default model")
            .hf_dir;
        let m = load_pretrained::<Cpu>(
            &path,
            LoadOptions::default(),
            &Default::default(),
            &mut |_, _| {},
        )
        .unwrap();
        let fp = model_fingerprint(
            &path,
            m.format,
            m.model.config(),
            m.model.weight_precision(),
        )
        .unwrap();
        (m, fp)
    })
}

fn engine() -> Engine<Cpu> {
    let (m, fp) = loaded();
    let config = EngineConfig {
        // Slices of 64 rows: long prompts share steps with the others' decodes.
        max_batch_tokens: 64,
        max_pool_bytes: Some(1 << 30),
        ..EngineConfig::new(1 << 30)
    };
    Engine::new(m.model.clone(), m.tokenizer.clone(), fp, config).unwrap()
}

const QUESTIONS: [&str; 8] = [
    "What is the capital of France?",
    "Name three primary colours.",
    "Why is the sky blue? Answer in one sentence.",
    "Write a haiku about autumn leaves.",
    "What is 17 times 3?",
    "Translate 'good morning' into Spanish.",
    "Who wrote Romeo and Juliet?",
    "Give me a synonym for happy.",
];

fn prompts(e: &Engine<Cpu>) -> Vec<Vec<u32>> {
    let system = "You are a concise assistant for a museum's visitors. Answer in one or two short \
                  sentences, be friendly, and never invent facts you are unsure of.";
    (0..16)
        .map(|i| {
            let mut messages = Vec::new();
            if i % 2 == 0 {
                messages.push(ChatMessage::new("system", system));
            }
            messages.push(ChatMessage::new("user", QUESTIONS[i % 8]));
            let text = e.tokenizer().apply_chat_template(&messages, true).unwrap();
            e.tokenizer().encode(&text, false).unwrap()
        })
        .collect()
}

fn options(mode: GenerationMode) -> GenerateOptions {
    GenerateOptions {
        max_new_tokens: 12,
        mode,
        ..Default::default()
    }
}

#[test]
fn batches_of_1_4_and_16_generate_what_each_prompt_generates_alone() {
    let probe = engine();
    let prompts = prompts(&probe);
    drop(probe);
    for mode in [GenerationMode::Baseline, GenerationMode::ChunkReuse] {
        let alone: Vec<GenerationResult> = prompts
            .iter()
            .map(|p| {
                engine()
                    .generate_tokens(p, &options(mode), &mut |_| {})
                    .unwrap()
            })
            .collect();
        for size in [1usize, 4, 16] {
            let e = engine();
            for (k, group) in prompts.chunks(size).enumerate() {
                let handles: Vec<_> = group
                    .iter()
                    .map(|p| e.submit(Request::new(p.clone(), options(mode))).unwrap())
                    .collect();
                for (j, h) in handles.into_iter().enumerate() {
                    let r = h.wait().unwrap();
                    let i = k * size + j;
                    let what = format!("{mode}, batch of {size}, prompt {i}");
                    assert_eq!(
                        r.token_ids, alone[i].token_ids,
                        "{what}: {:?}",
                        r.output_text
                    );
                    let worst = r
                        .first_logits
                        .iter()
                        .zip(&alone[i].first_logits)
                        .map(|(a, b)| (a - b).abs())
                        .fold(0f32, f32::max);
                    // Batch-invariant kernels: measured 0 (the same bits); 1e-5 is the promise.
                    assert!(
                        worst <= 1e-5,
                        "{what}: first-token logits differ by {worst}"
                    );
                }
            }
        }
    }
}
