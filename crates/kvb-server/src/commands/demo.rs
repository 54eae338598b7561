//! `kvb demo`: a scripted multi-turn conversation and a moved document on the default model,
//! printing TTFT cold (Baseline, full prefill) vs warm (chunk reuse) and reuse per turn.

use super::generate::ModelArgs;
use crate::backend::{probe_device, with_backend};
use crate::model_arg;
use clap::Args;
use kvb_engine::{Engine, EngineConfig, GenerateOptions, GenerationMode, RecomputeStrategy};
use kvb_model::{ChatMessage, ModelBackend};

/// Arguments of `kvb demo`.
#[derive(Args, Debug)]
pub struct DemoArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Tokens generated per answer.
    #[arg(long, default_value_t = 24)]
    max_new_tokens: usize,
}

const QUESTIONS: [&str; 6] = [
    "What is the capital of France?",
    "Tell me one famous landmark there.",
    "How tall is it, roughly?",
    "When was it built?",
    "Who designed it?",
    "Name another city in the same country.",
];

/// A ~600-token document, as a RAG application would retrieve it.
const DOCUMENT: &str = "The Amazon rainforest covers much of the Amazon basin of South America. The basin \
encompasses seven million square kilometres, of which five and a half million are covered by the \
rainforest. The region includes territory belonging to nine nations, and the majority of the forest \
is contained within Brazil, with sixty percent of the rainforest, followed by Peru with thirteen \
percent and Colombia with ten percent. The rainforest likely formed during the Eocene era, after a \
global reduction of tropical temperatures when the Atlantic Ocean had widened sufficiently to provide \
a warm, moist climate to the Amazon basin. It has been estimated that the region holds about sixteen \
thousand tree species and some three hundred and ninety billion individual trees.

The Amazon River is the largest river in the world by discharge volume of water, and one of the two \
longest. It rises in the Andes mountains of Peru and flows eastward across the continent to the \
Atlantic Ocean. During the wet season, parts of the river can exceed forty kilometres in width, and \
its mouth releases so much fresh water that the sea remains drinkable far from the coast. More than \
three thousand species of fish have been described from the river and its tributaries.

Deforestation is the conversion of forested areas to non-forested areas. The main sources of \
deforestation in the Amazon are human settlement and the development of the land, in particular cattle \
ranching and the cultivation of soybeans. Satellite monitoring began in the late nineteen eighties, \
and the annual rate of forest loss has varied widely since then, rising with commodity prices and \
falling when enforcement of environmental law was strengthened. Scientists warn that continued loss \
could push parts of the forest past a tipping point, turning rainforest into dry savanna.

Indigenous peoples have lived in the Amazon for at least eleven thousand years. Hundreds of distinct \
groups live there today, speaking many languages, and their territories protect large areas of forest \
from clearing. Archaeological work has revealed earthworks, raised fields and dark fertile soils made \
by earlier societies, which show that parts of the forest were shaped by people long before Europeans \
arrived.";

fn row(
    label: &str,
    tokens: usize,
    cold: f64,
    warm: f64,
    reuse: f64,
    recomputed: usize,
    same: bool,
) {
    println!(
        "| {label} | {tokens} | {cold:.0} ms | {warm:.0} ms | {:.1}x | {:.0}% | {recomputed} | {} |",
        cold / warm.max(1e-9),
        100.0 * reuse,
        if same { "yes" } else { "no" }
    );
}

/// Runs `kvb demo`.
pub fn run(args: DemoArgs) -> anyhow::Result<()> {
    let path = model_arg::resolve(args.model.model.as_deref())?;
    with_backend!(
        args.model.backend,
        args.model.dtype,
        |B, device| run_on::<B>(&args, &path, &device)
    )
}

