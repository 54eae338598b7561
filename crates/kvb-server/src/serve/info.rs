//! The routes around generation: models, health, warming, stats, metrics, the OpenAPI document.

use super::api::{ErrorBody, Health, ModelCard, ModelList, WarmRequest, WarmResponse};
use super::app::{AppState, Tenant};
use super::body::ApiJson;
use super::chat_prompt::chat_prompt_tokens;
use super::completions::{cache_scope, chat_messages};
use super::error::ApiError;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::{Extension, Json};
use kvb_engine::{PoolStats, StoreStats};
use serde::Serialize;
use std::sync::Arc;
use utoipa::ToSchema;

#[utoipa::path(get, path = "/v1/models", responses((status = 200, body = ModelList), (status = 401, body = ErrorBody)))]
pub async fn models(State(app): State<Arc<AppState>>) -> Json<ModelList> {
    Json(ModelList {
        object: "list",
        data: vec![ModelCard {
            id: app.settings.model_name.clone(),
            object: "model",
            created: app.started,
            owned_by: "kvb",
            max_model_len: app.engine.context_len(),
        }],
    })
}

#[utoipa::path(get, path = "/health", responses((status = 200, body = Health)))]
pub async fn health() -> Json<Health> {
    Json(Health { status: "ok" })
}

#[utoipa::path(
    post,
    path = "/v1/warm",
    request_body = WarmRequest,
    responses((status = 200, body = WarmResponse), (status = 400, body = ErrorBody),
              (status = 401, body = ErrorBody), (status = 503, body = ErrorBody))
)]
/// Computes text (or messages) and keeps its K/V, so later prompts holding it reuse it.
pub async fn warm(
    State(app): State<Arc<AppState>>,
    tenant: Option<Extension<Tenant>>,
    ApiJson(req): ApiJson<WarmRequest>,
) -> Result<Json<WarmResponse>, ApiError> {
    // Cached for the caller's tenant and salt, as its requests would be.
    let tenant = tenant.map(|Extension(t)| t).unwrap_or_default();
    let scope = cache_scope(&tenant, req.cache_salt.as_deref());
    enum Warm {
        Text(String),
        Chat(super::tools::ChatPrompt),
    }
    let what = match (req.text, req.messages) {
        (Some(t), None) => Warm::Text(t),
        (None, Some(m)) => Warm::Chat(super::tools::ChatPrompt::new(
            chat_messages(&m, app.tool_format)?,
            None,
        )),
        _ => {
            return Err(ApiError::bad_request(
                "give `text` or `messages`, one of the two",
                None,
            ))
        }
    };
    let _ticket = app.admit()?;
    let engine = app.engine.clone();
    let trusted = app.settings.trust_message_special_tokens;
    let r = tokio::time::timeout(
        app.settings.request_timeout,
        tokio::task::spawn_blocking(move || match what {
            Warm::Text(text) => {
                let tokens = engine.tokenizer().encode(&text, false).map_err(|e| {
                    ApiError::bad_request(format!("cannot tokenize `text`: {e}"), Some("text"))
                })?;
                engine.warm_tokens(&tokens, scope).map_err(ApiError::from)
            }
            // Tokenized as a chat request's messages, so that one holding them hits.
            Warm::Chat(m) => {
                let tokens = chat_prompt_tokens(engine.tokenizer(), &m, false, trusted)?;
                engine.warm_tokens(&tokens, scope).map_err(ApiError::from)
            }
        }),
    )
    .await
    .map_err(|_| ApiError::timeout(app.settings.request_timeout.as_secs_f64()))?
    .map_err(|e| ApiError::internal(format!("the warm task failed: {e}")))??;
    Ok(Json(WarmResponse {
        object: "warm",
        tokens: r.tokens,
        chunks_stored: r.chunks_stored,
        bytes: r.bytes,
    }))
}

/// `GET /v1/stats`: the K/V pool and the chunk store.
#[derive(Serialize, ToSchema)]
pub struct Stats {
    /// The K/V pool.
    pub pool: PoolView,
    /// The chunk store (second tier).
    pub store: StoreStats,
}

/// The pool's counters, with their sizes in bytes.
#[derive(Serialize, ToSchema)]
pub struct PoolView {
    #[serde(flatten)]
    pub counters: PoolStats,
    /// Bytes of K/V the pool holds now.
    pub bytes_used: usize,
    /// The pool's budget in bytes.
    pub bytes_total: usize,
}

#[utoipa::path(get, path = "/v1/stats", responses((status = 200, body = Stats), (status = 401, body = ErrorBody)))]
pub async fn stats(State(app): State<Arc<AppState>>) -> Json<Stats> {
    let counters = app.engine.paged_stats();
    Json(Stats {
        pool: PoolView {
            bytes_used: counters.bytes_used(),
            bytes_total: counters.bytes_total(),
            counters,
        },
        store: app.engine.cache_stats(),
    })
}

#[utoipa::path(get, path = "/metrics", responses((status = 200, description = "Prometheus text format", content_type = "text/plain")))]
pub async fn metrics(State(app): State<Arc<AppState>>) -> impl IntoResponse {
    let text = app.metrics.render(&app.snapshot());
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
}

#[utoipa::path(get, path = "/openapi.json", responses((status = 200, description = "This document (OpenAPI 3)", content_type = "application/json")))]
pub async fn openapi(Extension(doc): Extension<Arc<serde_json::Value>>) -> impl IntoResponse {
    Json(doc.as_ref().clone())
}
