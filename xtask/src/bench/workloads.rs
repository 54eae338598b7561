//! The benchmark's workloads, generated deterministically from `bench/corpus/` (no downloads),
//! modelled on kvboost's published ones. Each workload is a short sequence of requests that
//! repeat context; its first request starts from an empty cache (`reset`).

use anyhow::{Context, Result};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// One request, as a `kvb replay` line.
#[derive(Serialize, Debug, Clone)]
pub struct Request {
    /// `workload/name`.
    pub id: String,
    /// The prompt text, chat markup included.
    pub prompt: String,
    /// Tokens to generate.
    pub max_new_tokens: usize,
    /// Forget the cache first: the request opens a workload.
    pub reset: bool,
    /// Its context was not seen before (not sent to the replay; warm requests are the others).
    #[serde(skip)]
    pub cold: bool,
}

/// A named sequence of requests.
pub struct Workload {
    /// Short name (file names, tables).
    pub name: &'static str,
    /// What it models.
    pub title: &'static str,
    /// Its requests, in order.
    pub requests: Vec<Request>,
}

/// How big the generated prompts are.
#[derive(Clone, Copy, Debug)]
pub struct Size {
    /// Fraction of each corpus text kept (1.0 = the full workloads).
    pub text: f64,
    /// Turns of the conversation.
    pub turns: usize,
    /// Tokens generated per request.
    pub max_new_tokens: usize,
    /// Chat markup: ChatML (what the default model was trained on) or a terse plain form for
    /// tiny models with a short context.
    pub chatml: bool,
    /// Tokens generated per turn of the concurrency workload (answers long enough that decoding
    /// is most of a chat's work, as in a chat service).
    pub concurrency_new_tokens: usize,
}

#[derive(Deserialize)]
struct Conversation {
    system: String,
    turns: Vec<Turn>,
}

#[derive(Deserialize)]
struct Turn {
    user: String,
    assistant: Option<String>,
}

/// The first `fraction` of `text`'s words (at least three), whitespace kept inside lines.
pub(crate) fn cut(text: &str, fraction: f64) -> String {
    if fraction >= 1.0 {
        return text.trim().to_string();
    }
    let words: Vec<&str> = text.split_whitespace().collect();
    let keep =
        ((words.len() as f64 * fraction).ceil() as usize).clamp(3.min(words.len()), words.len());
    words[..keep].join(" ")
}

struct Chat<'a> {
    size: &'a Size,
    text: String,
}

impl<'a> Chat<'a> {
    fn new(size: &'a Size) -> Self {
        Chat {
            size,
            text: String::new(),
        }
    }

    fn message(mut self, role: &str, content: &str) -> Self {
        if self.size.chatml {
            self.text += &format!("<|im_start|>{role}\n{content}<|im_end|>\n");
        } else {
            self.text += &format!("{}: {content}\n", &role[..1]);
        }
        self
    }

    /// The prompt, ending where the assistant's answer begins.
    fn prompt(self) -> String {
        if self.size.chatml {
            self.text + "<|im_start|>assistant\n"
        } else {
            self.text + "a:"
        }
    }
}

/// A chat prompt of `messages` (role, text), ending where the assistant's answer begins.
pub(crate) fn chat_prompt(size: &Size, messages: &[(&str, String)]) -> String {
    messages
        .iter()
        .fold(Chat::new(size), |chat, (role, text)| {
            chat.message(role, text)
        })
        .prompt()
}

/// What follows the model's answer when a chat continues: the end of the assistant's turn, a new
/// user message, and the start of the next answer.
pub(crate) fn chat_continuation(size: &Size, user: &str) -> String {
    if size.chatml {
        format!("<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n")
    } else {
        format!("\nu: {user}\na:")
    }
}

fn read(corpus: &Path, name: &str) -> Result<String> {
    let p = corpus.join(name);
    std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))
}

