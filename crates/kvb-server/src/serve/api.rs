//! The request and response bodies, in OpenAI's shapes (field names, types, `object` values).
//! Each derives its OpenAPI schema, so `/openapi.json` describes exactly what is parsed and sent.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

/// `stop`: one string or a list of them.
#[derive(Deserialize, Debug, Clone, ToSchema)]
#[serde(untagged)]
pub enum Stop {
    /// One stop string.
    One(String),
    /// Several.
    Many(Vec<String>),
}

impl Stop {
    /// The stop strings as a list.
    pub fn into_vec(self) -> Vec<String> {
        match self {
            Stop::One(s) => vec![s],
            Stop::Many(v) => v,
        }
    }
}

/// `stream_options`.
#[derive(Deserialize, Debug, Clone, Default, ToSchema)]
pub struct StreamOptions {
    /// Send a last chunk with the usage before `[DONE]`.
    #[serde(default)]
    pub include_usage: bool,
}

/// `response_format`: free text, any JSON object, or JSON valid against a schema.
#[derive(Deserialize, Debug, Clone, ToSchema)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ResponseFormat {
    /// Free text (the default).
    Text,
    /// A JSON object.
    JsonObject,
    /// JSON valid against `json_schema.schema`.
    JsonSchema {
        /// The schema and its name.
        json_schema: JsonSchemaFormat,
    },
}

/// `response_format.json_schema`.
#[derive(Deserialize, Debug, Clone, ToSchema)]
#[allow(dead_code)] // name, description, strict: parsed so their types are checked; no effect.
pub struct JsonSchemaFormat {
    /// The schema's name (for the caller; it does not change the answer).
    pub name: String,
    /// What the schema is for (likewise).
    pub description: Option<String>,
    /// The JSON Schema the answer must be valid against.
    #[schema(value_type = Object)]
    pub schema: Option<serde_json::Value>,
    /// OpenAI's strict mode. kvb always constrains decoding to the schema, strict or not.
    pub strict: Option<bool>,
}

/// What both endpoints take besides the prompt.
#[derive(Deserialize, Debug, Clone, ToSchema)]
pub struct Sampling {
    /// The served model's name (`GET /v1/models`).
    pub model: String,
    /// Upper bound on generated tokens.
    #[schema(minimum = 1)]
    pub max_tokens: Option<u32>,
    /// The same, under its newer name (takes precedence).
    #[schema(minimum = 1)]
    pub max_completion_tokens: Option<u32>,
    /// 0 (greedy) to 2.
    #[schema(minimum = 0, maximum = 2)]
    pub temperature: Option<f32>,
    /// Nucleus sampling, in (0, 1].
    #[schema(exclusive_minimum = 0, maximum = 1)]
    pub top_p: Option<f32>,
    /// Sample among the `top_k` most likely tokens only (0 or -1: all).
    #[schema(minimum = -1)]
    pub top_k: Option<i64>,
    /// Sample only among tokens at least `min_p` times as likely as the most likely one.
    #[schema(minimum = 0, maximum = 1)]
    pub min_p: Option<f32>,
    /// Lowers a token's logit by this much per time it was generated already.
    #[schema(minimum = -2, maximum = 2)]
    pub frequency_penalty: Option<f32>,
    /// Lowers a token's logit by this much once it was generated at all.
    #[schema(minimum = -2, maximum = 2)]
    pub presence_penalty: Option<f32>,
    /// Divides (positive) or multiplies (negative) the logit of every token of the prompt and
    /// the output so far (transformers' and vLLM's; 1: off).
    #[schema(exclusive_minimum = 0, maximum = 10)]
    pub repetition_penalty: Option<f32>,
    /// Token id (as a string) to a bias added to its logit, -100 to 100.
    pub logit_bias: Option<std::collections::HashMap<String, f32>>,
    /// Sampler seed: same seed, same tokens (absent: a new seed per request).
    pub seed: Option<u64>,
    /// Generation stops before any of these.
    pub stop: Option<Stop>,
    /// Stream the answer as server-sent events.
    #[serde(default)]
    pub stream: bool,
    /// Streaming options.
    pub stream_options: Option<StreamOptions>,
    /// Answers per request, 1 to 16: copies of the prompt sampled with seeds `seed`,
    /// `seed + 1`, ..., which wait for the first copy's prefill and reuse its blocks (streamed,
    /// each chunk names its copy's `index`).
    #[schema(minimum = 1, maximum = 16)]
    pub n: Option<u32>,
    /// Structured output: the answer is JSON (an object, or valid against a schema), by
    /// constrained decoding.
    pub response_format: Option<ResponseFormat>,
    /// Cached K/V is reused only among requests with the same salt (as vLLM's `cache_salt`):
    /// a salted prompt neither hits nor fills the cache of unsalted or other-salted ones.
    pub cache_salt: Option<String>,
}

