//! Reading ggml's quantized blocks apart: every weight of Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K,
//! Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL and IQ4_XS is `q * scale + offset` for a small integer `q` (at
//! most 8 bits: IQ4's table entries) and a scale and offset shared by a run of 16 or 32 weights
//! (a sub-block). The product is exact in f32 (a scale of at most 19 significant bits times an
//! integer of at most 6, or IQ4_XS's of at most 16 times a table entry of 7), so that expression
//! rounds once, exactly as llama.cpp's own dequantization does; [`super::dequantize`] and the
//! CPU kernels (kvb-gemm's `packed`) both start from here.
//!
//! Formats as ggml defines them (`ggml-common.h`, `ggml-quants.c`); K-quants and IQ4_XS hold
//! 256 weights.

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

/// IQ4_NL's and IQ4_XS's 16 values (`kvalues_iq4nl` in ggml), indexed by a weight's nibble.
pub const IQ4_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

/// Weights per sub-block (sharing one scale and offset) of a quantized type.
pub fn sub_block_len(t: GgmlType) -> usize {
    match t {
        GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::Q6_K => 16,
        _ => 32,
    }
}

/// Whether the type's integers ([`Coded::q`]) are not all unsigned 4-bit ones.
pub fn wider_than_4_bits(t: GgmlType) -> bool {
    !matches!(
        t,
        GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q4_K | GgmlType::Q2_K
    )
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
        // Q4_0's and Q4_1's nibbles with a fifth bit from `qh` (bit j for weight j); Q5_0's
        // values are offset by 16 (d (q - 16)), Q5_1's have a min (d q + m).
        GgmlType::Q5_0 | GgmlType::Q5_1 => {
            let d = f16_at(block, 0);
            let (offset, at) = match t {
                GgmlType::Q5_0 => (-0.0, 2),
                _ => (f16_at(block, 2), 4),
            };
            let qh = u32::from_le_bytes([block[at], block[at + 1], block[at + 2], block[at + 3]]);
            let qs = &block[at + 4..at + 20];
            let bias = if t == GgmlType::Q5_0 { 16 } else { 0 };
            for (half, shift) in [0, 4].into_iter().enumerate() {
                for (j, &b) in qs.iter().enumerate() {
                    let high = ((qh >> (16 * half + j)) & 1) << 4;
                    push(
                        d,
                        offset,
                        (((b >> shift) & 0x0f) as i32 | high as i32) - bias,
                    );
                }
            }
        }
        // Indices into IQ4's table: d * value, low nibbles first as in Q4_0.
        GgmlType::IQ4_NL => {
            let d = f16_at(block, 0);
            for shift in [0, 4] {
                for &b in &block[2..18] {
                    push(d, -0.0, IQ4_VALUES[((b >> shift) & 0x0f) as usize] as i32);
                }
            }
        }
        // 2-bit values: each run of 32 bytes holds 4 planes (bit pairs 0-1, 2-3, ...) of 32
        // weights, two sub-blocks of 16 each, with a 4-bit scale (low) and min (high) per
        // sub-block: d sc q - dmin m.
        GgmlType::Q2_K => {
            let (d, dmin) = (f16_at(block, 80), f16_at(block, 82));
            let (scales, qs) = (&block[..16], &block[16..80]);
            for (s, &sc) in scales.iter().enumerate() {
                let (half, plane, part) = (s / 8, (s % 8) / 2, s % 2);
                let scale = d * (sc & 0x0f) as f32;
                let offset = -(dmin * (sc >> 4) as f32);
                let bytes = &qs[half * 32 + part * 16..half * 32 + part * 16 + 16];
                for &b in bytes {
                    push(scale, offset, ((b >> (2 * plane)) & 3) as i32);
                }
            }
        }
        // K-quants and IQ4_XS: the block read apart once ([`KBlock`]), each weight from its
        // sub-block.
        GgmlType::Q3_K | GgmlType::Q4_K | GgmlType::Q5_K | GgmlType::Q6_K | GgmlType::IQ4_XS => {
            let k = KBlock::read(t, block);
            for (r, &q) in k.q.iter().enumerate() {
                let (scale, offset) = k.sub_scale(r / k.sub_len);
                push(scale, offset, q as i32 - k.bias as i32);
            }
        }
        GgmlType::F32 | GgmlType::F16 | GgmlType::Bf16 => {}
    }
}

