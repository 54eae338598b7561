//! Where a K-quant cell keeps each row's bits: in row order as loaded ([`CellOrder::Rows`],
//! [`super::kcells`]'s layout, which the f32 products read), or in the order of the 8-bit
//! products' byte dot products ([`CellOrder::Dot`]).
//!
//! `vpdpbusd` adds 4 byte products per 32-bit lane, so it wants each column's rows 4 to a
//! lane. In row order a run of 8 rows is 32 bytes, 8 columns side by side per pair of rows,
//! and the one-row 8-bit product spent more time turning it around (two unpacks and two
//! permutes per run) than reading it from memory. In dot order the same 32 bytes hold, at
//! byte `4 lane + i`, row `i` of the run in the low nibble and row `i + 4` in the high one:
//! a mask and a shift give the two registers the products multiply. The high bits follow
//! suit, so that one variable shift per 64-bit quarter puts them beside their nibbles:
//! - Q5_K's fifth bits (8 bytes a run): byte `4 (lane % 2) + i % 4`, bit `lane / 2 + 4 (i / 4)`;
//! - Q6_K's top pairs (16 bytes a run): byte `8 (lane / 2 % 2) + 4 (lane % 2) + i % 4`, bits
//!   `2 (lane / 4) + 4 (i / 4)`.
//!
//! Each run keeps its bytes (the same span of the cell), the head is untouched, and the bits
//! are the file's: only their places change, at load, under `--activations q8`.

use super::kcells::{Layout, ROWS};
use super::{CellValues, GROUP};

/// The order of a K-quant cell's value bits (see the module doc).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CellOrder {
    /// As loaded: rows in pairs (nibbles), eights (fifth bits) or fours (top pairs) per byte,
    /// the 8 columns side by side.
    Rows,
    /// The 8-bit products' order: each column's rows 4 to a 32-bit lane.
    Dot,
}

impl CellOrder {
    /// The order the 8-bit products read cells of `values` in: dot order for the types with
    /// nibbles (Q4_K, Q5_K, Q6_K, IQ4_XS); Q2_K's and Q3_K's bit pairs stay in row order.
    pub(crate) const fn for_int8(values: CellValues) -> CellOrder {
        match values {
            CellValues::Q4K | CellValues::Q5K | CellValues::Q6K | CellValues::IQ4XS => {
                CellOrder::Dot
            }
            _ => CellOrder::Rows,
        }
    }

    /// Row `r`'s `bits` (4: a nibble; 1: Q5_K's fifth or Q3_K's third; 2: Q6_K's top pair or
    /// Q2_K's and Q3_K's low pair) of lane `lane` in a plane of a cell in this order: its byte
    /// in the plane and the shift of its lowest bit.
    #[inline]
    pub(crate) const fn place(self, bits: usize, r: usize, lane: usize) -> (usize, usize) {
        let (run, i) = (r / 8, r % 8);
        match (self, bits) {
            (CellOrder::Dot, 4) => (run * 32 + 4 * lane + i % 4, 4 * (i / 4)),
            (CellOrder::Dot, 1) => (run * 8 + 4 * (lane % 2) + i % 4, lane / 2 + 4 * (i / 4)),
            (CellOrder::Dot, 2) => (
                run * 16 + 8 * (lane / 2 % 2) + 4 * (lane % 2) + i % 4,
                2 * (lane / 4) + 4 * (i / 4),
            ),
            _ => {
                let per_byte = 8 / bits;
                (r / per_byte * GROUP + lane, bits * (r % per_byte))
            }
        }
    }
}

/// The planes of a cell of `values` that dot order moves: (offset, bits per row).
fn planes(values: CellValues) -> Vec<(usize, usize)> {
    let at = Layout::of(values);
    match values {
        CellValues::Q5K => vec![(at.nibbles, 4), (at.high, 1)],
        CellValues::Q6K => vec![(at.nibbles, 4), (at.high, 2)],
        _ => vec![(at.nibbles, 4)],
    }
}

/// `cell` (one cell of `values`, in row order) re-laid in dot order, in place.
pub(crate) fn to_dot_order(values: CellValues, cell: &mut [u8]) {
    debug_assert_eq!(CellOrder::for_int8(values), CellOrder::Dot);
    for (at, bits) in planes(values) {
        let plane = &mut cell[at..at + ROWS * GROUP * bits / 8];
        #[cfg(target_arch = "x86_64")]
        if bits == 4 && std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: AVX2 was just found; `plane` is a whole plane of nibbles.
            unsafe { nibbles_to_dot_order_avx2(plane) };
            continue;
        }
        plane_to_dot_order(bits, plane);
    }
}

