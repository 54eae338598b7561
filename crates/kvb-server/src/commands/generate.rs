//! `kvb generate`: one prompt in, streamed text out; timings on stderr.

use super::engine_args::EngineArgs;
use super::text_file::read_text_file;
use crate::backend::{parse_backend, probe_device, with_backend};
use crate::model_arg;
use anyhow::Context;
use clap::Args;
use kvb_engine::{GenerateOptions, GenerationResult, Grammar};
use kvb_model::generate::SamplingParams;
use kvb_model::{backends::BackendKind, FloatDtype};
use kvb_model::{ActivationPrecision, ChatMessage, ModelBackend, WeightPrecision};
use std::io::Write;
use std::path::PathBuf;

/// Sampling flags shared by the generating commands.
#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Maximum number of tokens to generate.
    #[arg(long, default_value_t = GenerateOptions::default().max_new_tokens)]
    pub max_new_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = SamplingParams::default().temperature)]
    pub temperature: f32,
    /// Keep only the k most likely tokens when sampling (0 = all).
    #[arg(long, default_value_t = SamplingParams::default().top_k)]
    pub top_k: usize,
    /// Nucleus sampling threshold.
    #[arg(long, default_value_t = SamplingParams::default().top_p)]
    pub top_p: f32,
    /// Keep only tokens at least this many times as likely as the most likely one (0 = all).
    #[arg(long, default_value_t = SamplingParams::default().min_p)]
    pub min_p: f32,
    /// Lower a token's logit this much per time it was generated already.
    #[arg(long, default_value_t = SamplingParams::default().frequency_penalty)]
    pub frequency_penalty: f32,
    /// Lower a token's logit this much once it was generated at all.
    #[arg(long, default_value_t = SamplingParams::default().presence_penalty)]
    pub presence_penalty: f32,
    /// Divide the logits of the prompt's and output's tokens by this (1 = off).
    #[arg(long, default_value_t = SamplingParams::default().repetition_penalty)]
    pub repetition_penalty: f32,
    /// Seed of the sampler.
    #[arg(long, default_value_t = SamplingParams::default().seed)]
    pub seed: u64,
    /// Stop when the output contains this string (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Answer with a JSON object (constrained decoding, as `response_format: json_object`).
    #[arg(long, conflicts_with_all = ["json_schema", "regex"])]
    pub json: bool,
    /// Answer with JSON valid against this JSON Schema: inline JSON, or a file's path.
    #[arg(long, value_name = "SCHEMA", value_parser = parse_schema, conflicts_with = "regex")]
    pub json_schema: Option<serde_json::Value>,
    /// Answer with text matching this regular expression in full.
    #[arg(long, value_name = "REGEX")]
    pub regex: Option<String>,
}

/// `--json-schema`: inline JSON when it starts with `{` (or is `true`/`false`), else a file.
fn parse_schema(arg: &str) -> Result<serde_json::Value, String> {
    let trimmed = arg.trim_start();
    let text = if trimmed.starts_with('{') || trimmed == "true" || trimmed == "false" {
        arg.to_string()
    } else {
        std::fs::read_to_string(arg).map_err(|e| format!("reading the schema file {arg}: {e}"))?
    };
    serde_json::from_str(&text).map_err(|e| format!("the schema is not JSON: {e}"))
}

impl SamplingArgs {
    /// Request options with these flags and `engine.mode`.
    pub fn options(&self, engine: &EngineArgs) -> GenerateOptions {
        GenerateOptions {
            max_new_tokens: self.max_new_tokens,
            mode: engine.mode,
            sampling: SamplingParams {
                temperature: self.temperature,
                top_k: self.top_k,
                top_p: self.top_p,
                min_p: self.min_p,
                frequency_penalty: self.frequency_penalty,
                presence_penalty: self.presence_penalty,
                repetition_penalty: self.repetition_penalty,
                logit_bias: Vec::new(),
                seed: self.seed,
            },
            stop_strings: self.stop.clone(),
            cacheable_prefix_len: None,
            grammar: self.grammar(),
            ..Default::default()
        }
    }

    /// The structured output the flags ask for.
    fn grammar(&self) -> Option<Grammar> {
        if self.json {
            Some(Grammar::JsonObject)
        } else if let Some(schema) = &self.json_schema {
            Some(Grammar::JsonSchema(schema.clone()))
        } else {
            self.regex.clone().map(Grammar::Regex)
        }
    }
}

