//! The building blocks of a Llama-layout block: linear projections and RMSNorm.

use super::backend_ops::ModelBackend;
use crate::config::Activation;
use crate::weights::HostTensor;
use burn::tensor::activation::{gelu, gelu_approximate, silu};
use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};

/// `y = x W + b` with `W` stored `[in, out]`, contiguous.
///
/// PyTorch stores `[out, in]`; the transpose is done once at load because burn-ndarray copies a
/// non-contiguous right-hand side on every matmul, which would dominate a decode step.
#[derive(Debug, Clone)]
pub struct Linear<B: ModelBackend> {
    weight: Tensor<B, 2>,
    bias: Option<Tensor<B, 1>>,
}

impl<B: ModelBackend> Linear<B> {
    /// Builds from PyTorch-layout weights `[out, in]` (several stacked along `out` to fuse
    /// projections that read the same input) and an optional bias `[out]`.
    pub fn from_torch(weights: &[HostTensor], bias: Option<Vec<f32>>, device: &B::Device) -> Self {
        let cols = weights[0].shape[1];
        let rows: usize = weights.iter().map(|w| w.shape[0]).sum();
        let mut t = vec![0f32; rows * cols];
        let mut row0 = 0;
        for w in weights {
            let r = w.shape[0];
            transpose_into(&w.data, r, cols, &mut t, rows, row0);
            row0 += r;
        }
        Linear {
            weight: Tensor::from_data(TensorData::new(t, [cols, rows]), device),
            bias: bias.map(|b| {
                let n = b.len();
                Tensor::from_data(TensorData::new(b, [n]), device)
            }),
        }
    }

    /// Builds from a weight already laid out `[in, out]`.
    pub fn from_in_out(weight: Tensor<B, 2>) -> Self {
        Linear { weight, bias: None }
    }

    /// `x`: `[n, in]` -> `[n, out]`.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        let y = B::linear_matmul(x, self.weight.clone());
        match &self.bias {
            Some(b) => y + b.clone().unsqueeze::<2>(),
            None => y,
        }
    }

    /// Output width.
    pub fn out_dim(&self) -> usize {
        self.weight.dims()[1]
    }
}

/// Writes the transpose of `src` (`[rows, cols]`) into columns `col0..col0 + rows` of `dst`
/// (`[cols, dst_cols]`), in cache-friendly tiles.
fn transpose_into(
    src: &[f32],
    rows: usize,
    cols: usize,
    dst: &mut [f32],
    dst_cols: usize,
    col0: usize,
) {
    const TILE: usize = 32;
    for r0 in (0..rows).step_by(TILE) {
        for c0 in (0..cols).step_by(TILE) {
            for r in r0..(r0 + TILE).min(rows) {
                for c in c0..(c0 + TILE).min(cols) {
                    dst[c * dst_cols + col0 + r] = src[r * cols + c];
                }
            }
        }
    }
}

/// Root-mean-square normalisation with a learned scale.
#[derive(Debug, Clone)]
pub struct RmsNorm<B: ModelBackend> {
    /// `[1, hidden]`; Gemma's stored `w - 1` already has the 1 added back.
    weight: Tensor<B, 2>,
    eps: f64,
}

impl<B: ModelBackend> RmsNorm<B> {
    /// `weight`: `[hidden]`.
    pub fn new(mut weight: Vec<f32>, add_one: bool, eps: f64, device: &B::Device) -> Self {
        if add_one {
            weight.iter_mut().for_each(|w| *w += 1.0);
        }
        let n = weight.len();
        RmsNorm {
            weight: Tensor::from_data(TensorData::new(weight, [1, n]), device),
            eps,
        }
    }

    /// `x`: `[n, hidden]` -> `x / rms(x) * w`.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        B::rms_norm(x, self.weight.clone(), self.eps)
    }
}

/// Applies the feed-forward activation.
pub fn activate<B: Backend>(act: Activation, x: Tensor<B, 2>) -> Tensor<B, 2> {
    match act {
        Activation::Silu => silu(x),
        Activation::GeluTanh => gelu_approximate(x),
        Activation::Gelu => gelu(x),
    }
}
