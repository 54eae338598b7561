//! The requests file: one JSON object per line, every line checked before the model loads.

use anyhow::{bail, Context};
use serde::Deserialize;
use serde_json::Value;
use std::path::Path;

/// One request line.
#[derive(Deserialize, Debug)]
pub struct Request {
    /// Echoed back as is: a string, a number, anything JSON.
    pub id: Value,
    /// Raw prompt text, used as given.
    pub prompt: Option<String>,
    /// Chat messages, rendered with the model's chat template.
    pub messages: Option<Vec<Message>>,
    /// Overrides `--max-new-tokens`.
    pub max_new_tokens: Option<usize>,
    /// Text warmed into the cache before the request (its time is `warm_ms`, not part of TTFT).
    pub warm: Option<String>,
    /// Forget every cached chunk and resident block first (the request opens an independent
    /// workload).
    #[serde(default)]
    pub reset: bool,
    /// The client sending it: requests of one client run one after another, in file order; the
    /// clients run at once (default: one client).
    #[serde(default)]
    pub client: Option<Value>,
    /// Continue the client's chat: its previous request's prompt, the answer the model gave there,
    /// then this request's text (`prompt`: appended as is; `messages`: after the previous messages
    /// and the answer as an assistant message, rendered with the chat template). A chat grows
    /// this way, and its next turn reuses the K/V of the previous answer.
    #[serde(default, rename = "continue")]
    pub continue_chat: bool,
}

/// A chat message.
#[derive(Deserialize, Debug)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: String,
    /// Its text.
    pub content: String,
}

/// Reads and checks every request line (blank lines are skipped).
pub fn read_requests(path: &Path) -> anyhow::Result<Vec<Request>> {
    let text = crate::commands::text_file::read_text_file(path, "requests file")?;
    parse_requests(&text, &path.display().to_string())
}

/// Checks the request lines of `text`, a file called `name` in errors.
pub fn parse_requests(text: &str, name: &str) -> anyhow::Result<Vec<Request>> {
    let mut requests = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let at = || format!("{name} line {}", i + 1);
        let r: Request = serde_json::from_str(line).with_context(at)?;
        match (&r.prompt, &r.messages) {
            (Some(_), Some(_)) => bail!("{}: give `prompt` or `messages`, not both", at()),
            (None, None) => bail!("{}: a request needs `prompt` or `messages`", at()),
            (None, Some(m)) if m.is_empty() => bail!("{}: `messages` is empty", at()),
            _ => {}
        }
        requests.push(r);
    }
    if requests.is_empty() {
        bail!("{name} holds no request");
    }
    for group in by_client(&requests) {
        if let Some(first) = group.first().filter(|r| r.continue_chat) {
            bail!(
                "{name}: request {} continues a chat its client has not started",
                first.id
            );
        }
    }
    Ok(requests)
}

/// The requests grouped by client, each group in file order; clients in order of first
/// appearance.
pub fn by_client(requests: &[Request]) -> Vec<Vec<&Request>> {
    let mut groups: Vec<(String, Vec<&Request>)> = Vec::new();
    for r in requests {
        let key = r.client.as_ref().map_or_else(String::new, Value::to_string);
        match groups.iter_mut().find(|(k, _)| *k == key) {
            Some((_, g)) => g.push(r),
            None => groups.push((key, vec![r])),
        }
    }
    groups.into_iter().map(|(_, g)| g).collect()
}
