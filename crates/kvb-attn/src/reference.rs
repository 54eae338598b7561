//! Attention in burn tensor ops: the reference every backend can run.

use crate::mask::{Mask, Visibility};
use crate::AttnError;
use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Tensor};

/// The checked dimensions of one attention call.
pub(crate) struct Dims {
    pub batch: usize,
    pub q_heads: usize,
    pub kv_heads: usize,
    pub n: usize,
    pub t: usize,
    pub head_dim: usize,
}

/// Checks that `q` `[batch, q_heads, n, d]` and `k`, `v` `[batch, kv_heads, t, d]` fit together.
pub(crate) fn check_dims(q: [usize; 4], k: [usize; 4], v: [usize; 4]) -> Result<Dims, AttnError> {
    let [batch, q_heads, n, head_dim] = q;
    let [k_batch, kv_heads, t, k_dim] = k;
    if k != v {
        return Err(AttnError::Shape(format!("k is {k:?} but v is {v:?}")));
    }
    if k_batch != batch || k_dim != head_dim {
        return Err(AttnError::Shape(format!("q is {q:?} but k/v are {k:?}")));
    }
    if kv_heads == 0 || q_heads % kv_heads != 0 {
        return Err(AttnError::Shape(format!(
            "{q_heads} query heads cannot share {kv_heads} kv heads"
        )));
    }
    Ok(Dims {
        batch,
        q_heads,
        kv_heads,
        n,
        t,
        head_dim,
    })
}

/// Scaled dot-product attention of `n` queries over `t` cached keys.
///
/// - `q`: `[batch, q_heads, n, head_dim]`
/// - `k`, `v`: `[batch, kv_heads, t, head_dim]`, with `q_heads` a multiple of `kv_heads`
/// - `extra_mask`: `[n, t]`, `true` where a query must not see a key
/// - returns `[batch, q_heads, n, head_dim]`
///
/// The softmax runs in the backend's float type; queries of one kv head's group are stacked into
/// one matrix so each K/V head is read once, never repeated.
pub fn attention<B: Backend>(
    q: Tensor<B, 4>,
    k: Tensor<B, 4>,
    v: Tensor<B, 4>,
    visibility: &Visibility,
    extra_mask: Option<&Tensor<B, 2, Bool>>,
    scale: f32,
) -> Result<Tensor<B, 4>, AttnError> {
    let Dims {
        batch,
        q_heads,
        kv_heads,
        n,
        t,
        head_dim,
    } = check_dims(q.dims(), k.dims(), v.dims())?;
    let group = q_heads / kv_heads;
    let bias = Mask::new::<B>(visibility, extra_mask, n, t)?.bias::<B>(&q.device());
    if n == 0 {
        return Ok(q);
    }

    // [batch, kv_heads, group * n, d]: the q heads of one group are contiguous (HF's repeat_kv order).
    let q = q.reshape([batch, kv_heads, group * n, head_dim]);
    let scores = q.matmul(k.swap_dims(2, 3)) * scale; // [batch, kv_heads, group * n, t]
    let scores = match bias {
        Some(bias) => {
            let scores = scores.reshape([batch, kv_heads, group, n, t]);
            (scores + bias.unsqueeze::<5>()).reshape([batch, kv_heads, group * n, t])
        }
        None => scores,
    };
    let probs = softmax(scores, 3);
    let out = probs.matmul(v); // [batch, kv_heads, group * n, d]
    Ok(out.reshape([batch, q_heads, n, head_dim]))
}
