//! Choosing the next token from logits: greedy, or temperature / top-k / top-p / min-p sampling,
//! after the logits are adjusted by the request's penalties and biases.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use std::collections::{HashMap, HashSet};

/// How to pick tokens. `temperature <= 0` means greedy (after the adjustments below, which
/// apply to greedy choice too, as OpenAI's and vLLM's do).
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; 0 picks the most likely token.
    pub temperature: f32,
    /// Keep only the `k` most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches `top_p` (1.0 = all).
    pub top_p: f32,
    /// Keep only tokens at least `min_p` times as likely as the most likely one (0 = all).
    pub min_p: f32,
    /// Subtracted from a token's logit once per time it was generated already (OpenAI's
    /// `frequency_penalty`; 0 = off, negative favours repeats).
    pub frequency_penalty: f32,
    /// Subtracted from a token's logit if it was generated at all (OpenAI's `presence_penalty`).
    pub presence_penalty: f32,
    /// A token of the prompt or of the output so far has its logit divided by this when
    /// positive, multiplied when negative (transformers' `repetition_penalty`; 1 = off).
    pub repetition_penalty: f32,
    /// Added to the logits of these tokens (OpenAI's `logit_bias`; -100 all but bans a token,
    /// 100 all but forces it).
    pub logit_bias: Vec<(u32, f32)>,
    /// Seed of the sampler's random generator: same seed, same tokens.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            frequency_penalty: 0.0,
            presence_penalty: 0.0,
            repetition_penalty: 1.0,
            logit_bias: Vec::new(),
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding.
    pub fn greedy() -> Self {
        Self::default()
    }

    /// Whether the logits are adjusted before choosing (a penalty or a bias is set).
    pub fn adjusts_logits(&self) -> bool {
        self.frequency_penalty != 0.0
            || self.presence_penalty != 0.0
            || self.repetition_penalty != 1.0
            || !self.logit_bias.is_empty()
    }
}

/// Picks tokens according to [`SamplingParams`], with its own seeded generator and the tokens
/// seen so far (for the penalties).
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
    /// How often each token was generated.
    generated: HashMap<u32, u32>,
    /// Tokens of the prompt (kept only for a repetition penalty).
    prompt: HashSet<u32>,
}

/// The index of the largest value; the lowest index wins a tie (as `torch.argmax`).
pub fn argmax(values: &[f32]) -> usize {
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    best
}

impl Sampler {
    /// A sampler seeded from `params.seed`.
    pub fn new(params: SamplingParams) -> Self {
        let rng = StdRng::seed_from_u64(params.seed);
        Sampler {
            params,
            rng,
            generated: HashMap::new(),
            prompt: HashSet::new(),
        }
    }

    /// Whether it picks the most likely token (temperature 0).
    pub fn greedy(&self) -> bool {
        self.params.temperature <= 0.0
    }

    /// Whether [`Sampler::adjusted`] changes the logits (a penalty or a bias is set).
    pub fn adjusts_logits(&self) -> bool {
        self.params.adjusts_logits()
    }

    /// Takes note of the prompt's tokens, which a repetition penalty covers too.
    pub fn see_prompt(&mut self, tokens: &[u32]) {
        if self.params.repetition_penalty != 1.0 {
            self.prompt.extend(tokens);
        }
    }

    /// Takes note of a generated token (sampled or forced), for the penalties.
    pub fn record(&mut self, token: u32) {
        if self.params.adjusts_logits() {
            *self.generated.entry(token).or_insert(0) += 1;
        }
    }

