//! Attention in burn tensor ops: the reference every backend can run.

use crate::mask::{attention_bias, Visibility};
use crate::AttnError;
use burn::tensor::activation::softmax;
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Tensor};

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
    let [batch, q_heads, n, head_dim] = q.dims();
    let [k_batch, kv_heads, t, k_dim] = k.dims();
    if k.dims() != v.dims() {
        return Err(AttnError::Shape(format!(
            "k is {:?} but v is {:?}",
            k.dims(),
            v.dims()
        )));
    }
    if k_batch != batch || k_dim != head_dim {
        return Err(AttnError::Shape(format!(
            "q is {:?} but k/v are {:?}",
            q.dims(),
            k.dims()
        )));
    }
    if kv_heads == 0 || q_heads % kv_heads != 0 {
        return Err(AttnError::Shape(format!(
            "{q_heads} query heads cannot share {kv_heads} kv heads"
        )));
    }
    let group = q_heads / kv_heads;
    let bias = attention_bias::<B>(visibility, extra_mask, n, t, &q.device())?;
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
