//! `POST /v1/chat/completions` and `POST /v1/completions`: validate, render, tokenize, submit to
//! the engine's scheduler, then answer in one body or as server-sent events, one per token.

use super::api::*;
use super::app::{AppState, Arrival, Tenant, Ticket};
use super::body::ApiJson;
use super::bridge::{self, Events};
use super::chat_prompt::chat_prompt_tokens;
use super::error::ApiError;
use super::logprobs;
use super::sampling::sampling_params;
use super::tool_stream::{Finished, StreamPiece, ToolStream};
use super::tools::{self, tools_of, ChatPrompt, ToolFormat, Tools};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderName, HeaderValue};
use axum::response::sse::{Event as SseEvent, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use futures_util::stream::{self, Stream};
use kvb_engine::{
    Event, GenerateOptions, GenerationResult, Grammar, Started, StopReason, TokenLogprobs,
};
use kvb_model::ChatMessage;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;
use tokio::time::Instant as Deadline;

/// Which endpoint a request came through: its object names and ids differ.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Chat,
    Text,
}

impl Kind {
    fn endpoint(self) -> &'static str {
        match self {
            Kind::Chat => "chat",
            Kind::Text => "completions",
        }
    }
}

/// A validated request, ready for the engine.
struct Job {
    kind: Kind,
    id: String,
    prompt: PromptInput,
    options: GenerateOptions,
    stream: bool,
    include_usage: bool,
    arrival: Instant,
    /// The request's tools, when it offers any (chat only).
    tools: Option<Tools>,
    /// Its tenant's name in `/metrics` (with several API keys).
    tenant: Option<String>,
    /// The prompt's text, to go before the completion's (`echo`, completions only).
    echo: Option<String>,
    /// Answers asked for (`n`): copies of the prompt, each its own sequence.
    n: usize,
}

enum PromptInput {
    Text(String),
    Tokens(Vec<u32>),
    /// Rendered with the chat template and tokenized off the async workers.
    Chat(ChatPrompt),
}

#[utoipa::path(
    post,
    path = "/v1/chat/completions",
    request_body = ChatCompletionRequest,
    responses(
        (status = 200, description = "The answer; with `stream`, server-sent `ChatCompletionChunk`s then `[DONE]`",
         content((ChatCompletion = "application/json"), (StreamEvent = "text/event-stream"))),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 503, body = ErrorBody), (status = 504, body = ErrorBody),
    )
)]
pub async fn chat_completions(
    State(app): State<Arc<AppState>>,
    Extension(arrival): Extension<Arrival>,
    tenant: Option<Extension<Tenant>>,
    ApiJson(req): ApiJson<ChatCompletionRequest>,
) -> Response {
    let job = (|| {
        let tools = tools_of(&req, app.tool_format)?;
        let messages = chat_messages(&req.messages, app.tool_format)?;
        let prompt = ChatPrompt::new(messages, tools.as_ref());
        let logprobs = match (req.logprobs, req.top_logprobs) {
            (_, Some(n)) if n > MAX_TOP_LOGPROBS => Err(ApiError::bad_request(
                format!("`top_logprobs` must be at most {MAX_TOP_LOGPROBS}"),
                Some("top_logprobs"),
            )),
            (false, Some(_)) => Err(ApiError::bad_request(
                "`top_logprobs` needs `logprobs`: true",
                Some("top_logprobs"),
            )),
            (true, top) => Ok(Some(top.unwrap_or(0) as usize)),
            (false, None) => Ok(None),
        }?;
        let mut job = job(
            &app,
            Kind::Chat,
            PromptInput::Chat(prompt),
            (req.sampling, logprobs),
            (arrival, tenant.map(|t| t.0).unwrap_or_default()),
        )?;
        if let Some(t) = &tools {
            job.options.grammar = Some(t.grammar());
        }
        job.tools = tools;
        Ok(job)
    })();
    match job {
        Ok(job) => run(app, job).await,
        Err(e) => refuse(&app, Kind::Chat, e, arrival),
    }
}

