//! Choosing the next token from logits: greedy, or temperature / top-k / top-p sampling.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// How to pick tokens. `temperature <= 0` means greedy.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Softmax temperature; 0 picks the most likely token.
    pub temperature: f32,
    /// Keep only the `k` most likely tokens (0 = all).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches `top_p` (1.0 = all).
    pub top_p: f32,
    /// Seed of the sampler's random generator: same seed, same tokens.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// Greedy decoding.
    pub fn greedy() -> Self {
        Self::default()
    }
}

/// Picks tokens according to [`SamplingParams`], with its own seeded generator.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
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
        Sampler { params, rng }
    }

    /// The next token given the logits of the last position.
    pub fn sample(&mut self, logits: &[f32]) -> u32 {
        if self.params.temperature <= 0.0 || logits.len() <= 1 {
            return argmax(logits) as u32;
        }
        let mut order: Vec<usize> = (0..logits.len()).collect();
        order.sort_unstable_by(|&a, &b| logits[b].total_cmp(&logits[a]).then(a.cmp(&b)));
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
    /// [`Sampler::sample`] picks: greedy, or a top-k of at most `k`.
    pub fn fits_candidates(&self, k: usize) -> bool {
        let p = &self.params;
        p.temperature <= 0.0 || (p.top_k > 0 && p.top_k <= k)
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
    /// temperature, cut to the `top_p` nucleus.
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
        let total: f64 = probs.iter().sum();
        let mut r = self.rng.random::<f64>() * total;
        for (&(token, _), &x) in ranked.iter().zip(&probs) {
            if r < x {
                return token;
            }
            r -= x;
        }
        ranked[probs.len() - 1].0
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
        });
        let picks: Vec<u32> = (0..300).map(|_| s.sample(&logits)).collect();
        assert!(picks.iter().all(|&t| t < 2));
        assert!(picks.contains(&0) && picks.contains(&1));
    }
}
