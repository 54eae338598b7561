//! `GET /metrics`, in Prometheus' text format (prometheus-client): latencies, token counters,
//! requests by status, and the pool, store and queue read from the engine at each scrape.

use kvb_engine::RemoteStats;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// Engine state sampled at a scrape.
pub struct Snapshot {
    pub pool_blocks_total: usize,
    pub pool_blocks_used: usize,
    pub pool_blocks_shared: usize,
    pub pool_bytes_used: usize,
    pub pool_bytes_total: usize,
    pub store_ram_bytes: usize,
    pub store_disk_bytes: u64,
    /// The shared tier's counters, when there is one.
    pub remote: Option<RemoteStats>,
    pub running: usize,
    pub waiting: usize,
    pub in_flight: usize,
}

/// The remote tier's counters, as gauges (0 without one): name, help, and how to read it.
type RemoteCount = (&'static str, &'static str, fn(&RemoteStats) -> u64);

/// A remote tier counter's gauge and how to read the counter.
type RemoteGauge = (fn(&RemoteStats) -> u64, Gauge);

const REMOTE_COUNTS: [RemoteCount; 8] = [
    (
        "remote_cache_hits",
        "Chunks read from the remote cache",
        |r| r.hits,
    ),
    (
        "remote_cache_misses",
        "Keys asked of the remote cache and not there",
        |r| r.misses,
    ),
    (
        "remote_cache_corrupt",
        "Remote cache values dropped for a bad checksum, key or shape",
        |r| r.corrupt,
    ),
    (
        "remote_cache_errors",
        "Remote cache calls that failed",
        |r| r.errors,
    ),
    ("remote_cache_outages", "Remote cache outages begun", |r| {
        r.outages
    }),
    (
        "remote_cache_writes",
        "Chunks written to the remote cache",
        |r| r.writes,
    ),
    (
        "remote_cache_writes_dropped",
        "Chunks not written to the remote cache (backlog full, down or refused)",
        |r| r.writes_dropped,
    ),
    (
        "remote_cache_writes_pending",
        "Chunks queued for the remote cache",
        |r| r.writes_pending,
    ),
];

/// A gauge and how a snapshot sets it.
type SnapshotGauge = (fn(&Snapshot) -> i64, Gauge);

/// Every metric the server keeps.
pub struct Metrics {
    registry: Registry,
    ttft: Histogram,
    e2e: Histogram,
    prompt_tokens: Counter,
    cached_tokens: Counter,
    generated_tokens: Counter,
    /// Prompt and cached tokens per tenant (with several API keys).
    tenant_prompt_tokens: Family<Vec<(String, String)>, Counter>,
    tenant_cached_tokens: Family<Vec<(String, String)>, Counter>,
    requests: Family<Vec<(String, String)>, Counter>,
    gauges: Vec<SnapshotGauge>,
    remote_gauges: Vec<RemoteGauge>,
}

