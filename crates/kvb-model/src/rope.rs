//! Rotary position embedding in the HF half-split layout, at arbitrary per-token positions.
//!
//! burn's `RotaryEncoding` rotates interleaved pairs from a single start offset; HF checkpoints pair
//! dimension `j` with `j + head_dim/2` (`rotate_half`), and kvb needs any position per token (reuse at
//! a new offset, sparse recompute), so kvb has its own. Angles are computed in f32 exactly as
//! transformers does (`inv_freq * position` in f32, then cos/sin), so golden logits match.

use crate::config::ModelConfig;
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use kvb_attn::float_on;

/// RoPE frequencies of one model.
#[derive(Debug, Clone)]
pub struct Rope {
    /// One frequency per rotated pair: `[head_dim / 2]`.
    inv_freq: Vec<f32>,
}

/// cos/sin tables for one set of positions, shaped to broadcast over `[1, heads, n, head_dim]`.
#[derive(Debug, Clone)]
pub struct RopeTables<B: Backend> {
    /// `[1, 1, n, head_dim]`: `cos(angle)` for both halves.
    cos: Tensor<B, 4>,
    /// `[1, 1, n, head_dim]`: `-sin(angle)` for the first half, `sin(angle)` for the second.
    signed_sin: Tensor<B, 4>,
}

impl Rope {
    /// The frequencies of `config` (theta, head_dim and rope_scaling).
    pub fn new(config: &ModelConfig) -> Self {
        let inv_freq = config
            .rope_scaling
            .inv_freq(config.head_dim, config.rope_theta);
        Rope { inv_freq }
    }

    /// Width of a head this RoPE rotates.
    pub fn head_dim(&self) -> usize {
        self.inv_freq.len() * 2
    }

    /// The f32 angle of pair `i` at `position`, computed as transformers does.
    fn angle(&self, position: usize, i: usize) -> f32 {
        position as f32 * self.inv_freq[i]
    }

    /// Tables that rotate tokens to `positions`.
    pub fn tables<B: Backend>(&self, positions: &[usize], device: &B::Device) -> RopeTables<B> {
        self.build_tables(positions.len(), device, |t, i| {
            let a = self.angle(positions[t], i);
            (a.cos(), a.sin())
        })
    }

    /// Tables that move keys already rotated to `from` so they read as rotated to `to`.
    ///
    /// Rotations in one plane compose by adding angles, so this rotates by the difference of the two
    /// f32 angles the model itself would use (taken in f64, so no precision is lost to the
    /// subtraction): re-rotated keys match keys encoded at `to` up to f32 rounding.
    pub fn rerotation_tables<B: Backend>(
        &self,
        from: &[usize],
        to: &[usize],
        device: &B::Device,
    ) -> RopeTables<B> {
        assert_eq!(
            from.len(),
            to.len(),
            "one source position per target position"
        );
        self.build_tables(from.len(), device, |t, i| {
            let delta = self.angle(to[t], i) as f64 - self.angle(from[t], i) as f64;
            (delta.cos() as f32, delta.sin() as f32)
        })
    }

    /// Re-rotates host keys in place: `keys` is `[heads, n, head_dim]` (token `t` of each head
    /// rotated to position `from[t]`), moved to `to[t]`. The same rotation, rounded the same way,
    /// as [`Rope::rerotation_tables`] applied to a tensor: done while K/V is copied from a chunk
    /// store into the pool, it costs no pass of its own.
    pub fn rerotate_host(&self, keys: &mut [f32], from: &[usize], to: &[usize]) {
        assert_eq!(
            from.len(),
            to.len(),
            "one source position per target position"
        );
        let half = self.inv_freq.len();
        let dim = 2 * half;
        let n = from.len();
        if n == 0 || dim == 0 {
            return;
        }
        // cos and sin of each token's angle difference, per pair.
        let table: Vec<(f32, f32)> = (0..n)
            .flat_map(|t| {
                (0..half).map(move |i| {
                    let delta = self.angle(to[t], i) as f64 - self.angle(from[t], i) as f64;
                    (delta.cos() as f32, delta.sin() as f32)
                })
            })
            .collect();
        for row in keys.chunks_exact_mut(n * dim) {
            for (t, x) in row.chunks_exact_mut(dim).enumerate() {
                if from[t] == to[t] {
                    continue;
                }
                for i in 0..half {
                    let (c, s) = table[t * half + i];
                    let (a, b) = (x[i], x[i + half]);
                    x[i] = a * c + b * -s;
                    x[i + half] = b * c + a * s;
                }
            }
        }
    }

    fn build_tables<B: Backend>(
        &self,
        n: usize,
        device: &B::Device,
        cos_sin: impl Fn(usize, usize) -> (f32, f32),
    ) -> RopeTables<B> {
        let half = self.inv_freq.len();
        let dim = half * 2;
        let mut cos = vec![0f32; n * dim];
        let mut sin = vec![0f32; n * dim];
        for t in 0..n {
            for i in 0..half {
                let (c, s) = cos_sin(t, i);
                cos[t * dim + i] = c;
                cos[t * dim + half + i] = c;
                sin[t * dim + i] = -s;
                sin[t * dim + half + i] = s;
            }
        }
        kvb_attn::host_work::uploaded(2);
        RopeTables {
            cos: Tensor::from_data(TensorData::new(cos, [1, 1, n, dim]), float_on::<B>(device)),
            signed_sin: Tensor::from_data(
                TensorData::new(sin, [1, 1, n, dim]),
                float_on::<B>(device),
            ),
        }
    }
}

