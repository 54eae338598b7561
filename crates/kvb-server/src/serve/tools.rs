//! Tool calling. Where the model's chat template has a tools section that writes calls in a
//! format read here, the template describes the tools and writes the history's calls and
//! results ([`ToolFormat::Tagged`]: `<tool_call>` JSON lines, as Qwen2.5 and Hermes;
//! [`ToolFormat::Json`]: the answer is one JSON call, as Llama 3.1; [`ToolFormat::Mistral`]:
//! `[TOOL_CALLS]` and a JSON list of calls, as Mistral's v3 and Nemo;
//! [`ToolFormat::MistralNamed`]: `[TOOL_CALLS]name[ARGS]{...}` per call, as Mistral's v11 and
//! later: Small 3.2, Magistral, Devstral). Otherwise kvb's generic
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

pub(super) const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";
/// What opens Mistral's calls: a control token in its vocabulary.
const MISTRAL_CALLS: &str = "[TOOL_CALLS]";
/// What follows a call's name in Mistral's v11 and later (control tokens too).
const MISTRAL_ARGS: &str = "[ARGS]";
const MISTRAL_CALL_ID: &str = "[CALL_ID]";
/// Mistral's templates refuse a call id of another length.
const MISTRAL_ID_LEN: usize = 9;

/// How the model's chat template writes tools and calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    /// No tools section kvb can read: kvb's own format, described in a system message.
    Generic,
    /// The template's tools section; calls `<tool_call>{"name", "arguments"}</tool_call>`.
    Tagged,
    /// The template's tools section; a call is the whole answer, `{"name", "parameters"}`.
    Json,
    /// The template's tools section; the answer is `[TOOL_CALLS]` and a JSON list of calls
    /// `{"name", "arguments"}`. `marker` is that control token's id where the vocabulary has it
    /// (the answer's text then lacks it, as it lacks every control token); without one, the
    /// text itself.
    Mistral { marker: Option<u32> },
    /// The template's tools section; the answer is calls `[TOOL_CALLS]name[ARGS]{...}`, one
    /// after another, with `[CALL_ID]` and a call id of nine letters and digits before
    /// `[ARGS]` where the template writes ids (v11; v13 writes none). The markers are control
    /// tokens where the vocabulary has them, else text.
    MistralNamed(NamedMarkers),
}

/// The control tokens of [`ToolFormat::MistralNamed`]'s markers, where the vocabulary has them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NamedMarkers {
    calls: Option<u32>,
    args: Option<u32>,
    /// `None` where the template writes no call ids; else `[CALL_ID]`'s token, if any.
    call_id: Option<Option<u32>>,
}

/// What the start of an answer whose calls are the whole answer turns out to be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerStart {
    /// Not yet known (more text may make it either).
    Undecided,
    /// Calls.
    Calls,
    /// Text.
    Text,
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
        } else if template.contains(MISTRAL_CALLS) && template.contains(MISTRAL_ARGS) {
            ToolFormat::MistralNamed(NamedMarkers {
                calls: special_token(tokenizer, MISTRAL_CALLS),
                args: special_token(tokenizer, MISTRAL_ARGS),
                call_id: template
                    .contains(MISTRAL_CALL_ID)
                    .then(|| special_token(tokenizer, MISTRAL_CALL_ID)),
            })
        } else if template.contains(MISTRAL_CALLS) {
            ToolFormat::Mistral {
                marker: special_token(tokenizer, MISTRAL_CALLS),
            }
        } else {
            ToolFormat::Generic
        }
    }

    /// Whether the chat template writes the tools and the history's calls.
    pub fn native(self) -> bool {
        self != ToolFormat::Generic
    }
}

/// The id of the special (control) token written `text`, if the vocabulary has one.
fn special_token(tokenizer: &Tokenizer, text: &str) -> Option<u32> {
    tokenizer
        .inner()
        .get_added_tokens_decoder()
        .into_iter()
        .find(|(_, t)| t.special && t.content == text)
        .map(|(id, _)| id)
}

