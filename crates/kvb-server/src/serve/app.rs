//! The server's shared state and its router: every route is registered with its OpenAPI
//! description (utoipa-axum), so `/openapi.json` cannot miss one.

use super::body::BodyLimit;
use super::error::ApiError;
use super::metrics::{Metrics, Snapshot};
use super::{completions, info, tokenize};
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::http::{header, Method, Uri};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::Router;
use kvb_engine::{
    Engine, EngineError, EventSink, PoolStats, RequestTicket, StoreStats, WarmResult,
};
use kvb_model::{ModelBackend, Tokenizer};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use utoipa::OpenApi;
use utoipa_axum::router::OpenApiRouter;
use utoipa_axum::routes;

/// What the server needs of an engine, whatever its backend.
pub trait ServedEngine: Send + Sync {
    fn tokenizer(&self) -> &Tokenizer;
    fn context_len(&self) -> usize;
    fn max_running(&self) -> usize;
    fn submit_to(
        &self,
        request: kvb_engine::Request,
        sink: Box<dyn EventSink>,
    ) -> Result<RequestTicket, EngineError>;
    fn warm_tokens(
        &self,
        tokens: &[u32],
        cache_scope: Option<Vec<u8>>,
    ) -> Result<WarmResult, EngineError>;
    fn paged_stats(&self) -> PoolStats;
    fn cache_stats(&self) -> StoreStats;
    fn flush(&self) -> Result<(), EngineError>;
}

impl<B: ModelBackend> ServedEngine for Engine<B> {
    fn tokenizer(&self) -> &Tokenizer {
        Engine::tokenizer(self)
    }
    fn context_len(&self) -> usize {
        self.model().config().max_position_embeddings
    }
    fn max_running(&self) -> usize {
        self.config().max_running
    }
    fn submit_to(
        &self,
        request: kvb_engine::Request,
        sink: Box<dyn EventSink>,
    ) -> Result<RequestTicket, EngineError> {
        Engine::submit_to(self, request, sink)
    }
    fn warm_tokens(
        &self,
        tokens: &[u32],
        cache_scope: Option<Vec<u8>>,
    ) -> Result<WarmResult, EngineError> {
        Engine::warm_tokens_in(self, tokens, cache_scope)
    }
    fn paged_stats(&self) -> PoolStats {
        Engine::paged_stats(self)
    }
    fn cache_stats(&self) -> StoreStats {
        Engine::cache_stats(self)
    }
    fn flush(&self) -> Result<(), EngineError> {
        Engine::flush(self)
    }
}

/// Server settings from the command line.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The name requests must use in `model`.
    pub model_name: String,
    /// One of these is required as `Authorization: Bearer KEY` on `/v1/*` when any is set;
    /// with more than one, each key is a tenant with its own cache namespace.
    pub api_keys: Vec<String>,
    /// Requests held beyond those the engine runs at once; more get 503.
    pub max_queue: usize,
    /// A request waiting or running longer is cancelled with 504.
    pub request_timeout: Duration,
    /// Bodies over this many bytes get 413.
    pub max_body_bytes: usize,
    /// `max_tokens` when a request gives none.
    pub default_max_tokens: usize,
    /// How requests use the cache.
    pub mode: kvb_engine::GenerationMode,
    /// Special tokens typed in messages are control tokens (`--trust-message-special-tokens`).
    pub trust_message_special_tokens: bool,
    /// Origins browsers may call from (`--allowed-origins`; `*`: any; empty: none).
    pub allowed_origins: Vec<String>,
}

/// State every handler reads.
pub struct AppState {
    pub engine: Arc<dyn ServedEngine>,
    pub settings: Settings,
    pub metrics: Metrics,
    /// How the model's chat template writes tools and calls.
    pub tool_format: super::tools::ToolFormat,
    /// Unix seconds at start (`created` of the model card).
    pub started: u64,
    in_flight: AtomicUsize,
    next_id: AtomicUsize,
    /// Set once shutdown begins: new generation requests get 503.
    pub closing: AtomicBool,
}

/// A request's place in the server: held while it waits or runs, given back on drop.
pub struct Ticket(Arc<AppState>);

impl Drop for Ticket {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

impl AppState {
    pub fn new(engine: Arc<dyn ServedEngine>, settings: Settings) -> Arc<Self> {
        let started = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let tool_format = super::tools::ToolFormat::of(engine.tokenizer());
        Arc::new(AppState {
            engine,
            settings,
            metrics: Metrics::new(),
            tool_format,
            started,
            in_flight: AtomicUsize::new(0),
            next_id: AtomicUsize::new(0),
            closing: AtomicBool::new(false),
        })
    }

    /// A place for one more request, or 503 when the engine's running slots and the queue are
    /// all taken (or the server is closing).
    pub fn admit(self: &Arc<Self>) -> Result<Ticket, ApiError> {
        if self.closing.load(Ordering::Acquire) {
            return Err(ApiError::shutting_down());
        }
        let limit = self.engine.max_running() + self.settings.max_queue;
        let held = self.in_flight.fetch_add(1, Ordering::AcqRel);
        let ticket = Ticket(self.clone());
        if held >= limit {
            return Err(ApiError::overloaded(1));
        }
        Ok(ticket)
    }

    /// An id for a response: `prefix-<start>-<n>`, unique within this server's life.
    pub fn new_id(&self, prefix: &str) -> String {
        let n = self.next_id.fetch_add(1, Ordering::Relaxed);
        format!("{prefix}-{:x}{n:06x}", self.started)
    }

