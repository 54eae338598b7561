//! Operations the model needs that a backend may run faster than burn's generic ops.
//!
//! [`ModelBackend`]'s default methods are plain burn tensor ops, so any backend works with a one-line
//! `impl ModelBackend for MyBackend {}`; a backend overrides a method only where it has a measured
//! reason to.

use burn::tensor::Tensor;
use kvb_attn::AttentionBackend;

/// A burn backend the model can run on (attention included, see [`AttentionBackend`]).
pub trait ModelBackend: AttentionBackend {
    /// `x`: `[m, k]` times `w`: `[k, n]` (contiguous) -> `[m, n]`.
    fn linear_matmul(x: Tensor<Self, 2>, w: Tensor<Self, 2>) -> Tensor<Self, 2> {
        x.matmul(w)
    }
}

#[cfg(feature = "wgpu")]
impl ModelBackend for crate::backends::Wgpu {}

#[cfg(feature = "cuda")]
impl ModelBackend for crate::backends::Cuda {}

#[cfg(feature = "ndarray")]
mod cpu {
    use super::ModelBackend;
    use burn::tensor::{Tensor, TensorData, TensorPrimitive};
    use burn_ndarray::{NdArray, NdArrayTensor};
    use rayon::prelude::*;

    /// Up to this many rows, a product is a few matrix-vector products: burn-ndarray would send it
    /// through matrixmultiply, which packs the whole `[k, n]` weight on every call (measured: the
    /// 576x49152 LM head took 107 ms per decode step, 0.5 GFLOP/s). Streaming the weight once
    /// instead is bound by memory bandwidth.
    const GEMV_MAX_ROWS: usize = 8;
    /// Output columns per parallel task: 256 floats keep each row segment a 1 KiB streaming read.
    const COLUMN_BLOCK: usize = 256;

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

    /// `y[r, j] = sum_i x[r, i] * w[i, j]`, parallel over blocks of output columns.
    fn gemv_rows(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
        let blocks: Vec<Vec<f32>> = (0..n.div_ceil(COLUMN_BLOCK))
            .into_par_iter()
            .map(|b| {
                let j0 = b * COLUMN_BLOCK;
                let width = COLUMN_BLOCK.min(n - j0);
                let mut acc = vec![0f32; m * width];
                for i in 0..k {
                    let row = &w[i * n + j0..i * n + j0 + width];
                    for r in 0..m {
                        let xi = x[r * k + i];
                        let out = &mut acc[r * width..(r + 1) * width];
                        for (o, &wv) in out.iter_mut().zip(row) {
                            *o += xi * wv;
                        }
                    }
                }
                acc
            })
            .collect();
        let mut y = vec![0f32; m * n];
        for (b, acc) in blocks.iter().enumerate() {
            let j0 = b * COLUMN_BLOCK;
            let width = acc.len() / m;
            for r in 0..m {
                y[r * n + j0..r * n + j0 + width].copy_from_slice(&acc[r * width..(r + 1) * width]);
            }
        }
        y
    }

    impl ModelBackend for NdArray<f32> {
        fn linear_matmul(x: Tensor<Self, 2>, w: Tensor<Self, 2>) -> Tensor<Self, 2> {
            let [m, k] = x.dims();
            let [_, n] = w.dims();
            if m > GEMV_MAX_ROWS {
                return x.matmul(w);
            }
            let device = x.device();
            let (xp, wp) = match (x.clone().into_primitive(), w.clone().into_primitive()) {
                (TensorPrimitive::Float(a), TensorPrimitive::Float(b)) => (a, b),
                _ => return x.matmul(w),
            };
            match (f32_slice(&xp), f32_slice(&wp)) {
                (Some((xs, xv)), Some((ws, wv))) if xs == [m, k] && ws == [k, n] => {
                    let y = gemv_rows(xv, wv, m, k, n);
                    Tensor::from_data(TensorData::new(y, [m, n]), &device)
                }
                // Not contiguous f32: the generic path is always correct.
                _ => x.matmul(w),
            }
        }
    }
}
