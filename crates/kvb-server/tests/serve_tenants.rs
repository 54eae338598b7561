//! Tenant-safe caching over real HTTP on the tiny model: a request reuses cached K/V only from
//! requests of its own tenant (API key, when the server has several) and `cache_salt`. What a
//! tenant cannot reuse it cannot time either; the answers stay the same, cached or not.

mod common;

use common::{client, tiny_server, words, Server};
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
    let (n, cached, first) = ask(&s, Some("alpha"), None, &prompt);
    assert_eq!(cached, 0, "a fresh server has nothing cached");
    // The same tenant again: a hit, and the same answer.
    let (_, cached, again) = ask(&s, Some("alpha"), None, &prompt);
    assert!(cached >= n - 1, "alpha's repeat: {cached} of {n} cached");
    assert_eq!(again, first);
    // Another key: nothing of alpha's, and the same answer computed from scratch.
    let (_, cached, theirs) = ask(&s, Some("beta"), None, &prompt);
    assert_eq!(cached, 0, "beta was served alpha's cache");
    assert_eq!(theirs, first);
    // A salt opens a cache of its own inside the tenant's ...
    assert_eq!(ask(&s, Some("alpha"), Some("s1"), &prompt).1, 0);
    let (_, cached, salted) = ask(&s, Some("alpha"), Some("s1"), &prompt);
    assert!(cached >= n - 1, "alpha's salted repeat: {cached} of {n}");
    assert_eq!(salted, first);
    // ... which another tenant's same salt does not reach.
    assert_eq!(ask(&s, Some("beta"), Some("s1"), &prompt).1, 0);
    // beta's own cache was filled by its first request.
    assert!(ask(&s, Some("beta"), None, &prompt).1 >= n - 1);
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
