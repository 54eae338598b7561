//! K-quant cells: a GGUF's Q2_K, Q3_K, Q4_K, Q5_K and Q6_K blocks kept at the file's bits per
//! weight, and IQ4_XS blocks (256 weights too) laid out as theirs.
//!
//! A cell is one K-quant block's 256 reduction rows for the 8 columns of a group, holding what
//! the 8 blocks hold, re-laid so that one 8-byte load feeds one 8-lane vector:
//! - the head: each column's super-block scale `d` (and for Q4_K/Q5_K its `dmin`) as the file's
//!   f16 bytes, then its sub-block scales (and mins) as bytes, sub-block by sub-block;
//! - the low 4 bits of every value, two rows per byte (row `2p` in the low nibble of byte
//!   `p * 8 + lane`, row `2p + 1` in the high one);
//! - Q5_K: the fifth bits, 8 rows per byte (row `r` in bit `r % 8` of byte `r / 8 * 8 + lane`);
//!   Q6_K: the top two bits, 4 rows per byte (bits `2 (r % 4)` of byte `r / 4 * 8 + lane`).
//!
//! The 8-bit products hold Q4_K, Q5_K, Q6_K and IQ4_XS cells with these planes re-laid in
//! their byte dot products' order ([`super::kcells_order`]; the head as here).
//!
//! A Q3_K cell has no nibbles: in their place its low bit pairs, 4 rows per byte as Q6_K's top
//! pairs, then its third bits, 8 rows per byte as Q5_K's fifth; its sub-block scales are the
//! file's 6-bit ones less 32, signed bytes as Q6_K's. A Q2_K cell holds only bit pairs, and
//! each sub-block's 4-bit scale and min in one byte per lane, as the file does (scale low).
//! An IQ4_XS cell holds Q4_K's nibbles, each an index into IQ4's table of 16 signed values,
//! and its sub-block scales (6 bits less 32) as signed bytes; it has no `dmin` or mins.
//!
//! Bits per weight: Q2_K 2.625 (the file's), Q3_K 3.5625 (file 3.4375: a byte for each 6-bit
//! scale), Q4_K 4.625 (file 4.5: bytes for the 6-bit scales and mins), Q5_K 5.625 (5.5), Q6_K
//! 6.5625 (the file's), IQ4_XS 4.3125 (4.25: a byte for each 6-bit scale). A weight's value is
//! computed as the file defines it ([`kvb_modelfile::gguf::blocks::KBlock`]):
//! `(q - bias) * (d * sc) + -(dmin * m)`, every product exact in f32, so the vector kernels,
//! which form `d * sc` in a register, give the same f32.

use super::kcells_order::CellOrder;
use super::{CellValues, GROUP};
use kvb_modelfile::gguf::blocks::{KBlock, IQ4_VALUES};

/// Rows of a K-quant cell (one block).
pub const ROWS: usize = 256;

/// Byte offsets inside a cell of `values` (a K-quant cell type).
#[derive(Clone, Copy)]
pub(crate) struct Layout {
    /// The `dmin` values (Q2_K, Q4_K, Q5_K; 0 for the signed types, which have none).
    pub dmin: usize,
    /// The sub-block scales, `[sub][lane]`.
    pub sc: usize,
    /// The sub-block mins, `[sub][lane]` (Q4_K, Q5_K; Q2_K's share the scales' bytes).
    pub m: usize,
    /// The nibbles (Q2_K and Q3_K: the low bit pairs).
    pub nibbles: usize,
    /// The high bits (Q3_K's third, Q5_K's fifth, Q6_K's top pair).
    pub high: usize,
    /// Rows per sub-block.
    pub sub_rows: usize,
}

impl Layout {
    pub(crate) const fn of(values: CellValues) -> Layout {
        match values {
            CellValues::Q6K => Layout {
                dmin: 0,
                sc: 16,
                m: 0,
                nibbles: 144,
                high: 144 + ROWS * GROUP / 2,
                sub_rows: 16,
            },
            CellValues::Q2K => Layout {
                dmin: 16,
                sc: 32,
                m: 32,
                nibbles: 160,
                high: 160 + ROWS * GROUP / 4,
                sub_rows: 16,
            },
            CellValues::Q3K => Layout {
                dmin: 0,
                sc: 16,
                m: 0,
                nibbles: 144,
                high: 144 + ROWS * GROUP / 4,
                sub_rows: 16,
            },
            CellValues::IQ4XS => Layout {
                dmin: 0,
                sc: 16,
                m: 0,
                nibbles: 80,
                high: 80 + ROWS * GROUP / 2,
                sub_rows: 32,
            },
            _ => Layout {
                dmin: 16,
                sc: 32,
                m: 96,
                nibbles: 160,
                high: 160 + ROWS * GROUP / 2,
                sub_rows: 32,
            },
        }
    }
}

/// The K-quant cell types as constants, for kernels instantiated per type ([`kind`]).
pub(crate) const KIND_Q4K: u8 = 0;
pub(crate) const KIND_Q5K: u8 = 1;
pub(crate) const KIND_Q6K: u8 = 2;
pub(crate) const KIND_Q3K: u8 = 3;
pub(crate) const KIND_Q2K: u8 = 4;
pub(crate) const KIND_IQ4XS: u8 = 5;

