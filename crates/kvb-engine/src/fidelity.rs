//! How close reuse stays to a full prefill, on a user's own prompts.

use crate::config::{GenerateOptions, GenerationMode};
use crate::{Engine, EngineError};
use kvb_model::ModelBackend;

/// Fidelity of chunk reuse against Baseline over a set of prompts (greedy decoding).
#[derive(Debug, Clone, PartialEq)]
pub struct FidelityReport {
    /// Prompts compared.
    pub prompts: usize,
    /// Prompts whose greedy output was identical.
    pub identical: usize,
    /// Mean fraction of generated positions with the same token as Baseline.
    pub token_agreement: f64,
    /// Mean KL(Baseline || reuse) of the first-token distributions, in nats.
    pub mean_kl: f64,
    /// Largest such KL.
    pub max_kl: f64,
    /// Recomputed tokens over cached tokens, over all prompts.
    pub recompute_fraction: f64,
    /// Cached tokens over prompt tokens, over all prompts.
    pub reuse_ratio: f64,
}

/// Softmax of logits in f64.
fn softmax(logits: &[f32]) -> Vec<f64> {
    let max = logits.iter().fold(f32::NEG_INFINITY, |m, &x| m.max(x)) as f64;
    let e: Vec<f64> = logits.iter().map(|&x| (x as f64 - max).exp()).collect();
    let s: f64 = e.iter().sum();
    e.into_iter().map(|x| x / s).collect()
}

/// KL(p || q) between the softmax distributions of two logit vectors, in nats.
pub fn kl_divergence(p_logits: &[f32], q_logits: &[f32]) -> f64 {
    let (p, q) = (softmax(p_logits), softmax(q_logits));
    p.iter()
        .zip(&q)
        .filter(|(a, _)| **a > 0.0)
        .map(|(a, b)| a * (a / b.max(1e-300)).ln())
        .sum()
}

/// Fraction of positions (over the longer output) where two token sequences agree.
pub fn token_agreement(a: &[u32], b: &[u32]) -> f64 {
    let len = a.len().max(b.len());
    if len == 0 {
        return 1.0;
    }
    a.iter().zip(b).filter(|(x, y)| x == y).count() as f64 / len as f64
}

impl<B: ModelBackend> Engine<B> {
    /// Runs each prompt in Baseline and in ChunkReuse (against the cache as it stands: warm your
    /// documents first) and reports how close reuse stays. The reuse runs store nothing new beyond
    /// what a normal request stores.
    pub fn verify_correctness(
        &self,
        prompts: &[&str],
        max_new_tokens: usize,
    ) -> Result<FidelityReport, EngineError> {
        let mut r = FidelityReport {
            prompts: prompts.len(),
            identical: 0,
            token_agreement: 0.0,
            mean_kl: 0.0,
            max_kl: 0.0,
            recompute_fraction: 0.0,
            reuse_ratio: 0.0,
        };
        let (mut cached, mut recomputed, mut prompt_tokens) = (0usize, 0usize, 0usize);
        for p in prompts {
            let base = self.generate(
                p,
                &GenerateOptions {
                    max_new_tokens,
                    mode: GenerationMode::Baseline,
                    ..Default::default()
                },
                &mut |_| {},
            )?;
            let reuse = self.generate(
                p,
                &GenerateOptions {
                    max_new_tokens,
                    mode: GenerationMode::ChunkReuse,
                    ..Default::default()
                },
                &mut |_| {},
            )?;
            if base.token_ids == reuse.token_ids {
                r.identical += 1;
            }
            r.token_agreement += token_agreement(&base.token_ids, &reuse.token_ids);
            let kl = kl_divergence(&base.first_logits, &reuse.first_logits);
            r.mean_kl += kl;
            r.max_kl = r.max_kl.max(kl);
            cached += reuse.cached_tokens;
            recomputed += reuse.recomputed_tokens;
            prompt_tokens += reuse.prompt_tokens;
        }
        let n = prompts.len().max(1) as f64;
        r.token_agreement /= n;
        r.mean_kl /= n;
        r.recompute_fraction = if cached == 0 {
            0.0
        } else {
            recomputed as f64 / cached as f64
        };
        r.reuse_ratio = if prompt_tokens == 0 {
            0.0
        } else {
            cached as f64 / prompt_tokens as f64
        };
        Ok(r)
    }
}