/// A message's content: text, or a list of parts of which only text parts are taken.
#[derive(Deserialize, Debug, Clone, ToSchema)]
#[serde(untagged)]
pub enum Content {
    /// Plain text.
    Text(String),
    /// `[{"type": "text", "text": "..."}]`.
    Parts(Vec<ContentPart>),
}

/// One part of a message's content.
#[derive(Deserialize, Debug, Clone, ToSchema)]
pub struct ContentPart {
    /// Only `text` is served.
    #[serde(rename = "type")]
    #[schema(pattern = "^text$")]
    pub kind: String,
    /// The text of a `text` part.
    pub text: Option<String>,
}

/// A chat message.
#[derive(Deserialize, Debug, Clone, ToSchema)]
pub struct ChatMessageIn {
    /// `system`, `user`, `assistant`, `tool` (or `developer`, read as `system`).
    #[schema(pattern = "^(system|user|assistant|developer|tool)$")]
    pub role: String,
    /// Its content (may be null for an assistant message with `tool_calls`).
    #[serde(default)]
    pub content: Option<Content>,
    /// An assistant message's calls of the request's tools.
    pub tool_calls: Option<Vec<ToolCallIn>>,
    /// A `tool` message: the call it answers (checked as text; the generic format matches
    /// results to calls by order).
    #[allow(dead_code)]
    pub tool_call_id: Option<String>,
    /// Who speaks: given to the chat template as `message.name` (most templates do not write
    /// it); a special token's text in it is a 400.
    pub name: Option<String>,
}

/// A function call in an assistant message of the history.
#[derive(Deserialize, Debug, Clone, ToSchema)]
#[allow(dead_code)] // id, type: parsed so their types are checked; the format writes neither.
pub struct ToolCallIn {
    /// The call's id.
    pub id: Option<String>,
    /// `function`.
    #[serde(rename = "type")]
    #[schema(pattern = "^function$")]
    pub kind: Option<String>,
    /// The function and its arguments.
    pub function: FunctionCall,
}

/// A function's name and its arguments, as a JSON text (OpenAI's shape).
#[derive(Serialize, Deserialize, Debug, Clone, ToSchema)]
pub struct FunctionCall {
    /// The function's name.
    pub name: String,
    /// Its arguments: a JSON object, as text.
    pub arguments: String,
}

/// A tool the model may call.
#[derive(Deserialize, Debug, Clone, ToSchema)]
pub struct ToolDef {
    /// Only `function`.
    #[serde(rename = "type")]
    #[schema(pattern = "^function$")]
    pub kind: String,
    /// The function.
    pub function: FunctionDef,
}

/// A function the model may call.
#[derive(Deserialize, Serialize, Debug, Clone, ToSchema)]
pub struct FunctionDef {
    /// Its name: letters, digits, `_` and `-`, at most 64.
    pub name: String,
    /// What it does, for the model.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// The JSON Schema of its arguments (an object; absent: no arguments).
    #[schema(value_type = Object)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub parameters: Option<serde_json::Value>,
    /// OpenAI's strict mode; kvb always constrains forced calls' arguments to the schema.
    #[serde(skip_serializing)]
    #[allow(dead_code)]
    pub strict: Option<bool>,
}

