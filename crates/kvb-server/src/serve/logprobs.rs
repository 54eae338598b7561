//! The engine's per-token log-probabilities in OpenAI's two shapes: the chat one
//! (`logprobs.content[]`) and the legacy completions one (`tokens`, `token_logprobs`,
//! `top_logprobs`, `text_offset`). A token's text is the token decoded alone, as vLLM reports it
//! (a token holding part of a UTF-8 character decodes to U+FFFD).

use super::api::{ChatLogprobs, ChatTokenLogprob, CompletionLogprobs, TopLogprob};
use kvb_engine::TokenLogprobs;
use kvb_model::Tokenizer;

fn text_of(tokenizer: &Tokenizer, id: u32) -> String {
    tokenizer.decode(&[id], false).unwrap_or_default()
}

/// The chat shape of `tokens`' log-probabilities.
pub(super) fn chat(tokenizer: &Tokenizer, tokens: &[TokenLogprobs]) -> ChatLogprobs {
    ChatLogprobs {
        content: tokens
            .iter()
            .map(|t| {
                let token = text_of(tokenizer, t.token);
                ChatTokenLogprob {
                    bytes: token.as_bytes().to_vec(),
                    token,
                    logprob: t.logprob,
                    top_logprobs: t
                        .top
                        .iter()
                        .map(|&(id, logprob)| {
                            let token = text_of(tokenizer, id);
                            TopLogprob {
                                bytes: token.as_bytes().to_vec(),
                                token,
                                logprob,
                            }
                        })
                        .collect(),
                }
            })
            .collect(),
    }
}

/// The completions shape of `tokens`' log-probabilities, their text offsets counted in
/// characters from `offset` (the characters of the answer before them), which it advances past
/// them.
pub(super) fn completion(
    tokenizer: &Tokenizer,
    tokens: &[TokenLogprobs],
    offset: &mut usize,
) -> CompletionLogprobs {
    let mut out = CompletionLogprobs {
        tokens: Vec::with_capacity(tokens.len()),
        token_logprobs: Vec::with_capacity(tokens.len()),
        top_logprobs: Vec::with_capacity(tokens.len()),
        text_offset: Vec::with_capacity(tokens.len()),
    };
    for t in tokens {
        let token = text_of(tokenizer, t.token);
        out.text_offset.push(*offset);
        *offset += token.chars().count();
        out.tokens.push(token);
        out.token_logprobs.push(t.logprob);
        // Two tokens can decode to the same text: the map keeps the likelier.
        let mut top = std::collections::BTreeMap::new();
        for &(id, logprob) in &t.top {
            top.entry(text_of(tokenizer, id)).or_insert(logprob);
        }
        out.top_logprobs.push(top);
    }
    out
}
