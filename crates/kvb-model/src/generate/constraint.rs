//! [`TokenConstraint`]: a rule on which tokens may come next (a grammar, a JSON schema), kept
//! apart from the sampler so the model crate needs no grammar engine (kvb-constrain has one).

/// What a constraint's methods report when they fail.
pub type ConstraintError = Box<dyn std::error::Error + Send + Sync>;

/// Which tokens may come next in one sequence. Each step: [`TokenConstraint::prepare`] (may run
/// on another thread while the forward pass computes the logits), [`TokenConstraint::mask`],
/// then [`TokenConstraint::accept`] of the token chosen.
pub trait TokenConstraint: Send {
    /// Works out the tokens allowed next; a second call before [`TokenConstraint::accept`]
    /// returns at once.
    fn prepare(&mut self) -> Result<(), ConstraintError>;
    /// Whether `token` may come next. Exactly the tokens [`TokenConstraint::mask`] keeps, but
    /// cheap without a prepared mask: greedy decoding checks its best token alone.
    fn allows(&mut self, token: u32) -> Result<bool, ConstraintError>;
    /// Sets the logit of every token not allowed next to minus infinity.
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), ConstraintError>;
    /// Moves past the chosen token; an error if it was not allowed.
    fn accept(&mut self, token: u32) -> Result<(), ConstraintError>;
    /// Whether the constrained text is complete and nothing more may follow.
    fn finished(&self) -> bool;
    /// A copy at the same place (for a sequence that forks).
    fn boxed_clone(&self) -> Box<dyn TokenConstraint>;
}

/// A boxed constraint that is `Clone` and `Debug`, so the continuation holding it stays so.
pub(crate) struct Constrained(pub Box<dyn TokenConstraint>);

impl Clone for Constrained {
    fn clone(&self) -> Self {
        Constrained(self.0.boxed_clone())
    }
}

impl std::fmt::Debug for Constrained {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Constrained")
            .field("finished", &self.0.finished())
            .finish()
    }
}
