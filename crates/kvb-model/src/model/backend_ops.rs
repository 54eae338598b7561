//! Operations the model needs that a backend may run faster than burn's generic ops.
//!
//! [`ModelBackend`]'s default methods are plain burn tensor ops, so any backend works with a one-line
//! `impl ModelBackend for MyBackend {}`; a backend overrides a method only where it has a measured
//! reason to.

use crate::config::Activation;
use crate::rope::RopeTables;
use burn::tensor::Tensor;
use kvb_attn::AttentionBackend;

/// A burn backend the model can run on (attention included, see [`AttentionBackend`]).
pub trait ModelBackend: AttentionBackend {
    /// `x`: `[m, k]` times `w`: `[k, n]` (contiguous) -> `[m, n]`.
    fn linear_matmul(x: Tensor<Self, 2>, w: Tensor<Self, 2>) -> Tensor<Self, 2> {
        x.matmul(w)
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

#[cfg(feature = "wgpu")]
impl ModelBackend for crate::backends::Wgpu {}

#[cfg(feature = "cuda")]
impl ModelBackend for crate::backends::Cuda {}

#[cfg(feature = "ndarray")]
mod cpu {
    use super::ModelBackend;
    use crate::config::Activation;
    use crate::rope::RopeTables;
    use burn::tensor::{Tensor, TensorData, TensorPrimitive};
    use burn_ndarray::{NdArray, NdArrayTensor};
    use kvb_attn::fastmath::fast_exp;
    use rayon::prelude::*;

    /// Up to this many rows, a product runs through [`super::super::few_rows`], which streams the
    /// weight once instead of packing it (burn-ndarray sends every product through
    /// matrixmultiply, which packs the whole `[k, n]` weight on each call: the LM head took 107
    /// ms per decode step). Above it, packing pays for itself.
    const FEW_ROWS_MAX: usize = 32;

    fn f32_slice(t: &NdArrayTensor) -> Option<(Vec<usize>, &[f32])> {
        match t {
            NdArrayTensor::F32(storage) => {
                let shape = storage.shape().to_vec();
                // `view()` borrows the storage; a standard-layout view is one contiguous slice.
                let slice = storage.view().to_slice()?;
                Some((shape, slice))
            }
            _ => None,
        }
    }

    /// Rows per parallel task for row-wise ops (RMSNorm, SwiGLU): enough work to amortise rayon.
    const ROWS_PER_TASK: usize = 16;

    /// The primitive of a 4-d tensor.
    fn rows_of4(t: &Tensor<NdArray<f32>, 4>) -> Option<NdArrayTensor> {
        match t.clone().into_primitive() {
            TensorPrimitive::Float(p) => Some(p),
            _ => None,
        }
    }

    /// The contiguous f32 values of a 2-d tensor, or `None` (then the generic path runs).
    fn rows_of(t: &Tensor<NdArray<f32>, 2>) -> Option<NdArrayTensor> {
        match t.clone().into_primitive() {
            TensorPrimitive::Float(p) => Some(p),
            _ => None,
        }
    }

    impl ModelBackend for NdArray<f32> {
        /// One pass per row instead of six tensor ops (square, mean, add, sqrt, recip, two muls),
        /// each allocating an `[n, h]` tensor. Sums in f32, as transformers does.
        fn rms_norm(x: Tensor<Self, 2>, weight: Tensor<Self, 2>, eps: f64) -> Tensor<Self, 2> {
            let [n, h] = x.dims();
            let (Some(xp), Some(wp)) = (rows_of(&x), rows_of(&weight)) else {
                return super::rms_norm_reference(x, weight, eps);
            };
            let (Some((xs, xv)), Some((ws, wv))) = (f32_slice(&xp), f32_slice(&wp)) else {
                return super::rms_norm_reference(x, weight, eps);
            };
            if xs != [n, h] || ws != [1, h] {
                return super::rms_norm_reference(x, weight, eps);
            }
            let mut out = vec![0f32; n * h];
            out.par_chunks_mut(h * ROWS_PER_TASK)
                .zip(xv.par_chunks(h * ROWS_PER_TASK))
                .for_each(|(o, xr)| {
                    for (orow, xrow) in o.chunks_mut(h).zip(xr.chunks(h)) {
                        let ms = xrow.iter().map(|v| v * v).sum::<f32>() / h as f32;
                        let inv = 1.0 / (ms + eps as f32).sqrt();
                        for ((o, &v), &w) in orow.iter_mut().zip(xrow).zip(wv) {
                            *o = v * inv * w;
                        }
                    }
                });
            Tensor::from_data(TensorData::new(out, [n, h]), &x.device())
        }

        /// Head split, layout change and RoPE in one pass over `qkv`, instead of a slice, a
        /// reshape, a transpose copy, two half slices, a concatenation and three elementwise ops
        /// per q and k.
        fn split_heads(
            qkv: Tensor<Self, 2>,
            (hq, hkv, d): (usize, usize, usize),
            rope: &RopeTables<Self>,
        ) -> [Tensor<Self, 4>; 3] {
            let n = qkv.dims()[0];
            let width = (hq + 2 * hkv) * d;
            let fallback = |qkv| super::split_heads_reference(qkv, (hq, hkv, d), rope);
            let (Some(p), Some(cp), Some(sp)) = (
                rows_of(&qkv),
                rows_of4(rope.cos()),
                rows_of4(rope.signed_sin()),
            ) else {
                return fallback(qkv);
            };
            let (Some((shape, x)), Some((_, cos)), Some((_, sin))) =
                (f32_slice(&p), f32_slice(&cp), f32_slice(&sp))
            else {
                return fallback(qkv);
            };
            if shape != [n, width] || cos.len() != n * d || sin.len() != n * d || d % 2 != 0 {
                return fallback(qkv);
            }
            let half = d / 2;
            let total = hq + 2 * hkv;
            // Output head-major: head h holds [n, d]; heads 0..hq are q, then k, then v.
            let mut out = vec![0f32; total * n * d];
            out.par_chunks_mut(n * d).enumerate().for_each(|(h, head)| {
                let rotate = h < hq + hkv;
                for t in 0..n {
                    let src = &x[t * width + h * d..t * width + (h + 1) * d];
                    let dst = &mut head[t * d..(t + 1) * d];
                    if rotate {
                        let (c, s) = (&cos[t * d..(t + 1) * d], &sin[t * d..(t + 1) * d]);
                        for i in 0..d {
                            let partner = if i < half {
                                src[i + half]
                            } else {
                                src[i - half]
                            };
                            dst[i] = src[i] * c[i] + partner * s[i];
                        }
                    } else {
                        dst.copy_from_slice(src);
                    }
                }
            });
            let device = qkv.device();
            let part = |from: usize, count: usize| {
                let v = out[from * n * d..(from + count) * n * d].to_vec();
                Tensor::<Self, 4>::from_data(TensorData::new(v, [1, count, n, d]), &device)
            };
            [part(0, hq), part(hq, hkv), part(hq + hkv, hkv)]
        }

        /// SwiGLU in one pass: burn's sigmoid takes eight elementwise passes with two
        /// transcendentals (`exp(-log(exp(-x) + 1))`); this is `g / (1 + e^-g) * u` per element.
        fn gated_activation(gu: Tensor<Self, 2>, act: Activation) -> Tensor<Self, 2> {
            let [n, two_i] = gu.dims();
            let i = two_i / 2;
            let generic = |gu| super::gated_activation_reference(gu, act);
            if act != Activation::Silu {
                return generic(gu);
            }
            let Some(p) = rows_of(&gu) else {
                return generic(gu);
            };
            let Some((shape, v)) = f32_slice(&p) else {
                return generic(gu);
            };
            if shape != [n, two_i] {
                return generic(gu);
            }
            let mut out = vec![0f32; n * i];
            out.par_chunks_mut(i * ROWS_PER_TASK)
                .zip(v.par_chunks(two_i * ROWS_PER_TASK))
                .for_each(|(o, rows)| {
                    for (orow, row) in o.chunks_mut(i).zip(rows.chunks(two_i)) {
                        let (gate, up) = row.split_at(i);
                        for ((o, &g), &u) in orow.iter_mut().zip(gate).zip(up) {
                            *o = g / (1.0 + fast_exp(-g)) * u;
                        }
                    }
                });
            Tensor::from_data(TensorData::new(out, [n, i]), &gu.device())
        }

        fn linear_matmul(x: Tensor<Self, 2>, w: Tensor<Self, 2>) -> Tensor<Self, 2> {
            let [m, k] = x.dims();
            let [_, n] = w.dims();
            if m > FEW_ROWS_MAX {
                return x.matmul(w);
            }
            let device = x.device();
            let (xp, wp) = match (x.clone().into_primitive(), w.clone().into_primitive()) {
                (TensorPrimitive::Float(a), TensorPrimitive::Float(b)) => (a, b),
                _ => return x.matmul(w),
            };
            match (f32_slice(&xp), f32_slice(&wp)) {
                (Some((xs, xv)), Some((ws, wv))) if xs == [m, k] && ws == [k, n] => {
                    let y = super::super::few_rows::matmul(xv, wv, m, k, n);
                    Tensor::from_data(TensorData::new(y, [m, n]), &device)
                }
                // Not contiguous f32: the generic path is always correct.
                _ => x.matmul(w),
            }
        }
    }
}
