//! `kvb generate`: one prompt in, streamed text out; timings on stderr.

use crate::backend::{parse_backend, with_backend};
use crate::model_arg;
use anyhow::Context;
use clap::Args;
use kvb_model::backends::BackendKind;
use kvb_model::generate::{generate, GenerateParams, SamplingParams};
use kvb_model::ChatMessage;
use kvb_model::ModelBackend;
use std::io::Write;
use std::path::PathBuf;

/// Arguments of `kvb generate`.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// A HuggingFace model folder or a .gguf file (default: the embedded SmolLM2-135M-Instruct).
    #[arg(long)]
    model: Option<PathBuf>,
    /// The prompt text.
    #[arg(long)]
    prompt: String,
    /// Wrap the prompt as one user message with the model's chat template.
    #[arg(long)]
    chat: bool,
    /// A system message (with --chat).
    #[arg(long, requires = "chat")]
    system: Option<String>,
    /// Maximum number of tokens to generate.
    #[arg(long, default_value_t = 128)]
    max_new_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Keep only the k most likely tokens when sampling (0 = all).
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Nucleus sampling threshold.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Seed of the sampler.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Stop when the output contains this string (repeatable).
    #[arg(long = "stop")]
    stop: Vec<String>,
    /// cpu (default), wgpu or cuda, as compiled in.
    #[arg(long, default_value = "cpu", value_parser = parse_backend)]
    backend: BackendKind,
    /// Try unknown architectures as Llama-layout models.
    #[arg(long)]
    no_strict: bool,
}

/// Runs `kvb generate`.
pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    let path = model_arg::resolve(args.model.as_deref())?;
    with_backend!(args.backend, |B, device| run_on::<B>(&args, &path, &device))
}

fn run_on<B: ModelBackend>(
    args: &GenerateArgs,
    path: &std::path::Path,
    device: &B::Device,
) -> anyhow::Result<()> {
    crate::backend::probe_device::<B>(device, args.backend)?;
    let m = model_arg::load::<B>(path, !args.no_strict, device)?;
    let prompt = if args.chat {
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(ChatMessage::new("system", system.clone()));
        }
        messages.push(ChatMessage::new("user", args.prompt.clone()));
        m.tokenizer.apply_chat_template(&messages, true)?
    } else {
        args.prompt.clone()
    };
    let ids = m.tokenizer.encode(&prompt, false)?;
    if ids.is_empty() {
        anyhow::bail!("the prompt is empty after tokenization");
    }
    let params = GenerateParams {
        max_new_tokens: args.max_new_tokens,
        sampling: SamplingParams {
            temperature: args.temperature,
            top_k: args.top_k,
            top_p: args.top_p,
            seed: args.seed,
        },
        stop_strings: args.stop.clone(),
        stop_at_eos: true,
    };
    let mut stdout = std::io::stdout().lock();
    let out = generate(&m.model, &m.tokenizer, &ids, &params, &mut |event| {
        let _ = stdout.write_all(event.text.as_bytes());
        let _ = stdout.flush();
    })
    .context("generation failed")?;
    let _ = writeln!(stdout);
    let d = &out.decoded;
    let decode_steps = d.tokens.len().saturating_sub(1);
    let tps = if d.decode_time.as_secs_f64() > 0.0 {
        decode_steps as f64 / d.decode_time.as_secs_f64()
    } else {
        0.0
    };
    eprintln!(
        "prompt tokens: {} | TTFT: {:.1} ms | generated: {} tokens | decode: {:.1} tokens/s | stop: {:?}",
        out.prompt_tokens,
        out.ttft.as_secs_f64() * 1e3,
        d.tokens.len(),
        tps,
        d.stop
    );
    Ok(())
}
