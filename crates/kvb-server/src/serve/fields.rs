//! Which request fields kvb serves, which it accepts because they cannot change the answer, and
//! the 400 for any other: a field that would change the answer is never dropped in silence.

use super::error::ApiError;
use serde_json::Value;

/// Fields both endpoints serve.
const SAMPLING: &[&str] = &[
    "model",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "logit_bias",
    "seed",
    "stop",
    "stream",
    "stream_options",
    "n",
    "response_format",
    "cache_salt",
];

/// Fields of `/v1/chat/completions` besides [`SAMPLING`].
pub const CHAT: &[&str] = &[
    "messages",
    "logprobs",
    "top_logprobs",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
];

/// Fields of `/v1/completions` besides [`SAMPLING`].
pub const COMPLETION: &[&str] = &["prompt", "logprobs", "echo"];

/// Accepted and without effect on the answer: who asks, labels, and OpenAI's own storage and
/// routing settings.
const NO_EFFECT: &[&str] = &[
    "user",
    "metadata",
    "store",
    "service_tier",
    "prompt_cache_key",
    "safety_identifier",
];

/// Fields not served yet that are accepted at the value that leaves the answer as it is.
fn neutral(field: &str, value: &Value, body: &Value) -> bool {
    let no_tools = body
        .get("tools")
        .is_none_or(|t| t.as_array().is_some_and(Vec::is_empty));
    match field {
        "tools" | "functions" => value.as_array().is_some_and(Vec::is_empty),
        "tool_choice" | "function_call" => {
            no_tools && matches!(value.as_str(), Some("none" | "auto"))
        }
        "parallel_tool_calls" => no_tools,
        "echo" => value == &Value::Bool(false),
        "suffix" => value.as_str().is_some_and(str::is_empty),
        "best_of" => value.as_u64() == Some(1),
        _ => false,
    }
}

/// The keys served inside the fields that hold objects, by path from the body (`*`: each item
/// of a list); any other key there, not null, is a 400 naming it, as at the top.
const NESTED: &[(&[&str], &[&str])] = &[
    (
        &["messages", "*"],
        &["role", "content", "name", "tool_calls", "tool_call_id"],
    ),
    (&["messages", "*", "content", "*"], &["type", "text"]),
    (
        &["messages", "*", "tool_calls", "*"],
        &["id", "type", "function"],
    ),
    (
        &["messages", "*", "tool_calls", "*", "function"],
        &["name", "arguments"],
    ),
    (&["tools", "*"], &["type", "function"]),
    (
        &["tools", "*", "function"],
        &["name", "description", "parameters", "strict"],
    ),
    (&["tool_choice"], &["type", "function"]),
    (&["tool_choice", "function"], &["name"]),
    (&["response_format"], &["type", "json_schema"]),
    (
        &["response_format", "json_schema"],
        &["name", "description", "schema", "strict"],
    ),
    // OpenAI's obfuscation pads streamed chunks; it cannot change the answer.
    (
        &["stream_options"],
        &["include_usage", "include_obfuscation"],
    ),
];

/// Checks every field of `body` against the route's `served` fields: a null is as good as
/// absent; a field kvb does not serve is a 400 naming it unless it cannot change the answer.
/// Keys inside the served objects are checked likewise ([`NESTED`]).
pub fn check(body: &Value, served: &[&str]) -> Result<(), ApiError> {
    let Some(fields) = body.as_object() else {
        return Ok(());
    };
    for (path, keys) in NESTED {
        if served.contains(&path[0]) || SAMPLING.contains(&path[0]) {
            check_nested(&body[path[0]], &path[1..], path[0].to_string(), keys)?;
        }
    }
    for (name, value) in fields {
        let known = served.contains(&name.as_str()) || SAMPLING.contains(&name.as_str());
        if known
            || value.is_null()
            || NO_EFFECT.contains(&name.as_str())
            || neutral(name, value, body)
        {
            continue;
        }
        return Err(ApiError::bad_request(
            format!(
                "`{name}` is not served by kvb and would change the answer; leave it out \
                 (docs/server.md lists the fields served)"
            ),
            Some(name),
        ));
    }
    Ok(())
}

