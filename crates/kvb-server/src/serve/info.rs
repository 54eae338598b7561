//! The routes around generation: models, health, warming, stats, metrics, the OpenAPI document.

use super::api::{
    ChatMessageIn, ErrorBody, Health, ModelCard, ModelList, WarmRequest, WarmResponse,
};
use super::app::AppState;
use super::body::ApiJson;
use super::error::ApiError;
use axum::extract::State;
use axum::http::header;
use axum::response::IntoResponse;
use axum::{Extension, Json};
use kvb_model::ChatMessage;
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
    ApiJson(req): ApiJson<WarmRequest>,
) -> Result<Json<WarmResponse>, ApiError> {
    let text = match (req.text, req.messages) {
        (Some(t), None) => t,
        (None, Some(m)) => {
            let messages: Vec<ChatMessage> = m
                .iter()
                .map(|m: &ChatMessageIn| match &m.content {
                    super::api::Content::Text(t) => Ok(ChatMessage::new(m.role.clone(), t.clone())),
                    super::api::Content::Parts(_) => Err(ApiError::bad_request(
                        "warm takes text content only",
                        Some("messages"),
                    )),
                })
                .collect::<Result<_, _>>()?;
            app.engine
                .tokenizer()
                .apply_chat_template(&messages, false)
                .map_err(|e| {
                    ApiError::bad_request(
                        format!("the chat template failed: {e}"),
                        Some("messages"),
                    )
                })?
        }
        _ => {
            return Err(ApiError::bad_request(
                "give `text` or `messages`, one of the two",
                None,
            ))
        }
    };
    let _ticket = app.admit()?;
    let engine = app.engine.clone();
    let r = tokio::time::timeout(
        app.settings.request_timeout,
        tokio::task::spawn_blocking(move || engine.warm(&text)),
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
    pub store: StoreView,
}

/// The pool's counters (see kvb-engine's `PoolStats`).
#[derive(Serialize, ToSchema)]
pub struct PoolView {
    pub block_size: usize,
    pub block_bytes: usize,
    pub blocks_total: usize,
    pub blocks_used: usize,
    pub blocks_shared: usize,
    pub blocks_resident: usize,
    pub blocks_approximate: usize,
    pub peak_blocks_used: usize,
    pub bytes_used: usize,
    pub bytes_total: usize,
    pub bytes_saved_by_sharing: usize,
    pub resident_sequences: usize,
    pub running: usize,
    pub waiting: usize,
    pub evictions: u64,
    pub preemptions: u64,
    pub requests: u64,
}

/// The chunk store's counters (see kvb-store's `StoreStats`).
#[derive(Serialize, ToSchema)]
pub struct StoreView {
    pub hits: u64,
    pub approximate_hits: u64,
    pub misses: u64,
    pub hit_rate: f64,
    pub evictions: u64,
    pub ram_chunks: usize,
    pub ram_bytes: usize,
    pub disk_chunks: usize,
    pub disk_bytes: u64,
    pub corrupt_records: u64,
}

#[utoipa::path(get, path = "/v1/stats", responses((status = 200, body = Stats), (status = 401, body = ErrorBody)))]
pub async fn stats(State(app): State<Arc<AppState>>) -> Json<Stats> {
    let p = app.engine.paged_stats();
    let s = app.engine.cache_stats();
    Json(Stats {
        pool: PoolView {
            block_size: p.block_size,
            block_bytes: p.block_bytes,
            blocks_total: p.blocks_total,
            blocks_used: p.blocks_used,
            blocks_shared: p.blocks_shared,
            blocks_resident: p.blocks_resident,
            blocks_approximate: p.blocks_approximate,
            peak_blocks_used: p.peak_blocks_used,
            bytes_used: p.bytes_used(),
            bytes_total: p.bytes_total(),
            bytes_saved_by_sharing: p.bytes_saved_by_sharing,
            resident_sequences: p.resident_sequences,
            running: p.running,
            waiting: p.waiting,
            evictions: p.evictions,
            preemptions: p.preemptions,
            requests: p.requests,
        },
        store: StoreView {
            hits: s.hits,
            approximate_hits: s.approximate_hits,
            misses: s.misses,
            hit_rate: s.hit_rate,
            evictions: s.evictions,
            ram_chunks: s.ram_chunks,
            ram_bytes: s.ram_bytes,
            disk_chunks: s.disk_chunks,
            disk_bytes: s.disk_bytes,
            corrupt_records: s.corrupt_records,
        },
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
pub async fn openapi(
    Extension(doc): Extension<Arc<utoipa::openapi::OpenApi>>,
) -> impl IntoResponse {
    Json(doc.as_ref().clone())
}