/// `tool_choice`: `none`, `auto`, `required`, or one function by name.
#[derive(Deserialize, Debug, Clone, ToSchema)]
#[serde(untagged)]
pub enum ToolChoice {
    /// `none`, `auto` or `required`.
    Mode(String),
    /// `{"type": "function", "function": {"name": ...}}`.
    Named {
        /// `function`.
        #[serde(rename = "type")]
        kind: String,
        /// The function to call.
        function: NamedFunction,
    },
}

/// The function of a named `tool_choice`.
#[derive(Deserialize, Debug, Clone, ToSchema)]
pub struct NamedFunction {
    /// Its name.
    pub name: String,
}

/// A call the answer makes.
#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct ToolCallOut {
    /// `call_...`, unique within the server's run.
    pub id: String,
    /// `function`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The function and its arguments.
    pub function: FunctionCall,
}

/// A piece of a call in a streamed chunk (OpenAI's shape): the first piece of a call has its
/// `id`, `type` and function name; the pieces after it add to its arguments' text.
#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct ToolCallDelta {
    /// Which call of the answer, from 0.
    pub index: u32,
    /// `call_...`, in a call's first piece.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// `function`, in a call's first piece.
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<&'static str>,
    /// The function's name (first piece) and more of its arguments.
    pub function: FunctionCallDelta,
}

/// What a streamed piece of a call adds.
#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct FunctionCallDelta {
    /// The function's name, in a call's first piece.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The next piece of the arguments' JSON text (the pieces joined are the whole text).
    pub arguments: String,
}

/// `POST /v1/chat/completions`.
#[derive(Deserialize, Debug, Clone, ToSchema)]
pub struct ChatCompletionRequest {
    /// The conversation, rendered with the model's chat template.
    #[schema(min_items = 1)]
    pub messages: Vec<ChatMessageIn>,
    /// Return each generated token's log-probability (in `choices[].logprobs.content`).
    #[serde(default)]
    pub logprobs: bool,
    /// With `logprobs`, how many of the most likely tokens to list at each position.
    #[schema(minimum = 0, maximum = 20)]
    pub top_logprobs: Option<u32>,
    /// Functions the model may call.
    pub tools: Option<Vec<ToolDef>>,
    /// Whether and which tool it calls (default `auto` with tools).
    pub tool_choice: Option<ToolChoice>,
    /// Whether an answer may make several calls (default true).
    pub parallel_tool_calls: Option<bool>,
    /// Model, sampling and streaming settings.
    #[serde(flatten)]
    pub sampling: Sampling,
}

/// `prompt` of a completion: a string, a list of one string, or token ids.
#[derive(Deserialize, Debug, Clone, ToSchema)]
#[serde(untagged)]
pub enum Prompt {
    /// Text.
    Text(String),
    /// Token ids.
    Tokens(Vec<u32>),
    /// Texts (only one is served).
    Texts(Vec<String>),
}

/// `POST /v1/completions`.
#[derive(Deserialize, Debug, Clone, ToSchema)]
pub struct CompletionRequest {
    /// Raw prompt, used as given.
    pub prompt: Prompt,
    /// Return each generated token's log-probability and this many of the most likely tokens at
    /// its position (in `choices[].logprobs`).
    #[schema(minimum = 0, maximum = 20)]
    pub logprobs: Option<u32>,
    /// Return the prompt's text before the completion in `choices[].text` (streamed: as the
    /// first chunk). Not with `logprobs`: the prompt's log-probabilities are not computed.
    pub echo: Option<bool>,
    /// Model, sampling and streaming settings.
    #[serde(flatten)]
    pub sampling: Sampling,
}