/// One plane of `bits` per row (a whole cell's) re-laid from row order into dot order, run by
/// run. Both orders number a run's bits by the bits of (row, lane, bit), each in its own
/// place, so dot order moves whole index bits: the 1- and 2-bit planes take a few swaps of
/// index bits a 64-bit word ([`IndexSwaps`]); nibbles go through [`NIBBLE_MOVES`].
fn plane_to_dot_order(bits: usize, plane: &mut [u8]) {
    match bits {
        1 => {
            for run in plane.chunks_exact_mut(8) {
                let word = u64::from_le_bytes(run.try_into().expect("8 bytes"));
                run.copy_from_slice(&FIFTH_BITS.apply(word).to_le_bytes());
            }
        }
        2 => {
            for run in plane.chunks_exact_mut(16) {
                let (lo, hi) = run.split_at_mut(8);
                let (a, b) = top_pairs_halves(
                    u64::from_le_bytes((&*lo).try_into().expect("8 bytes")),
                    u64::from_le_bytes((&*hi).try_into().expect("8 bytes")),
                );
                lo.copy_from_slice(&TOP_PAIRS.apply(a).to_le_bytes());
                hi.copy_from_slice(&TOP_PAIRS.apply(b).to_le_bytes());
            }
        }
        _ => {
            let mut rows = [0u8; 32];
            for run in plane.chunks_exact_mut(32) {
                rows.copy_from_slice(run);
                run.fill(0);
                for &[from, from_shift, to, to_shift] in &NIBBLE_MOVES {
                    run[to as usize] |= ((rows[from as usize] >> from_shift) & 0x0f) << to_shift;
                }
            }
        }
    }
}

/// A permutation of a 64-bit word that moves whole bits of the index: the bit at index `x`
/// goes to the index whose bit `to[j]` is bit `j` of `x`. Done as swaps of two index bits,
/// each a delta swap (a mask and a shift); unused swaps have an empty mask.
struct IndexSwaps([(u64, u32); 6]);

impl IndexSwaps {
    const fn new(to: [usize; 6]) -> IndexSwaps {
        // `at[j]`: where index bit `j` of the source sits after the swaps so far.
        let mut at = [0, 1, 2, 3, 4, 5];
        let mut swaps = [(0u64, 0u32); 6];
        let mut n = 0;
        let mut p = 0;
        while p < 6 {
            let mut j = 0;
            while to[j] != p {
                j += 1;
            }
            let c = at[j];
            if c != p {
                let (a, b) = if c < p { (c, p) } else { (p, c) };
                // Bits whose index has bit a set and bit b clear trade places with those
                // 2^b - 2^a above them, which have the reverse.
                let mut mask = 0u64;
                let mut x = 0;
                while x < 64 {
                    if (x >> a) & 1 == 1 && (x >> b) & 1 == 0 {
                        mask |= 1 << x;
                    }
                    x += 1;
                }
                swaps[n] = (mask, (1 << b) - (1 << a));
                n += 1;
                let mut k = 0;
                while at[k] != p {
                    k += 1;
                }
                at[k] = c;
                at[j] = p;
            }
            p += 1;
        }
        IndexSwaps(swaps)
    }

    #[inline]
    fn apply(&self, mut word: u64) -> u64 {
        for &(mask, shift) in &self.0 {
            let t = ((word >> shift) ^ word) & mask;
            word ^= t ^ (t << shift);
        }
        word
    }
}

/// Q5_K's fifth bits, a run a word: index bits (row 0-2, lane 0-2) in row order go to
/// (lane 1, lane 2, row 2, row 0, row 1, lane 0) in dot order.
const FIFTH_BITS: IndexSwaps = IndexSwaps::new([3, 4, 2, 5, 0, 1]);

/// Q6_K's top pairs, a run two words: index bits (bit, row 0, row 1, lane 0-2, row 2) in row
/// order go to (bit, lane 2, row 2, row 0, row 1, lane 0, lane 1) in dot order. The word
/// (index bit 6) is row 2's in row order and lane 1's in dot order: [`top_pairs_halves`]
/// swaps index bits 6 and 4 across the two words, then each word moves as this says.
const TOP_PAIRS: IndexSwaps = IndexSwaps::new([0, 3, 4, 5, 2, 1]);

/// A run of top pairs' two words with index bits 6 and 4 swapped: the low word's bits with
/// bit 4 set trade places with the high word's 16 below them.
#[inline]
fn top_pairs_halves(lo: u64, hi: u64) -> (u64, u64) {
    const BIT4_CLEAR: u64 = 0x0000_ffff_0000_ffff;
    let t = ((lo >> 16) ^ hi) & BIT4_CLEAR;
    (lo ^ (t << 16), hi ^ t)
}

