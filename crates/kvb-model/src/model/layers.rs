//! The building blocks of a Llama-layout block: linear projections and RMSNorm.

use super::backend_ops::ModelBackend;
use super::int8::IntDotMatrix;
use super::linear_weight::{Dense, LinearWeight, Packed, Stacked};
use crate::config::Activation;
use crate::packed::PackedMatrix;
use crate::weights::HostTensor;
use burn::tensor::activation::{gelu, gelu_approximate, silu};
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use kvb_attn::{float_on, host_work};
use kvb_modelfile::MappedRows;
use std::sync::Arc;

/// `y = x W + b` with `W` `[in, out]`: contiguous, or the transposed view of PyTorch's
/// `[out, in]` where the backend asks for it ([`ModelBackend::weights_out_in`]).
///
/// On the CPU the transpose is done once at load because burn-ndarray copies a non-contiguous
/// right-hand side on every matmul, which would dominate a decode step. `W` is a
/// [`LinearWeight`]: f32, packed blocks, 8-bit-activation layouts, stacks of them, or a format
/// of another crate's.
#[derive(Debug, Clone)]
pub struct Linear<B: ModelBackend> {
    pub(super) weight: Arc<dyn LinearWeight<B>>,
    pub(super) bias: Option<Tensor<B, 1>>,
}

impl<B: ModelBackend> Linear<B> {
    /// Builds from PyTorch-layout weights `[out, in]` (several stacked along `out` to fuse
    /// projections that read the same input) and an optional bias `[out]`.
    pub fn from_torch(weights: &[HostTensor], bias: Option<Vec<f32>>, device: &B::Device) -> Self {
        let cols = weights[0].shape[1];
        let rows: usize = weights.iter().map(|w| w.shape[0]).sum();
        let weight = if B::weights_out_in() {
            let mut t = Vec::with_capacity(rows * cols);
            for w in weights {
                t.extend_from_slice(&w.data);
            }
            out_in_view(t, rows, cols, device)
        } else {
            let mut t = vec![0f32; rows * cols];
            let mut row0 = 0;
            for w in weights {
                let r = w.shape[0];
                transpose_into(&w.data, r, cols, &mut t, rows, row0);
                row0 += r;
            }
            Tensor::from_data(TensorData::new(t, [cols, rows]), float_on::<B>(device))
        };
        Linear {
            weight: Arc::new(Dense(weight)),
            bias: bias_tensor(bias, device),
        }
    }

    /// Builds from a weight `[in, out]` as [`ModelBackend::linear_matmul`] takes it.
    pub fn from_in_out(weight: Tensor<B, 2>) -> Self {
        Linear {
            weight: Arc::new(Dense(weight)),
            bias: None,
        }
    }

    /// Builds from a weight in any format (kvb's: [`super::Dense`], [`super::Packed`], ...; or
    /// another crate's) and an optional bias `[out]` on the backend.
    pub fn from_weight(weight: Arc<dyn LinearWeight<B>>, bias: Option<Tensor<B, 1>>) -> Self {
        Linear { weight, bias }
    }

    /// Builds from a packed weight, kept packed where the backend multiplies packed weights
    /// and expanded to f32 (the same values) elsewhere.
    pub fn from_packed(
        weight: Arc<PackedMatrix>,
        bias: Option<Vec<f32>>,
        device: &B::Device,
    ) -> Self {
        let weight: Arc<dyn LinearWeight<B>> = if B::runs_packed_weights() {
            Arc::new(Packed(weight))
        } else if B::weights_out_in() {
            Arc::new(Dense(out_in_view(
                weight.to_torch_layout(),
                weight.n(),
                weight.k(),
                device,
            )))
        } else {
            Arc::new(Dense(Tensor::from_data(
                TensorData::new(weight.to_dense(), [weight.k(), weight.n()]),
                float_on::<B>(device),
            )))
        };
        Linear {
            weight,
            bias: bias_tensor(bias, device),
        }
    }

    /// Builds from stored parts kept apart (see [`Stacked`]), their outputs side
    /// by side in order, and an optional bias over all of them.
    pub(super) fn stacked(
        parts: Vec<Linear<B>>,
        bias: Option<Vec<f32>>,
        device: &B::Device,
    ) -> Self {
        Linear {
            weight: Arc::new(Stacked(parts.into_iter().map(|l| l.weight).collect())),
            bias: bias_tensor(bias, device),
        }
    }

    /// `x`: `[n, in]` -> `[n, out]`.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        host_work::launched(1);
        let y = self.weight.apply(x);
        match &self.bias {
            Some(b) => {
                host_work::launched(1);
                y + b.clone().unsqueeze::<2>()
            }
            None => y,
        }
    }

    /// Output width.
    pub fn out_dim(&self) -> usize {
        self.weight.out_dim()
    }

    /// Whether the weight is held quantized to integers (Q8_0 to Q4 blocks), not as floats.
    pub fn is_quantized(&self) -> bool {
        self.weight.is_quantized()
    }

    /// Bytes the weight holds.
    pub fn weight_bytes(&self) -> usize {
        self.weight.bytes()
    }
}

/// `[in, out]` as the transposed view of `t`, held `[out, in]` (`rows` outputs of `cols`).
fn out_in_view<B: ModelBackend>(
    t: Vec<f32>,
    rows: usize,
    cols: usize,
    device: &B::Device,
) -> Tensor<B, 2> {
    Tensor::<B, 2>::from_data(TensorData::new(t, [rows, cols]), float_on::<B>(device)).transpose()
}

