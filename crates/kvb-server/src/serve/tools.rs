//! Tool calling in one generic format, whatever the model's chat template: the request's
//! functions are described in a system message, each call is a JSON object `{"name": ...,
//! "arguments": {...}}` between `<tool_call>` and `</tool_call>` lines (calls in the history are
//! written the same way, tool results as `<tool_response>` user turns), a forced call
//! (`required` or a named function) is constrained to its function's schema, and the answer's
//! calls are read back into OpenAI's `tool_calls`.

use super::api::{ChatCompletionRequest, FunctionCall, FunctionDef, ResponseFormat, ToolChoice};
use super::error::ApiError;
use kvb_engine::Grammar;
use kvb_model::ChatMessage;
use serde_json::{json, Value};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// Which calls an answer may or must make.
#[derive(Debug, Clone, PartialEq)]
pub enum Choice {
    /// The model decides: text, calls, or both.
    Auto,
    /// At least one call, to any of the functions.
    Required,
    /// One call, to this function (an index into the functions).
    Named(usize),
}

/// A request's tools, when it offers any and does not say `none`.
#[derive(Debug, Clone)]
pub struct Tools {
    functions: Vec<FunctionDef>,
    choice: Choice,
    parallel: bool,
}

/// A call read back from an answer.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedCall {
    /// The function's name.
    pub name: String,
    /// Its arguments, as JSON text.
    pub arguments: String,
}

fn bad(message: impl Into<String>, param: &str) -> ApiError {
    ApiError::bad_request(message, Some(param))
}

/// The tools of `req`, checked: `None` when it has none or asks for `none`.
pub fn tools_of(req: &ChatCompletionRequest) -> Result<Option<Tools>, ApiError> {
    let functions: Vec<FunctionDef> = match &req.tools {
        None => Vec::new(),
        Some(tools) => {
            let mut functions = Vec::with_capacity(tools.len());
            for (i, t) in tools.iter().enumerate() {
                if t.kind != "function" {
                    return Err(bad(
                        "only `function` tools are served",
                        &format!("tools[{i}].type"),
                    ));
                }
                let f = &t.function;
                let name_ok = !f.name.is_empty()
                    && f.name.len() <= 64
                    && f.name
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                if !name_ok || functions.iter().any(|g: &FunctionDef| g.name == f.name) {
                    return Err(bad(
                        "a function name is 1-64 letters, digits, `_` or `-`, unique among the tools",
                        &format!("tools[{i}].function.name"),
                    ));
                }
                if f.parameters.as_ref().is_some_and(|p| !p.is_object()) {
                    return Err(bad(
                        "`parameters` is a JSON Schema object",
                        &format!("tools[{i}].function.parameters"),
                    ));
                }
                functions.push(f.clone());
            }
            functions
        }
    };
    let choice = match &req.tool_choice {
        None => Choice::Auto,
        Some(ToolChoice::Mode(m)) => match m.as_str() {
            "none" => return Ok(None),
            "auto" => Choice::Auto,
            "required" => Choice::Required,
            _ => {
                return Err(bad(
                    "`tool_choice` is none, auto, required or a function",
                    "tool_choice",
                ))
            }
        },
        Some(ToolChoice::Named { kind, function }) => {
            let i = functions.iter().position(|f| f.name == function.name);
            match (kind.as_str(), i) {
                ("function", Some(i)) => Choice::Named(i),
                _ => {
                    return Err(bad(
                        format!(
                            "`tool_choice` names `{}`, which is not among the tools",
                            function.name
                        ),
                        "tool_choice",
                    ))
                }
            }
        }
    };
    if functions.is_empty() {
        return match choice {
            Choice::Auto => Ok(None),
            _ => Err(bad("`tool_choice` needs `tools`", "tool_choice")),
        };
    }
    if req
        .sampling
        .response_format
        .as_ref()
        .is_some_and(|f| !matches!(f, ResponseFormat::Text))
    {
        return Err(bad(
            "`response_format` and `tools` cannot be combined (tool calls have their own format)",
            "response_format",
        ));
    }
    if req.logprobs {
        return Err(bad("`logprobs` is not served with `tools`", "logprobs"));
    }
    Ok(Some(Tools {
        functions,
        choice,
        parallel: req.parallel_tool_calls.unwrap_or(true),
    }))
}

/// A call as the format writes it.
pub fn call_text(name: &str, arguments: &str) -> String {
    // Arguments that are not JSON (a client's history) are kept as a string.
    let arguments: Value =
        serde_json::from_str(arguments).unwrap_or_else(|_| Value::String(arguments.into()));
    format!(
        "{OPEN}\n{}\n{CLOSE}",
        json!({"name": name, "arguments": arguments})
    )
}

