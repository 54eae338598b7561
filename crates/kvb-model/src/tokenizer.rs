//! Tokenization (the `tokenizers` crate) and chat templates (minijinja).

use crate::error::{ModelError, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// One message of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` or `tool`.
    pub role: String,
    /// The message text.
    pub content: String,
    /// An assistant's calls of tools, for templates with a tools section (they read
    /// `message.tool_calls`, in OpenAI's shape).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ChatToolCall>,
    /// A `tool` message: the id of the call it answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    /// Who speaks, where the caller names them (OpenAI's `name`): templates that read
    /// `message.name` write it, as transformers and vLLM give it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl ChatMessage {
    /// A message with `role` and `content`.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            tool_calls: Vec::new(),
            tool_call_id: None,
            name: None,
        }
    }
}

/// A call of a tool in a conversation, as chat templates read it:
/// `{"id", "type": "function", "function": {"name", "arguments"}}`, the arguments a JSON value
/// (templates write them with `tojson`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatToolCall {
    /// The call's id, when the caller gave one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Always `function`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The function and its arguments.
    pub function: ChatFunctionCall,
}

/// The function a [`ChatToolCall`] calls.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatFunctionCall {
    /// The function's name.
    pub name: String,
    /// Its arguments (an object; a string where a caller's were not JSON).
    pub arguments: serde_json::Value,
}

impl ChatToolCall {
    /// A call of function `name` with `arguments`.
    pub fn function(
        id: Option<String>,
        name: impl Into<String>,
        arguments: serde_json::Value,
    ) -> Self {
        ChatToolCall {
            id,
            kind: "function".into(),
            function: ChatFunctionCall {
                name: name.into(),
                arguments,
            },
        }
    }
}

/// What [`Tokenizer::encode_chat`] needs to know of the special tokens, gathered once.
#[derive(Debug, Clone)]
pub(crate) struct SpecialTokens {
    /// Their texts.
    pub texts: Vec<String>,
    /// The characters they start with.
    pub firsts: std::collections::HashSet<char>,
    /// Their ids.
    pub ids: std::collections::HashSet<u32>,
}

/// A model's tokenizer with its special tokens and chat template.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    /// `inner` reading special tokens' texts as text, made when first needed.
    text_only: std::sync::OnceLock<tokenizers::Tokenizer>,
    /// The special added tokens, gathered when first needed.
    specials: std::sync::OnceLock<SpecialTokens>,
    chat_template: Option<String>,
    bos_token: Option<String>,
    eos_token: Option<String>,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("has_chat_template", &self.chat_template.is_some())
            .finish()
    }
}

/// A special token in `tokenizer_config.json`: a string, or an object with `content`.
fn token_text(value: Option<&serde_json::Value>) -> Option<String> {
    match value? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(o) => o.get("content")?.as_str().map(String::from),
        _ => None,
    }
}

impl Tokenizer {
    /// Builds a tokenizer from the text of a `tokenizer.json`.
    pub fn from_json(json: &str) -> Result<Self> {
        // The tokenizers crate panics on some malformed files (an `expect` in its decoder's
        // deserializer, found by fuzzing): a bad file must be an error, not a crash. Its panics
        // come from JSON it cannot read (syntax, numbers out of range), so the text is read as
        // JSON once, here (the error names line and column), and the tokenizer is built from
        // that value; anything else it might panic on is caught.
        let value: serde_json::Value = serde_json::from_str(json)
            .map_err(|e| ModelError::Tokenizer(format!("invalid tokenizer.json: {e}")))?;
        Self::from_json_value(value)
    }

