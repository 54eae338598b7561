//! The CubeCL backends' overrides of [`ModelBackend`] (wgpu, CUDA): RMSNorm (with the residual add
//! before it), the head split with RoPE, and the gated activation, each one kernel launch instead
//! of a chain of burn ops, a decode step's projections in a kernel that launches as cheaply, and
//! a greedy step's argmax split across the device.
//!
//! With burn's ops a decode step on a GPU was bound by the host: each burn op is a launch (a
//! round of host work: binding, caching, queueing), and burn 0.21 without its `fusion` feature
//! fuses none of them. With these kernels an H200's step is bound by the device, and by its
//! slowest kernels (`bench/results/2026-11-27-gpu-step-time`). RMSNorm was seven launches (square, mean, add, sqrt, recip, two
//! multiplies), the split with RoPE about twelve (contiguous copies of each head group, the
//! half swap's concatenation, two multiplies and an add for q and for k), the gated activation
//! three or four: about 30 launches per layer, 900 per forward pass of a 30-layer model, where
//! these kernels take 4 per layer. The arithmetic is the reference's, per element, in f32; sums
//! are taken in another order (a tree in shared memory), so values agree within rounding, not
//! bit for bit (`tests/cube_ops.rs` bounds the difference).
//!
//! `KVB_OPS=reference` in the environment (read once per process) runs the reference ops
//! instead, to compare, or to work around a driver that miscompiles a kernel.

mod argmax;
mod gated;
mod projection;
mod rms_norm;
mod rope;

pub use projection::MAX_ROWS as PROJECTION_KERNEL_ROWS;

use super::backend_ops::{self, ModelBackend};
use crate::config::Activation;
use crate::rope::RopeTables;
use burn::tensor::{Int, Tensor, TensorPrimitive};
use burn_cubecl::tensor::CubeTensor;
use burn_cubecl::{BoolElement, CubeBackend, CubeRuntime, FloatElement, IntElement};

/// Cubes along one axis of a launch at most (WebGPU's limit): RMSNorm and the head split take a
/// cube per token, so a longer forward pass stays on the reference ops.
const MAX_CUBES_PER_AXIS: usize = 65_535;

/// The kernels run unless `KVB_OPS=reference` asks for burn's ops.
fn kernels_chosen() -> bool {
    static CHOSEN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *CHOSEN.get_or_init(|| !std::env::var("KVB_OPS").is_ok_and(|v| v == "reference"))
}

/// The CubeCL tensor under a burn float tensor.
fn cube<R, F, I, BT, const D: usize>(t: Tensor<CubeBackend<R, F, I, BT>, D>) -> CubeTensor<R>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    t.into_primitive().tensor()
}

/// A burn float tensor over a CubeCL tensor.
fn burn<R, F, I, BT, const D: usize>(t: CubeTensor<R>) -> Tensor<CubeBackend<R, F, I, BT>, D>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    Tensor::from_primitive(TensorPrimitive::Float(t))
}

/// Units one cube may hold on this tensor's device.
fn max_units<R: CubeRuntime>(t: &CubeTensor<R>) -> usize {
    t.client.properties().hardware.max_cube_dim.0 as usize
}

impl<R, F, I, BT> ModelBackend for CubeBackend<R, F, I, BT>
where
    R: CubeRuntime,
    F: FloatElement,
    I: IntElement,
    BT: BoolElement,
{
    fn rms_norm(x: Tensor<Self, 2>, weight: Tensor<Self, 2>, eps: f64) -> Tensor<Self, 2> {
        let [n, h] = x.dims();
        if !kernels_chosen()
            || n == 0
            || n > MAX_CUBES_PER_AXIS
            || h == 0
            || weight.dims() != [1, h]
        {
            return backend_ops::rms_norm_reference(x, weight, eps);
        }
        burn(rms_norm::launch(cube(x), cube(weight), eps as f32))
    }

    fn samples_on_device() -> bool {
        true
    }

    fn argmax_rows(logits: Tensor<Self, 2>) -> Tensor<Self, 2, Int> {
        let c = cube(logits.clone());
        if !kernels_chosen() || !argmax::chosen(R::name(&c.client)) || !argmax::fits(&c) {
            kvb_attn::host_work::launched(1);
            return logits.argmax(1);
        }
        kvb_attn::host_work::launched(2);
        Tensor::from_primitive(argmax::launch(c, I::dtype()))
    }

    /// A decode step's products (up to [`projection::MAX_ROWS`] rows) in kvb's own kernel;
    /// longer inputs (prefill) in burn's autotuned ones, whose host work per call is amortised.
    fn linear_matmul(x: Tensor<Self, 2>, w: Tensor<Self, 2>) -> Tensor<Self, 2> {
        if kernels_chosen() {
            // The weight as held, `[out, in]`.
            let (xc, wc) = (cube(x.clone()), cube(w.clone().transpose()));
            if projection::fits(&xc, &wc) {
                return burn(projection::launch(xc, wc));
            }
        }
        x.matmul(w)
    }

    /// burn-cubecl's matrix-vector kernels (a decode step's products) are written for a
    /// column-major right-hand side; with `[in, out]` rows the autotuner has only slow ones.
    /// `KVB_GPU_WEIGHTS=in-out` holds them `[in, out]` as before, to compare.
    fn weights_out_in() -> bool {
        static OUT_IN: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
        *OUT_IN.get_or_init(|| !std::env::var("KVB_GPU_WEIGHTS").is_ok_and(|v| v == "in-out"))
    }

    fn add_rms_norm(
        x: Tensor<Self, 2>,
        delta: Tensor<Self, 2>,
        weight: Tensor<Self, 2>,
        eps: f64,
    ) -> [Tensor<Self, 2>; 2] {
        let [n, h] = x.dims();
        if !kernels_chosen()
            || n == 0
            || n > MAX_CUBES_PER_AXIS
            || h == 0
            || delta.dims() != [n, h]
            || weight.dims() != [1, h]
        {
            return backend_ops::add_then(x, delta, |sum| {
                backend_ops::rms_norm_reference(sum, weight, eps)
            });
        }
        rms_norm::launch_residual(cube(x), cube(delta), cube(weight), eps as f32).map(burn)
    }

    fn split_heads(
        qkv: Tensor<Self, 2>,
        (hq, hkv, d): (usize, usize, usize),
        rope: &RopeTables<Self>,
    ) -> [Tensor<Self, 4>; 3] {
        let [n, width] = qkv.dims();
        let fits = width == (hq + 2 * hkv) * d
            && d % 2 == 0
            && rope.cos().dims() == [1, 1, n, d]
            && rope.signed_sin().dims() == [1, 1, n, d];
        let qkv = cube(qkv);
        if !kernels_chosen()
            || !fits
            || n == 0
            || n > MAX_CUBES_PER_AXIS
            || d == 0
            || d > max_units(&qkv)
        {
            return backend_ops::split_heads_reference(burn(qkv), (hq, hkv, d), rope);
        }
        let tables = [cube(rope.cos().clone()), cube(rope.signed_sin().clone())];
        rope::launch(qkv, tables, (hq, hkv, d)).map(burn)
    }

    fn gated_activation(gu: Tensor<Self, 2>, act: Activation) -> Tensor<Self, 2> {
        let [n, two_i] = gu.dims();
        let Some(kind) = gated::Kind::of(act) else {
            return backend_ops::gated_activation_reference(gu, act);
        };
        if !kernels_chosen() || n == 0 || two_i == 0 || two_i % 2 == 1 {
            return backend_ops::gated_activation_reference(gu, act);
        }
        burn(gated::launch(cube(gu), kind))
    }
}