/// A tool result as the format writes it (a user turn).
pub fn response_text(content: &str) -> String {
    format!("<tool_response>\n{content}\n</tool_response>")
}

/// The schema of one call of `f`: its name, then its arguments.
fn call_schema(f: &FunctionDef) -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"const": f.name},
            "arguments": f.parameters.clone().unwrap_or_else(|| json!({"type": "object"})),
        },
        "required": ["name", "arguments"],
        "additionalProperties": false,
    })
}

impl Tools {
    /// Whether the answer must be calls only (constrained).
    pub fn forced(&self) -> bool {
        self.choice != Choice::Auto
    }

    /// The system text that describes the functions and the format.
    fn description(&self) -> String {
        let mut s = String::from("Functions you can call (name, use, arguments' JSON Schema):\n");
        for f in &self.functions {
            s += &serde_json::to_string(f).unwrap_or_default();
            s.push('\n');
        }
        s += &format!(
            "To call one, write {OPEN}, then {{\"name\": ..., \"arguments\": {{...}}}}, then \
             {CLOSE}, each on its own line."
        );
        if self.parallel {
            s += " Several calls go one after another.";
        }
        match self.choice {
            Choice::Auto => s += " Call a function only when it helps; otherwise answer in text.",
            Choice::Required => s += " Answer with calls only.",
            Choice::Named(i) => {
                s += &format!(" Answer with one call of {}.", self.functions[i].name)
            }
        }
        s
    }

    /// `messages` with the functions described: in the first system message, or in a new one
    /// before the rest.
    pub fn prompt(&self, mut messages: Vec<ChatMessage>) -> Vec<ChatMessage> {
        let description = self.description();
        match messages.first_mut() {
            Some(m) if m.role == "system" => {
                m.content = format!("{}\n\n{description}", m.content);
            }
            _ => messages.insert(0, ChatMessage::new("system", description)),
        }
        messages
    }

    /// For a forced choice, the grammar of the answer: calls in the format, each constrained
    /// to its function's schema (one call unless parallel calls are allowed).
    pub fn grammar(&self) -> Option<Grammar> {
        let functions: Vec<&FunctionDef> = match self.choice {
            Choice::Auto => return None,
            Choice::Required => self.functions.iter().collect(),
            Choice::Named(i) => vec![&self.functions[i]],
        };
        let several = self.parallel && self.choice == Choice::Required;
        let mut lark = String::from(if several {
            "start: call (\"\\n\" call)*\n"
        } else {
            "start: call\n"
        });
        let names: Vec<String> = (0..functions.len()).map(|i| format!("fn{i}")).collect();
        lark += &format!(
            "call: \"{OPEN}\\n\" ({}) \"\\n{CLOSE}\"\n",
            names.join(" | ")
        );
        for (name, f) in names.iter().zip(&functions) {
            let mut schema = call_schema(f);
            schema["x-guidance"] = kvb_engine::json_layout();
            lark += &format!("{name}: %json {schema}\n");
        }
        Some(Grammar::Lark(lark))
    }

    /// The calls in `text`, with the text before the first; `None` when it makes none, or
    /// when any is not a well-formed call of one of the functions (then it is all text).
    pub fn parse(&self, text: &str) -> Option<(Option<String>, Vec<ParsedCall>)> {
        let start = text.find(OPEN)?;
        let mut calls = Vec::new();
        let mut rest = &text[start..];
        while let Some(after) = rest.strip_prefix(OPEN) {
            let end = after.find(CLOSE).unwrap_or(after.len());
            let v: Value = serde_json::from_str(after[..end].trim()).ok()?;
            let name = v.get("name")?.as_str()?;
            if !self.functions.iter().any(|f| f.name == name) {
                return None;
            }
            let arguments = match v.get("arguments")? {
                Value::String(s) => s.clone(),
                a @ Value::Object(_) => a.to_string(),
                _ => return None,
            };
            calls.push(ParsedCall {
                name: name.to_string(),
                arguments,
            });
            rest = after[end..].strip_prefix(CLOSE).unwrap_or("").trim_start();
        }
        if !rest.is_empty() {
            return None;
        }
        let before = text[..start].trim();
        Some(((!before.is_empty()).then(|| before.to_string()), calls))
    }
}

impl From<ParsedCall> for FunctionCall {
    fn from(c: ParsedCall) -> Self {
        FunctionCall {
            name: c.name,
            arguments: c.arguments,
        }
    }
}

/// A streamed answer's text with tools offered: text goes out as it comes until a call may
/// be starting; from there on it is held, to be read as calls at the end.
#[derive(Debug, Default)]
pub struct ToolStream {
    text: String,
    /// Bytes of `text` sent as content.
    sent: usize,
    /// A call has started (or the answer must be calls): nothing more goes out as content.
    holding: bool,
}

