//! Test helpers shared by the CPU kernels' tests: deterministic operands and the reference
//! product the kernels must match bit for bit.

use burn::tensor::{Tensor, TensorData};

type Cpu = burn::backend::NdArray<f32>;

/// Value `i` of a deterministic spread of numbers in `[-1000, 1000] / scale`, varied by `seed`.
pub fn spread(i: usize, seed: u32, scale: f32) -> f32 {
    (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 2001) as f32 - 1000.0) / scale
}

/// burn-ndarray's product of row-major `x [m, k]` and `w [k, n]` (matrixmultiply's sgemm).
pub fn burn_matmul(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let dev = Default::default();
    let x = Tensor::<Cpu, 2>::from_data(TensorData::new(x.to_vec(), [m, k]), &dev);
    let w = Tensor::<Cpu, 2>::from_data(TensorData::new(w.to_vec(), [k, n]), &dev);
    x.matmul(w).into_data().to_vec::<f32>().expect("f32 values")
}
