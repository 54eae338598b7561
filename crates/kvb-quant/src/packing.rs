//! Packing codes tightly: one 8-bit, two 4-bit or four 2-bit codes per byte, earlier codes in the
//! lower bits.

use crate::Bits;

/// Packs `codes` (each below `2^bits`) into `ceil(len * bits / 8)` bytes.
pub fn pack(codes: &[u8], bits: Bits) -> Vec<u8> {
    match bits {
        Bits::Eight => codes.to_vec(),
        Bits::Four => codes
            .chunks(2)
            .map(|c| c[0] | c.get(1).map_or(0, |h| h << 4))
            .collect(),
        Bits::Two => codes
            .chunks(4)
            .map(|c| {
                c.iter()
                    .enumerate()
                    .fold(0u8, |b, (i, &v)| b | (v << (2 * i)))
            })
            .collect(),
    }
}

/// Unpacks the first `len` codes of `packed`.
pub fn unpack(packed: &[u8], bits: Bits, len: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(len);
    match bits {
        Bits::Eight => out.extend_from_slice(&packed[..len.min(packed.len())]),
        Bits::Four => {
            for &b in packed {
                out.push(b & 0x0f);
                out.push(b >> 4);
            }
        }
        Bits::Two => {
            for &b in packed {
                out.extend([b & 3, (b >> 2) & 3, (b >> 4) & 3, b >> 6]);
            }
        }
    }
    out.truncate(len);
    out
}

/// Bytes that `len` packed codes take.
pub fn packed_len(len: usize, bits: Bits) -> usize {
    (len * bits.count() as usize).div_ceil(8)
}