/// `values` as a kind constant (K-quant cell types only).
pub(crate) const fn kind(values: CellValues) -> u8 {
    match values {
        CellValues::Q5K => KIND_Q5K,
        CellValues::Q6K => KIND_Q6K,
        CellValues::Q3K => KIND_Q3K,
        CellValues::Q2K => KIND_Q2K,
        CellValues::IQ4XS => KIND_IQ4XS,
        _ => KIND_Q4K,
    }
}

pub(crate) const fn of_kind(kind: u8) -> CellValues {
    match kind {
        KIND_Q5K => CellValues::Q5K,
        KIND_Q6K => CellValues::Q6K,
        KIND_Q3K => CellValues::Q3K,
        KIND_Q2K => CellValues::Q2K,
        KIND_IQ4XS => CellValues::IQ4XS,
        _ => CellValues::Q4K,
    }
}

/// Whether `values`' integers are signed (stored less a bias) with no per-sub-block offset:
/// Q3_K, Q6_K and IQ4_XS, whose scales are signed bytes too.
pub(crate) const fn signed(values: CellValues) -> bool {
    matches!(
        values,
        CellValues::Q3K | CellValues::Q6K | CellValues::IQ4XS
    )
}

/// Whether the 16-lane (AVX-512) kernels take cells of `values`: Q2_K's and Q3_K's have only
/// the 8-lane ones (every CPU with AVX-512 has AVX2, FMA and F16C). IQ4_XS's take Q4_K's path
/// with IQ4's table in place of the nibbles' values.
pub(crate) const fn has_16_lanes(values: CellValues) -> bool {
    !matches!(values, CellValues::Q2K | CellValues::Q3K)
}

/// What `values`' stored integers are less: 4 for Q3_K, 32 for Q6_K, 128 for IQ4_XS (whose
/// values [`avx2::run_bytes`] gives as its table's entries plus 128), else 0.
pub(crate) const fn bias(values: CellValues) -> u8 {
    match values {
        CellValues::Q3K => 4,
        CellValues::Q6K => 32,
        CellValues::IQ4XS => 128,
        _ => 0,
    }
}

/// IQ4's table entries plus 128, as unsigned bytes (what an IQ4_XS cell's nibbles index).
pub(crate) const IQ4_STORED: [u8; 16] = {
    let mut t = [0u8; 16];
    let mut i = 0;
    while i < 16 {
        t[i] = (IQ4_VALUES[i] as i16 + 128) as u8;
        i += 1;
    }
    t
};

/// The nibble of each stored IQ4_XS integer ([`KBlock`]'s entry plus 128; 0 where no entry is).
const IQ4_INDEX: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 16 {
        t[IQ4_STORED[i] as usize] = i as u8;
        i += 1;
    }
    t
};

/// The nibble of IQ4's table entry `value` (IQ4_NL's cells keep their nibbles).
pub(crate) fn iq4_index(value: i8) -> u8 {
    IQ4_INDEX[(value as i16 + 128) as usize]
}

/// Calls `$run!(KIND)` with `$values`' kind as a constant (a K-quant cell type).
macro_rules! by_kind {
    ($values:expr, $run:ident) => {
        match $crate::packed::kcells::kind($values) {
            $crate::packed::kcells::KIND_Q5K => $run!({ $crate::packed::kcells::KIND_Q5K }),
            $crate::packed::kcells::KIND_Q6K => $run!({ $crate::packed::kcells::KIND_Q6K }),
            $crate::packed::kcells::KIND_Q3K => $run!({ $crate::packed::kcells::KIND_Q3K }),
            $crate::packed::kcells::KIND_Q2K => $run!({ $crate::packed::kcells::KIND_Q2K }),
            $crate::packed::kcells::KIND_IQ4XS => $run!({ $crate::packed::kcells::KIND_IQ4XS }),
            _ => $run!({ $crate::packed::kcells::KIND_Q4K }),
        }
    };
}
pub(crate) use by_kind;

/// Bytes of a cell's head (scales and mins).
pub(crate) fn head_bytes(values: CellValues) -> usize {
    Layout::of(values).nibbles
}

/// Bytes of the values of a cell (256 rows).
pub(crate) fn value_bytes(values: CellValues) -> usize {
    match values {
        CellValues::Q2K => ROWS * GROUP / 4,
        CellValues::Q3K => ROWS * GROUP / 4 + ROWS * GROUP / 8,
        CellValues::Q5K => ROWS * GROUP / 2 + ROWS * GROUP / 8,
        CellValues::Q6K => ROWS * GROUP / 2 + ROWS * GROUP / 4,
        _ => ROWS * GROUP / 2,
    }
}

