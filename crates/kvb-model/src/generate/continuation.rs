//! [`Continuation`]: what happens after each forward pass of a generating sequence: sample, turn
//! the token into text, decide whether to stop. One owner for that logic, whether a sequence runs
//! alone ([`super::decode`]) or in a scheduler's batch.

use super::constraint::Constrained;
use super::{argmax, GenerateParams, Sampler, StopReason, TextStream, TokenConstraint};
use crate::error::{ModelError, Result};
use crate::tokenizer::Tokenizer;
use std::borrow::Cow;

/// What a step samples from.
#[derive(Debug, Clone, Copy)]
pub enum Next<'a> {
    /// The logits of the sequence's last position.
    Logits(&'a [f32]),
    /// Its best tokens, highest first, with their logits ([`super::top_candidates`]); enough
    /// where [`Sampler::fits_candidates`] says so.
    Candidates {
        /// Token ids.
        ids: &'a [u32],
        /// Their logits (may be empty for one candidate).
        values: &'a [f32],
    },
}

/// The outcome of one [`Continuation::step`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Step {
    /// The token sampled.
    pub token: u32,
    /// Text that became final with it (possibly empty).
    pub text: String,
    /// Set when generation ends with this token.
    pub stop: Option<StopReason>,
}

/// The generation state of one sequence.
#[derive(Debug, Clone)]
pub struct Continuation {
    params: GenerateParams,
    sampler: Sampler,
    stream: TextStream,
    eos: Vec<u32>,
    tokens: Vec<u32>,
    stop: Option<StopReason>,
    /// Teacher forcing: the tokens to emit, in order, instead of sampling.
    forced: Vec<u32>,
    /// Which tokens may come next (a grammar), when the request has one.
    constraint: Option<Constrained>,
}

impl Continuation {
    /// Generation with `params`; `eos` lists the end-of-sequence ids (see [`super::eos_ids`]).
    pub fn new(params: GenerateParams, eos: Vec<u32>) -> Self {
        let stop = (params.max_new_tokens == 0).then_some(StopReason::MaxTokens);
        Continuation {
            sampler: Sampler::new(params.sampling.clone()),
            stream: TextStream::new(&params.stop_strings),
            params,
            eos,
            tokens: Vec::new(),
            stop,
            forced: Vec::new(),
            constraint: None,
        }
    }

    /// Only tokens `constraint` allows are sampled (forced tokens must fit it too), and
    /// generation ends once it is complete.
    pub fn constrained(mut self, constraint: Box<dyn TokenConstraint>) -> Self {
        self.constraint = Some(Constrained(constraint));
        self
    }

    /// Whether each step needs the constraint's whole mask (it samples; greedy decoding checks
    /// its best token first), which a scheduler can prepare while the forward pass runs.
    pub fn needs_mask(&self) -> bool {
        self.constraint.is_some() && !self.sampler.greedy()
    }

    /// Takes the constraint out, to prepare its mask elsewhere while the forward pass runs;
    /// put it back with [`Continuation::restore_constraint`] before the step.
    pub fn take_constraint(&mut self) -> Option<Box<dyn TokenConstraint>> {
        self.constraint.take().map(|c| c.0)
    }

    /// Puts back what [`Continuation::take_constraint`] took.
    pub fn restore_constraint(&mut self, constraint: Box<dyn TokenConstraint>) {
        self.constraint = Some(Constrained(constraint));
    }

    /// Whether the step can sample from the device's best `k` candidates rather than all the
    /// logits: the sampler says so ([`Sampler::fits_candidates`]) and no constraint masks them.
    pub fn fits_candidates(&self, k: usize) -> bool {
        self.constraint.is_none() && self.sampler.fits_candidates(k)
    }

    /// The prompt's tokens, which a repetition penalty covers as well as the output.
    pub fn with_prompt(mut self, prompt: &[u32]) -> Self {
        self.sampler.see_prompt(prompt);
        self
    }

