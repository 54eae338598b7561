//! Expanding ggml tensors to f32: floats converted, quantized blocks read by [`super::blocks`].

use super::blocks;
use super::parse::GgmlType;
use half::{bf16, f16};

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Dequantizes `bytes` (whose length the parser has checked against the element count).
pub fn dequantize(ggml_type: GgmlType, bytes: &[u8]) -> Vec<f32> {
    let (per_block, block_bytes) = ggml_type.block();
    let mut out = Vec::with_capacity(bytes.len() / block_bytes * per_block);
    match ggml_type {
        GgmlType::F32 => out.extend(
            bytes
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
        ),
        GgmlType::F16 => out.extend(bytes.chunks_exact(2).map(|b| f16_at(b, 0))),
        GgmlType::Bf16 => out.extend(
            bytes
                .chunks_exact(2)
                .map(|b| bf16::from_le_bytes([b[0], b[1]]).to_f32()),
        ),
        _ => {
            // Quantized blocks: q * scale + offset per weight (see `blocks`).
            let mut coded = Vec::with_capacity(per_block);
            for block in bytes.chunks_exact(block_bytes) {
                coded.clear();
                blocks::decode(ggml_type, block, &mut coded);
                out.extend(coded.iter().map(|c| c.value()));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f16_bytes(v: f32) -> [u8; 2] {
        f16::from_f32(v).to_le_bytes()
    }

    #[test]
    fn q4_1_low_nibbles_come_first() {
        let mut block = Vec::new();
        block.extend(f16_bytes(0.5));
        block.extend(f16_bytes(-1.0));
        block.extend((0..16u8).map(|i| i | ((15 - i) << 4)));
        let out = dequantize(GgmlType::Q4_1, &block);
        assert_eq!(out.len(), 32);
        assert_eq!(out[0], -1.0);
        assert_eq!(out[3], 0.5);
        assert_eq!(out[16], 0.5 * 15.0 - 1.0);
        assert_eq!(out[31], -1.0);
    }

    #[test]
    fn q4_0_and_q8_0_are_symmetric() {
        let mut q4 = Vec::from(f16_bytes(2.0));
        q4.extend([0x88u8; 16]);
        assert!(dequantize(GgmlType::Q4_0, &q4).iter().all(|&v| v == 0.0));
        let mut q8 = Vec::from(f16_bytes(0.25));
        q8.extend((0..32).map(|i| (i as i8 - 16) as u8));
        let out = dequantize(GgmlType::Q8_0, &q8);
        assert_eq!(out[0], -4.0);
        assert_eq!(out[31], 3.75);
    }
}
