//! `kvb`: the command line of the kvb engine.
//!
//! Every command takes `--model PATH` (a HuggingFace folder or a `.gguf` file); without it, the
//! embedded default model (SmolLM2-135M-Instruct) is used and fetched on first use.
//!
//! `kvb replay` is the stable interface for outside harnesses: JSONL requests in, one JSON result
//! line per request out (its fields are documented in docs/guide.md and in `commands/replay.rs`).

use clap::{Parser, Subcommand};
use kvb_server::{allocator, commands, model_arg, serve};

#[derive(Parser)]
#[command(
    name = "kvb",
    version,
    about = "Fast LLM inference on repeated context"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Generate text from a prompt, streaming it to stdout.
    Generate(commands::generate::GenerateArgs),
    /// Chat interactively; each turn reuses the K/V of the conversation so far.
    Chat(commands::chat::ChatArgs),
    /// A scripted chat and a moved document: TTFT cold vs warm, reuse per turn.
    Demo(commands::demo::DemoArgs),
    /// Run the requests of a JSONL file through one engine; one JSON result line per request.
    Replay(commands::replay::ReplayArgs),
    /// How close chunk reuse stays to a full prefill on your prompts, beside the noise floor.
    Verify(commands::verify::VerifyArgs),
    /// Serve the model over HTTP with OpenAI's API (chat and completions, streamed or not).
    Serve(serve::ServeArgs),
    /// Fetch the default model into the models folder (idempotent).
    FetchModel,
}

fn main() {
    allocator::keep_freed_memory();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Generate(args) => commands::generate::run(args),
        Command::Chat(args) => commands::chat::run(args),
        Command::Demo(args) => commands::demo::run(args),
        Command::Replay(args) => commands::replay::run(args),
        Command::Verify(args) => commands::verify::run(args),
        Command::Serve(args) => serve::run(args),
        Command::FetchModel => model_arg::resolve(None).map(|p| {
            eprintln!("default model ready at {}", p.display());
        }),
    };
    if let Err(e) = result {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
