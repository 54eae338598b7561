//! [`Continuation`]: what happens after each forward pass of a generating sequence: sample, turn
//! the token into text, decide whether to stop. One owner for that logic, whether a sequence runs
//! alone ([`super::decode`]) or in a scheduler's batch.

use super::{GenerateParams, Sampler, StopReason, TextStream};
use crate::error::Result;
use crate::tokenizer::Tokenizer;

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
        }
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
        let token = match (self.forced.get(self.tokens.len()), next) {
            (Some(&forced), _) => forced,
            (None, Next::Logits(logits)) => self.sampler.sample(logits),
            (None, Next::Candidates { ids, values }) => self.sampler.sample_candidates(ids, values),
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
