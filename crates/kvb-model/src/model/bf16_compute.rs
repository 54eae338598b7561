//! A bf16 forward pass emulated in f32: every weight and every activation between operations
//! rounded to bf16, the arithmetic inside each operation kept in f32 (as a bf16 GPU kernel
//! accumulates in f32). It is the yardstick fidelity checks put reuse beside: how far a change
//! of precision people accept every day moves the model's predictions. It is not a fast path.

use super::layers::{Embedding, Linear, RmsNorm};
use super::{Model, ModelBackend};
use crate::error::Result;
use crate::packed::{PackedMatrix, CELL_ROWS};
use burn::tensor::{Tensor, TensorData};
use std::sync::Arc;

/// How a model's activations are held between operations.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ComputePrecision {
    /// f32 throughout.
    #[default]
    F32,
    /// Rounded to bf16 after every operation (embedding, norm, projection, rotation, attention,
    /// activation, residual sum, logits).
    Bf16,
}

/// `v` rounded to bf16 (to nearest, ties to even) and widened back.
pub(super) fn bf16(v: f32) -> f32 {
    half::bf16::from_f32(v).to_f32()
}

/// `x` with every value rounded to bf16.
pub(super) fn round_tensor<B: ModelBackend, const D: usize>(
    x: Tensor<B, D>,
) -> Result<Tensor<B, D>> {
    let (shape, device) = (x.shape(), x.device());
    let values = crate::to_host_f32(x);
    let rounded: Vec<f32> = values.into_iter().map(bf16).collect();
    Ok(Tensor::from_data(
        TensorData::new(rounded, shape),
        kvb_attn::float_on::<B>(&device),
    ))
}

/// A packed matrix's weights rounded to bf16 (packed as bf16 when its width allows whole cells,
/// else `None`: the caller keeps an f32 copy of the rounded values).
pub(super) fn rounded_packed(p: &PackedMatrix) -> Result<Option<PackedMatrix>> {
    if !p.k().is_multiple_of(CELL_ROWS) {
        return Ok(None);
    }
    Ok(Some(PackedMatrix::round_to_bf16(
        &[(&p.to_torch_layout(), p.n())],
        p.k(),
    )?))
}

/// The emulated bf16 forward rounds f32 activations; a model whose products quantize them to 8
/// bits already is not one it emulates.
pub(super) fn not_with_q8_activations() -> crate::error::ModelError {
    crate::error::ModelError::unsupported(
        "a bf16 forward of a model with 8-bit activations (load it with f32 activations)".into(),
    )
}

impl<B: ModelBackend> Linear<B> {
    /// The projection with its weight and bias rounded to bf16.
    fn rounded_to_bf16(&self, device: &B::Device) -> Result<Self> {
        let weight = self.weight.rounded_to_bf16(device)?;
        let bias = match &self.bias {
            Some(b) => Some(round_tensor(b.clone())?),
            None => None,
        };
        Ok(Linear { weight, bias })
    }
}

impl<B: ModelBackend> Embedding<B> {
    fn rounded_to_bf16(&self, device: &B::Device) -> Result<Self> {
        Ok(match self {
            Embedding::Dense(t) => Embedding::Dense(round_tensor(t.clone())?),
            Embedding::Packed(p) => match rounded_packed(p)? {
                Some(r) => Embedding::Packed(Arc::new(r)),
                None => {
                    let rows: Vec<f32> = p.to_torch_layout().into_iter().map(bf16).collect();
                    Embedding::Dense(Tensor::from_data(
                        TensorData::new(rows, [p.n(), p.k()]),
                        kvb_attn::float_on::<B>(device),
                    ))
                }
            },
            Embedding::IntDot(_) => return Err(not_with_q8_activations()),
            // Rounded rows cannot be read in place: the table is expanded.
            Embedding::Mapped(m) => {
                let rows: Vec<f32> = (0..m.rows())
                    .flat_map(|r| m.row(r).into_iter().flatten())
                    .map(bf16)
                    .collect();
                Embedding::Dense(Tensor::from_data(
                    TensorData::new(rows, [m.rows(), m.cols()]),
                    kvb_attn::float_on::<B>(device),
                ))
            }
        })
    }
}

impl<B: ModelBackend> RmsNorm<B> {
    fn rounded_to_bf16(&self) -> Result<Self> {
        Ok(RmsNorm {
            weight: round_tensor(self.weight.clone())?,
            eps: self.eps,
        })
    }
}

impl<B: ModelBackend> Model<B> {
    /// This model as a bf16 forward pass would run it: weights rounded to bf16 and activations
    /// rounded after every operation ([`ComputePrecision::Bf16`]). A new copy of the weights
    /// (2 bytes each where packed); `self` is unchanged.
    pub fn with_bf16_compute(&self) -> Result<Self> {
        let mut m = self.clone();
        m.embed = self.embed.rounded_to_bf16(&self.device)?;
        // One copy serves both where it did at load.
        m.lm_head = match m.embed.head_view() {
            Some(head) if self.config.tie_word_embeddings => head,
            _ => self.lm_head.rounded_to_bf16(&self.device)?,
        };
        m.norm = self.norm.rounded_to_bf16()?;
        for b in &mut m.blocks {
            b.attn_norm = b.attn_norm.rounded_to_bf16()?;
            b.qkv = b.qkv.rounded_to_bf16(&self.device)?;
            b.o = b.o.rounded_to_bf16(&self.device)?;
            b.mlp_norm = b.mlp_norm.rounded_to_bf16()?;
            b.gate_up = b.gate_up.rounded_to_bf16(&self.device)?;
            b.down = b.down.rounded_to_bf16(&self.device)?;
        }
        m.compute = ComputePrecision::Bf16;
        Ok(m)
    }

    /// How activations are held between operations.
    pub fn compute_precision(&self) -> ComputePrecision {
        self.compute
    }

    /// `x` as this model's compute precision holds it.
    pub(super) fn held<const D: usize>(&self, x: Tensor<B, D>) -> Result<Tensor<B, D>> {
        match self.compute {
            ComputePrecision::F32 => Ok(x),
            ComputePrecision::Bf16 => round_tensor(x),
        }
    }
}
