//! `kvb serve`: an OpenAI-compatible HTTP server (tokio + axum) over the engine's batched
//! scheduler. Every request is submitted to the engine at once and streams from it; the engine
//! batches all running sequences into one forward pass per step and shares their K/V blocks.
//!
//! A reader's path: [`app`] (state, admission, router) → [`completions`] (validate, tokenize,
//! submit, answer whole or as server-sent events) → [`bridge`] (engine events to async, cancel on
//! drop) → kvb-engine. On the way in, [`body`] parses JSON naming the bad field, [`fields`] refuses
//! fields that would change the answer and are not served, [`sampling`] checks the sampler's
//! settings and [`chat_prompt`] tokenizes messages with control tokens from the template only.
//! [`info`] and [`tokenize`] have the other routes, [`error`] OpenAI's error bodies, [`metrics`]
//! the Prometheus text.

mod api;
mod app;
mod body;
mod bridge;
mod chat_prompt;
mod completions;
mod error;
mod fields;
mod info;
mod logprobs;
mod metrics;
mod sampling;
mod tokenize;
mod tool_stream;
mod tools;

use crate::backend::{probe_device, with_backend};
use crate::commands::engine_args::EngineArgs;
use crate::commands::generate::ModelArgs;
use crate::model_arg;
use anyhow::Context;
use app::{AppState, ServedEngine, Settings};
use axum::serve::ListenerExt;
use clap::Args;
use kvb_model::{ChatMessage, ModelBackend};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Reads `body` as the server reads a POST to `route` (`/v1/chat/completions`, `/v1/completions`
/// or `/v1/warm`) before anything reaches the engine: JSON, the route's fields, and the chat
/// messages' roles and contents. `Ok` holds the messages for the chat template where the route
/// takes them; `Err` the message of the 400 a client gets. Unknown routes are an `Err` too.
pub fn read_body(route: &str, body: &[u8]) -> Result<Option<Vec<ChatMessage>>, String> {
    let messages = match route {
        "/v1/chat/completions" => {
            let req = body::parse::<api::ChatCompletionRequest>(body).map_err(|e| e.message)?;
            Some(
                completions::chat_messages(&req.messages, tools::ToolFormat::Generic)
                    .map_err(|e| e.message)?,
            )
        }
        "/v1/completions" => {
            body::parse::<api::CompletionRequest>(body).map_err(|e| e.message)?;
            None
        }
        "/v1/warm" => match body::parse::<api::WarmRequest>(body).map_err(|e| e.message)? {
            api::WarmRequest {
                messages: Some(m), ..
            } => Some(
                completions::chat_messages(&m, tools::ToolFormat::Generic)
                    .map_err(|e| e.message)?,
            ),
            _ => None,
        },
        other => return Err(format!("no POST route {other}")),
    };
    Ok(messages)
}

/// Arguments of `kvb serve`.
#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    model: ModelArgs,
    /// Address to listen on (loopback unless told otherwise).
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0: any free port; the one taken is printed).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// The name requests use in `model` (default: the model folder's or file's name; for the
    /// embedded model, `SmolLM2-135M-Instruct`).
    #[arg(long)]
    served_model_name: Option<String>,
    /// Require `Authorization: Bearer KEY` on /v1/* (also read from KVB_API_KEY). Several keys
    /// (repeated, or comma-separated) are several tenants: each key's requests get their own
    /// cache namespace, so no tenant is served (or can time) another's cached prompts.
    #[arg(
        long,
        env = "KVB_API_KEY",
        hide_env_values = true,
        value_delimiter = ','
    )]
    api_key: Vec<String>,
    /// Requests held waiting beyond those running (--max-running); more get 503.
    #[arg(long, default_value_t = 256)]
    max_queue: usize,
    /// Seconds a request may wait and run; past that it is cancelled with 504.
    #[arg(long, default_value_t = 600.0)]
    request_timeout: f64,
    /// Largest request body in bytes; larger ones get 413.
    #[arg(long, default_value_t = 4 << 20)]
    max_body_bytes: usize,
    /// `max_tokens` of requests that give none (default: up to the end of the context).
    #[arg(long)]
    default_max_tokens: Option<usize>,
    /// Seconds running requests get to finish after SIGINT/SIGTERM before they are cancelled.
    #[arg(long, default_value_t = 30.0)]
    shutdown_grace: f64,
    /// Read special tokens typed in chat messages (`<|im_start|>`) as control tokens, as the
    /// chat template's own are. Only for callers trusted to write whole turns: by default they
    /// are text, so a user cannot forge a system turn.
    #[arg(long)]
    trust_message_special_tokens: bool,
    /// Origins a browser may call this server from (CORS), comma-separated or repeated; `*`
    /// allows any. None by default.
    #[arg(long, value_delimiter = ',')]
    allowed_origins: Vec<String>,
    #[command(flatten)]
    engine: EngineArgs,
}

