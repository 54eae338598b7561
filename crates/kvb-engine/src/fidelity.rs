//! How close reuse stays to a full prefill, on a user's own prompts, measured so that one flipped
//! token does not compound, and set beside the noise of changes people already accept.
//!
//! Counting agreeing greedy tokens over a long answer is a blunt measure: once one near-tied token
//! flips, every later token is compared against another text. So each comparison *teacher-forces*
//! Baseline's answer (feeds its tokens whatever the compared run predicts) and compares the two
//! distributions at every answer position: top-1 agreement and KL(Baseline || compared). Whether
//! the free-running greedy answer is identical is reported beside them.
//!
//! The *noise floor* runs the same measures on the same prompts for changes of precision people
//! accept every day ([`NoiseFloor`]): the prompt's K/V read back from the chunk store at KIVI int8
//! and int4, a bf16 forward pass (weights and activations rounded to bf16,
//! [`kvb_model::ComputePrecision::Bf16`]), and for integer weights the products with 8-bit
//! activations that llama.cpp computes ([`kvb_model::ActivationPrecision::Q8`]).

use crate::config::{EngineConfig, GenerateOptions, GenerationMode, KvPrecision};
use crate::result::GenerationResult;
use crate::{Engine, EngineError};
use kvb_model::generate::argmax;
use kvb_model::{ActivationPrecision, ModelBackend};

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

/// Per-position agreement of two runs over the same tokens: `(positions whose top tokens agree,
/// KL(reference || other) at each position)`, over the positions both have.
pub fn compare_positions(reference: &[Vec<f32>], other: &[Vec<f32>]) -> (usize, Vec<f64>) {
    let agree = reference
        .iter()
        .zip(other)
        .filter(|(r, o)| argmax(r) == argmax(o))
        .count();
    let kls = reference
        .iter()
        .zip(other)
        .map(|(r, o)| kl_divergence(r, o))
        .collect();
    (agree, kls)
}

/// Baseline's answer to a prompt: what every comparison is measured against.
#[derive(Debug, Clone)]
pub struct Reference {
    /// The prompt's token ids.
    pub prompt: Vec<u32>,
    /// Baseline's greedy answer.
    pub answer: Vec<u32>,
    /// Baseline's logits at each answer position (the one that predicted each answer token).
    pub logits: Vec<Vec<f32>>,
    /// The token budget the answer was generated with (a compared greedy run gets the same).
    pub max_new_tokens: usize,
}

/// What a comparison ran against Baseline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Compared {
    /// Chunk reuse on the engine's cache as it stands (warm documents first).
    Reuse,
    /// Noise floor: the prompt's K/V read back from the chunk store at this precision.
    StoredKv(KvPrecision),
    /// Noise floor: a bf16 forward pass.
    Bf16Forward,
    /// Noise floor: products with 8-bit activations, as llama.cpp computes on a quantized
    /// model (`--activations q8`).
    Q8Activations,
}

impl std::fmt::Display for Compared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Compared::Reuse => f.write_str("reuse"),
            Compared::StoredKv(p) => write!(f, "K/V stored {p}"),
            Compared::Bf16Forward => f.write_str("bf16 forward"),
            Compared::Q8Activations => f.write_str("q8 activations"),
        }
    }
}

/// One prompt compared with Baseline.
#[derive(Debug, Clone, PartialEq)]
pub struct PromptFidelity {
    /// What ran.
    pub compared: Compared,
    /// Prompt length.
    pub prompt_tokens: usize,
    /// Baseline's answer length (the positions compared).
    pub answer_tokens: usize,
    /// Whether the compared run's free greedy answer equals Baseline's.
    pub identical: bool,
    /// Answer positions whose top token equals Baseline's, teacher-forced.
    pub agreeing: usize,
    /// KL(Baseline || compared) at each answer position, in nats, teacher-forced.
    pub kl: Vec<f64>,
    /// Prompt tokens whose K/V came from the cache.
    pub cached_tokens: usize,
    /// Of those, tokens recomputed by repair.
    pub recomputed_tokens: usize,
}