fn run_on<B: ModelBackend>(
    args: &DemoArgs,
    path: &std::path::Path,
    device: &B::Device,
) -> anyhow::Result<()> {
    probe_device::<B>(device, args.model.backend, args.model.dtype)?;
    let engine: Engine<B> = model_arg::load_engine(
        path,
        EngineConfig::new(1 << 30),
        args.model.chat_template.as_deref(),
        device,
    )?;
    let opts = |mode| GenerateOptions {
        max_new_tokens: args.max_new_tokens,
        mode,
        ..Default::default()
    };

    // The first request of a process pays one-off costs (allocator growth, thread pools): keep
    // them out of the table, or turn 1 would show a "speedup" with nothing reused.
    let warmup = engine
        .tokenizer()
        .apply_chat_template(&[ChatMessage::new("user", "Hello")], true)?;
    engine.generate(&warmup, &opts(GenerationMode::Baseline), &mut |_| {})?;
    println!("Multi-turn chat (each turn's history is the previous prompt and answer):\n");
    println!("| turn | prompt tokens | TTFT cold (baseline) | TTFT warm (kvb) | speedup | reuse | recomputed | same output |");
    println!("|---|---:|---:|---:|---:|---:|---:|---|");
    let mut messages = Vec::new();
    for (i, q) in QUESTIONS.iter().enumerate() {
        messages.push(ChatMessage::new("user", *q));
        let prompt = engine.tokenizer().apply_chat_template(&messages, true)?;
        let cold = engine.generate(&prompt, &opts(GenerationMode::Baseline), &mut |_| {})?;
        let warm = engine.generate(&prompt, &opts(GenerationMode::ChunkReuse), &mut |_| {})?;
        row(
            &format!("{}", i + 1),
            warm.prompt_tokens,
            cold.ttft_ms,
            warm.ttft_ms,
            warm.kv_reuse_ratio,
            warm.recomputed_tokens,
            cold.token_ids == warm.token_ids,
        );
        messages.push(ChatMessage::new("assistant", warm.output_text));
    }

    println!(
        "\nA document moved behind a different preamble (interior reuse, CacheBlend repair):\n"
    );
    let blend: Engine<B> = model_arg::load_engine(
        path,
        EngineConfig {
            recompute_strategy: RecomputeStrategy::CacheBlend,
            ..EngineConfig::new(1 << 30)
        },
        args.model.chat_template.as_deref(),
        device,
    )?;
    let chat = |preamble: &str, question: &str| -> anyhow::Result<String> {
        Ok(blend.tokenizer().apply_chat_template(
            &[ChatMessage::new(
                "user",
                format!("{preamble}\n\n{DOCUMENT}\n\n{question}"),
            )],
            true,
        )?)
    };
    // As a RAG application would: the document is warmed once on its own, so each of its chunks
    // holds document text only and is found wherever the document lands in a prompt.
    let warmed = blend.warm(DOCUMENT)?;
    println!(
        "(warmed the document alone: {} tokens, {} chunks)\n",
        warmed.tokens, warmed.chunks_stored
    );
    println!("| preamble | prompt tokens | TTFT cold (baseline) | TTFT warm (kvb) | speedup | reuse | recomputed | same output |");
    println!("|---|---:|---:|---:|---:|---:|---:|---|");
    let asks = [
        ("Read this text.", "Which country holds most of the forest?"),
        (
            "You are a careful geography tutor. Answer briefly, using the text below.",
            "How many tree species does the region hold?",
        ),
        (
            "Answer the question after the article.",
            "Where does the Amazon River rise?",
        ),
    ];
    let mut answers = Vec::new();
    for (i, (preamble, question)) in asks.iter().enumerate() {
        let prompt = chat(preamble, question)?;
        let cold = blend.generate(&prompt, &opts(GenerationMode::Baseline), &mut |_| {})?;
        let warm = blend.generate(&prompt, &opts(GenerationMode::ChunkReuse), &mut |_| {})?;
        row(
            &format!("{}", i + 1),
            warm.prompt_tokens,
            cold.ttft_ms,
            warm.ttft_ms,
            warm.kv_reuse_ratio,
            warm.recomputed_tokens,
            cold.token_ids == warm.token_ids,
        );
        answers.push((cold.output_text, warm.output_text));
    }
    for (i, (cold, warm)) in answers.iter().enumerate() {
        println!(
            "\n{}. baseline: {}\n   kvb:      {}",
            i + 1,
            cold.trim().replace('\n', " "),
            warm.trim().replace('\n', " ")
        );
    }
    Ok(())
}