/// Model selection flags shared by every command.
#[derive(Args, Debug, Clone)]
pub struct ModelArgs {
    /// A HuggingFace model folder or a .gguf file (default: the embedded SmolLM2-135M-Instruct).
    #[arg(long)]
    pub model: Option<PathBuf>,
    /// cpu (default), wgpu or cuda, as compiled in.
    #[arg(long, default_value = "cpu", value_parser = parse_backend)]
    pub backend: BackendKind,
    /// Float type of weights, activations and the K/V pool on a GPU backend: f32 (default), f16
    /// (wgpu, CUDA: half the memory; attention and normalisation still sum in f32) or bf16
    /// (CUDA). The CPU computes in f32 (see --weights and --pool-dtype).
    #[arg(long, default_value_t = FloatDtype::F32)]
    pub dtype: FloatDtype,
    /// Try unknown architectures as Llama-layout models.
    #[arg(long)]
    pub no_strict: bool,
    /// Precision of the weights in memory: auto (as stored: a GGUF's quantized tensors and
    /// f16/bf16 tensors stay as they are, with the outputs of their f32 expansion), f32, bf16
    /// (rounds f32 weights to bf16; lossy) or q8_0 (quantizes f32/16-bit weights to 8 bits;
    /// lossy).
    #[arg(long, default_value_t = WeightPrecision::Auto)]
    pub weights: WeightPrecision,
    /// How products quantize their input rows: f32 (default; the exact products, the output of
    /// the f32 model) or q8 (8 bits per value and a scale per 32, as llama.cpp computes on a
    /// quantized model: faster prefill and batched decode on CPUs with AVX-512 VNNI, slightly
    /// different output; needs integer weights, e.g. a Q4/Q8 GGUF or --weights q8_0).
    #[arg(long, default_value_t = ActivationPrecision::F32)]
    pub activations: ActivationPrecision,
    /// A Jinja chat template file to use instead of the model's own (as transformers'
    /// `chat_template`; a template with a tools section also writes tools and calls).
    #[arg(long, value_name = "PATH")]
    pub chat_template: Option<PathBuf>,
}

/// Arguments of `kvb generate`.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The prompt text.
    #[arg(
        long,
        required_unless_present = "prompt_file",
        conflicts_with = "prompt_file"
    )]
    prompt: Option<String>,
    /// Read the prompt from a file (`-`: standard input); it must be UTF-8 text.
    #[arg(long, value_name = "PATH")]
    prompt_file: Option<PathBuf>,
    /// Wrap the prompt as one user message with the model's chat template.
    #[arg(long)]
    chat: bool,
    /// A system message (with --chat).
    #[arg(long, requires = "chat")]
    system: Option<String>,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    engine: EngineArgs,
}

/// One line of request statistics for stderr.
pub fn summary(r: &GenerationResult) -> String {
    format!(
        "prompt tokens: {} | cached: {} ({:.0}%) | recomputed: {} | TTFT: {:.1} ms | generated: {} tokens | decode: {:.1} tokens/s",
        r.prompt_tokens,
        r.cached_tokens,
        100.0 * r.kv_reuse_ratio,
        r.recomputed_tokens,
        r.ttft_ms,
        r.token_ids.len(),
        r.tokens_per_sec
    )
}

/// Runs `kvb generate`.
pub fn run(args: GenerateArgs) -> anyhow::Result<()> {
    let path = model_arg::resolve(args.model.model.as_deref())?;
    with_backend!(
        args.model.backend,
        args.model.dtype,
        |B, device| run_on::<B>(&args, &path, &device)
    )
}

fn run_on<B: ModelBackend>(
    args: &GenerateArgs,
    path: &std::path::Path,
    device: &B::Device,
) -> anyhow::Result<()> {
    probe_device::<B>(device, args.model.backend, args.model.dtype)?;
    let text = match (&args.prompt, &args.prompt_file) {
        (Some(text), _) => text.clone(),
        (None, Some(file)) => read_text_file(file, "prompt file")?,
        (None, None) => anyhow::bail!("give --prompt or --prompt-file"),
    };
    let engine = model_arg::load_engine::<B>(
        path,
        args.engine.config(&args.model),
        args.model.chat_template.as_deref(),
        device,
    )?;
    let prompt = if args.chat {
        let mut messages = Vec::new();
        if let Some(system) = &args.system {
            messages.push(ChatMessage::new("system", system.clone()));
        }
        messages.push(ChatMessage::new("user", text));
        engine.tokenizer().apply_chat_template(&messages, true)?
    } else {
        text
    };
    let mut stdout = std::io::stdout().lock();
    let r = engine
        .generate(
            &prompt,
            &args.sampling.options(&args.engine),
            &mut |event| {
                let _ = stdout.write_all(event.text.as_bytes());
                let _ = stdout.flush();
            },
        )
        .context("generation failed")?;
    let _ = writeln!(stdout);
    eprintln!("{}", summary(&r));
    Ok(())
}