#[utoipa::path(
    post,
    path = "/v1/completions",
    request_body = CompletionRequest,
    responses(
        (status = 200, description = "The answer; with `stream`, server-sent `Completion` chunks then `[DONE]`",
         content((Completion = "application/json"), (StreamEvent = "text/event-stream"))),
        (status = 400, body = ErrorBody), (status = 401, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 413, body = ErrorBody),
        (status = 503, body = ErrorBody), (status = 504, body = ErrorBody),
    )
)]
pub async fn completions(
    State(app): State<Arc<AppState>>,
    Extension(arrival): Extension<Arrival>,
    tenant: Option<Extension<Tenant>>,
    ApiJson(req): ApiJson<CompletionRequest>,
) -> Response {
    let prompt = match req.prompt {
        Prompt::Text(t) => Ok(PromptInput::Text(t)),
        Prompt::Tokens(t) => Ok(PromptInput::Tokens(t)),
        Prompt::Texts(mut v) if v.len() == 1 => Ok(PromptInput::Text(v.remove(0))),
        Prompt::Texts(_) => Err(ApiError::bad_request(
            "only one prompt per request is served",
            Some("prompt"),
        )),
    };
    let logprobs = match req.logprobs {
        Some(n) if n > MAX_TOP_LOGPROBS => Err(ApiError::bad_request(
            format!("`logprobs` must be at most {MAX_TOP_LOGPROBS}"),
            Some("logprobs"),
        )),
        n => Ok(n.map(|n| n as usize)),
    };
    let echo = req.echo == Some(true);
    if echo && req.logprobs.is_some() {
        let e = ApiError::bad_request(
            "`echo` with `logprobs` is not served: the prompt's log-probabilities are not computed",
            Some("echo"),
        );
        return refuse(&app, Kind::Text, e, arrival);
    }
    let sampling = logprobs.map(|l| (req.sampling, l));
    let tenant = tenant.map(|t| t.0).unwrap_or_default();
    let job = prompt.and_then(|p| {
        let echo = match (&p, echo) {
            (_, false) => None,
            (PromptInput::Text(t), true) => Some(t.clone()),
            (PromptInput::Tokens(t), true) => Some(echoed_tokens(&app, t)?),
            (PromptInput::Chat(_), true) => None,
        };
        let job = job(&app, Kind::Text, p, sampling?, (arrival, tenant))?;
        Ok(Job { echo, ..job })
    });
    match job {
        Ok(job) => run(app, job).await,
        Err(e) => refuse(&app, Kind::Text, e, arrival),
    }
}

/// The text of a prompt given as token ids, for `echo`.
fn echoed_tokens(app: &AppState, tokens: &[u32]) -> Result<String, ApiError> {
    app.engine.tokenizer().decode(tokens, false).map_err(|e| {
        ApiError::bad_request(format!("cannot decode the prompt: {e}"), Some("prompt"))
    })
}

/// The messages of a request for the chat template, calls and tool results written in
/// `format`; none at all, an unknown role or a content part other than text is refused,
/// naming the message.
pub(super) fn chat_messages(
    messages: &[ChatMessageIn],
    format: ToolFormat,
) -> Result<Vec<ChatMessage>, ApiError> {
    if messages.is_empty() {
        return Err(ApiError::bad_request(
            "`messages` is empty",
            Some("messages"),
        ));
    }
    messages
        .iter()
        .enumerate()
        .map(|(i, m)| message(m, i, format))
        .collect()
}

/// A message for the chat template; content parts other than text are refused. Tool results
/// and an assistant's calls are written in the tool format ([`super::tools`]).
fn message(m: &ChatMessageIn, i: usize, format: ToolFormat) -> Result<ChatMessage, ApiError> {
    let role = match m.role.as_str() {
        "developer" => "system",
        r @ ("system" | "user" | "assistant" | "tool") => r,
        other => {
            return Err(ApiError::bad_request(
                format!("unknown role `{other}` (system, user, assistant, developer, tool)"),
                Some(&format!("messages[{i}].role")),
            ))
        }
    };
    let calls = m.tool_calls.as_deref().unwrap_or_default();
    if !calls.is_empty() && role != "assistant" {
        return Err(ApiError::bad_request(
            "only assistant messages have `tool_calls`",
            Some(&format!("messages[{i}].tool_calls")),
        ));
    }
    let content = match &m.content {
        None if !calls.is_empty() => String::new(),
        None => {
            return Err(ApiError::bad_request(
                "`content` is required (it may be null only beside `tool_calls`)",
                Some(&format!("messages[{i}].content")),
            ))
        }
        Some(Content::Text(t)) => t.clone(),
        Some(Content::Parts(parts)) => {
            let mut text = String::new();
            for (j, p) in parts.iter().enumerate() {
                match (p.kind.as_str(), &p.text) {
                    ("text", Some(t)) => text.push_str(t),
                    _ => {
                        return Err(ApiError::bad_request(
                            "only text content parts are served",
                            Some(&format!("messages[{i}].content[{j}]")),
                        ))
                    }
                }
            }
            text
        }
    };
    let mut message =
        tools::history_message(role, content, calls, m.tool_call_id.as_deref(), format);
    message.name = m.name.clone();
    Ok(message)
}

