//! `POST /tokenize` and `POST /detokenize` (vLLM's shapes): the token ids kvb reads a prompt or a
//! conversation as, and the text of token ids, so a client can count and budget its context.

use super::api::{ChatMessageIn, ErrorBody, ToolDef};
use super::app::AppState;
use super::body::{whole, ApiJson, JsonBody};
use super::chat_prompt::chat_prompt_tokens;
use super::completions::chat_messages;
use super::error::ApiError;
use super::tools::{ChatPrompt, Tools};
use axum::extract::State;
use axum::Json;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::sync::Arc;
use utoipa::ToSchema;

/// `POST /tokenize`: a prompt, or chat messages, to token ids.
#[derive(Deserialize, Debug, Clone, ToSchema)]
pub struct TokenizeRequest {
    /// The served model's name (optional).
    pub model: Option<String>,
    /// Raw text, read as `/v1/completions` reads its prompt.
    pub prompt: Option<String>,
    /// Or messages, read as `/v1/chat/completions` reads them.
    pub messages: Option<Vec<ChatMessageIn>>,
    /// With `messages`: the tools a chat request would offer (rendered as it renders them).
    pub tools: Option<Vec<ToolDef>>,
    /// With `messages`: add the template's generation prompt (default true, as a chat request).
    pub add_generation_prompt: Option<bool>,
    /// With `prompt`: add what the tokenizer adds around a text (a BOS); default false, as
    /// `/v1/completions` does.
    pub add_special_tokens: Option<bool>,
}

/// The token ids of a prompt.
#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct TokenizeResponse {
    /// How many.
    pub count: usize,
    /// The model's context in tokens.
    pub max_model_len: usize,
    /// The ids.
    pub tokens: Vec<u32>,
}

/// `POST /detokenize`: token ids to text.
#[derive(Deserialize, Debug, Clone, ToSchema)]
pub struct DetokenizeRequest {
    /// The served model's name (optional).
    pub model: Option<String>,
    /// Token ids.
    pub tokens: Vec<u32>,
}

/// The text of token ids.
#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct DetokenizeResponse {
    /// The text, control tokens included.
    pub prompt: String,
}

impl JsonBody for TokenizeRequest {
    fn from_json(v: &Value) -> Result<Self, ApiError> {
        whole(v)
    }
}

impl JsonBody for DetokenizeRequest {
    fn from_json(v: &Value) -> Result<Self, ApiError> {
        whole(v)
    }
}

fn check_model(app: &AppState, model: Option<&str>) -> Result<(), ApiError> {
    match model {
        Some(m) if m != app.settings.model_name => {
            Err(ApiError::unknown_model(m, &app.settings.model_name))
        }
        _ => Ok(()),
    }
}

#[utoipa::path(
    post,
    path = "/tokenize",
    request_body = TokenizeRequest,
    responses((status = 200, body = TokenizeResponse), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 404, body = ErrorBody))
)]
pub async fn tokenize(
    State(app): State<Arc<AppState>>,
    ApiJson(req): ApiJson<TokenizeRequest>,
) -> Result<Json<TokenizeResponse>, ApiError> {
    check_model(&app, req.model.as_deref())?;
    if req.tools.is_some() && req.messages.is_none() {
        return Err(ApiError::bad_request(
            "`tools` go with `messages`",
            Some("tools"),
        ));
    }
    let tokenizer = app.engine.tokenizer();
    let tokens = match (&req.prompt, &req.messages) {
        (Some(text), None) => tokenizer
            .encode(text, req.add_special_tokens.unwrap_or(false))
            .map_err(|e| ApiError::bad_request(format!("cannot tokenize: {e}"), Some("prompt")))?,
        (None, Some(m)) => chat_prompt_tokens(
            tokenizer,
            &chat_prompt(&app, m, req.tools.as_deref())?,
            req.add_generation_prompt.unwrap_or(true),
            app.settings.trust_message_special_tokens,
        )?,
        _ => {
            return Err(ApiError::bad_request(
                "give `prompt` or `messages`, one of the two",
                None,
            ))
        }
    };
    Ok(Json(TokenizeResponse {
        count: tokens.len(),
        max_model_len: app.engine.context_len(),
        tokens,
    }))
}

/// The prompt a chat request with `messages` and `tools` (choice `auto`) would render.
fn chat_prompt(
    app: &AppState,
    messages: &[ChatMessageIn],
    tools: Option<&[ToolDef]>,
) -> Result<ChatPrompt, ApiError> {
    let messages = chat_messages(messages, app.tool_format)?;
    let tools = Tools::new(tools, None, true, app.tool_format)?;
    Ok(ChatPrompt::new(messages, tools.as_ref()))
}

#[utoipa::path(
    post,
    path = "/detokenize",
    request_body = DetokenizeRequest,
    responses((status = 200, body = DetokenizeResponse), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 404, body = ErrorBody))
)]
pub async fn detokenize(
    State(app): State<Arc<AppState>>,
    ApiJson(req): ApiJson<DetokenizeRequest>,
) -> Result<Json<DetokenizeResponse>, ApiError> {
    check_model(&app, req.model.as_deref())?;
    let tokenizer = app.engine.tokenizer();
    let vocab = tokenizer.vocab_size();
    if let Some(i) = req.tokens.iter().position(|&t| t as usize >= vocab) {
        return Err(ApiError::bad_request(
            format!(
                "token {} is not below the vocabulary's {vocab}",
                req.tokens[i]
            ),
            Some(&format!("tokens[{i}]")),
        ));
    }
    let prompt = tokenizer
        .decode(&req.tokens, false)
        .map_err(|e| ApiError::bad_request(format!("cannot decode: {e}"), Some("tokens")))?;
    Ok(Json(DetokenizeResponse { prompt }))
}
