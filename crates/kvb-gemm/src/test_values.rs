//! Test helpers shared by the CPU kernels' tests (here and in kvb-model): deterministic operands
//! in every packed format. Not part of the API.

/// Value `i` of a deterministic spread of numbers in `[-1000, 1000] / scale`, varied by `seed`.
pub fn spread(i: usize, seed: u32, scale: f32) -> f32 {
    (((i as u32).wrapping_mul(2654435761).wrapping_add(seed) % 2001) as f32 - 1000.0) / scale
}

/// Formats [`packed_matrix`] builds: 0 Q8_0 (quantized from f32: f32 scales), 1 Q4_1, 2 Q6_K,
/// 3 bf16, 4 f16, 5 Q4_K, 6 Q5_K, 7 Q8_0 and 8 Q4_0 blocks as a file holds them (f16 scales),
/// 10 Q2_K, 11 IQ4_XS, 12 Q3_K, 14 IQ4_NL, 9 Q5_1 and 15 Q5_0 (their own cells), and 13 Q3_K
/// columns beside Q6_K ones (one projection in Q6_K cells).
pub const FORMATS: usize = 16;

/// A packed `[k, n]` weight of one of [`FORMATS`] formats with deterministic values, and its
/// `k`: `blocks_per_row` cells of 32 rows (K-quants: rounded up to whole 256-weight blocks).
pub fn packed_matrix(
    format: usize,
    blocks_per_row: usize,
    n: usize,
    seed: u32,
) -> (crate::packed::PackedMatrix, usize) {
    use crate::packed::{BlockTensor, PackedMatrix, CELL_ROWS};
    use kvb_modelfile::gguf::GgmlType;
    let k_quant = match format {
        2 => Some(GgmlType::Q6_K),
        5 => Some(GgmlType::Q4_K),
        6 => Some(GgmlType::Q5_K),
        10 => Some(GgmlType::Q2_K),
        11 => Some(GgmlType::IQ4_XS),
        12 | 13 => Some(GgmlType::Q3_K),
        _ => None,
    };
    let k = if k_quant.is_some() {
        blocks_per_row.div_ceil(8) * 256
    } else {
        blocks_per_row * CELL_ROWS
    };
    let w: Vec<f32> = (0..n * k).map(|i| spread(i + 7919, seed, 700.0)).collect();
    let byte = |i: usize| ((i as u32).wrapping_mul(2246822519).wrapping_add(seed) >> 13) as u8;
    let tensor = |ggml_type, rows, bytes| BlockTensor {
        ggml_type,
        rows,
        cols: k,
        bytes,
    };
    let blocks = |ggml_type, bytes| PackedMatrix::from_blocks(&[tensor(ggml_type, n, bytes)]);
    let f16 = |v: f32| half::f16::from_f32(v).to_le_bytes();
    // Random K-quant blocks of `t` (values and scales), the f16 scale last, for `rows` columns.
    let scaled_last = |t: GgmlType, rows: usize, seed_at: usize| {
        let block_bytes = t.block().1;
        let mut bytes = Vec::new();
        for b in seed_at..seed_at + rows * k / 256 {
            bytes.extend((0..block_bytes - 2).map(|i| byte(b * block_bytes + i)));
            bytes.extend(f16(0.001 + (b % 5) as f32 * 0.0003));
        }
        bytes
    };
    let packed = match (format, k_quant) {
        (0, _) => PackedMatrix::quantize_q8_0(&[(&w, n)], k),
        // 16-bit floats: the f32 weights rounded.
        (3, _) => blocks(
            GgmlType::Bf16,
            w.iter()
                .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
                .collect(),
        ),
        (4, _) => blocks(GgmlType::F16, w.iter().flat_map(|v| f16(*v)).collect()),
        (1, _) => {
            // 4-bit values: a Q4_1 block per 32 weights of each output row.
            let mut bytes = Vec::new();
            for b in 0..n * k / CELL_ROWS {
                bytes.extend(f16(0.01 + (b % 7) as f32 * 0.003));
                bytes.extend(f16(-0.1));
                bytes.extend((0..16).map(|i| byte(b * 16 + i)));
            }
            blocks(GgmlType::Q4_1, bytes)
        }
        (7, _) => {
            // 8-bit values of either sign, the scale's sign varying too.
            let mut bytes = Vec::new();
            for b in 0..n * k / CELL_ROWS {
                let sign = if b % 4 == 3 { -1.0 } else { 1.0 };
                bytes.extend(f16(sign * (0.001 + (b % 5) as f32 * 0.0002)));
                bytes.extend((0..32).map(|i| byte(b * 32 + i)));
            }
            blocks(GgmlType::Q8_0, bytes)
        }
        (8 | 14, _) => {
            // Q4_0 and IQ4_NL: an f16 scale (IQ4_NL's of either sign), 16 bytes of nibbles.
            let (t, sign) = match format {
                8 => (GgmlType::Q4_0, 1.0),
                _ => (GgmlType::IQ4_NL, -1.0),
            };
            let mut bytes = Vec::new();
            for b in 0..n * k / CELL_ROWS {
                let sign = if b % 3 == 2 { sign } else { 1.0 };
                bytes.extend(f16(sign * (0.02 + (b % 6) as f32 * 0.004)));
                bytes.extend((0..16).map(|i| byte(b * 16 + i)));
            }
            blocks(t, bytes)
        }
        (9, _) => {
            // 5-bit values: a Q5_1 block (scale, min, fifth bits, nibbles) per 32 weights.
            let mut bytes = Vec::new();
            for b in 0..n * k / CELL_ROWS {
                bytes.extend(f16(0.004 + (b % 7) as f32 * 0.001));
                bytes.extend(f16(if b % 3 == 0 { 0.05 } else { -0.07 }));
                bytes.extend((0..20).map(|i| byte(b * 20 + i)));
            }
            blocks(GgmlType::Q5_1, bytes)
        }
        (15, _) => {
            // A Q5_0 block (scale of either sign, fifth bits, nibbles) per 32 weights.
            let mut bytes = Vec::new();
            for b in 0..n * k / CELL_ROWS {
                let sign = if b % 4 == 2 { -1.0 } else { 1.0 };
                bytes.extend(f16(sign * (0.005 + (b % 6) as f32 * 0.001)));
                bytes.extend((0..20).map(|i| byte(b * 20 + i)));
            }
            blocks(GgmlType::Q5_0, bytes)
        }
        (13, _) => {
            // The first half of the columns Q3_K, the rest Q6_K.
            let (q3, q6) = (n.div_ceil(2), n / 2);
            let mut parts = vec![tensor(
                GgmlType::Q3_K,
                q3,
                scaled_last(GgmlType::Q3_K, q3, 0),
            )];
            if q6 > 0 {
                let bytes = scaled_last(GgmlType::Q6_K, q6, q3 * k / 256);
                parts.push(tensor(GgmlType::Q6_K, q6, bytes));
            }
            PackedMatrix::from_blocks(&parts)
        }
        (_, Some(t @ (GgmlType::Q6_K | GgmlType::Q3_K))) => blocks(t, scaled_last(t, n, 0)),
        (_, Some(GgmlType::Q2_K)) => {
            // Scales and mins, values random; the f16 scale and min last, the min of either sign.
            let mut bytes = Vec::new();
            for b in 0..n * k / 256 {
                bytes.extend((0..80).map(|i| byte(b * 80 + i)));
                bytes.extend(f16(0.003 + (b % 5) as f32 * 0.0005));
                bytes.extend(f16(if b % 3 == 0 { -0.002 } else { 0.004 }));
            }
            blocks(GgmlType::Q2_K, bytes)
        }
        (_, Some(GgmlType::IQ4_XS)) => {
            // The f16 scale first, of either sign; sub-block scales and indices random.
            let mut bytes = Vec::new();
            for b in 0..n * k / 256 {
                let sign = if b % 4 == 1 { -1.0 } else { 1.0 };
                bytes.extend(f16(sign * (0.0004 + (b % 5) as f32 * 0.0001)));
                bytes.extend((0..134).map(|i| byte(b * 134 + i)));
            }
            blocks(GgmlType::IQ4_XS, bytes)
        }
        (_, Some(t)) => {
            // Q4_K, Q5_K: finite super-block scale and min of either sign, random scales, mins
            // and values.
            let block_bytes = t.block().1;
            let mut bytes = Vec::new();
            for b in 0..n * k / 256 {
                bytes.extend(f16(0.002 + (b % 5) as f32 * 0.0007));
                bytes.extend(f16(if b % 3 == 0 {
                    -0.004
                } else {
                    0.003 + (b % 4) as f32 * 0.001
                }));
                bytes.extend((4..block_bytes).map(|i| byte(b * block_bytes + i)));
            }
            blocks(t, bytes)
        }
        _ => unreachable!("format {format} is not one of {FORMATS}"),
    };
    (packed.expect("a well-formed packed matrix"), k)
}
