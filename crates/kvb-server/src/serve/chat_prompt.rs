//! A chat request's messages to prompt tokens. Control tokens come from the chat template only:
//! a special token's text typed in a message is text, so no caller can forge a system turn;
//! `--trust-message-special-tokens` reads it as the control token again, for trusted callers.

use super::error::ApiError;
use super::tools::ChatPrompt;
use kvb_model::{ModelError, Tokenizer};

/// Token ids of `prompt` rendered with the model's chat template.
pub fn chat_prompt_tokens(
    tokenizer: &Tokenizer,
    prompt: &ChatPrompt,
    add_generation_prompt: bool,
    trust_special_tokens: bool,
) -> Result<Vec<u32>, ApiError> {
    let (messages, tools) = (&prompt.messages, &prompt.tools);
    let tokens = if trust_special_tokens {
        tokenizer
            .apply_chat_template_with_tools(messages, tools, add_generation_prompt)
            .and_then(|text| tokenizer.encode(&text, false))
    } else {
        tokenizer.encode_chat_with_tools(messages, tools, add_generation_prompt)
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