impl Metrics {
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("kvb");
        // 5 ms to ~160 s.
        let ttft = Histogram::new(exponential_buckets(0.005, 2.0, 16));
        let e2e = Histogram::new(exponential_buckets(0.005, 2.0, 16));
        registry.register(
            "time_to_first_token_seconds",
            "From a request's arrival to its first token",
            ttft.clone(),
        );
        registry.register(
            "request_duration_seconds",
            "From a request's arrival to its last byte",
            e2e.clone(),
        );
        let prompt_tokens = Counter::default();
        let cached_tokens = Counter::default();
        let generated_tokens = Counter::default();
        registry.register(
            "prompt_tokens",
            "Prompt tokens served",
            prompt_tokens.clone(),
        );
        registry.register(
            "cached_prompt_tokens",
            "Prompt tokens whose K/V the cache served",
            cached_tokens.clone(),
        );
        registry.register(
            "generated_tokens",
            "Tokens generated",
            generated_tokens.clone(),
        );
        let tenant_prompt_tokens = Family::<Vec<(String, String)>, Counter>::default();
        let tenant_cached_tokens = Family::<Vec<(String, String)>, Counter>::default();
        registry.register(
            "tenant_prompt_tokens",
            "Prompt tokens served, by tenant (API key: key1, key2, ...)",
            tenant_prompt_tokens.clone(),
        );
        registry.register(
            "tenant_cached_prompt_tokens",
            "Prompt tokens the cache served, by tenant (each has its own cache)",
            tenant_cached_tokens.clone(),
        );
        let requests = Family::<Vec<(String, String)>, Counter>::default();
        registry.register(
            "requests",
            "Requests by endpoint and outcome (ok, client_error, rejected, timeout, cancelled, server_error)",
            requests.clone(),
        );
        let mut gauges: Vec<SnapshotGauge> = Vec::new();
        let mut gauge = |name: &str, help: &str, read: fn(&Snapshot) -> i64| {
            let g = Gauge::default();
            registry.register(name, help, g.clone());
            gauges.push((read, g));
        };
        gauge("pool_blocks_total", "K/V pool budget in blocks", |s| {
            s.pool_blocks_total as i64
        });
        gauge("pool_blocks_used", "K/V pool blocks in use", |s| {
            s.pool_blocks_used as i64
        });
        gauge(
            "pool_blocks_shared",
            "K/V pool blocks read by several holders",
            |s| s.pool_blocks_shared as i64,
        );
        gauge("pool_bytes_used", "K/V pool bytes in use", |s| {
            s.pool_bytes_used as i64
        });
        gauge("pool_bytes_total", "K/V pool budget in bytes", |s| {
            s.pool_bytes_total as i64
        });
        gauge("store_ram_bytes", "Chunk store RAM tier bytes", |s| {
            s.store_ram_bytes as i64
        });
        gauge("store_disk_bytes", "Chunk store disk tier bytes", |s| {
            s.store_disk_bytes as i64
        });
        // The shared tier's counters are read from the store at each scrape (so gauges); all
        // stay 0 without one.
        gauge(
            "remote_cache_connected",
            "1 while the remote cache answers, 0 during an outage or without one",
            |s| s.remote.as_ref().map_or(0, |r| r.connected as i64),
        );
        gauge("running_sequences", "Sequences running", |s| {
            s.running as i64
        });
        gauge("queue_depth", "Requests waiting to be admitted", |s| {
            s.waiting as i64
        });
        gauge("requests_in_flight", "Requests the server holds", |s| {
            s.in_flight as i64
        });
        let remote_gauges = REMOTE_COUNTS
            .iter()
            .map(|&(name, help, read)| {
                let g = Gauge::default();
                registry.register(name, help, g.clone());
                (read, g)
            })
            .collect();
        Metrics {
            registry,
            ttft,
            e2e,
            prompt_tokens,
            cached_tokens,
            generated_tokens,
            tenant_prompt_tokens,
            tenant_cached_tokens,
            requests,
            gauges,
            remote_gauges,
        }
    }

    /// A request's first token, `ttft_ms` after its arrival, with its prompt and cached tokens,
    /// from `tenant` (its label) where the server has several.
    pub fn started(&self, ttft_ms: f64, (prompt, cached): (usize, usize), tenant: Option<&str>) {
        self.ttft.observe(ttft_ms / 1e3);
        self.prompt_tokens.inc_by(prompt as u64);
        self.cached_tokens.inc_by(cached as u64);
        if let Some(tenant) = tenant {
            let label = vec![("tenant".to_string(), tenant.to_string())];
            self.tenant_prompt_tokens
                .get_or_create(&label)
                .inc_by(prompt as u64);
            self.tenant_cached_tokens
                .get_or_create(&label)
                .inc_by(cached as u64);
        }
    }

    /// A request ended with `status` after `seconds`, having generated `generated` tokens.
    pub fn ended(&self, endpoint: &str, status: &str, seconds: f64, generated: usize) {
        self.e2e.observe(seconds);
        self.generated_tokens.inc_by(generated as u64);
        self.requests
            .get_or_create(&vec![
                ("endpoint".to_string(), endpoint.to_string()),
                ("status".to_string(), status.to_string()),
            ])
            .inc();
    }

    /// The text format, with the gauges set from `snapshot`.
    pub fn render(&self, snapshot: &Snapshot) -> String {
        for (read, g) in &self.gauges {
            g.set(read(snapshot));
        }
        for (read, g) in &self.remote_gauges {
            g.set(snapshot.remote.as_ref().map_or(0, |r| read(r) as i64));
        }
        let mut out = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut out, &self.registry);
        out
    }
}
