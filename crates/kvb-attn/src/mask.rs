//! Which keys each query may see, and the additive bias that enforces it.

use crate::AttnError;
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Tensor, TensorData};

/// Which key slots each query may attend to. Keys are addressed by their slot in the K/V sequence
/// (its index along the token axis), which is not necessarily their RoPE position.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Visibility {
    /// The `n` queries are the last `n` slots of the `t` keys: query `i` sees slots `[0, t - n + i]`.
    Causal,
    /// Query `i` sees slots `[0, last_slot[i]]`; one entry per query, each below `t`.
    UpToSlot(Vec<usize>),
}

impl Visibility {
    /// The last visible slot of each query, checked against `n` queries and `t` keys.
    pub fn last_slots(&self, n: usize, t: usize) -> Result<Vec<usize>, AttnError> {
        match self {
            Visibility::Causal => {
                if n > t {
                    return Err(AttnError::Visibility(format!(
                        "causal attention needs at least as many keys as queries ({n} queries, {t} keys)"
                    )));
                }
                Ok((0..n).map(|i| t - n + i).collect())
            }
            Visibility::UpToSlot(slots) => {
                if slots.len() != n {
                    return Err(AttnError::Visibility(format!(
                        "{} slots given for {n} queries",
                        slots.len()
                    )));
                }
                if let Some(&bad) = slots.iter().find(|&&s| s >= t) {
                    return Err(AttnError::Visibility(format!(
                        "query slot {bad} is outside the {t} keys"
                    )));
                }
                Ok(slots.clone())
            }
        }
    }
}

/// Builds the additive bias `[n, t]` (0 where visible, -inf where blocked), or `None` when every
/// query sees every key (a single decode query over its whole cache), so the common decode step
/// pays for no mask at all.
pub(crate) fn attention_bias<B: Backend>(
    visibility: &Visibility,
    extra_mask: Option<&Tensor<B, 2, Bool>>,
    n: usize,
    t: usize,
    device: &B::Device,
) -> Result<Option<Tensor<B, 2>>, AttnError> {
    let last = visibility.last_slots(n, t)?;
    let mut blocked: Vec<bool> = Vec::with_capacity(n * t);
    for &l in &last {
        blocked.extend((0..t).map(|j| j > l));
    }
    if let Some(extra) = extra_mask {
        if extra.dims() != [n, t] {
            return Err(AttnError::Shape(format!(
                "extra mask is {:?}, expected [{n}, {t}]",
                extra.dims()
            )));
        }
        let extra = extra.to_data();
        let extra = extra
            .as_slice::<bool>()
            .map_err(|e| AttnError::Shape(format!("extra mask is not boolean data: {e:?}")))?;
        for (b, &e) in blocked.iter_mut().zip(extra) {
            *b |= e;
        }
    }
    if let Some(row) = blocked.chunks(t.max(1)).position(|r| r.iter().all(|&b| b)) {
        if t > 0 {
            return Err(AttnError::Visibility(format!("query {row} can see no key")));
        }
    }
    if !blocked.iter().any(|&b| b) {
        return Ok(None);
    }
    let bias: Vec<f32> = blocked
        .into_iter()
        .map(|b| if b { f32::NEG_INFINITY } else { 0.0 })
        .collect();
    Ok(Some(Tensor::from_data(
        TensorData::new(bias, [n, t]),
        device,
    )))
}
