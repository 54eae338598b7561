//! Structured output: a request's [`Grammar`] compiled against the model's vocabulary (built
//! once, on the first request that asks) into the constraint its continuation samples under.

use crate::EngineError;
use kvb_constrain::{Grammar, TokenMatcher, Vocabulary};
use kvb_model::generate::{ConstraintError, TokenConstraint};
use kvb_model::Tokenizer;
use std::sync::OnceLock;

/// The model's vocabulary for grammars, built when first needed (it reads every token).
#[derive(Default)]
pub(crate) struct Grammars {
    vocabulary: OnceLock<Result<Vocabulary, String>>,
}

impl Grammars {
    /// `grammar` as a constraint over `tokenizer`'s tokens (`size` logits, `eos` ending).
    /// A grammar that cannot be followed is [`EngineError::Grammar`].
    pub fn constraint(
        &self,
        grammar: &Grammar,
        tokenizer: &Tokenizer,
        eos: &[u32],
        size: usize,
    ) -> Result<Box<dyn TokenConstraint>, EngineError> {
        let vocabulary = self
            .vocabulary
            .get_or_init(|| {
                Vocabulary::new(tokenizer.inner(), eos, size).map_err(|e| e.to_string())
            })
            .as_ref()
            .map_err(|e| EngineError::Grammar(format!("this model's tokenizer: {e}")))?;
        let matcher = vocabulary
            .matcher(grammar)
            .map_err(|e| EngineError::Grammar(e.to_string()))?;
        Ok(Box::new(Guided(matcher)))
    }
}

/// llguidance's matcher as the sampler's constraint.
#[derive(Clone)]
struct Guided(TokenMatcher);

impl TokenConstraint for Guided {
    fn prepare(&mut self) -> Result<(), ConstraintError> {
        Ok(self.0.prepare()?)
    }

    fn allows(&mut self, token: u32) -> Result<bool, ConstraintError> {
        Ok(self.0.check(token)?)
    }

    fn mask(&mut self, logits: &mut [f32]) -> Result<(), ConstraintError> {
        Ok(self.0.mask_logits(logits)?)
    }

    fn accept(&mut self, token: u32) -> Result<(), ConstraintError> {
        Ok(self.0.accept(token)?)
    }

    fn finished(&self) -> bool {
        self.0.finished()
    }

    fn boxed_clone(&self) -> Box<dyn TokenConstraint> {
        Box::new(self.clone())
    }
}