impl PromptFidelity {
    /// Share of answer positions whose top token agrees (1 for an empty answer).
    pub fn top1_agreement(&self) -> f64 {
        ratio(self.agreeing, self.answer_tokens, 1.0)
    }

    /// Mean KL over the answer's positions.
    pub fn mean_kl(&self) -> f64 {
        mean(&self.kl)
    }

    /// Largest KL over the answer's positions.
    pub fn max_kl(&self) -> f64 {
        self.kl.iter().copied().fold(0.0, f64::max)
    }

    /// Recomputed tokens over cached tokens (0 when nothing was cached).
    pub fn recompute_share(&self) -> f64 {
        ratio(self.recomputed_tokens, self.cached_tokens, 0.0)
    }
}

/// Prompts compared the same way, summed up. Agreement and KL are over all answer positions of
/// all prompts (a long answer weighs more than a short one).
#[derive(Debug, Clone, PartialEq)]
pub struct FidelitySummary {
    /// What ran.
    pub compared: Compared,
    /// Prompts compared.
    pub prompts: usize,
    /// Prompts whose free greedy answer was identical to Baseline's.
    pub identical: usize,
    /// Answer positions compared.
    pub positions: usize,
    /// Share of them whose top token agrees, teacher-forced.
    pub top1_agreement: f64,
    /// Mean KL(Baseline || compared) over them.
    pub mean_kl: f64,
    /// Largest KL over them.
    pub max_kl: f64,
    /// Recomputed tokens over cached tokens.
    pub recompute_share: f64,
    /// Cached tokens over prompt tokens.
    pub reuse_ratio: f64,
}

impl FidelitySummary {
    /// The summary of `rows` (all of one [`Compared`]).
    pub fn of(compared: Compared, rows: &[&PromptFidelity]) -> Self {
        let sum = |f: fn(&PromptFidelity) -> usize| rows.iter().map(|r| f(r)).sum::<usize>();
        let positions = sum(|r| r.answer_tokens);
        let kls: Vec<f64> = rows.iter().flat_map(|r| r.kl.iter().copied()).collect();
        FidelitySummary {
            compared,
            prompts: rows.len(),
            identical: rows.iter().filter(|r| r.identical).count(),
            positions,
            top1_agreement: ratio(sum(|r| r.agreeing), positions, 1.0),
            mean_kl: mean(&kls),
            max_kl: kls.iter().copied().fold(0.0, f64::max),
            recompute_share: ratio(sum(|r| r.recomputed_tokens), sum(|r| r.cached_tokens), 0.0),
            reuse_ratio: ratio(sum(|r| r.cached_tokens), sum(|r| r.prompt_tokens), 0.0),
        }
    }
}

/// A fidelity check over several prompts: every comparison of every prompt, and a summary per
/// kind of comparison (reuse first, then the noise floor).
#[derive(Debug, Clone, PartialEq)]
pub struct FidelityReport {
    /// Each prompt's comparisons, in prompt order.
    pub prompts: Vec<Vec<PromptFidelity>>,
    /// One per kind of comparison.
    pub summaries: Vec<FidelitySummary>,
}

impl FidelityReport {
    /// Builds the summaries of `prompts`.
    pub fn new(prompts: Vec<Vec<PromptFidelity>>) -> Self {
        let mut kinds: Vec<Compared> = Vec::new();
        for c in prompts.iter().flatten().map(|r| r.compared) {
            if !kinds.contains(&c) {
                kinds.push(c);
            }
        }
        let summaries = kinds
            .into_iter()
            .map(|c| {
                let rows: Vec<&PromptFidelity> = prompts
                    .iter()
                    .flatten()
                    .filter(|r| r.compared == c)
                    .collect();
                FidelitySummary::of(c, &rows)
            })
            .collect();
        FidelityReport { prompts, summaries }
    }

