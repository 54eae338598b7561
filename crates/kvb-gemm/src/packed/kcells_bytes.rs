//! Q5_K and Q6_K values assembled with byte permutes (AVX-512 VBMI), for the 16-lane f32
//! kernels: a run of 8 rows of two cells (128 weights) is joined from its nibbles and top bits
//! in 64-byte registers with a handful of instructions, where the 16-byte path
//! ([`super::kcells`]'s `six_bit_pair`) spends about ten per 32 weights.
//!
//! The rows are then made f32 with no conversion: the f32 of an integer of at most 6 bits has
//! only its top two bytes set, so each integer is looked up twice (those two bytes), and one
//! permute places two rows' top halves in each 32-bit lane, which a shift and a logical
//! instruction part. The weights are the integers themselves, so `fma(scale, q, offset)` keeps
//! their bits. Per 8 rows this takes 8 permutes where placing each row's integers and
//! converting them took 10 permutes and 8 conversions
//! (bench/results/2026-12-07-q6k-rows-without-conversion). On Zen 4 a permute takes a third of
//! an FMA's slot or more, a conversion the pipe the shifts share
//! (bench/results/2026-12-07-zen4-vector-pipes).
//!
//! The permutes are written as `asm!` so that the kernels, compiled for AVX-512F alone, take
//! them only where [`crate::cpu`] found VBMI (an intrinsic would need the whole kernel compiled
//! for it, and a kernel per feature set).

use super::kcells::{Layout, KIND_Q6K};
use super::GROUP;
use std::arch::asm;
use std::arch::x86_64::*;

/// `table[idx[j] % 64]` for each byte `j` (`vpermb`).
///
/// # Safety
/// The CPU has AVX-512 VBMI.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn look_up(idx: __m512i, table: __m512i) -> __m512i {
    let out: __m512i;
    // SAFETY: the caller found VBMI; the instruction reads only registers.
    unsafe {
        asm!(
            "vpermb {out}, {idx}, {table}",
            out = lateout(zmm_reg) out, idx = in(zmm_reg) idx, table = in(zmm_reg) table,
            options(pure, nomem, nostack, preserves_flags),
        )
    };
    out
}

/// The permutes and tables of one cell type, as bytes ([`Constants`] loads them).
#[repr(C, align(64))]
struct Tables {
    /// Spreads the run's top-bit bytes so that byte `32c + 8p + lane` holds the bits of rows
    /// `2p` and `2p + 1` (of cell `c`, lane `lane`).
    spread_high: [u8; 64],
    /// Per 64-bit lane (one `p`): the rotation that puts row `2p`'s top bits at bit 4.
    even_shift: [u64; 8],
    /// The same for row `2p + 1`.
    odd_shift: [u64; 8],
    /// A 6-bit index (Q5_K's with the bits above its fifth ignored) to byte 3 (sign and
    /// exponent) of the f32 of the integer the cell type defines.
    top: [u8; 64],
    /// The same index to byte 2 of that f32.
    second: [u8; 64],
    /// Per half `h` of a run: places each 32-bit lane's two 16-bit halves, the top halves of
    /// the f32 of row pairs `2h` (low half) and `2h + 1`, from [`Self::top`]'s bytes (indices
    /// below 64) and [`Self::second`]'s (64 and above).
    row_pairs: [[u8; 64]; 2],
}

impl Tables {
    /// Q6_K's tables, or Q5_K's with its values less `centre` (16 for Q5_0's 5-bit cells,
    /// [`super::five_bits`], whose nibbles and fifth bits are laid out as Q5_K's).
    const fn of(q6: bool, centre: i8) -> Tables {
        // Rotations of 64 bits: each byte's wanted bits move inside the byte (rotating by 62
        // moves them right by 2).
        let (even, odd): ([u64; 4], [u64; 4]) = if q6 {
            ([4, 0, 4, 0], [2, 62, 2, 62])
        } else {
            ([4, 2, 0, 62], [3, 1, 63, 61])
        };
        let mut t = Tables {
            spread_high: [0; 64],
            even_shift: [0; 8],
            odd_shift: [0; 8],
            top: [0; 64],
            second: [0; 64],
            row_pairs: [[0; 64]; 2],
        };
        let mut j = 0;
        while j < 64 {
            let (c, p, lane) = (j / 32, j % 32 / 8, j % 8);
            t.spread_high[j] = (if q6 {
                c * 16 + p / 2 * 8 + lane
            } else {
                c * 8 + lane
            }) as u8;
            let value = if q6 {
                j as i32 - 32
            } else {
                (j % 32) as i32 - centre as i32
            };
            // At most 6 significant bits: bytes 0 and 1 of the f32 are zero.
            let float = (value as f32).to_bits();
            t.top[j] = (float >> 24) as u8;
            t.second[j] = (float >> 16) as u8;
            let (k, mut h) = (j / 4, 0);
            while h < 2 {
                let from = (k / 8 * 32 + (2 * h + j % 4 / 2) * 8 + k % 8) as u8;
                // Bytes 0 and 2 from `second`, 1 and 3 from `top`.
                t.row_pairs[h][j] = if j % 2 == 0 { 64 + from } else { from };
                h += 1;
            }
            if j < 8 {
                t.even_shift[j] = even[j % 4];
                t.odd_shift[j] = odd[j % 4];
            }
            j += 1;
        }
        t
    }
}

