//! Reading ggml's quantized blocks apart: every weight of Q4_0, Q4_1, Q8_0, Q4_K, Q5_K and Q6_K
//! is `q * scale + offset` for a small integer `q` and a scale and offset shared by a run of 16
//! or 32 weights (a sub-block). The product is exact in f32 (a scale of at most 19 significant
//! bits times an integer of at most 6), so that expression rounds once, exactly as llama.cpp's
//! own dequantization does; [`super::dequantize`] and [`crate::packed`] both start from here.
//!
//! Formats as ggml defines them (`ggml-common.h`, `ggml-quants.c`); K-quants hold 256 weights.

use super::parse::GgmlType;

/// One weight of a block: its value is `q * scale + offset`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Coded {
    /// The sub-block's scale.
    pub scale: f32,
    /// The sub-block's offset.
    pub offset: f32,
    /// The weight's integer.
    pub q: i8,
}

impl Coded {
    /// The weight's value.
    pub fn value(self) -> f32 {
        self.q as f32 * self.scale + self.offset
    }
}

fn f16_at(b: &[u8], at: usize) -> f32 {
    half::f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Weights per sub-block (sharing one scale and offset) of a quantized type.
pub fn sub_block_len(t: GgmlType) -> usize {
    match t {
        GgmlType::Q6_K => 16,
        _ => 32,
    }
}

/// Whether the type's integers need more than 4 bits.
pub fn wider_than_4_bits(t: GgmlType) -> bool {
    matches!(t, GgmlType::Q8_0 | GgmlType::Q5_K | GgmlType::Q6_K)
}

/// Whether [`decode`] reads this type.
pub fn is_quantized(t: GgmlType) -> bool {
    !matches!(t, GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16)
}

/// Appends the weights of one block (`block` is exactly one block of `t`) to `out`.
pub fn decode(t: GgmlType, block: &[u8], out: &mut Vec<Coded>) {
    let mut push = |scale: f32, offset: f32, q: i32| {
        out.push(Coded {
            scale,
            offset,
            q: q as i8,
        })
    };
    match t {
        // Low nibbles hold weights 0..16, high nibbles 16..32. (q - 8) d = q d + (-8 d), exactly.
        GgmlType::Q4_0 | GgmlType::Q4_1 => {
            let d = f16_at(block, 0);
            let (offset, qs) = if t == GgmlType::Q4_0 {
                (-8.0 * d, &block[2..18])
            } else {
                (f16_at(block, 2), &block[4..20])
            };
            for shift in [0, 4] {
                for &b in qs {
                    push(d, offset, ((b >> shift) & 0x0f) as i32);
                }
            }
        }
        // d q; adding -0.0 keeps every value, signed zeros included.
        GgmlType::Q8_0 => {
            let d = f16_at(block, 0);
            for &b in &block[2..34] {
                push(d, -0.0, b as i8 as i32);
            }
        }
        // 4 runs of 64: 32 low nibbles then 32 high nibbles of the same bytes, each half with
        // its own 6-bit scale and min: d * sc * q - dmin * m.
        GgmlType::Q4_K | GgmlType::Q5_K => {
            let (d, dmin) = (f16_at(block, 0), f16_at(block, 2));
            let scales = &block[4..16];
            let (qh, qs) = if t == GgmlType::Q5_K {
                (Some(&block[16..48]), &block[48..176])
            } else {
                (None, &block[16..144])
            };
            for run in 0..4 {
                let q = &qs[run * 32..run * 32 + 32];
                for half in 0..2 {
                    let (sc, m) = scale_min_k4(2 * run + half, scales);
                    let (scale, offset) = (d * sc as f32, -(dmin * m as f32));
                    let bit = 2 * run + half;
                    for l in 0..32 {
                        let low = (q[l] >> (4 * half)) & 0x0f;
                        let high = qh.map_or(0, |h| ((h[l] >> bit) & 1) << 4);
                        push(scale, offset, (low | high) as i32);
                    }
                }
            }
        }
        // 2 halves of 128: 4 runs of 32 from the low/high nibbles of ql and 2-bit pairs of qh,
        // minus 32; an int8 scale per 16: (d * sc) * q.
        GgmlType::Q6_K => {
            let d = f16_at(block, 208);
            let scales = &block[192..208];
            for half in 0..2 {
                let ql = &block[half * 64..half * 64 + 64];
                let qh = &block[128 + half * 32..128 + half * 32 + 32];
                for run in 0..4 {
                    for l in 0..32 {
                        let (src, shift) = match run {
                            0 => (ql[l], 0),
                            1 => (ql[l + 32], 0),
                            2 => (ql[l], 4),
                            _ => (ql[l + 32], 4),
                        };
                        let high = (qh[l] >> (2 * run)) & 3;
                        let q = (((src >> shift) & 0x0f) | (high << 4)) as i32 - 32;
                        let sc = scales[half * 8 + run * 2 + l / 16] as i8;
                        push(d * sc as f32, -0.0, q);
                    }
                }
            }
        }
        GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16 => {}
    }
}

/// The 6-bit scale and min of sub-block `j` (0..8) from a K-quant's 12 packed bytes.
fn scale_min_k4(j: usize, q: &[u8]) -> (u8, u8) {
    if j < 4 {
        (q[j] & 63, q[j + 4] & 63)
    } else {
        (
            (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4),
            (q[j + 4] >> 4) | ((q[j] >> 6) << 4),
        )
    }
}