    /// The engine's state for `/metrics`.
    pub fn snapshot(&self) -> Snapshot {
        let p = self.engine.paged_stats();
        let s = self.engine.cache_stats();
        Snapshot {
            pool_blocks_total: p.blocks_total,
            pool_blocks_used: p.blocks_used,
            pool_blocks_shared: p.blocks_shared,
            pool_bytes_used: p.bytes_used(),
            pool_bytes_total: p.bytes_total(),
            store_ram_bytes: s.ram_bytes,
            store_disk_bytes: s.disk_bytes,
            remote: s.remote,
            running: p.running,
            waiting: p.waiting,
            in_flight: self.in_flight.load(Ordering::Acquire),
        }
    }
}

/// When a request arrived, taken before its body is read: TTFT counts from here.
#[derive(Clone, Copy)]
pub struct Arrival(pub Instant);

async fn stamp_arrival(mut req: Request, next: Next) -> Response {
    req.extensions_mut().insert(Arrival(Instant::now()));
    next.run(req).await
}

/// The tenant a request comes from, where the server has several API keys (none otherwise).
#[derive(Clone, Debug, Default)]
pub struct Tenant {
    /// The key it gave: its cache scope.
    pub key: Option<String>,
    /// Its name in `/metrics`: `key1`, `key2`, ... in `--api-key` order (never the key).
    pub label: Option<String>,
}

/// `/v1/*` needs one of the API keys when any is set; the key names the request's [`Tenant`].
async fn check_key(State(app): State<Arc<AppState>>, mut req: Request, next: Next) -> Response {
    let keys = &app.settings.api_keys;
    if !keys.is_empty() {
        let given = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim);
        let Some(at) = given.and_then(|g| keys.iter().position(|k| k == g)) else {
            return ApiError::unauthorized().into_response();
        };
        if keys.len() > 1 {
            let tenant = Tenant {
                key: Some(keys[at].clone()),
                label: Some(format!("key{}", at + 1)),
            };
            req.extensions_mut().insert(tenant);
        }
    }
    next.run(req).await
}

async fn no_route(uri: Uri) -> ApiError {
    ApiError::no_route(uri.path())
}

async fn wrong_method(method: Method, uri: Uri) -> ApiError {
    ApiError::wrong_method(method.as_str(), uri.path())
}

/// The OpenAPI document's header; routes and schemas are added as they are registered.
#[derive(OpenApi)]
#[openapi(info(
    title = "kvb",
    description = "OpenAI-compatible inference with K/V reuse of repeated context"
))]
struct ApiDoc;

/// The OpenAPI document as served: `model` takes the one name this server answers to, so that a
/// client (or a fuzzer) generating requests from the document names it.
fn served_document(doc: &utoipa::openapi::OpenApi, model_name: &str) -> serde_json::Value {
    let mut json = serde_json::to_value(doc).unwrap_or_default();
    if let Some(model) = json
        .pointer_mut("/components/schemas/Sampling/properties/model")
        .and_then(serde_json::Value::as_object_mut)
    {
        model.insert("enum".into(), serde_json::json!([model_name]));
    }
    json
}

/// Every route, and the OpenAPI document describing them.
pub fn router(app: Arc<AppState>) -> Router {
    let limit = app.settings.max_body_bytes;
    let (v1, doc) = OpenApiRouter::with_openapi(ApiDoc::openapi())
        .routes(routes!(completions::chat_completions))
        .routes(routes!(completions::completions))
        .routes(routes!(info::models))
        .routes(routes!(info::warm))
        .routes(routes!(info::stats))
        .routes(routes!(tokenize::tokenize))
        .routes(routes!(tokenize::detokenize))
        .route_layer(middleware::from_fn_with_state(app.clone(), check_key))
        .routes(routes!(info::health))
        .routes(routes!(info::metrics))
        .routes(routes!(info::openapi))
        .split_for_parts();
    let doc = Arc::new(served_document(&doc, &app.settings.model_name));
    let router = v1
        .layer(axum::Extension(doc))
        .fallback(no_route)
        .method_not_allowed_fallback(wrong_method)
        .layer(DefaultBodyLimit::max(limit))
        .layer(axum::Extension(BodyLimit(limit)))
        .layer(middleware::from_fn(stamp_arrival));
    match cors(&app.settings.allowed_origins) {
        Some(layer) => router.layer(layer).with_state(app),
        None => router.with_state(app),
    }
}

/// Cross-origin access for browser apps from `origins` (`*`: any), preflights included (they
/// carry no API key, so this outermost layer answers them before the key is checked); `None`
/// (no CORS headers at all) without origins.
fn cors(origins: &[String]) -> Option<tower_http::cors::CorsLayer> {
    use tower_http::cors::{AllowHeaders, AllowOrigin, CorsLayer};
    if origins.is_empty() {
        return None;
    }
    let allow = if origins.iter().any(|o| o == "*") {
        AllowOrigin::any()
    } else {
        AllowOrigin::list(origins.iter().filter_map(|o| o.parse().ok()))
    };
    let layer = CorsLayer::new()
        .allow_origin(allow)
        .allow_methods([Method::GET, Method::POST])
        // Whatever headers the preflight names: client libraries add their own (the openai
        // SDKs send `x-stainless-*`), and origins, not headers, are what is guarded.
        .allow_headers(AllowHeaders::mirror_request())
        .expose_headers(
            [
                "x-kvb-ttft-ms",
                "x-kvb-prompt-tokens",
                "x-kvb-cached-tokens",
                "x-kvb-reuse-ratio",
            ]
            .map(header::HeaderName::from_static),
        );
    Some(layer)
}
