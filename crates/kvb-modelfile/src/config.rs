//! Model configuration from a HuggingFace `config.json`, and the compatibility check.
//!
//! kvb reuses K/V across requests and re-rotates cached keys to new positions, so it can only serve
//! decoder-only models whose positions enter through RoPE alone, in the Llama block layout.

use crate::error::{FileError, Result};
use serde::Deserialize;
use std::path::Path;

/// The model families kvb knows; all share the Llama block layout.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// `LlamaForCausalLM` (also SmolLM, TinyLlama, Llama 2/3).
    Llama,
    /// `Qwen2ForCausalLM`: q/k/v projections carry biases.
    Qwen2,
    /// `MistralForCausalLM`, full attention only.
    Mistral,
    /// `GemmaForCausalLM`: embeddings scaled by sqrt(hidden), RMSNorm weights stored as `w - 1`.
    Gemma,
    /// `Phi3ForCausalLM`: fused `qkv_proj` and `gate_up_proj`.
    Phi3,
}

/// The feed-forward activation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Activation {
    /// `x * sigmoid(x)`.
    Silu,
    /// GELU with the tanh approximation (`gelu_pytorch_tanh`).
    GeluTanh,
    /// Exact GELU (erf).
    Gelu,
}

/// How RoPE frequencies are scaled for long context.
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// Plain RoPE.
    None,
    /// Positions divided by `factor` (HF "linear").
    Linear {
        /// The divisor.
        factor: f32,
    },
    /// Llama 3.1's frequency-dependent scaling (HF "llama3").
    Llama3 {
        /// Overall scale of low frequencies.
        factor: f32,
        /// Wavelength bound (in units of the original context) below which nothing is scaled.
        low_freq_factor: f32,
        /// Wavelength bound above which frequencies are fully scaled.
        high_freq_factor: f32,
        /// The context the model was pretrained on.
        original_max_position_embeddings: f32,
    },
    /// One divisor per frequency (`head_dim / 2` of them): what a GGUF file stores as its
    /// `rope_freqs` tensor (llama.cpp writes Llama 3.1/3.2's scaling this way). Written to
    /// `config.json` as `{"rope_type": "freq_factors", "factors": [...]}`, which kvb reads and
    /// transformers does not.
    FreqFactors(Vec<f32>),
}

impl RopeScaling {
    /// One frequency per rotated pair of a head of `head_dim`, for base `theta`, scaled: as
    /// transformers computes them (in f32), so that angles and golden logits match.
    pub fn inv_freq(&self, head_dim: usize, theta: f32) -> Vec<f32> {
        let mut inv_freq: Vec<f32> = (0..head_dim / 2)
            .map(|i| 1.0 / theta.powf((2 * i) as f32 / head_dim as f32))
            .collect();
        match self {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } => inv_freq.iter_mut().for_each(|f| *f /= factor),
            // As llama.cpp applies a GGUF's `rope_freqs`: each frequency divided by its factor.
            RopeScaling::FreqFactors(factors) => {
                for (f, factor) in inv_freq.iter_mut().zip(factors) {
                    *f /= factor;
                }
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: old_ctx,
            } => {
                // Llama 3.1: keep high frequencies, divide low ones by `factor`, blend in between.
                let low_wavelen = old_ctx / low_freq_factor;
                let high_wavelen = old_ctx / high_freq_factor;
                for f in inv_freq.iter_mut() {
                    let wavelen = 2.0 * std::f32::consts::PI / *f;
                    if wavelen > low_wavelen {
                        *f /= factor;
                    } else if wavelen >= high_wavelen {
                        let smooth = (old_ctx / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        *f = (1.0 - smooth) * *f / factor + smooth * *f;
                    }
                }
            }
        }
        inv_freq
    }
}

