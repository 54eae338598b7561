//! Errors as OpenAI sends them: a status and `{"error": {"message", "type", "param", "code"}}`.

use super::api::{ErrorBody, ErrorDetail};
use axum::http::{header, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use kvb_engine::EngineError;

/// An error answer.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    pub code: Option<&'static str>,
    /// Seconds for `Retry-After` (503 only).
    pub retry_after: Option<u64>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after: None,
        }
    }

    /// 400 for a bad field (`param`) or a bad body (`None`).
    pub fn bad_request(message: impl Into<String>, param: Option<&str>) -> Self {
        ApiError {
            param: param.map(str::to_string),
            ..Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
        }
    }

    /// 404 for a model this server does not serve.
    pub fn unknown_model(asked: &str, served: &str) -> Self {
        ApiError {
            param: Some("model".into()),
            code: Some("model_not_found"),
            ..Self::new(
                StatusCode::NOT_FOUND,
                "not_found_error",
                format!("the model `{asked}` does not exist; this server serves `{served}`"),
            )
        }
    }

    /// 404 for a path no route serves.
    pub fn no_route(path: &str) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "not_found_error",
            format!("no route for {path}"),
        )
    }

    /// 405 for a known path with the wrong method.
    pub fn wrong_method(method: &str, path: &str) -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            format!("{path} does not take {method}"),
        )
    }

    /// 401: no key or a wrong one.
    pub fn unauthorized() -> Self {
        ApiError {
            code: Some("invalid_api_key"),
            ..Self::new(
                StatusCode::UNAUTHORIZED,
                "authentication_error",
                "a valid API key is required (Authorization: Bearer KEY)",
            )
        }
    }

    /// 413: the body is over the limit.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body is over {limit} bytes (--max-body-bytes)"),
        )
    }

    /// 503: the queue is full; try again in `retry_after` seconds.
    pub fn overloaded(retry_after: u64) -> Self {
        ApiError {
            code: Some("server_overloaded"),
            retry_after: Some(retry_after),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "the server's queue is full; retry later",
            )
        }
    }

    /// 503: the server is shutting down.
    pub fn shutting_down() -> Self {
        ApiError {
            code: Some("shutting_down"),
            ..Self::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_error",
                "the server is shutting down",
            )
        }
    }

    /// 504: the request waited or ran past `--request-timeout`; it was cancelled.
    pub fn timeout(seconds: f64) -> Self {
        ApiError {
            code: Some("timeout"),
            ..Self::new(
                StatusCode::GATEWAY_TIMEOUT,
                "server_error",
                format!("the request took longer than {seconds} s (--request-timeout) and was cancelled"),
            )
        }
    }

    /// 500 for what should not happen.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// The body, for an error sent inside a stream.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                message: self.message.clone(),
                kind: self.kind,
                param: self.param.clone(),
                code: self.code,
            },
        }
    }

    /// The status label of the requests counter.
    pub fn label(&self) -> &'static str {
        match self.status.as_u16() {
            503 => "rejected",
            504 => "timeout",
            s if s < 500 => "client_error",
            _ => "server_error",
        }
    }
}

impl From<EngineError> for ApiError {
    fn from(e: EngineError) -> Self {
        let message = e.to_string();
        match e {
            EngineError::PromptTooLong { .. } => ApiError {
                code: Some("context_length_exceeded"),
                ..Self::bad_request(message, Some("messages"))
            },
            EngineError::EmptyPrompt => Self::bad_request(message, None),
            EngineError::PoolTooSmall { .. } => ApiError {
                code: Some("context_length_exceeded"),
                ..Self::bad_request(message, Some("max_tokens"))
            },
            // The only request-level config error: a token id outside the vocabulary.
            EngineError::Config(_) => Self::bad_request(message, Some("prompt")),
            EngineError::Grammar(_) => Self::bad_request(message, Some("response_format")),
            EngineError::Stopped => Self::shutting_down(),
            _ => Self::internal(message),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (self.status, Json(self.body())).into_response();
        if let Some(s) = self.retry_after {
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(s));
        }
        r
    }
}