/// The most likely tokens a request may ask to see at each position (OpenAI's bound for chat).
const MAX_TOP_LOGPROBS: u32 = 20;
/// The most answers one request may ask for (`n`): each is a sequence in the batch.
const MAX_CHOICES: usize = 16;

/// Checks the settings shared by both endpoints; `logprobs` is how many of the most likely
/// tokens to report beside each generated one (`None`: no log-probabilities).
fn job(
    app: &AppState,
    kind: Kind,
    prompt: PromptInput,
    (s, logprobs): (Sampling, Option<usize>),
    (arrival, tenant): (Arrival, Tenant),
) -> Result<Job, ApiError> {
    if s.model != app.settings.model_name {
        return Err(ApiError::unknown_model(&s.model, &app.settings.model_name));
    }
    let n = s.n.unwrap_or(1) as usize;
    if !(1..=MAX_CHOICES).contains(&n) {
        return Err(ApiError::bad_request(
            format!("`n` must be 1 to {MAX_CHOICES}"),
            Some("n"),
        ));
    }
    let sampling = sampling_params(&s, app.engine.tokenizer().vocab_size())?;
    let (max_tokens, param) = match (s.max_completion_tokens, s.max_tokens) {
        (Some(m), _) => (m as usize, "max_completion_tokens"),
        (None, Some(m)) => (m as usize, "max_tokens"),
        (None, None) => (app.settings.default_max_tokens, "max_tokens"),
    };
    if max_tokens == 0 {
        return Err(ApiError::bad_request(
            format!("`{param}` must be at least 1"),
            Some(param),
        ));
    }
    let stop_strings = s.stop.map(Stop::into_vec).unwrap_or_default();
    if stop_strings.iter().any(String::is_empty) {
        return Err(ApiError::bad_request(
            "a stop string is empty",
            Some("stop"),
        ));
    }
    let grammar = match s.response_format.clone() {
        Some(format) => grammar(format)?,
        None => None,
    };
    if s.stream_options.is_some() && !s.stream {
        return Err(ApiError::bad_request(
            "`stream_options` needs `stream`: true",
            Some("stream_options"),
        ));
    }
    Ok(Job {
        kind,
        id: app.new_id(match kind {
            Kind::Chat => "chatcmpl",
            Kind::Text => "cmpl",
        }),
        prompt,
        options: GenerateOptions {
            max_new_tokens: max_tokens,
            mode: app.settings.mode,
            sampling,
            stop_strings,
            cacheable_prefix_len: None,
            logprobs,
            grammar,
            cache_scope: cache_scope(&tenant, s.cache_salt.as_deref()),
            ..Default::default()
        },
        stream: s.stream,
        include_usage: s.stream_options.is_some_and(|o| o.include_usage),
        arrival: arrival.0,
        tools: None,
        tenant: tenant.label,
        echo: None,
        n,
    })
}

/// Whose cache a request uses: its tenant's (with several API keys) and, within it, its
/// `cache_salt`'s; `None` (the shared cache) with neither. Each part is length-prefixed, so no
/// tenant and salt can spell another pair.
pub(super) fn cache_scope(tenant: &Tenant, salt: Option<&str>) -> Option<Vec<u8>> {
    if tenant.key.is_none() && salt.is_none() {
        return None;
    }
    let mut scope = Vec::new();
    for (name, part) in [("tenant", tenant.key.as_deref()), ("salt", salt)] {
        if let Some(part) = part {
            scope.extend(name.as_bytes());
            scope.extend((part.len() as u64).to_le_bytes());
            scope.extend(part.as_bytes());
        }
    }
    Some(scope)
}

/// The grammar a `response_format` asks for (`None` for free text).
fn grammar(format: ResponseFormat) -> Result<Option<Grammar>, ApiError> {
    Ok(match format {
        ResponseFormat::Text => None,
        ResponseFormat::JsonObject => Some(Grammar::JsonObject),
        ResponseFormat::JsonSchema { json_schema } => match json_schema.schema {
            Some(schema) => Some(Grammar::JsonSchema(schema)),
            None => {
                return Err(ApiError::bad_request(
                    "`response_format.json_schema.schema` is required",
                    Some("response_format"),
                ))
            }
        },
    })
}