    /// Builds a tokenizer from a `tokenizer.json` already read as JSON (a GGUF's vocabulary
    /// becomes one without passing through text).
    pub fn from_json_value(value: serde_json::Value) -> Result<Self> {
        let parsed =
            std::panic::catch_unwind(|| serde_json::from_value::<tokenizers::Tokenizer>(value))
                .map_err(|_| {
                    ModelError::Tokenizer("invalid tokenizer.json: its parser gave up on it".into())
                })?;
        let inner =
            parsed.map_err(|e| ModelError::Tokenizer(format!("invalid tokenizer.json: {e}")))?;
        Ok(Tokenizer {
            inner,
            text_only: std::sync::OnceLock::new(),
            specials: std::sync::OnceLock::new(),
            chat_template: None,
            bos_token: None,
            eos_token: None,
        })
    }

    /// Loads `tokenizer.json` and, when present beside it, `tokenizer_config.json` (chat template,
    /// bos/eos tokens).
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let path = dir.join("tokenizer.json");
        let json = std::fs::read_to_string(&path).map_err(|e| ModelError::io(&path, e))?;
        let mut tok = Self::from_json(&json)
            .map_err(|e| ModelError::Tokenizer(format!("{}: {e}", path.display())))?;
        let config_path = dir.join("tokenizer_config.json");
        if config_path.exists() {
            let text = std::fs::read_to_string(&config_path)
                .map_err(|e| ModelError::io(&config_path, e))?;
            let cfg: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
                ModelError::Tokenizer(format!("{}: invalid JSON: {e}", config_path.display()))
            })?;
            tok.chat_template = cfg
                .get("chat_template")
                .and_then(|v| v.as_str())
                .map(String::from);
            tok.bos_token = token_text(cfg.get("bos_token"));
            tok.eos_token = token_text(cfg.get("eos_token"));
        }
        Ok(tok)
    }

    /// Sets the chat template and the bos/eos token texts it may refer to.
    pub fn with_chat_template(
        mut self,
        template: Option<String>,
        bos_token: Option<String>,
        eos_token: Option<String>,
    ) -> Self {
        self.chat_template = template;
        self.bos_token = bos_token;
        self.eos_token = eos_token;
        self
    }

    /// The chat template, if the model has one.
    pub fn chat_template(&self) -> Option<&str> {
        self.chat_template.as_deref()
    }

    /// The end-of-sequence token text named by the tokenizer config, if any.
    pub fn eos_token(&self) -> Option<&str> {
        self.eos_token.as_deref()
    }

    /// The beginning-of-sequence token text named by the tokenizer config, if any.
    pub fn bos_token(&self) -> Option<&str> {
        self.bos_token.as_deref()
    }

    /// Vocabulary size including added tokens.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The id of a token's text (e.g. `<|im_end|>`).
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.inner.token_to_id(text)
    }

    /// Token ids of `text`. Special tokens written in the text (e.g. `<|im_start|>`) are recognised;
    /// `add_special_tokens` adds what the tokenizer's post-processor adds (e.g. a BOS).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        let enc = self
            .inner
            .encode(text, add_special_tokens)
            .map_err(|e| ModelError::Tokenizer(format!("encode: {e}")))?;
        Ok(enc.get_ids().to_vec())
    }

    /// Text of `ids`; `skip_special_tokens` drops control tokens such as `<|im_end|>`.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| ModelError::Tokenizer(format!("decode: {e}")))
    }

    /// The underlying `tokenizers` tokenizer.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }

    /// The special added tokens (control tokens such as `<|im_start|>`).
    pub(crate) fn special_tokens(&self) -> &SpecialTokens {
        self.specials.get_or_init(|| {
            let special: Vec<(u32, String)> = self
                .inner
                .get_added_tokens_decoder()
                .into_iter()
                .filter(|(_, t)| t.special && !t.content.is_empty())
                .map(|(id, t)| (id, t.content))
                .collect();
            SpecialTokens {
                firsts: special
                    .iter()
                    .filter_map(|(_, t)| t.chars().next())
                    .collect(),
                ids: special.iter().map(|(id, _)| *id).collect(),
                texts: special.into_iter().map(|(_, t)| t).collect(),
            }
        })
    }

    /// The tokenizer with special tokens' texts read as text (a message's `<|im_start|>` is
    /// then the characters, not the control token).
    pub(crate) fn text_only(&self) -> &tokenizers::Tokenizer {
        self.text_only.get_or_init(|| {
            let mut t = self.inner.clone();
            t.set_encode_special_tokens(true);
            t
        })
    }

    /// Renders `messages` with the model's chat template, as transformers' `apply_chat_template`
    /// does (Jinja with `trim_blocks` and `lstrip_blocks`).
    pub fn apply_chat_template(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String> {
        self.apply_chat_template_with_tools(messages, &[], add_generation_prompt)
    }

    /// [`Self::apply_chat_template`] with `tools` (OpenAI's `{"type": "function", "function":
    /// {...}}` objects) given to the template as `tools`; none leaves `tools` undefined.
    pub fn apply_chat_template_with_tools(
        &self,
        messages: &[ChatMessage],
        tools: &[serde_json::Value],
        add_generation_prompt: bool,
    ) -> Result<String> {
        let template = self
            .chat_template
            .as_deref()
            .ok_or_else(|| ModelError::ChatTemplate("this model has no chat template".into()))?;
        render(
            template,
            minijinja::context! {
                messages => messages,
                tools => (!tools.is_empty()).then_some(tools),
                add_generation_prompt => add_generation_prompt,
                bos_token => self.bos_token.as_deref().unwrap_or(""),
                eos_token => self.eos_token.as_deref().unwrap_or(""),
            },
        )
    }

    /// Whether the chat template reads a `tools` variable (has a tools section); `false`
    /// without a template or with one that does not parse.
    pub fn chat_template_reads_tools(&self) -> bool {
        let Some(template) = self.chat_template.as_deref() else {
            return false;
        };
        template_env(template)
            .ok()
            .and_then(|env| {
                let t = env.get_template("chat").ok()?;
                Some(t.undeclared_variables(false).contains("tools"))
            })
            .unwrap_or(false)
    }
}

