//! Operations the model needs that a backend may run faster than burn's generic ops.
//!
//! [`ModelBackend`]'s default methods are plain burn tensor ops, so any backend works with a one-line
//! `impl ModelBackend for MyBackend {}`; a backend overrides a method only where it has a measured
//! reason to. burn-ndarray's overrides are in `cpu_ops.rs`, the CubeCL backends' in `cube_ops/`.

use crate::config::Activation;
use crate::float_dtype::FloatDtype;
use crate::packed::PackedMatrix;
use crate::rope::RopeTables;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
pub use kvb_attn::paged::pool_write_runs as pool_write_reference;
pub(crate) use kvb_attn::paged::runs;
use kvb_attn::AttentionBackend;

/// A burn backend the model can run on (attention included, see [`AttentionBackend`]).
pub trait ModelBackend: AttentionBackend {
    /// Runs a whole forward pass `f` where the backend's parallel ops are cheapest to start.
    /// Here on the calling thread: a device backend only queues work from it.
    fn on_compute_threads<R: Send>(f: impl FnOnce() -> R + Send) -> R {
        f()
    }

    /// Whether a decode step should choose its tokens on the device
    /// ([`crate::generate::top_candidates`]) rather than read the logits: where reads cross a
    /// bus and are each a wait. Here (the CPU's memory) no.
    fn samples_on_device() -> bool {
        false
    }

    /// Whether dense projection weights are held `[out, in]` (PyTorch's layout) and multiplied
    /// as a transposed view ([`ModelBackend::linear_matmul`] then gets a `[k, n]` tensor with
    /// strides `[1, k]`, or `[1, pitch]` where the device pads rows), rather than `[in, out]`
    /// contiguous. Here no: burn-ndarray copies a
    /// non-contiguous right-hand side on every product.
    fn weights_out_in() -> bool {
        false
    }

    /// `x`: `[m, k]` times `w`: `[k, n]` (contiguous, or the transposed view of an `[n, k]`
    /// matrix where [`ModelBackend::weights_out_in`]) -> `[m, n]`.
    fn linear_matmul(x: Tensor<Self, 2>, w: Tensor<Self, 2>) -> Tensor<Self, 2> {
        x.matmul(w)
    }

    /// Whether [`ModelBackend::packed_linear`] runs on packed weights as they are; where it does
    /// not, the loader expands packed weights to f32 (the same values) at load.
    fn runs_packed_weights() -> bool {
        false
    }

    /// `x`: `[m, k]` times a packed weight `[k, n]` -> `[m, n]`. Here by expanding the weight
    /// (correct everywhere, and as slow and large as f32 weights).
    fn packed_linear(x: Tensor<Self, 2>, w: &PackedMatrix) -> Tensor<Self, 2> {
        packed_linear_reference(x, w)
    }

    /// `x`: `[m, k]` times a weight laid out for 8-bit activations -> `[m, n]`, `x` quantized
    /// to 8 bits per value ([`super::int8`]). Here through host memory: the kernel is a CPU
    /// kernel.
    #[cfg(feature = "ndarray")]
    fn int8_linear(x: Tensor<Self, 2>, w: &super::int8::IntDotMatrix) -> Tensor<Self, 2> {
        let [m, _] = x.dims();
        let device = x.device();
        let y = super::int8::matmul(&crate::to_host_f32(x), m, w);
        Tensor::from_data(
            TensorData::new(y, [m, w.n()]),
            kvb_attn::float_on::<Self>(&device),
        )
    }

    /// Splits fused projections `qkv` `[n, (hq + 2 hkv) d]` into q `[1, hq, n, d]` and k, v
    /// `[1, hkv, n, d]`, rotating q and k with `rope`.
    fn split_heads(
        qkv: Tensor<Self, 2>,
        (hq, hkv, d): (usize, usize, usize),
        rope: &RopeTables<Self>,
    ) -> [Tensor<Self, 4>; 3] {
        split_heads_reference(qkv, (hq, hkv, d), rope)
    }

    /// RMSNorm: `x` `[n, h]` divided by its root mean square, times `weight` `[1, h]`.
    fn rms_norm(x: Tensor<Self, 2>, weight: Tensor<Self, 2>, eps: f64) -> Tensor<Self, 2> {
        rms_norm_reference(x, weight, eps)
    }

    /// The residual add and the next RMSNorm: `x + delta` (`[n, h]` each) and its RMSNorm with
    /// `weight` `[1, h]`, as [`ModelBackend::rms_norm`] of the sum.
    fn add_rms_norm(
        x: Tensor<Self, 2>,
        delta: Tensor<Self, 2>,
        weight: Tensor<Self, 2>,
        eps: f64,
    ) -> [Tensor<Self, 2>; 2] {
        add_then(x, delta, |sum| Self::rms_norm(sum, weight, eps))
    }

    /// The gated MLP's middle: `gu` `[n, 2 i]` holds gate then up; returns `act(gate) * up` `[n, i]`.
    fn gated_activation(gu: Tensor<Self, 2>, act: Activation) -> Tensor<Self, 2> {
        gated_activation_reference(gu, act)
    }

    /// Whether a K/V pool can hold values in `precision` here. Here the backend's own float
    /// type only ([`FloatDtype::native`]): the pool is a plain tensor of it.
    fn holds_pool_precision(precision: FloatDtype) -> bool {
        precision == FloatDtype::native::<Self>()
    }

