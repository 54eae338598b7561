//! In which precision the model holds its weights, and building projections and the token
//! embedding in it.

use super::layers::{Embedding, Linear};
use super::ModelBackend;
use crate::error::{ModelError, Result};
use crate::packed::{BlockTensor, PackedMatrix};
use crate::weights::{HostTensor, StoredTensor};
use std::sync::Arc;

/// The precision weights are held in (`--weights`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightPrecision {
    /// As stored: a GGUF's quantized tensors (Q4_0 to Q6_K) stay quantized (the same values as their
    /// f32 expansion, so the same outputs), everything else becomes f32.
    #[default]
    Auto,
    /// Every weight expanded to f32.
    F32,
    /// At most 8 bits per weight: stored quantized tensors stay as they are, f32/f16/bf16
    /// projections and embeddings are quantized to 8 bits per weight (lossy).
    Q8_0,
}

impl WeightPrecision {
    /// The names `--weights` accepts.
    pub const NAMES: [&'static str; 3] = ["auto", "f32", "q8_0"];

    /// Whether outputs can differ from the f32 weights' (a cache key must then tell them apart).
    pub fn is_lossy(self) -> bool {
        self == WeightPrecision::Q8_0
    }
}

impl std::fmt::Display for WeightPrecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WeightPrecision::Auto => "auto",
            WeightPrecision::F32 => "f32",
            WeightPrecision::Q8_0 => "q8_0",
        })
    }
}

impl std::str::FromStr for WeightPrecision {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(WeightPrecision::Auto),
            "f32" => Ok(WeightPrecision::F32),
            "q8_0" | "q8" => Ok(WeightPrecision::Q8_0),
            other => Err(format!(
                "unknown weight precision `{other}` (expected one of {})",
                WeightPrecision::NAMES.join(", ")
            )),
        }
    }
}

/// The packed form of `parts` (stacked along their rows) in `precision`, or `None` where they
/// are held in f32.
fn packed(parts: &[StoredTensor], precision: WeightPrecision) -> Result<Option<PackedMatrix>> {
    let blocks: Vec<&BlockTensor> = parts
        .iter()
        .filter_map(|p| match p {
            StoredTensor::Blocks(b) => Some(b),
            StoredTensor::F32(_) => None,
        })
        .collect();
    let all_blocks = blocks.len() == parts.len();
    match precision {
        WeightPrecision::F32 => Ok(None),
        // Stored blocks stay as they are (at most 8 bits already).
        WeightPrecision::Auto | WeightPrecision::Q8_0 if all_blocks => {
            PackedMatrix::from_blocks(&blocks).map(Some)
        }
        WeightPrecision::Auto => Ok(None),
        WeightPrecision::Q8_0 => {
            let host: Vec<HostTensor> = parts.iter().cloned().map(StoredTensor::into_f32).collect();
            let cols = match host.first().map(|t| t.shape.as_slice()) {
                Some(&[_, cols]) => cols,
                // Not a matrix: nothing to quantize.
                _ => return Ok(None),
            };
            if cols % crate::packed::CELL_ROWS != 0 {
                // Too narrow to quantize in blocks of 32: stays f32.
                return Ok(None);
            }
            let views: Vec<(&[f32], usize)> =
                host.iter().map(|t| (&t.data[..], t.shape[0])).collect();
            PackedMatrix::quantize_q8_0(&views, cols).map(Some)
        }
    }
}

/// A projection from PyTorch-layout parts `[out, in]` stacked along `out`.
pub(super) fn linear<B: ModelBackend>(
    parts: Vec<StoredTensor>,
    bias: Option<Vec<f32>>,
    precision: WeightPrecision,
    device: &B::Device,
) -> Result<Linear<B>> {
    if parts.is_empty() {
        return Err(ModelError::Weights("a projection with no weights".into()));
    }
    Ok(match packed(&parts, precision)? {
        Some(p) => Linear::from_packed(Arc::new(p), bias, device),
        None => {
            let host: Vec<HostTensor> = parts.into_iter().map(StoredTensor::into_f32).collect();
            Linear::from_torch(&host, bias, device)
        }
    })
}

/// The token embedding `[vocab, hidden]` and, when the head is tied to it, the LM head (one
/// packed copy serves both).
pub(super) fn embedding_and_tied_head<B: ModelBackend>(
    embed: StoredTensor,
    tied: bool,
    precision: WeightPrecision,
    device: &B::Device,
) -> Result<(Embedding<B>, Option<Linear<B>>)> {
    let host = match packed(std::slice::from_ref(&embed), precision)? {
        Some(p) if B::runs_packed_weights() => {
            let p = Arc::new(p);
            let head = tied.then(|| Linear::from_packed(p.clone(), None, device));
            return Ok((Embedding::Packed(p), head));
        }
        // The packed values, expanded (the same outputs as the packed path).
        Some(p) => HostTensor {
            shape: vec![p.n(), p.k()],
            data: (0..p.n()).flat_map(|j| p.column(j)).collect(),
        },
        None => embed.into_f32(),
    };
    let head = tied.then(|| Linear::from_torch(std::slice::from_ref(&host), None, device));
    Ok((Embedding::dense(host, device), head))
}
