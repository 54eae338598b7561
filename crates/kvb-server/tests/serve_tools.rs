//! Tool calling on the default model (the tiny one's 256-token context cannot hold the tools'
//! description): `required` and a named function give calls whose arguments fit their
//! schemas, streamed (in pieces) and whole alike; `auto` gives text or calls that fit; `none`
//! gives text; calls and results in the history are
//! taken; bad tools are refused by name (on the tiny model: refused before it runs).

use crate::common::{client, post_streaming, sse_data, tiny_server, Server};

/// `kvb serve` on the default model, served as `tiny` like the rest of these requests.
fn default_server() -> Server {
    Server::start(&["--served-model-name", "tiny"])
}
use serde_json::{json, Value};

fn post(s: &Server, body: &Value) -> (u16, Value) {
    let r = client()
        .post(s.url("/v1/chat/completions"))
        .json(body)
        .send()
        .unwrap();
    let status = r.status().as_u16();
    let text = r.text().unwrap();
    (
        status,
        serde_json::from_str(&text).unwrap_or_else(|_| panic!("not JSON: {text}")),
    )
}

fn tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city.",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string", "maxLength": 10},
                "unit": {"enum": ["celsius", "fahrenheit"]}},
            "required": ["city", "unit"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "add",
            "parameters": {"type": "object", "properties": {
                "a": {"type": "integer", "minimum": 0, "maximum": 99},
                "b": {"type": "integer", "minimum": 0, "maximum": 99}},
            "required": ["a", "b"], "additionalProperties": false}}}
    ])
}

/// Whether `args` (JSON text) fit function `name` of [`tools`].
fn fits(name: &str, args: &str) -> bool {
    let v: Value = match serde_json::from_str(args) {
        Ok(v) => v,
        Err(_) => return false,
    };
    let o = v.as_object().unwrap();
    match name {
        "get_weather" => {
            o.len() == 2
                && o["city"].as_str().is_some_and(|c| c.chars().count() <= 10)
                && ["celsius", "fahrenheit"].contains(&o["unit"].as_str().unwrap_or(""))
        }
        "add" => {
            o.len() == 2
                && ["a", "b"]
                    .iter()
                    .all(|k| o[*k].as_u64().is_some_and(|n| n <= 99))
        }
        _ => false,
    }
}

fn request(choice: Value, seed: u64) -> Value {
    json!({"model": "tiny", "max_tokens": 160, "temperature": 0.8, "seed": seed,
        "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
        "tools": tools(), "tool_choice": choice})
}

/// A streamed answer: its content, its calls (name, arguments: the pieces joined) and their
/// ids, how many pieces they came in, and its finish reason.
struct Streamed {
    content: String,
    calls: Vec<(String, String)>,
    ids: Vec<String>,
    pieces: usize,
    finish: String,
}

fn streamed(s: &Server, body: &Value) -> Streamed {
    let r = post_streaming(s, "/v1/chat/completions", body);
    assert_eq!(r.status().as_u16(), 200);
    let mut out = Streamed {
        content: String::new(),
        calls: Vec::new(),
        ids: Vec::new(),
        pieces: 0,
        finish: String::new(),
    };
    for d in sse_data(&r.text().unwrap())
        .iter()
        .filter(|d| *d != "[DONE]")
    {
        let c: Value = serde_json::from_str(d).unwrap();
        let choice = &c["choices"][0];
        out.content += choice["delta"]["content"].as_str().unwrap_or("");
        for call in choice["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let index = call["index"].as_u64().unwrap() as usize;
            let f = &call["function"];
            // A call's first piece has its id, type and name; later pieces only arguments.
            if let Some(id) = call["id"].as_str() {
                // The server's, or the model's own (Mistral v11: nine letters and digits).
                let own = id.len() == 9 && id.bytes().all(|b| b.is_ascii_alphanumeric());
                assert!(id.starts_with("call") || own, "{id}");
                out.ids.push(id.to_string());
                assert_eq!(call["type"], "function");
                assert_eq!(index, out.calls.len(), "calls start in order");
                out.calls
                    .push((f["name"].as_str().unwrap().to_string(), String::new()));
            } else {
                assert!(f["name"].is_null() && call["type"].is_null(), "{call}");
            }
            out.calls[index].1 += f["arguments"].as_str().unwrap();
            out.pieces += 1;
        }
        if let Some(f) = choice["finish_reason"].as_str() {
            out.finish = f.to_string();
        }
    }
    out
}