    /// A zeroed K/V pool layer `[kv_heads, slots, head_dim]` holding `precision` (one that
    /// [`ModelBackend::holds_pool_precision`] accepts; the pool checks).
    fn pool_zeros(
        shape: [usize; 3],
        _precision: FloatDtype,
        device: &burn::tensor::Device<Self>,
    ) -> Tensor<Self, 3> {
        Tensor::zeros(shape, kvb_attn::float_on::<Self>(device))
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

    /// Writes `values` `[kv_heads, n, head_dim]` into `pool` `[kv_heads, slots, head_dim]` at the
    /// given `n` pool slots (distinct). A backend writes in place where the pool is not shared.
    /// Here [`AttentionBackend::pool_scatter`]: one launch per call on the CubeCL backends.
    fn pool_write(
        pool: Tensor<Self, 3>,
        slots: &[usize],
        values: Tensor<Self, 3>,
    ) -> Tensor<Self, 3> {
        <Self as AttentionBackend>::pool_scatter(pool, slots, values)
    }

    /// A layer's K and V pools written at the same slots: [`ModelBackend::pool_write`] of each.
    fn pool_write_pair(
        [k_pool, v_pool]: [Tensor<Self, 3>; 2],
        slots: &[usize],
        [k, v]: [Tensor<Self, 3>; 2],
    ) -> [Tensor<Self, 3>; 2] {
        [
            Self::pool_write(k_pool, slots, k),
            Self::pool_write(v_pool, slots, v),
        ]
    }

    /// As [`ModelBackend::pool_write`], from host values: tokens `src.first..src.first +
    /// slots.len()` of every head of `src` (`[kv_heads, src.tokens, head_dim]`).
    fn pool_write_host(pool: Tensor<Self, 3>, slots: &[usize], src: HostKv) -> Tensor<Self, 3> {
        let [h, _, d] = pool.dims();
        let values = src.tensor(h, d, slots.len(), &pool.device());
        Self::pool_write(pool, slots, values)
    }

    /// Copies the values at pool slots `from` onto pool slots `to` (as many, distinct, none in
    /// both): a block's copy-on-write. Here by a gather and a write, which stays on the device.
    fn pool_copy(pool: Tensor<Self, 3>, from: &[usize], to: &[usize]) -> Tensor<Self, 3> {
        let values = Self::pool_gather(&pool, from);
        Self::pool_write(pool, to, values)
    }

    /// [`ModelBackend::pool_write_host`] into every layer at once: `layers[l]` is layer `l`'s
    /// (K, V) pool and `srcs[l]` its host (K, V). Here one layer after another; a backend may
    /// write the layers in parallel.
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

/// One layer of a K/V pool: its K and its V, each `[kv_heads, slots, head_dim]`.
pub type PoolLayer<B> = (Tensor<B, 3>, Tensor<B, 3>);

/// [`ModelBackend::pool_write_host`] of one layer's K and V.
pub(crate) fn write_host_layer<B: ModelBackend>(
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
            kvb_attn::float_on::<B>(device),
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

/// [`ModelBackend::split_heads`] in burn tensor ops.
pub fn split_heads_reference<B: burn::tensor::backend::Backend>(
    qkv: Tensor<B, 2>,
    (hq, hkv, d): (usize, usize, usize),
    rope: &RopeTables<B>,
) -> [Tensor<B, 4>; 3] {
    let n = qkv.dims()[0];
    let heads = |from: usize, count: usize| {
        qkv.clone()
            .slice([0..n, from * d..(from + count) * d])
            .reshape([n, count, d])
            .swap_dims(0, 1)
            .unsqueeze::<4>()
    };
    [
        rope.apply(heads(0, hq)),
        rope.apply(heads(hq, hkv)),
        heads(hq + hkv, hkv),
    ]
}

/// [`ModelBackend::packed_linear`] by expanding the weight to f32 first.
pub fn packed_linear_reference<B: ModelBackend>(x: Tensor<B, 2>, w: &PackedMatrix) -> Tensor<B, 2> {
    let dense = Tensor::from_data(
        TensorData::new(w.to_dense(), [w.k(), w.n()]),
        (&x.device(), x.dtype()),
    );
    B::linear_matmul(x, dense)
}

/// [`ModelBackend::rms_norm`] in burn tensor ops.
pub fn rms_norm_reference<B: burn::tensor::backend::Backend>(
    x: Tensor<B, 2>,
    weight: Tensor<B, 2>,
    eps: f64,
) -> Tensor<B, 2> {
    let mean_sq = (x.clone() * x.clone()).mean_dim(1);
    let inv = (mean_sq + eps).sqrt().recip();
    x * inv * weight
}

/// `x + delta` and `norm` of it: [`ModelBackend::add_rms_norm`] as two steps.
pub(crate) fn add_then<B: Backend>(
    x: Tensor<B, 2>,
    delta: Tensor<B, 2>,
    norm: impl FnOnce(Tensor<B, 2>) -> Tensor<B, 2>,
) -> [Tensor<B, 2>; 2] {
    let sum = x + delta;
    [sum.clone(), norm(sum)]
}

/// [`ModelBackend::gated_activation`] in burn tensor ops.
pub fn gated_activation_reference<B: burn::tensor::backend::Backend>(
    gu: Tensor<B, 2>,
    act: Activation,
) -> Tensor<B, 2> {
    let [n, two_i] = gu.dims();
    let i = two_i / 2;
    let gate = super::layers::activate(act, gu.clone().slice([0..n, 0..i]));
    gate * gu.slice([0..n, i..two_i])
}