    /// Teacher forcing: the next tokens are `tokens`, in order, whatever the logits say; once they
    /// run out, sampling resumes. A fidelity check feeds a reference answer this way and reads the
    /// logits at each of its positions (stops still apply: forcing a finished answer ends with it).
    pub fn forcing(mut self, tokens: Vec<u32>) -> Self {
        self.forced = tokens;
        self
    }

    /// Samples the next token from `logits` (the distribution after the sequence's last token).
    /// The token would be fed back at `position`; at the end of a context of `max_positions` it
    /// cannot be, and generation ends there.
    pub fn step(
        &mut self,
        tokenizer: &Tokenizer,
        logits: &[f32],
        position: usize,
        max_positions: usize,
    ) -> Result<Step> {
        self.step_from(tokenizer, Next::Logits(logits), position, max_positions)
    }

    /// The sampler, to ask what a step needs ([`Sampler::fits_candidates`]).
    pub fn sampler(&self) -> &Sampler {
        &self.sampler
    }

    /// [`Continuation::step`] from all the logits or from the device's best candidates.
    pub fn step_from(
        &mut self,
        tokenizer: &Tokenizer,
        next: Next<'_>,
        position: usize,
        max_positions: usize,
    ) -> Result<Step> {
        let constraint_err = |e: super::ConstraintError| ModelError::Constraint(e.to_string());
        let token = match (
            self.forced.get(self.tokens.len()),
            next,
            &mut self.constraint,
        ) {
            (Some(&forced), _, _) => forced,
            (None, Next::Logits(logits), Some(c)) => {
                // A copy only where the logits change: penalties and biases, or the mask.
                let adjusted = match self.sampler.adjusts_logits() {
                    true => Cow::Owned(self.sampler.adjusted(logits)),
                    false => Cow::Borrowed(logits),
                };
                // Greedy: the best token, if the constraint allows it, is the best allowed one,
                // and checking it alone is far cheaper than the whole mask.
                let best = argmax(&adjusted) as u32;
                if self.sampler.greedy() && c.0.allows(best).map_err(constraint_err)? {
                    best
                } else {
                    let mut masked = adjusted.into_owned();
                    c.0.mask(&mut masked).map_err(constraint_err)?;
                    self.sampler.sample_adjusted(&masked)
                }
            }
            (None, Next::Candidates { .. }, Some(_)) => {
                return Err(ModelError::Constraint(
                    "a constrained step needs all the logits, not the best candidates".into(),
                ))
            }
            (None, Next::Logits(logits), None) => self.sampler.sample(logits),
            (None, Next::Candidates { ids, values }, None) => {
                self.sampler.sample_candidates(ids, values)
            }
        };
        let grammar_done = match &mut self.constraint {
            Some(c) => {
                c.0.accept(token).map_err(constraint_err)?;
                c.0.finished()
            }
            None => false,
        };
        self.sampler.record(token);
        self.tokens.push(token);
        if self.params.stop_at_eos && self.eos.contains(&token) {
            self.stop = Some(StopReason::Eos);
            return Ok(Step {
                token,
                text: String::new(),
                stop: self.stop,
            });
        }
        let text = self.stream.push(tokenizer, token)?;
        self.stop = if self.stream.stopped() {
            Some(StopReason::StopString)
        } else if grammar_done {
            // Complete: nothing but an end-of-sequence token could follow.
            Some(StopReason::Eos)
        } else if self.tokens.len() >= self.params.max_new_tokens {
            Some(StopReason::MaxTokens)
        } else if position >= max_positions {
            Some(StopReason::ContextFull)
        } else {
            None
        };
        Ok(Step {
            token,
            text,
            stop: self.stop,
        })
    }

    /// Why generation ended, once it has.
    pub fn stop(&self) -> Option<StopReason> {
        self.stop
    }

    /// Text held back (a possible stop string's start, an incomplete character) that becomes final
    /// when generation ends.
    pub fn finish(&mut self) -> String {
        self.stream.finish()
    }

