//! Reading JSON bodies: malformed JSON, a wrong type or a missing field become a 400 that names
//! the field, a body over the limit a 413; never axum's plain-text rejections.

use super::api::{ChatCompletionRequest, CompletionRequest, WarmRequest};
use super::error::ApiError;
use super::fields;
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::StatusCode;
use serde::de::DeserializeOwned;
use serde_json::Value;

/// A body of type `T`, read as [`JsonBody`] says.
pub struct ApiJson<T>(pub T);

/// A request body built from parsed JSON.
pub trait JsonBody: Sized {
    /// Reads `v`, naming the field at fault in the error.
    fn from_json(v: &Value) -> Result<Self, ApiError>;
}

impl<S: Send + Sync, T: JsonBody> FromRequest<S> for ApiJson<T> {
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, ApiError> {
        let limit = req.extensions().get::<BodyLimit>().map(|l| l.0);
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
                ApiError::too_large(limit.unwrap_or(0))
            } else {
                ApiError::bad_request(format!("cannot read the body: {}", e.body_text()), None)
            }
        })?;
        parse::<T>(&bytes).map(ApiJson)
    }
}

/// `bytes` read as the body of type `T`: JSON, an object, then the type's fields.
pub fn parse<T: JsonBody>(bytes: &[u8]) -> Result<T, ApiError> {
    let v: Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}"), None))?;
    if !v.is_object() {
        return Err(ApiError::bad_request(
            "the body must be a JSON object",
            None,
        ));
    }
    T::from_json(&v)
}

/// The body limit in force, put in each request's extensions so a 413 can state it.
#[derive(Clone, Copy)]
pub struct BodyLimit(pub usize);

/// `v` read as a `T`; an error names the path of the field at fault.
pub fn whole<T: DeserializeOwned>(v: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        // A missing field is reported at its parent; name the field itself.
        let missing = inner
            .strip_prefix("missing field `")
            .and_then(|r| r.split('`').next())
            .map(|f| {
                if path == "." {
                    f.to_string()
                } else {
                    format!("{path}.{f}")
                }
            });
        let param = missing.unwrap_or(path);
        ApiError::bad_request(format!("`{param}`: {inner}"), Some(&param))
    })
}

/// The required field `name` of `v`, read as a `T`.
pub fn field<T: DeserializeOwned>(v: &Value, name: &str) -> Result<T, ApiError> {
    let f = v
        .get(name)
        .ok_or_else(|| ApiError::bad_request(format!("`{name}` is required"), Some(name)))?;
    whole(f).map_err(|e| {
        let param = match e.param.as_deref() {
            None | Some(".") => name.to_string(),
            Some(p) if p.starts_with('[') => format!("{name}{p}"),
            Some(p) => format!("{name}.{p}"),
        };
        ApiError::bad_request(
            format!(
                "`{param}`: {}",
                e.message.split_once(": ").map_or(&*e.message, |x| x.1)
            ),
            Some(&param),
        )
    })
}

/// The optional field `name` of `v` (absent or null: `None`), read as a `T`.
pub fn optional_field<T: DeserializeOwned>(v: &Value, name: &str) -> Result<Option<T>, ApiError> {
    match v.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(_) => field(v, name).map(Some),
    }
}

impl JsonBody for ChatCompletionRequest {
    fn from_json(v: &Value) -> Result<Self, ApiError> {
        fields::check(v, fields::CHAT)?;
        Ok(ChatCompletionRequest {
            messages: field(v, "messages")?,
            logprobs: optional_field(v, "logprobs")?.unwrap_or(false),
            top_logprobs: optional_field(v, "top_logprobs")?,
            tools: optional_field(v, "tools")?,
            tool_choice: optional_field(v, "tool_choice")?,
            parallel_tool_calls: optional_field(v, "parallel_tool_calls")?,
            sampling: whole(v)?,
        })
    }
}

impl JsonBody for CompletionRequest {
    fn from_json(v: &Value) -> Result<Self, ApiError> {
        fields::check(v, fields::COMPLETION)?;
        Ok(CompletionRequest {
            prompt: field(v, "prompt")?,
            logprobs: optional_field(v, "logprobs")?,
            echo: optional_field(v, "echo")?,
            sampling: whole(v)?,
        })
    }
}

impl JsonBody for WarmRequest {
    fn from_json(v: &Value) -> Result<Self, ApiError> {
        whole(v)
    }
}
