//! One sequence's place in its grammar: which tokens may come next, and the token that did.

use crate::error::{ConstrainError, Result};
use llguidance::toktrie::{SimpleVob, TokEnv};
use llguidance::Matcher;

/// Follows one sequence through its grammar. Work out the mask ([`TokenMatcher::prepare`],
/// the costly part, which can run while the model computes the logits), apply it, then
/// [`TokenMatcher::accept`] the chosen token.
#[derive(Clone)]
pub struct TokenMatcher {
    matcher: Matcher,
    /// The mask for the next token, once prepared.
    mask: Option<SimpleVob>,
    size: usize,
    /// End-of-sequence ids: accepted once the grammar is complete.
    eos: Vec<u32>,
    /// The vocabulary's bytes, for [`TokenMatcher::check`].
    env: TokEnv,
}

impl std::fmt::Debug for TokenMatcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenMatcher")
            .field("prepared", &self.mask.is_some())
            .field("finished", &self.matcher.is_stopped())
            .finish()
    }
}

impl TokenMatcher {
    pub(crate) fn new(matcher: Matcher, size: usize, eos: Vec<u32>, env: TokEnv) -> Result<Self> {
        if let Some(e) = matcher.get_error() {
            return Err(ConstrainError::Grammar(e));
        }
        Ok(TokenMatcher {
            matcher,
            mask: None,
            size,
            eos,
            env,
        })
    }

    /// Works out which tokens may come next (once per token; later calls return at once).
    pub fn prepare(&mut self) -> Result<()> {
        if self.mask.is_none() {
            let mask = self
                .matcher
                .compute_mask_or_eos()
                .map_err(|e| ConstrainError::Matcher(e.to_string()))?;
            self.mask = Some(mask);
        }
        Ok(())
    }

    /// Whether `token` may come next.
    pub fn allows(&mut self, token: u32) -> Result<bool> {
        self.prepare()?;
        let mask = self.mask.as_ref().expect("prepared");
        Ok((token as usize) < self.size && mask.is_allowed(token))
    }

    /// Whether `token` may come next, as [`TokenMatcher::allows`] says, but without working
    /// out the whole mask when it is not prepared: the grammar reads the one token's bytes.
    /// A greedy sampler whose best token fits skips the mask altogether.
    pub fn check(&mut self, token: u32) -> Result<bool> {
        if self.mask.is_some() {
            return self.allows(token);
        }
        if token as usize >= self.size {
            return Ok(false);
        }
        if self.eos.contains(&token) {
            // After the end an EOS is still taken ([`TokenMatcher::accept`]).
            let ended = self.matcher.is_stopped() && self.matcher.get_error().is_none();
            return Ok(ended || self.accepting());
        }
        let trie = self.env.tok_trie();
        // Ids without bytes (padding) are never in a mask but an EOS; a control token is only
        // where the grammar names it (`<[id]>`), which the grammar's own check tells.
        if self.matcher.is_stopped() || trie.token_len(token) == 0 {
            return Ok(false);
        }
        let valid = self
            .matcher
            .validate_tokens(&[token])
            .map_err(|e| ConstrainError::Matcher(e.to_string()))?;
        Ok(valid == 1)
    }

    /// The tokens that may come next, as bits over token ids: bit `i % 32` of word `i / 32`.
    pub fn allowed(&mut self) -> Result<&[u32]> {
        self.prepare()?;
        Ok(self.mask.as_ref().expect("prepared").as_slice())
    }

    /// Sets the logits of every token that may not come next to minus infinity. `logits`
    /// holds one value per token id.
    pub fn mask_logits(&mut self, logits: &mut [f32]) -> Result<()> {
        let words = self.allowed()?;
        for (chunk, &word) in logits.chunks_mut(32).zip(words) {
            if word == u32::MAX {
                continue;
            }
            for (bit, l) in chunk.iter_mut().enumerate() {
                if word >> bit & 1 == 0 {
                    *l = f32::NEG_INFINITY;
                }
            }
        }
        // Ids past the mask's words (never in the vocabulary) are not allowed either.
        if let Some(rest) = logits.get_mut(words.len() * 32..) {
            rest.fill(f32::NEG_INFINITY);
        }
        Ok(())
    }

    /// Moves past `token`, the one chosen; an error if the grammar does not allow it. An
    /// end-of-sequence token is allowed once the grammar is complete, even where nothing could
    /// follow it (and [`TokenMatcher::finished`] said so already).
    pub fn accept(&mut self, token: u32) -> Result<()> {
        self.mask = None;
        if self.matcher.is_stopped()
            && self.eos.contains(&token)
            && self.matcher.get_error().is_none()
        {
            return Ok(());
        }
        self.matcher
            .consume_token(token)
            .map_err(|e| ConstrainError::Rejected {
                token,
                reason: e.to_string(),
            })
    }

    /// Whether the grammar is complete and allows nothing more (after its end-of-sequence
    /// token, or once nothing can follow).
    pub fn finished(&self) -> bool {
        self.matcher.is_stopped()
    }

    /// Whether the text so far is a complete match (an end-of-sequence token may come next).
    pub fn accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }
}
