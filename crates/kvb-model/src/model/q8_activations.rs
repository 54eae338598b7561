//! `--activations`: converting a loaded model's integer weights for products with 8-bit
//! activations ([`super::int8`]).

use super::layers::{Embedding, Linear};
use super::linear_weight::{Dense, IntDot};
use super::{Model, ModelBackend};
use crate::error::{ModelError, Result};
use burn::tensor::Tensor;

/// How the products quantize their input rows (`--activations`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ActivationPrecision {
    /// f32 rows against the weights' exact values: the bits of the f32 model.
    #[default]
    F32,
    /// Rows quantized to 8 bits per value, one f32 scale per 32 (llama.cpp's Q8 activations),
    /// for products with integer weights.
    Q8,
}

impl ActivationPrecision {
    /// The names `--activations` accepts.
    pub const NAMES: [&'static str; 2] = ["f32", "q8"];

    /// What a cache namespace records of this precision: its name and the revision of its
    /// arithmetic, so that K/V computed by an earlier revision is never served as this one's
    /// (revision 2, 2026-11-26: a K-quant file's Q6_K parts take 8-bit products too; revision 3,
    /// 2026-12-02: so do Q2_K's).
    pub fn cache_tag(self) -> String {
        match self {
            ActivationPrecision::F32 => "f32".into(),
            ActivationPrecision::Q8 => "q8 r3".into(),
        }
    }
}

impl std::fmt::Display for ActivationPrecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            ActivationPrecision::F32 => "f32",
            ActivationPrecision::Q8 => "q8",
        })
    }
}

impl std::str::FromStr for ActivationPrecision {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "f32" => Ok(ActivationPrecision::F32),
            "q8" | "q8_0" | "int8" => Ok(ActivationPrecision::Q8),
            other => Err(format!(
                "unknown activation precision `{other}` (expected one of {})",
                ActivationPrecision::NAMES.join(", ")
            )),
        }
    }
}

impl<B: ModelBackend> Linear<B> {
    /// Whether the weight is one [`super::int8::IntDotMatrix`] takes.
    fn takes_q8_activations(&self) -> bool {
        self.weight.takes_q8_activations()
    }

    /// The projection with its packed integer weights re-laid out for 8-bit activations, in
    /// place where nothing else holds them
    /// ([`super::linear_weight::LinearWeight::into_q8_activations`]).
    fn with_q8_activations(self) -> Result<Self> {
        if !self.weight.takes_q8_activations() {
            return Ok(self);
        }
        let (out, bytes) = (self.weight.out_dim(), self.weight.bytes());
        let weight = self.weight.into_q8_activations().ok_or_else(|| {
            ModelError::unsupported(format!(
                "a weight of {out} outputs ({bytes} bytes) takes 8-bit activations but its \
                 conversion gave nothing back"
            ))
        })?;
        Ok(Linear {
            weight,
            bias: self.bias,
        })
    }
}

impl<B: ModelBackend> Model<B> {
    /// This model with its products' inputs held in `activations`. For
    /// [`ActivationPrecision::Q8`], every projection (and the LM head) whose weight is packed in
    /// integer blocks of 32 is re-laid out for 8-bit products, and K-quant cells are shared as
    /// loaded ([`super::int8::IntDotMatrix`]); a tied embedding shares the result. Errors where the backend does not run packed weights
    /// (the kernels are the CPU's), or where no projection holds integer weights (f32 or 16-bit
    /// float weights: `--weights q8_0` quantizes them first).
    pub fn with_activations(self, activations: ActivationPrecision) -> Result<Self> {
        if activations == self.activations {
            return Ok(self);
        }
        if self.activations != ActivationPrecision::F32
            || self.compute != super::ComputePrecision::F32
        {
            return Err(ModelError::unsupported(format!(
                "changing a model's activations from {} to {activations}; load it again",
                self.activations
            )));
        }
        self.into_q8_activations()
    }

    /// Whether [`Model::with_activations`] can give this model 8-bit activations: the backend
    /// runs packed weights (the CPU's) and some layer projection is held in integer blocks.
    /// (A fidelity check asks before it adds the 8-bit row to its noise floor.)
    pub fn takes_q8_activations(&self) -> bool {
        B::runs_packed_weights()
            && self
                .blocks
                .iter()
                .flat_map(|b| [&b.qkv, &b.o, &b.gate_up, &b.down])
                .any(Linear::takes_q8_activations)
    }

    fn into_q8_activations(mut self) -> Result<Self> {
        use super::int8::IntDotMatrix;
        use std::sync::Arc;
        if !B::runs_packed_weights() {
            return Err(ModelError::unsupported(
                "8-bit activations on this backend (its products run in f32; the 8-bit kernels \
                 are the CPU's)"
                    .into(),
            ));
        }
        if !self.takes_q8_activations() {
            return Err(ModelError::unsupported(
                "8-bit activations with weights that are not integers in blocks (Q4_0, Q4_1, \
                 Q5_0, Q5_1, Q8_0, IQ4_NL, Q2_K to Q6_K, IQ4_XS); add --weights q8_0 to quantize \
                 float weights"
                    .into(),
            ));
        }
        // A weight being converted has let go of its matrix (this 1x1 stand-in for the
        // moment), so the conversion can re-lay it in its own pages.
        let stand_in = Tensor::<B, 2>::zeros([1, 1], &self.device);
        // A tied head and the embedding share one matrix: convert it once for both.
        let tied = match (&self.embed, self.lm_head.weight.packed()) {
            (Embedding::Packed(e), Some(h)) if Arc::ptr_eq(e, h) && IntDotMatrix::takes(e) => {
                Some(e.clone())
            }
            _ => None,
        };
        let shared = tied.map(|e| {
            // Both let go of it first: a 1B model's embedding is 279 MB in Q8_0.
            self.lm_head.weight = Arc::new(Dense(stand_in.clone()));
            self.embed = Embedding::Dense(stand_in.clone());
            Arc::new(IntDotMatrix::from_held(e).expect("`takes` took the embedding"))
        });
        if let Some(d) = shared {
            self.embed = Embedding::IntDot(d.clone());
            self.lm_head.weight = Arc::new(IntDot(d));
        } else {
            self.lm_head = self.lm_head.with_q8_activations()?;
        }
        // Each projection moved out, not cloned.
        let stand_in = Linear {
            weight: Arc::new(Dense(stand_in)),
            bias: None,
        };
        for b in &mut self.blocks {
            for l in [&mut b.qkv, &mut b.o, &mut b.gate_up, &mut b.down] {
                *l = std::mem::replace(l, stand_in.clone()).with_q8_activations()?;
            }
        }
        self.activations = ActivationPrecision::Q8;
        Ok(self)
    }

    /// How products quantize their input rows.
    pub fn activation_precision(&self) -> ActivationPrecision {
        self.activations
    }
}