impl<B: Backend> RopeTables<B> {
    /// `[1, 1, n, head_dim]`: `cos(angle)` for both halves.
    pub fn cos(&self) -> &Tensor<B, 4> {
        &self.cos
    }

    /// `[1, 1, n, head_dim]`: `-sin(angle)` for the first half, `sin(angle)` for the second.
    pub fn signed_sin(&self) -> &Tensor<B, 4> {
        &self.signed_sin
    }

    /// Rotates `x`: `[batch, heads, n, head_dim]`, one table row per token.
    ///
    /// `out = x * cos + swap_halves(x) * signed_sin`, i.e. HF's `x * cos + rotate_half(x) * sin`.
    pub fn apply(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let [b, h, n, d] = x.dims();
        let half = d / 2;
        let first = x.clone().slice([0..b, 0..h, 0..n, 0..half]);
        let second = x.clone().slice([0..b, 0..h, 0..n, half..d]);
        let swapped = Tensor::cat(vec![second, first], 3);
        x * self.cos.clone() + swapped * self.signed_sin.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn::backend::NdArray;
    use burn::tensor::Distribution;

    type B = NdArray<f32>;

    fn config(scaling: &str) -> ModelConfig {
        let json = format!(
            r#"{{"architectures":["LlamaForCausalLM"],"hidden_size":64,"intermediate_size":64,
            "num_hidden_layers":1,"num_attention_heads":4,"vocab_size":8,"rope_theta":10000.0,
            "rope_scaling":{scaling}}}"#
        );
        ModelConfig::from_json(&json, true).unwrap()
    }

    fn max_diff(a: Tensor<B, 4>, b: Tensor<B, 4>) -> f32 {
        (a - b).abs().max().into_scalar()
    }

    #[test]
    fn rerotating_from_p_to_q_equals_encoding_at_q() {
        let dev = Default::default();
        for scaling in ["null", r#"{"rope_type":"linear","factor":4.0}"#] {
            let rope = Rope::new(&config(scaling));
            let x = Tensor::<B, 4>::random([1, 2, 5, 16], Distribution::Default, &dev);
            let from = [0, 7, 100, 1500, 3];
            let to = [40, 2, 900, 10, 3];
            let at_from = rope.tables::<B>(&from, &dev).apply(x.clone());
            let moved = rope.rerotation_tables::<B>(&from, &to, &dev).apply(at_from);
            let at_to = rope.tables::<B>(&to, &dev).apply(x);
            let diff = max_diff(moved, at_to);
            assert!(diff < 2e-3, "{scaling}: {diff}");
        }
    }

    #[test]
    fn host_rerotation_equals_the_tensor_rerotation() {
        let dev = Default::default();
        let rope = Rope::new(&config("null"));
        let x = Tensor::<B, 4>::random([1, 3, 5, 16], Distribution::Default, &dev);
        let from = [0, 7, 100, 1500, 3];
        let to = [40, 2, 900, 10, 3];
        let want = rope
            .rerotation_tables::<B>(&from, &to, &dev)
            .apply(x.clone());
        let mut host = x.into_data().to_vec::<f32>().unwrap();
        rope.rerotate_host(&mut host, &from, &to);
        let want = want.into_data().to_vec::<f32>().unwrap();
        for (g, w) in host.iter().zip(&want) {
            assert_eq!(g.to_bits(), w.to_bits(), "{g} vs {w}");
        }
    }

    #[test]
    fn position_zero_is_the_identity() {
        let dev = Default::default();
        let rope = Rope::new(&config("null"));
        let x = Tensor::<B, 4>::random([1, 1, 3, 16], Distribution::Default, &dev);
        let y = rope.tables::<B>(&[0, 0, 0], &dev).apply(x.clone());
        assert_eq!(max_diff(x, y), 0.0);
    }

    #[test]
    fn rotation_preserves_each_pairs_norm() {
        let dev = Default::default();
        let rope = Rope::new(&config("null"));
        let x = Tensor::<B, 4>::random([1, 1, 4, 16], Distribution::Default, &dev);
        let y = rope.tables::<B>(&[1, 9, 77, 300], &dev).apply(x.clone());
        let pair_norms = |t: Tensor<B, 4>| {
            let a = t.clone().slice([0..1, 0..1, 0..4, 0..8]);
            let b = t.slice([0..1, 0..1, 0..4, 8..16]);
            a.clone() * a + b.clone() * b
        };
        assert!(max_diff(pair_norms(x), pair_norms(y)) < 1e-5);
    }

    #[test]
    fn llama3_scaling_keeps_high_and_divides_low_frequencies() {
        let plain = Rope::new(&config("null"));
        let scaled = Rope::new(&config(
            r#"{"rope_type":"llama3","factor":8.0,"low_freq_factor":1.0,"high_freq_factor":4.0,"original_max_position_embeddings":32}"#,
        ));
        assert_eq!(plain.inv_freq[0], scaled.inv_freq[0]);
        let last = plain.inv_freq.len() - 1;
        assert!((plain.inv_freq[last] / 8.0 - scaled.inv_freq[last]).abs() < 1e-9);
    }
}
