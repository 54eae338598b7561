//! In which precision the model holds its weights, and building projections and the token
//! embedding in it.

use super::layers::{Embedding, Linear};
use super::ModelBackend;
use crate::error::{ModelError, Result};
use crate::gguf::blocks::is_quantized;
use crate::packed::{BlockTensor, PackedMatrix};
use crate::weights::{HostTensor, StoredTensor};
use std::sync::Arc;

/// The precision weights are held in (`--weights`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WeightPrecision {
    /// As stored: a GGUF's quantized tensors (Q4_0 to Q6_K) stay quantized and f16/bf16
    /// projections and embeddings (a GGUF's or a safetensors folder's) stay 16-bit, with the same
    /// values as their f32 expansion, so the same outputs; f32 weights stay f32.
    #[default]
    Auto,
    /// Every weight expanded to f32.
    F32,
    /// At most 16 bits per weight: stored quantized and 16-bit tensors stay as they are, f32
    /// projections and embeddings are rounded to bf16 (lossy).
    Bf16,
    /// At most 8 bits per weight: stored quantized tensors stay as they are, f32/f16/bf16
    /// projections and embeddings are quantized to 8 bits per weight (lossy).
    Q8_0,
}

impl WeightPrecision {
    /// The names `--weights` accepts.
    pub const NAMES: [&'static str; 4] = ["auto", "f32", "bf16", "q8_0"];

    /// Whether outputs can differ from the f32 weights' (a cache key must then tell them apart).
    pub fn is_lossy(self) -> bool {
        matches!(self, WeightPrecision::Q8_0 | WeightPrecision::Bf16)
    }
}

impl std::fmt::Display for WeightPrecision {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            WeightPrecision::Auto => "auto",
            WeightPrecision::F32 => "f32",
            WeightPrecision::Bf16 => "bf16",
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
            "bf16" => Ok(WeightPrecision::Bf16),
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
    let cols = match parts.first() {
        Some(StoredTensor::Blocks(b)) => b.cols,
        Some(StoredTensor::F32(t)) if t.shape.len() == 2 => t.shape[1],
        // Not a matrix: nothing to pack.
        _ => return Ok(None),
    };
    let floats = blocks.iter().filter(|b| !is_quantized(b.ggml_type)).count();
    // Packed as stored: every part in blocks, all quantized or all of one 16-bit float type
    // (in whole cells).
    let as_stored = blocks.len() == parts.len()
        && (floats == 0
            || (blocks.iter().all(|b| b.ggml_type == blocks[0].ggml_type)
                && cols % crate::packed::CELL_ROWS == 0));
    // Rounding and quantizing work on whole 32-weight runs.
    let whole_runs = cols % crate::packed::CELL_ROWS == 0;
    let as_f32 =
        || -> Vec<HostTensor> { parts.iter().cloned().map(StoredTensor::into_f32).collect() };
    match precision {
        WeightPrecision::F32 => Ok(None),
        WeightPrecision::Auto | WeightPrecision::Bf16 if as_stored => {
            Ok(Some(PackedMatrix::from_blocks(&blocks)?))
        }
        WeightPrecision::Q8_0 if as_stored && floats == 0 => {
            Ok(Some(PackedMatrix::from_blocks(&blocks)?))
        }
        // f32 parts rounded to bf16; parts stored otherwise (a mix) keep their values in f32.
        WeightPrecision::Bf16 if blocks.is_empty() && whole_runs => Ok(Some(
            PackedMatrix::round_to_bf16(&row_views(&as_f32()), cols)?,
        )),
        WeightPrecision::Q8_0 if whole_runs => Ok(Some(PackedMatrix::quantize_q8_0(
            &row_views(&as_f32()),
            cols,
        )?)),
        // As stored in f32, or too narrow for whole runs of 32: stays f32.
        _ => Ok(None),
    }
}

/// Each 2-d part's values and rows.
fn row_views(host: &[HostTensor]) -> Vec<(&[f32], usize)> {
    host.iter().map(|t| (&t.data[..], t.shape[0])).collect()
}

/// Fused parts kept as stored that hold different quantized formats, as runs of one format
/// each; `None` where one matrix keeps them all (one
/// format, or weights held in f32). One matrix of mixed parts would widen every part to a
/// format that holds the widest (a Q4_K q beside a Q6_K v: 12 bits a weight).
fn stored_apart(
    parts: &[StoredTensor],
    precision: WeightPrecision,
) -> Option<Vec<Vec<StoredTensor>>> {
    let types: Vec<_> = parts
        .iter()
        .map(|p| match p {
            StoredTensor::Blocks(b) if is_quantized(b.ggml_type) => Some(b.ggml_type),
            _ => None,
        })
        .collect::<Option<_>>()?;
    if precision == WeightPrecision::F32 || types.iter().all(|t| *t == types[0]) {
        return None;
    }
    let mut runs: Vec<Vec<StoredTensor>> = Vec::new();
    for (i, part) in parts.iter().enumerate() {
        match runs.last_mut() {
            Some(run) if types[i - 1] == types[i] => run.push(part.clone()),
            _ => runs.push(vec![part.clone()]),
        }
    }
    Some(runs)
}

/// A projection from PyTorch-layout parts `[out, in]` stacked along `out`.
pub(super) fn linear<B: ModelBackend>(
    parts: Vec<StoredTensor>,
    bias: Option<Vec<f32>>,
    precision: WeightPrecision,
    device: &B::Device,
) -> Result<Linear<B>> {
    if parts.is_empty() {
        return Err(ModelError::weights("a projection with no weights".into()));
    }
    // Elsewhere the weights are expanded to the backend's floats: one matrix serves.
    if let Some(runs) = stored_apart(&parts, precision).filter(|_| B::runs_packed_weights()) {
        let parts = runs
            .into_iter()
            .map(|run| linear(run, None, precision, device))
            .collect::<Result<Vec<_>>>()?;
        return Ok(Linear::stacked(parts, bias, device));
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
            data: p.to_torch_layout(),
        },
        None => embed.into_f32(),
    };
    if B::weights_out_in() {
        let table = Embedding::dense(host, device);
        let head = if tied { table.head_view() } else { None };
        return Ok((table, head));
    }
    let head = tied.then(|| Linear::from_torch(std::slice::from_ref(&host), None, device));
    Ok((Embedding::dense(host, device), head))
}