    /// The summary of one kind of comparison.
    pub fn summary(&self, compared: Compared) -> Option<&FidelitySummary> {
        self.summaries.iter().find(|s| s.compared == compared)
    }
}

/// What [`Engine::verify`] runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerifyOptions {
    /// Baseline's answer length at most.
    pub max_new_tokens: usize,
    /// Also run the noise floor ([`NoiseFloor`]) on the same prompts.
    pub noise_floor: bool,
}

impl Default for VerifyOptions {
    fn default() -> Self {
        VerifyOptions {
            max_new_tokens: 32,
            noise_floor: true,
        }
    }
}

fn ratio(a: usize, b: usize, empty: f64) -> f64 {
    if b == 0 {
        empty
    } else {
        a as f64 / b as f64
    }
}

fn mean(v: &[f64]) -> f64 {
    if v.is_empty() {
        0.0
    } else {
        v.iter().sum::<f64>() / v.len() as f64
    }
}

impl<B: ModelBackend> Engine<B> {
    /// Baseline's greedy answer to `prompt` (token ids) and its logits at every position.
    pub fn reference(
        &self,
        prompt: &[u32],
        max_new_tokens: usize,
    ) -> Result<Reference, EngineError> {
        let base = self.generate_tokens(
            prompt,
            &GenerateOptions {
                max_new_tokens,
                mode: GenerationMode::Baseline,
                keep_logits: true,
                ..Default::default()
            },
            &mut |_| {},
        )?;
        Ok(Reference {
            prompt: prompt.to_vec(),
            answer: base.token_ids,
            logits: base.logits,
            max_new_tokens,
        })
    }

    /// Compares a run in `mode` with `reference`: a free greedy run, and unless its answer is
    /// identical (then its logits are the teacher-forced ones already), a run fed Baseline's
    /// answer. Cache counters come from the greedy run, the one that found the prompt cold.
    pub fn compare_with(
        &self,
        reference: &Reference,
        mode: GenerationMode,
        compared: Compared,
    ) -> Result<PromptFidelity, EngineError> {
        let run = |forced: Vec<u32>, max_new_tokens| -> Result<GenerationResult, EngineError> {
            self.generate_tokens(
                &reference.prompt,
                &GenerateOptions {
                    max_new_tokens,
                    mode,
                    forced_tokens: forced,
                    keep_logits: true,
                    ..Default::default()
                },
                &mut |_| {},
            )
        };
        let greedy = run(Vec::new(), reference.max_new_tokens)?;
        let identical = greedy.token_ids == reference.answer;
        let forced_logits = if identical {
            greedy.logits
        } else {
            run(reference.answer.clone(), reference.answer.len())?.logits
        };
        let (agreeing, kl) = compare_positions(&reference.logits, &forced_logits);
        Ok(PromptFidelity {
            compared,
            prompt_tokens: greedy.prompt_tokens,
            answer_tokens: reference.answer.len(),
            identical,
            agreeing,
            kl,
            cached_tokens: greedy.cached_tokens,
            recomputed_tokens: greedy.recomputed_tokens,
        })
    }

    /// Runs each prompt in Baseline and with chunk reuse (against the cache as it stands: warm
    /// your documents first), and with `options.noise_floor` the [`NoiseFloor`] too, and reports
    /// how close each stays to Baseline. The reuse runs store what a normal request stores.
    pub fn verify(
        &self,
        prompts: &[&str],
        options: &VerifyOptions,
    ) -> Result<FidelityReport, EngineError> {
        let floor = if options.noise_floor {
            Some(NoiseFloor::new(self)?)
        } else {
            None
        };
        let mut rows = Vec::with_capacity(prompts.len());
        for p in prompts {
            let tokens = self.tokenizer().encode(p, false)?;
            rows.push(self.verify_prompt(&tokens, options.max_new_tokens, floor.as_ref())?);
        }
        Ok(FidelityReport::new(rows))
    }