/// An environment holding `template` as `chat`, set up as transformers renders chat templates.
fn template_env(template: &str) -> Result<minijinja::Environment<'_>> {
    let mut env = minijinja::Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    minijinja_contrib::add_to_environment(&mut env);
    // HF templates call Python string methods (`.strip()`, `.startswith()`).
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function(
        "raise_exception",
        |msg: String| -> std::result::Result<String, minijinja::Error> {
            Err(minijinja::Error::new(
                minijinja::ErrorKind::InvalidOperation,
                msg,
            ))
        },
    );
    env.add_template("chat", template)
        .map_err(|e| ModelError::ChatTemplate(format!("cannot parse the template: {e}")))?;
    Ok(env)
}

/// Renders `template` with `context`.
fn render(template: &str, context: minijinja::Value) -> Result<String> {
    let env = template_env(template)?;
    let tmpl = env
        .get_template("chat")
        .map_err(|e| ModelError::ChatTemplate(e.to_string()))?;
    tmpl.render(context)
        .map_err(|e| ModelError::ChatTemplate(format!("rendering failed: {e}")))
}

/// Renders a HF chat template.
pub fn render_chat_template(
    template: &str,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    bos_token: &str,
    eos_token: &str,
) -> Result<String> {
    render(
        template,
        minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => bos_token,
            eos_token => eos_token,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn template_errors_are_reported_not_panics() {
        let err = render_chat_template("{% if %}", &[], true, "", "").unwrap_err();
        assert!(err.to_string().contains("cannot parse"), "{err}");
        let err =
            render_chat_template("{{ raise_exception('no system role') }}", &[], true, "", "")
                .unwrap_err();
        assert!(err.to_string().contains("no system role"), "{err}");
    }

    #[test]
    fn python_string_methods_work_in_templates() {
        let msgs = [ChatMessage::new("user", "  hi  ")];
        let out = render_chat_template(
            "{% for m in messages %}[{{ m['content'].strip() }}]{% endfor %}{% if add_generation_prompt %}>{% endif %}",
            &msgs,
            true,
            "",
            "",
        )
        .unwrap();
        assert_eq!(out, "[hi]>");
    }
}
