//! The attention a backend runs: the reference ops unless the backend has a faster kernel.

use crate::paged::{self, PagedBatch};
use crate::{reference, AttnError, Visibility};
use burn::tensor::backend::Backend;
use burn::tensor::{Bool, Tensor};

/// A burn backend that can run kvb's attention. The default methods are the references in burn
/// tensor ops, so `impl AttentionBackend for MyBackend {}` is all another backend needs; a backend
/// overrides one only with a kernel that gives the same results (tested against the reference).
pub trait AttentionBackend: Backend {
    /// Same contract and shapes as [`crate::attention`].
    fn attention(
        q: Tensor<Self, 4>,
        k: Tensor<Self, 4>,
        v: Tensor<Self, 4>,
        visibility: &Visibility,
        extra_mask: Option<&Tensor<Self, 2, Bool>>,
        scale: f32,
    ) -> Result<Tensor<Self, 4>, AttnError> {
        reference::attention(q, k, v, visibility, extra_mask, scale)
    }

    /// Same contract and shapes as [`crate::paged_attention`].
    fn paged_attention(
        q: Tensor<Self, 4>,
        k_pool: &Tensor<Self, 3>,
        v_pool: &Tensor<Self, 3>,
        batch: &PagedBatch,
        scale: f32,
    ) -> Result<Tensor<Self, 2>, AttnError> {
        paged::paged_attention(q, k_pool, v_pool, batch, scale)
    }

    /// Writes `values` `[kv_heads, n, head_dim]` into a pool layer `pool` `[kv_heads, slots,
    /// head_dim]` at its slots `slots` (distinct), in place where the pool is not shared. Here
    /// one slice-assign per run of consecutive slots ([`paged::pool_write_runs`]).
    fn pool_scatter(
        pool: Tensor<Self, 3>,
        slots: &[usize],
        values: Tensor<Self, 3>,
    ) -> Tensor<Self, 3> {
        paged::pool_write_runs(pool, slots, values)
    }

    /// A layer's K and V written at the same slots: [`AttentionBackend::pool_scatter`] of each,
    /// which a backend may do in one launch.
    fn pool_scatter_pair(
        [k_pool, v_pool]: [Tensor<Self, 3>; 2],
        slots: &[usize],
        [k, v]: [Tensor<Self, 3>; 2],
    ) -> [Tensor<Self, 3>; 2] {
        [
            Self::pool_scatter(k_pool, slots, k),
            Self::pool_scatter(v_pool, slots, v),
        ]
    }
}

// burn-ndarray's kernels are in `cpu`, every CubeCL backend's (wgpu, CUDA) in `cube`.