/// Runs `kvb serve` until SIGINT or SIGTERM.
pub fn run(args: ServeArgs) -> anyhow::Result<()> {
    init_logging();
    for (name, v) in [
        ("--request-timeout", args.request_timeout),
        ("--shutdown-grace", args.shutdown_grace),
    ] {
        if !(v.is_finite() && v > 0.0) {
            anyhow::bail!("{name} must be a positive number of seconds");
        }
    }
    for origin in args.allowed_origins.iter().filter(|o| *o != "*") {
        if origin.parse::<axum::http::HeaderValue>().is_err() || !origin.contains("://") {
            anyhow::bail!("--allowed-origins: `{origin}` is not an origin (scheme://host[:port])");
        }
    }
    let path = model_arg::resolve(args.model.model.as_deref())?;
    with_backend!(
        args.model.backend,
        args.model.dtype,
        |B, device| run_on::<B>(&args, &path, &device)
    )
}

/// Logs to stderr; `RUST_LOG` sets the level (default: info).
fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .try_init();
}

fn run_on<B: ModelBackend>(
    args: &ServeArgs,
    path: &std::path::Path,
    device: &B::Device,
) -> anyhow::Result<()> {
    probe_device::<B>(device, args.model.backend, args.model.dtype)?;
    let engine: Arc<dyn ServedEngine> = Arc::new(model_arg::load_engine::<B>(
        path,
        args.engine.config(&args.model),
        args.model.chat_template.as_deref(),
        device,
    )?);
    let model_name = args.served_model_name.clone().unwrap_or_else(|| {
        if args.model.model.is_none() {
            // The embedded model by its model name, not its file's (`...Instruct.Q4_1`).
            return kvb_model::fetch::HF_DIR_NAME.to_string();
        }
        path.file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "kvb".into())
    });
    let settings = Settings {
        model_name,
        api_keys: args
            .api_key
            .iter()
            .map(|k| k.trim().to_string())
            .filter(|k| !k.is_empty())
            .collect(),
        max_queue: args.max_queue,
        request_timeout: Duration::from_secs_f64(args.request_timeout),
        max_body_bytes: args.max_body_bytes,
        default_max_tokens: args.default_max_tokens.unwrap_or(engine.context_len()),
        mode: args.engine.mode,
        trust_message_special_tokens: args.trust_message_special_tokens,
        allowed_origins: args.allowed_origins.clone(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let grace = Duration::from_secs_f64(args.shutdown_grace);
    let served = runtime.block_on(serve(
        engine.clone(),
        settings,
        &args.host,
        args.port,
        grace,
    ));
    // Requests still running past the grace period are cancelled as their tasks go.
    runtime.shutdown_timeout(Duration::from_secs(5));
    served?;
    tracing::info!("flushing the chunk store");
    engine
        .flush()
        .context("flushing the chunk store at shutdown")?;
    tracing::info!("stopped");
    Ok(())
}

async fn serve(
    engine: Arc<dyn ServedEngine>,
    settings: Settings,
    host: &str,
    port: u16,
    grace: Duration,
) -> anyhow::Result<()> {
    let listener = tokio::net::TcpListener::bind((host, port))
        .await
        .with_context(|| format!("binding {host}:{port}"))?;
    let addr = listener.local_addr()?;
    let name = settings.model_name.clone();
    let app = AppState::new(engine, settings);
    // Tests and scripts read this line for the port.
    eprintln!("kvb serve: listening on http://{addr} (model `{name}`)");
    let signalled = Arc::new(tokio::sync::Notify::new());
    let (closing, notify) = (app.clone(), signalled.clone());
    // Streamed answers are one small write per token: with Nagle's algorithm on, a write can
    // wait for the client's delayed ACK of the one before (up to tens of milliseconds per token
    // over a network; loopback ACKs at once, so local tests do not show it).
    let listener = listener.tap_io(|tcp| {
        if let Err(e) = tcp.set_nodelay(true) {
            tracing::warn!("could not turn off Nagle's algorithm on a connection: {e}");
        }
    });
    let server = axum::serve(listener, app::router(app)).with_graceful_shutdown(async move {
        crate::stop_signal::stop_signal().await;
        closing.closing.store(true, Ordering::Release);
        tracing::info!(
            "shutting down: no new requests; running ones get {} s",
            grace.as_secs_f64()
        );
        notify.notify_one();
    });
    tokio::select! {
        r = server => r.context("serving")?,
        _ = async { signalled.notified().await; tokio::time::sleep(grace).await } => {
            tracing::warn!("grace period over: cancelling the requests still running");
        }
    }
    Ok(())
}
