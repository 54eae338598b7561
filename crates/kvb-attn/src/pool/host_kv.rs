//! Host K/V to write into a pool, and the generic read of pool slots.

use super::PoolBackend;
use crate::paged::runs;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};

/// One layer of a K/V pool: its K and its V, each `[kv_heads, slots, head_dim]`.
pub type PoolLayer<B> = (Tensor<B, 3>, Tensor<B, 3>);

/// [`PoolBackend::pool_write_host`] of one layer's K and V.
pub(crate) fn write_host_layer<B: PoolBackend>(
    (k, v): PoolLayer<B>,
    slots: &[usize],
    (sk, sv): &(HostKv, HostKv),
) -> PoolLayer<B> {
    (
        B::pool_write_host(k, slots, *sk),
        B::pool_write_host(v, slots, *sv),
    )
}

/// Host K or V to write into a pool: `data` is `[kv_heads, tokens, head_dim]`, of which tokens
/// `first..` are written (a piece of a stored chunk).
#[derive(Debug, Clone, Copy)]
pub struct HostKv<'a> {
    /// The values.
    pub data: &'a [f32],
    /// Tokens per head in `data`.
    pub tokens: usize,
    /// The first token written.
    pub first: usize,
}

impl HostKv<'_> {
    /// All of `data`, `[kv_heads, tokens, head_dim]`.
    pub fn all(data: &[f32], tokens: usize) -> HostKv<'_> {
        HostKv {
            data,
            tokens,
            first: 0,
        }
    }

    /// Tokens `first..first + n` of every head as a tensor `[heads, n, d]` on `device`.
    pub fn tensor<B: Backend>(
        &self,
        heads: usize,
        d: usize,
        n: usize,
        device: &B::Device,
    ) -> Tensor<B, 3> {
        Tensor::from_data(
            TensorData::new(self.rows(heads, d, n), [heads, n, d]),
            crate::float_on::<B>(device),
        )
    }

    /// Tokens `first..first + n` of every head, contiguous: `[heads, n, d]`.
    pub fn rows(&self, heads: usize, d: usize, n: usize) -> Vec<f32> {
        let mut out = Vec::with_capacity(heads * n * d);
        for h in 0..heads {
            let from = (h * self.tokens + self.first) * d;
            out.extend_from_slice(&self.data[from..from + n * d]);
        }
        out
    }
}

/// The values at pool slots `slots`: `[kv_heads, n, head_dim]` (a slice when they are
/// consecutive, a gather otherwise).
pub fn pool_read<B: Backend>(pool: &Tensor<B, 3>, slots: &[usize]) -> Tensor<B, 3> {
    let [h, _, d] = pool.dims();
    let mut parts: Vec<Tensor<B, 3>> = runs(slots)
        .map(|(_, first, len)| pool.clone().slice([0..h, first..first + len, 0..d]))
        .collect();
    match parts.len() {
        // Zero elements: `empty` launches nothing, where burn-cubecl's `zeros` launches a kernel of
        // zero cubes, which CUDA rejects (CUDA_ERROR_INVALID_VALUE).
        0 => Tensor::empty([h, 0, d], (&pool.device(), pool.dtype())),
        1 => parts.pop().expect("one part"),
        n if n <= 8 => Tensor::cat(parts, 1),
        _ => {
            let idx: Vec<i64> = slots.iter().map(|&s| s as i64).collect();
            let idx =
                Tensor::<B, 1, Int>::from_data(TensorData::new(idx, [slots.len()]), &pool.device());
            pool.clone().select(1, idx)
        }
    }
}