    /// Tokens generated so far.
    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    /// Text generated so far (without a stop string).
    pub fn text(&self) -> &str {
        self.stream.text()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::generate::{ConstraintError, SamplingParams};

    fn tokenizer() -> Tokenizer {
        Tokenizer::from_json(include_str!(
            "../../../../fixtures/tiny/llama/tokenizer.json"
        ))
        .unwrap()
    }

    /// Allows only tokens of `allowed`, `length` of them, then ends.
    #[derive(Clone)]
    struct OnlyThese {
        allowed: Vec<u32>,
        length: usize,
        taken: usize,
    }

    impl TokenConstraint for OnlyThese {
        fn prepare(&mut self) -> std::result::Result<(), ConstraintError> {
            Ok(())
        }
        fn allows(&mut self, token: u32) -> std::result::Result<bool, ConstraintError> {
            Ok(self.allowed.contains(&token) && self.taken < self.length)
        }
        fn mask(&mut self, logits: &mut [f32]) -> std::result::Result<(), ConstraintError> {
            for (t, l) in logits.iter_mut().enumerate() {
                if !self.allowed.contains(&(t as u32)) {
                    *l = f32::NEG_INFINITY;
                }
            }
            Ok(())
        }
        fn accept(&mut self, token: u32) -> std::result::Result<(), ConstraintError> {
            if !self.allowed.contains(&token) || self.taken == self.length {
                return Err(format!("token {token} not allowed").into());
            }
            self.taken += 1;
            Ok(())
        }
        fn finished(&self) -> bool {
            self.taken == self.length
        }
        fn boxed_clone(&self) -> Box<dyn TokenConstraint> {
            Box::new(self.clone())
        }
    }

    fn only(allowed: &[u32], length: usize) -> Box<dyn TokenConstraint> {
        Box::new(OnlyThese {
            allowed: allowed.to_vec(),
            length,
            taken: 0,
        })
    }

    fn params(temperature: f32) -> GenerateParams {
        GenerateParams {
            max_new_tokens: 10,
            sampling: SamplingParams {
                temperature,
                seed: 9,
                ..SamplingParams::default()
            },
            ..GenerateParams::default()
        }
    }

    /// Greedy and sampled choices stay within the allowed tokens, whatever the logits favour,
    /// and generation stops once the constraint is complete.
    #[test]
    fn a_constraint_decides_which_tokens_can_be_chosen() {
        let tok = tokenizer();
        let logits: Vec<f32> = (0..512).map(|i| (i % 97) as f32 * 0.1).collect();
        for temperature in [0.0, 1.0] {
            let mut run =
                Continuation::new(params(temperature), vec![1]).constrained(only(&[40, 41, 42], 3));
            assert!(!run.fits_candidates(64));
            let mut picked = Vec::new();
            for pos in 0..3 {
                let step = run.step(&tok, &logits, 10 + pos, 100).unwrap();
                picked.push(step.token);
                assert_eq!(step.stop.is_some(), pos == 2, "stops once complete");
            }
            assert!(
                picked.iter().all(|t| [40, 41, 42].contains(t)),
                "{picked:?}"
            );
            assert_eq!(run.stop(), Some(StopReason::Eos));
        }
        let free = Continuation::new(params(0.0), vec![1]);
        assert!(free.fits_candidates(64));
    }

    /// A forced token the constraint refuses, or candidates in place of logits, are errors.
    #[test]
    fn what_a_constraint_refuses_is_an_error() {
        let tok = tokenizer();
        let logits = vec![0.0f32; 512];
        let mut forced = Continuation::new(params(0.0), vec![1])
            .forcing(vec![7])
            .constrained(only(&[40], 3));
        let err = forced.step(&tok, &logits, 0, 100).unwrap_err();
        assert!(matches!(err, ModelError::Constraint(_)), "{err}");
        let mut run = Continuation::new(params(0.0), vec![1]).constrained(only(&[40], 3));
        let next = Next::Candidates {
            ids: &[40],
            values: &[],
        };
        assert!(run.step_from(&tok, next, 0, 100).is_err());
        // Taken out and put back, the constraint still holds.
        let c = run.take_constraint().unwrap();
        run.restore_constraint(c);
        assert_eq!(run.step(&tok, &logits, 0, 100).unwrap().token, 40);
    }
}
