//! A tokenizer's vocabulary as llguidance needs it: every token's bytes in a trie, built once per
//! model and shared by every request's matcher.

use crate::error::{ConstrainError, Result};
use crate::grammar::Grammar;
use crate::matcher::TokenMatcher;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use std::sync::Arc;

/// The token trie and the tokenizer, for llguidance's tokenizing of literal text.
struct Env {
    trie: TokTrie,
    tokenizer: tokenizers::Tokenizer,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        // The model's own tokenization where the bytes are text; the trie's greedy one where not.
        match std::str::from_utf8(s)
            .ok()
            .and_then(|text| self.tokenizer.encode(text, false).ok())
        {
            Some(enc) => enc.get_ids().to_vec(),
            None => self.trie.greedy_tokenize(s),
        }
    }

    /// Not canonical: llguidance then allows every token whose bytes fit, rather than only the
    /// canonical tokens of text the grammar forces, so that a mask is exactly the tokens
    /// [`crate::TokenMatcher::check`] accepts one by one (greedy decoding's shortcut).
    fn tokenize_is_canonical(&self) -> bool {
        false
    }
}

/// What grammars compile against: one per model (building it reads the whole vocabulary).
#[derive(Clone)]
pub struct Vocabulary {
    factory: Arc<ParserFactory>,
    env: TokEnv,
    size: usize,
    eos: Vec<u32>,
}

impl std::fmt::Debug for Vocabulary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Vocabulary")
            .field("size", &self.size)
            .finish()
    }
}

impl Vocabulary {
    /// The vocabulary of `tokenizer` (byte-level BPE or SentencePiece with byte fallback),
    /// padded to `size` ids (the model's logits; ids past the tokenizer's are never allowed),
    /// ending generation with any of `eos`.
    pub fn new(tokenizer: &tokenizers::Tokenizer, eos: &[u32], size: usize) -> Result<Self> {
        let vocab_err = |e: String| ConstrainError::Vocabulary(e);
        let json = tokenizer
            .to_string(false)
            .map_err(|e| vocab_err(e.to_string()))?;
        let json: serde_json::Value =
            serde_json::from_str(&json).map_err(|e| vocab_err(e.to_string()))?;
        // llguidance asserts on token names it does not expect; a panic there is a bad vocabulary.
        let bytes = std::panic::catch_unwind(|| llguidance::token_bytes_from_tokenizer_json(&json))
            .map_err(|_| vocab_err("unexpected token names".into()))?
            .map_err(|e| vocab_err(e.to_string()))?;
        let mut words = bytes;
        if words.len() > size {
            return Err(vocab_err(format!(
                "the tokenizer has {} tokens, more than the model's {size} logits",
                words.len()
            )));
        }
        words.resize(size, Vec::new());
        let &first_eos = eos
            .first()
            .ok_or_else(|| vocab_err("no end-of-sequence token".into()))?;
        let info = TokRxInfo::new(size as u32, first_eos);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(eos);
        let env: TokEnv = Arc::new(Env {
            trie,
            tokenizer: tokenizer.clone(),
        });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| vocab_err(e.to_string()))?;
        factory.quiet();
        Ok(Vocabulary {
            factory: Arc::new(factory),
            env,
            size,
            eos: eos.to_vec(),
        })
    }

    /// Token ids, as the model's logits count them.
    pub fn size(&self) -> usize {
        self.size
    }

    /// A matcher that allows only text of `grammar`, then an end-of-sequence token. A schema
    /// llguidance cannot follow (an unknown keyword, an unsatisfiable one) is an error here,
    /// before any token is generated.
    pub fn matcher(&self, grammar: &Grammar) -> Result<TokenMatcher> {
        let parser = self
            .factory
            .create_parser(grammar.to_llguidance()?)
            .map_err(|e| ConstrainError::Grammar(e.to_string()))?;
        TokenMatcher::new(
            Matcher::new(Ok(parser)),
            self.size,
            self.eos.clone(),
            self.env.clone(),
        )
    }
}
