//! The attention a backend runs: the reference ops unless the backend has a faster kernel.

use crate::paged::{self, PagedBatch};
use crate::pool::PoolBackend;
use crate::{reference, AttnError, Visibility};
use burn::tensor::{Bool, Tensor};

/// A burn backend that can run kvb's attention, over the K/V pool its [`PoolBackend`] holds. The
/// default methods are the references in burn tensor ops, so `impl AttentionBackend for MyBackend
/// {}` (and `impl PoolBackend for MyBackend {}`) is all another backend needs; a backend overrides
/// one only with a kernel that gives the same results (tested against the reference).
pub trait AttentionBackend: PoolBackend {
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
}

// burn-ndarray's kernels are in `cpu`, every CubeCL backend's (wgpu, CUDA) in `cube`.