/// Stores `blocks` (at most [`GROUP`]: the group's columns, in order) as the lanes of `cell`,
/// writing the cell's bytes in order, each once (a load re-lays every weight of the file);
/// lanes past the last block stay as they are.
pub(crate) fn put(values: CellValues, cell: &mut [u8], blocks: &[KBlock]) {
    let at = Layout::of(values);
    let signed = signed(values);
    for (lane, block) in blocks.iter().enumerate() {
        cell[lane * 2..lane * 2 + 2].copy_from_slice(&block.d);
        if !signed {
            cell[at.dmin + lane * 2..at.dmin + lane * 2 + 2].copy_from_slice(&block.dmin);
        }
        for s in 0..ROWS / at.sub_rows {
            cell[at.sc + s * GROUP + lane] = block.sc[s];
            if values == CellValues::Q2K {
                cell[at.sc + s * GROUP + lane] |= block.m[s] << 4;
            } else if !signed {
                cell[at.m + s * GROUP + lane] = block.m[s];
            }
        }
    }
    if values == CellValues::Q2K {
        put_plane(cell, at.nibbles, blocks, 2, |q| q);
        return;
    }
    if values == CellValues::Q3K {
        // `KBlock` reads a Q3_K value as Q6_K's (its 3 bits plus 28).
        put_plane(cell, at.nibbles, blocks, 2, |q| q.wrapping_sub(28));
        put_plane(cell, at.high, blocks, 1, |q| q.wrapping_sub(28) >> 2);
        return;
    }
    let nibble = |q: u8| {
        if values == CellValues::IQ4XS {
            IQ4_INDEX[q as usize]
        } else {
            q & 0x0f
        }
    };
    for p in 0..ROWS / 2 {
        let bytes = &mut cell[at.nibbles + p * GROUP..][..blocks.len()];
        for (byte, block) in bytes.iter_mut().zip(blocks) {
            *byte = nibble(block.q[2 * p]) | nibble(block.q[2 * p + 1]) << 4;
        }
    }
    match values {
        CellValues::Q5K => put_plane(cell, at.high, blocks, 1, |q| q >> 4),
        CellValues::Q6K => put_plane(cell, at.high, blocks, 2, |q| q >> 4),
        _ => {}
    }
}

/// Writes the low `bits` of `part(q)` of every row into the plane at `at`, `8 / bits` rows per
/// byte: row `r` of lane `lane` at bit `bits * (r % (8 / bits))` of byte
/// `at + r / (8 / bits) * 8 + lane`.
fn put_plane(cell: &mut [u8], at: usize, blocks: &[KBlock], bits: usize, part: impl Fn(u8) -> u8) {
    let (per_byte, mask) = (8 / bits, (1u8 << bits) - 1);
    for b in 0..ROWS / per_byte {
        let bytes = &mut cell[at + b * GROUP..][..blocks.len()];
        for (byte, block) in bytes.iter_mut().zip(blocks) {
            let run = &block.q[b * per_byte..(b + 1) * per_byte];
            *byte = run
                .iter()
                .enumerate()
                .fold(0u8, |acc, (i, &q)| acc | (part(q) & mask) << (bits * i));
        }
    }
}

/// Row `r`, lane `lane` of `cell` (its bits in `order`): its signed integer, and its
/// sub-block's scale and offset (the value is `q * scale + offset`, the product exact).
pub(crate) fn parts(
    values: CellValues,
    order: CellOrder,
    cell: &[u8],
    r: usize,
    lane: usize,
) -> (i32, f32, f32) {
    let at = Layout::of(values);
    let f16 = |o: usize| half::f16::from_le_bytes([cell[o], cell[o + 1]]).to_f32();
    // Row `r`'s `bits` in the plane at `o` (as [`put_plane`] wrote them, or re-laid).
    let plane = |o: usize, bits: usize| {
        let (byte, shift) = order.place(bits, r, lane);
        (cell[o + byte] >> shift) & ((1u8 << bits) - 1)
    };
    let s = r / at.sub_rows;
    let d = f16(lane * 2);
    let sc = cell[at.sc + s * GROUP + lane];
    if signed(values) {
        let q = match values {
            CellValues::Q3K => plane(at.nibbles, 2) | plane(at.high, 1) << 2,
            CellValues::IQ4XS => IQ4_STORED[plane(at.nibbles, 4) as usize],
            _ => plane(at.nibbles, 4) | plane(at.high, 2) << 4,
        };
        return (q as i32 - bias(values) as i32, d * sc as i8 as f32, -0.0);
    }
    let (q, sc, m) = match values {
        CellValues::Q2K => (plane(at.nibbles, 2), sc & 0x0f, sc >> 4),
        CellValues::Q5K => (
            plane(at.nibbles, 4) | plane(at.high, 1) << 4,
            sc,
            cell[at.m + s * GROUP + lane],
        ),
        _ => (plane(at.nibbles, 4), sc, cell[at.m + s * GROUP + lane]),
    };
    let offset = -(f16(at.dmin + lane * 2) * m as f32);
    (q as i32, d * sc as f32, offset)
}

/// Cells ahead whose lines the vector kernels ask for, a few lines per sub-block: a decode
/// step's weights come from memory, and the hardware prefetchers alone leave a product
/// waiting on them.
#[cfg(target_arch = "x86_64")]
pub(crate) const AHEAD: usize = 2;

/// Asks for part `s` of `parts` of the cell at `cell` (`bytes` long). `cell` may lie past the
/// data (a prefetch never faults).
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn prefetch_part(cell: *const u8, bytes: usize, s: usize, parts: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    let per = bytes.div_ceil(64).div_ceil(parts);
    for line in s * per..(s + 1) * per {
        // SAFETY: a prefetch is a hint; it reads nothing and never faults, whatever the
        // address (SSE, which every x86_64 has).
        unsafe { _mm_prefetch::<_MM_HINT_T0>(cell.wrapping_add(line * 64) as *const i8) };
    }
}

