//! The sampling fields of a request, checked and turned into the engine's [`SamplingParams`].

use super::api::Sampling;
use super::error::ApiError;
use kvb_model::generate::SamplingParams;

/// Bias entries a request may carry (OpenAI's own bound).
const MAX_LOGIT_BIAS: usize = 300;

/// `s`'s sampler settings for a vocabulary of `vocab` tokens; a value out of range is a 400
/// naming its field.
pub fn sampling_params(s: &Sampling, vocab: usize) -> Result<SamplingParams, ApiError> {
    let temperature = s.temperature.unwrap_or(1.0);
    within("temperature", temperature, 0.0..=2.0, "between 0 and 2")?;
    let top_p = s.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(bad("top_p", "must be in (0, 1]"));
    }
    let top_k = match s.top_k.unwrap_or(0) {
        -1 | 0 => 0,
        k if k > 0 => k as usize,
        _ => return Err(bad("top_k", "must be positive, or 0 or -1 for every token")),
    };
    let min_p = s.min_p.unwrap_or(0.0);
    within("min_p", min_p, 0.0..=1.0, "between 0 and 1")?;
    let frequency_penalty = s.frequency_penalty.unwrap_or(0.0);
    within(
        "frequency_penalty",
        frequency_penalty,
        -2.0..=2.0,
        "between -2 and 2",
    )?;
    let presence_penalty = s.presence_penalty.unwrap_or(0.0);
    within(
        "presence_penalty",
        presence_penalty,
        -2.0..=2.0,
        "between -2 and 2",
    )?;
    let repetition_penalty = s.repetition_penalty.unwrap_or(1.0);
    if !(repetition_penalty > 0.0 && repetition_penalty <= 10.0) {
        return Err(bad("repetition_penalty", "must be in (0, 10]"));
    }
    let logit_bias = match &s.logit_bias {
        None => Vec::new(),
        Some(map) if map.len() > MAX_LOGIT_BIAS => {
            return Err(bad(
                "logit_bias",
                &format!("holds {} tokens; at most {MAX_LOGIT_BIAS}", map.len()),
            ))
        }
        Some(map) => {
            let mut biases = Vec::with_capacity(map.len());
            for (key, &bias) in map {
                let param = format!("logit_bias.{key}");
                let id = key
                    .parse::<u32>()
                    .ok()
                    .filter(|&id| (id as usize) < vocab)
                    .ok_or_else(|| {
                        ApiError::bad_request(
                            format!("`{param}`: keys are token ids below {vocab}"),
                            Some(&param),
                        )
                    })?;
                within(&param, bias, -100.0..=100.0, "between -100 and 100")?;
                biases.push((id, bias));
            }
            // A map's order is not the request's; the sampler's sums do not depend on it, but
            // a sorted list keeps the settings (and what logs show) the same per request.
            biases.sort_unstable_by_key(|&(id, _)| id);
            biases
        }
    };
    Ok(SamplingParams {
        temperature,
        top_k,
        top_p,
        min_p,
        frequency_penalty,
        presence_penalty,
        repetition_penalty,
        logit_bias,
        seed: s.seed.unwrap_or_else(fresh_seed),
    })
}

/// A seed for a request that gives none: a new one each time, so unseeded sampled requests
/// differ as OpenAI's, vLLM's and llama-server's do (a fixed default repeated every answer).
fn fresh_seed() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    // Each `RandomState` takes new keys (seeded from the OS once per thread, then stepped).
    std::hash::RandomState::new().build_hasher().finish()
}

fn bad(param: &str, what: &str) -> ApiError {
    ApiError::bad_request(format!("`{param}` {what}"), Some(param))
}

/// `value` is finite and within `range`.
fn within(
    param: &str,
    value: f32,
    range: std::ops::RangeInclusive<f32>,
    what: &str,
) -> Result<(), ApiError> {
    if range.contains(&value) {
        Ok(())
    } else {
        Err(bad(param, &format!("must be {what}")))
    }
}
