//! Several `kvb serve` replicas sharing one Redis (Debian's redis-server, started here on a free
//! loopback port): a document one replica read is a hit on another with Baseline's greedy
//! answer; another K/V precision, another tenant or another salt never reads it; Redis killed
//! mid-run fails no request, and hits resume once it is back.

use crate::common::{client, tiny_model, Server};
use kvb_store::remote::test_server::RedisServer;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

fn replica(model: &str, redis: &str, extra: &[&str]) -> Server {
    let mut args = vec![
        "--model",
        model,
        "--served-model-name",
        "tiny",
        "--chunk-size",
        "32",
        "--remote-cache",
        redis,
        "--remote-timeout-ms",
        "300",
    ];
    args.extend_from_slice(extra);
    Server::start(&args)
}

/// A greedy completion: (answer, cached prompt tokens).
fn complete(s: &Server, prompt: &str) -> (String, u64) {
    let r = client()
        .post(s.url("/v1/completions"))
        .json(&json!({"model": "tiny", "prompt": prompt, "max_tokens": 8, "temperature": 0}))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200, "{}", s.log());
    let v: Value = r.json().unwrap();
    (
        v["choices"][0]["text"].as_str().unwrap().to_string(),
        v["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
    )
}

fn remote_stats(s: &Server) -> Value {
    remote_stats_as(s, None)
}

/// The shared tier's stats, asked with API key `key` where the server guards them.
fn remote_stats_as(s: &Server, key: Option<&str>) -> Value {
    let mut r = client().get(s.url("/v1/stats"));
    if let Some(key) = key {
        r = r.bearer_auth(key);
    }
    let stats: Value = r.send().unwrap().json().unwrap();
    stats["store"]["remote"].clone()
}

/// Waits until `s` has written everything it queued for the shared tier.
fn writes_landed(s: &Server) -> Value {
    writes_landed_as(s, None)
}