/// A K-quant block (256 weights), or an IQ4_XS one, read apart into what every weight is made
/// of: the f16 super-block scale `d` and min `dmin` as stored, a scale (and for Q2_K, Q4_K and
/// Q5_K a min) per sub-block, and each weight's unsigned integer. Weight `r` is
/// `(q[r] - bias) * (d * sc[s]) + -(dmin * m[s])` for its sub-block `s = r / sub_len`
/// (Q3_K, Q6_K and IQ4_XS: `dmin` and `m` are zero and the offset is -0.0).
#[derive(Debug, Clone, PartialEq)]
pub struct KBlock {
    /// `d`'s two bytes, as stored.
    pub d: [u8; 2],
    /// `dmin`'s two bytes, as stored (zero for Q3_K and Q6_K).
    pub dmin: [u8; 2],
    /// Sub-block scales: 8 unsigned 6-bit ones (Q4_K, Q5_K), 16 unsigned 4-bit ones (Q2_K),
    /// 16 signed bytes (Q3_K and Q6_K, as `u8`) or 8 (IQ4_XS: its 6-bit ones less 32).
    pub sc: [u8; 16],
    /// Sub-block mins: 8 of 6 bits (Q4_K, Q5_K) or 16 of 4 bits (Q2_K).
    pub m: [u8; 16],
    /// Each weight's stored integer, unsigned (2 to 6 bits; IQ4_XS: its table entry plus 128).
    pub q: [u8; 256],
    /// Weights per sub-block: 32, or 16 for Q2_K, Q3_K and Q6_K.
    pub sub_len: usize,
    /// Subtracted from `q`: 32 for Q3_K (read as Q6_K's values) and Q6_K, 128 for IQ4_XS,
    /// else 0.
    pub bias: u8,
}