/// A request refused before it reached the engine.
fn refuse(app: &AppState, kind: Kind, e: ApiError, arrival: Arrival) -> Response {
    app.metrics.ended(
        kind.endpoint(),
        e.label(),
        arrival.0.elapsed().as_secs_f64(),
        0,
    );
    tracing::info!(
        endpoint = kind.endpoint(),
        status = e.status.as_u16(),
        "{}",
        e.message
    );
    e.into_response()
}

/// Admits, tokenizes and submits `job`, then answers.
async fn run(app: Arc<AppState>, job: Job) -> Response {
    let kind = job.kind;
    let arrival = job.arrival;
    let deadline = Deadline::from_std(arrival + app.settings.request_timeout);
    let copies = match submit(&app, &job).await {
        Ok(s) => s,
        Err(e) => return refuse(&app, kind, e, Arrival(arrival)),
    };
    if job.stream {
        stream_answer(app, job, copies, deadline).await
    } else {
        whole_answer(app, job, copies, deadline).await
    }
}

/// Admits, tokenizes and submits the job's `n` copies (seeds `seed`, `seed + 1`, ...): the
/// prompt's K/V is computed once and its blocks shared.
async fn submit(app: &Arc<AppState>, job: &Job) -> Result<Vec<(Ticket, Events)>, ApiError> {
    let tickets = (0..job.n)
        .map(|_| app.admit())
        .collect::<Result<Vec<_>, _>>()?;
    let engine = app.engine.clone();
    let prompt = match &job.prompt {
        PromptInput::Text(t) => PromptInput::Text(t.clone()),
        PromptInput::Tokens(t) => PromptInput::Tokens(t.clone()),
        PromptInput::Chat(m) => PromptInput::Chat(m.clone()),
    };
    let trusted = app.settings.trust_message_special_tokens;
    let request_options = job.options.clone();
    let (arrival, copies) = (job.arrival, job.n);
    // Tokenizing a long prompt takes milliseconds: off the async workers.
    let events = tokio::task::spawn_blocking(move || {
        let tokens = match prompt {
            PromptInput::Text(t) => engine.tokenizer().encode(&t, false).map_err(|e| {
                ApiError::bad_request(format!("cannot tokenize the prompt: {e}"), Some("prompt"))
            })?,
            PromptInput::Tokens(t) => t,
            PromptInput::Chat(p) => chat_prompt_tokens(engine.tokenizer(), &p, true, trusted)?,
        };
        let context = engine.context_len();
        if tokens.len() >= context {
            return Err(ApiError {
                code: Some("context_length_exceeded"),
                ..ApiError::bad_request(
                    format!(
                        "the prompt has {} tokens; this model's context holds {context}",
                        tokens.len()
                    ),
                    Some("messages"),
                )
            });
        }
        let seed = request_options.sampling.seed;
        (0..copies)
            .map(|i| {
                let mut options = request_options.clone();
                options.sampling.seed = seed.wrapping_add(i as u64);
                let request = kvb_engine::Request {
                    tokens: tokens.clone(),
                    options,
                    arrival,
                };
                bridge::submit(engine.as_ref(), request).map_err(ApiError::from)
            })
            .collect::<Result<Vec<_>, _>>()
    })
    .await
    .map_err(|e| ApiError::internal(format!("the submitting task failed: {e}")))??;
    Ok(tickets.into_iter().zip(events).collect())
}

fn finish_reason(r: &GenerationResult) -> &'static str {
    match r.stop_reason {
        Some(StopReason::MaxTokens | StopReason::ContextFull) => "length",
        _ => "stop",
    }
}

/// Usage of a request's copies: the prompt once, every copy's generated tokens.
fn usage_of_copies(results: &[GenerationResult]) -> Usage {
    let mut u = usage(&results[0]);
    u.completion_tokens = results.iter().map(|r| r.token_ids.len()).sum();
    u.total_tokens = u.prompt_tokens + u.completion_tokens;
    u
}

fn usage(r: &GenerationResult) -> Usage {
    Usage {
        prompt_tokens: r.prompt_tokens,
        completion_tokens: r.token_ids.len(),
        total_tokens: r.prompt_tokens + r.token_ids.len(),
        prompt_tokens_details: PromptTokensDetails {
            cached_tokens: r.cached_tokens,
        },
    }
}