/// A whole answer's calls (name, arguments), each fitting its function.
fn whole_calls(v: &Value) -> Vec<(String, String)> {
    v["choices"][0]["message"]["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| {
            assert_eq!(t["type"], "function");
            let f = &t["function"];
            let (name, args) = (
                f["name"].as_str().unwrap().to_string(),
                f["arguments"].as_str().unwrap().to_string(),
            );
            assert!(fits(&name, &args), "{name}({args}) does not fit");
            (name, args)
        })
        .collect()
}

/// A ChatML template with a tools section that writes calls in `<tool_call>` lines (the shape
/// of Qwen2.5's): kvb leaves tools, calls and results to it.
const TAGGED: &str = r#"{%- if tools %}<|im_start|>system
{% if messages[0].role == 'system' %}{{ messages[0].content }}

{% endif %}Tools on offer:
<tools>
{% for t in tools %}{{ t | tojson }}
{% endfor %}</tools>
Call one as <tool_call>
{"name": NAME, "arguments": ARGUMENTS}
</tool_call><|im_end|>
{% elif messages[0].role == 'system' %}<|im_start|>system
{{ messages[0].content }}<|im_end|>
{% endif %}
{%- for m in messages %}{% if m.role == 'tool' %}<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% elif m.role != 'system' %}<|im_start|>{{ m.role }}
{{ m.content }}{% for c in m.tool_calls %}
<tool_call>
{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}}
</tool_call>{% endfor %}<|im_end|>
{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant
{% endif %}"#;

/// A template in Llama 3.1's shape: the tools in the first user turn, a call is the whole
/// answer, `{"name", "parameters"}`.
const JSON_CALLS: &str = r#"{% for m in messages %}<|start_header_id|>{{ m.role }}<|end_header_id|>

{% if tools and loop.first %}Answer with one JSON call {"name": a function's name, "parameters": its arguments} of:
{% for t in tools %}{{ t | tojson }}
{% endfor %}
{% endif %}{% for c in m.tool_calls %}{"name": "{{ c.function.name }}", "parameters": {{ c.function.arguments | tojson }}}{% endfor %}{{ m.content }}<|eot_id|>{% endfor %}{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>

{% endif %}"#;

/// A template in the shape of Mistral's (v3): the tools before the first user turn, the
/// answer `[TOOL_CALLS]` and a list of calls; call ids of nine characters, as Mistral's own
/// templates demand.
const MISTRAL: &str = r#"{%- for m in messages %}
{%- if m.role == 'user' %}{% if tools and loop.first %}[AVAILABLE_TOOLS] {{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}[INST] {{ m.content }}[/INST]
{%- elif m.role == 'tool' %}[TOOL_RESULTS] {"content": {{ m.content | tojson }}, "call_id": "{{ m.tool_call_id }}"}[/TOOL_RESULTS]
{%- elif m.tool_calls %}[TOOL_CALLS] [{% for c in m.tool_calls %}{% if c.id | length != 9 %}{{ raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}{% endif %}{"name": "{{ c.function.name }}", "arguments": {{ c.function.arguments | tojson }}, "id": "{{ c.id }}"}{% if not loop.last %}, {% endif %}{% endfor %}]{{ eos_token }}
{%- else %} {{ m.content }}{{ eos_token }}
{%- endif %}
{%- endfor %}"#;

/// A template in the shape of Mistral's v11 (Small 3.2): each call of the history
/// `[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}`, ids of nine characters, results by id.
const MISTRAL_V11: &str = r#"{%- for m in messages %}
{%- if m.role == 'user' %}{% if tools and loop.first %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}[INST]{{ m.content }}[/INST]
{%- elif m.role == 'tool' %}[TOOL_RESULTS]{{ m.tool_call_id }}[TOOL_CONTENT]{{ m.content }}[/TOOL_RESULTS]
{%- elif m.tool_calls %}{% for c in m.tool_calls %}{% if c.id | length != 9 %}{{ raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}{% endif %}[TOOL_CALLS]{{ c.function.name }}[CALL_ID]{{ c.id }}[ARGS]{{ c.function.arguments | tojson }}{% endfor %}{{ eos_token }}
{%- else %}{{ m.content }}{{ eos_token }}
{%- endif %}
{%- endfor %}"#;

/// `kvb serve` on the default model with the chat template `template` (and the folder
/// holding its file).
fn server_with_template(template: &str) -> (tempfile::TempDir, Server) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("template.jinja");
    std::fs::write(&file, template).unwrap();
    let s = Server::start(&[
        "--served-model-name",
        "tiny",
        "--chat-template",
        file.to_str().unwrap(),
    ]);
    (dir, s)
}

#[test]
fn forced_calls_fit_their_functions_streamed_or_whole() {
    let s = default_server();
    forced_calls_fit(&s, 3);
}

/// The template's own format, where it has one: the tools and the history reach the template,
/// and forced calls fit their functions, streamed or whole.
#[test]
fn a_template_with_a_tools_section_writes_tools_and_calls() {
    let history = weather_history();
    let prompt = |s: &Server| rendered(s, &history);
    let (_d, tagged) = server_with_template(TAGGED);
    let text = prompt(&tagged);
    assert!(
        text.contains("Tools on offer:\n<tools>\n{")
            && text.contains("\"name\":\"get_weather\"")
            && text.contains("<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}\n</tool_call><|im_end|>")
            && text.contains("<tool_response>\n18 degrees\n</tool_response>")
            && !text.contains("Functions you can call"),
        "{text}"
    );
    forced_calls_fit(&tagged, 1);
    auto_answers_fit(&tagged, 2, "<");
    drop(tagged);
    let (_d, json_calls) = server_with_template(JSON_CALLS);
    let text = prompt(&json_calls);
    assert!(
        text.contains("Answer with one JSON call")
            && text.contains(
                "{\"name\": \"get_weather\", \"parameters\": {\"city\":\"Paris\"}}<|eot_id|>"
            )
            && text.contains("\n\n18 degrees<|eot_id|>")
            && !text.contains("<tool_call>"),
        "{text}"
    );
    forced_calls_fit(&json_calls, 1);
    auto_answers_fit(&json_calls, 2, "{");
    // The generic format, for comparison: kvb's description and tags in the messages.
    let text = prompt(&default_server());
    assert!(
        text.contains("Functions you can call") && text.contains("<tool_response>"),
        "{text}"
    );
}

/// The history of a call and its result.
fn weather_history() -> Value {
    json!([
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees"}
    ])
}

/// The prompt `s` makes of `history` with [`tools`], as text.
fn rendered(s: &Server, history: &Value) -> String {
    let ids = client()
        .post(s.url("/tokenize"))
        .json(&json!({"messages": history, "tools": tools()}))
        .send()
        .unwrap()
        .json::<Value>()
        .unwrap()["tokens"]
        .clone();
    client()
        .post(s.url("/detokenize"))
        .json(&json!({"tokens": ids}))
        .send()
        .unwrap()
        .json::<Value>()
        .unwrap()["prompt"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Mistral's format (v3): the template gets the tools, and the history's call ids as nine
/// letters and digits (the same id in the call and in its result); answers are lists of
/// calls that fit, streamed or whole.
#[test]
fn a_mistral_template_gets_its_ids_and_answers_in_lists() {
    let (_d, s) = server_with_template(MISTRAL);
    let text = rendered(&s, &weather_history());
    let call =
        "[TOOL_CALLS] [{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}, \"id\": \"";
    let at = text.find(call).unwrap_or_else(|| panic!("{text}")) + call.len();
    let id = &text[at..at + 9];
    assert!(id.bytes().all(|b| b.is_ascii_alphanumeric()), "{text}");
    assert!(
        text.starts_with("[AVAILABLE_TOOLS] [{")
            && text.contains("\"name\":\"get_weather\"")
            && text[at + 9..].starts_with("\"}]")
            && text.contains(&format!(
                "[TOOL_RESULTS] {{\"content\": \"18 degrees\", \"call_id\": \"{id}\"}}[/TOOL_RESULTS]"
            ))
            && !text.contains("Functions you can call"),
        "{text}"
    );
    forced_calls_fit(&s, 1);
    auto_answers_fit(&s, 2, "[");
}

/// Mistral's v11 format: the history's calls as `[TOOL_CALLS]name[CALL_ID]id[ARGS]{...}`
/// with ids of nine letters and digits (the same in the result); answers are such calls
/// (the markers as text: the default model's vocabulary has no such control tokens) that fit,
/// streamed or whole.
#[test]
fn a_mistral_v11_template_gets_named_calls_and_answers_in_them() {
    let (_d, s) = server_with_template(MISTRAL_V11);
    let text = rendered(&s, &weather_history());
    let call = "[TOOL_CALLS]get_weather[CALL_ID]";
    let at = text.find(call).unwrap_or_else(|| panic!("{text}")) + call.len();
    let id = &text[at..at + 9];
    assert!(id.bytes().all(|b| b.is_ascii_alphanumeric()), "{text}");
    assert!(
        text.starts_with("[AVAILABLE_TOOLS][{")
            && text[at + 9..].starts_with("[ARGS]{\"city\":\"Paris\"}")
            && text.contains(&format!(
                "[TOOL_RESULTS]{id}[TOOL_CONTENT]18 degrees[/TOOL_RESULTS]"
            ))
            && !text.contains("Functions you can call"),
        "{text}"
    );
    forced_calls_fit(&s, 1);
    auto_answers_fit(&s, 2, "[");
    // The model's own call ids come back, streamed or whole: the next turn's prompt then
    // repeats the tokens it wrote. (One call: asked for several, a 135M model repeats its
    // call to the token limit.)
    let mut body = request(json!("required"), 0);
    body["parallel_tool_calls"] = json!(false);
    let (_, v) = post(&s, &body);
    let whole: Vec<&str> = v["choices"][0]["message"]["tool_calls"]
        .as_array()
        .unwrap_or_else(|| panic!("{v}"))
        .iter()
        .map(|c| c["id"].as_str().unwrap())
        .collect();
    assert!(
        whole
            .iter()
            .all(|id| id.len() == 9 && id.bytes().all(|b| b.is_ascii_alphanumeric())),
        "{v}"
    );
    assert_eq!(streamed(&s, &body).ids, whole);
}

/// Forced calls (`required`, a named function) on `s` with `seeds` seeds: each fits its
/// function, streamed and whole alike.
fn forced_calls_fit(s: &Server, seeds: u64) {
    for seed in 0..seeds {
        for choice in [
            json!("required"),
            json!({"type": "function", "function": {"name": "add"}}),
        ] {
            // One call each: a 135M model asked for parallel calls tends to repeat its call
            // until the token limit.
            let mut body = request(choice.clone(), seed);
            body["parallel_tool_calls"] = json!(false);
            let (status, v) = post(s, &body);
            assert_eq!(status, 200, "{v}");
            let c = &v["choices"][0];
            assert_eq!(c["finish_reason"], "tool_calls", "{v}");
            let calls = whole_calls(&v);
            assert!(!calls.is_empty());
            if choice.is_object() {
                assert_eq!(calls.len(), 1, "a named function is called once");
                assert_eq!(calls[0].0, "add");
            }
            let st = streamed(s, &body);
            assert_eq!((&st.calls, st.finish.as_str()), (&calls, "tool_calls"));
            assert!(st.pieces > calls.len(), "calls go out in pieces");
        }
    }
}

/// `auto`: the model answers in text or calls; calls fit their functions (once opened, a
/// call is constrained), and the stream gives the same answer in pieces.
#[test]
fn auto_answers_are_text_or_calls_that_fit() {
    let s = default_server();
    assert!(
        auto_answers_fit(&s, 6, "<") > 0,
        "some seed calls a function"
    );
}

/// `auto` on `s` with `seeds` seeds: each answer is text, or calls that fit, streamed and
/// whole alike. Returns how many answers made calls. A 135M model rarely opens a call on its
/// own: `opening`, the format's first character of a call, is made likelier (`logit_bias`),
/// which also tempts it into text that is no call.
fn auto_answers_fit(s: &Server, seeds: u64, opening: &str) -> usize {
    let lt = client()
        .post(s.url("/tokenize"))
        .json(&json!({"prompt": opening}))
        .send()
        .unwrap()
        .json::<Value>()
        .unwrap()["tokens"][0]
        .clone();
    let mut called = 0;
    for seed in 0..seeds {
        let mut body = request(json!("auto"), seed);
        body["parallel_tool_calls"] = json!(false);
        body["logit_bias"] = json!({ lt.to_string(): 4 });
        let (status, v) = post(s, &body);
        assert_eq!(status, 200, "{v}");
        let calls = whole_calls(&v);
        let finish = v["choices"][0]["finish_reason"].as_str().unwrap();
        if !calls.is_empty() {
            called += 1;
            assert_eq!(finish, "tool_calls", "{v}");
        }
        let st = streamed(s, &body);
        assert_eq!(
            (&st.calls, st.finish.as_str()),
            (&calls, finish),
            "seed {seed}"
        );
        let content = v["choices"][0]["message"]["content"].as_str().unwrap_or("");
        assert_eq!(st.content.trim(), content.trim(), "seed {seed}");
    }
    called
}

#[test]
fn none_answers_in_text_and_history_with_calls_is_taken() {
    let s = default_server();
    let mut none = request(json!("none"), 1);
    none["max_tokens"] = json!(16);
    let (status, v) = post(&s, &none);
    assert_eq!(status, 200, "{v}");
    assert!(v["choices"][0]["message"]["tool_calls"].is_null());
    assert!(v["choices"][0]["message"]["content"].is_string());
    // A conversation with a call and its result: the prompt grows by them.
    let mut body = request(json!("auto"), 1);
    body["max_tokens"] = json!(8);
    let (_, short) = post(&s, &body);
    body["messages"] = json!([
        {"role": "user", "content": "What is the weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"unit\": \"celsius\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"}
    ]);
    let (status, long) = post(&s, &body);
    assert_eq!(status, 200, "{long}");
    assert!(
        long["usage"]["prompt_tokens"].as_u64() > short["usage"]["prompt_tokens"].as_u64(),
        "{long}"
    );
}

#[test]
fn bad_tools_are_refused_by_name() {
    let (_d, s) = tiny_server(&[]);
    let with = |patch: Value| {
        let mut body = request(json!("auto"), 0);
        for (k, v) in patch.as_object().unwrap() {
            body[k] = v.clone();
        }
        body
    };
    for (patch, param) in [
        (
            json!({"tool_choice": {"type": "function", "function": {"name": "nope"}}}),
            "tool_choice",
        ),
        (json!({"tool_choice": "sometimes"}), "tool_choice"),
        (
            json!({"tools": [{"type": "retrieval", "function": {"name": "f"}}]}),
            "tools[0].type",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "has space"}}]}),
            "tools[0].function.name",
        ),
        (
            json!({"tools": [{"type": "function", "function": {"name": "f", "parameters": 3}}]}),
            "tools[0].function.parameters",
        ),
        (
            json!({"tools": [], "tool_choice": "required"}),
            "tool_choice",
        ),
        (
            json!({"response_format": {"type": "json_object"}}),
            "response_format",
        ),
        (
            json!({"messages": [{"role": "user", "content": null}]}),
            "messages[0].content",
        ),
    ] {
        let (status, v) = post(&s, &with(patch.clone()));
        assert_eq!(status, 400, "{patch}: {v}");
        assert_eq!(v["error"]["param"], param, "{patch}: {v}");
    }
}
