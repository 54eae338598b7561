//! `kvb chat`: an interactive multi-turn chat; each answer's history is reused by the next turn.

use super::engine_args::EngineArgs;
use super::generate::{summary, ModelArgs, SamplingArgs};
use crate::backend::{probe_device, with_backend};
use crate::model_arg;
use clap::Args;
use kvb_model::{ChatMessage, ModelBackend};
use std::io::{BufRead, Write};

/// Arguments of `kvb chat`.
#[derive(Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// A system message for the conversation.
    #[arg(long)]
    system: Option<String>,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    engine: EngineArgs,
}

/// Runs `kvb chat`.
pub fn run(args: ChatArgs) -> anyhow::Result<()> {
    let path = model_arg::resolve(args.model.model.as_deref())?;
    with_backend!(
        args.model.backend,
        args.model.dtype,
        |B, device| run_on::<B>(&args, &path, &device)
    )
}

fn run_on<B: ModelBackend>(
    args: &ChatArgs,
    path: &std::path::Path,
    device: &B::Device,
) -> anyhow::Result<()> {
    probe_device::<B>(device, args.model.backend, args.model.dtype)?;
    let engine = std::sync::Arc::new(model_arg::load_engine::<B>(
        path,
        args.engine.config(&args.model),
        args.model.chat_template.as_deref(),
        device,
    )?);
    let flushing = engine.clone();
    crate::stop_signal::flush_on_stop_signal(move || {
        if let Err(e) = flushing.flush() {
            eprintln!("kvb: flushing the chunk store failed: {e}");
        }
    })?;
    let mut messages: Vec<ChatMessage> = args
        .system
        .iter()
        .map(|s| ChatMessage::new("system", s.clone()))
        .collect();
    let options = args.sampling.options(&args.engine);
    eprintln!("kvb chat: type a message; /reset starts over, /exit (or end of input) quits.");
    let stdin = std::io::stdin();
    let mut lines = stdin.lock().lines();
    loop {
        eprint!("> ");
        let Some(line) = lines.next() else { break };
        let line = line?;
        match line.trim() {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                messages.retain(|m| m.role == "system");
                eprintln!("(conversation reset; the K/V cache is kept)");
                continue;
            }
            _ => {}
        }
        messages.push(ChatMessage::new("user", line));
        let prompt = engine.tokenizer().apply_chat_template(&messages, true)?;
        let mut stdout = std::io::stdout().lock();
        let r = engine.generate(&prompt, &options, &mut |e| {
            let _ = stdout.write_all(e.text.as_bytes());
            let _ = stdout.flush();
        });
        let _ = writeln!(stdout);
        match r {
            Ok(r) => {
                eprintln!("[{}]", summary(&r));
                messages.push(ChatMessage::new("assistant", r.output_text));
            }
            Err(e) => {
                eprintln!("error: {e}");
                messages.pop();
            }
        }
    }
    // End of input or /exit: what this session learned reaches the disk tier.
    engine.flush()?;
    Ok(())
}
