//! The one error type of kvb-model.

use std::path::PathBuf;

/// Everything that can go wrong loading or running a model.
#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    /// A file could not be read or written.
    #[error("{path}: {error}")]
    Io {
        /// The file involved.
        path: PathBuf,
        /// The underlying error (shown in the message; a field named `source` would also be
        /// chained by thiserror and printed twice).
        error: std::io::Error,
    },
    /// `config.json` (or GGUF metadata) is malformed or missing a field.
    #[error("model config {path}: {reason}")]
    Config {
        /// Where the config came from.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The architecture cannot be served by kvb (or is unknown and `strict` is on).
    #[error("unsupported model: {0}")]
    Unsupported(String),
    /// A weight tensor is missing, unused, of the wrong shape or of an unsupported dtype.
    #[error("weights: {0}")]
    Weights(String),
    /// A GGUF file is truncated or corrupt.
    #[error("GGUF {path}: {reason}")]
    Gguf {
        /// The file.
        path: PathBuf,
        /// What is wrong, with the byte offset where it applies.
        reason: String,
    },
    /// The tokenizer could not be built or used.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// The chat template could not be rendered.
    #[error("chat template: {0}")]
    ChatTemplate(String),
    /// A forward pass was asked for something inconsistent (positions, slots, context length).
    #[error("forward: {0}")]
    Forward(String),
    /// The K/V pool cannot be built as asked (its element type, its block size).
    #[error("K/V pool: {0}")]
    Pool(String),
    /// Attention rejected its inputs.
    #[error(transparent)]
    Attention(#[from] kvb_attn::AttnError),
    /// Fetching or converting the default model failed.
    #[error("fetch: {0}")]
    Fetch(String),
}

impl ModelError {
    /// Wraps an I/O error with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, error: std::io::Error) -> Self {
        ModelError::Io {
            path: path.into(),
            error,
        }
    }
}

/// A model file's error, as the same kind of model error.
impl From<kvb_modelfile::FileError> for ModelError {
    fn from(e: kvb_modelfile::FileError) -> Self {
        use kvb_modelfile::FileError as F;
        match e {
            F::Io { path, error } => ModelError::Io { path, error },
            F::Config { path, reason } => ModelError::Config { path, reason },
            F::Unsupported(m) => ModelError::Unsupported(m),
            F::Weights(m) => ModelError::Weights(m),
            F::Gguf { path, reason } => ModelError::Gguf { path, reason },
        }
    }
}

/// Result alias of this crate.
pub type Result<T, E = ModelError> = std::result::Result<T, E>;
