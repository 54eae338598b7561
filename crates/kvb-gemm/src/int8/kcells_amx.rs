//! AMX's tile products over K-quant cells with sub-blocks of 32 rows (Q4_K, Q5_K, IQ4_XS),
//! 16 rows by two groups (16 columns) a call: a prefill's products. (A tile product over Q6_K's
//! 16-row sub-blocks costs about what one over 32 does, and measured slower than VNNI.)
//!
//! A pass of rows first decodes the two groups' cells once ([`DecodedPair`]): each run as the
//! VNNI pair kernel decodes it ([`super::kcells_x86`]: rows 0-3 and 4-7 of 16 lanes, 4 bytes a
//! lane), which is the layout a tile product takes its second operand in (4 reduction rows a
//! 32-bit column), and each sub-block's scales and offsets in f32. Then per 16 rows and
//! sub-block, one `tdpbsud` (signed activations by unsigned stored values) gives the 16 x 16
//! exact integer sums that the VNNI kernel gets from 128 `vpdpbusd`, and the float steps are
//! that kernel's, in its order, so the bits are the same ([`super::kcells::portable`]'s).
//! The tile instructions run one after another, beside the vector ones: a sub-block's sums
//! are read [`LAG`] sub-blocks after the tiles store them, so the float steps of one overlap
//! the tile products of the next (bench/results/2026-12-08-amx-tiles).

use super::kcells_x86::PairCells;
use super::{QuantizedRows, BLOCK};
use crate::amx::TileConfig;
use crate::packed::kcells::{self, kind, of_kind, Layout, KIND_IQ4XS, KIND_Q4K, KIND_Q5K, ROWS};
use crate::packed::{CellValues, PackedMatrix, GROUP};
use std::arch::asm;
use std::arch::x86_64::*;

/// Rows of a tile product (AMX's 16).
pub(super) const TILE_ROWS: usize = 16;
/// Sub-blocks between a tile product and the float steps that read its sums.
const LAG: usize = 2;
/// Sums in flight: the tile sets (0-2, 3-5) alternate, and [`LAG`] more wait to be read.
const RING: usize = 4;

/// 64 bytes on a line of their own: a tile row of decoded values, or 16 sums.
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Line([u8; 64]);

/// Two groups' cells decoded for the tile products of a pass of rows: every run's rows 0-3 and
/// 4-7 (tile rows of 16 lanes, 4 reduction rows a lane), and each sub-block's 16 scales and
/// offsets (`-(dmin * m)`; `-0.0` for the signed types).
pub(super) struct DecodedPair {
    runs: Vec<Line>,
    scales: Vec<__m512>,
    offsets: Vec<__m512>,
    /// The ring the tile products store their sums in, 16 lines a sub-block ([`RING`] of them):
    /// made once per task, each line written by the tiles before the float steps read it.
    sums: Vec<Line>,
}

impl DecodedPair {
    pub(super) fn new() -> DecodedPair {
        DecodedPair {
            runs: Vec::new(),
            scales: Vec::new(),
            offsets: Vec::new(),
            sums: vec![Line([0; 64]); RING * TILE_ROWS],
        }
    }
}

/// Whether the tile products take cells of `values` (sub-blocks of 32 rows).
pub(super) fn takes(values: CellValues) -> bool {
    matches!(
        values,
        CellValues::Q4K | CellValues::Q5K | CellValues::IQ4XS
    )
}

/// Groups `g` and `g + 1` of `w` into `into`.
///
/// # Safety
/// The CPU has AVX2, F16C, AVX-512 F and BW; `g + 1` is a group of `w`, whose cells the tile
/// products take ([`takes`]).
pub(super) unsafe fn decode_pair(w: &PackedMatrix, g: usize, into: &mut DecodedPair) {
    let values = w.cell_values();
    assert!(g + 1 < w.n().div_ceil(GROUP) && takes(values));
    let cells = (w.group_cells(g).as_ptr(), w.group_cells(g + 1).as_ptr());
    match kind(values) {
        KIND_Q4K => decode::<KIND_Q4K>(w.k(), cells, into),
        KIND_Q5K => decode::<KIND_Q5K>(w.k(), cells, into),
        KIND_IQ4XS => decode::<KIND_IQ4XS>(w.k(), cells, into),
        _ => unreachable!("{values:?}: not taken"),
    }
}

#[target_feature(enable = "avx2,f16c,avx512f,avx512bw")]
unsafe fn decode<const K: u8>(
    k: usize,
    (cells_a, cells_b): (*const u8, *const u8),
    into: &mut DecodedPair,
) {
    let sub = Layout::of(of_kind(K)).sub_rows;
    let cell_bytes = of_kind(K).cell_bytes(ROWS);
    let cells = PairCells::new();
    into.runs.clear();
    into.scales.clear();
    into.offsets.clear();
    // Every line written below, in place.
    into.runs.reserve(k / 4);
    into.scales.reserve(k / sub);
    into.offsets.reserve(k / sub);
    for c in 0..k / ROWS {
        let pair = (cells_a.add(c * cell_bytes), cells_b.add(c * cell_bytes));
        let heads = cells.heads::<K>(pair);
        for s in 0..ROWS / sub {
            let (scale, offset) = cells.sub_scales::<K>(pair, heads, s);
            into.scales.push(scale);
            into.offsets.push(offset);
        }
        for r8 in (0..ROWS).step_by(8) {
            let [rows03, rows47] = cells.run::<K>(pair, r8);
            let at = into.runs.len();
            let lines = into.runs.spare_capacity_mut().as_mut_ptr() as *mut __m512i;
            _mm512_store_si512(lines, rows03);
            _mm512_store_si512(lines.add(1), rows47);
            into.runs.set_len(at + 2);
        }
    }
}

