//! Constrained decoding: the text a model generates follows a JSON Schema, a regular expression
//! or a Lark grammar, because before each token is chosen every token that would break it has
//! its logit set to minus infinity.
//!
//! Built on [llguidance](https://github.com/guidance-ai/llguidance), the matcher llama.cpp,
//! vLLM and SGLang use. This crate turns a `tokenizers` vocabulary into the token trie it
//! needs ([`Vocabulary`], once per model), compiles a request's [`Grammar`] into a
//! [`TokenMatcher`], and exposes the one loop a runtime needs: prepare the mask (the costly
//! part, which can overlap the forward pass), mask the logits, accept the chosen token.
//!
//! Promises, proved by `tests/json_schema.rs`: whatever a sampler picks among the allowed
//! tokens, the text ends as soon as it is complete and parses as JSON valid against its
//! schema; an object schema that names its `properties` admits no other keys unless it says
//! `"additionalProperties"` (as xgrammar's strict mode, vLLM's default); the mask never allows
//! a token the matcher then rejects; a schema the matcher cannot follow is an error before the
//! first token.

mod closed;
mod error;
mod grammar;
mod matcher;
mod vocabulary;

pub use error::{ConstrainError, Result};
pub use grammar::{json_layout, lark_json_schema, Grammar};
pub use matcher::TokenMatcher;
pub use vocabulary::Vocabulary;

/// The README's example, compiled as a doctest.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
