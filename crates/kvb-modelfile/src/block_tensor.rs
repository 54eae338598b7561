//! A weight tensor as a file stores it.

use crate::gguf::{blocks, GgmlType};

/// A tensor as stored: `rows` output features of `cols` inputs, each row a run of ggml blocks
/// (PyTorch's `[out, in]` layout, blockwise): a GGUF's quantized blocks of 32 or 256 weights, or
/// 16-bit floats (a block of one) from a GGUF or a safetensors file.
#[derive(Debug, Clone, PartialEq)]
pub struct BlockTensor {
    /// The block format.
    pub ggml_type: GgmlType,
    /// Output features.
    pub rows: usize,
    /// Input features (a multiple of the block's weights: 32, 256 for K-quants, 1 for floats).
    pub cols: usize,
    /// `rows * cols / weights per block` blocks.
    pub bytes: Vec<u8>,
}

impl BlockTensor {
    /// Whether a model keeps tensors of `ggml_type` as stored (every quantized format read
    /// here, f16 and bf16) rather than widened to f32.
    pub fn packable(ggml_type: GgmlType) -> bool {
        blocks::is_quantized(ggml_type) || matches!(ggml_type, GgmlType::F16 | GgmlType::Bf16)
    }

    /// The values as f32, row-major `[rows, cols]`.
    pub fn to_f32(&self) -> Vec<f32> {
        crate::gguf::dequantize(self.ggml_type, &self.bytes)
    }
}