/// Rows `2p` and `2p + 1` of a run of 8 (a byte per lane: 8 or 16) of a Q5_K or Q6_K cell:
/// their low nibbles from `nibbles`, their top bits from the run's `high` bytes, joined in
/// bytes before widening (a 16-byte operation per row instead of several on 8 or 16 words);
/// Q6_K's values as signed bytes less 32: the integers [`parts`] defines.
///
/// # Safety
/// None beyond SSE2, which every x86_64 has.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
unsafe fn six_bit_pair<const K: u8>(
    nibbles: std::arch::x86_64::__m128i,
    high: [std::arch::x86_64::__m128i; 2],
    p: usize,
) -> [std::arch::x86_64::__m128i; 2] {
    use std::arch::x86_64::*;
    let mask = _mm_set1_epi8(0x0f);
    let lo = _mm_and_si128(nibbles, mask);
    let hi = _mm_and_si128(_mm_srli_epi16::<4>(nibbles), mask);
    // Each row's bits moved to bit 4 (16-bit shifts: what crosses a byte is masked off).
    let (lo_bits, hi_bits) = if K == KIND_Q6K {
        let (h, top) = (high[p / 2], _mm_set1_epi8(0x30));
        let (l, u) = if p.is_multiple_of(2) {
            (_mm_slli_epi16::<4>(h), _mm_slli_epi16::<2>(h))
        } else {
            (h, _mm_srli_epi16::<2>(h))
        };
        (_mm_and_si128(l, top), _mm_and_si128(u, top))
    } else {
        let (h, top) = (high[0], _mm_set1_epi8(0x10));
        let (l, u) = match p {
            0 => (_mm_slli_epi16::<4>(h), _mm_slli_epi16::<3>(h)),
            1 => (_mm_slli_epi16::<2>(h), _mm_slli_epi16::<1>(h)),
            2 => (h, _mm_srli_epi16::<1>(h)),
            _ => (_mm_srli_epi16::<2>(h), _mm_srli_epi16::<3>(h)),
        };
        (_mm_and_si128(l, top), _mm_and_si128(u, top))
    };
    let (lo, hi) = (_mm_or_si128(lo, lo_bits), _mm_or_si128(hi, hi_bits));
    if K == KIND_Q6K {
        let bias = _mm_set1_epi8(32);
        [_mm_sub_epi8(lo, bias), _mm_sub_epi8(hi, bias)]
    } else {
        [lo, hi]
    }
}