/// `x-kvb-*` headers: the request's TTFT, cached tokens and reuse ratio.
fn reuse_headers(s: &Started) -> HeaderMap {
    let mut h = HeaderMap::new();
    let mut put = |name: &'static str, value: String| {
        if let Ok(v) = HeaderValue::from_str(&value) {
            h.insert(HeaderName::from_static(name), v);
        }
    };
    put("x-kvb-ttft-ms", format!("{:.3}", s.ttft_ms));
    put("x-kvb-prompt-tokens", s.prompt_tokens.to_string());
    put("x-kvb-cached-tokens", s.cached_tokens().to_string());
    put("x-kvb-reuse-ratio", format!("{:.4}", s.kv_reuse_ratio()));
    h
}

/// Logs and counts a request that reached the engine.
fn log_end(app: &AppState, job: &Job, status: &str, results: &[GenerationResult]) {
    let seconds = job.arrival.elapsed().as_secs_f64();
    let generated = results.iter().map(|r| r.token_ids.len()).sum();
    app.metrics
        .ended(job.kind.endpoint(), status, seconds, generated);
    match results.first() {
        Some(r) => tracing::info!(
            id = %job.id,
            status,
            prompt_tokens = r.prompt_tokens,
            cached_tokens = r.cached_tokens,
            generated,
            choices = results.len(),
            ttft_ms = format!("{:.1}", r.ttft_ms),
            total_ms = format!("{:.1}", seconds * 1e3),
            queue_ms = format!("{:.1}", r.stages.queue.as_secs_f64() * 1e3),
            prefill_ms = format!("{:.1}", r.stages.live_prefill.as_secs_f64() * 1e3),
            prefill_passes = r.prefill_passes,
            "request done"
        ),
        None => {
            tracing::info!(id = %job.id, status, total_ms = format!("{:.1}", seconds * 1e3), "request ended")
        }
    }
}

/// The next event before `deadline`; `Err` at the deadline (the caller drops the channel, which
/// cancels the sequence).
async fn next_before(events: &mut Events, deadline: Deadline) -> Result<Option<Event>, ()> {
    // `timeout_at` polls the channel before its timer, so an event already queued would be
    // taken past the deadline (a fast model answered a 1 us timeout with 200, now and then).
    if Deadline::now() >= deadline {
        return Err(());
    }
    tokio::time::timeout_at(deadline, events.recv())
        .await
        .map_err(|_| ())
}

/// One copy's events until its end: its `Started` (counted in the metrics when `count`) and
/// result.
async fn collect(
    app: &AppState,
    job: &Job,
    events: &mut Events,
    deadline: Deadline,
    count: bool,
) -> Result<(Option<Started>, GenerationResult), ApiError> {
    let mut started = None;
    loop {
        match next_before(events, deadline).await {
            Err(()) => {
                return Err(ApiError::timeout(
                    app.settings.request_timeout.as_secs_f64(),
                ))
            }
            Ok(Some(Event::Started(s))) => {
                if count {
                    app.metrics.started(
                        s.ttft_ms,
                        (s.prompt_tokens, s.cached_tokens()),
                        job.tenant.as_deref(),
                    );
                }
                started = Some(s);
            }
            Ok(Some(Event::Token { .. })) => {}
            Ok(Some(Event::Finished(r))) => return Ok((started, (*r)?)),
            Ok(None) => return Err(kvb_engine::EngineError::Stopped.into()),
        }
    }
}

/// The answer in one body: a choice per copy, in order. The prompt is counted once (its
/// copies share its blocks; the first copy's `Started` gives the headers and the metrics).
async fn whole_answer(
    app: Arc<AppState>,
    job: Job,
    mut copies: Vec<(Ticket, Events)>,
    deadline: Deadline,
) -> Response {
    let collected = futures_util::future::join_all(
        copies
            .iter_mut()
            .enumerate()
            .map(|(i, (_, events))| collect(&app, &job, events, deadline, i == 0)),
    )
    .await;
    let mut started = None;
    let mut results = Vec::with_capacity(collected.len());
    for c in collected {
        match c {
            Ok((s, r)) => {
                started = started.or(s);
                results.push(r);
            }
            Err(e) => {
                log_end(&app, &job, e.label(), &[]);
                return e.into_response();
            }
        }
    }
    drop(copies);
    log_end(&app, &job, "ok", &results);
    let headers = started.as_ref().map(reuse_headers).unwrap_or_default();
    let usage = usage_of_copies(&results);
    let body = match job.kind {
        Kind::Chat => Json(ChatCompletion {
            id: job.id.clone(),
            object: "chat.completion",
            created: unix_now(),
            model: app.settings.model_name.clone(),
            choices: results
                .iter()
                .enumerate()
                .map(|(i, r)| chat_choice(&app, &job, i, r))
                .collect(),
            usage,
        })
        .into_response(),
        Kind::Text => Json(Completion {
            id: job.id.clone(),
            object: "text_completion",
            created: unix_now(),
            model: app.settings.model_name.clone(),
            choices: results
                .iter()
                .enumerate()
                .map(|(i, r)| CompletionChoice {
                    index: i as u32,
                    text: job.echo.clone().unwrap_or_default() + &r.output_text,
                    logprobs: job
                        .options
                        .logprobs
                        .map(|_| logprobs::completion(app.engine.tokenizer(), &r.logprobs, &mut 0)),
                    finish_reason: Some(finish_reason(r)),
                })
                .collect(),
            usage: Some(usage),
        })
        .into_response(),
    };
    (headers, body).into_response()
}

