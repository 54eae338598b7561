//! burn-ndarray's overrides of [`ModelBackend`]: fused row passes and the few-row product (its
//! K/V pool in place is kvb-attn's).

use super::backend_ops::{self, ModelBackend};
use crate::config::Activation;
use crate::packed::PackedMatrix;
use crate::rope::RopeTables;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};
use burn_ndarray::{NdArray, NdArrayTensor};
use kvb_attn::fastmath::fast_exp;
use kvb_gemm::{few_rows, packed_rows};
use rayon::prelude::*;

/// Up to this many rows, a product runs through [`few_rows`], which streams the
/// weight once instead of packing it (packing the whole `[k, n]` weight costs as much as the
/// product itself at these sizes: the LM head took 107 ms per decode step through sgemm). Above
/// it, [`kvb_gemm`] packs and pays for it.
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
    /// On a worker of rayon's pool: a parallel op started from another thread (the engine's
    /// scheduler) hands its work over and sleeps until it is done, two thread wake-ups that a
    /// decode step paid ~200 times; started from a worker it is a cheap fork-join. SmolLM2 Q4_1
    /// decode on 2 cores, 300 tokens: 59.7 -> 74 tokens/s (1 thread: 36 -> 42).
    fn on_compute_threads<R: Send>(f: impl FnOnce() -> R + Send) -> R {
        // The pass's host-work counts follow it back to the calling thread.
        let (r, work) = rayon::scope(|_| kvb_attn::host_work::counted(f));
        kvb_attn::host_work::add(work);
        r
    }

    /// A 512-row pass of a 1B model frees ~150 MB of tensors a layer; glibc keeps such pages in
    /// its arenas, scattered by fragmentation, so peak RSS grew with the prompt. Trimming once a
    /// pass costs about what re-faulting them does (`bench/results/2026-11-27-peak-rss/`).
    fn release_freed_memory() {
        crate::release_freed_host_memory();
    }

    /// One pass per row instead of six tensor ops (square, mean, add, sqrt, recip, two muls),
    /// each allocating an `[n, h]` tensor. Sums in f32, as transformers does.
    fn rms_norm(x: Tensor<Self, 2>, weight: Tensor<Self, 2>, eps: f64) -> Tensor<Self, 2> {
        let [n, h] = x.dims();
        let (Some(xp), Some(wp)) = (rows_of(&x), rows_of(&weight)) else {
            return backend_ops::rms_norm_reference(x, weight, eps);
        };
        let (Some((xs, xv)), Some((ws, wv))) = (f32_slice(&xp), f32_slice(&wp)) else {
            return backend_ops::rms_norm_reference(x, weight, eps);
        };
        if xs != [n, h] || ws != [1, h] {
            return backend_ops::rms_norm_reference(x, weight, eps);
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
        let fallback = |qkv| backend_ops::split_heads_reference(qkv, (hq, hkv, d), rope);
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
        let generic = |gu| backend_ops::gated_activation_reference(gu, act);
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
        let device = x.device();
        let (xp, wp) = match (x.clone().into_primitive(), w.clone().into_primitive()) {
            (TensorPrimitive::Float(a), TensorPrimitive::Float(b)) => (a, b),
            _ => return x.matmul(w),
        };
        match (f32_slice(&xp), f32_slice(&wp)) {
            (Some((xs, xv)), Some((ws, wv))) if xs == [m, k] && ws == [k, n] => {
                let y = if m > FEW_ROWS_MAX {
                    kvb_gemm::matmul(xv, m, k, n, &kvb_gemm::DenseWeight { w: wv, n })
                } else {
                    few_rows::matmul(xv, wv, m, k, n)
                };
                Tensor::from_data(TensorData::new(y, [m, n]), &device)
            }
            // Not contiguous f32: the generic path is always correct.
            _ => x.matmul(w),
        }
    }

    fn runs_packed_weights() -> bool {
        true
    }

    /// 1 to 4 rows: dequantized in registers ([`packed_rows`]). More: the blocked GEMM
    /// ([`kvb_gemm`]) expands the weight block by block straight into its panels (the whole
    /// weight is never expanded). Both compute what the f32 weight would (see
    /// [`crate::packed`]).
    fn packed_linear(x: Tensor<Self, 2>, w: &PackedMatrix) -> Tensor<Self, 2> {
        let [m, k] = x.dims();
        let n = w.n();
        let device = x.device();
        let Some(xp) = rows_of(&x) else {
            return backend_ops::packed_linear_reference(x, w);
        };
        let Some((xs, xv)) = f32_slice(&xp) else {
            return backend_ops::packed_linear_reference(x, w);
        };
        if xs != [m, k] || k != w.k() {
            return backend_ops::packed_linear_reference(x, w);
        }
        let y = packed_rows::matmul(xv, m, w).unwrap_or_else(|| kvb_gemm::matmul(xv, m, k, n, w));
        Tensor::from_data(TensorData::new(y, [m, n]), &device)
    }

    /// Straight from the tensor's storage (no copy of `x`).
    fn int8_linear(x: Tensor<Self, 2>, w: &super::int8::IntDotMatrix) -> Tensor<Self, 2> {
        let [m, k] = x.dims();
        let device = x.device();
        let y = match rows_of(&x).as_ref().and_then(f32_slice) {
            Some((shape, xv)) if shape == [m, k] && k == w.k() => super::int8::matmul(xv, m, w),
            _ => super::int8::matmul(&crate::to_host_f32(x), m, w),
        };
        Tensor::from_data(TensorData::new(y, [m, w.n()]), &device)
    }
}