/// AVX2 pieces (8 lanes: one group).
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use super::*;
    use std::arch::x86_64::*;

    /// The 8 bytes at `p`, zero- or sign-extended to i32 lanes.
    #[inline(always)]
    pub(crate) unsafe fn bytes(p: *const u8, signed: bool) -> __m256i {
        let raw = _mm_loadl_epi64(p as *const __m128i);
        if signed {
            _mm256_cvtepi8_epi32(raw)
        } else {
            _mm256_cvtepu8_epi32(raw)
        }
    }

    /// Rows `r8..r8 + 8` (`r8` a multiple of 8) of a cell of kind `K`, their values joined in
    /// bytes 32 at a time: rows `r8`, `r8 + 2`, `r8 + 4`, `r8 + 6` in the 64-bit quarters of the
    /// first register, the odd rows in the second, each quarter the 8 lanes' values as stored
    /// (Q3_K's and Q6_K's unsigned, before their [`bias`]; IQ4_XS's nibbles looked up in
    /// [`IQ4_STORED`]). Q5_K's fifth bits and Q6_K's top pairs shift into place by a variable
    /// shift per quarter.
    ///
    /// # Safety
    /// AVX2 is present; `cell` points at a whole cell of kind `K`.
    #[inline(always)]
    pub(crate) unsafe fn run_bytes<const K: u8>(cell: *const u8, r8: usize) -> [__m256i; 2] {
        let values = of_kind(K);
        let at = Layout::of(values);
        match values {
            CellValues::Q2K => return pair_run_bytes(cell, &at, r8),
            CellValues::Q3K => return q3k_run_bytes(cell, &at, r8),
            _ => {}
        }
        let low = _mm256_set1_epi8(0x0f);
        let v = _mm256_loadu_si256(cell.add(at.nibbles + r8 / 2 * GROUP) as *const __m256i);
        let (mut lo, mut hi) = (
            _mm256_and_si256(v, low),
            _mm256_and_si256(_mm256_srli_epi16::<4>(v), low),
        );
        // Each quarter's even and odd rows' high bits, moved to the bottom of their bytes.
        let (even, odd, top) = match values {
            CellValues::Q5K => {
                let (even, odd) = fifth_bits(cell.add(at.high + r8));
                (even, odd, 0x10)
            }
            CellValues::Q6K => {
                let pair = _mm_loadu_si128(cell.add(at.high + r8 / 4 * GROUP) as *const __m128i);
                let h = _mm256_permute4x64_epi64::<0b01_01_00_00>(_mm256_castsi128_si256(pair));
                let even = _mm256_srlv_epi64(h, _mm256_setr_epi64x(0, 4, 0, 4));
                (even, _mm256_srli_epi64::<2>(even), 0x30)
            }
            CellValues::IQ4XS => return iq4_stored([lo, hi]),
            _ => return [lo, hi],
        };
        let top = _mm256_set1_epi8(top);
        lo = _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16::<4>(even), top));
        hi = _mm256_or_si256(hi, _mm256_and_si256(_mm256_slli_epi16::<4>(odd), top));
        [lo, hi]
    }

    /// IQ4_XS's nibbles in `nibbles` (a byte each) as the table's entries plus 128
    /// ([`IQ4_STORED`]).
    ///
    /// # Safety
    /// AVX2 is present.
    #[inline(always)]
    pub(crate) unsafe fn iq4_stored(nibbles: [__m256i; 2]) -> [__m256i; 2] {
        let table = _mm_loadu_si128(IQ4_STORED.as_ptr() as *const __m128i);
        let table = _mm256_broadcastsi128_si256(table);
        nibbles.map(|n| _mm256_shuffle_epi8(table, n))
    }

    /// A run's fifth bits at `high` (8 bytes: byte `lane`, bit `i` for the run's row `i`, Q5_K's
    /// plane and Q5_0's and Q5_1's) for its even and its odd rows: bit 0 of byte `lane` of
    /// quarter `p` holds row `2p`'s (or `2p + 1`'s).
    #[inline(always)]
    pub(crate) unsafe fn fifth_bits(high: *const u8) -> (__m256i, __m256i) {
        let h = _mm256_set1_epi64x((high as *const i64).read_unaligned());
        let even = _mm256_srlv_epi64(h, _mm256_setr_epi64x(0, 2, 4, 6));
        (even, _mm256_srli_epi64::<1>(even))
    }

    /// The four 8-byte rows of a half of [`run_bytes`] (a row per 64-bit quarter), each in the
    /// low 64 bits.
    #[inline(always)]
    pub(crate) unsafe fn quarters(v: __m256i) -> [__m128i; 4] {
        let (a, b) = (_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        [a, _mm_unpackhi_epi64(a, a), b, _mm_unpackhi_epi64(b, b)]
    }

    /// The 8 bytes in the low 64 bits of `q` widened to i32 lanes, as signed values or not.
    #[inline(always)]
    pub(crate) unsafe fn widen_bytes(q: __m128i, signed: bool) -> __m256i {
        if signed {
            _mm256_cvtepi8_epi32(q)
        } else {
            _mm256_cvtepu8_epi32(q)
        }
    }

    /// [`run_bytes`] for a cell of bit pairs (Q2_K's values, Q3_K's low bits): they shift into
    /// place as Q6_K's top pairs do.
    #[inline(always)]
    unsafe fn pair_run_bytes(cell: *const u8, at: &Layout, r8: usize) -> [__m256i; 2] {
        let pair = _mm_loadu_si128(cell.add(at.nibbles + r8 / 4 * GROUP) as *const __m128i);
        let h = _mm256_permute4x64_epi64::<0b01_01_00_00>(_mm256_castsi128_si256(pair));
        let even = _mm256_srlv_epi64(h, _mm256_setr_epi64x(0, 4, 0, 4));
        let pairs = _mm256_set1_epi8(3);
        [
            _mm256_and_si256(even, pairs),
            _mm256_and_si256(_mm256_srli_epi64::<2>(even), pairs),
        ]
    }

    /// [`run_bytes`] for a Q3_K cell: its low pairs ([`pair_run_bytes`]), its third bits
    /// shifted into place as Q5_K's fifth.
    #[inline(always)]
    unsafe fn q3k_run_bytes(cell: *const u8, at: &Layout, r8: usize) -> [__m256i; 2] {
        let [lo, hi] = pair_run_bytes(cell, at, r8);
        let t = _mm256_set1_epi64x((cell.add(at.high + r8) as *const i64).read_unaligned());
        let even = _mm256_srlv_epi64(t, _mm256_setr_epi64x(0, 2, 4, 6));
        let third = _mm256_set1_epi8(4);
        let lo_third = _mm256_and_si256(_mm256_slli_epi16::<2>(even), third);
        let hi_third = _mm256_and_si256(_mm256_slli_epi16::<1>(even), third);
        [_mm256_or_si256(lo, lo_third), _mm256_or_si256(hi, hi_third)]
    }

    /// Sub-block `s`'s scales and mins of the cell of kind `K` at `cell`, 8 lanes of i32: the
    /// scales signed for Q3_K, Q6_K and IQ4_XS (whose mins are zero), Q2_K's two nibbles of one
    /// byte.
    ///
    /// # Safety
    /// AVX2 is present; `cell` points at a whole cell of kind `K`.
    #[inline(always)]
    pub(crate) unsafe fn sub_ints<const K: u8>(cell: *const u8, s: usize) -> (__m256i, __m256i) {
        let values = of_kind(K);
        let at = Layout::of(values);
        let sc = bytes(cell.add(at.sc + s * GROUP), signed(values));
        match values {
            CellValues::Q2K => (
                _mm256_and_si256(sc, _mm256_set1_epi32(0x0f)),
                _mm256_srli_epi32::<4>(sc),
            ),
            _ if signed(values) => (sc, _mm256_setzero_si256()),
            _ => (sc, bytes(cell.add(at.m + s * GROUP), false)),
        }
    }

    /// Calls `row(r, w)` with each row's weights of `U` cells of kind `K` (one per group, `w[i]` from
    /// `cells[i]`), in row order: per sub-block each cell's scale `d * sc` and offset
    /// `-(dmin * m)` formed once (exact products), then `fma(scale, q, offset)` per row, as the
    /// portable [`super::parts`] defines them. The `U` cells' rows come together so that a
    /// product has `U` independent chains of multiply-adds (one chain per column is the f32
    /// order, and alone it waits on the multiply-add's latency).
    ///
    /// # Safety
    /// AVX2, FMA and F16C are present; `cells` point at whole cells of `values`.
    #[inline]
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(crate) unsafe fn each_row<const U: usize, const K: u8>(
        cells: [*const u8; U],
        ahead: [*const u8; U],
        mut row: impl FnMut(usize, &[__m256; U]),
    ) {
        // The type as a constant, so that no test of it is left in the loops.
        let values = of_kind(K);
        let at = Layout::of(values);
        let signed = signed(values);
        let mut d = [_mm256_setzero_ps(); U];
        let mut dmin = [_mm256_setzero_ps(); U];
        for i in 0..U {
            d[i] = _mm256_cvtph_ps(_mm_loadu_si128(cells[i] as *const __m128i));
            dmin[i] = _mm256_cvtph_ps(_mm_loadu_si128(cells[i].add(at.dmin) as *const __m128i));
        }
        let sign = _mm256_set1_ps(-0.0);
        let low = _mm256_set1_epi32(0x0f);
        let mut scale = [_mm256_setzero_ps(); U];
        let mut offset = [sign; U];
        let (subs, bytes_of_cell) = (ROWS / at.sub_rows, values.cell_bytes(ROWS));
        for s in 0..subs {
            for cell in ahead {
                prefetch_part(cell, bytes_of_cell, s, subs);
            }
            for i in 0..U {
                let (sc, m) = sub_ints::<K>(cells[i], s);
                scale[i] = _mm256_mul_ps(d[i], _mm256_cvtepi32_ps(sc));
                if !signed {
                    let m = _mm256_cvtepi32_ps(m);
                    offset[i] = _mm256_xor_ps(_mm256_mul_ps(dmin[i], m), sign);
                }
            }
            // Rows in runs of 8 (one byte of Q5_K's fifth bits, two of Q6_K's top bits).
            for run in 0..at.sub_rows / 8 {
                let r0 = s * at.sub_rows + run * 8;
                if values != CellValues::Q4K {
                    // Per group, the run's even and odd rows' bytes, a row per 64-bit quarter.
                    let mut runs = [[[_mm_setzero_si128(); 4]; 2]; U];
                    for (i, q) in runs.iter_mut().enumerate() {
                        for (half, v) in run_bytes::<K>(cells[i], r0).into_iter().enumerate() {
                            let v = if signed {
                                _mm256_sub_epi8(v, _mm256_set1_epi8(bias(values) as i8))
                            } else {
                                v
                            };
                            q[half] = quarters(v);
                        }
                    }
                    for p in 0..4 {
                        for half in 0..2 {
                            let w: [__m256; U] = std::array::from_fn(|i| {
                                let q = widen_bytes(runs[i][half][p], signed);
                                _mm256_fmadd_ps(scale[i], _mm256_cvtepi32_ps(q), offset[i])
                            });
                            row(r0 + 2 * p + half, &w);
                        }
                    }
                    continue;
                }
                for p in 0..4 {
                    let r = r0 + 2 * p;
                    let mut lo = [_mm256_setzero_si256(); U];
                    let mut hi = [_mm256_setzero_si256(); U];
                    for i in 0..U {
                        let nib = bytes(cells[i].add(at.nibbles + r / 2 * GROUP), false);
                        lo[i] = _mm256_and_si256(nib, low);
                        hi[i] = _mm256_srli_epi32::<4>(nib);
                    }
                    let mut w = [_mm256_setzero_ps(); U];
                    for i in 0..U {
                        w[i] = _mm256_fmadd_ps(scale[i], _mm256_cvtepi32_ps(lo[i]), offset[i]);
                    }
                    row(r, &w);
                    for i in 0..U {
                        w[i] = _mm256_fmadd_ps(scale[i], _mm256_cvtepi32_ps(hi[i]), offset[i]);
                    }
                    row(r + 1, &w);
                }
            }
        }
    }
}

