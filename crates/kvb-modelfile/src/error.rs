//! The one error type of kvb-modelfile.

use std::path::PathBuf;

/// Everything that can go wrong reading a model's files.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// A file could not be read.
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
    /// The architecture cannot be served (or is unknown and `strict` is on).
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
}

impl FileError {
    /// Wraps an I/O error with the path it concerns.
    pub fn io(path: impl Into<PathBuf>, error: std::io::Error) -> Self {
        FileError::Io {
            path: path.into(),
            error,
        }
    }
}

/// Result alias of this crate.
pub type Result<T, E = FileError> = std::result::Result<T, E>;
