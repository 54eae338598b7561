//! `kvb verify`: how close chunk reuse stays to a full prefill on a user's own prompts, beside the
//! noise of changes of precision people already accept (KIVI int8/int4 K/V, a bf16 forward,
//! and for integer weights 8-bit activations).
//!
//! Each request of the file (`kvb replay`'s format) is taken in order: its `warm` text is cached
//! first (`reset` forgets the cache before), then Baseline answers its prompt and each comparison
//! is teacher-forced on that answer (see `kvb_engine::Engine::verify`).

use super::engine_args::EngineArgs;
use super::generate::ModelArgs;
use super::replay::requests::{read_requests, Request};
use super::replay::{prompt_text, Chat};
use crate::backend::{probe_device, with_backend};
use crate::model_arg;
use anyhow::{bail, Context as _};
use clap::Args;
use kvb_engine::{FidelityReport, FidelitySummary, NoiseFloor, PromptFidelity};
use kvb_model::ModelBackend;
use serde_json::json;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Arguments of `kvb verify`.
#[derive(Args, Debug)]
pub struct VerifyArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// The prompts, one JSON object per line as for `kvb replay` (`id`, `prompt` or `messages`,
    /// optional `warm`, `reset`, `max_new_tokens`; `continue` and `client` do not apply).
    #[arg(long)]
    requests: PathBuf,
    /// Tokens of Baseline's answer compared per prompt, at most.
    #[arg(long, default_value_t = 32)]
    max_new_tokens: usize,
    /// Compare reuse only, without the noise floor.
    #[arg(long)]
    no_noise_floor: bool,
    /// Also write every comparison and the summaries as JSON lines to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    #[command(flatten)]
    engine: EngineArgs,
}

/// Runs `kvb verify`.
pub fn run(args: VerifyArgs) -> anyhow::Result<()> {
    let requests = read_requests(&args.requests)?;
    if let Some(r) = requests.iter().find(|r| r.continue_chat) {
        bail!(
            "request {}: `continue` does not apply to kvb verify (each prompt is compared on its own)",
            r.id
        );
    }
    let path = model_arg::resolve(args.model.model.as_deref())?;
    with_backend!(
        args.model.backend,
        args.model.dtype,
        |B, device| run_on::<B>(&args, &requests, &path, &device)
    )
}

fn run_on<B: ModelBackend>(
    args: &VerifyArgs,
    requests: &[Request],
    path: &Path,
    device: &B::Device,
) -> anyhow::Result<()> {
    probe_device::<B>(device, args.model.backend, args.model.dtype)?;
    let engine = model_arg::load_engine::<B>(
        path,
        args.engine.config(&args.model),
        args.model.chat_template.as_deref(),
        device,
    )?;
    let floor = if args.no_noise_floor {
        None
    } else {
        Some(NoiseFloor::new(&engine).context("building the noise floor's engines")?)
    };
    let mut json_out = match &args.json {
        Some(p) => Some(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?,
        )),
        None => None,
    };
    let mut all = Vec::new();
    for r in requests {
        if r.reset {
            engine.reset_cache().context("resetting the cache")?;
        }
        if let Some(text) = &r.warm {
            engine
                .warm(text)
                .with_context(|| format!("request {}: warming", r.id))?;
        }
        let (text, _) = prompt_text(&engine, r, &Chat::None)?;
        let prompt = engine.tokenizer().encode(&text, false)?;
        let max_new = r.max_new_tokens.unwrap_or(args.max_new_tokens);
        let rows = engine
            .verify_prompt(&prompt, max_new, floor.as_ref())
            .with_context(|| format!("request {}", r.id))?;
        for row in &rows {
            println!("{}", row_line(&r.id.to_string(), row));
            if let Some(out) = &mut json_out {
                writeln!(out, "{}", row_json(&r.id, row))?;
            }
        }
        all.push(rows);
    }
    let report = FidelityReport::new(all);
    println!();
    println!("| compared | prompts | identical | top-1 (forced) | mean KL | max KL | recomputed | reused |");
    println!("|---|---:|---:|---:|---:|---:|---:|---:|");
    for s in &report.summaries {
        println!("{}", summary_line(s));
        if let Some(out) = &mut json_out {
            writeln!(out, "{}", summary_json(s))?;
        }
    }
    if let Some(mut out) = json_out {
        out.flush()?;
    }
    Ok(())
}

fn row_line(id: &str, r: &PromptFidelity) -> String {
    format!(
        "{id} {}: {} tokens, identical {}, top-1 {:.1}%, mean KL {:.2e}, max KL {:.2e}, recomputed {}/{} cached of {}",
        r.compared,
        r.answer_tokens,
        r.identical,
        100.0 * r.top1_agreement(),
        r.mean_kl(),
        r.max_kl(),
        r.recomputed_tokens,
        r.cached_tokens,
        r.prompt_tokens
    )
}

fn row_json(id: &serde_json::Value, r: &PromptFidelity) -> serde_json::Value {
    json!({
        "id": id,
        "compared": r.compared.to_string(),
        "prompt_tokens": r.prompt_tokens,
        "answer_tokens": r.answer_tokens,
        "identical": r.identical,
        "top1_agreement": r.top1_agreement(),
        "mean_kl": r.mean_kl(),
        "max_kl": r.max_kl(),
        "cached_tokens": r.cached_tokens,
        "recomputed_tokens": r.recomputed_tokens,
    })
}

fn summary_line(s: &FidelitySummary) -> String {
    format!(
        "| {} | {} | {} | {:.1}% | {:.2e} | {:.2e} | {:.1}% | {:.1}% |",
        s.compared,
        s.prompts,
        s.identical,
        100.0 * s.top1_agreement,
        s.mean_kl,
        s.max_kl,
        100.0 * s.recompute_share,
        100.0 * s.reuse_ratio
    )
}

fn summary_json(s: &FidelitySummary) -> serde_json::Value {
    json!({
        "summary": s.compared.to_string(),
        "prompts": s.prompts,
        "identical": s.identical,
        "positions": s.positions,
        "top1_agreement": s.top1_agreement,
        "mean_kl": s.mean_kl,
        "max_kl": s.max_kl,
        "recompute_share": s.recompute_share,
        "reuse_ratio": s.reuse_ratio,
    })
}