/// AVX-512 pieces (16 lanes: the same cell of two groups side by side).
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use super::super::dequant::avx512::bytes16;
    use super::super::kcells_bytes;
    use super::*;
    use std::arch::x86_64::*;

    /// 8 bytes at `a` and 8 at `b`, zero- or sign-extended to 16 i32 lanes.
    #[inline(always)]
    unsafe fn bytes([a, b]: [*const u8; 2], at: usize, signed: bool) -> __m512i {
        let raw = bytes16(a.add(at), b.add(at));
        if signed {
            _mm512_cvtepi8_epi32(raw)
        } else {
            _mm512_cvtepu8_epi32(raw)
        }
    }

    /// The 8 f16 at `a + at` and the 8 at `b + at` as 16 f32 lanes.
    #[inline(always)]
    unsafe fn halves([a, b]: [*const u8; 2], at: usize) -> __m512 {
        _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(
            _mm256_castsi128_si256(_mm_loadu_si128(a.add(at) as *const __m128i)),
            _mm_loadu_si128(b.add(at) as *const __m128i),
        ))
    }

    /// The 16 values of a nibble as f32, indexed by the nibble: `_mm512_permutexvar_ps` reads
    /// only an index's low 4 bits, so a lookup takes a nibble in place of a mask and a
    /// conversion (one instruction where the conversion's port is the busiest).
    #[inline(always)]
    pub(crate) unsafe fn nibble_values() -> __m512 {
        _mm512_setr_ps(
            0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
        )
    }

    /// Q4_K's 8 rows of [`kcells_bytes::nibble_lanes`] (a column's nibbles per 32-bit lane):
    /// `row(j, w)` with row `j`'s weights, `scale * q + offset`, for j in 0..8. Each byte's two
    /// rows are masked in place and converted, the high nibble as `16 q` by `sixteenth`
    /// (`scale / 16`): the same product, exactly. So one shift serves two rows where a shift
    /// and a lookup per row took the vector pipes the FMAs share on Zen 4
    /// (bench/results/2026-12-06-q4k-rows-in-place-zen4: 1.06x on one row).
    #[inline(always)]
    pub(crate) unsafe fn byte_rows<const U: usize>(
        lanes: &mut [__m512i; U],
        scale: &[__m512; U],
        sixteenth: &[__m512; U],
        offset: &[__m512; U],
        mut row: impl FnMut(usize, &[__m512; U]),
    ) {
        let halves = [
            (_mm512_set1_epi32(0x0f), scale),
            (_mm512_set1_epi32(0xf0), sixteenth),
        ];
        for b in 0..4 {
            if b > 0 {
                for l in lanes.iter_mut() {
                    *l = _mm512_srli_epi32::<8>(*l);
                }
            }
            for (half, (nibble, by)) in halves.iter().enumerate() {
                row(2 * b + half, &masked_weights(lanes, *nibble, by, offset));
            }
        }
    }

    /// `by * (lanes & nibble) + offset` per lane: a nibble masked in place (the high one of a
    /// byte as `16 q`, which `by`, a sixteenth of the scale, takes back exactly), converted and
    /// formed into its weight.
    #[inline(always)]
    pub(crate) unsafe fn masked_weights<const U: usize>(
        lanes: &[__m512i; U],
        nibble: __m512i,
        by: &[__m512; U],
        offset: &[__m512; U],
    ) -> [__m512; U] {
        let mut w = [_mm512_setzero_ps(); U];
        for i in 0..U {
            let q = _mm512_cvtepi32_ps(_mm512_and_si512(lanes[i], nibble));
            w[i] = _mm512_fmadd_ps(by[i], q, offset[i]);
        }
        w
    }

    /// [`nibble_values`] for IQ4_XS and IQ4_NL: their table's 16 entries as f32.
    #[inline(always)]
    pub(crate) unsafe fn iq4_values() -> __m512 {
        _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128(
            IQ4_VALUES.as_ptr() as *const __m128i
        )))
    }

    /// [`super::avx2::each_row`] for `U` pairs of groups: `w[i]` holds row `r`'s 16 weights of
    /// pair `i` (the cell of `cells[i][0]` in the low 8 lanes); each lane computed as the 8-lane
    /// kernel does. With `BYTES`, Q5_K and Q6_K values are assembled by byte permutes, and
    /// Q4_K's and IQ4_XS's nibbles gathered a column per 32-bit lane
    /// ([`super::super::kcells_bytes`]), to the same bits; with `few_rows` too (1 or 2 rows
    /// of x), Q4_K's rows are taken from those lanes by [`byte_rows`].
    ///
    /// # Safety
    /// AVX-512F is present, and AVX-512 VBMI with `BYTES`; `cells` point at whole cells of
    /// `values`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn each_row<const U: usize, const K: u8, const BYTES: bool>(
        cells: [[*const u8; 2]; U],
        ahead: [[*const u8; 2]; U],
        few_rows: bool,
        mut row: impl FnMut(usize, &[__m512; U]),
    ) {
        // The type as a constant, so that no test of it is left in the loops.
        let values = of_kind(K);
        assert!(
            has_16_lanes(values),
            "{values:?} cells take the 8-lane kernels"
        );
        let at = Layout::of(values);
        let (q6, signed) = (values == CellValues::Q6K, signed(values));
        // Q5_K's and Q6_K's high bits; Q4_K and IQ4_XS have only nibbles.
        let high_bits = matches!(values, CellValues::Q5K | CellValues::Q6K);
        let mut d = [_mm512_setzero_ps(); U];
        let mut dmin = [_mm512_setzero_ps(); U];
        for i in 0..U {
            d[i] = halves(cells[i], 0);
            dmin[i] = halves(cells[i], at.dmin);
        }
        let sign = _mm512_castps_si512(_mm512_set1_ps(-0.0));
        let nibble_values = if values == CellValues::IQ4XS {
            iq4_values()
        } else {
            nibble_values()
        };
        let by_bytes = BYTES && high_bits;
        let constants = if by_bytes {
            Some(kcells_bytes::Constants::of::<K>())
        } else {
            None
        };
        // 4-bit cells with VBMI: a column's 8 rows of nibbles per 32-bit lane.
        let lanes_index = if BYTES && !high_bits {
            Some(kcells_bytes::nibble_lane_index())
        } else {
            None
        };
        let mut scale = [_mm512_setzero_ps(); U];
        // Q4_K's rows masked in place for 1 and 2 rows (`byte_rows`; at 4 and 8 rows the
        // lookup measured 2-3% faster), with the scales over 16 for the high nibbles.
        let in_place = lanes_index.is_some() && values == CellValues::Q4K && few_rows;
        let mut sixteenth = [_mm512_setzero_ps(); U];
        let mut offset = [_mm512_castsi512_ps(sign); U];
        let (subs, bytes_of_cell) = (ROWS / at.sub_rows, values.cell_bytes(ROWS));
        for s in 0..subs {
            for cell in ahead.iter().flatten() {
                prefetch_part(*cell, bytes_of_cell, s, subs);
            }
            for i in 0..U {
                let sc = bytes(cells[i], at.sc + s * GROUP, signed);
                scale[i] = _mm512_mul_ps(d[i], _mm512_cvtepi32_ps(sc));
                if !signed {
                    let m = _mm512_cvtepi32_ps(bytes(cells[i], at.m + s * GROUP, false));
                    let dm = _mm512_castps_si512(_mm512_mul_ps(dmin[i], m));
                    offset[i] = _mm512_castsi512_ps(_mm512_xor_si512(dm, sign));
                }
                if in_place {
                    // Exact: a K-quant scale is zero or at least 2^-24 (an f16 times a whole
                    // number), so a sixteenth of it is a normal f32 or zero.
                    sixteenth[i] = _mm512_mul_ps(scale[i], _mm512_set1_ps(1.0 / 16.0));
                }
            }
            for run in 0..at.sub_rows / 8 {
                let r0 = s * at.sub_rows + run * 8;
                if let Some(c) = &constants {
                    let mut runs = [[[_mm512_setzero_si512(); 2]; 2]; U];
                    for i in 0..U {
                        runs[i] = kcells_bytes::run::<K>(cells[i], &at, r0, c);
                    }
                    kcells_bytes::run_rows(&runs, c, &scale, &offset, |j, w| row(r0 + j, w));
                    continue;
                }
                if high_bits {
                    let mut high = [[_mm_setzero_si128(); 2]; U];
                    for (i, h) in high.iter_mut().enumerate() {
                        let [a, b] = cells[i];
                        let at_high = |row: usize| at.high + row * GROUP;
                        match values {
                            CellValues::Q5K => {
                                h[0] = bytes16(a.add(at_high(r0 / 8)), b.add(at_high(r0 / 8)))
                            }
                            _ => {
                                h[0] = bytes16(a.add(at_high(r0 / 4)), b.add(at_high(r0 / 4)));
                                let o = at_high(r0 / 4 + 1);
                                h[1] = bytes16(a.add(o), b.add(o));
                            }
                        }
                    }
                    for p in 0..4 {
                        let r = r0 + 2 * p;
                        let mut w = [[_mm512_setzero_ps(); U]; 2];
                        for i in 0..U {
                            let [a, b] = cells[i];
                            let o = at.nibbles + r / 2 * GROUP;
                            let [lo, hi] =
                                six_bit_pair::<K>(bytes16(a.add(o), b.add(o)), high[i], p);
                            for (half, q) in [lo, hi].into_iter().enumerate() {
                                let q = if q6 {
                                    _mm512_cvtepi8_epi32(q)
                                } else {
                                    _mm512_cvtepu8_epi32(q)
                                };
                                w[half][i] =
                                    _mm512_fmadd_ps(scale[i], _mm512_cvtepi32_ps(q), offset[i]);
                            }
                        }
                        row(r, &w[0]);
                        row(r + 1, &w[1]);
                    }
                    continue;
                }
                if let Some(index) = lanes_index {
                    let mut lanes = [_mm512_setzero_si512(); U];
                    for i in 0..U {
                        lanes[i] = kcells_bytes::nibble_lanes(cells[i], &at, r0, index);
                    }
                    if in_place {
                        byte_rows(&mut lanes, &scale, &sixteenth, &offset, |b, w| {
                            row(r0 + b, w)
                        });
                        continue;
                    }
                    for r in r0..r0 + 8 {
                        let mut w = [_mm512_setzero_ps(); U];
                        for i in 0..U {
                            let q = _mm512_permutexvar_ps(lanes[i], nibble_values);
                            w[i] = _mm512_fmadd_ps(scale[i], q, offset[i]);
                            lanes[i] = _mm512_srli_epi32::<4>(lanes[i]);
                        }
                        row(r, &w);
                    }
                    continue;
                }
                for p in 0..4 {
                    let r = r0 + 2 * p;
                    let mut lo = [_mm512_setzero_si512(); U];
                    let mut hi = [_mm512_setzero_si512(); U];
                    for i in 0..U {
                        // Looked up (`nibble_values`, IQ4_XS's table): the low nibble needs no
                        // mask.
                        lo[i] = bytes(cells[i], at.nibbles + r / 2 * GROUP, false);
                        hi[i] = _mm512_srli_epi32::<4>(lo[i]);
                    }
                    let mut w = [_mm512_setzero_ps(); U];
                    for i in 0..U {
                        let q = _mm512_permutexvar_ps(lo[i], nibble_values);
                        w[i] = _mm512_fmadd_ps(scale[i], q, offset[i]);
                    }
                    row(r, &w);
                    for i in 0..U {
                        let q = _mm512_permutexvar_ps(hi[i], nibble_values);
                        w[i] = _mm512_fmadd_ps(scale[i], q, offset[i]);
                    }
                    row(r + 1, &w);
                }
            }
        }
    }
}
