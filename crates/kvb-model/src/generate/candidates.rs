//! Choosing tokens on the device: a pass's logits reduced there to each sampled row's best
//! tokens, read back in one copy, so that a vocabulary of logits never crosses to the host for
//! a greedy or a top-k choice ([`super::Sampler::sample_candidates`] then picks among them, as
//! [`super::Sampler::sample`] would among all the logits).

use crate::error::{ModelError, Result};
use crate::ModelBackend;
use burn::tensor::{DType, FloatDType, Tensor};

/// Candidates of a top-k row chosen on the device, whatever its `k` (at most this): one size,
/// so one top-k kernel is compiled per process and float type. Top-k sampling with a larger
/// `k`, and sampling without one, read the logits instead.
pub const MAX_DEVICE_K: usize = 64;

/// The `k` best tokens of each row, highest logit first (ties: the lower id first).
#[derive(Debug, Clone, PartialEq)]
pub struct Candidates {
    k: usize,
    ids: Vec<u32>,
    /// Their logits; empty when `k` is 1 (a single candidate needs none).
    values: Vec<f32>,
}

impl Candidates {
    /// Candidates per row.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Rows.
    pub fn rows(&self) -> usize {
        self.ids.len() / self.k
    }

    /// Row `r`'s token ids, best first.
    pub fn ids(&self, r: usize) -> &[u32] {
        &self.ids[r * self.k..(r + 1) * self.k]
    }

    /// Row `r`'s logits, in the order of [`Candidates::ids`] (empty when `k` is 1).
    pub fn values(&self, r: usize) -> &[f32] {
        if self.values.is_empty() {
            &[]
        } else {
            &self.values[r * self.k..(r + 1) * self.k]
        }
    }
}

/// The `k` best tokens of each row of `logits` (`[rows, vocab]`), reduced on `logits`' device
/// and read back in one copy: the argmax alone for `k = 1`, else the top `k` ids with their
/// logits (`k` is cut to the vocabulary).
pub fn top_candidates<B: ModelBackend>(logits: Tensor<B, 2>, k: usize) -> Result<Candidates> {
    let [rows, vocab] = logits.dims();
    if vocab == 0 || k == 0 {
        return Err(ModelError::Forward(format!(
            "{k} candidates of a vocabulary of {vocab}"
        )));
    }
    let k = k.min(vocab);
    if rows == 0 {
        return Ok(Candidates {
            k,
            ids: Vec::new(),
            values: Vec::new(),
        });
    }
    if k == 1 {
        let ids = B::argmax_rows(logits);
        return Ok(Candidates {
            k,
            ids: crate::host_ids::to_host_ids(ids)?,
            values: Vec::new(),
        });
    }
    // burn's top-k asks for fewer than all; a whole vocabulary is its sort.
    let ids = if k < vocab {
        logits.clone().argtopk(k, 1)
    } else {
        logits.clone().argsort_descending(1)
    };
    let mut values = logits.gather(1, ids.clone());
    kvb_attn::host_work::launched(4);
    if values.dtype() != DType::F32 {
        kvb_attn::host_work::launched(1);
        values = values.cast(FloatDType::F32);
    }
    // Ids as f32 (exact below 2^24) beside the values: one copy back.
    let both = Tensor::cat(vec![values, ids.cast(FloatDType::F32)], 1);
    let host = crate::to_host_f32(both);
    let mut out = Candidates {
        k,
        ids: Vec::with_capacity(rows * k),
        values: Vec::with_capacity(rows * k),
    };
    for row in host.chunks_exact(2 * k) {
        let (values, ids) = row.split_at(k);
        let mut order: Vec<usize> = (0..k).collect();
        order.sort_unstable_by(|&a, &b| {
            values[b]
                .total_cmp(&values[a])
                .then(ids[a].total_cmp(&ids[b]))
        });
        out.ids.extend(order.iter().map(|&i| ids[i] as u32));
        out.values.extend(order.iter().map(|&i| values[i]));
    }
    Ok(out)
}
