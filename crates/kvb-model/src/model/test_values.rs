//! Test helpers shared by the CPU kernels' tests: deterministic operands and the reference
//! product the kernels must match bit for bit.

use burn::tensor::{Tensor, TensorData};

type Cpu = burn::backend::NdArray<f32>;

pub use kvb_gemm::test_values::{packed_matrix, spread, FORMATS};

/// burn-ndarray's product of row-major `x [m, k]` and `w [k, n]` (matrixmultiply's sgemm).
pub fn burn_matmul(x: &[f32], w: &[f32], m: usize, k: usize, n: usize) -> Vec<f32> {
    let dev = Default::default();
    let x = Tensor::<Cpu, 2>::from_data(TensorData::new(x.to_vec(), [m, k]), &dev);
    let w = Tensor::<Cpu, 2>::from_data(TensorData::new(w.to_vec(), [k, n]), &dev);
    x.matmul(w).into_data().to_vec::<f32>().expect("f32 values")
}
