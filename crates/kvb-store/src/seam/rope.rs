//! Re-rotating a moved chunk's keys on the host: keys stored after RoPE at their old positions
//! become the keys at new ones, by a rotation through the difference of the angles.
//!
//! Angles are those transformers computes (`position as f32 * inv_freq`, in f32), so a key turned
//! from position `p` to `q` is the key a runtime computes at `q`, within the rounding of the
//! rotation itself; the difference of the two f32 angles is taken in f64.

use crate::chunk::{KvChunk, KvData};
use crate::seam::SeamError;
use half::{bf16, f16};

/// Which dimensions RoPE pairs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RopePairs {
    /// Dimension `j` with `j + head_dim / 2` (HF's `rotate_half`: Llama, Qwen2, Mistral, Gemma).
    HalfSplit,
    /// Dimension `2i` with `2i + 1` (GPT-J style; llama.cpp's for its `llama` architecture).
    Interleaved,
}

/// How frequencies are scaled for long contexts (the model's `rope_scaling`).
#[derive(Debug, Clone, PartialEq)]
pub enum RopeScaling {
    /// None.
    None,
    /// Every frequency divided by `factor`.
    Linear {
        /// The divisor.
        factor: f32,
    },
    /// Llama 3.1's: low frequencies divided by `factor`, high ones kept, blended between.
    Llama3 {
        /// Divisor of the low frequencies.
        factor: f32,
        /// Below `original_max_position_embeddings / low_freq_factor` tokens of wavelength...
        low_freq_factor: f32,
        /// ... and above `original_max_position_embeddings / high_freq_factor` they blend.
        high_freq_factor: f32,
        /// The context the model was trained at.
        original_max_position_embeddings: f32,
    },
    /// Each frequency divided by its own factor (a GGUF's `rope_freqs`).
    FreqFactors(Vec<f32>),
}

/// A model's RoPE: what a key's rotation depends on.
#[derive(Debug, Clone, PartialEq)]
pub struct RopeSpec {
    /// Width of a head (all of it rotates).
    pub head_dim: usize,
    /// The base (`rope_theta`).
    pub theta: f32,
    /// Long-context scaling.
    pub scaling: RopeScaling,
    /// Which dimensions pair.
    pub pairs: RopePairs,
}

impl RopeSpec {
    /// One frequency per rotated pair, as transformers computes them (f32).
    pub fn inv_freq(&self) -> Vec<f32> {
        let dim = self.head_dim;
        let mut inv: Vec<f32> = (0..dim / 2)
            .map(|i| 1.0 / self.theta.powf((2 * i) as f32 / dim as f32))
            .collect();
        match &self.scaling {
            RopeScaling::None => {}
            RopeScaling::Linear { factor } => inv.iter_mut().for_each(|f| *f /= factor),
            RopeScaling::FreqFactors(factors) => {
                inv.iter_mut().zip(factors).for_each(|(f, x)| *f /= x)
            }
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings: old,
            } => {
                let (low_wavelen, high_wavelen) = (old / low_freq_factor, old / high_freq_factor);
                for f in inv.iter_mut() {
                    let wavelen = 2.0 * std::f32::consts::PI / *f;
                    if wavelen > low_wavelen {
                        *f /= factor;
                    } else if wavelen >= high_wavelen {
                        let smooth = (old / wavelen - low_freq_factor)
                            / (high_freq_factor - low_freq_factor);
                        *f = (1.0 - smooth) * *f / factor + smooth * *f;
                    }
                }
            }
        }
        inv
    }

    /// The dimensions of pair `i`.
    fn pair(&self, i: usize) -> (usize, usize) {
        match self.pairs {
            RopePairs::HalfSplit => (i, i + self.head_dim / 2),
            RopePairs::Interleaved => (2 * i, 2 * i + 1),
        }
    }

    /// Rotates `head` (one token's head, `head_dim` values) by `angle(i)` for each pair `i`.
    fn rotate(&self, head: &mut [f32], angle: impl Fn(usize) -> f64) {
        for i in 0..self.head_dim / 2 {
            let (a, b) = self.pair(i);
            let (sin, cos) = angle(i).sin_cos();
            let (x, y) = (head[a] as f64, head[b] as f64);
            head[a] = (x * cos - y * sin) as f32;
            head[b] = (x * sin + y * cos) as f32;
        }
    }

    /// Applies RoPE at `position` to a head not yet rotated: what a runtime computes (in f64
    /// from the f32 angles; the reference for tests).
    pub fn apply(&self, head: &mut [f32], position: u32, inv_freq: &[f32]) {
        self.rotate(head, |i| (position as f32 * inv_freq[i]) as f64);
    }
}

