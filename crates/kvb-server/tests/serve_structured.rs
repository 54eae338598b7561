//! Structured outputs on the tiny model (random weights: its free text is noise, so any valid
//! JSON it writes is the constraint's doing): `response_format` `json_object` and `json_schema`
//! on both endpoints, streamed and whole alike, and schemas that cannot be followed refused.

use crate::common::{client, post_streaming, sse_data, tiny_server, Server};
use serde_json::{json, Value};

fn post(s: &Server, body: &Value) -> (u16, Value) {
    let path = if body.get("messages").is_some() {
        "/v1/chat/completions"
    } else {
        "/v1/completions"
    };
    let r = client().post(s.url(path)).json(body).send().unwrap();
    let status = r.status().as_u16();
    let text = r.text().unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}")),
    )
}

/// The answer's text and finish reason.
fn answer(s: &Server, body: &Value) -> (String, String) {
    let (status, v) = post(s, body);
    assert_eq!(status, 200, "{body}: {v}");
    let choice = &v["choices"][0];
    let text = choice["message"]["content"]
        .as_str()
        .or(choice["text"].as_str())
        .unwrap()
        .to_string();
    (text, choice["finish_reason"].as_str().unwrap().to_string())
}

/// The streamed answer's text, its pieces joined.
fn streamed(s: &Server, body: &Value) -> String {
    let path = if body.get("messages").is_some() {
        "/v1/chat/completions"
    } else {
        "/v1/completions"
    };
    let r = post_streaming(s, path, body);
    assert_eq!(r.status().as_u16(), 200);
    let mut text = String::new();
    for d in sse_data(&r.text().unwrap())
        .iter()
        .filter(|d| *d != "[DONE]")
    {
        let c: Value = serde_json::from_str(d).unwrap();
        let choice = &c["choices"][0];
        if let Some(t) = choice["delta"]["content"]
            .as_str()
            .or(choice["text"].as_str())
        {
            text.push_str(t);
        }
    }
    text
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "maxLength": 12},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
            "ok": {"type": "boolean"}
        },
        "required": ["name", "age", "tags", "ok"],
        "additionalProperties": false
    })
}

fn fits(v: &Value) -> bool {
    let o = v.as_object().unwrap();
    o.len() == 4
        && o["name"].as_str().is_some_and(|n| n.chars().count() <= 12)
        && o["age"].as_u64().is_some_and(|a| a <= 150)
        && o["tags"].as_array().is_some_and(|t| {
            t.len() <= 3
                && t.iter()
                    .all(|x| ["a", "b", "c"].contains(&x.as_str().unwrap()))
        })
        && o["ok"].is_boolean()
}

#[test]
fn json_schema_answers_parse_and_fit_on_both_endpoints_streamed_or_not() {
    let (_d, s) = tiny_server(&[]);
    let format = json!({"type": "json_schema",
        "json_schema": {"name": "person", "schema": schema(), "strict": true}});
    for seed in 0..6u64 {
        let chat = json!({"model": "tiny", "max_tokens": 120, "temperature": 1.0, "seed": seed,
            "messages": [{"role": "user", "content": "Describe someone."}],
            "response_format": format});
        let text = json!({"model": "tiny", "max_tokens": 120, "temperature": 1.0, "seed": seed,
            "prompt": "A person:", "response_format": format});
        for body in [chat, text] {
            let (answer, finish) = answer(&s, &body);
            assert_eq!(finish, "stop", "{answer}");
            let v: Value = serde_json::from_str(&answer)
                .unwrap_or_else(|e| panic!("{answer:?} is not JSON: {e}"));
            assert!(fits(&v), "{answer} does not fit the schema");
            assert_eq!(streamed(&s, &body), answer, "streamed and whole differ");
        }
    }
    // Without the format the same request is free text: noise, not this JSON.
    let (free, _) = answer(
        &s,
        &json!({"model": "tiny", "max_tokens": 40, "temperature": 0,
        "prompt": "A person:"}),
    );
    assert!(
        serde_json::from_str::<Value>(&free).map_or(true, |v| !fits(&v)),
        "{free}"
    );
}

#[test]
fn json_object_answers_are_objects() {
    let (_d, s) = tiny_server(&[]);
    let mut stopped = 0;
    for seed in 0..8u64 {
        let body = json!({"model": "tiny", "max_tokens": 60, "temperature": 0.7, "seed": seed,
            "messages": [{"role": "user", "content": "JSON please."}],
            "response_format": {"type": "json_object"}});
        let (answer, finish) = answer(&s, &body);
        assert!(answer.starts_with('{'), "{answer}");
        // A cut answer ends at the token limit; a finished one is a whole object.
        if finish == "stop" {
            stopped += 1;
            let v: Value =
                serde_json::from_str(&answer).unwrap_or_else(|e| panic!("{answer}: {e}"));
            assert!(v.is_object());
        } else {
            assert_eq!(finish, "length");
        }
    }
    assert!(stopped > 0, "no object finished in 60 tokens");
}

#[test]
fn schemas_that_cannot_be_followed_are_refused_naming_the_field() {
    let (_d, s) = tiny_server(&[]);
    let with = |format: Value| json!({"model": "tiny", "max_tokens": 8, "prompt": "x", "response_format": format});
    for format in [
        json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "no-such-type"}}}),
        json!({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "integer", "minimum": 3, "maximum": 1}}}),
        json!({"type": "json_schema", "json_schema": {"name": "x"}}),
        json!({"type": "json_schema", "json_schema": {"name": "x", "schema": 5}}),
        json!({"type": "yaml"}),
    ] {
        let (status, v) = post(&s, &with(format.clone()));
        assert_eq!(status, 400, "{format}: {v}");
        let param = v["error"]["param"].as_str().unwrap_or_default();
        assert!(param.starts_with("response_format"), "{format}: {v}");
    }
    // The server goes on answering.
    let (text, _) = answer(&s, &with(json!({"type": "text"})));
    assert!(!text.is_empty());
}