/// A resolved model configuration: every default applied, every field checked.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// The architecture name as written in the config (e.g. `LlamaForCausalLM`).
    pub architecture: String,
    /// The family it is served as.
    pub family: Family,
    /// Width of the residual stream.
    pub hidden_size: usize,
    /// Width of the feed-forward layer.
    pub intermediate_size: usize,
    /// Number of transformer blocks.
    pub num_layers: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads (`num_heads` without GQA).
    pub num_kv_heads: usize,
    /// Width of one head.
    pub head_dim: usize,
    /// Vocabulary size (rows of the embedding).
    pub vocab_size: usize,
    /// Longest context the model supports.
    pub max_position_embeddings: usize,
    /// RMSNorm epsilon.
    pub rms_norm_eps: f64,
    /// RoPE base.
    pub rope_theta: f32,
    /// RoPE frequency scaling.
    pub rope_scaling: RopeScaling,
    /// Whether the LM head reuses the embedding matrix.
    pub tie_word_embeddings: bool,
    /// Whether q/k/v projections have biases.
    pub attention_bias: bool,
    /// Whether the output projection has a bias (Llama's `attention_bias` covers it too).
    pub o_proj_bias: bool,
    /// Whether the MLP projections have biases.
    pub mlp_bias: bool,
    /// Feed-forward activation.
    pub activation: Activation,
    /// Beginning-of-sequence token, if the config names one.
    pub bos_token_id: Option<u32>,
    /// End-of-sequence tokens (generation stops at any of them).
    pub eos_token_ids: Vec<u32>,
}

/// `config.json` as written by transformers; only the fields kvb reads.
#[derive(Debug, Deserialize)]
struct RawConfig {
    #[serde(default)]
    architectures: Vec<String>,
    #[serde(default)]
    model_type: Option<String>,
    hidden_size: Option<usize>,
    intermediate_size: Option<usize>,
    num_hidden_layers: Option<usize>,
    num_attention_heads: Option<usize>,
    num_key_value_heads: Option<usize>,
    head_dim: Option<usize>,
    vocab_size: Option<usize>,
    max_position_embeddings: Option<usize>,
    rms_norm_eps: Option<f64>,
    rope_theta: Option<f64>,
    rope_scaling: Option<serde_json::Value>,
    tie_word_embeddings: Option<bool>,
    attention_bias: Option<bool>,
    mlp_bias: Option<bool>,
    hidden_act: Option<String>,
    hidden_activation: Option<String>,
    sliding_window: Option<serde_json::Value>,
    use_sliding_window: Option<bool>,
    partial_rotary_factor: Option<f64>,
    bos_token_id: Option<serde_json::Value>,
    eos_token_id: Option<serde_json::Value>,
}

/// Why an architecture that is not Llama-shaped cannot be served.
fn refusal_reason(arch: &str) -> Option<&'static str> {
    let a = arch.to_ascii_lowercase();
    let reasons: [(&str, &str); 9] = [
        (
            "gpt2",
            "it uses learned absolute position embeddings, not RoPE",
        ),
        (
            "gptneox",
            "it applies partial rotary embeddings inside a parallel attention/MLP block",
        ),
        (
            "gptneo",
            "it uses learned absolute position embeddings, not RoPE",
        ),
        (
            "gptj",
            "it rotates interleaved pairs of a partial head inside a parallel block",
        ),
        (
            "falcon",
            "its blocks use parallel attention and LayerNorm, not the Llama layout",
        ),
        ("bloom", "it encodes positions with ALiBi biases, not RoPE"),
        ("mpt", "it encodes positions with ALiBi biases, not RoPE"),
        (
            "opt",
            "it uses learned absolute position embeddings, not RoPE",
        ),
        ("bert", "it is an encoder, not a causal language model"),
    ];
    reasons
        .iter()
        .find(|(prefix, _)| a.starts_with(prefix))
        .map(|(_, why)| *why)
}

fn family_of(arch: &str, model_type: Option<&str>) -> Option<Family> {
    let by_arch = match arch {
        "LlamaForCausalLM" => Some(Family::Llama),
        "Qwen2ForCausalLM" => Some(Family::Qwen2),
        "MistralForCausalLM" => Some(Family::Mistral),
        "GemmaForCausalLM" => Some(Family::Gemma),
        "Phi3ForCausalLM" => Some(Family::Phi3),
        _ => None,
    };
    by_arch.or(match model_type {
        Some("llama") => Some(Family::Llama),
        Some("qwen2") => Some(Family::Qwen2),
        Some("mistral") => Some(Family::Mistral),
        Some("gemma") => Some(Family::Gemma),
        Some("phi3") => Some(Family::Phi3),
        _ => None,
    })
}

/// The largest value a size field may take: well past every real model (vocabularies of 256k,
/// contexts of 1M tokens, hidden sizes of 16k), far below sizes whose products could overflow.
const SIZE_LIMIT: usize = 1 << 24;
/// The largest count of layers or of heads (real models have at most a few hundred).
const COUNT_LIMIT: usize = 1 << 12;