static Q5K_TABLES: Tables = Tables::of(false, 0);
static Q6K_TABLES: Tables = Tables::of(true, 0);
static Q5_0_TABLES: Tables = Tables::of(false, 16);

/// [`Tables`] in registers (loaded once per cell).
pub(crate) struct Constants {
    spread_high: __m512i,
    even_shift: __m512i,
    odd_shift: __m512i,
    top: __m512i,
    second: __m512i,
    row_pairs: [__m512i; 2],
}

impl Constants {
    /// The constants of kind `K` (Q5_K or Q6_K).
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn of<const K: u8>() -> Constants {
        let t = if K == KIND_Q6K {
            &Q6K_TABLES
        } else {
            &Q5K_TABLES
        };
        Self::load(t)
    }

    /// The constants of 5-bit cells ([`super::five_bits`]), Q5_0's (`signed`) or Q5_1's: Q5_K's
    /// runs, with Q5_0's values less 16. [`run`] takes them with kind Q5_K and
    /// [`super::five_bits::layout`].
    ///
    /// # Safety
    /// The CPU has AVX-512F.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn five_bits(signed: bool) -> Constants {
        Self::load(if signed { &Q5_0_TABLES } else { &Q5K_TABLES })
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn load(t: &Tables) -> Constants {
        let load = |p: *const u8| _mm512_load_si512(p as *const _);
        Constants {
            spread_high: load(t.spread_high.as_ptr()),
            even_shift: load(t.even_shift.as_ptr() as *const u8),
            odd_shift: load(t.odd_shift.as_ptr() as *const u8),
            top: load(t.top.as_ptr()),
            second: load(t.second.as_ptr()),
            row_pairs: [0, 1].map(|h| load(t.row_pairs[h].as_ptr())),
        }
    }
}

/// The nibbles of rows `r0..r0 + 8` of the cells `[a, b]` side by side: `a`'s 32 bytes, then
/// `b`'s.
///
/// # Safety
/// AVX-512F is present; the cells are whole cells laid out as `at`.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn joined_nibbles([a, b]: [*const u8; 2], at: &Layout, r0: usize) -> __m512i {
    let o = at.nibbles + r0 / 2 * GROUP;
    _mm512_inserti64x4::<1>(
        _mm512_castsi256_si512(_mm256_loadu_si256(a.add(o) as *const __m256i)),
        _mm256_loadu_si256(b.add(o) as *const __m256i),
    )
}

/// Rows `r0..r0 + 8` of the cells `[a, b]` of kind `K` (a Q5_K or Q6_K cell of two groups
/// side by side), for [`rows`]: `[even, odd]`, each the top two bytes (`[3, 2]`) of the f32
/// of the integer [`super::kcells::parts`] defines for row `r0 + 2p` (or `+ 1`) of cell `c`,
/// lane `lane`, at `32c + 8p + lane`.
///
/// # Safety
/// The CPU has AVX-512 VBMI; the cells are whole cells of kind `K` laid out as `at`.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn run<const K: u8>(
    [a, b]: [*const u8; 2],
    at: &Layout,
    r0: usize,
    c: &Constants,
) -> [[__m512i; 2]; 2] {
    let nibbles = joined_nibbles([a, b], at, r0);
    let high = if K == KIND_Q6K {
        let o = at.high + r0 / 4 * GROUP;
        _mm512_castsi256_si512(_mm256_inserti128_si256::<1>(
            _mm256_castsi128_si256(_mm_loadu_si128(a.add(o) as *const __m128i)),
            _mm_loadu_si128(b.add(o) as *const __m128i),
        ))
    } else {
        let o = at.high + r0 / 8 * GROUP;
        _mm512_castsi128_si512(super::bytes16(a.add(o), b.add(o)))
    };
    let high = look_up(c.spread_high, high);
    let low4 = _mm512_set1_epi8(0x0f);
    // 0xca: the first operand's bits pick the second's, the rest come from the third.
    let even =
        _mm512_ternarylogic_epi64::<0xca>(low4, nibbles, _mm512_rolv_epi64(high, c.even_shift));
    let odd = _mm512_ternarylogic_epi64::<0xca>(
        low4,
        _mm512_srli_epi64::<4>(nibbles),
        _mm512_rolv_epi64(high, c.odd_shift),
    );
    // Lookups read an index's low 6 bits.
    [even, odd].map(|i| [look_up(i, c.top), look_up(i, c.second)])
}