impl ToolStream {
    /// A stream; a forced answer holds everything.
    pub fn new(forced: bool) -> Self {
        ToolStream {
            holding: forced,
            ..Default::default()
        }
    }

    /// Takes the next piece of text; returns what can go out as content now.
    pub fn push(&mut self, piece: &str) -> String {
        self.text.push_str(piece);
        if self.holding {
            return String::new();
        }
        let unsent = &self.text[self.sent..];
        let until = match unsent.find(OPEN) {
            Some(i) => {
                self.holding = true;
                i
            }
            // Hold back an end that may be the start of the tag.
            None => (1..OPEN.len())
                .rev()
                .find(|&k| unsent.ends_with(&OPEN[..k]))
                .map_or(unsent.len(), |k| unsent.len() - k),
        };
        let out = unsent[..until].to_string();
        self.sent += until;
        out
    }

    /// At the end: the answer's calls (and nothing more to send), or the text held back.
    pub fn finish(self, tools: &Tools) -> Result<Vec<ParsedCall>, String> {
        match tools.parse(&self.text) {
            Some((_, calls)) => Ok(calls),
            None => Err(self.text[self.sent..].to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tools(choice: Choice, parallel: bool) -> Tools {
        let f = |name: &str| FunctionDef {
            name: name.into(),
            description: Some(format!("{name} things")),
            parameters: Some(json!({"type": "object", "properties": {"x": {"type": "integer"}}})),
            strict: None,
        };
        Tools {
            functions: vec![f("get_weather"), f("add")],
            choice,
            parallel,
        }
    }

    #[test]
    fn calls_are_read_back_and_anything_else_is_text() {
        let t = tools(Choice::Auto, true);
        let text = format!(
            "Let me check.\n{}\n{}",
            call_text("get_weather", r#"{"x": 1}"#),
            call_text("add", r#"{"x": 2}"#)
        );
        let (before, calls) = t.parse(&text).unwrap();
        assert_eq!(before.as_deref(), Some("Let me check."));
        assert_eq!(
            calls,
            [
                ParsedCall {
                    name: "get_weather".into(),
                    arguments: r#"{"x":1}"#.into()
                },
                ParsedCall {
                    name: "add".into(),
                    arguments: r#"{"x":2}"#.into()
                },
            ]
        );
        assert_eq!(t.parse("no calls here"), None);
        assert_eq!(
            t.parse(&call_text("unknown", "{}")),
            None,
            "not a function offered"
        );
        assert_eq!(
            t.parse("<tool_call>\n{\"name\": \"add\"\n"),
            None,
            "cut short"
        );
        assert_eq!(
            t.parse(&format!("{} and more", call_text("add", "{}"))),
            None
        );
    }

    #[test]
    fn a_stream_sends_text_until_a_call_may_start() {
        let t = tools(Choice::Auto, true);
        let mut s = ToolStream::new(false);
        let call = call_text("add", r#"{"x": 3}"#);
        let mut sent = String::new();
        for piece in [
            "Sure",
            ", one moment <",
            "tool",
            "_call>",
            &call["<tool_call>".len()..],
        ] {
            sent += &s.push(piece);
        }
        assert_eq!(sent, "Sure, one moment ");
        assert_eq!(s.finish(&t).unwrap()[0].name, "add");
        // A `<` that starts no tag goes out once the next piece shows it.
        let mut s = ToolStream::new(false);
        assert_eq!(s.push("a <"), "a ");
        assert_eq!(s.push("b"), "<b");
        assert_eq!(s.finish(&t), Err(String::new()));
        let mut forced = ToolStream::new(true);
        assert_eq!(forced.push("<tool_call>"), "");
    }

    #[test]
    fn forced_choices_have_a_grammar_of_calls() {
        assert!(tools(Choice::Auto, true).grammar().is_none());
        let Some(Grammar::Lark(one)) = tools(Choice::Named(1), true).grammar() else {
            panic!()
        };
        assert!(
            one.starts_with("start: call\n")
                && one.contains("\"add\"")
                && !one.contains("get_weather"),
            "{one}"
        );
        let Some(Grammar::Lark(many)) = tools(Choice::Required, true).grammar() else {
            panic!()
        };
        assert!(
            many.contains("call (\"\\n\" call)*") && many.contains("fn1"),
            "{many}"
        );
    }

    #[test]
    fn the_description_lands_in_the_system_message() {
        let t = tools(Choice::Required, false);
        let m = t.prompt(vec![ChatMessage::new("user", "hi")]);
        assert_eq!(m[0].role, "system");
        assert!(m[0].content.contains("get_weather") && m[0].content.contains("calls only"));
        let m = t.prompt(vec![
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "hi"),
        ]);
        assert_eq!(m.len(), 2);
        assert!(m[0].content.starts_with("Be brief.\n\n"));
    }
}
