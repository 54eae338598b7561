//! A chat request's messages to prompt tokens. Control tokens come from the chat template only:
//! a special token's text typed in a message is text, so no caller can forge a system turn;
//! `--trust-message-special-tokens` reads it as the control token again, for trusted callers.

use super::error::ApiError;
use kvb_model::{ChatMessage, ModelError, Tokenizer};

/// Token ids of `messages` rendered with the model's chat template.
pub fn chat_prompt_tokens(
    tokenizer: &Tokenizer,
    messages: &[ChatMessage],
    add_generation_prompt: bool,
    trust_special_tokens: bool,
) -> Result<Vec<u32>, ApiError> {
    let tokens = if trust_special_tokens {
        tokenizer
            .apply_chat_template(messages, add_generation_prompt)
            .and_then(|text| tokenizer.encode(&text, false))
    } else {
        tokenizer.encode_chat(messages, add_generation_prompt)
    };
    tokens.map_err(|e| match e {
        ModelError::ChatTemplate(_) => {
            ApiError::bad_request(format!("the chat template failed: {e}"), Some("messages"))
        }
        e => ApiError::bad_request(
            format!("cannot tokenize the messages: {e}"),
            Some("messages"),
        ),
    })
}