/// Each of a run's 64 nibbles (rows and lanes) as (byte, shift) in row order, then in dot
/// order.
const NIBBLE_MOVES: [[u8; 4]; 64] = {
    let mut all = [[0u8; 4]; 64];
    let mut e = 0;
    while e < 64 {
        let (r, lane) = (e / GROUP, e % GROUP);
        let (from, from_shift) = CellOrder::Rows.place(4, r, lane);
        let (to, to_shift) = CellOrder::Dot.place(4, r, lane);
        all[e] = [from as u8, from_shift as u8, to as u8, to_shift as u8];
        e += 1;
    }
    all
};

/// [`plane_to_dot_order`] for nibbles with AVX2, 32 bytes (a run of 8 rows) at a time: the
/// unpacks and permutes the 8-bit products did per run before this order existed, done once.
///
/// # Safety
/// The CPU has AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn nibbles_to_dot_order_avx2(plane: &mut [u8]) {
    use std::arch::x86_64::*;
    let low = _mm256_set1_epi8(0x0f);
    for run in plane.chunks_exact_mut(32) {
        let v = _mm256_loadu_si256(run.as_ptr() as *const __m256i);
        // Even rows and odd rows of the 8 lanes, a row per 8 bytes.
        let (even, odd) = (
            _mm256_and_si256(v, low),
            _mm256_and_si256(_mm256_srli_epi16::<4>(v), low),
        );
        // Rows (r, r + 1) per 16 bits, then 4 rows per 32 bits, then each lane's rows 0-3 and
        // 4-7 in lane order.
        let (pa, pb) = (
            _mm256_unpacklo_epi8(even, odd),
            _mm256_unpackhi_epi8(even, odd),
        );
        let (w03, w47) = (_mm256_unpacklo_epi16(pa, pb), _mm256_unpackhi_epi16(pa, pb));
        let rows03 = _mm256_permute2x128_si256::<0x20>(w03, w47);
        let rows47 = _mm256_permute2x128_si256::<0x31>(w03, w47);
        let dot = _mm256_or_si256(rows03, _mm256_slli_epi16::<4>(rows47));
        _mm256_storeu_si256(run.as_mut_ptr() as *mut __m256i, dot);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Dot order places every row's bits of every lane once: the places of a run's rows and
    /// lanes cover its bytes' bits exactly, within the run's span of the plane.
    #[test]
    fn dot_order_is_a_permutation_of_each_runs_bits() {
        for bits in [4, 1, 2] {
            let run_bytes = 8 * GROUP * bits / 8;
            let mut seen = vec![0u8; ROWS * GROUP * bits / 8];
            for r in 0..ROWS {
                for lane in 0..GROUP {
                    let (byte, shift) = CellOrder::Dot.place(bits, r, lane);
                    assert!(shift + bits <= 8, "bits {bits}, row {r}, lane {lane}");
                    assert_eq!(byte / run_bytes, r / 8, "bits {bits}: row {r} left its run");
                    let mask = ((1u8 << bits) - 1) << shift;
                    assert_eq!(
                        seen[byte] & mask,
                        0,
                        "bits {bits}: row {r}, lane {lane} twice"
                    );
                    seen[byte] |= mask;
                }
            }
            assert!(
                seen.iter().all(|&b| b == 0xff),
                "bits {bits}: a bit left unused"
            );
        }
    }

    /// The re-laying of a plane (by run, and with AVX2 for nibbles) puts each row's bits where
    /// [`CellOrder::place`] says, on arbitrary bytes.
    #[test]
    fn re_laid_planes_put_each_rows_bits_in_its_place() {
        let mut state = 0x2545_f491_4f6c_dd1du64;
        for bits in [4, 1, 2] {
            let rows: Vec<u8> = (0..ROWS * GROUP * bits / 8)
                .map(|_| {
                    state ^= state << 13;
                    state ^= state >> 7;
                    state ^= state << 17;
                    state as u8
                })
                .collect();
            let mut want = vec![0u8; rows.len()];
            let mask = (1u8 << bits) - 1;
            for r in 0..ROWS {
                for lane in 0..GROUP {
                    let (from, shift) = CellOrder::Rows.place(bits, r, lane);
                    let (to, to_shift) = CellOrder::Dot.place(bits, r, lane);
                    want[to] |= ((rows[from] >> shift) & mask) << to_shift;
                }
            }
            let mut by_runs = rows.clone();
            plane_to_dot_order(bits, &mut by_runs);
            assert_eq!(by_runs, want, "bits {bits}, by runs");
            #[cfg(target_arch = "x86_64")]
            if bits == 4 && std::arch::is_x86_feature_detected!("avx2") {
                let mut avx2 = rows.clone();
                // SAFETY: AVX2 was just found.
                unsafe { nibbles_to_dot_order_avx2(&mut avx2) };
                assert_eq!(avx2, want, "nibbles with AVX2");
            }
        }
    }
}