/// `v` if it is at most `limit` ([`COUNT_LIMIT`] or [`SIZE_LIMIT`]); the error names the field.
fn within_limit(v: usize, name: &str, limit: usize) -> std::result::Result<usize, String> {
    if v > limit {
        return Err(format!(
            "`{name}` is {v}, beyond any model kvb can run (at most {limit})"
        ));
    }
    Ok(v)
}

fn token_ids(value: &Option<serde_json::Value>) -> Vec<u32> {
    match value {
        Some(serde_json::Value::Number(n)) => {
            n.as_u64().map(|v| vec![v as u32]).unwrap_or_default()
        }
        Some(serde_json::Value::Array(items)) => items
            .iter()
            .filter_map(|v| v.as_u64().map(|v| v as u32))
            .collect(),
        _ => Vec::new(),
    }
}

impl ModelConfig {
    /// Reads and checks `config.json`. `strict = false` serves an unknown architecture as Llama.
    pub fn from_file(path: &Path, strict: bool) -> Result<Self> {
        let text = std::fs::read_to_string(path).map_err(|e| FileError::io(path, e))?;
        Self::from_json(&text, strict).map_err(|e| match e {
            FileError::Config { reason, .. } => FileError::Config {
                path: path.to_path_buf(),
                reason,
            },
            other => other,
        })
    }