/// Copy `index`'s chat choice: its text, or the tool calls it wrote.
fn chat_choice(app: &AppState, job: &Job, index: usize, r: &GenerationResult) -> ChatChoice {
    let calls = job.tools.as_ref().and_then(|t| t.parse(&r.output_text));
    ChatChoice {
        index: index as u32,
        message: match &calls {
            Some((before, calls)) => ChatMessageOut {
                role: "assistant",
                content: before.clone(),
                tool_calls: Some(
                    calls
                        .iter()
                        .map(|c| ToolCallOut {
                            id: c.id.clone().unwrap_or_else(|| app.new_id("call")),
                            kind: "function",
                            function: c.clone().into(),
                        })
                        .collect(),
                ),
            },
            None => ChatMessageOut {
                role: "assistant",
                content: Some(r.output_text.clone()),
                tool_calls: None,
            },
        },
        logprobs: job
            .options
            .logprobs
            .map(|_| logprobs::chat(app.engine.tokenizer(), &r.logprobs)),
        finish_reason: if calls.is_some() {
            "tool_calls"
        } else {
            finish_reason(r)
        },
    }
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// One copy's part of a stream.
struct CopyStream {
    /// Its engine events, until its end.
    events: Option<Events>,
    /// Characters of the tokens sent so far (a completion chunk's `text_offset`).
    token_chars: usize,
    /// With tools: what of the text goes out as content, and the calls held back.
    tool_stream: Option<ToolStream>,
    /// Its result, once finished.
    result: Option<GenerationResult>,
}

/// What a stream still has to send: the chunks of its `n` copies, each with its choice's index,
/// as their tokens come.
struct StreamState {
    app: Arc<AppState>,
    job: Job,
    _tickets: Vec<Ticket>,
    copies: Vec<CopyStream>,
    deadline: Deadline,
    created: u64,
    /// Events ready to go out before the next engine event is read.
    pending: std::collections::VecDeque<SseEvent>,
    done: bool,
}

impl StreamState {
    fn json<T: serde::Serialize>(value: &T) -> SseEvent {
        SseEvent::default().data(serde_json::to_string(value).unwrap_or_default())
    }

    /// A chunk of copy `index` carrying `text` (and `role` first, `finish` last), and its
    /// token's log-probabilities when the request asks.
    fn chunk(
        &mut self,
        index: usize,
        text: Option<String>,
        role: bool,
        finish: Option<&'static str>,
        token: Option<&TokenLogprobs>,
    ) -> SseEvent {
        let (id, model) = (self.job.id.clone(), self.app.settings.model_name.clone());
        let tokenizer = self.app.engine.tokenizer();
        let tokens = token.map(std::slice::from_ref);
        match self.job.kind {
            Kind::Chat => Self::json(&ChatCompletionChunk {
                id,
                object: "chat.completion.chunk",
                created: self.created,
                model,
                choices: vec![ChatChunkChoice {
                    index: index as u32,
                    delta: Delta {
                        role: role.then_some("assistant"),
                        content: text,
                        tool_calls: None,
                    },
                    logprobs: tokens.map(|t| logprobs::chat(tokenizer, t)),
                    finish_reason: finish,
                }],
                usage: None,
            }),
            Kind::Text => Self::json(&Completion {
                id,
                object: "text_completion",
                created: self.created,
                model,
                choices: vec![CompletionChoice {
                    index: index as u32,
                    text: text.unwrap_or_default(),
                    logprobs: tokens.map(|t| {
                        logprobs::completion(tokenizer, t, &mut self.copies[index].token_chars)
                    }),
                    finish_reason: finish,
                }],
                usage: None,
            }),
        }
    }

    /// Queues copy `index`'s `pieces`: text (with its token's log-probabilities when the
    /// request asks), and pieces of calls.
    fn send_pieces(
        &mut self,
        index: usize,
        pieces: Vec<StreamPiece>,
        token: Option<&TokenLogprobs>,
    ) {
        for piece in pieces {
            let e = match piece {
                StreamPiece::Text(text) => self.chunk(index, Some(text), false, None, token),
                StreamPiece::CallStart {
                    index: call,
                    name,
                    id,
                } => {
                    let id = id.unwrap_or_else(|| self.app.new_id("call"));
                    self.call_chunk(index, call, Some((name, id)), String::new())
                }
                StreamPiece::Arguments { index: call, text } => {
                    self.call_chunk(index, call, None, text)
                }
            };
            self.pending.push_back(e);
        }
    }

    /// A chat chunk with a piece of copy `index`'s call `call`: its first (with the function's
    /// name and the call's id) or more of its `arguments`.
    fn call_chunk(
        &self,
        index: usize,
        call: usize,
        start: Option<(String, String)>,
        arguments: String,
    ) -> SseEvent {
        let (name, id) = start.unzip();
        let delta = ToolCallDelta {
            index: call as u32,
            id,
            kind: name.as_ref().map(|_| "function"),
            function: FunctionCallDelta { name, arguments },
        };
        Self::json(&ChatCompletionChunk {
            id: self.job.id.clone(),
            object: "chat.completion.chunk",
            created: self.created,
            model: self.app.settings.model_name.clone(),
            choices: vec![ChatChunkChoice {
                index: index as u32,
                delta: Delta {
                    role: None,
                    content: None,
                    tool_calls: Some(vec![delta]),
                },
                logprobs: None,
                finish_reason: None,
            }],
            usage: None,
        })
    }

    fn usage_chunk(&self, results: &[GenerationResult]) -> SseEvent {
        let (id, model) = (self.job.id.clone(), self.app.settings.model_name.clone());
        let usage = Some(usage_of_copies(results));
        match self.job.kind {
            Kind::Chat => Self::json(&ChatCompletionChunk {
                id,
                object: "chat.completion.chunk",
                created: self.created,
                model,
                choices: Vec::new(),
                usage,
            }),
            Kind::Text => Self::json(&Completion {
                id,
                object: "text_completion",
                created: self.created,
                model,
                choices: Vec::new(),
                usage,
            }),
        }
    }

    /// Queues what copy `index`'s `event` sends.
    fn on_event(&mut self, index: usize, event: Option<Event>) {
        match event {
            // The prompt is counted once, by the first copy's start (the copies share it).
            Some(Event::Started(_)) => {}
            Some(Event::Token { text, logprobs, .. }) => {
                let stream = self.copies[index].tool_stream.as_mut();
                let pieces = match (stream, self.job.tools.as_ref()) {
                    (Some(stream), Some(tools)) => stream.push(&text, tools),
                    _ => vec![StreamPiece::Text(text)],
                };
                self.send_pieces(index, pieces, logprobs.as_ref());
            }
            Some(Event::Finished(r)) => match *r {
                Ok(r) => self.finish_copy(index, r),
                Err(e) => self.fail(ApiError::from(e)),
            },
            None => self.fail(ApiError::from(kvb_engine::EngineError::Stopped)),
        }
    }

    /// Queues copy `index`'s last chunks (its held text or calls, its finish reason); after
    /// the last copy, the usage and the end.
    fn finish_copy(&mut self, index: usize, r: GenerationResult) {
        let mut finish = finish_reason(&r);
        let held = self.copies[index].tool_stream.take();
        match held.zip(self.job.tools.as_ref()).map(|(s, t)| s.finish(t)) {
            Some(Finished::Calls(pieces)) => {
                self.send_pieces(index, pieces, None);
                finish = "tool_calls";
            }
            Some(Finished::Text(rest)) if !rest.is_empty() => {
                let e = self.chunk(index, Some(rest), false, None, None);
                self.pending.push_back(e);
            }
            // Text sent whole, or a call cut short by the token limit (its pieces stand).
            _ => {}
        }
        let last = self.chunk(index, None, false, Some(finish), None);
        self.pending.push_back(last);
        let copy = &mut self.copies[index];
        copy.events = None;
        copy.result = Some(r);
        if self.copies.iter().all(|c| c.result.is_some()) {
            let results: Vec<GenerationResult> = self
                .copies
                .iter_mut()
                .filter_map(|c| c.result.take())
                .collect();
            log_end(&self.app, &self.job, "ok", &results);
            if self.job.include_usage {
                let u = self.usage_chunk(&results);
                self.pending.push_back(u);
            }
            self.end();
        }
    }

    fn fail(&mut self, e: ApiError) {
        log_end(&self.app, &self.job, e.label(), &[]);
        self.pending.push_back(Self::json(&e.body()));
        self.end();
    }

    fn end(&mut self) {
        self.pending.push_back(SseEvent::default().data("[DONE]"));
        for c in &mut self.copies {
            c.events = None; // a sequence still running is cancelled
        }
        self.done = true;
    }

    /// The next event of any copy still running, with the copy's index; `Err` at the
    /// deadline.
    async fn next_event(&mut self) -> Result<(usize, Option<Event>), ()> {
        // One copy (most streams): its channel alone, with no futures to gather.
        if let [copy] = self.copies.as_mut_slice() {
            if let Some(events) = copy.events.as_mut() {
                return next_before(events, self.deadline).await.map(|e| (0, e));
            }
        }
        if Deadline::now() >= self.deadline {
            return Err(());
        }
        let (indices, waits): (Vec<usize>, Vec<_>) = self
            .copies
            .iter_mut()
            .enumerate()
            .filter_map(|(i, c)| Some((i, Box::pin(c.events.as_mut()?.recv()))))
            .unzip();
        if waits.is_empty() {
            return Ok((0, None));
        }
        tokio::time::timeout_at(self.deadline, futures_util::future::select_all(waits))
            .await
            .map(|(event, k, _)| (indices[k], event))
            .map_err(|_| ())
    }
}

impl Drop for StreamState {
    /// A stream dropped before its end: the client went away; the sequences are cancelled with
    /// their channels.
    fn drop(&mut self) {
        if !self.done {
            log_end(&self.app, &self.job, "cancelled", &[]);
        }
    }
}

/// Streams the answer of `copies` (one per choice), after the first copy's first token.
async fn stream_answer(
    app: Arc<AppState>,
    job: Job,
    copies: Vec<(Ticket, Events)>,
    deadline: Deadline,
) -> Response {
    let (tickets, mut events): (Vec<Ticket>, Vec<Events>) = copies.into_iter().unzip();
    // Wait for the first token, so the headers carry TTFT and reuse, and an error before it is
    // still a plain error status.
    let started = loop {
        match next_before(&mut events[0], deadline).await {
            Err(()) => {
                log_end(&app, &job, "timeout", &[]);
                return ApiError::timeout(app.settings.request_timeout.as_secs_f64())
                    .into_response();
            }
            Ok(Some(Event::Started(s))) => break s,
            Ok(Some(Event::Finished(r))) => {
                let e = match *r {
                    Err(e) => ApiError::from(e),
                    Ok(_) => ApiError::internal("the request ended before its first token"),
                };
                log_end(&app, &job, e.label(), &[]);
                return e.into_response();
            }
            Ok(Some(Event::Token { .. })) => {}
            Ok(None) => return ApiError::shutting_down().into_response(),
        }
    };
    app.metrics.started(
        started.ttft_ms,
        (started.prompt_tokens, started.cached_tokens()),
        job.tenant.as_deref(),
    );
    let headers = reuse_headers(&started);
    let copies = events
        .into_iter()
        .map(|events| CopyStream {
            events: Some(events),
            token_chars: 0,
            tool_stream: job.tools.as_ref().map(ToolStream::new),
            result: None,
        })
        .collect();
    let mut state = StreamState {
        app,
        job,
        _tickets: tickets,
        copies,
        deadline,
        created: unix_now(),
        pending: Default::default(),
        done: false,
    };
    for index in 0..state.copies.len() {
        if state.job.kind == Kind::Chat {
            let first = state.chunk(index, Some(String::new()), true, None, None);
            state.pending.push_back(first);
        }
        if let Some(prompt) = state.job.echo.clone() {
            let first = state.chunk(index, Some(prompt), false, None, None);
            state.pending.push_back(first);
        }
    }
    (headers, Sse::new(sse_events(state))).into_response()
}

/// The events of a stream: pending ones first, then one per engine event, until `[DONE]`.
fn sse_events(state: StreamState) -> impl Stream<Item = Result<SseEvent, Infallible>> {
    stream::unfold(state, |mut s| async move {
        loop {
            if let Some(e) = s.pending.pop_front() {
                return Some((Ok(e), s));
            }
            if s.done {
                return None;
            }
            match s.next_event().await {
                Ok((index, event)) => s.on_event(index, event),
                Err(()) => {
                    let t = s.app.settings.request_timeout.as_secs_f64();
                    s.fail(ApiError::timeout(t));
                }
            }
        }
    })
}
