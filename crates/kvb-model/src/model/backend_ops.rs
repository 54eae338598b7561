//! Operations the model needs that a backend may run faster than burn's generic ops.
//!
//! [`ModelBackend`]'s default methods are plain burn tensor ops, so any backend works with a one-line
//! `impl ModelBackend for MyBackend {}`; a backend overrides a method only where it has a measured
//! reason to. burn-ndarray's overrides are in `cpu_ops.rs`, the CubeCL backends' in `cube_ops/`.

use crate::config::Activation;
use crate::packed::PackedMatrix;
use crate::rope::RopeTables;
use burn::tensor::backend::Backend;
use burn::tensor::{Int, Tensor, TensorData};
use kvb_attn::AttentionBackend;

/// A burn backend the model can run on (attention included, see [`AttentionBackend`]).
pub trait ModelBackend: AttentionBackend {
    /// Runs a whole forward pass `f` where the backend's parallel ops are cheapest to start.
    /// Here on the calling thread: a device backend only queues work from it.
    fn on_compute_threads<R: Send>(f: impl FnOnce() -> R + Send) -> R {
        f()
    }

    /// Gives the pages of freed host tensors back to the system after a pass over many rows.
    /// Here nothing: a device backend's tensors are not in the host's heap.
    fn release_freed_memory() {}

    /// Whether a decode step should choose its tokens on the device
    /// ([`crate::generate::top_candidates`]) rather than read the logits: where reads cross a
    /// bus and are each a wait. Here (the CPU's memory) no.
    fn samples_on_device() -> bool {
        false
    }

    /// The index of each row's largest value, `[rows, 1]` (the lowest index wins a tie): a
    /// greedy step's tokens, chosen where [`ModelBackend::samples_on_device`]. Here burn's.
    fn argmax_rows(logits: Tensor<Self, 2>) -> Tensor<Self, 2, Int> {
        kvb_attn::host_work::launched(1);
        logits.argmax(1)
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
