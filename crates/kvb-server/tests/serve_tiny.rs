//! `kvb serve` over real HTTP on the tiny model: OpenAI's shapes, streaming, every error, the
//! API key, timeouts, the OpenAPI document, and greedy text equal to `kvb generate`'s.

use crate::common::{client, post_streaming, sse_data, tiny_model, tiny_server, Server};
use serde_json::{json, Value};

fn post(s: &Server, path: &str, body: &Value) -> (u16, reqwest::header::HeaderMap, Value) {
    let r = client().post(s.url(path)).json(body).send().unwrap();
    let status = r.status().as_u16();
    let headers = r.headers().clone();
    let text = r.text().unwrap();
    let v = serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}"));
    (status, headers, v)
}

/// The JSON chunks of a streamed answer to `body` at `path` (without `[DONE]`).
fn stream_chunks(s: &Server, path: &str, body: &Value) -> Vec<Value> {
    let r = client().post(s.url(path)).json(body).send().unwrap();
    sse_data(&r.text().unwrap())
        .iter()
        .filter(|d| *d != "[DONE]")
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

fn chat(content: &str, max_tokens: u32) -> Value {
    json!({
        "model": "tiny",
        "messages": [{"role": "system", "content": "You answer."}, {"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "temperature": 0
    })
}

#[test]
fn chat_and_completions_answer_in_openais_shapes_and_report_cached_tokens() {
    let (_d, s) = tiny_server(&[]);
    let (status, headers, v) = post(
        &s,
        "/v1/chat/completions",
        &chat("Tell me about rivers and lakes.", 8),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert!(v["id"].as_str().unwrap().starts_with("chatcmpl-"));
    assert_eq!(v["model"], "tiny");
    assert!(v["created"].as_u64().unwrap() > 1_600_000_000);
    let choice = &v["choices"][0];
    assert_eq!(choice["index"], 0);
    assert_eq!(choice["message"]["role"], "assistant");
    assert!(choice["message"]["content"].is_string());
    assert!(["stop", "length"].contains(&choice["finish_reason"].as_str().unwrap()));
    let u = &v["usage"];
    let (p, c) = (
        u["prompt_tokens"].as_u64().unwrap(),
        u["completion_tokens"].as_u64().unwrap(),
    );
    assert!(p > 10 && (1..=8).contains(&c), "{u}");
    assert_eq!(u["total_tokens"].as_u64().unwrap(), p + c);
    assert!(
        headers["x-kvb-ttft-ms"]
            .to_str()
            .unwrap()
            .parse::<f64>()
            .unwrap()
            > 0.0
    );
    assert_eq!(
        headers["x-kvb-prompt-tokens"].to_str().unwrap(),
        p.to_string()
    );

    // The same conversation again: its prompt is resident, reported as OpenAI reports cached
    // tokens, and the greedy answer is the same.
    let (_, headers2, v2) = post(
        &s,
        "/v1/chat/completions",
        &chat("Tell me about rivers and lakes.", 8),
    );
    let cached = v2["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(cached >= p - 1, "cached {cached} of {p}");
    assert_eq!(
        headers2["x-kvb-cached-tokens"].to_str().unwrap(),
        cached.to_string()
    );
    assert_eq!(
        v2["choices"][0]["message"]["content"],
        choice["message"]["content"]
    );

    let (status, _, v) = post(
        &s,
        "/v1/completions",
        &json!({"model": "tiny", "prompt": "The river flows", "max_tokens": 5, "temperature": 0}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["object"], "text_completion");
    assert!(v["id"].as_str().unwrap().starts_with("cmpl-"));
    assert!(v["choices"][0]["text"].is_string());
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() <= 5);
    assert!(v["choices"][0]["finish_reason"].is_string());

    // Token ids as the prompt.
    let (status, _, v) = post(
        &s,
        "/v1/completions",
        &json!({"model": "tiny", "prompt": [5, 6, 7, 8], "max_tokens": 2}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["usage"]["prompt_tokens"], 4);

    let (status, _, v) = post(
        &s,
        "/v1/warm",
        &json!({"text": "A document to keep around. ".repeat(8)}),
    );
    assert_eq!(status, 200, "{v}");
    assert!(v["tokens"].as_u64().unwrap() > 50);

    let models: Value = client()
        .get(s.url("/v1/models"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "tiny");
    let health: Value = client()
        .get(s.url("/health"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(health["status"], "ok");
    let stats = s.stats();
    assert!(
        stats["pool"]["blocks_resident"].as_u64().unwrap() > 0,
        "{stats}"
    );
    assert_eq!(stats["pool"]["running"], 0);
    let metrics = s.metrics();
    for needle in [
        "kvb_time_to_first_token_seconds_bucket",
        "kvb_request_duration_seconds_count",
        "kvb_cached_prompt_tokens_total",
        "kvb_generated_tokens_total",
        "kvb_pool_blocks_used",
        "kvb_queue_depth",
        "kvb_requests_total{endpoint=\"chat\",status=\"ok\"} 2",
    ] {
        assert!(metrics.contains(needle), "{needle} missing from\n{metrics}");
    }
}

#[test]
fn streaming_sends_a_chunk_per_token_then_the_finish_then_usage_then_done() {
    let (_d, s) = tiny_server(&[]);
    let (_, _, whole) = post(&s, "/v1/chat/completions", &chat("Name three colours.", 12));
    let mut req = chat("Name three colours.", 12);
    req["stream_options"] = json!({"include_usage": true});
    let r = post_streaming(&s, "/v1/chat/completions", &req);
    assert_eq!(r.status().as_u16(), 200);
    assert!(r.headers()["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/event-stream"));
    assert!(r.headers().contains_key("x-kvb-ttft-ms"));
    let data = sse_data(&r.text().unwrap());
    assert_eq!(data.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = data[..data.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
    assert!(chunks.iter().all(|c| c["id"] == chunks[0]["id"]));
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(
        chunks.last().unwrap()["choices"].as_array().unwrap().len(),
        0
    );
    let finish = &chunks[chunks.len() - 2];
    assert_eq!(
        finish["choices"][0]["finish_reason"],
        whole["choices"][0]["finish_reason"]
    );
    let content: Vec<&Value> = chunks[1..chunks.len() - 2]
        .iter()
        .map(|c| &c["choices"][0]["delta"]["content"])
        .collect();
    // One chunk per generated token (plus at most one for text held back until the end).
    let tokens = usage["completion_tokens"].as_u64().unwrap() as usize;
    assert!(
        content.len() == tokens || content.len() == tokens + 1,
        "{} chunks for {tokens} tokens",
        content.len()
    );
    let text: String = content.iter().map(|c| c.as_str().unwrap()).collect();
    assert_eq!(
        text,
        whole["choices"][0]["message"]["content"].as_str().unwrap()
    );

    // Completions stream too, ending the same way.
    let r = client()
        .post(s.url("/v1/completions"))
        .json(&json!({"model": "tiny", "prompt": "Once", "max_tokens": 4, "stream": true}))
        .send()
        .unwrap();
    let data = sse_data(&r.text().unwrap());
    assert_eq!(data.last().unwrap(), "[DONE]");
    let last: Value = serde_json::from_str(&data[data.len() - 2]).unwrap();
    assert_eq!(last["object"], "text_completion");
    assert!(last["choices"][0]["finish_reason"].is_string());
}

#[test]
fn bad_requests_get_openai_errors_and_the_server_keeps_answering() {
    let (_d, s) = tiny_server(&["--max-body-bytes", "4000"]);
    let expect = |body: &str, want: u16, param: Option<&str>, code: Option<&str>| {
        let r = client()
            .post(s.url("/v1/chat/completions"))
            .header("content-type", "application/json")
            .body(body.to_string())
            .send()
            .unwrap();
        assert_eq!(r.status().as_u16(), want, "{body}");
        let v: Value = r.json().unwrap();
        let e = &v["error"];
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert!(e["type"].is_string(), "{v}");
        if let Some(p) = param {
            assert_eq!(e["param"], p, "{v}");
        }
        if let Some(c) = code {
            assert_eq!(e["code"], c, "{v}");
        }
    };
    let ok_messages = r#""messages": [{"role": "user", "content": "hi"}]"#;
    expect("{not json", 400, None, None);
    expect("[1, 2]", 400, None, None);
    expect(
        &format!(r#"{{"model": "tiny", {ok_messages}, "max_tokens": "ten"}}"#),
        400,
        Some("max_tokens"),
        None,
    );
    expect(&format!(r#"{{{ok_messages}}}"#), 400, Some("model"), None);
    expect(r#"{"model": "tiny"}"#, 400, Some("messages"), None);
    expect(
        r#"{"model": "tiny", "messages": [{"role": "user"}]}"#,
        400,
        Some("messages[0].content"),
        None,
    );
    expect(
        r#"{"model": "tiny", "messages": [{"role": "robot", "content": "x"}]}"#,
        400,
        Some("messages[0].role"),
        None,
    );
    expect(
        &format!(r#"{{"model": "other", {ok_messages}}}"#),
        404,
        Some("model"),
        Some("model_not_found"),
    );
    expect(
        &format!(r#"{{"model": "tiny", {ok_messages}, "n": 17}}"#),
        400,
        Some("n"),
        None,
    );
    expect(
        &format!(r#"{{"model": "tiny", {ok_messages}, "temperature": 5}}"#),
        400,
        Some("temperature"),
        None,
    );
    expect(
        &format!(r#"{{"model": "tiny", {ok_messages}, "max_tokens": 0}}"#),
        400,
        Some("max_tokens"),
        None,
    );
    // Over the context (the tiny model holds 256 tokens).
    let long = "word ".repeat(400);
    expect(
        &json!({"model": "tiny", "messages": [{"role": "user", "content": long}]}).to_string(),
        400,
        Some("messages"),
        Some("context_length_exceeded"),
    );
    // Over --max-body-bytes.
    let huge = "word ".repeat(1000);
    expect(
        &json!({"model": "tiny", "messages": [{"role": "user", "content": huge}]}).to_string(),
        413,
        None,
        None,
    );
    let (status, _, v) = post(
        &s,
        "/v1/completions",
        &json!({"model": "tiny", "prompt": vec![7u32; 300]}),
    );
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], "context_length_exceeded");
    let (status, _, v) = post(
        &s,
        "/v1/completions",
        &json!({"model": "tiny", "prompt": [100000]}),
    );
    assert_eq!(status, 400, "{v}");
    // Unknown routes and methods answer in the same shape.
    let r = client().get(s.url("/v1/nothing")).send().unwrap();
    assert_eq!(r.status().as_u16(), 404);
    assert!(r.json::<Value>().unwrap()["error"]["message"].is_string());
    let r = client().get(s.url("/v1/chat/completions")).send().unwrap();
    assert_eq!(r.status().as_u16(), 405);
    // Still answering.
    let (status, _, _) = post(&s, "/v1/chat/completions", &chat("hi", 2));
    assert_eq!(status, 200);
}

#[test]
fn an_api_key_guards_the_v1_routes() {
    let (_d, s) = tiny_server(&["--api-key", "sesame"]);
    let get = |key: Option<&str>| {
        let mut r = client().get(s.url("/v1/models"));
        if let Some(k) = key {
            r = r.bearer_auth(k);
        }
        r.send().unwrap()
    };
    let r = get(None);
    assert_eq!(r.status().as_u16(), 401);
    assert_eq!(
        r.json::<Value>().unwrap()["error"]["type"],
        "authentication_error"
    );
    assert_eq!(get(Some("wrong")).status().as_u16(), 401);
    assert_eq!(get(Some("sesame")).status().as_u16(), 200);
    let r = client()
        .post(s.url("/v1/completions"))
        .json(&json!({"model": "tiny", "prompt": "x"}))
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 401);
    assert_eq!(
        client()
            .get(s.url("/health"))
            .send()
            .unwrap()
            .status()
            .as_u16(),
        200
    );
}

#[test]
fn a_request_past_its_timeout_gets_504_and_its_blocks_are_freed() {
    let (_d, s) = tiny_server(&["--request-timeout", "0.000001"]);
    let (status, _, v) = post(
        &s,
        "/v1/chat/completions",
        &chat("Tell me a long story.", 200),
    );
    assert_eq!(status, 504, "{v}");
    assert_eq!(v["error"]["code"], "timeout");
    let req = chat("Tell me another long story.", 200);
    let r = post_streaming(&s, "/v1/chat/completions", &req);
    assert_eq!(r.status().as_u16(), 504);
    // The cancelled sequences are gone.
    let stats = s.idle();
    assert_eq!(stats["pool"]["running"], 0, "{stats}");
    let metrics = s.metrics();
    assert!(
        metrics.contains("kvb_requests_total{endpoint=\"chat\",status=\"timeout\"} 2"),
        "{metrics}"
    );
}

#[test]
fn the_openapi_document_describes_every_route_and_each_answers() {
    let (_d, s) = tiny_server(&[]);
    let doc: Value = client()
        .get(s.url("/openapi.json"))
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let paths = doc["paths"].as_object().unwrap();
    for (path, method) in [
        ("/v1/chat/completions", "post"),
        ("/v1/completions", "post"),
        ("/v1/models", "get"),
        ("/v1/warm", "post"),
        ("/v1/stats", "get"),
        ("/tokenize", "post"),
        ("/detokenize", "post"),
        ("/health", "get"),
        ("/metrics", "get"),
        ("/openapi.json", "get"),
    ] {
        assert!(
            paths.get(path).and_then(|p| p.get(method)).is_some(),
            "{method} {path} missing"
        );
    }
    // Every documented route is served: none answers 404 or 405.
    for (path, item) in paths {
        for method in item.as_object().unwrap().keys() {
            let r = match method.as_str() {
                "get" => client().get(s.url(path)).send().unwrap(),
                "post" => client().post(s.url(path)).json(&json!({})).send().unwrap(),
                other => panic!("unexpected method {other}"),
            };
            let code = r.status().as_u16();
            assert!(code != 404 && code != 405, "{method} {path}: {code}");
        }
    }
    // The request schemas name the fields the server reads.
    let schemas = &doc["components"]["schemas"];
    for field in [
        "model",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "n",
        "top_k",
        "min_p",
        "frequency_penalty",
        "presence_penalty",
        "repetition_penalty",
        "logit_bias",
    ] {
        assert!(
            schemas["Sampling"]["properties"].get(field).is_some(),
            "{field}"
        );
    }
    // The document states the server's own limits, so clients generating from it stay valid.
    let sampling = &schemas["Sampling"]["properties"];
    assert_eq!(sampling["model"]["enum"], json!(["tiny"]));
    assert_eq!(sampling["temperature"]["maximum"].as_f64(), Some(2.0));
    assert_eq!(sampling["n"]["maximum"].as_f64(), Some(16.0));
    assert_eq!(sampling["max_tokens"]["minimum"].as_f64(), Some(1.0));
    let chat = &schemas["ChatCompletionRequest"]["allOf"][1]["properties"];
    assert_eq!(chat["messages"]["minItems"], json!(1));
}

#[test]
fn greedy_text_from_the_server_equals_kvb_generate() {
    let (dir, model) = tiny_model();
    let s = Server::start(&[
        "--model",
        model.to_str().unwrap(),
        "--served-model-name",
        "tiny",
    ]);
    let prompt = "The capital of the country is";
    let (_, _, v) = post(
        &s,
        "/v1/completions",
        &json!({"model": "tiny", "prompt": prompt, "max_tokens": 16, "temperature": 0}),
    );
    let out = crate::common::kvb()
        .args([
            "generate",
            "--model",
            model.to_str().unwrap(),
            "--prompt",
            prompt,
            "--max-new-tokens",
            "16",
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let served = v["choices"][0]["text"].as_str().unwrap();
    let generated = String::from_utf8_lossy(&out.stdout);
    assert!(!served.is_empty());
    assert_eq!(
        served.trim_end_matches('\n'),
        generated.trim_end_matches('\n')
    );
    drop(dir);
}

#[test]
fn logprobs_come_in_both_shapes_streamed_or_not_and_bad_settings_are_refused() {
    let (_d, s) = tiny_server(&[]);
    let mut req = chat("Name three rivers.", 6);
    req["logprobs"] = json!(true);
    req["top_logprobs"] = json!(3);
    let (status, _, whole) = post(&s, "/v1/chat/completions", &req);
    assert_eq!(status, 200, "{whole}");
    let content = whole["choices"][0]["logprobs"]["content"]
        .as_array()
        .unwrap();
    let generated = whole["usage"]["completion_tokens"].as_u64().unwrap() as usize;
    assert_eq!(content.len(), generated);
    for t in content {
        let top = t["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3, "{t}");
        let lp = |v: &Value| v["logprob"].as_f64().unwrap();
        assert!(lp(t) <= 0.0, "{t}");
        assert!(top.windows(2).all(|w| lp(&w[0]) >= lp(&w[1])), "{t}");
        // Greedy: the token generated is the most likely one.
        assert_eq!((&t["token"], lp(t)), (&top[0]["token"], lp(&top[0])), "{t}");
        let bytes: Vec<u8> = t["bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap() as u8)
            .collect();
        assert_eq!(bytes, t["token"].as_str().unwrap().as_bytes());
        let mass: f64 = top.iter().map(|a| lp(a).exp()).sum();
        assert!(mass <= 1.0 + 1e-5, "{t}");
    }
    // Without `logprobs`, none.
    let (_, _, plain) = post(&s, "/v1/chat/completions", &chat("Name three rivers.", 6));
    assert!(plain["choices"][0]["logprobs"].is_null());

    // Streamed: each token's chunk carries its entry, the same as the whole answer's.
    req["stream"] = json!(true);
    let streamed: Vec<Value> = stream_chunks(&s, "/v1/chat/completions", &req)
        .into_iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array().cloned())
        .inspect(|c| assert_eq!(c.len(), 1))
        .map(|mut c| c.remove(0))
        .collect();
    assert_eq!(&streamed, content);

    // Completions: the legacy shape, offsets counting the tokens' characters.
    let body = json!({"model": "tiny", "prompt": "Once upon", "max_tokens": 5, "temperature": 0, "logprobs": 2});
    let (status, _, v) = post(&s, "/v1/completions", &body);
    assert_eq!(status, 200, "{v}");
    let l = &v["choices"][0]["logprobs"];
    let tokens = l["tokens"].as_array().unwrap();
    assert_eq!(
        tokens.len() as u64,
        v["usage"]["completion_tokens"].as_u64().unwrap()
    );
    assert_eq!(l["token_logprobs"].as_array().unwrap().len(), tokens.len());
    let mut offset = 0;
    for (i, t) in tokens.iter().enumerate() {
        assert_eq!(l["text_offset"][i].as_u64().unwrap() as usize, offset);
        offset += t.as_str().unwrap().chars().count();
        let top = l["top_logprobs"][i].as_object().unwrap();
        assert!(!top.is_empty() && top.len() <= 2, "{top:?}");
        assert!(l["token_logprobs"][i].as_f64().unwrap() <= 0.0);
    }
    let mut streamed_body = body.clone();
    streamed_body["stream"] = json!(true);
    let offsets: Vec<Value> = stream_chunks(&s, "/v1/completions", &streamed_body)
        .into_iter()
        .filter_map(|c| {
            c["choices"][0]["logprobs"]["text_offset"]
                .as_array()
                .cloned()
        })
        .flatten()
        .collect();
    assert_eq!(&offsets, l["text_offset"].as_array().unwrap());

    // Settings that cannot be served name their field.
    for (path, extra, param) in [
        (
            "/v1/chat/completions",
            json!({"top_logprobs": 2}),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            json!({"logprobs": true, "top_logprobs": 21}),
            "top_logprobs",
        ),
        (
            "/v1/chat/completions",
            json!({"logprobs": "yes"}),
            "logprobs",
        ),
        ("/v1/completions", json!({"logprobs": 21}), "logprobs"),
    ] {
        let mut body = if path == "/v1/completions" {
            json!({"model": "tiny", "prompt": "Once"})
        } else {
            chat("hi", 2)
        };
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (status, _, e) = post(&s, path, &body);
        assert_eq!(status, 400, "{body} -> {e}");
        assert_eq!(e["error"]["param"], param, "{e}");
    }
}

#[test]
fn echo_puts_the_prompt_before_the_completion_whole_and_streamed() {
    let (_d, s) = tiny_server(&[]);
    let body = |echo: bool| {
        json!({"model": "tiny", "prompt": "The river flows", "max_tokens": 5,
               "temperature": 0, "echo": echo})
    };
    let (status, _, plain) = post(&s, "/v1/completions", &body(false));
    assert_eq!(status, 200, "{plain}");
    let answer = plain["choices"][0]["text"].as_str().unwrap().to_string();
    let (status, _, echoed) = post(&s, "/v1/completions", &body(true));
    assert_eq!(status, 200, "{echoed}");
    assert_eq!(
        echoed["choices"][0]["text"].as_str().unwrap(),
        format!("The river flows{answer}")
    );
    assert_eq!(
        echoed["usage"]["completion_tokens"],
        plain["usage"]["completion_tokens"]
    );

    let mut streamed = body(true);
    streamed["stream"] = json!(true);
    let chunks = stream_chunks(&s, "/v1/completions", &streamed);
    assert_eq!(chunks[0]["choices"][0]["text"], "The river flows");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    assert_eq!(text, format!("The river flows{answer}"));

    // Token ids: their text goes first.
    let ids = json!({"model": "tiny", "prompt": [5, 6, 7, 8], "max_tokens": 2, "temperature": 0});
    let (_, _, plain) = post(&s, "/v1/completions", &ids);
    let mut with_echo = ids.clone();
    with_echo["echo"] = json!(true);
    let (status, _, echoed) = post(&s, "/v1/completions", &with_echo);
    assert_eq!(status, 200, "{echoed}");
    let (a, e) = (
        plain["choices"][0]["text"].as_str().unwrap(),
        echoed["choices"][0]["text"].as_str().unwrap(),
    );
    assert!(e.len() > a.len() && e.ends_with(a), "{e:?} after {a:?}");

    // Not with logprobs; not on chat; `echo: false` on chat changes nothing.
    let mut both = body(true);
    both["logprobs"] = json!(1);
    let (status, _, v) = post(&s, "/v1/completions", &both);
    assert_eq!(
        (status, v["error"]["param"].as_str()),
        (400, Some("echo")),
        "{v}"
    );
    let mut on_chat = chat("Hi.", 2);
    on_chat["echo"] = json!(true);
    let (status, _, v) = post(&s, "/v1/chat/completions", &on_chat);
    assert_eq!(
        (status, v["error"]["param"].as_str()),
        (400, Some("echo")),
        "{v}"
    );
    on_chat["echo"] = json!(false);
    assert_eq!(post(&s, "/v1/chat/completions", &on_chat).0, 200);
}

#[test]
fn n_answers_are_the_copies_seeded_one_after_another() {
    let (_d, s) = tiny_server(&[]);
    let body = |n: u32, seed: u64| {
        json!({"model": "tiny", "prompt": "The river flows", "max_tokens": 6,
               "temperature": 1.0, "seed": seed, "n": n})
    };
    let (status, _, many) = post(&s, "/v1/completions", &body(3, 5));
    assert_eq!(status, 200, "{many}");
    let choices = many["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    let mut generated = 0;
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        // Copy i is what the one request seeded `5 + i` answers.
        let (_, _, one) = post(&s, "/v1/completions", &body(1, 5 + i as u64));
        assert_eq!(c["text"], one["choices"][0]["text"], "copy {i}");
        generated += one["usage"]["completion_tokens"].as_u64().unwrap();
    }
    let (_, _, one) = post(&s, "/v1/completions", &body(1, 5));
    let u = &many["usage"];
    assert_eq!(
        u["prompt_tokens"], one["usage"]["prompt_tokens"],
        "the prompt counts once"
    );
    assert_eq!(u["completion_tokens"].as_u64(), Some(generated));

    // Greedy copies are equal; chat answers with as many choices.
    let mut greedy = chat("Tell me about rivers.", 4);
    greedy["n"] = json!(2);
    let (status, _, v) = post(&s, "/v1/chat/completions", &greedy);
    assert_eq!(status, 200, "{v}");
    let choices = v["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 2);
    assert_eq!(choices[0]["message"], choices[1]["message"]);
    assert_eq!(choices[1]["index"], 1);

    for bad in [json!(0), json!(17)] {
        let mut b = body(1, 1);
        b["n"] = bad;
        let (status, _, v) = post(&s, "/v1/completions", &b);
        assert_eq!(
            (status, v["error"]["param"].as_str()),
            (400, Some("n")),
            "{v}"
        );
    }
    // Streamed, each copy's chunks carry its index and make the same text as the whole
    // answer's choice; the usage counts the prompt once.
    let mut streamed = body(3, 5);
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let r = post_streaming(&s, "/v1/completions", &streamed);
    assert_eq!(r.status().as_u16(), 200);
    let (mut texts, mut finished) = (vec![String::new(); 3], vec![false; 3]);
    let mut streamed_usage = Value::Null;
    for d in sse_data(&r.text().unwrap())
        .iter()
        .filter(|d| *d != "[DONE]")
    {
        let c: Value = serde_json::from_str(d).unwrap();
        if let Some(choice) = c["choices"].as_array().and_then(|c| c.first()) {
            let i = choice["index"].as_u64().unwrap() as usize;
            assert!(!finished[i], "copy {i} sent after its end");
            texts[i] += choice["text"].as_str().unwrap();
            finished[i] = choice["finish_reason"].is_string();
        } else {
            streamed_usage = c["usage"].clone();
        }
    }
    assert_eq!(finished, [true; 3]);
    for (i, text) in texts.iter().enumerate() {
        assert_eq!(
            many["choices"][i]["text"].as_str(),
            Some(text.as_str()),
            "copy {i}"
        );
    }
    for field in ["prompt_tokens", "completion_tokens"] {
        assert_eq!(streamed_usage[field], u[field], "{field}");
    }
    s.idle();
}