/// Turns `keys` (`[kv_heads, tokens, head_dim]`, rotated at positions `from`) into the keys at
/// positions `to`.
pub fn rerotate_keys(
    keys: &mut [f32],
    kv_heads: usize,
    spec: &RopeSpec,
    from: &[u32],
    to: &[u32],
) -> Result<(), SeamError> {
    let (tokens, dim) = (from.len(), spec.head_dim);
    if let RopeScaling::FreqFactors(f) = &spec.scaling {
        if f.len() != dim / 2 {
            return Err(SeamError::Layout(format!(
                "{} frequency factors for a head of {dim} ({} pairs)",
                f.len(),
                dim / 2
            )));
        }
    }
    if to.len() != tokens || keys.len() != kv_heads * tokens * dim || dim == 0 || dim % 2 != 0 {
        return Err(SeamError::Layout(format!(
            "{} key values for {kv_heads} heads x {tokens} tokens x {dim} (even), {} new \
             positions",
            keys.len(),
            to.len()
        )));
    }
    let inv = spec.inv_freq();
    for (n, head) in keys.chunks_exact_mut(dim).enumerate() {
        let t = n % tokens;
        if from[t] == to[t] {
            continue;
        }
        let (p, q) = (from[t] as f32, to[t] as f32);
        spec.rotate(head, |i| (q * inv[i]) as f64 - (p * inv[i]) as f64);
    }
    Ok(())
}

/// Moves `chunk` to positions `to`: its keys re-rotated (kept in their type: f32 exactly as
/// computed, f16 and bf16 rounded once; KIVI-quantized keys become f32) and its positions set.
pub fn rerotate_chunk(chunk: &mut KvChunk, spec: &RopeSpec, to: &[u32]) -> Result<(), SeamError> {
    if spec.head_dim != chunk.head_dim {
        return Err(SeamError::Layout(format!(
            "a RoPE of head width {} for a chunk of head width {}",
            spec.head_dim, chunk.head_dim
        )));
    }
    if to.len() != chunk.len() {
        return Err(SeamError::Layout(format!(
            "{} new positions for a chunk of {} tokens",
            to.len(),
            chunk.len()
        )));
    }
    chunk.check().map_err(SeamError::Layout)?;
    // Every layer turned before any is replaced: an error leaves the chunk as it was.
    let mut turned = Vec::with_capacity(chunk.layers.len());
    for layer in &chunk.layers {
        let mut keys = layer.k.to_f32();
        rerotate_keys(&mut keys, chunk.kv_heads, spec, &chunk.positions, to)?;
        turned.push(match &layer.k {
            KvData::F16(_) => KvData::F16(keys.iter().map(|&x| f16::from_f32(x)).collect()),
            KvData::Bf16(_) => KvData::Bf16(keys.iter().map(|&x| bf16::from_f32(x)).collect()),
            KvData::F32(_) | KvData::Quantized(_) => KvData::F32(keys),
        });
    }
    for (layer, k) in chunk.layers.iter_mut().zip(turned) {
        layer.k = k;
    }
    chunk.positions = to.to_vec();
    Ok(())
}