    /// Parses and checks the text of a `config.json`.
    pub fn from_json(text: &str, strict: bool) -> Result<Self> {
        let bad = |reason: String| FileError::Config {
            path: "config.json".into(),
            reason,
        };
        let raw: RawConfig =
            serde_json::from_str(text).map_err(|e| bad(format!("invalid JSON: {e}")))?;
        let arch = raw
            .architectures
            .first()
            .cloned()
            .or_else(|| raw.model_type.clone())
            .ok_or_else(|| bad("neither `architectures` nor `model_type` is set".into()))?;
        if let Some(why) = refusal_reason(&arch) {
            return Err(FileError::Unsupported(format!(
                "{arch} cannot reuse K/V across positions: {why}"
            )));
        }
        let family = family_of(&arch, raw.model_type.as_deref());
        if family.is_none() && strict {
            let msg = format!(
                "unknown architecture {arch}: kvb serves Llama, Qwen2, Mistral, Gemma and Phi-3; \
                 pass strict = false to try it as a Llama-layout model"
            );
            return Err(FileError::Unsupported(msg));
        }
        let family = family.unwrap_or(Family::Llama);
        let window_set = matches!(&raw.sliding_window, Some(v) if !v.is_null());
        let window_on = match family {
            Family::Qwen2 => raw.use_sliding_window.unwrap_or(false) && window_set,
            Family::Mistral => window_set,
            _ => false,
        };
        if window_on {
            return Err(FileError::Unsupported(format!(
                "{arch} with sliding-window attention: kvb's attention is full-context, so reused K/V \
                 outside the window would change the output; use a checkpoint with `sliding_window: null`"
            )));
        }
        if let Some(f) = raw.partial_rotary_factor {
            if (f - 1.0).abs() > 1e-9 {
                return Err(FileError::Unsupported(format!(
                    "{arch} with partial_rotary_factor {f}: only full-head RoPE is supported"
                )));
            }
        }

        // Sizes are bounded far above any real model so that a corrupt or hostile config is an
        // error here, never an allocation sized by a length field later.
        let need = |v: Option<usize>, name: &str, limit: usize| {
            let v = v
                .filter(|&x| x > 0)
                .ok_or_else(|| bad(format!("`{name}` is missing or zero")))?;
            within_limit(v, name, limit).map_err(bad)
        };
        let hidden_size = need(raw.hidden_size, "hidden_size", SIZE_LIMIT)?;
        let num_heads = need(raw.num_attention_heads, "num_attention_heads", COUNT_LIMIT)?;
        let num_kv_heads = within_limit(
            raw.num_key_value_heads.unwrap_or(num_heads),
            "num_key_value_heads",
            COUNT_LIMIT,
        )
        .map_err(bad)?;
        if num_kv_heads == 0 || num_heads % num_kv_heads != 0 {
            return Err(bad(format!(
                "{num_heads} attention heads cannot share {num_kv_heads} key/value heads"
            )));
        }
        let head_dim = match raw.head_dim {
            Some(d) => within_limit(d, "head_dim", SIZE_LIMIT).map_err(bad)?,
            None if hidden_size % num_heads == 0 => hidden_size / num_heads,
            None => {
                return Err(bad(format!(
                    "hidden_size {hidden_size} is not divisible by {num_heads} heads and head_dim is not set"
                )))
            }
        };
        if head_dim == 0 || head_dim % 2 != 0 {
            return Err(bad(format!("head_dim {head_dim} must be even for RoPE")));
        }
        let act_name = raw
            .hidden_activation
            .clone()
            .or(raw.hidden_act.clone())
            .unwrap_or_else(|| "silu".into());
        let activation = match (family, act_name.as_str()) {
            // transformers runs every Gemma checkpoint with the tanh approximation.
            (Family::Gemma, _) => Activation::GeluTanh,
            (_, "silu" | "swish") => Activation::Silu,
            (_, "gelu_pytorch_tanh" | "gelu_new" | "gelu_fast") => Activation::GeluTanh,
            (_, "gelu") => Activation::Gelu,
            (_, other) => return Err(bad(format!("unsupported activation `{other}`"))),
        };
        let rope_scaling = parse_rope_scaling(raw.rope_scaling.as_ref()).map_err(bad)?;
        if let RopeScaling::FreqFactors(f) = &rope_scaling {
            if f.len() != head_dim / 2 || f.iter().any(|x| !x.is_finite() || *x <= 0.0) {
                return Err(bad(format!(
                    "rope frequency factors: {} of them for head_dim {head_dim} (needs {}, each \
                     finite and positive)",
                    f.len(),
                    head_dim / 2
                )));
            }
        }
        let attention_bias = match family {
            Family::Qwen2 => true,
            _ => raw.attention_bias.unwrap_or(false),
        };
        let o_proj_bias = family != Family::Qwen2 && attention_bias;
        let bos = token_ids(&raw.bos_token_id).first().copied();
        let max_position_embeddings = match raw.max_position_embeddings {
            None => 2048,
            Some(0) => return Err(bad("`max_position_embeddings` is zero".into())),
            Some(n) => within_limit(n, "max_position_embeddings", SIZE_LIMIT).map_err(bad)?,
        };
        let rms_norm_eps = raw.rms_norm_eps.unwrap_or(1e-6);
        if !(rms_norm_eps.is_finite() && rms_norm_eps >= 0.0) {
            return Err(bad(format!(
                "`rms_norm_eps` {rms_norm_eps} is not a finite non-negative number"
            )));
        }
        // As f32, as the model uses it: a value past f32's range would be infinite.
        let rope_theta = raw.rope_theta.unwrap_or(10_000.0) as f32;
        if !(rope_theta.is_finite() && rope_theta > 0.0) {
            return Err(bad(format!(
                "`rope_theta` {rope_theta} is not a finite positive number"
            )));
        }
        Ok(ModelConfig {
            architecture: arch,
            family,
            hidden_size,
            intermediate_size: need(raw.intermediate_size, "intermediate_size", SIZE_LIMIT)?,
            num_layers: need(raw.num_hidden_layers, "num_hidden_layers", COUNT_LIMIT)?,
            num_heads,
            num_kv_heads,
            head_dim,
            vocab_size: need(raw.vocab_size, "vocab_size", SIZE_LIMIT)?,
            max_position_embeddings,
            rms_norm_eps,
            rope_theta,
            rope_scaling,
            tie_word_embeddings: raw.tie_word_embeddings.unwrap_or(family == Family::Gemma),
            attention_bias,
            o_proj_bias,
            mlp_bias: raw.mlp_bias.unwrap_or(false),
            activation,
            bos_token_id: bos,
            eos_token_ids: token_ids(&raw.eos_token_id),
        })
    }

    /// Whether RMSNorm weights are stored as `w - 1` (Gemma) and applied as `1 + w`.
    pub fn norm_adds_one(&self) -> bool {
        self.family == Family::Gemma
    }

    /// The factor embeddings are multiplied by before the first block (sqrt(hidden) for Gemma).
    pub fn embedding_scale(&self) -> Option<f32> {
        (self.family == Family::Gemma).then(|| (self.hidden_size as f32).sqrt())
    }

    /// Width of the K (or V) projection: kv heads times head width.
    pub fn kv_dim(&self) -> usize {
        self.num_kv_heads * self.head_dim
    }

