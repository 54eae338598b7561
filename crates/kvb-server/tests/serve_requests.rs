//! `kvb serve`'s request fields on the tiny model: each sampling field checked for its effect,
//! the fields it does not serve refused by name rather than dropped, and `/tokenize` and
//! `/detokenize` agreeing with what the completions read.

use crate::common::{client, tiny_server, Server};
use serde_json::{json, Value};

fn post(s: &Server, path: &str, body: &Value) -> (u16, Value) {
    let r = client().post(s.url(path)).json(body).send().unwrap();
    let status = r.status().as_u16();
    let text = r.text().unwrap();
    let v = serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}"));
    (status, v)
}

/// The generated tokens' texts for a completion of token ids `prompt` with `extra` settings
/// (greedy and 12 tokens unless `extra` says otherwise).
fn tokens(s: &Server, prompt: &[u32], extra: Value) -> Vec<String> {
    let mut body = json!({"model": "tiny", "prompt": prompt, "max_tokens": 12,
        "temperature": 0, "logprobs": 0});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let (status, v) = post(s, "/v1/completions", &body);
    assert_eq!(status, 200, "{body}: {v}");
    v["choices"][0]["logprobs"]["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap().to_string())
        .collect()
}

fn distinct(t: &[String]) -> std::collections::BTreeSet<&str> {
    t.iter().map(String::as_str).collect()
}

#[test]
fn each_sampling_field_changes_the_answer_as_it_says() {
    let (_d, s) = tiny_server(&[]);
    let prompt = [5u32, 6, 7, 8];
    // A bias of 100 forces a token, every time.
    let only = |id: u32| tokens(&s, &prompt, json!({"logit_bias": {id.to_string(): 100}}));
    let (a, b) = (only(20), only(21));
    assert_eq!(a.len(), 12);
    assert_eq!(distinct(&a).len(), 1, "{a:?}");
    assert_eq!(distinct(&b).len(), 1, "{b:?}");
    assert_ne!(a[0], b[0]);

    // Both forced: greedy repeats the likelier one; a frequency penalty makes them alternate,
    // a presence penalty gives the other one a turn.
    let both = json!({"20": 100, "21": 100});
    let plain = tokens(&s, &prompt, json!({"logit_bias": both}));
    assert_eq!(distinct(&plain).len(), 1, "{plain:?}");
    for penalty in ["frequency_penalty", "presence_penalty"] {
        let t = tokens(&s, &prompt, json!({"logit_bias": both, penalty: 2.0}));
        assert_eq!(
            distinct(&t),
            distinct(&[a[0].clone(), b[0].clone()]),
            "{penalty}: {t:?}"
        );
    }
    // Under a frequency penalty neither can run far ahead of the other.
    let frequent = tokens(
        &s,
        &prompt,
        json!({"logit_bias": both, "frequency_penalty": 2.0}),
    );
    let count = |x: &str| frequent.iter().filter(|t| *t == x).count();
    assert!(count(&a[0]) >= 3 && count(&b[0]) >= 3, "{frequent:?}");

    // A repetition penalty covers the prompt: token 20, in it and favoured by 10 more, loses its
    // first place to 21 (its logit, near 100, halves; 21's stays near 90).
    let repeated = [5u32, 6, 7, 20];
    let favoured = json!({"20": 100, "21": 90});
    let t = tokens(&s, &repeated, json!({"logit_bias": favoured}));
    assert_eq!(t[0], a[0], "{t:?}");
    let t = tokens(
        &s,
        &repeated,
        json!({"logit_bias": favoured, "repetition_penalty": 2.0}),
    );
    assert_eq!(t[0], b[0], "{t:?}");

    // top_k 1 and min_p 1 keep only the most likely token: sampling hot gives greedy's tokens.
    let greedy = tokens(&s, &prompt, json!({}));
    for cut in [json!({"top_k": 1}), json!({"min_p": 1.0})] {
        let mut extra = json!({"temperature": 2.0, "seed": 3});
        extra
            .as_object_mut()
            .unwrap()
            .extend(cut.as_object().unwrap().clone());
        assert_eq!(tokens(&s, &prompt, extra.clone()), greedy, "{extra}");
    }
}

/// The text of a completion of `prompt` with `extra` settings, and why it finished.
fn completion(s: &Server, prompt: &[u32], extra: Value) -> (String, String) {
    let mut body = json!({"model": "tiny", "prompt": prompt, "max_tokens": 24});
    for (k, v) in extra.as_object().unwrap() {
        body[k] = v.clone();
    }
    let (status, v) = post(s, "/v1/completions", &body);
    assert_eq!(status, 200, "{body}: {v}");
    let choice = &v["choices"][0];
    let text = choice["text"].as_str().unwrap().to_string();
    (text, choice["finish_reason"].as_str().unwrap().to_string())
}

#[test]
fn a_stop_string_ends_the_answer_before_its_first_match() {
    let (_d, s) = tiny_server(&[]);
    let prompt = [5u32, 6, 7, 8];
    let greedy = json!({"temperature": 0});
    let (full, finish) = completion(&s, &prompt, greedy);
    assert_eq!(finish, "length", "{full:?}");
    // Two stops, from a quarter and three quarters into the text: the answer ends where the
    // first match starts, in whichever order the stops are listed.
    let chars: Vec<char> = full.chars().collect();
    assert!(chars.len() >= 8, "{full:?}");
    let piece = |at: usize| chars[at..at + 2].iter().collect::<String>();
    let (early, late) = (piece(chars.len() / 4), piece(chars.len() * 3 / 4));
    let cut = [&late, &early]
        .iter()
        .filter_map(|stop| full.find(stop.as_str()))
        .min()
        .unwrap();
    for stop in [json!([late, early]), json!([early, late])] {
        let (text, finish) = completion(&s, &prompt, json!({"temperature": 0, "stop": stop}));
        assert_eq!(
            (text.as_str(), finish.as_str()),
            (&full[..cut], "stop"),
            "{stop}"
        );
    }
    // One stop, as a string.
    let (text, finish) = completion(&s, &prompt, json!({"temperature": 0, "stop": late}));
    let at = full.find(late.as_str()).unwrap();
    assert_eq!((text.as_str(), finish.as_str()), (&full[..at], "stop"));
}

#[test]
fn unseeded_samples_differ_and_a_seed_repeats_its_answer() {
    let (_d, s) = tiny_server(&[]);
    let prompt = [5u32, 6, 7, 8];
    let hot = json!({"temperature": 1.0});
    let unseeded: std::collections::BTreeSet<String> = (0..3)
        .map(|_| completion(&s, &prompt, hot.clone()).0)
        .collect();
    assert!(
        unseeded.len() > 1,
        "every unseeded answer alike: {unseeded:?}"
    );
    let seeded = json!({"temperature": 1.0, "seed": 7});
    assert_eq!(
        completion(&s, &prompt, seeded.clone()),
        completion(&s, &prompt, seeded)
    );
}

#[test]
fn unserved_fields_are_refused_by_name_and_harmless_ones_accepted() {
    let (_d, s) = tiny_server(&[]);
    let chat = |extra: Value| {
        let mut body = json!({"model": "tiny", "max_tokens": 2,
            "messages": [{"role": "user", "content": "hi"}]});
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        post(&s, "/v1/chat/completions", &body)
    };
    for (extra, param) in [
        (
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}),
            "response_format",
        ),
        (
            json!({"functions": [{"name": "f", "parameters": {}}]}),
            "functions",
        ),
        (json!({"reasoning_effort": "low"}), "reasoning_effort"),
        (json!({"logit_bias": {"abc": 1}}), "logit_bias.abc"),
        (json!({"logit_bias": {"100000": 1}}), "logit_bias.100000"),
        (json!({"logit_bias": {"5": 500}}), "logit_bias.5"),
        (json!({"top_k": -5}), "top_k"),
        (json!({"min_p": 1.5}), "min_p"),
        (json!({"frequency_penalty": 3}), "frequency_penalty"),
        (json!({"presence_penalty": -3}), "presence_penalty"),
        (json!({"repetition_penalty": 0}), "repetition_penalty"),
        (
            json!({"stream_options": {"continuous_usage_stats": true}}),
            "stream_options.continuous_usage_stats",
        ),
        (
            json!({"messages": [{"role": "user", "content": "hi", "audio": {"id": "a"}}]}),
            "messages[0].audio",
        ),
    ] {
        let (status, v) = chat(extra.clone());
        assert_eq!(status, 400, "{extra}: {v}");
        assert_eq!(v["error"]["param"], param, "{extra}: {v}");
    }
    let (status, v) = chat(
        json!({"user": "u-1", "metadata": {"team": "a"}, "store": false,
        "response_format": {"type": "text"}, "tools": [], "tool_choice": "none",
        "frequency_penalty": 0, "top_k": -1}),
    );
    assert_eq!(status, 200, "{v}");
    let (status, v) = post(
        &s,
        "/v1/completions",
        &json!({"model": "tiny", "prompt": "x", "max_tokens": 1, "suffix": "and so on"}),
    );
    assert_eq!(
        (status, &v["error"]["param"]),
        (400, &json!("suffix")),
        "{v}"
    );
}

