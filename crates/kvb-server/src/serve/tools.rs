//! Tool calling. Where the model's chat template has a tools section that writes calls in a
//! format read here, the template describes the tools and writes the history's calls and
//! results ([`ToolFormat::Tagged`]: `<tool_call>` JSON lines, as Qwen2.5 and Hermes;
//! [`ToolFormat::Json`]: the answer is one JSON call, as Llama 3.1). Otherwise kvb's generic
//! format: the functions are described in a system message, each call is a JSON object
//! `{"name": ..., "arguments": {...}}` between `<tool_call>` and `</tool_call>` lines (calls in
//! the history are written the same way, tool results as `<tool_response>` user turns). A
//! forced call (`required` or a named function) is constrained to its function's schema, and
//! the answer's calls are read back into OpenAI's `tool_calls`.

use super::api::{
    ChatCompletionRequest, FunctionCall, FunctionDef, ResponseFormat, ToolChoice, ToolDef,
};
use super::error::ApiError;
use kvb_engine::Grammar;
use kvb_model::{ChatMessage, Tokenizer};
use serde_json::{json, Value};

const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

/// How the model's chat template writes tools and calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// No tools section kvb can read: kvb's own format, described in a system message.
    Generic,
    /// The template's tools section; calls `<tool_call>{"name", "arguments"}</tool_call>`.
    Tagged,
    /// The template's tools section; a call is the whole answer, `{"name", "parameters"}`.
    Json,
}

impl ToolFormat {
    /// The format of `tokenizer`'s chat template: its own where it reads `tools` and writes
    /// calls in a format known here.
    pub fn of(tokenizer: &Tokenizer) -> Self {
        let template = tokenizer.chat_template().unwrap_or("");
        if !tokenizer.chat_template_reads_tools() {
            ToolFormat::Generic
        } else if template.contains(OPEN) {
            ToolFormat::Tagged
        } else if template.contains("<|start_header_id|>") && template.contains("parameters") {
            ToolFormat::Json
        } else {
            ToolFormat::Generic
        }
    }

    /// Whether the chat template writes the tools and the history's calls.
    pub fn native(self) -> bool {
        self != ToolFormat::Generic
    }
}

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
    format: ToolFormat,
}

/// A chat prompt: the messages and the tools given to the chat template (none where the
/// generic format describes them in a message).
#[derive(Debug, Clone, Default)]
pub struct ChatPrompt {
    /// The conversation.
    pub messages: Vec<ChatMessage>,
    /// OpenAI's tool objects, for a template with a tools section.
    pub tools: Vec<Value>,
}

