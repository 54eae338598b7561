//! What can go wrong turning a grammar into token masks.

/// An error of constrained decoding, with what it was about.
#[derive(Debug, thiserror::Error)]
pub enum ConstrainError {
    /// The tokenizer's vocabulary could not be read as bytes.
    #[error("tokenizer vocabulary: {0}")]
    Vocabulary(String),
    /// The grammar or schema is malformed, unsupported or unsatisfiable.
    #[error("grammar: {0}")]
    Grammar(String),
    /// A token the grammar does not allow here was chosen.
    #[error("token {token} does not fit the grammar: {reason}")]
    Rejected {
        /// The token id.
        token: u32,
        /// What the matcher said.
        reason: String,
    },
    /// The matcher failed while working out the next mask (a grammar too costly to follow).
    #[error("grammar matcher: {0}")]
    Matcher(String),
}

/// Results of this crate.
pub type Result<T> = std::result::Result<T, ConstrainError>;
