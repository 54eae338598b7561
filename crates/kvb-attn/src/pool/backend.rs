//! How a backend holds the K/V pool's layers: the memory [`crate::KvPool`] asks for, and the
//! moves it makes in it. Attention ([`crate::AttentionBackend`]) reads what this holds.

use super::{pool_read, write_host_layer, HostKv, PoolLayer};
use crate::paged;
use crate::FloatDtype;
use burn::tensor::backend::Backend;
use burn::tensor::Tensor;

/// A burn backend that can hold a K/V pool: each layer's K and V as `[kv_heads, slots, head_dim]`
/// in a precision this backend accepts. The default methods are burn tensor ops over a plain
/// float tensor (`impl PoolBackend for MyBackend {}` is enough); burn-ndarray holds f16 layers
/// as well and moves values in place (`cpu/layer.rs` writes its layout down), the CubeCL backends
/// write in one launch.
pub trait PoolBackend: Backend {
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

    /// A layer's K and V written at the same slots: [`PoolBackend::pool_scatter`] of each,
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

    /// Whether a K/V pool can hold values in `precision` here. Here the backend's own float
    /// type only ([`FloatDtype::native`]): the pool is a plain tensor of it.
    fn holds_pool_precision(precision: FloatDtype) -> bool {
        precision == FloatDtype::native::<Self>()
    }

    /// A zeroed K/V pool layer `[kv_heads, slots, head_dim]` holding `precision` (one that
    /// [`PoolBackend::holds_pool_precision`] accepts; the pool checks).
    fn pool_zeros(
        shape: [usize; 3],
        _precision: FloatDtype,
        device: &burn::tensor::Device<Self>,
    ) -> Tensor<Self, 3> {
        Tensor::zeros(shape, crate::float_on::<Self>(device))
    }

    /// Whether a pool should be made at its whole budget of blocks at once instead of grown:
    /// where [`PoolBackend::pool_zeros`] costs only the memory later written, a pool made whole
    /// never copies its layers, nor holds old and new at once while it grows. Here no: a device
    /// buffer is backed when it is allocated.
    fn pool_reserves_budget() -> bool {
        false
    }

    /// The pool layer `pool` grown to `slots` slots, keeping its values (new slots zeroed).
    fn pool_grow(pool: Tensor<Self, 3>, slots: usize, precision: FloatDtype) -> Tensor<Self, 3> {
        let [h, old, d] = pool.dims();
        let fresh = Self::pool_zeros([h, slots, d], precision, &pool.device());
        if old == 0 {
            fresh
        } else {
            fresh.slice_assign([0..h, 0..old, 0..d], pool)
        }
    }

    /// The values at pool slots `slots` as f32, `[kv_heads, n, head_dim]`, on the device.
    fn pool_gather(pool: &Tensor<Self, 3>, slots: &[usize]) -> Tensor<Self, 3> {
        pool_read(pool, slots)
    }

    /// Backs pool slots `slots` (free ones: their values are left unspecified) with memory now,
    /// so that the first sequence to write them does not pay for it. Here nothing: a device
    /// buffer is backed when it is allocated.
    fn pool_prefault(pool: Tensor<Self, 3>, _slots: std::ops::Range<usize>) -> Tensor<Self, 3> {
        pool
    }

    /// As [`PoolBackend::pool_scatter`], from host values: tokens `src.first..src.first +
    /// slots.len()` of every head of `src` (`[kv_heads, src.tokens, head_dim]`).
    fn pool_write_host(pool: Tensor<Self, 3>, slots: &[usize], src: HostKv) -> Tensor<Self, 3> {
        let [h, _, d] = pool.dims();
        let values = src.tensor(h, d, slots.len(), &pool.device());
        Self::pool_scatter(pool, slots, values)
    }

    /// Copies the values at pool slots `from` onto pool slots `to` (as many, distinct, none in
    /// both): a block's copy-on-write. Here by a gather and a write, which stays on the device.
    fn pool_copy(pool: Tensor<Self, 3>, from: &[usize], to: &[usize]) -> Tensor<Self, 3> {
        let values = Self::pool_gather(&pool, from);
        Self::pool_scatter(pool, to, values)
    }

    /// [`PoolBackend::pool_write_host`] into every layer at once: `layers[l]` is layer
    /// `l`'s (K, V) pool and `srcs[l]` its host (K, V). Here one layer after another; a backend
    /// may write the layers in parallel.
    fn pool_write_host_layers(
        layers: Vec<PoolLayer<Self>>,
        slots: &[usize],
        srcs: &[(HostKv, HostKv)],
    ) -> Vec<PoolLayer<Self>> {
        layers
            .into_iter()
            .zip(srcs)
            .map(|(layer, src)| write_host_layer::<Self>(layer, slots, src))
            .collect()
    }

    /// The values at pool slots `slots`, `[kv_heads, n, head_dim]`, on the host.
    fn pool_read_host(pool: &Tensor<Self, 3>, slots: &[usize]) -> Vec<f32> {
        crate::to_host_f32(Self::pool_gather(pool, slots))
    }
}