#[cfg(test)]
mod tests {
    use super::super::test_values::{burn_matmul, packed_matrix, spread};
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]
        /// The product of a linear layer computes the bits burn-ndarray's `matmul` computes on
        /// either side of [`FEW_ROWS_MAX`], so a row's result does not depend on how many rows
        /// its step had.
        #[test]
        fn linear_products_match_burn_ndarray_bit_for_bit(m in 1usize..80, k in 1usize..600, n in 1usize..70, seed in 0u32..1000) {
            let val = |i: usize| spread(i, seed, 700.0);
            let x: Vec<f32> = (0..m * k).map(val).collect();
            let w: Vec<f32> = (0..k * n).map(|i| val(i + 7919)).collect();
            let want = burn_matmul(&x, &w, m, k, n);
            let dev = Default::default();
            let xt = Tensor::<NdArray<f32>, 2>::from_data(TensorData::new(x, [m, k]), &dev);
            let wt = Tensor::<NdArray<f32>, 2>::from_data(TensorData::new(w, [k, n]), &dev);
            let got = NdArray::<f32>::linear_matmul(xt, wt).into_data().to_vec::<f32>().unwrap();
            for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                prop_assert_eq!(g.to_bits(), e.to_bits(), "element {} of [{}, {}]", i, m, n);
            }
        }

        /// A product over packed weights gives the bits of the same product over the weights
        /// expanded to f32, for few rows (in registers) and many (the blocked GEMM), so a
        /// model answers the same whether it keeps its GGUF's blocks or expands them.
        #[test]
        fn packed_products_equal_the_f32_products_bit_for_bit(
            m in prop_oneof![1usize..9, 30usize..40, 250usize..270], blocks_per_row in 1usize..20, n in 1usize..200,
            format in 0usize..super::super::test_values::FORMATS, seed in 0u32..1000,
        ) {
            let (packed, k) = packed_matrix(format, blocks_per_row, n, seed);
            let val = |i: usize| spread(i, seed, 700.0);
            let x: Vec<f32> = (0..m * k).map(val).collect();
            let dev = Default::default();
            let xt = Tensor::<NdArray<f32>, 2>::from_data(TensorData::new(x, [m, k]), &dev);
            let dense = Tensor::<NdArray<f32>, 2>::from_data(TensorData::new(packed.to_dense(), [k, n]), &dev);
            let want = NdArray::<f32>::linear_matmul(xt.clone(), dense).into_data().to_vec::<f32>().unwrap();
            let got = NdArray::<f32>::packed_linear(xt, &packed).into_data().to_vec::<f32>().unwrap();
            for (i, (g, e)) in got.iter().zip(&want).enumerate() {
                prop_assert_eq!(g.to_bits(), e.to_bits(), "element {} of [{}, {}] x [{}, {}]", i, m, k, k, n);
            }
        }
    }
}