    /// One prompt (token ids) compared with Baseline: reuse first, then the noise floor's rows
    /// when `floor` is given.
    pub fn verify_prompt(
        &self,
        prompt: &[u32],
        max_new_tokens: usize,
        floor: Option<&NoiseFloor<B>>,
    ) -> Result<Vec<PromptFidelity>, EngineError> {
        let reference = self.reference(prompt, max_new_tokens)?;
        let mut rows =
            vec![self.compare_with(&reference, GenerationMode::ChunkReuse, Compared::Reuse)?];
        if let Some(floor) = floor {
            rows.extend(floor.compare(&reference)?);
        }
        Ok(rows)
    }

    /// [`Engine::verify`] with the noise floor, `max_new_tokens` answer tokens at most.
    pub fn verify_correctness(
        &self,
        prompts: &[&str],
        max_new_tokens: usize,
    ) -> Result<FidelityReport, EngineError> {
        self.verify(
            prompts,
            &VerifyOptions {
                max_new_tokens,
                noise_floor: true,
            },
        )
    }
}

/// Engines over the same weights that run the changes of precision a fidelity check sets reuse
/// beside: the prompt's K/V stored at KIVI int8 and int4 and read back (an exact prefix hit from
/// the chunk store), a bf16 forward pass, and, for a model with integer weights, products with
/// 8-bit activations (llama.cpp's arithmetic). Each has its own empty cache (RAM only) and the
/// engine's other settings.
pub struct NoiseFloor<B: ModelBackend> {
    stored: Vec<(KvPrecision, Engine<B>)>,
    /// Where the engine's products run in f32 (a bf16 forward is a change of their f32).
    bf16: Option<Engine<B>>,
    /// Where the model takes 8-bit activations ([`kvb_model::Model::takes_q8_activations`]) and
    /// the engine's products run in f32.
    q8: Option<Engine<B>>,
}

impl<B: ModelBackend> NoiseFloor<B> {
    /// The noise-floor engines of `engine` (the bf16 one holds its own copy of the weights, at
    /// 2 bytes each).
    pub fn new(engine: &Engine<B>) -> Result<Self, EngineError> {
        let config = |kv_precision| EngineConfig {
            kv_precision,
            // Every sequence's K/V goes to the store at once, so the next run reads it back.
            keep_resident: false,
            disk_dir: None,
            remote_cache: None,
            ..engine.config().clone()
        };
        let stored = [KvPrecision::Int8, KvPrecision::Int4]
            .into_iter()
            .map(|p| Ok((p, engine.sibling(config(p))?)))
            .collect::<Result<Vec<_>, EngineError>>()?;
        let f32_products = engine.model().activation_precision() == ActivationPrecision::F32;
        let bf16 = if f32_products {
            Some(engine.variant(
                engine.model().with_bf16_compute()?,
                "bf16-compute",
                config(KvPrecision::F32),
            )?)
        } else {
            None
        };
        let q8 = if f32_products && engine.model().takes_q8_activations() {
            let model = engine
                .model()
                .clone()
                .with_activations(ActivationPrecision::Q8)?;
            Some(engine.variant(model, "q8-activations", config(KvPrecision::F32))?)
        } else {
            None
        };
        Ok(NoiseFloor { stored, bf16, q8 })
    }

    /// The noise floor's comparisons for `reference` (computed by its Baseline engine).
    pub fn compare(&self, reference: &Reference) -> Result<Vec<PromptFidelity>, EngineError> {
        let mut out = Vec::new();
        for (precision, e) in &self.stored {
            e.warm_tokens(&reference.prompt)?;
            out.push(e.compare_with(
                reference,
                GenerationMode::PrefixCache,
                Compared::StoredKv(*precision),
            )?);
        }
        if let Some(bf16) = &self.bf16 {
            out.push(bf16.compare_with(
                reference,
                GenerationMode::Baseline,
                Compared::Bf16Forward,
            )?);
        }
        if let Some(q8) = &self.q8 {
            out.push(q8.compare_with(
                reference,
                GenerationMode::Baseline,
                Compared::Q8Activations,
            )?);
        }
        Ok(out)
    }
}