/// Follows `path` from `value` (named `at` so far) and refuses a key of the objects it ends at
/// that is not in `keys` and not null.
fn check_nested(value: &Value, path: &[&str], at: String, keys: &[&str]) -> Result<(), ApiError> {
    match (path.first(), value) {
        (None, Value::Object(fields)) => {
            let unserved = fields
                .iter()
                .find(|(name, v)| !keys.contains(&name.as_str()) && !v.is_null());
            if let Some((name, _)) = unserved {
                let param = format!("{at}.{name}");
                return Err(ApiError::bad_request(
                    format!(
                        "`{param}` is not served by kvb and would change the answer; leave it \
                         out (docs/server.md lists the fields served)"
                    ),
                    Some(&param),
                ));
            }
            Ok(())
        }
        (Some(&"*"), Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                check_nested(item, &path[1..], format!("{at}[{i}]"), keys)?;
            }
            Ok(())
        }
        (Some(&key), Value::Object(fields)) if key != "*" => match fields.get(key) {
            Some(v) => check_nested(v, &path[1..], format!("{at}.{key}"), keys),
            None => Ok(()),
        },
        // Another shape (a string `tool_choice`, text content) has no keys to check; a wrong
        // type is the parser's 400.
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn refused(body: Value) -> Option<String> {
        check(&body, CHAT).err().and_then(|e| e.param)
    }

    #[test]
    fn unserved_fields_are_named_and_harmless_ones_pass() {
        let ok = json!({"model": "m", "messages": [], "user": "u", "metadata": {"a": "b"},
            "store": false, "temperature": 0, "logit_bias": {"5": 1}, "tools": [],
            "tool_choice": "auto", "response_format": {"type": "json_object"}, "suffix": null});
        assert_eq!(refused(ok), None);
        for (field, value) in [
            ("functions", json!([{"name": "f", "parameters": {}}])),
            ("reasoning_effort", json!("high")),
            ("chat_template_kwargs", json!({})),
            ("echo", json!(true)),
        ] {
            let mut body = json!({"model": "m", "messages": []});
            body[field] = value;
            assert_eq!(refused(body), Some(field.to_string()), "{field}");
        }
        // The legacy function call means something once tools are given.
        let forced = json!({"model": "m", "messages": [], "tools": [{"type": "function"}],
            "function_call": "none"});
        assert!(!neutral("function_call", &forced["function_call"], &forced));
        assert!(refused(forced).is_some());
        // Tools are served on chat, not on completions.
        let body = json!({"model": "m", "prompt": "x", "tools": []});
        assert!(check(&body, COMPLETION).is_ok(), "an empty list is neutral");
        // Keys inside what is served are checked too, named by their path; nulls pass.
        for (body, param) in [
            (
                json!({"model": "m", "messages": [{"role": "user", "content": "x"},
                    {"role": "user", "content": "y", "audio": {"id": "a"}}]}),
                "messages[1].audio",
            ),
            (
                json!({"model": "m", "messages": [{"role": "user", "content":
                    [{"type": "text", "text": "x", "cache_control": {"type": "ephemeral"}}]}]}),
                "messages[0].content[0].cache_control",
            ),
            (
                json!({"model": "m", "messages": [{"role": "assistant", "content": null,
                    "tool_calls": [{"id": "c", "type": "function",
                        "function": {"name": "f", "arguments": "{}", "extra": 1}}]}]}),
                "messages[0].tool_calls[0].function.extra",
            ),
            (
                json!({"model": "m", "messages": [], "tools": [{"type": "function",
                    "function": {"name": "f"}, "cache": true}]}),
                "tools[0].cache",
            ),
            (
                json!({"model": "m", "messages": [], "response_format": {"type": "json_schema",
                    "json_schema": {"name": "n", "schema": {}, "examples": []}}}),
                "response_format.json_schema.examples",
            ),
            (
                json!({"model": "m", "messages": [], "stream_options": {"continuous": true}}),
                "stream_options.continuous",
            ),
        ] {
            assert_eq!(refused(body), Some(param.to_string()), "{param}");
        }
        let ok = json!({"model": "m", "messages": [{"role": "user", "content": "x",
            "name": "ann", "refusal": null}, {"role": "assistant", "content": null,
            "tool_calls": [{"id": "c", "type": "function",
                "function": {"name": "f", "arguments": "{}"}}]}],
            "tools": [{"type": "function", "function": {"name": "f", "strict": true}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}},
            "stream_options": {"include_usage": true, "include_obfuscation": false}});
        assert_eq!(refused(ok), None);
        // Chat fields are not completion fields.
        let body = json!({"model": "m", "prompt": "x", "top_logprobs": 2});
        assert_eq!(
            check(&body, COMPLETION).err().and_then(|e| e.param),
            Some("top_logprobs".to_string())
        );
    }
}
