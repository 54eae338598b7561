//! Tenant-safe caching over real HTTP on the tiny model: a request reuses cached K/V only from
//! requests of its own tenant (API key, when the server has several) and `cache_salt`. What a
//! tenant cannot reuse it cannot time either; the answers stay the same, cached or not.

use crate::common::{client, tiny_server, words, Server};
use serde_json::{json, Value};

/// Asks for a greedy answer to `prompt` as the holder of `key`, salted with `salt`; returns
/// the prompt's tokens, how many the cache served, and the answer.
fn ask(s: &Server, key: Option<&str>, salt: Option<&str>, prompt: &str) -> (u64, u64, String) {
    let mut body = json!({
        "model": "tiny",
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": 6,
        "temperature": 0
    });
    if let Some(salt) = salt {
        body["cache_salt"] = json!(salt);
    }
    let mut r = client().post(s.url("/v1/chat/completions")).json(&body);
    if let Some(key) = key {
        r = r.bearer_auth(key);
    }
    let r = r.send().unwrap();
    let status = r.status().as_u16();
    let v: Value = r.json().unwrap();
    assert_eq!(status, 200, "{v}");
    let usage = &v["usage"];
    (
        usage["prompt_tokens"].as_u64().unwrap(),
        usage["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap(),
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap()
            .to_string(),
    )
}

#[test]
fn each_api_key_and_each_salt_has_its_own_cache() {
    let (_d, s) = tiny_server(&["--api-key", "alpha,beta"]);
    let prompt = words(3, 40);
    // Prompt and cached tokens each key was served, to compare with `/metrics`.
    let mut served = [(0u64, 0u64); 2];
    let mut ask = |key: &str, salt: Option<&str>| {
        let r = ask(&s, Some(key), salt, &prompt);
        let at = usize::from(key == "beta");
        served[at] = (served[at].0 + r.0, served[at].1 + r.1);
        r
    };
    let (n, cached, first) = ask("alpha", None);
    assert_eq!(cached, 0, "a fresh server has nothing cached");
    // The same tenant again: a hit, and the same answer.
    let (_, cached, again) = ask("alpha", None);
    assert!(cached >= n - 1, "alpha's repeat: {cached} of {n} cached");
    assert_eq!(again, first);
    // Another key: nothing of alpha's, and the same answer computed from scratch.
    let (_, cached, theirs) = ask("beta", None);
    assert_eq!(cached, 0, "beta was served alpha's cache");
    assert_eq!(theirs, first);
    // A salt opens a cache of its own inside the tenant's ...
    assert_eq!(ask("alpha", Some("s1")).1, 0);
    let (_, cached, salted) = ask("alpha", Some("s1"));
    assert!(cached >= n - 1, "alpha's salted repeat: {cached} of {n}");
    assert_eq!(salted, first);
    // ... which another tenant's same salt does not reach.
    assert_eq!(ask("beta", Some("s1")).1, 0);
    // beta's own cache was filled by its first request.
    assert!(ask("beta", None).1 >= n - 1);

    // `/metrics` counts each tenant's tokens under its key's place, never the key.
    let metrics = s.metrics();
    let count = |name: &str, tenant: &str| -> u64 {
        let head = format!("kvb_{name}_total{{tenant=\"{tenant}\"}} ");
        let line = metrics.lines().find(|l| l.starts_with(&head));
        line.unwrap_or_else(|| panic!("no {head} in\n{metrics}"))[head.len()..]
            .trim()
            .parse()
            .unwrap()
    };
    for (at, tenant) in ["key1", "key2"].into_iter().enumerate() {
        assert_eq!(count("tenant_prompt_tokens", tenant), served[at].0);
        assert_eq!(count("tenant_cached_prompt_tokens", tenant), served[at].1);
    }
    assert!(!metrics.contains("alpha") && !metrics.contains("beta"));
}

#[test]
fn a_salted_request_neither_hits_nor_fills_the_shared_cache() {
    let (_d, s) = tiny_server(&[]);
    let prompt = words(5, 40);
    let (n, _, first) = ask(&s, None, Some("mine"), &prompt);
    assert_eq!(
        ask(&s, None, None, &prompt).1,
        0,
        "unsalted got the salted cache"
    );
    assert!(ask(&s, None, None, &prompt).1 >= n - 1);
    assert_eq!(ask(&s, None, Some("other"), &prompt).1, 0);
    let (_, cached, answer) = ask(&s, None, Some("mine"), &prompt);
    assert!(cached >= n - 1, "the salt's own repeat: {cached} of {n}");
    assert_eq!(answer, first);
}

/// `POST /v1/warm` caches for the caller's tenant and salt: what alpha warms is a hit for
/// alpha's requests only, and a salted warm only for that salt.
#[test]
fn a_warm_is_cached_for_its_own_tenant_and_salt() {
    let (_d, s) = tiny_server(&["--api-key", "alpha,beta"]);
    let warm = |key: &str, salt: Option<&str>, text: &str| {
        let mut body = json!({"messages": [{"role": "user", "content": text}]});
        if let Some(salt) = salt {
            body["cache_salt"] = json!(salt);
        }
        let r = client()
            .post(s.url("/v1/warm"))
            .bearer_auth(key)
            .json(&body)
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), 200);
    };
    let (doc, salted) = (words(5, 40), words(6, 40));
    // Each check on a scope nothing has filled yet: two chats share their template's opening,
    // so a scope that holds one conversation serves the opening of any other.
    warm("alpha", Some("s"), &salted);
    assert_eq!(
        ask(&s, Some("alpha"), None, &salted).1,
        0,
        "unsalted reads a salt's"
    );
    assert_eq!(
        ask(&s, Some("alpha"), Some("t"), &salted).1,
        0,
        "a salt reads another's"
    );
    let (n, cached, _) = ask(&s, Some("alpha"), Some("s"), &salted);
    assert!(cached >= n / 2, "the salted warm served {cached} of {n}");
    warm("alpha", None, &doc);
    assert_eq!(
        ask(&s, Some("beta"), None, &doc).1,
        0,
        "beta reads alpha's warm"
    );
    let (n, cached, _) = ask(&s, Some("alpha"), None, &doc);
    assert!(cached >= n / 2, "alpha's warm served {cached} of {n}");
}