    /// `logits` adjusted by the biases and penalties, in the order vLLM's sampler applies them:
    /// the bias first (a biased token is then penalised like any other), then repetition, then
    /// frequency and presence.
    pub fn adjusted(&self, logits: &[f32]) -> Vec<f32> {
        let p = &self.params;
        let mut out = logits.to_vec();
        for &(t, bias) in &p.logit_bias {
            if let Some(l) = out.get_mut(t as usize) {
                *l += bias;
            }
        }
        if p.repetition_penalty != 1.0 {
            // Each token once: the prompt's, then generated ones the prompt does not hold.
            let generated = self.generated.keys().filter(|t| !self.prompt.contains(t));
            for &t in self.prompt.iter().chain(generated) {
                if let Some(l) = out.get_mut(t as usize) {
                    *l = if *l > 0.0 {
                        *l / p.repetition_penalty
                    } else {
                        *l * p.repetition_penalty
                    };
                }
            }
        }
        for (&t, &n) in &self.generated {
            if let Some(l) = out.get_mut(t as usize) {
                *l -= p.frequency_penalty * n as f32 + p.presence_penalty;
            }
        }
        out
    }

    /// The next token given the logits of the last position (the model's own; the sampler
    /// adjusts them first).
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.params.adjusts_logits() {
            let adjusted = self.adjusted(logits);
            return self.sample_adjusted(&adjusted);
        }
        self.sample_adjusted(logits)
    }

    /// The next token from logits already adjusted (and masked: a token at minus infinity is
    /// never picked while another is finite).
    pub(crate) fn sample_adjusted(&mut self, logits: &[f32]) -> u32 {
        if self.params.temperature <= 0.0 || logits.len() <= 1 {
            return argmax(logits) as u32;
        }
        let mut order: Vec<usize> = (0..logits.len()).collect();
        let first = |&a: &usize, &b: &usize| logits[b].total_cmp(&logits[a]).then(a.cmp(&b));
        let k = self.params.top_k;
        if k > 0 && k < order.len() {
            // The best k first, then only they are sorted: the same ranking (the order is
            // total), without sorting the whole vocabulary each step.
            order.select_nth_unstable_by(k - 1, first);
            order.truncate(k);
        }
        order.sort_unstable_by(first);
        self.pick(order.into_iter().map(|i| (i as u32, logits[i])).collect())
    }

    /// The next token among candidates: `ids` with their logits `values`, highest first (ties:
    /// lower id first), as [`super::top_candidates`] gives them. The same token, and the same
    /// draws from the generator, as [`Sampler::sample`] of all the logits whenever the
    /// candidates hold every token it would keep: greedy (`ids[0]`; `values` may be empty), or
    /// top-k with `k` at most the candidates.
    pub fn sample_candidates(&mut self, ids: &[u32], values: &[f32]) -> u32 {
        if self.params.temperature <= 0.0 || ids.len() <= 1 {
            // One candidate: every value gives it probability 1 (the draw is still taken).
            if self.params.temperature > 0.0 {
                return self.pick(vec![(ids[0], 0.0)]);
            }
            return ids[0];
        }
        self.pick(ids.iter().copied().zip(values.iter().copied()).collect())
    }

    /// Whether [`Sampler::sample_candidates`] of the best `k` tokens picks what
    /// [`Sampler::sample`] picks: greedy, or a top-k of at most `k`, with no penalty or bias
    /// (which can lift a token from outside the best `k`).
    pub fn fits_candidates(&self, k: usize) -> bool {
        let p = &self.params;
        !p.adjusts_logits() && (p.temperature <= 0.0 || (p.top_k > 0 && p.top_k <= k))
    }

    /// Tokens needed by [`Sampler::sample_candidates`]: 1 when greedy, else `top_k` (0 when
    /// every token may be drawn).
    pub fn candidates_needed(&self) -> usize {
        if self.params.temperature <= 0.0 {
            1
        } else {
            self.params.top_k
        }
    }

    /// Draws from `ranked` (token, logit), highest first: cut to `top_k`, softmax at the
    /// temperature, cut to the `top_p` nucleus, then to the tokens at least `min_p` times as
    /// likely as the first.
    fn pick(&mut self, mut ranked: Vec<(u32, f32)>) -> u32 {
        let p = &self.params;
        if p.top_k > 0 {
            ranked.truncate(p.top_k);
        }
        let max = ranked[0].1;
        let mut probs: Vec<f64> = ranked
            .iter()
            .map(|&(_, l)| (((l - max) / p.temperature) as f64).exp())
            .collect();
        let sum: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|x| *x /= sum);
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            let keep = probs
                .iter()
                .position(|&x| {
                    acc += x;
                    acc >= p.top_p as f64
                })
                .map_or(probs.len(), |i| i + 1);
            probs.truncate(keep);
            ranked.truncate(keep);
        }
        if p.min_p > 0.0 {
            let floor = probs[0] * p.min_p as f64;
            let keep = probs.iter().take_while(|&&x| x >= floor).count().max(1);
            probs.truncate(keep);
            ranked.truncate(keep);
        }
        let total: f64 = probs.iter().sum();
        let mut r = self.rng.random::<f64>() * total;
        for (&(token, _), &x) in ranked.iter().zip(&probs) {
            if r < x {
                return token;
            }
            r -= x;
        }
        // Rounding left `r` past the end: the last token that can be drawn at all.
        let last = probs.iter().rposition(|&x| x > 0.0).unwrap_or(0);
        ranked[last].0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn temperature_zero_is_argmax() {
        let mut s = Sampler::new(SamplingParams::greedy());
        assert_eq!(s.sample(&[0.1, 3.0, 2.9, 3.0]), 1);
    }

    #[test]
    fn same_seed_same_tokens_and_top_k_one_is_greedy() {
        let logits: Vec<f32> = (0..50).map(|i| ((i * 37) % 11) as f32 * 0.3).collect();
        let params = SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.9,
            seed: 7,
            ..SamplingParams::default()
        };
        let a: Vec<u32> = {
            let mut s = Sampler::new(params.clone());
            (0..20).map(|_| s.sample(&logits)).collect()
        };
        let b: Vec<u32> = {
            let mut s = Sampler::new(params);
            (0..20).map(|_| s.sample(&logits)).collect()
        };
        assert_eq!(a, b);
        let mut k1 = Sampler::new(SamplingParams {
            temperature: 2.0,
            top_k: 1,
            top_p: 1.0,
            seed: 3,
            ..SamplingParams::default()
        });
        assert!((0..20).all(|_| k1.sample(&logits) == argmax(&logits) as u32));
    }

    /// Greedy and top-k draw the same tokens, step after step, from the best `k` candidates
    /// (as the device hands them over) as from all the logits.
    #[test]
    fn candidates_give_the_tokens_of_all_the_logits() {
        let logits: Vec<f32> = (0..300).map(|i| ((i * 7919) % 101) as f32 * 0.05).collect();
        let mut ranked: Vec<u32> = (0..300).collect();
        ranked.sort_by(|&a, &b| {
            logits[b as usize]
                .total_cmp(&logits[a as usize])
                .then(a.cmp(&b))
        });
        for (temperature, top_k, top_p) in
            [(0.0, 0, 1.0), (0.8, 1, 1.0), (1.3, 5, 1.0), (0.7, 40, 0.9)]
        {
            let params = SamplingParams {
                temperature,
                top_k,
                top_p,
                seed: 11,
                ..SamplingParams::default()
            };
            let mut all = Sampler::new(params.clone());
            let mut some = Sampler::new(params);
            let k = all.candidates_needed().max(1);
            assert!(all.fits_candidates(k) && !all.fits_candidates(k - 1) || temperature <= 0.0);
            let ids = &ranked[..k];
            let values: Vec<f32> = ids.iter().map(|&i| logits[i as usize]).collect();
            let a: Vec<u32> = (0..50).map(|_| all.sample(&logits)).collect();
            let b: Vec<u32> = (0..50)
                .map(|_| some.sample_candidates(ids, &values))
                .collect();
            assert_eq!(
                a, b,
                "temperature {temperature}, top_k {top_k}, top_p {top_p}"
            );
        }
        let unbounded = Sampler::new(SamplingParams {
            temperature: 1.0,
            ..SamplingParams::default()
        });
        assert!(!unbounded.fits_candidates(64));
    }

    #[test]
    fn top_p_never_picks_outside_the_nucleus() {
        // Probabilities ~0.5, 0.3, 0.2: top_p 0.6 keeps the first two only.
        let logits = [0.5f32.ln(), 0.3f32.ln(), 0.2f32.ln()];
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_k: 0,
            top_p: 0.6,
            seed: 1,
            ..SamplingParams::default()
        });
        let picks: Vec<u32> = (0..300).map(|_| s.sample(&logits)).collect();
        assert!(picks.iter().all(|&t| t < 2));
        assert!(picks.contains(&0) && picks.contains(&1));
    }

    /// A bias of 100 forces a token greedy decoding would not pick; -100 bans the one it would.
    #[test]
    fn logit_bias_forces_and_bans_tokens() {
        let logits = [1.0f32, 3.0, 2.0, 0.5];
        let bias = |logit_bias| SamplingParams {
            logit_bias,
            ..SamplingParams::default()
        };
        assert_eq!(Sampler::new(bias(vec![(3, 100.0)])).sample(&logits), 3);
        assert_eq!(Sampler::new(bias(vec![(1, -100.0)])).sample(&logits), 2);
        // An id beyond the vocabulary changes nothing.
        assert_eq!(Sampler::new(bias(vec![(99, 100.0)])).sample(&logits), 1);
    }

    /// Frequency penalties grow with each repeat, presence penalties do not; both cover only
    /// generated tokens, and greedy decoding moves on once the best token is penalised enough.
    #[test]
    fn frequency_and_presence_penalties_lower_generated_tokens() {
        let logits = [2.0f32, 1.5, 1.0, 0.0];
        let mut s = Sampler::new(SamplingParams {
            frequency_penalty: 0.25,
            presence_penalty: 0.5,
            ..SamplingParams::default()
        });
        s.see_prompt(&[2, 3]);
        for t in [0, 0, 1] {
            s.record(t);
        }
        assert_eq!(
            s.adjusted(&logits),
            [2.0 - 0.5 - 0.5, 1.5 - 0.25 - 0.5, 1.0, 0.0]
        );
        // Greedy under a frequency penalty of 0.6: token 0 (2.0) loses its lead over 1 (1.5)
        // after one pick, wins again once 1 is penalised too, then 2 (1.0) comes up.
        let mut greedy = Sampler::new(SamplingParams {
            frequency_penalty: 0.6,
            ..SamplingParams::default()
        });
        let picks: Vec<u32> = (0..4)
            .map(|_| {
                let t = greedy.sample(&logits);
                greedy.record(t);
                t
            })
            .collect();
        assert_eq!(picks, [0, 1, 0, 2]);
        let plain = Sampler::new(SamplingParams::greedy());
        assert_eq!(plain.adjusted(&logits), logits);
    }

    /// A repetition penalty divides positive logits and multiplies negative ones, of prompt and
    /// generated tokens alike, once per token however often it occurs.
    #[test]
    fn repetition_penalty_covers_prompt_and_output() {
        let logits = [2.0f32, -1.0, 3.0, 1.0];
        let mut s = Sampler::new(SamplingParams {
            repetition_penalty: 2.0,
            ..SamplingParams::default()
        });
        s.see_prompt(&[0, 1, 0]);
        s.record(2);
        s.record(2);
        assert_eq!(s.adjusted(&logits), [1.0, -2.0, 1.5, 1.0]);
        assert!(!s.fits_candidates(64), "penalties need all the logits");
        // A bias comes first: a favoured token of the prompt is penalised with its bias.
        let mut biased = Sampler::new(SamplingParams {
            repetition_penalty: 2.0,
            logit_bias: vec![(0, 4.0)],
            ..SamplingParams::default()
        });
        biased.see_prompt(&[0]);
        assert_eq!(biased.adjusted(&logits)[0], 3.0);
    }

    #[test]
    fn min_p_never_picks_the_unlikely() {
        // Probabilities 0.5, 0.3, 0.2: min_p 0.5 keeps those of at least 0.25, the first two.
        let logits = [0.5f32.ln(), 0.3f32.ln(), 0.2f32.ln()];
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            min_p: 0.5,
            seed: 5,
            ..SamplingParams::default()
        });
        let picks: Vec<u32> = (0..300).map(|_| s.sample(&logits)).collect();
        assert!(picks.iter().all(|&t| t < 2));
        assert!(picks.contains(&0) && picks.contains(&1));
    }
}