/// How many of the prompt's tokens the cache served.
#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct PromptTokensDetails {
    /// Prompt tokens whose K/V was reused.
    pub cached_tokens: usize,
}

/// Token counts of a request.
#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: usize,
    /// Generated tokens.
    pub completion_tokens: usize,
    /// Their sum.
    pub total_tokens: usize,
    /// Of the prompt, what the cache served.
    pub prompt_tokens_details: PromptTokensDetails,
}

/// The assistant's message.
#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct ChatMessageOut {
    /// Always `assistant`.
    pub role: &'static str,
    /// The generated text (null when the answer is only tool calls).
    pub content: Option<String>,
    /// The answer's calls of the request's tools.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallOut>>,
}

/// One answer of a chat completion.
#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct ChatChoice {
    /// Which of the request's `n` copies this is, from 0.
    pub index: u32,
    /// The answer.
    pub message: ChatMessageOut,
    /// The tokens' log-probabilities when the request asks (`logprobs`), else null.
    pub logprobs: Option<ChatLogprobs>,
    /// `stop` (end of sequence or a stop string), `length` (token limit or context full) or
    /// `tool_calls`.
    pub finish_reason: &'static str,
}

/// A chat completion.
#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct ChatCompletion {
    /// `chatcmpl-...`.
    pub id: String,
    /// `chat.completion`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The served model's name.
    pub model: String,
    /// The answer.
    pub choices: Vec<ChatChoice>,
    /// Token counts.
    pub usage: Usage,
}

/// What a streamed chunk adds to the message.
#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct Delta {
    /// `assistant`, in the first chunk only.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub role: Option<&'static str>,
    /// New text.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// Pieces of tool calls, as they are generated.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<ToolCallDelta>>,
}

/// One choice of a streamed chat chunk.
#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct ChatChunkChoice {
    /// Which of the request's `n` copies this chunk belongs to, from 0.
    pub index: u32,
    /// What this chunk adds.
    pub delta: Delta,
    /// This chunk's token's log-probability when the request asks (`logprobs`), else null.
    pub logprobs: Option<ChatLogprobs>,
    /// Set in the last chunk of the answer.
    pub finish_reason: Option<&'static str>,
}

/// A server-sent event of a streamed chat completion.
#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct ChatCompletionChunk {
    /// The same for every chunk of a request.
    pub id: String,
    /// `chat.completion.chunk`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The served model's name.
    pub model: String,
    /// One choice; empty in the usage chunk.
    pub choices: Vec<ChatChunkChoice>,
    /// Only in the usage chunk (`stream_options.include_usage`), else null.
    pub usage: Option<Usage>,
}

/// One answer of a completion (also a streamed chunk's choice).
#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct CompletionChoice {
    /// Which of the request's `n` copies this is (or a streamed chunk belongs to), from 0.
    pub index: u32,
    /// The generated text (a streamed chunk: the new text).
    pub text: String,
    /// The tokens' log-probabilities when the request asks (`logprobs`), else null.
    pub logprobs: Option<CompletionLogprobs>,
    /// `stop` or `length`; null in a streamed chunk before the last.
    pub finish_reason: Option<&'static str>,
}

/// A completion, or one streamed chunk of it.
#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct Completion {
    /// `cmpl-...`.
    pub id: String,
    /// `text_completion`.
    pub object: &'static str,
    /// Unix seconds.
    pub created: u64,
    /// The served model's name.
    pub model: String,
    /// The answer; empty in the usage chunk.
    pub choices: Vec<CompletionChoice>,
    /// Token counts (a streamed chunk: only in the usage chunk).
    pub usage: Option<Usage>,
}

/// One served model.
#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct ModelCard {
    /// The name requests use.
    pub id: String,
    /// `model`.
    pub object: &'static str,
    /// Unix seconds when the server started.
    pub created: u64,
    /// `kvb`.
    pub owned_by: &'static str,
    /// Tokens of context.
    pub max_model_len: usize,
}