impl ChatPrompt {
    /// The prompt of `messages` with `tools` where the request offers them ([`Tools::prompt`]).
    pub fn new(messages: Vec<ChatMessage>, tools: Option<&Tools>) -> Self {
        match tools {
            Some(t) => t.prompt(messages),
            None => ChatPrompt {
                messages,
                tools: Vec::new(),
            },
        }
    }
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

/// The tools of `req` in `format`, checked: `None` when it has none or asks for `none`.
pub fn tools_of(
    req: &ChatCompletionRequest,
    format: ToolFormat,
) -> Result<Option<Tools>, ApiError> {
    let tools = Tools::new(
        req.tools.as_deref(),
        req.tool_choice.as_ref(),
        req.parallel_tool_calls.unwrap_or(true),
        format,
    )?;
    if tools.is_none() {
        return Ok(None);
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
    Ok(tools)
}

impl Tools {
    /// Tools from a request's fields, checked: `None` when there are none or `choice` is
    /// `none`.
    pub fn new(
        tools: Option<&[ToolDef]>,
        choice: Option<&ToolChoice>,
        parallel: bool,
        format: ToolFormat,
    ) -> Result<Option<Tools>, ApiError> {
        let functions: Vec<FunctionDef> = match tools {
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
        let choice = match choice {
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
        Ok(Some(Tools {
            functions,
            choice,
            // A template whose answer is one JSON call makes one call.
            parallel: parallel && format != ToolFormat::Json,
            format,
        }))
    }
}

/// A call's arguments as JSON; arguments that are not JSON (a client's history) are kept as
/// a string.
fn arguments_value(arguments: &str) -> Value {
    serde_json::from_str(arguments).unwrap_or_else(|_| Value::String(arguments.into()))
}

/// A call as the generic format writes it.
pub fn call_text(name: &str, arguments: &str) -> String {
    format!(
        "{OPEN}\n{}\n{CLOSE}",
        json!({"name": name, "arguments": arguments_value(arguments)})
    )
}

/// A tool result as the generic format writes it (a user turn).
pub fn response_text(content: &str) -> String {
    format!("<tool_response>\n{content}\n</tool_response>")
}

/// A message of the history for the chat template: with a native format, an assistant's
/// calls and a tool result's call id go to the template as they are; with the generic one,
/// calls are written after the content and a tool result becomes a user turn.
pub fn history_message(
    role: &str,
    mut content: String,
    calls: &[super::api::ToolCallIn],
    tool_call_id: Option<&str>,
    format: ToolFormat,
) -> ChatMessage {
    if format.native() {
        let mut m = ChatMessage::new(role, content);
        m.tool_calls = calls
            .iter()
            .map(|c| {
                kvb_model::ChatToolCall::function(
                    c.id.clone(),
                    c.function.name.clone(),
                    arguments_value(&c.function.arguments),
                )
            })
            .collect();
        m.tool_call_id = tool_call_id.map(String::from);
        return m;
    }
    for call in calls {
        if !content.is_empty() {
            content.push('\n');
        }
        content += &call_text(&call.function.name, &call.function.arguments);
    }
    match role {
        "tool" => ChatMessage::new("user", response_text(&content)),
        _ => ChatMessage::new(role, content),
    }
}

/// The schema of one call of `f`: its name, then its arguments (under `key`).
fn call_schema(f: &FunctionDef, key: &str) -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"const": f.name},
            key: f.parameters.clone().unwrap_or_else(|| json!({"type": "object"})),
        },
        "required": ["name", key],
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

    /// The prompt of `messages` with the functions: given to a template with a tools section,
    /// or (generic format) described in the first system message or a new one before the rest.
    pub fn prompt(&self, mut messages: Vec<ChatMessage>) -> ChatPrompt {
        if self.format.native() {
            return ChatPrompt {
                messages,
                tools: self.template_tools(),
            };
        }
        let description = self.description();
        match messages.first_mut() {
            Some(m) if m.role == "system" => {
                m.content = format!("{}\n\n{description}", m.content);
            }
            _ => messages.insert(0, ChatMessage::new("system", description)),
        }
        ChatPrompt {
            messages,
            tools: Vec::new(),
        }
    }

    /// The functions as chat templates read `tools`: OpenAI's tool objects.
    fn template_tools(&self) -> Vec<Value> {
        self.functions
            .iter()
            .map(|f| json!({"type": "function", "function": f}))
            .collect()
    }

    /// For a forced choice, the grammar of the answer: calls in the format, each constrained
    /// to its function's schema (one call unless parallel calls are allowed).
    pub fn grammar(&self) -> Option<Grammar> {
        let functions: Vec<&FunctionDef> = match self.choice {
            Choice::Auto => return None,
            Choice::Required => self.functions.iter().collect(),
            Choice::Named(i) => vec![&self.functions[i]],
        };
        let names: Vec<String> = (0..functions.len()).map(|i| format!("fn{i}")).collect();
        if self.format == ToolFormat::Json {
            let mut lark = format!("start: {}\n", names.join(" | "));
            for (name, f) in names.iter().zip(&functions) {
                let mut schema = call_schema(f, "parameters");
                schema["x-guidance"] = kvb_engine::json_layout();
                lark += &format!("{name}: %json {schema}\n");
            }
            return Some(Grammar::Lark(lark));
        }
        let several = self.parallel && self.choice == Choice::Required;
        let mut lark = String::from(if several {
            "start: call (\"\\n\" call)*\n"
        } else {
            "start: call\n"
        });
        lark += &format!(
            "call: \"{OPEN}\\n\" ({}) \"\\n{CLOSE}\"\n",
            names.join(" | ")
        );
        for (name, f) in names.iter().zip(&functions) {
            let mut schema = call_schema(f, "arguments");
            schema["x-guidance"] = kvb_engine::json_layout();
            lark += &format!("{name}: %json {schema}\n");
        }
        Some(Grammar::Lark(lark))
    }

    /// The call `v` (`{"name", key: {...}}`), when it is one of a function offered.
    fn call_of(&self, v: &Value, key: &str) -> Option<ParsedCall> {
        let name = v.get("name")?.as_str()?;
        if !self.functions.iter().any(|f| f.name == name) {
            return None;
        }
        let arguments = match v.get(key)? {
            Value::String(s) => s.clone(),
            a @ Value::Object(_) => a.to_string(),
            _ => return None,
        };
        Some(ParsedCall {
            name: name.to_string(),
            arguments,
        })
    }

    /// The calls in `text`, with the text before the first; `None` when it makes none, or
    /// when any is not a well-formed call of one of the functions (then it is all text).
    pub fn parse(&self, text: &str) -> Option<(Option<String>, Vec<ParsedCall>)> {
        if self.format == ToolFormat::Json {
            // The whole answer is the call; Llama 3.1 names the arguments `parameters`.
            let v: Value = serde_json::from_str(text.trim()).ok()?;
            let call = self
                .call_of(&v, "parameters")
                .or_else(|| self.call_of(&v, "arguments"))?;
            return Some((None, vec![call]));
        }
        let start = text.find(OPEN)?;
        let mut calls = Vec::new();
        let mut rest = &text[start..];
        while let Some(after) = rest.strip_prefix(OPEN) {
            let end = after.find(CLOSE).unwrap_or(after.len());
            let v: Value = serde_json::from_str(after[..end].trim()).ok()?;
            calls.push(self.call_of(&v, "arguments")?);
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
#[derive(Debug)]
pub struct ToolStream {
    text: String,
    /// Bytes of `text` sent as content.
    sent: usize,
    /// A call has started (or the answer must be calls): nothing more goes out as content.
    holding: bool,
    /// The format: where a call may start.
    format: ToolFormat,
}

impl ToolStream {
    /// A stream of an answer to `tools`; a forced answer holds everything.
    pub fn new(tools: &Tools) -> Self {
        ToolStream {
            text: String::new(),
            sent: 0,
            holding: tools.forced(),
            format: tools.format,
        }
    }

    /// Takes the next piece of text; returns what can go out as content now.
    pub fn push(&mut self, piece: &str) -> String {
        self.text.push_str(piece);
        if self.holding {
            return String::new();
        }
        let unsent = &self.text[self.sent..];
        let (until, holding) = match self.format {
            // A JSON call is the whole answer: held while the answer may still start one.
            ToolFormat::Json => match (self.sent, unsent.trim_start()) {
                (0, "") => (0, false),
                (0, t) if t.starts_with('{') => (0, true),
                _ => (unsent.len(), false),
            },
            _ => match unsent.find(OPEN) {
                Some(i) => (i, true),
                // Hold back an end that may be the start of the tag.
                None => (
                    (1..OPEN.len())
                        .rev()
                        .find(|&k| unsent.ends_with(&OPEN[..k]))
                        .map_or(unsent.len(), |k| unsent.len() - k),
                    false,
                ),
            },
        };
        self.holding = holding;
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
        in_format(choice, parallel, ToolFormat::Generic)
    }

    fn in_format(choice: Choice, parallel: bool, format: ToolFormat) -> Tools {
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
            format,
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
        let mut s = ToolStream::new(&t);
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
        let mut s = ToolStream::new(&t);
        assert_eq!(s.push("a <"), "a ");
        assert_eq!(s.push("b"), "<b");
        assert_eq!(s.finish(&t), Err(String::new()));
        let mut forced = ToolStream::new(&tools(Choice::Required, true));
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
        let p = t.prompt(vec![ChatMessage::new("user", "hi")]);
        let m = &p.messages;
        assert_eq!(m[0].role, "system");
        assert!(m[0].content.contains("get_weather") && m[0].content.contains("calls only"));
        assert!(p.tools.is_empty(), "described, not given to the template");
        let p = t.prompt(vec![
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", "hi"),
        ]);
        assert_eq!(p.messages.len(), 2);
        assert!(p.messages[0].content.starts_with("Be brief.\n\n"));
        // A template with a tools section gets the tools and the messages as they are.
        let native = in_format(Choice::Required, false, ToolFormat::Tagged);
        let p = native.prompt(vec![ChatMessage::new("user", "hi")]);
        assert_eq!(p.messages, [ChatMessage::new("user", "hi")]);
        assert_eq!(p.tools.len(), 2);
        assert_eq!(p.tools[1]["function"]["name"], "add");
        assert_eq!(p.tools[1]["type"], "function");
    }

    /// Llama 3.1's format: the whole answer is one call, its arguments under `parameters`.
    #[test]
    fn a_json_call_is_the_whole_answer() {
        let t = in_format(Choice::Auto, true, ToolFormat::Json);
        let call = r#" {"name": "add", "parameters": {"x": 2}}"#;
        assert_eq!(
            t.parse(call),
            Some((
                None,
                vec![ParsedCall {
                    name: "add".into(),
                    arguments: r#"{"x":2}"#.into()
                }]
            ))
        );
        assert_eq!(t.parse(r#"{"name": "sub", "parameters": {}}"#), None);
        assert_eq!(t.parse(&format!("Sure: {call}")), None, "text first");
        // Streamed: held while it may be a call, sent at once when it cannot be one.
        let mut s = ToolStream::new(&t);
        let sent: String = [" ", call.trim(), ""].iter().map(|p| s.push(p)).collect();
        assert_eq!(sent, "");
        assert_eq!(s.finish(&t).unwrap()[0].name, "add");
        let mut s = ToolStream::new(&t);
        assert_eq!(s.push(" "), "");
        assert_eq!(s.push("It is {sunny}"), " It is {sunny}");
        assert_eq!(s.push(" today"), " today");
        assert_eq!(s.finish(&t), Err(String::new()));
        // Forced: one call, no tags, no parallel calls.
        let Some(Grammar::Lark(one)) =
            in_format(Choice::Required, true, ToolFormat::Json).grammar()
        else {
            panic!()
        };
        assert!(
            one.starts_with("start: fn0 | fn1\n")
                && one.contains("\"parameters\"")
                && !one.contains(OPEN),
            "{one}"
        );
    }

    /// The format follows the template: its own where it reads `tools` and writes a known
    /// call format, kvb's generic one otherwise.
    #[test]
    fn the_format_is_read_from_the_template() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny/llama");
        let base = Tokenizer::from_dir(&dir).unwrap();
        let with = |template: &str| {
            ToolFormat::of(
                &base
                    .clone()
                    .with_chat_template(Some(template.into()), None, None),
            )
        };
        let plain = "{% for m in messages %}{{ m.content }}<tool_call>{% endfor %}";
        assert_eq!(with(plain), ToolFormat::Generic, "no tools section");
        let tagged = "{% if tools %}{{ tools | tojson }}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}Write <tool_call> lines.";
        assert_eq!(with(tagged), ToolFormat::Tagged);
        let json = "{% for m in messages %}<|start_header_id|>{{ m.role }}{% if tools %}{{ tools | tojson }} as {\"name\", \"parameters\"}{% endif %}{% endfor %}";
        assert_eq!(with(json), ToolFormat::Json);
        let other = "{% if tools %}[TOOLS]{{ tools | tojson }}{% endif %}";
        assert_eq!(with(other), ToolFormat::Generic, "an unknown call format");
    }
}