    /// Writes this configuration as a transformers-style `config.json` value.
    pub fn to_hf_json(&self) -> serde_json::Value {
        let model_type = match self.family {
            Family::Llama => "llama",
            Family::Qwen2 => "qwen2",
            Family::Mistral => "mistral",
            Family::Gemma => "gemma",
            Family::Phi3 => "phi3",
        };
        let rope_scaling = match &self.rope_scaling {
            RopeScaling::None => serde_json::Value::Null,
            RopeScaling::Linear { factor } => {
                serde_json::json!({"rope_type": "linear", "factor": factor})
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => serde_json::json!({
                "rope_type": "llama3",
                "factor": factor,
                "low_freq_factor": low_freq_factor,
                "high_freq_factor": high_freq_factor,
                "original_max_position_embeddings": original_max_position_embeddings,
            }),
            RopeScaling::FreqFactors(factors) => {
                serde_json::json!({"rope_type": "freq_factors", "factors": factors})
            }
        };
        let act = match self.activation {
            Activation::Silu => "silu",
            Activation::GeluTanh => "gelu_pytorch_tanh",
            Activation::Gelu => "gelu",
        };
        serde_json::json!({
            "architectures": [self.architecture],
            "model_type": model_type,
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_layers,
            "num_attention_heads": self.num_heads,
            "num_key_value_heads": self.num_kv_heads,
            "head_dim": self.head_dim,
            "vocab_size": self.vocab_size,
            "max_position_embeddings": self.max_position_embeddings,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "rope_scaling": rope_scaling,
            "tie_word_embeddings": self.tie_word_embeddings,
            "attention_bias": self.attention_bias,
            "mlp_bias": self.mlp_bias,
            "hidden_act": act,
            "bos_token_id": self.bos_token_id,
            "eos_token_id": self.eos_token_ids.first(),
            "torch_dtype": "float32",
        })
    }
}

fn parse_rope_scaling(value: Option<&serde_json::Value>) -> Result<RopeScaling, String> {
    let Some(obj) = value.and_then(|v| v.as_object()) else {
        return Ok(RopeScaling::None);
    };
    let kind = obj
        .get("rope_type")
        .or_else(|| obj.get("type"))
        .and_then(|v| v.as_str())
        .unwrap_or("default");
    let num = |name: &str| -> Result<f32, String> {
        let v = obj
            .get(name)
            .and_then(|v| v.as_f64())
            .map(|v| v as f32)
            .ok_or_else(|| format!("rope_scaling of type {kind} lacks `{name}`"))?;
        // As f32, as the model uses it: a value past f32's range would be infinite.
        if !(v.is_finite() && v > 0.0) {
            return Err(format!(
                "rope_scaling `{name}` is {v}; it must be a finite positive number"
            ));
        }
        Ok(v)
    };
    match kind {
        "default" => Ok(RopeScaling::None),
        "linear" => Ok(RopeScaling::Linear {
            factor: num("factor")?,
        }),
        "freq_factors" => obj
            .get("factors")
            .and_then(|v| v.as_array())
            .and_then(|a| a.iter().map(|x| x.as_f64().map(|x| x as f32)).collect())
            .map(RopeScaling::FreqFactors)
            .ok_or_else(|| "rope_scaling of type freq_factors needs `factors`: numbers".into()),
        "llama3" => Ok(RopeScaling::Llama3 {
            factor: num("factor")?,
            low_freq_factor: num("low_freq_factor")?,
            high_freq_factor: num("high_freq_factor")?,
            original_max_position_embeddings: num("original_max_position_embeddings")?,
        }),
        other => Err(format!(
            "rope_scaling type `{other}` is not supported (supported: linear, llama3, freq_factors)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LLAMA: &str = r#"{"architectures":["LlamaForCausalLM"],"hidden_size":64,
        "intermediate_size":128,"num_hidden_layers":2,"num_attention_heads":4,
        "num_key_value_heads":2,"vocab_size":512,"rms_norm_eps":1e-6}"#;

    #[test]
    fn llama_defaults_are_applied() {
        let c = ModelConfig::from_json(LLAMA, true).unwrap();
        assert_eq!(c.family, Family::Llama);
        assert_eq!(c.head_dim, 16);
        assert_eq!(c.rope_theta, 10_000.0);
        assert!(!c.tie_word_embeddings);
        assert_eq!(c.activation, Activation::Silu);
    }

    #[test]
    fn non_rope_architectures_are_refused_with_a_reason() {
        for arch in [
            "GPT2LMHeadModel",
            "BloomForCausalLM",
            "MptForCausalLM",
            "FalconForCausalLM",
        ] {
            let json = LLAMA.replace("LlamaForCausalLM", arch);
            let err = ModelConfig::from_json(&json, false)
                .unwrap_err()
                .to_string();
            assert!(err.contains(arch) && err.contains("cannot reuse"), "{err}");
        }
    }

    #[test]
    fn mistral_with_a_sliding_window_is_refused() {
        let json = LLAMA
            .replace("LlamaForCausalLM", "MistralForCausalLM")
            .replace("\"vocab_size\"", "\"sliding_window\":4096,\"vocab_size\"");
        let err = ModelConfig::from_json(&json, true).unwrap_err().to_string();
        assert!(err.contains("sliding-window"), "{err}");
        let json = json.replace("4096", "null");
        assert_eq!(
            ModelConfig::from_json(&json, true).unwrap().family,
            Family::Mistral
        );
    }

    #[test]
    fn unknown_architectures_need_strict_off() {
        let json = LLAMA.replace("LlamaForCausalLM", "FancyNewForCausalLM");
        let err = ModelConfig::from_json(&json, true).unwrap_err().to_string();
        assert!(err.contains("strict = false"), "{err}");
        assert_eq!(
            ModelConfig::from_json(&json, false).unwrap().family,
            Family::Llama
        );
    }

    #[test]
    fn malformed_json_is_an_error_naming_the_problem() {
        let err = ModelConfig::from_json("{not json", true)
            .unwrap_err()
            .to_string();
        assert!(err.contains("invalid JSON"), "{err}");
        let err = ModelConfig::from_json(&LLAMA.replace("\"hidden_size\":64,", ""), true)
            .unwrap_err()
            .to_string();
        assert!(err.contains("hidden_size"), "{err}");
    }

    #[test]
    fn hf_json_round_trips() {
        let c = ModelConfig::from_json(LLAMA, true).unwrap();
        let again = ModelConfig::from_json(&c.to_hf_json().to_string(), true).unwrap();
        assert_eq!(c, again);
    }

    /// A GGUF's per-frequency RoPE divisors survive `config.json` (the cache's namespace is built
    /// from it, so two factor sets never share K/V), and bad ones are refused.
    #[test]
    fn rope_frequency_factors_round_trip_and_are_checked() {
        let mut c = ModelConfig::from_json(LLAMA, true).unwrap();
        let half = c.head_dim / 2;
        c.rope_scaling = RopeScaling::FreqFactors((0..half).map(|i| 1.0 + i as f32).collect());
        let json = c.to_hf_json().to_string();
        assert_eq!(ModelConfig::from_json(&json, true).unwrap(), c);
        for bad in [vec![1.0; half + 1], {
            let mut f = vec![1.0; half];
            f[0] = -2.0;
            f
        }] {
            c.rope_scaling = RopeScaling::FreqFactors(bad);
            let err = ModelConfig::from_json(&c.to_hf_json().to_string(), true)
                .unwrap_err()
                .to_string();
            assert!(err.contains("rope frequency factors"), "{err}");
        }
    }

    #[test]
    fn sizes_past_any_model_and_broken_numbers_are_refused_by_name() {
        let with = |field: &str, value: serde_json::Value| {
            let mut json: serde_json::Value = serde_json::from_str(LLAMA).unwrap();
            json[field] = value;
            ModelConfig::from_json(&json.to_string(), true)
        };
        for (field, value) in [
            ("num_hidden_layers", serde_json::json!(5000)),
            ("num_attention_heads", serde_json::json!(1u64 << 40)),
            ("num_key_value_heads", serde_json::json!(8192)),
            ("hidden_size", serde_json::json!(1u64 << 25)),
            ("intermediate_size", serde_json::json!(1u64 << 30)),
            ("vocab_size", serde_json::json!(u64::MAX)),
            ("head_dim", serde_json::json!(1u64 << 26)),
            ("max_position_embeddings", serde_json::json!(1u64 << 32)),
            ("max_position_embeddings", serde_json::json!(0)),
            ("rms_norm_eps", serde_json::json!(-1.0)),
            ("rope_theta", serde_json::json!(0.0)),
            ("rope_theta", serde_json::json!(1e300)),
        ] {
            let err = with(field, value.clone()).unwrap_err().to_string();
            assert!(err.contains(field), "{field} = {value}: {err}");
        }
        // The largest real values pass.
        assert!(with("max_position_embeddings", serde_json::json!(1_048_576)).is_ok());
        assert!(with("vocab_size", serde_json::json!(262_144)).is_ok());
    }
}