/// `GET /v1/models`.
#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct ModelList {
    /// `list`.
    pub object: &'static str,
    /// The served model.
    pub data: Vec<ModelCard>,
}

/// `POST /v1/warm`: text (or messages, rendered with the chat template) to compute and keep.
#[derive(Deserialize, Debug, Clone, ToSchema)]
pub struct WarmRequest {
    /// Raw text.
    pub text: Option<String>,
    /// Or chat messages (the template's generation prompt is not added).
    pub messages: Option<Vec<ChatMessageIn>>,
    /// Cached for requests with this salt only (and, with several API keys, for the caller's
    /// key), as a completion's `cache_salt` is.
    pub cache_salt: Option<String>,
}

/// What `POST /v1/warm` did.
#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct WarmResponse {
    /// `warm`.
    pub object: &'static str,
    /// Tokens of the text.
    pub tokens: usize,
    /// Chunks newly stored in the chunk store.
    pub chunks_stored: usize,
    /// Their bytes.
    pub bytes: usize,
}

/// `GET /health`.
#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct Health {
    /// `ok`.
    pub status: &'static str,
}

/// The body of every error, as OpenAI sends it.
#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct ErrorBody {
    /// What went wrong.
    pub error: ErrorDetail,
}

/// The error itself.
#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct ErrorDetail {
    /// A sentence for people.
    pub message: String,
    /// `invalid_request_error`, `authentication_error`, `not_found_error`, `server_error`.
    #[serde(rename = "type")]
    pub kind: &'static str,
    /// The request field at fault, if one is.
    pub param: Option<String>,
    /// A code for programs (`context_length_exceeded`, `model_not_found`, ...).
    pub code: Option<&'static str>,
}

/// A token and its log-probability, among the most likely at a position.
#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct TopLogprob {
    /// The token's text.
    pub token: String,
    /// Its natural log-probability under the model's distribution (before temperature and
    /// top-p).
    pub logprob: f32,
    /// The UTF-8 bytes of `token`.
    pub bytes: Vec<u8>,
}

/// A generated token's log-probability, in a chat answer.
#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct ChatTokenLogprob {
    /// The token's text.
    pub token: String,
    /// Its natural log-probability under the model's distribution (before temperature and
    /// top-p).
    pub logprob: f32,
    /// The UTF-8 bytes of `token`.
    pub bytes: Vec<u8>,
    /// The most likely tokens at this position, most likely first (`top_logprobs` of them).
    pub top_logprobs: Vec<TopLogprob>,
}

/// A chat answer's (or chunk's) log-probabilities.
#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct ChatLogprobs {
    /// One entry per generated token.
    pub content: Vec<ChatTokenLogprob>,
}

/// A completion's (or chunk's) log-probabilities, in the legacy completions shape.
#[derive(Serialize, Debug, Clone, ToSchema)]
pub struct CompletionLogprobs {
    /// Each generated token's text.
    pub tokens: Vec<String>,
    /// Each one's natural log-probability (before temperature and top-p).
    pub token_logprobs: Vec<f32>,
    /// At each position, the most likely tokens' texts and log-probabilities.
    pub top_logprobs: Vec<std::collections::BTreeMap<String, f32>>,
    /// Where each token's text starts in the generated text, in characters.
    pub text_offset: Vec<usize>,
}

/// One server-sent event of a streamed answer, as a client's SSE parser sees it: `data` holds a
/// chunk (`ChatCompletionChunk` or `Completion`) as JSON text, and `[DONE]` at the end. It only
/// describes the stream in the OpenAPI document; the events are written by the SSE layer.
#[derive(ToSchema)]
#[allow(dead_code)]
pub struct StreamEvent {
    /// The chunk as JSON text, or `[DONE]`.
    pub data: String,
}