/// Rows `r0..r0 + 16` of `a` against the two groups of `w` decoded in `pair`, into `out` (row
/// `r`'s 16 lanes at `r * 16`).
///
/// # Safety
/// The CPU has AVX-512 F, and AMX-TILE and AMX-INT8 granted to this process
/// (`crate::amx::usable`); `pair` is [`decode_pair`]'s for two groups of `w`.
pub(super) unsafe fn tile_pair(
    a: &QuantizedRows,
    r0: usize,
    w: &PackedMatrix,
    pair: &mut DecodedPair,
    out: &mut [f32],
) {
    let values = w.cell_values();
    let sub = Layout::of(values).sub_rows;
    assert!(
        r0 + TILE_ROWS <= a.m
            && a.k == w.k()
            && a.k <= u16::MAX as usize
            && pair.runs.len() == a.k / 4
            && pair.scales.len() == a.k / sub
            && pair.offsets.len() == a.k / sub
            && out.len() >= TILE_ROWS * 2 * GROUP
            && takes(values)
    );
    match kind(values) {
        KIND_IQ4XS => run::<KIND_IQ4XS>(a, r0, pair, out),
        _ => run::<KIND_Q4K>(a, r0, pair, out),
    }
}

/// [`tile_pair`] for cells of kind `K` (Q4_K's steps serve Q5_K's: the same sub-blocks and
/// float steps once decoded; IQ4_XS's are signed, with no offsets).
#[target_feature(enable = "avx512f")]
unsafe fn run<const K: u8>(a: &QuantizedRows, r0: usize, pair: &mut DecodedPair, out: &mut [f32]) {
    let values = of_kind(K);
    let signed = kcells::signed(values);
    let sub = Layout::of(values).sub_rows;
    let (k, blocks) = (a.k, a.k / BLOCK);
    // Tile 0: the sums; 1: the rows' integers of one sub-block; 2: its decoded runs; 3-5 the
    // same again, for the next sub-block.
    let shapes = [
        (TILE_ROWS as u8, 64),
        (TILE_ROWS as u8, sub as u16),
        ((sub / 4) as u8, 64),
    ];
    let config = TileConfig::new(&[
        shapes[0], shapes[1], shapes[2], shapes[0], shapes[1], shapes[2],
    ]);
    let sums = &mut pair.sums;
    let x = a.q.as_ptr().add(r0 * k);
    let runs = pair.runs.as_ptr();
    let mut y = [_mm512_setzero_ps(); TILE_ROWS];
    let subs = k / sub;
    asm!("ldtilecfg [{}]", in(reg) &config, options(nostack, readonly));
    for j in 0..subs + LAG {
        if j < subs {
            let row0 = j * sub;
            let (x, runs, sums) = (
                x.add(row0),
                runs.add(row0 / 4),
                sums[j % RING * TILE_ROWS..].as_mut_ptr(),
            );
            // One tile set (sums, integers, runs) or the other, named in the instructions.
            macro_rules! tile_step {
                ($c:literal, $a:literal, $b:literal) => {
                    asm!(
                        concat!("tilezero ", $c),
                        concat!("tileloadd ", $a, ", [{x} + {k}]"),
                        concat!("tileloadd ", $b, ", [{runs} + {line}]"),
                        concat!("tdpbsud ", $c, ", ", $a, ", ", $b),
                        concat!("tilestored [{sums} + {line}], ", $c),
                        x = in(reg) x, k = in(reg) k, runs = in(reg) runs, sums = in(reg) sums,
                        line = in(reg) 64usize, options(nostack),
                    )
                };
            }
            // SAFETY: tiles as configured above: 16 rows of `sub` integers at stride k from
            // row r0's `row0` (inside `a`), the sub-block's decoded runs, its 16 sums' lines.
            if j % 2 == 0 {
                tile_step!("tmm0", "tmm1", "tmm2");
            } else {
                tile_step!("tmm3", "tmm4", "tmm5");
            }
        }
        if j < LAG {
            continue;
        }
        // The float steps of sub-block `j - LAG`, the VNNI kernel's.
        let done = j - LAG;
        let (row0, sums) = (done * sub, &sums[done % RING * TILE_ROWS..]);
        let (scale, offset) = (pair.scales[done], pair.offsets[done]);
        // Unrolled, so that the outputs stay in registers.
        macro_rules! step {
            ($($i:literal)*) => {$(
                let mut isum = _mm512_load_si512(sums[$i].0.as_ptr() as *const __m512i);
                if signed {
                    let sum = a.sub_block_sum(r0 + $i, row0, sub);
                    let bias = kcells::bias(values) as i32;
                    isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(bias * sum));
                }
                let b = (r0 + $i) * blocks + row0 / BLOCK;
                let dx = _mm512_set1_ps(*a.scale.get_unchecked(b));
                y[$i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(scale, dx), y[$i]);
                if !signed {
                    let sx = _mm512_set1_ps(a.sub_block_scaled_sum(r0 + $i, row0, sub));
                    y[$i] = _mm512_fmadd_ps(offset, sx, y[$i]);
                }
            )*};
        }
        step!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15);
    }
    asm!("tilerelease", options(nostack, nomem));
    for (i, y) in y.iter().enumerate() {
        _mm512_storeu_ps(out.as_mut_ptr().add(i * 2 * GROUP), *y);
    }
}