impl KBlock {
    /// Reads one block of `t` (Q2_K, Q3_K, Q4_K, Q5_K, Q6_K or IQ4_XS). A Q3_K block is read as
    /// the Q6_K block of the same values: its 6-bit scales less 32 are Q6_K's int8 scales and
    /// its 3-bit values plus 32 are 6-bit values within Q6_K's bias (same sub-blocks of 16, same
    /// `d`). An IQ4_XS block's values are its table entries plus 128.
    ///
    /// # Panics
    /// If `block` is shorter than one block of `t`: callers check a tensor's size against its
    /// block count once, not per block.
    pub fn read(t: GgmlType, block: &[u8]) -> KBlock {
        let mut k = KBlock {
            d: [0; 2],
            dmin: [0; 2],
            sc: [0; 16],
            m: [0; 16],
            q: [0; 256],
            sub_len: 32,
            bias: 0,
        };
        if t == GgmlType::Q2_K {
            // scales (16: a 4-bit scale low, a 4-bit min high), qs (64), d, dmin. Each half's
            // 32 bytes of qs hold 4 planes of bit pairs, each plane two sub-blocks of 16.
            let (scales, qs) = (&block[..16], &block[16..80]);
            (k.d, k.dmin) = ([block[80], block[81]], [block[82], block[83]]);
            k.sub_len = 16;
            for (s, &b) in scales.iter().enumerate() {
                (k.sc[s], k.m[s]) = (b & 0x0f, b >> 4);
                let (half, plane, part) = (s / 8, (s % 8) / 2, s % 2);
                for l in 0..16 {
                    k.q[s * 16 + l] = (qs[half * 32 + part * 16 + l] >> (2 * plane)) & 3;
                }
            }
            return k;
        }
        if t == GgmlType::Q3_K {
            // hmask (32), qs (64), scales (12), d. Each half's 32 bytes of qs hold 4 planes of
            // bit pairs; plane p of half h takes its high bit from bit 4h + p of hmask's bytes,
            // and a clear high bit subtracts 4.
            let (hmask, qs) = (&block[..32], &block[32..96]);
            k.d = [block[108], block[109]];
            (k.sub_len, k.bias) = (16, 32);
            for (s, sc) in q3_k_scales(&block[96..108]).into_iter().enumerate() {
                k.sc[s] = (sc as i8 - 32) as u8;
            }
            for half in 0..2 {
                for plane in 0..4 {
                    for l in 0..32 {
                        let low = (qs[half * 32 + l] >> (2 * plane)) & 3;
                        let high = (hmask[l] >> (4 * half + plane)) & 1;
                        // q3 = low - 4 (high clear) or low; stored as q3 + 32.
                        k.q[half * 128 + plane * 32 + l] = 28 + low + 4 * high;
                    }
                }
            }
            return k;
        }
        if t == GgmlType::IQ4_XS {
            // d, scales_h (2: bit pair s of scale s's high bits), scales_l (4: nibble s), then
            // 8 sub-blocks of 32 laid out as IQ4_NL's (16 bytes: low nibbles are weights 0..16,
            // high ones 16..32), each an index into IQ4's table.
            k.d = [block[0], block[1]];
            (k.sub_len, k.bias) = (32, 128);
            let high = u16::from_le_bytes([block[2], block[3]]);
            for s in 0..8 {
                let low = (block[4 + s / 2] >> (4 * (s % 2))) & 0x0f;
                let ls = low | (((high >> (2 * s)) & 3) as u8) << 4;
                k.sc[s] = (ls as i8 - 32) as u8;
                let qs = &block[8 + 16 * s..8 + 16 * s + 16];
                for (half, shift) in [0, 4].into_iter().enumerate() {
                    for (l, &b) in qs.iter().enumerate() {
                        let value = IQ4_VALUES[((b >> shift) & 0x0f) as usize];
                        k.q[s * 32 + half * 16 + l] = (value as i32 + 128) as u8;
                    }
                }
            }
            return k;
        }
        if t == GgmlType::Q6_K {
            // 2 halves of 128: 4 runs of 32 from the low/high nibbles of ql and 2-bit pairs of
            // qh; an int8 scale per 16.
            k.d = [block[208], block[209]];
            k.sc.copy_from_slice(&block[192..208]);
            (k.sub_len, k.bias) = (16, 32);
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
                        k.q[half * 128 + run * 32 + l] = ((src >> shift) & 0x0f) | (high << 4);
                    }
                }
            }
            return k;
        }
        // 4 runs of 64: 32 low nibbles then 32 high nibbles of the same bytes, each half with
        // its own 6-bit scale and min; Q5_K adds a fifth bit from qh.
        k.d = [block[0], block[1]];
        k.dmin = [block[2], block[3]];
        let scales = &block[4..16];
        let (qh, qs) = if t == GgmlType::Q5_K {
            (Some(&block[16..48]), &block[48..176])
        } else {
            (None, &block[16..144])
        };
        for j in 0..8 {
            (k.sc[j], k.m[j]) = scale_min_k4(j, scales);
        }
        for run in 0..4 {
            let q = &qs[run * 32..run * 32 + 32];
            for half in 0..2 {
                let bit = 2 * run + half;
                for l in 0..32 {
                    let low = (q[l] >> (4 * half)) & 0x0f;
                    let high = qh.map_or(0, |h| ((h[l] >> bit) & 1) << 4);
                    k.q[bit * 32 + l] = low | high;
                }
            }
        }
        k
    }

    /// Sub-block `s`'s scale and offset: `(d * sc, -(dmin * m))`, each product exact in f32
    /// (an f16 times an integer of at most 8 bits).
    pub fn sub_scale(&self, s: usize) -> (f32, f32) {
        let d = half::f16::from_le_bytes(self.d).to_f32();
        if self.bias != 0 {
            return (d * self.sc[s] as i8 as f32, -0.0);
        }
        let dmin = half::f16::from_le_bytes(self.dmin).to_f32();
        (d * self.sc[s] as f32, -(dmin * self.m[s] as f32))
    }
}

/// Q3_K's 16 sub-block scales (6 bits, unsigned) from its 12 packed bytes: the low 4 bits of
/// scale `s` are nibble `s / 8` of byte `s % 8`, its high 2 bits are pair `s / 4` of byte
/// `8 + s % 4` (ggml's `kmask` shuffle in `dequantize_row_q3_K`).
fn q3_k_scales(packed: &[u8]) -> [u8; 16] {
    std::array::from_fn(|s| {
        let low = (packed[s % 8] >> (4 * (s / 8))) & 0x0f;
        let high = (packed[8 + s % 4] >> (2 * (s / 4))) & 3;
        low | high << 4
    })
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