fn bias_tensor<B: ModelBackend>(
    bias: Option<Vec<f32>>,
    device: &B::Device,
) -> Option<Tensor<B, 1>> {
    bias.map(|b| {
        let n = b.len();
        Tensor::from_data(TensorData::new(b, [n]), float_on::<B>(device))
    })
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

/// The token embedding table `[vocab, hidden]`: on the backend in f32, or packed (its rows are
/// the packed matrix's columns, expanded per looked-up token).
#[derive(Debug, Clone)]
pub enum Embedding<B: ModelBackend> {
    /// `[vocab, hidden]` on the backend.
    Dense(Tensor<B, 2>),
    /// `[hidden, vocab]` packed (shared with a tied LM head).
    Packed(Arc<PackedMatrix>),
    /// `[hidden, vocab]` laid out for 8-bit activation products (shared with a tied LM head).
    IntDot(Arc<IntDotMatrix>),
    /// `[vocab, hidden]` read in place from the model file's map, a row per looked-up token (an
    /// untied table: only the rows a request touches are read, into the shared page cache).
    Mapped(MappedRows),
}

impl<B: ModelBackend> Embedding<B> {
    /// A tied LM head that is this table itself, with no copy: its transposed view, where the
    /// backend holds dense weights `[out, in]`. `None` for a dense table elsewhere (the CPU
    /// multiplies a transposed copy) and for packed tables (their head shares the matrix).
    pub(super) fn head_view(&self) -> Option<Linear<B>> {
        match self {
            Embedding::Dense(t) if B::weights_out_in() => {
                Some(Linear::from_in_out(t.clone().transpose()))
            }
            _ => None,
        }
    }

    /// From host values `[vocab, hidden]`.
    pub fn dense(t: HostTensor, device: &B::Device) -> Self {
        let shape = [t.shape[0], t.shape[1]];
        Embedding::Dense(Tensor::from_data(
            TensorData::new(t.data, shape),
            float_on::<B>(device),
        ))
    }

    /// `[n, hidden]`: the rows of `tokens` (each below the vocabulary size).
    pub fn lookup(&self, tokens: &[u32], device: &B::Device) -> Tensor<B, 2> {
        let n = tokens.len();
        host_work::uploaded(1);
        match self {
            Embedding::Dense(table) => {
                host_work::launched(1);
                let ids: Vec<i64> = tokens.iter().map(|&t| t as i64).collect();
                let ids = Tensor::<B, 1, Int>::from_data(TensorData::new(ids, [n]), device);
                table.clone().select(0, ids)
            }
            Embedding::Packed(p) => {
                let rows: Vec<f32> = tokens.iter().flat_map(|&t| p.column(t as usize)).collect();
                Tensor::from_data(TensorData::new(rows, [n, p.k()]), float_on::<B>(device))
            }
            Embedding::IntDot(p) => {
                let rows: Vec<f32> = tokens.iter().flat_map(|&t| p.column(t as usize)).collect();
                Tensor::from_data(TensorData::new(rows, [n, p.k()]), float_on::<B>(device))
            }
            Embedding::Mapped(m) => {
                let rows: Vec<f32> = tokens
                    .iter()
                    .flat_map(|&t| m.row(t as usize).into_iter().flatten())
                    .collect();
                Tensor::from_data(TensorData::new(rows, [n, m.cols()]), float_on::<B>(device))
            }
        }
    }

    /// Bytes the table holds of its own (none for a mapped table: [`Self::mapped_bytes`]).
    pub fn bytes(&self) -> usize {
        match self {
            Embedding::Dense(t) => t.shape().num_elements() * t.dtype().size(),
            Embedding::Packed(p) => p.bytes(),
            Embedding::IntDot(p) => p.bytes(),
            Embedding::Mapped(_) => 0,
        }
    }

    /// Bytes of the model file the table is read from in place.
    pub fn mapped_bytes(&self) -> usize {
        match self {
            Embedding::Mapped(m) => m.mapped_bytes(),
            _ => 0,
        }
    }
}

/// Root-mean-square normalisation with a learned scale.
#[derive(Debug, Clone)]
pub struct RmsNorm<B: ModelBackend> {
    /// `[1, hidden]`; Gemma's stored `w - 1` already has the 1 added back.
    pub(super) weight: Tensor<B, 2>,
    pub(super) eps: f64,
}

impl<B: ModelBackend> RmsNorm<B> {
    /// `weight`: `[hidden]`.
    pub fn new(mut weight: Vec<f32>, add_one: bool, eps: f64, device: &B::Device) -> Self {
        if add_one {
            weight.iter_mut().for_each(|w| *w += 1.0);
        }
        let n = weight.len();
        RmsNorm {
            weight: Tensor::from_data(TensorData::new(weight, [1, n]), float_on::<B>(device)),
            eps,
        }
    }

    /// `x`: `[n, hidden]` -> `x / rms(x) * w`.
    pub fn forward(&self, x: Tensor<B, 2>) -> Tensor<B, 2> {
        host_work::launched(1);
        B::rms_norm(x, self.weight.clone(), self.eps)
    }

    /// `x + delta` (`[n, hidden]` each) and its norm: a residual add and the RMSNorm after it.
    pub fn forward_residual(&self, x: Tensor<B, 2>, delta: Tensor<B, 2>) -> [Tensor<B, 2>; 2] {
        host_work::launched(1);
        B::add_rms_norm(x, delta, self.weight.clone(), self.eps)
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
