//! Which keys each query may see.

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

/// The visibility of `n` queries over `t` keys, resolved on the host and checked: every query sees
/// at least one key.
pub(crate) struct Mask {
    /// Last visible slot per query.
    pub last: Vec<usize>,
    /// `[n, t]`, `true` = blocked by the extra mask.
    pub blocked: Option<Vec<bool>>,
    pub t: usize,
}

impl Mask {
    pub fn new<B: Backend>(
        visibility: &Visibility,
        extra_mask: Option<&Tensor<B, 2, Bool>>,
        n: usize,
        t: usize,
    ) -> Result<Self, AttnError> {
        let last = visibility.last_slots(n, t)?;
        let blocked = match extra_mask {
            None => None,
            Some(extra) => {
                if extra.dims() != [n, t] {
                    return Err(AttnError::Shape(format!(
                        "extra mask is {:?}, expected [{n}, {t}]",
                        extra.dims()
                    )));
                }
                let data = extra.to_data();
                let values = data.as_slice::<bool>().map_err(|e| {
                    AttnError::Shape(format!("extra mask is not boolean data: {e:?}"))
                })?;
                Some(values.to_vec())
            }
        };
        let mask = Mask { last, blocked, t };
        if let Some(row) = (0..n).find(|&i| (0..t).all(|j| !mask.visible(i, j))) {
            return Err(AttnError::Visibility(format!("query {row} can see no key")));
        }
        Ok(mask)
    }

    /// Whether query `i` sees key `j`.
    pub fn visible(&self, i: usize, j: usize) -> bool {
        j <= self.last[i] && !self.blocked.as_ref().is_some_and(|b| b[i * self.t + j])
    }

    /// The additive bias `[n, t]` (0 where visible, -inf where blocked), or `None` when every query
    /// sees every key (a decode step over its whole cache), so that step pays for no mask.
    pub fn bias<B: Backend>(&self, device: &B::Device) -> Option<Tensor<B, 2>> {
        let (n, t) = (self.last.len(), self.t);
        let mut any_blocked = false;
        let bias: Vec<f32> = (0..n * t)
            .map(|x| {
                if self.visible(x / t.max(1), x % t.max(1)) {
                    0.0
                } else {
                    any_blocked = true;
                    f32::NEG_INFINITY
                }
            })
            .collect();
        any_blocked
            .then(|| Tensor::from_data(TensorData::new(bias, [n, t]), crate::float_on::<B>(device)))
    }
}