/// Rows `4h` and `4h + 2` (of `even`) or `4h + 1` and `4h + 3` (of `odd`) of a [`run`] as 16
/// f32 each, the integers themselves: one permute places both rows' top halves in each 32-bit
/// lane, a shift and a logical instruction part them.
///
/// # Safety
/// The CPU has AVX-512 VBMI; `c` holds the run's constants.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn rows([top, second]: [__m512i; 2], h: usize, c: &Constants) -> [__m512; 2] {
    let mut both = top;
    // SAFETY: the caller found VBMI; the instruction reads only registers.
    unsafe {
        asm!(
            "vpermt2b {both}, {idx}, {second}",
            both = inout(zmm_reg) both, idx = in(zmm_reg) c.row_pairs[h], second = in(zmm_reg) second,
            options(pure, nomem, nostack, preserves_flags),
        )
    };
    [
        _mm512_castsi512_ps(_mm512_slli_epi32::<16>(both)),
        _mm512_castsi512_ps(_mm512_and_si512(both, _mm512_set1_epi32(-65536))),
    ]
}

/// The 8 rows of `U` pairs' [`run`]s, in order: `row(j, w)` with row `j`'s weights,
/// `fma(scale, q, offset)` per pair, `q` the integers as f32.
///
/// # Safety
/// The CPU has AVX-512 VBMI; `c` holds the runs' constants.
#[inline(always)]
pub(crate) unsafe fn run_rows<const U: usize>(
    runs: &[[[__m512i; 2]; 2]; U],
    c: &Constants,
    scale: &[__m512; U],
    offset: &[__m512; U],
    mut row: impl FnMut(usize, &[__m512; U]),
) {
    for h in 0..2 {
        // [parity][pair][row 4h + parity, row 4h + 2 + parity]
        let mut q = [[[_mm512_setzero_ps(); 2]; U]; 2];
        for i in 0..U {
            for (parity, by_pair) in q.iter_mut().enumerate() {
                by_pair[i] = rows(runs[i][parity], h, c);
            }
        }
        for later in 0..2 {
            for (parity, by_pair) in q.iter().enumerate() {
                let mut w = [_mm512_setzero_ps(); U];
                for i in 0..U {
                    w[i] = _mm512_fmadd_ps(scale[i], by_pair[i][later], offset[i]);
                }
                row(4 * h + 2 * later + parity, &w);
            }
        }
    }
}

/// Byte `4l + k` of [`nibble_lanes`]' result comes from byte `32 (l / 8) + 8k + l % 8` of the
/// two cells' joined nibbles: 32-bit lane `l` gathers column `l`'s four row pairs.
static NIBBLE_LANES: [u8; 64] = {
    let mut t = [0u8; 64];
    let mut j = 0;
    while j < 64 {
        let (l, k) = (j / 4, j % 4);
        t[j] = (l / 8 * 32 + k * 8 + l % 8) as u8;
        j += 1;
    }
    t
};

/// [`NIBBLE_LANES`] in a register (loaded once per call of a kernel).
///
/// # Safety
/// The CPU has AVX-512F.
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn nibble_lane_index() -> __m512i {
    _mm512_loadu_si512(NIBBLE_LANES.as_ptr() as *const __m512i)
}

/// Rows `r0..r0 + 8` (`r0` a multiple of 8) of two cells of 4-bit values (Q4_K, IQ4_XS: a
/// byte per column and pair of rows, the even row in its low nibble), with each 32-bit lane one
/// column's 8 nibbles, row `r0 + i` in bits `4i..4i + 4`. A row is then a shift and a lookup
/// (`_mm512_permutexvar_ps` reads an index's low 4 bits), where bytes widened per pair of rows
/// take a join, a widening and a shift (bench/results/2026-12-05-f32-decode-floor); Q4_K's
/// rows for 1 or 2 rows of x, a mask and a conversion ([`super::kcells::avx512::byte_rows`]).
///
/// # Safety
/// The CPU has AVX-512 VBMI; the cells are whole cells laid out as `at`; `index` is
/// [`nibble_lane_index`].
#[inline]
#[target_feature(enable = "avx512f")]
pub(crate) unsafe fn nibble_lanes(
    [a, b]: [*const u8; 2],
    at: &Layout,
    r0: usize,
    index: __m512i,
) -> __m512i {
    let nibbles = joined_nibbles([a, b], at, r0);
    look_up(index, nibbles)
}
