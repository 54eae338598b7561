//! Q5_0 and Q5_1 blocks at the file's bits ([`CellValues::FiveBits`]): a cell of 32 rows holds
//! the 8 columns' f16 scales (and Q5_1's f16 offsets, [`Scales`]), their values' low four bits
//! as [`CellValues::Nibbles`] holds them (byte `8 m + lane`: row `2m` low, `2m + 1` high), then a
//! plane of fifth bits laid out as Q5_K's ([`super::kcells`]): byte `8 t + lane` holds lane
//! `lane`'s rows `8t..8t + 8`, bit `i` row `8t + i`. Q5_0's values are `q - 16` with no offset
//! (its cells take [`Scales::HalfOnly`]), Q5_1's `q` with its offset ([`Scales::Half`]).
//!
//! [`CellValues::FiveBits`]: super::CellValues::FiveBits
//! [`CellValues::Nibbles`]: super::CellValues::Nibbles

use super::{Scales, CELL_ROWS, GROUP};

/// Bytes of a cell's nibbles, before its plane of fifth bits.
pub(crate) const NIBBLE_BYTES: usize = CELL_ROWS * GROUP / 2;

/// Where a cell's nibbles and fifth bits lie, in the terms of Q5_K's cells (the byte kernels
/// read both alike, [`super::kcells_bytes`]).
pub(crate) const fn layout(scales: Scales) -> super::kcells::Layout {
    let nibbles = scales.head_bytes();
    super::kcells::Layout {
        dmin: 0,
        sc: 0,
        m: 0,
        nibbles,
        high: nibbles + NIBBLE_BYTES,
        sub_rows: CELL_ROWS,
    }
}

/// Whether cells with `scales` hold Q5_0's signed values (`q - 16`).
pub(crate) fn signed(scales: Scales) -> bool {
    scales == Scales::HalfOnly
}

/// Row `r`, lane `lane` of a cell's values `v` (past its head): the stored integer, Q5_0's less
/// 16.
pub(crate) fn value(scales: Scales, v: &[u8], r: usize, lane: usize) -> i32 {
    let nibble = (v[r / 2 * GROUP + lane] >> (4 * (r % 2))) & 0x0f;
    let fifth = (v[NIBBLE_BYTES + r / 8 * GROUP + lane] >> (r % 8)) & 1;
    let q = (nibble | fifth << 4) as i32;
    if signed(scales) {
        q - 16
    } else {
        q
    }
}

/// Stores `q` (Q5_0's `-16..16`, Q5_1's `0..32`) as row `r`, lane `lane` of the zeroed values
/// `v` of a cell.
pub(crate) fn put(scales: Scales, v: &mut [u8], r: usize, lane: usize, q: i8) {
    let stored = if signed(scales) {
        q as i32 + 16
    } else {
        q as i32
    } as u8;
    debug_assert!(stored < 32, "{q} is not a 5-bit value of {scales:?} cells");
    v[r / 2 * GROUP + lane] |= (stored & 0x0f) << (4 * (r % 2));
    v[NIBBLE_BYTES + r / 8 * GROUP + lane] |= (stored >> 4) << (r % 8);
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use super::{GROUP, NIBBLE_BYTES};
    pub(crate) use crate::packed::kcells::avx2::{quarters, widen_bytes as widen};
    use std::arch::x86_64::*;

    /// Rows `r8..r8 + 8` (`r8` a multiple of 8) of a cell's values at `v` as bytes: the even
    /// rows and the odd rows, quarter `p` (64 bits, the 8 lanes) of each holding row
    /// `r8 + 2p` and `r8 + 2p + 1`; signed values (Q5_0's) less 16. The fifth bits move into
    /// place as Q5_K's do ([`crate::packed::kcells::avx2::run_bytes`]).
    #[inline(always)]
    pub(crate) unsafe fn run_bytes(v: *const u8, r8: usize, signed: bool) -> [__m256i; 2] {
        let low = _mm256_set1_epi8(0x0f);
        let n = _mm256_loadu_si256(v.add(r8 / 2 * GROUP) as *const __m256i);
        let (even, odd) = crate::packed::kcells::avx2::fifth_bits(v.add(NIBBLE_BYTES + r8));
        [
            join(_mm256_and_si256(n, low), even, signed),
            join(
                _mm256_and_si256(_mm256_srli_epi16::<4>(n), low),
                odd,
                signed,
            ),
        ]
    }

    /// Nibbles with their fifth bits (bit 0 of each byte of `bits`) put above them.
    #[inline(always)]
    unsafe fn join(nibbles: __m256i, bits: __m256i, signed: bool) -> __m256i {
        let fifth = _mm256_set1_epi8(0x10);
        let q = _mm256_or_si256(
            nibbles,
            _mm256_and_si256(_mm256_slli_epi16::<4>(bits), fifth),
        );
        if signed {
            _mm256_sub_epi8(q, fifth)
        } else {
            q
        }
    }
}
