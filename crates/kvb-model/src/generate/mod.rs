//! Generation: prefill, then one token at a time until EOS, a stop string or the token budget.

mod candidates;
mod constraint;
mod continuation;
mod logprobs;
mod sampler;
mod text_stream;

pub use candidates::{top_candidates, Candidates, MAX_DEVICE_K};
pub use constraint::{ConstraintError, TokenConstraint};
pub use continuation::{Continuation, Next, Step};
pub use logprobs::{token_logprobs, TokenLogprobs};
pub use sampler::{argmax, Sampler, SamplingParams};
pub use text_stream::TextStream;

use crate::error::{ModelError, Result};
use crate::kv_cache::KvCache;
use crate::model::{LogitsFor, Model, ModelBackend};
use crate::tokenizer::Tokenizer;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use std::time::{Duration, Instant};

/// What to generate.
#[derive(Debug, Clone)]
pub struct GenerateParams {
    /// Upper bound on generated tokens.
    pub max_new_tokens: usize,
    /// Greedy or sampled.
    pub sampling: SamplingParams,
    /// Generation stops when the text contains one of these; it is not part of the output.
    pub stop_strings: Vec<String>,
    /// Whether an end-of-sequence token stops generation.
    pub stop_at_eos: bool,
}

impl Default for GenerateParams {
    fn default() -> Self {
        GenerateParams {
            max_new_tokens: 64,
            sampling: SamplingParams::default(),
            stop_strings: Vec::new(),
            stop_at_eos: true,
        }
    }
}

/// Why generation ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// An end-of-sequence token was produced.
    Eos,
    /// A stop string appeared in the text.
    StopString,
    /// `max_new_tokens` were produced.
    MaxTokens,
    /// The model's context is full.
    ContextFull,
}

/// One streamed step: the token and the text it made final (possibly empty).
#[derive(Debug, Clone, Copy)]
pub struct StreamEvent<'a> {
    /// The token just generated.
    pub token: u32,
    /// Text that became final with it.
    pub text: &'a str,
}

/// The outcome of a decode loop.
#[derive(Debug, Clone)]
pub struct Decoded {
    /// Generated token ids (an EOS that stopped generation included).
    pub tokens: Vec<u32>,
    /// Generated text, without special tokens or a stop string.
    pub text: String,
    /// Why it stopped.
    pub stop: StopReason,
    /// Time spent in decode steps (every token after the first).
    pub decode_time: Duration,
}

/// A full generation from a prompt, with its timings.
#[derive(Debug, Clone)]
pub struct Generation {
    /// The decode outcome.
    pub decoded: Decoded,
    /// Prompt length in tokens.
    pub prompt_tokens: usize,
    /// From the call to the moment the first token id was known (prefill and first sampling).
    pub ttft: Duration,
    /// From the call to the end.
    pub total: Duration,
}

/// The tokens that end a sequence: the config's EOS ids and the tokenizer's EOS token.
pub fn eos_ids(model_eos: &[u32], tokenizer: &Tokenizer) -> Vec<u32> {
    let mut ids = model_eos.to_vec();
    if let Some(id) = tokenizer.eos_token().and_then(|t| tokenizer.token_id(t)) {
        if !ids.contains(&id) {
            ids.push(id);
        }
    }
    ids
}

/// The values of a `[1, vocab]` logits tensor on the host.
pub fn logits_to_vec<B: Backend>(logits: Tensor<B, 2>) -> Result<Vec<f32>> {
    Ok(crate::to_host_f32(logits))
}

/// The values of some rows of a `[rows, vocab]` logits tensor on the host, in the order of
/// `rows`: on a GPU a step whose other rows chose their tokens there reads only these (a
/// sequence's first token keeps its logits), not a vocabulary for every row.
pub fn logits_rows_to_vec<B: Backend>(logits: Tensor<B, 2>, rows: &[usize]) -> Result<Vec<f32>> {
    let [count, _] = logits.dims();
    if let Some(&r) = rows.iter().find(|&&r| r >= count) {
        return Err(ModelError::Forward(format!("logits row {r} of {count}")));
    }
    if rows.len() == count && rows.iter().enumerate().all(|(i, &r)| i == r) {
        return logits_to_vec(logits);
    }
    let idx: Vec<i64> = rows.iter().map(|&r| r as i64).collect();
    let idx = Tensor::<B, 1, Int>::from_data(TensorData::new(idx, [rows.len()]), &logits.device());
    kvb_attn::host_work::uploaded(1);
    kvb_attn::host_work::launched(1);
    logits_to_vec(logits.select(0, idx))
}

/// Continues a sequence whose prompt already sits in `cache`, starting from the logits of its
/// last position. New tokens take positions `next_position..` and are appended to `cache`.
pub fn decode<B: ModelBackend>(
    model: &Model<B>,
    tokenizer: &Tokenizer,
    cache: &mut KvCache<B>,
    first_logits: Vec<f32>,
    next_position: usize,
    params: &GenerateParams,
    on_token: &mut dyn FnMut(StreamEvent<'_>),
) -> Result<Decoded> {
    let eos = eos_ids(&model.config().eos_token_ids, tokenizer);
    let mut run = Continuation::new(params.clone(), eos);
    let max_positions = model.config().max_position_embeddings;
    let mut logits = first_logits;
    let mut position = next_position;
    let mut decode_time = Duration::ZERO;
    let stop = loop {
        if let Some(stop) = run.stop() {
            break stop;
        }
        let step = run.step(tokenizer, &logits, position, max_positions)?;
        on_token(StreamEvent {
            token: step.token,
            text: &step.text,
        });
        if let Some(stop) = step.stop {
            break stop;
        }
        let t = Instant::now();
        let out = model.forward(&[step.token], &[position], cache, LogitsFor::Last)?;
        logits = logits_to_vec(out)?;
        decode_time += t.elapsed();
        position += 1;
    };
    let rest = run.finish();
    if !rest.is_empty() {
        on_token(StreamEvent {
            token: *run.tokens().last().unwrap_or(&0),
            text: &rest,
        });
    }
    Ok(Decoded {
        tokens: run.tokens().to_vec(),
        text: run.text().to_string(),
        stop,
        decode_time,
    })
}

/// Prefills `prompt` at positions `0..` into a fresh cache and generates from it.
pub fn generate<B: ModelBackend>(
    model: &Model<B>,
    tokenizer: &Tokenizer,
    prompt: &[u32],
    params: &GenerateParams,
    on_token: &mut dyn FnMut(StreamEvent<'_>),
) -> Result<Generation> {
    let start = Instant::now();
    let max = model.config().max_position_embeddings;
    if prompt.len() >= max {
        return Err(ModelError::Forward(format!(
            "the prompt has {} tokens; the model's context holds {max}",
            prompt.len()
        )));
    }
    let mut cache = model.new_cache();
    let positions: Vec<usize> = (0..prompt.len()).collect();
    let logits = logits_to_vec(model.forward(prompt, &positions, &mut cache, LogitsFor::Last)?)?;
    let mut ttft = None;
    let decoded = decode(
        model,
        tokenizer,
        &mut cache,
        logits,
        prompt.len(),
        params,
        &mut |event| {
            ttft.get_or_insert_with(|| start.elapsed());
            on_token(event)
        },
    )?;
    Ok(Generation {
        decoded,
        prompt_tokens: prompt.len(),
        ttft: ttft.unwrap_or_else(|| start.elapsed()),
        total: start.elapsed(),
    })
}