/// [`writes_landed`], asking with API key `key`.
fn writes_landed_as(s: &Server, key: Option<&str>) -> Value {
    let end = Instant::now() + Duration::from_secs(60);
    loop {
        let r = remote_stats_as(s, key);
        if r["writes_pending"] == 0 && r["writes"].as_u64().unwrap() > 0 {
            return r;
        }
        assert!(Instant::now() < end, "writes never landed: {r}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Warms `text` through `s` and waits until its chunks are in Redis.
fn warm_and_publish(s: &Server, text: &str) {
    let r = client()
        .post(s.url("/v1/warm"))
        .json(&json!({"text": text}))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    writes_landed(s);
}

fn document(topic: &str) -> String {
    format!("A note on {topic}: ").repeat(12)
}

#[test]
fn replicas_share_what_they_read_and_survive_a_redis_outage() {
    let mut redis = RedisServer::start().unwrap();
    let (_dir, model) = tiny_model();
    let model = model.to_str().unwrap();
    let url = redis.url();
    let a = replica(model, &url, &[]);
    let b = replica(model, &url, &[]);
    let baseline = Server::start(&[
        "--model",
        model,
        "--served-model-name",
        "tiny",
        "--mode",
        "baseline",
    ]);

    // A document warmed through A ...
    let doc = document("rivers");
    warm_and_publish(&a, &doc);
    // ... is a hit on B, whose greedy answer is Baseline's.
    let prompt = format!("{doc}What flows?");
    let (answer, cached) = complete(&b, &prompt);
    assert!(cached >= 64, "B reused {cached} tokens from A's document");
    assert_eq!(answer, complete(&baseline, &prompt).0);
    let rb = remote_stats(&b);
    assert!(rb["hits"].as_u64().unwrap() >= 2, "{rb}");
    assert_eq!(rb["corrupt"], 0);

    // Another K/V precision is another namespace: it never reads A's entries.
    let int8 = replica(model, &url, &["--kv-precision", "int8"]);
    let (_, cached) = complete(&int8, &prompt);
    assert_eq!(cached, 0);
    let r8 = remote_stats(&int8);
    assert_eq!(r8["hits"], 0, "{r8}");
    assert!(r8["misses"].as_u64().unwrap() > 0, "{r8}");

    // Redis killed mid-run: every request still succeeds, from the local tiers.
    redis.kill();
    for (i, s) in [&a, &b, &a, &b].into_iter().enumerate() {
        let (text, _) = complete(s, &format!("{}Question {i}?", document("lakes")));
        assert!(!text.is_empty(), "an answer from the local tiers");
    }
    let rb = remote_stats(&b);
    assert_eq!(rb["connected"], false, "{rb}");
    assert!(rb["outages"].as_u64().unwrap() >= 1, "{rb}");
    assert!(b.metrics().contains("kvb_remote_cache_outages 1"));
    assert!(a.log().contains("unavailable"), "one warning per outage");

    // Redis back (empty): after the retry interval, what A reads is a hit on B again.
    redis.restart().unwrap();
    std::thread::sleep(Duration::from_millis(1200));
    let doc = document("mountains");
    let prompt = format!("{doc}How high?");
    let (first, cached_a) = complete(&a, &prompt);
    assert!(
        cached_a < 64,
        "A had not read this document: cached {cached_a}"
    );
    writes_landed(&a);
    let (again, cached_b) = complete(&b, &prompt);
    assert!(
        cached_b >= 64,
        "hits resumed on B: cached {cached_b}; {}",
        remote_stats(&b)
    );
    assert_eq!(again, first);
    assert_eq!(remote_stats(&b)["connected"], true);
    assert_eq!(a.log().matches("unavailable").count(), 1, "{}", a.log());
}

#[test]
fn a_document_one_replica_read_is_reused_by_another_at_another_position() {
    let redis = RedisServer::start().unwrap();
    let (_dir, model) = tiny_model();
    let model = model.to_str().unwrap();
    let a = replica(model, &redis.url(), &[]);
    let b = replica(model, &redis.url(), &[]);
    let doc = document("glaciers");
    warm_and_publish(&a, &doc);
    // The document after a preamble B has never seen: found through the content index, placed
    // at its new position and repaired.
    let (_, cached) = complete(&b, &format!("Read this carefully, then answer. {doc}Why?"));
    let rb = remote_stats(&b);
    assert!(
        cached >= 32,
        "B reused {cached} tokens of A's document: {rb}"
    );
    assert!(rb["hits"].as_u64().unwrap() >= 1, "{rb}");
    assert_eq!(rb["corrupt"], 0);
}

/// A greedy completion as tenant `key`, salted or not: cached prompt tokens.
fn cached_as(s: &Server, key: &str, salt: Option<&str>, prompt: &str) -> u64 {
    let mut body = json!({"model": "tiny", "prompt": prompt, "max_tokens": 4, "temperature": 0});
    if let Some(salt) = salt {
        body["cache_salt"] = salt.into();
    }
    let r = client()
        .post(s.url("/v1/completions"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .unwrap();
    assert_eq!(r.status(), 200, "{}", s.log());
    let v: Value = r.json().unwrap();
    v["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap()
}

#[test]
fn another_tenant_or_salt_never_reads_a_tenants_entries_in_redis() {
    let redis = RedisServer::start().unwrap();
    let (_dir, model) = tiny_model();
    let model = model.to_str().unwrap();
    // Blocks freed as each request ends, so its chunks go to the store (and Redis) at once.
    let keys = ["--api-key", "alpha,beta", "--no-resident"];
    let a = replica(model, &redis.url(), &keys);
    let b = replica(model, &redis.url(), &keys);
    let prompt = format!("{}Whose?", document("ledgers"));
    assert!(
        cached_as(&a, "alpha", None, &prompt) < 32,
        "A had not read it"
    );
    writes_landed_as(&a, Some("alpha"));
    // On B, which has read nothing: beta and a salted alpha find nothing in Redis ...
    assert_eq!(cached_as(&b, "beta", None, &prompt), 0);
    assert_eq!(cached_as(&b, "alpha", Some("s"), &prompt), 0);
    let rb = remote_stats_as(&b, Some("beta"));
    assert_eq!(rb["hits"], 0, "{rb}");
    assert!(rb["misses"].as_u64().unwrap() > 0, "{rb}");
    // ... where alpha itself gets what A wrote.
    let cached = cached_as(&b, "alpha", None, &prompt);
    assert!(cached >= 64, "alpha reused {cached} tokens on B");
    let rb = remote_stats_as(&b, Some("beta"));
    assert!(rb["hits"].as_u64().unwrap() >= 2, "{rb}");
}