#[test]
fn tokenize_gives_the_prompt_the_server_reads_and_detokenize_its_text() {
    let (_d, s) = tiny_server(&[]);
    let (status, t) = post(
        &s,
        "/tokenize",
        &json!({"model": "tiny", "prompt": "w1 w2 w3"}),
    );
    assert_eq!(status, 200, "{t}");
    let ids: Vec<u32> = serde_json::from_value(t["tokens"].clone()).unwrap();
    assert_eq!(t["count"], ids.len());
    assert_eq!(t["max_model_len"], 256);
    // The completion of the text and of its ids read the same prompt.
    let complete = |prompt: Value| {
        let (status, v) = post(
            &s,
            "/v1/completions",
            &json!({"model": "tiny", "prompt": prompt, "max_tokens": 4, "temperature": 0}),
        );
        assert_eq!(status, 200, "{v}");
        (
            v["usage"]["prompt_tokens"].clone(),
            v["choices"][0]["text"].clone(),
        )
    };
    assert_eq!(complete(json!("w1 w2 w3")), complete(json!(ids)));
    let (status, d) = post(&s, "/detokenize", &json!({"tokens": ids}));
    assert_eq!(status, 200, "{d}");
    assert_eq!(d["prompt"].as_str().unwrap().trim(), "w1 w2 w3");

    // Messages count as a chat request's prompt does.
    let messages = json!([{"role": "user", "content": "w4 w5"}]);
    let (_, t) = post(&s, "/tokenize", &json!({"messages": messages}));
    let (status, v) = post(
        &s,
        "/v1/chat/completions",
        &json!({"model": "tiny", "messages": messages, "max_tokens": 1}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(t["count"], v["usage"]["prompt_tokens"], "{t} {v}");

    for (path, body, param) in [
        ("/tokenize", json!({}), Value::Null),
        (
            "/tokenize",
            json!({"prompt": "x", "model": "other"}),
            json!("model"),
        ),
        (
            "/detokenize",
            json!({"tokens": [1, 100000]}),
            json!("tokens[1]"),
        ),
    ] {
        let (status, v) = post(&s, path, &body);
        assert!(status == 400 || status == 404, "{path} {body}: {v}");
        assert_eq!(v["error"]["param"], param, "{path} {body}: {v}");
    }
}

/// A browser app at an allowed origin gets its preflight answered (before the API key, which a
/// preflight never carries) and may read the answer; another origin, or a server without
/// `--allowed-origins`, gets no CORS headers.
#[test]
fn cors_lets_allowed_origins_in_and_no_other() {
    let allowed = "http://app.example";
    let (_d, s) = tiny_server(&["--allowed-origins", allowed, "--api-key", "k"]);
    let preflight = |origin: &str| {
        client()
            .request(reqwest::Method::OPTIONS, s.url("/v1/chat/completions"))
            .header("origin", origin)
            .header("access-control-request-method", "POST")
            .header(
                "access-control-request-headers",
                // What the openai JavaScript SDK asks for from a browser.
                "authorization, content-type, x-stainless-os, x-stainless-retry-count",
            )
            .send()
            .unwrap()
    };
    let r = preflight(allowed);
    assert!(r.status().is_success(), "{}", r.status());
    assert_eq!(r.headers()["access-control-allow-origin"], allowed);
    let headers = r.headers()["access-control-allow-headers"]
        .to_str()
        .unwrap()
        .to_lowercase();
    for h in [
        "authorization",
        "content-type",
        "x-stainless-os",
        "x-stainless-retry-count",
    ] {
        assert!(headers.contains(h), "{h} not allowed: {headers}");
    }
    let methods = r.headers()["access-control-allow-methods"]
        .to_str()
        .unwrap()
        .to_string();
    assert!(methods.contains("POST"), "{methods}");
    let r = preflight("http://evil.example");
    assert!(r.headers().get("access-control-allow-origin").is_none());
    let r = client()
        .get(s.url("/v1/models"))
        .header("origin", allowed)
        .bearer_auth("k")
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    assert_eq!(r.headers()["access-control-allow-origin"], allowed);

    let (_d2, plain) = tiny_server(&[]);
    let r = client()
        .get(plain.url("/v1/models"))
        .header("origin", allowed)
        .send()
        .unwrap();
    assert!(r.headers().get("access-control-allow-origin").is_none());
}