/// Every workload at `size`, from the texts in `corpus` (and the shared documents in `docs`).
pub fn all(corpus: &Path, docs: &Path, size: &Size) -> Result<Vec<Workload>> {
    let s = size;
    let req = |workload: &str, name: &str, prompt: String, first: bool| Request {
        id: format!("{workload}/{name}"),
        prompt,
        max_new_tokens: s.max_new_tokens,
        reset: first,
        cold: first,
    };
    // Requests `name1`, `name2`, ... over one context; the first opens the workload.
    let series = |workload: &str, name: &str, prompts: &mut dyn Iterator<Item = String>| {
        prompts
            .enumerate()
            .map(|(i, p)| req(workload, &format!("{name}{}", i + 1), p, i == 0))
            .collect::<Vec<_>>()
    };
    let doc = |name: &str| -> Result<String> { Ok(cut(&read(docs, name)?, s.text)) };
    let mut out = Vec::new();

    let system = cut(&read(corpus, "system_prompt.txt")?, s.text);
    let questions = [
        "Can I return a tent I used once if a pole snapped?",
        "How long does express shipping take to Ohio?",
        "Which sleeping bag would you recommend for a first trip in spring?",
        "My order has not arrived after eight days. What should I do?",
    ];
    out.push(Workload {
        name: "system_prompt",
        title: "System prompt reuse (~250 tokens, 4 questions)",
        requests: series(
            "system_prompt",
            "q",
            &mut questions.iter().map(|q| {
                Chat::new(s)
                    .message("system", &system)
                    .message("user", q)
                    .prompt()
            }),
        ),
    });

    let rag_system = "Answer the question using only the document. Quote figures exactly.";
    let rag = [
        (
            doc("amazon.txt")?,
            [
                "How many nations share the Amazon rainforest?",
                "What are the main sources of deforestation?",
            ],
        ),
        (
            format!("{}\n\n{}", doc("printing.txt")?, doc("photosynthesis.txt")?),
            [
                "Where was the printing press developed?",
                "What are the two stages of photosynthesis?",
            ],
        ),
    ];
    // The documents alternate, so each warm question finds the other document resident and
    // reads its own from the chunk store: the store path, measured.
    let mut requests = Vec::new();
    for i in 0..2 {
        for (d, (text, qs)) in rag.iter().enumerate() {
            let user = format!("Document:\n{text}\n\nQuestion: {}", qs[i]);
            let p = Chat::new(s)
                .message("system", rag_system)
                .message("user", &user)
                .prompt();
            let mut r = req(
                "rag",
                &format!("doc{}-q{}", d + 1, i + 1),
                p,
                d == 0 && i == 0,
            );
            r.cold = i == 0;
            requests.push(r);
        }
    }
    out.push(Workload {
        name: "rag",
        title: "RAG document reuse (~500 tokens, 2 documents x 2 questions, alternating)",
        requests,
    });

    let shots = cut(&read(corpus, "few_shot.txt")?, s.text);
    let reviews = [
        "The tent poles bent in the first gust of wind and the fly tore.",
        "Arrived quickly and the jacket fits well; very happy with it.",
        "The bottle holds one litre and the cap screws on.",
        "Great value: the stove boils water in three minutes flat.",
    ];
    out.push(Workload {
        name: "few_shot",
        title: "Few-shot classification (~500 tokens, 4 inputs)",
        requests: series(
            "few_shot",
            "input",
            &mut reviews
                .iter()
                .map(|r| format!("{shots}\n\nReview: {r}\nSentiment:")),
        ),
    });

    let code = cut(&read(corpus, "code_sample.rs")?, s.text);
    let code_questions = [
        "What does slice_kv return when the range is outside the chunk?",
        "Why does merge_kv widen every chunk to f32?",
        "How would you add a function that merges only the keys?",
    ];
    out.push(Workload {
        name: "code",
        title: "Code context (~880 tokens, 3 questions over one file)",
        requests: series(
            "code",
            "q",
            &mut code_questions.iter().map(|q| {
                let user = format!("```rust\n{code}\n```\n\n{q}");
                Chat::new(s)
                    .message("system", "You are a senior Rust engineer reviewing code.")
                    .message("user", &user)
                    .prompt()
            }),
        ),
    });

    let conv: Conversation = serde_json::from_str(&read(corpus, "conversation.json")?)
        .context("parsing bench/corpus/conversation.json")?;
    let turns = s.turns.min(conv.turns.len());
    let mut requests = Vec::new();
    for t in 0..turns {
        let mut chat = Chat::new(s).message("system", &cut(&conv.system, s.text));
        for (i, turn) in conv.turns[..=t].iter().enumerate() {
            chat = chat.message("user", &cut(&turn.user, s.text));
            if i < t {
                let answer = turn.assistant.as_deref().unwrap_or_default();
                chat = chat.message("assistant", &cut(answer, s.text));
            }
        }
        requests.push(req(
            "conversation",
            &format!("turn{}", t + 1),
            chat.prompt(),
            t == 0,
        ));
    }
    out.push(Workload {
        name: "conversation",
        title: "Multi-turn conversation (8 turns, ~200 to ~1,400 tokens)",
        requests,
    });

    let moved = doc("amazon.txt")?;
    let preambles = [
        ("You are a careful research assistant.", "How much of the rainforest is in Brazil?"),
        (
            "You are a geography teacher preparing a quiz for a class of fifteen-year-olds. Keep answers short and mention numbers when the document gives them.",
            "How long have indigenous peoples lived in the Amazon?",
        ),
        (
            "You help a journalist check facts before publication. Say which sentence of the document supports your answer.",
            "What could push parts of the forest past a tipping point?",
        ),
    ];
    out.push(Workload {
        name: "moved_document",
        title: "Document moved behind a new preamble (interior reuse, ~550 tokens)",
        requests: series(
            "moved_document",
            "preamble",
            &mut preambles.iter().map(|(pre, q)| {
                let user = format!("Document:\n{moved}\n\nQuestion: {q}");
                Chat::new(s)
                    .message("system", pre)
                    .message("user", &user)
                    .prompt()
            }),
        ),
    });

    let long = cut(&read(corpus, "long_document.md")?, s.text);
    let long_questions = [
        "Summarise the section about printing in two sentences.",
        "Which countries hold most of the Amazon rainforest?",
        "What does kvb store so that a chat's next turn is fast?",
    ];
    out.push(Workload {
        name: "long_document",
        title: "Long document (~3,000 tokens, 3 questions)",
        requests: series(
            "long_document",
            "q",
            &mut long_questions.iter().map(|q| {
                let user = format!("{long}\n\n{q}");
                Chat::new(s)
                    .message("system", "You answer questions about the user's notes.")
                    .message("user", &user)
                    .prompt()
            }),
        ),
    });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cut_keeps_the_first_words() {
        assert_eq!(cut("a b c d e f", 0.5), "a b c");
        assert_eq!(cut("a b", 0.1), "a b");
        assert_eq!(cut(" a  b ", 1.0), "a  b");
    }
}
