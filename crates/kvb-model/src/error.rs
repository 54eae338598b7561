//! The one error type of kvb-model.

use std::path::PathBuf;

/// Everything that can go wrong loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A model file is unreadable, malformed or not servable: kvb-modelfile's error (an I/O
    /// error with its path, a bad config, an unsupported model, a weight or GGUF problem).
    #[error(transparent)]
    File(#[from] kvb_modelfile::FileError),
    /// The tokenizer could not be built or used.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The chat template could not be rendered.
    #[error("chat template: {0}")]
    ChatTemplate(String),
    /// A forward pass was asked for something inconsistent (positions, slots, context length).
    #[error("forward: {0}")]
    Forward(String),
    /// Attention, or the K/V pool, rejected its inputs.
    #[error(transparent)]
    Attention(#[from] kvb_attn::AttnError),
    /// Fetching or converting the default model failed.
    #[error("fetch: {0}")]
    Fetch(String),
    /// A token constraint (a grammar) failed or refused a token.
    #[error("constraint: {0}")]
    Constraint(String),
}

impl ModelError {
    /// Wraps an I/O error with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, error: std::io::Error) -> Self {
        ModelError::File(kvb_modelfile::FileError::io(path, error))
    }

    /// A model kvb cannot serve as asked.
    pub fn unsupported(reason: String) -> Self {
        ModelError::File(kvb_modelfile::FileError::Unsupported(reason))
    }

    /// A weight tensor kvb cannot use.
    pub fn weights(reason: String) -> Self {
        ModelError::File(kvb_modelfile::FileError::Weights(reason))
    }
}

/// Result alias of this crate.
pub type Result<T, E = ModelError> = std::result::Result<T, E>;