/// A call id as Mistral's templates take it: nine letters and digits, the same for the same
/// id (the prompt of a conversation stays the same from turn to turn, so its blocks are reused).
fn mistral_id(id: &str) -> String {
    if id.len() == MISTRAL_ID_LEN && id.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return id.to_string();
    }
    const DIGITS: &[u8] = b"0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ";
    // FNV-1a: stable across builds and platforms, unlike std's hasher.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in id.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    (0..MISTRAL_ID_LEN)
        .map(|_| {
            let d = DIGITS[(h % DIGITS.len() as u64) as usize] as char;
            h /= DIGITS.len() as u64;
            d
        })
        .collect()
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
    /// The call id the model wrote (Mistral v11's); else the server names the call.
    pub id: Option<String>,
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
        let id = |id: &str| match format {
            ToolFormat::Mistral { .. } | ToolFormat::MistralNamed(_) => mistral_id(id),
            _ => id.to_string(),
        };
        let mut m = ChatMessage::new(role, content);
        m.tool_calls = calls
            .iter()
            .map(|c| {
                kvb_model::ChatToolCall::function(
                    c.id.as_deref().map(id),
                    c.function.name.clone(),
                    arguments_value(&c.function.arguments),
                )
            })
            .collect();
        m.tool_call_id = tool_call_id.map(id);
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

    /// The grammar of the answer: calls in the format, each constrained to its function's
    /// schema (one call unless parallel calls are allowed). A forced choice is calls only; with
    /// `auto` the answer is free text or, once it starts a call, calls: its text cannot hold a
    /// call's opening (a `{` first, in the JSON format), so a call is never left unconstrained.
    pub fn grammar(&self) -> Grammar {
        let functions: Vec<&FunctionDef> = match self.choice {
            Choice::Auto | Choice::Required => self.functions.iter().collect(),
            Choice::Named(i) => vec![&self.functions[i]],
        };
        let names: Vec<String> = (0..functions.len()).map(|i| format!("fn{i}")).collect();
        // Several calls where parallel calls are allowed and no one function is named.
        let several = self.parallel && !matches!(self.choice, Choice::Named(_));
        if let ToolFormat::MistralNamed(markers) = self.format {
            return Grammar::Lark(self.named_grammar(markers, &functions, &names, several));
        }
        let (key, mut lark) = match (self.format, &self.choice) {
            // Llama 3.1's: one call, the whole answer.
            (ToolFormat::Json, Choice::Auto) => (
                "parameters",
                format!(
                    "start: TEXT | {}\nTEXT: /\\s*[^{{\\s](.|\\n)*/\n",
                    names.join(" | ")
                ),
            ),
            (ToolFormat::Json, _) => ("parameters", format!("start: {}\n", names.join(" | "))),
            // Mistral's: the marker, then one list of calls, the whole answer.
            (ToolFormat::Mistral { marker }, choice) => {
                let open = match marker {
                    Some(id) => format!("<[{id}]>"),
                    None => format!("\"{MISTRAL_CALLS}\""),
                };
                let calls = match several {
                    true => "call (\", \" call)*",
                    false => "call",
                };
                let start = match choice {
                    Choice::Auto => "start: TEXT | calls\nTEXT: /\\s*[^\\[\\s](.|\\n)*/\n",
                    _ => "start: calls\n",
                };
                // v3 writes a space before the list, Nemo none.
                let lark = format!(
                    "{start}calls: {open} \" \"? \"[\" {calls} \"]\"\ncall: {}\n",
                    names.join(" | ")
                );
                ("arguments", lark)
            }
            (_, choice) => {
                let calls = if several {
                    "call (\"\\n\" call)*"
                } else {
                    "call"
                };
                let start = match choice {
                    Choice::Auto => format!(
                        "start: TEXT ({calls})?\nTEXT: /(.|\\n)*/ & ~/(.|\\n)*{OPEN}(.|\\n)*/\n"
                    ),
                    _ => format!("start: {calls}\n"),
                };
                let call = format!(
                    "call: \"{OPEN}\\n\" ({}) \"\\n{CLOSE}\"\n",
                    names.join(" | ")
                );
                ("arguments", start + &call)
            }
        };
        for (name, f) in names.iter().zip(&functions) {
            let schema = kvb_engine::lark_json_schema(call_schema(f, key));
            lark += &format!("{name}: %json {schema}\n");
        }
        Grammar::Lark(lark)
    }

    /// [`Self::grammar`] for [`ToolFormat::MistralNamed`]: calls one after another, each its
    /// marker, the function's name, a call id where the template writes them, and the
    /// arguments; with `auto`, text that cannot be read as calls ([`Self::named_call`]).
    fn named_grammar(
        &self,
        markers: NamedMarkers,
        functions: &[&FunctionDef],
        rules: &[String],
        several: bool,
    ) -> String {
        let marker = |token: Option<u32>, text: &str| match token {
            Some(id) => format!("<[{id}]>"),
            None => format!("\"{text}\""),
        };
        let id = match markers.call_id {
            Some(token) => format!(
                " {} /[a-zA-Z0-9]{{{MISTRAL_ID_LEN}}}/",
                marker(token, MISTRAL_CALL_ID)
            ),
            None => String::new(),
        };
        let (open, args) = (
            marker(markers.calls, MISTRAL_CALLS),
            marker(markers.args, MISTRAL_ARGS),
        );
        let names: Vec<&str> = functions.iter().map(|f| f.name.as_str()).collect();
        let calls = if several { "call+" } else { "call" };
        // `auto`'s text: not what `named_start` reads as calls (the marker, a name then `[`, `{`).
        let mut lark = match self.choice {
            Choice::Auto => format!(
                "start: TEXT | {calls}\nTEXT: /(.|\\n)*/ & ~/\\s*(\\[TOOL_CALLS\\]|({})[a-zA-Z0-9]*[\\[{{])(.|\\n)*/\n",
                names.join("|")
            ),
            _ => format!("start: {calls}\n"),
        };
        lark += &format!("call: {}\n", rules.join(" | "));
        for (i, f) in functions.iter().enumerate() {
            let schema = kvb_engine::lark_json_schema(
                f.parameters
                    .clone()
                    .unwrap_or_else(|| json!({"type": "object"})),
            );
            lark += &format!(
                "fn{i}: {open} \"{}\"{id} {args} args{i}\nargs{i}: %json {schema}\n",
                f.name
            );
        }
        lark
    }

    /// What an answer starting `text` (its leading whitespace removed) is, where calls are the
    /// whole answer; `None` in the formats whose calls follow text.
    pub fn whole_answer_start(&self, text: &str) -> Option<AnswerStart> {
        let first = |opening: char| match text.chars().next() {
            None => AnswerStart::Undecided,
            Some(c) if c == opening => AnswerStart::Calls,
            Some(_) => AnswerStart::Text,
        };
        match self.format {
            ToolFormat::Json => Some(first('{')),
            ToolFormat::Mistral { .. } => Some(first('[')),
            ToolFormat::MistralNamed(_) => Some(self.named_start(text)),
            ToolFormat::Generic | ToolFormat::Tagged => None,
        }
    }

    /// [`Self::whole_answer_start`] for [`ToolFormat::MistralNamed`]: calls open with the
    /// marker's text, or (the marker a control token, left out of the text) with a function's
    /// name, letters or digits (a call id), then `[` or `{`: what `auto`'s text cannot start with.
    fn named_start(&self, text: &str) -> AnswerStart {
        if text.starts_with(MISTRAL_CALLS) {
            return AnswerStart::Calls;
        }
        if MISTRAL_CALLS.starts_with(text) {
            return AnswerStart::Undecided;
        }
        let mut start = AnswerStart::Text;
        for f in &self.functions {
            let Some(rest) = text.strip_prefix(f.name.as_str()) else {
                if f.name.starts_with(text) {
                    start = AnswerStart::Undecided;
                }
                continue;
            };
            let rest = rest.trim_start_matches(|c: char| c.is_ascii_alphanumeric());
            match rest.chars().next() {
                Some('[' | '{') => return AnswerStart::Calls,
                None => start = AnswerStart::Undecided,
                Some(_) => {}
            }
        }
        start
    }

    /// The function a [`ToolFormat::MistralNamed`] call names, and the call id the model wrote
    /// where the template writes ids, from `head`: what comes before its arguments' `{` (after
    /// the previous call), with its markers where they are text; `None` unless it names a
    /// function offered.
    pub(super) fn named_call(&self, head: &str) -> Option<(String, Option<String>)> {
        let head = head.trim_start();
        let head = head.strip_prefix(MISTRAL_CALLS).unwrap_or(head);
        let head = head.strip_suffix(MISTRAL_ARGS).unwrap_or(head);
        let (name, id) = match (head.split_once(MISTRAL_CALL_ID), self.format) {
            (Some((name, id)), _) => (name, Some(id)),
            // The id's marker is a control token, left out of the text: the id follows the name.
            (
                None,
                ToolFormat::MistralNamed(NamedMarkers {
                    call_id: Some(Some(_)),
                    ..
                }),
            ) => {
                let at = head.len().checked_sub(MISTRAL_ID_LEN)?;
                (head.get(..at)?, head.get(at..))
            }
            (None, _) => (head, None),
        };
        self.offers(name)
            .then(|| (name.to_string(), id.map(str::to_string)))
    }

    /// Whether `name` is a function offered.
    pub fn offers(&self, name: &str) -> bool {
        self.functions.iter().any(|f| f.name == name)
    }

    /// How calls are written.
    pub fn format(&self) -> ToolFormat {
        self.format
    }

    /// The call written in `json` (`{"name", key: {...}}`), when it is one of a function
    /// offered; its arguments as written (an object's text), or a string's value.
    fn call_of(&self, json: &str, keys: &[&str]) -> Option<ParsedCall> {
        use serde_json::value::RawValue;
        let fields: std::collections::HashMap<String, &RawValue> =
            serde_json::from_str(json).ok()?;
        let name: String = serde_json::from_str(fields.get("name")?.get()).ok()?;
        if !self.offers(&name) {
            return None;
        }
        // Valid JSON with no space around it: its first byte tells an object from a string.
        let raw = keys.iter().find_map(|k| fields.get(*k))?.get();
        let arguments = match raw.as_bytes().first() {
            Some(b'{') => raw.to_string(),
            Some(b'"') => serde_json::from_str::<String>(raw).ok()?,
            _ => return None,
        };
        Some(ParsedCall {
            name,
            arguments,
            id: None,
        })
    }

    /// The calls in `text`, with the text before the first; `None` when it makes none, or
    /// when any is not a well-formed call of one of the functions (then it is all text).
    pub fn parse(&self, text: &str) -> Option<(Option<String>, Vec<ParsedCall>)> {
        match self.format {
            ToolFormat::Json => {
                // The whole answer is the call; Llama 3.1 names the arguments `parameters`.
                let call = self.call_of(text.trim(), &["parameters", "arguments"])?;
                return Some((None, vec![call]));
            }
            ToolFormat::Mistral { .. } => {
                // The whole answer is the list; its marker is in the text only where the
                // vocabulary has no such control token.
                let text = text.trim_start();
                let list = text.strip_prefix(MISTRAL_CALLS).unwrap_or(text);
                let items: Vec<&serde_json::value::RawValue> =
                    serde_json::from_str(list.trim()).ok()?;
                let calls = items
                    .iter()
                    .map(|c| self.call_of(c.get(), &["arguments"]))
                    .collect::<Option<Vec<_>>>()?;
                return (!calls.is_empty()).then_some((None, calls));
            }
            ToolFormat::MistralNamed(_) => {
                // Calls one after another, the whole answer: a name, then its arguments.
                let mut calls = Vec::new();
                let mut rest = text.trim_start();
                while !rest.is_empty() {
                    let open = rest.find('{')?;
                    let (name, id) = self.named_call(&rest[..open])?;
                    let mut values = serde_json::Deserializer::from_str(&rest[open..])
                        .into_iter::<&serde_json::value::RawValue>();
                    let arguments = values.next()?.ok()?.get().to_string();
                    rest = rest[open + values.byte_offset()..].trim_start();
                    calls.push(ParsedCall {
                        name,
                        arguments,
                        id,
                    });
                }
                return (!calls.is_empty()).then_some((None, calls));
            }
            ToolFormat::Generic | ToolFormat::Tagged => {}
        }
        let start = text.find(OPEN)?;
        let mut calls = Vec::new();
        let mut rest = &text[start..];
        while let Some(after) = rest.strip_prefix(OPEN) {
            let end = after.find(CLOSE).unwrap_or(after.len());
            calls.push(self.call_of(after[..end].trim(), &["arguments"])?);
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

#[cfg(test)]
impl NamedMarkers {
    /// Markers for tests: `[TOOL_CALLS]` token 5 and `[ARGS]` token 6 (`tokens`), else text;
    /// call ids after `[CALL_ID]` (token 7 with `tokens`) where `ids`.
    pub(crate) fn for_tests(tokens: bool, ids: bool) -> Self {
        let token = |id| tokens.then_some(id);
        NamedMarkers {
            calls: token(5),
            args: token(6),
            call_id: ids.then(|| token(7)),
        }
    }
}

#[cfg(test)]
impl Tools {
    /// Tools for tests: `get_weather` and `add`, each of an integer `x`.
    pub(crate) fn two_functions(choice: Choice, parallel: bool, format: ToolFormat) -> Tools {
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
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The call of `name` with `arguments` as read back.
    fn call(name: &str, arguments: &str) -> ParsedCall {
        ParsedCall {
            name: name.into(),
            arguments: arguments.into(),
            id: None,
        }
    }

    fn tools(choice: Choice, parallel: bool) -> Tools {
        in_format(choice, parallel, ToolFormat::Generic)
    }

    fn in_format(choice: Choice, parallel: bool, format: ToolFormat) -> Tools {
        Tools::two_functions(choice, parallel, format)
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
            [call("get_weather", r#"{"x":1}"#), call("add", r#"{"x":2}"#)]
        );
        // Arguments written as a JSON string are that string; any other value is no call.
        let quoted =
            "<tool_call>\n{\"name\": \"add\", \"arguments\": \"{\\\"x\\\": 1}\"}\n</tool_call>";
        assert_eq!(t.parse(quoted).unwrap().1[0].arguments, r#"{"x": 1}"#);
        let number = "<tool_call>\n{\"name\": \"add\", \"arguments\": 5}\n</tool_call>";
        assert_eq!(t.parse(number), None);
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
    fn every_choice_has_a_grammar_of_calls() {
        let Grammar::Lark(one) = tools(Choice::Named(1), true).grammar() else {
            panic!()
        };
        assert!(
            one.starts_with("start: call\n")
                && one.contains("\"add\"")
                && !one.contains("get_weather"),
            "{one}"
        );
        let Grammar::Lark(many) = tools(Choice::Required, true).grammar() else {
            panic!()
        };
        assert!(
            many.starts_with("start: call (\"\\n\" call)*\n") && many.contains("fn1"),
            "{many}"
        );
        // `auto`: text that holds no call's opening, then calls or nothing.
        let Grammar::Lark(auto) = tools(Choice::Auto, false).grammar() else {
            panic!()
        };
        assert!(
            auto.starts_with("start: TEXT (call)?\n") && auto.contains("& ~/(.|\\n)*<tool_call>"),
            "{auto}"
        );
    }

    /// Arguments' schemas that say nothing of other keys get none in every format: left open,
    /// a small model invents keys until its tokens run out.
    #[test]
    fn every_format_closes_the_arguments_schema() {
        for format in [
            ToolFormat::Generic,
            ToolFormat::Tagged,
            ToolFormat::Json,
            ToolFormat::Mistral { marker: Some(5) },
            ToolFormat::MistralNamed(NamedMarkers::for_tests(true, true)),
        ] {
            let Grammar::Lark(lark) = in_format(Choice::Required, true, format).grammar() else {
                panic!()
            };
            let schemas: Vec<Value> = lark
                .lines()
                .filter_map(|l| l.split_once(": %json ").map(|(_, s)| s))
                .map(|s| serde_json::from_str(s).unwrap())
                .collect();
            assert_eq!(schemas.len(), 2, "{format:?}: {lark}");
            for s in &schemas {
                // A call's schema holds the arguments under its key; Mistral's v11 has them bare.
                let args = ["arguments", "parameters"]
                    .iter()
                    .find_map(|k| s["properties"].get(k))
                    .unwrap_or(s);
                assert_eq!(args["additionalProperties"], false, "{format:?}: {lark}");
            }
        }
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
        let answer = r#" {"name": "add", "parameters": {"x": 2}}"#;
        assert_eq!(
            t.parse(answer),
            Some((None, vec![call("add", r#"{"x": 2}"#)]))
        );
        assert_eq!(t.parse(r#"{"name": "sub", "parameters": {}}"#), None);
        assert_eq!(t.parse(&format!("Sure: {answer}")), None, "text first");
        // `auto`: text that cannot start with `{`, or the call.
        let Grammar::Lark(auto) = t.grammar() else {
            panic!()
        };
        assert!(auto.starts_with("start: TEXT | fn0 | fn1\n"), "{auto}");
        // Forced: one call, no tags, no parallel calls.
        let Grammar::Lark(one) = in_format(Choice::Required, true, ToolFormat::Json).grammar()
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

    /// Mistral's format: the answer is the marker and a list of calls; in the grammar the
    /// marker is the control token where the vocabulary has one, else its text.
    #[test]
    fn a_mistral_answer_is_a_list_of_calls() {
        let t = in_format(Choice::Auto, true, ToolFormat::Mistral { marker: Some(5) });
        let list = r#" [{"name": "add", "arguments": {"x": 2}}, {"name": "get_weather", "arguments": {}}]"#;
        let calls = vec![call("add", r#"{"x": 2}"#), call("get_weather", "{}")];
        assert_eq!(t.parse(list), Some((None, calls.clone())));
        assert_eq!(
            t.parse(&format!("[TOOL_CALLS]{list}")),
            Some((None, calls)),
            "the marker as text"
        );
        assert_eq!(t.parse("[]"), None, "no calls");
        assert_eq!(t.parse(r#"[{"name": "sub", "arguments": {}}]"#), None);
        assert_eq!(t.parse(&format!("Sure:{list}")), None, "text first");
        let Grammar::Lark(auto) = t.grammar() else {
            panic!()
        };
        assert!(
            auto.starts_with("start: TEXT | calls\n")
                && auto.contains("calls: <[5]> \" \"? \"[\" call (\", \" call)* \"]\"")
                && auto.contains("\"arguments\""),
            "{auto}"
        );
        let named = in_format(Choice::Named(0), true, ToolFormat::Mistral { marker: None });
        let Grammar::Lark(one) = named.grammar() else {
            panic!()
        };
        assert!(
            one.starts_with("start: calls\ncalls: \"[TOOL_CALLS]\" \" \"? \"[\" call \"]\""),
            "{one}"
        );
    }

    /// Mistral's v11 and later: calls `[TOOL_CALLS]name[ARGS]{...}` one after another, a call
    /// id before `[ARGS]` where the template writes them; the markers are left out of the text
    /// where they are control tokens. Text that could be read as calls is not `auto`'s.
    #[test]
    fn mistral_named_calls_are_read_with_or_without_their_markers() {
        let want = vec![
            call("add", r#"{"x": 2}"#),
            call("get_weather", r#"{"x": {"y": "}"}}"#),
        ];
        let answers = [
            // Markers as text, with and without ids.
            (
                false,
                true,
                r#"[TOOL_CALLS]add[CALL_ID]a1b2c3d4e[ARGS]{"x": 2}[TOOL_CALLS]get_weather[CALL_ID]zzzzzzzzz[ARGS]{"x": {"y": "}"}}"#,
            ),
            (
                false,
                false,
                r#" [TOOL_CALLS]add[ARGS]{"x": 2} [TOOL_CALLS]get_weather[ARGS]{"x": {"y": "}"}}"#,
            ),
            // Markers as control tokens: the id runs on from the name.
            (
                true,
                true,
                r#"adda1b2c3d4e{"x": 2}get_weatherzzzzzzzzz{"x": {"y": "}"}}"#,
            ),
            (true, false, r#"add{"x": 2}get_weather{"x": {"y": "}"}}"#),
        ];
        for (tokens, ids, text) in answers {
            let format = ToolFormat::MistralNamed(NamedMarkers::for_tests(tokens, ids));
            let t = in_format(Choice::Auto, true, format);
            // The model's own call ids come back as the calls' ids.
            let mut want = want.clone();
            if ids {
                want[0].id = Some("a1b2c3d4e".into());
                want[1].id = Some("zzzzzzzzz".into());
            }
            assert_eq!(t.parse(text), Some((None, want)), "{text}");
            assert_eq!(
                t.whole_answer_start(text.trim_start()),
                Some(AnswerStart::Calls)
            );
        }
        let t = in_format(
            Choice::Auto,
            true,
            ToolFormat::MistralNamed(NamedMarkers::for_tests(true, false)),
        );
        for text in [
            r#"Sure: add{"x": 2}"#,
            r#"sub{"x": 2}"#,
            r#"add {"x": 2}"#,
            r#"add{"x": 2} and"#,
        ] {
            assert_eq!(t.parse(text), None, "{text}");
        }
        let start = |text| t.whole_answer_start(text);
        assert_eq!(start("[TOOL_C"), Some(AnswerStart::Undecided));
        assert_eq!(start("get_w"), Some(AnswerStart::Undecided));
        assert_eq!(start("add12"), Some(AnswerStart::Undecided));
        assert_eq!(start("added more"), Some(AnswerStart::Text));
        assert_eq!(start("Sure"), Some(AnswerStart::Text));
        // The grammar: markers as tokens or text, ids where written, text that opens no call.
        let Grammar::Lark(auto) = t.grammar() else {
            panic!()
        };
        assert!(
            auto.starts_with("start: TEXT | call+\n")
                && auto.contains(r"~/\s*(\[TOOL_CALLS\]|(get_weather|add)[a-zA-Z0-9]*[\[{])")
                && auto.contains("fn1: <[5]> \"add\" <[6]> args1\nargs1: %json {"),
            "{auto}"
        );
        let named = in_format(
            Choice::Named(1),
            true,
            ToolFormat::MistralNamed(NamedMarkers::for_tests(false, true)),
        );
        let Grammar::Lark(one) = named.grammar() else {
            panic!()
        };
        assert!(
            one.starts_with("start: call\ncall: fn0\n")
                && one.contains(
                    r#"fn0: "[TOOL_CALLS]" "add" "[CALL_ID]" /[a-zA-Z0-9]{9}/ "[ARGS]" args0"#
                )
                && !one.contains("get_weather"),
            "{one}"
        );
    }

    /// Mistral's templates take call ids of nine letters and digits: others are mapped to
    /// such, the same each time, in calls and in the results that answer them.
    #[test]
    fn mistral_call_ids_are_nine_letters_and_digits() {
        let format = ToolFormat::Mistral { marker: None };
        let call = |id: &str| super::super::api::ToolCallIn {
            id: Some(id.into()),
            kind: Some("function".into()),
            function: FunctionCall {
                name: "add".into(),
                arguments: "{}".into(),
            },
        };
        let m = history_message(
            "assistant",
            String::new(),
            &[call("call_7f3a")],
            None,
            format,
        );
        let id = m.tool_calls[0].id.clone().unwrap();
        assert_eq!(id.len(), 9);
        assert!(id.bytes().all(|b| b.is_ascii_alphanumeric()), "{id}");
        let result = history_message("tool", "4".into(), &[], Some("call_7f3a"), format);
        assert_eq!(result.tool_call_id.as_deref(), Some(id.as_str()));
        assert_ne!(mistral_id("call_7f3b"), id);
        assert_eq!(mistral_id("abcDEF123"), "abcDEF123", "already one");
        // Other formats keep the client's ids.
        let m = history_message(
            "assistant",
            String::new(),
            &[call("call_7f3a")],
            None,
            ToolFormat::Tagged,
        );
        assert_eq!(m.tool_calls[0].id.as_deref(), Some("call_7f3a"));
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
        // The tiny tokenizer has no `[TOOL_CALLS]` control token: the marker is text.
        let mistral = "{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}{% for m in messages %}{% if m.tool_calls %}[TOOL_CALLS]{% endif %}{% endfor %}";
        assert_eq!(with(mistral), ToolFormat::Mistral { marker: None });
        let v13 = mistral.replace("[TOOL_CALLS]", "[TOOL_CALLS]{{ c.name }}[ARGS]");
        assert_eq!(
            with(&v13),
            ToolFormat::MistralNamed(NamedMarkers::for_tests(false, false))
        );
        let v11 = mistral.replace(
            "[TOOL_CALLS]",
            "[TOOL_CALLS]{{ c.name }}[CALL_ID]{{ c.id }}[ARGS]",
        );
        assert_eq!(
            with(&v11),
            ToolFormat::MistralNamed(NamedMarkers::for_tests(false, true))
        );
    }
}
