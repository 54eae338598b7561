//! The x86 kernels of [`super::kcells`]: one group's 8 columns, a cell's values decoded once per
//! tile of rows, or with AVX2 (tiles of 4 rows) once per pass of up to 64 rows
//! ([`decode_group`]; bench/results/2026-11-28-avx2-k-quant-kernels).
//!
//! Cells with nibbles (Q4_K, Q5_K, Q6_K, IQ4_XS) are in dot order
//! ([`crate::packed::kcells_order`]): one load, a mask and a shift give the 8 lanes' rows 0-3,
//! 4 consecutive rows per 32-bit lane, in one register and rows 4-7 in another ([`dot_run`]).
//! Q2_K's and Q3_K's bit pairs, in row order, are joined in bytes ([`run_bytes`]) and turned
//! around by two unpacks and two permutes. Each half takes one broadcast of the row's 4
//! activation bytes, and one byte dot product adds 4 rows per lane: AVX-512 VNNI's
//! `vpdpbusd` on 8 lanes (16 in the two-group tile), or AVX2's `vpmaddubsw` and `vpmaddwd`
//! (values at most 63 times bytes at most 127: no pair saturates, and two pairs' sums fit 16
//! bits). The integer sums are exact, and the float steps are [`super::kcells::portable`]'s,
//! so the bits are the same.

use super::kcells::MAX_TILE_ROWS;
use super::products::Kernel;
use super::{QuantizedRows, BLOCK};
use crate::packed::kcells::avx2::{bytes, iq4_stored, run_bytes, sub_ints};
use crate::packed::kcells::{
    self, of_kind, Layout, KIND_IQ4XS, KIND_Q2K, KIND_Q3K, KIND_Q4K, KIND_Q5K, KIND_Q6K, ROWS,
};
use crate::packed::{CellOrder, CellValues, PackedMatrix, GROUP};
use std::arch::x86_64::*;

/// Calls `$f::<ROWS, KIND>$args` for `$rows` (one of the literals) and `$values`' kind.
macro_rules! by_shape {
    ($rows:expr, $values:expr, $f:ident $args:tt: $($r:literal)*) => {
        match ($rows, crate::packed::kcells::kind($values)) {
            $(
                ($r, KIND_Q4K) => $f::<$r, KIND_Q4K> $args,
                ($r, KIND_Q5K) => $f::<$r, KIND_Q5K> $args,
                ($r, KIND_Q6K) => $f::<$r, KIND_Q6K> $args,
                ($r, KIND_Q3K) => $f::<$r, KIND_Q3K> $args,
                ($r, KIND_Q2K) => $f::<$r, KIND_Q2K> $args,
                ($r, KIND_IQ4XS) => $f::<$r, KIND_IQ4XS> $args,
            )*
            _ => unreachable!("rows checked above"),
        }
    };
}

/// Rows `r0..r0 + rows` of `a` against group `g` of `w` (K-quant cells), into `out` (row `r`'s
/// 8 lanes at `r * 8`).
///
/// # Safety
/// The CPU has AVX2, FMA and F16C, and for [`Kernel::Vnni512`] AVX-512 VL and VNNI; `a` holds
/// rows `r0..r0 + rows` (1 to 4 for AVX2, to 8 for VNNI) of width `w.k()`; `g` is a group of `w`.
pub(super) unsafe fn tile(
    kernel: Kernel,
    a: &QuantizedRows,
    r0: usize,
    rows: usize,
    w: &PackedMatrix,
    g: usize,
    out: &mut [f32],
) {
    let limit = if kernel == Kernel::Vnni512 {
        MAX_TILE_ROWS
    } else {
        4
    };
    assert!(
        (1..=limit).contains(&rows)
            && r0 + rows <= a.m
            && a.k == w.k()
            && g < w.n().div_ceil(GROUP)
            && out.len() >= rows * GROUP
            && w.cell_values().is_k_quant()
    );
    let cells = w.group_cells(g).as_ptr();
    let values = w.cell_values();
    if kernel == Kernel::Vnni512 {
        by_shape!(rows, values, run_vnni(a, r0, cells, out): 1 2 3 4 5 6 7 8)
    } else {
        by_shape!(rows, values, run_avx2(a, r0, cells, out): 1 2 3 4)
    }
}

/// Cells ahead whose lines a kernel asks for while it works on one, a few per sub-block: a
/// decode step's weights come from memory, and the hardware prefetchers alone kept these
/// kernels at about half the machine's bandwidth.
const AHEAD: usize = 2;

/// One run of 8 rows of a K-quant cell (`r8` a multiple of 8) as the byte dot products take
/// it: the 8 lanes' rows 0-3, 4 per 32-bit lane, and their rows 4-7 (values as stored,
/// Q3_K's and Q6_K's unsigned). Cells in dot order ([`dot_run`]) hold them so; Q2_K's and
/// Q3_K's, in row order, are turned around.
///
/// # Safety
/// AVX2 is present; `cell` points at a whole cell of kind `K`, in the order
/// [`CellOrder::for_int8`] gives.
#[inline(always)]
unsafe fn run_of<const K: u8>(cell: *const u8, r8: usize) -> [__m256i; 2] {
    if matches!(CellOrder::for_int8(of_kind(K)), CellOrder::Dot) {
        return dot_run::<K>(cell, r8);
    }
    let [lo, hi] = run_bytes::<K>(cell, r8);
    // Rows (r, r + 1) per 16 bits, then rows r..r + 4 per 32 bits (lanes 0-3 and 4-7 apart),
    // then lanes 0-7 of rows 0-3 and of rows 4-7.
    let (pa, pb) = (_mm256_unpacklo_epi8(lo, hi), _mm256_unpackhi_epi8(lo, hi));
    let (w03, w47) = (_mm256_unpacklo_epi16(pa, pb), _mm256_unpackhi_epi16(pa, pb));
    [
        _mm256_permute2x128_si256::<0x20>(w03, w47),
        _mm256_permute2x128_si256::<0x31>(w03, w47),
    ]
}

/// A run of a cell of kind `K` in dot order ([`crate::packed::kcells_order`]): byte `4 j + i`
/// of its 32 nibble bytes holds lane `j`'s rows `i` (low) and `i + 4` (high), so a mask and a
/// shift give both halves; Q5_K's fifth bits and Q6_K's top pairs reach their bytes by one
/// variable shift per 64-bit quarter (quarter `q` holds lanes `2 q` and `2 q + 1`).
///
/// # Safety
/// AVX2 is present; `cell` points at a whole cell of kind `K` in dot order.
#[inline(always)]
unsafe fn dot_run<const K: u8>(cell: *const u8, r8: usize) -> [__m256i; 2] {
    let values = of_kind(K);
    let at = Layout::of(values);
    let low = _mm256_set1_epi8(0x0f);
    let v = _mm256_loadu_si256(cell.add(at.nibbles + r8 / 2 * GROUP) as *const __m256i);
    let lo = _mm256_and_si256(v, low);
    let hi = _mm256_and_si256(_mm256_srli_epi16::<4>(v), low);
    // The high bits of rows 0-3 at bit 0 of their bytes, of rows 4-7 at bit 4.
    let (high, top) = match values {
        CellValues::Q5K => {
            let word = (cell.add(at.high + r8) as *const i64).read_unaligned();
            let shift = _mm256_setr_epi64x(0, 1, 2, 3);
            (_mm256_srlv_epi64(_mm256_set1_epi64x(word), shift), 0x10)
        }
        CellValues::Q6K => {
            let pairs = _mm_loadu_si128(cell.add(at.high + r8 / 4 * GROUP) as *const __m128i);
            let shift = _mm256_setr_epi64x(0, 0, 2, 2);
            (
                _mm256_srlv_epi64(_mm256_broadcastsi128_si256(pairs), shift),
                0x30,
            )
        }
        CellValues::IQ4XS => return iq4_stored([lo, hi]),
        _ => return [lo, hi],
    };
    let top = _mm256_set1_epi8(top);
    [
        _mm256_or_si256(lo, _mm256_and_si256(_mm256_slli_epi16::<4>(high), top)),
        _mm256_or_si256(hi, _mm256_and_si256(high, top)),
    ]
}

/// A run's two 4-row halves `w` by a row's activations `x` (4 bytes a lane each), added to
/// the row's `sums[0]` with AVX2's `vpmaddubsw`: the halves' 16-bit pair sums are added before
/// widening (each at most 63 x 128 x 2, so two stay within 16 bits). IQ4_XS's values (its
/// table's entries, signed: [`avx2_run`]) are multiplied as `|w|` times `x` with `w`'s sign
/// moved onto `x` (`vpsignb`), at most 127 x 127 x 2 a pair, and widened half by half.
macro_rules! dot_avx2 {
    ($sums:expr, $w:expr, $x:expr, $R:ident, $K:ident) => {{
        let ones = _mm256_set1_epi16(1);
        if $K == KIND_IQ4XS {
            for half in 0..2 {
                let (w, x) = ($w[half], $x[half]);
                let pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w));
                $sums[half] = _mm256_add_epi32($sums[half], _mm256_madd_epi16(pairs, ones));
            }
        } else {
            let pairs = _mm256_add_epi16(
                _mm256_maddubs_epi16($w[0], $x[0]),
                _mm256_maddubs_epi16($w[1], $x[1]),
            );
            $sums[0] = _mm256_add_epi32($sums[0], _mm256_madd_epi16(pairs, ones));
        }
    }};
}

/// [`run_of`] as AVX2's products take it: IQ4_XS's values back to signed (less their bias of
/// 128: `vpmaddubsw`'s unsigned bytes could not take them plus 128 without saturating).
///
/// # Safety
/// AVX2 is present; `cell` points at a whole cell of kind `K`.
#[inline(always)]
unsafe fn avx2_run<const K: u8>(cell: *const u8, r8: usize) -> [__m256i; 2] {
    let run = run_of::<K>(cell, r8);
    if K == KIND_IQ4XS {
        let bias = _mm256_set1_epi8(i8::MIN);
        return run.map(|w| _mm256_xor_si256(w, bias));
    }
    run
}

/// The bias AVX2's products take off a sub-block's sum ([`kcells::bias`], but none for the
/// signed values of [`avx2_run`]).
const fn avx2_bias(values: CellValues) -> i32 {
    if matches!(values, CellValues::IQ4XS) {
        0
    } else {
        kcells::bias(values) as i32
    }
}

/// The same with VNNI's `vpdpbusd`: two chains for few rows (its latency), and with more the
/// rows' chains overlap and one sum per row leaves registers for more rows.
macro_rules! dot_vnni {
    ($sums:expr, $w:expr, $x:expr, $R:ident, $K:ident) => {{
        $sums[0] = _mm256_dpbusd_epi32($sums[0], $w[0], $x[0]);
        let second = if $R < 4 { 1 } else { 0 };
        $sums[second] = _mm256_dpbusd_epi32($sums[second], $w[1], $x[1]);
    }};
}

/// The kernel's body, with `$dot` the byte dot product, `$run(cell, c, r8)` the rows of cell
/// `c`'s run at `r8` and `$bias` what the run's values are more than the cell's integers (taken
/// off each sub-block's sum with the rows' sums: `kcells::bias` for the signed types).
macro_rules! body {
    (
        $dot:ident, $run:expr, $bias:expr,
        $R:ident, $K:ident, $a:ident, $r0:ident, $cells:ident, $out:ident
    ) => {{
        let values = of_kind($K);
        let at = Layout::of(values);
        let signed = kcells::signed(values);
        let cell_bytes = values.cell_bytes(ROWS);
        let (k, blocks) = ($a.k, $a.k / BLOCK);
        let sign = _mm256_set1_ps(-0.0);
        let x = $a.q.as_ptr().add($r0 * k) as *const u8;
        let mut y = [_mm256_setzero_ps(); $R];
        let subs = ROWS / at.sub_rows;
        let lines_per_sub = cell_bytes.div_ceil(64).div_ceil(subs);
        for c in 0..k / ROWS {
            let cell = $cells.add(c * cell_bytes);
            // Past the last cell this is the next group's (or beyond: a prefetch never faults).
            let ahead = cell.wrapping_add(AHEAD * cell_bytes);
            let d = _mm256_cvtph_ps(_mm_loadu_si128(cell as *const __m128i));
            let dmin = _mm256_cvtph_ps(_mm_loadu_si128(cell.add(at.dmin) as *const __m128i));
            for s in 0..subs {
                for line in s * lines_per_sub..(s + 1) * lines_per_sub {
                    _mm_prefetch::<_MM_HINT_T0>(ahead.wrapping_add(line * 64) as *const i8);
                }
                let (sc, m) = sub_ints::<$K>(cell, s);
                let scale = _mm256_mul_ps(d, _mm256_cvtepi32_ps(sc));
                let offset = if signed {
                    sign
                } else {
                    let m = _mm256_cvtepi32_ps(m);
                    _mm256_xor_ps(_mm256_mul_ps(dmin, m), sign)
                };
                let mut sums = [[_mm256_setzero_si256(); 2]; $R];
                for run in 0..at.sub_rows / 8 {
                    let r8 = s * at.sub_rows + run * 8;
                    let w: [__m256i; 2] = $run(cell, c, r8);
                    for (i, sums) in sums.iter_mut().enumerate() {
                        let at = x.add(i * k + c * ROWS + r8) as *const i32;
                        let x = [
                            _mm256_set1_epi32(at.read_unaligned()),
                            _mm256_set1_epi32(at.add(1).read_unaligned()),
                        ];
                        $dot!(sums, w, x, $R, $K);
                    }
                }
                let row0 = c * ROWS + s * at.sub_rows;
                for (i, sums) in sums.iter().enumerate() {
                    let mut isum = _mm256_add_epi32(sums[0], sums[1]);
                    let bias: i32 = $bias;
                    if bias != 0 {
                        let sum = $a.sub_block_sum($r0 + i, row0, at.sub_rows);
                        isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(bias * sum));
                    }
                    let b = ($r0 + i) * blocks + row0 / BLOCK;
                    let dx = _mm256_set1_ps(*$a.scale.get_unchecked(b));
                    y[i] =
                        _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_mul_ps(scale, dx), y[i]);
                    if !signed {
                        let sx = $a.sub_block_scaled_sum($r0 + i, row0, at.sub_rows);
                        let sx = _mm256_set1_ps(sx);
                        y[i] = _mm256_fmadd_ps(offset, sx, y[i]);
                    }
                }
            }
        }
        for (i, y) in y.iter().enumerate() {
            _mm256_storeu_ps($out.as_mut_ptr().add(i * GROUP), *y);
        }
    }};
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_avx2<const R: usize, const K: u8>(
    a: &QuantizedRows,
    r0: usize,
    cells: *const u8,
    out: &mut [f32],
) {
    body!(
        dot_avx2,
        |cell, _, r8| avx2_run::<K>(cell, r8),
        avx2_bias(of_kind(K)),
        R,
        K,
        a,
        r0,
        cells,
        out
    )
}

/// Runs of 8 rows per cell.
const RUNS: usize = ROWS / 8;

/// Every run of group `g`'s cells ([`avx2_run`]), in order, into `runs`: a pass of many rows
/// reads these in place of decoding each cell again for every tile of 4 rows.
///
/// # Safety
/// The CPU has AVX2; `g` is a group of `w`, whose cells are K-quant cells.
#[target_feature(enable = "avx2")]
pub(super) unsafe fn decode_group(w: &PackedMatrix, g: usize, runs: &mut Vec<[__m256i; 2]>) {
    assert!(g < w.n().div_ceil(GROUP) && w.cell_values().is_k_quant());
    let cell_bytes = w.cell_values().cell_bytes(ROWS);
    let cells = w.group_cells(g).as_ptr();
    runs.clear();
    runs.reserve(w.k() / 8);
    macro_rules! fill {
        ($k:expr) => {
            for c in 0..w.k() / ROWS {
                let cell = cells.add(c * cell_bytes);
                runs.extend((0..RUNS).map(|run| avx2_run::<$k>(cell, run * 8)));
            }
        };
    }
    crate::packed::kcells::by_kind!(w.cell_values(), fill);
}

/// [`tile`] for AVX2 with group `g`'s runs decoded by [`decode_group`].
///
/// # Safety
/// The CPU has AVX2, FMA and F16C; `a` holds rows `r0..r0 + rows` (1 to 4) of width `w.k()`;
/// `runs` are [`decode_group`]'s for group `g` of `w`.
pub(super) unsafe fn tile_decoded(
    a: &QuantizedRows,
    r0: usize,
    rows: usize,
    w: &PackedMatrix,
    g: usize,
    runs: &[[__m256i; 2]],
    out: &mut [f32],
) {
    assert!(
        (1..=4).contains(&rows)
            && r0 + rows <= a.m
            && a.k == w.k()
            && g < w.n().div_ceil(GROUP)
            && runs.len() == w.k() / 8
            && out.len() >= rows * GROUP
            && w.cell_values().is_k_quant()
    );
    let (cells, runs) = (w.group_cells(g).as_ptr(), runs.as_ptr());
    by_shape!(rows, w.cell_values(), run_avx2_decoded(a, r0, cells, runs, out): 1 2 3 4)
}

#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn run_avx2_decoded<const R: usize, const K: u8>(
    a: &QuantizedRows,
    r0: usize,
    cells: *const u8,
    runs: *const [__m256i; 2],
    out: &mut [f32],
) {
    body!(
        dot_avx2,
        |_, c, r8| *runs.add(c * RUNS + r8 / 8),
        avx2_bias(of_kind(K)),
        R,
        K,
        a,
        r0,
        cells,
        out
    )
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512vl,avx512vnni")]
unsafe fn run_vnni<const R: usize, const K: u8>(
    a: &QuantizedRows,
    r0: usize,
    cells: *const u8,
    out: &mut [f32],
) {
    body!(
        dot_vnni,
        |cell, _, r8| run_of::<K>(cell, r8),
        kcells::bias(of_kind(K)) as i32,
        R,
        K,
        a,
        r0,
        cells,
        out
    )
}

/// Rows `r0..r0 + rows` (1 to 8) of `a` against groups `g` and `g + 1` of `w`, 16 columns in
/// 512-bit registers, into `out` (row `r`'s 16 lanes at `r * 16`). Each lane runs
/// [`run_vnni`]'s steps, so the bits are the same; the float steps per sub-block, which bound
/// the 8-lane kernel at many rows, serve twice the columns.
///
/// # Safety
/// The CPU has AVX2, FMA, F16C, AVX-512 F, BW, VL and VNNI; `a` holds rows `r0..r0 + rows` of
/// width `w.k()`; `g + 1` is a group of `w`.
pub(super) unsafe fn tile_pair(
    a: &QuantizedRows,
    r0: usize,
    rows: usize,
    w: &PackedMatrix,
    g: usize,
    out: &mut [f32],
) {
    assert!(
        (1..=MAX_TILE_ROWS).contains(&rows)
            && r0 + rows <= a.m
            && a.k == w.k()
            && g + 1 < w.n().div_ceil(GROUP)
            && out.len() >= rows * 2 * GROUP
            && w.cell_values().is_k_quant()
    );
    let cells = (w.group_cells(g).as_ptr(), w.group_cells(g + 1).as_ptr());
    by_shape!(rows, w.cell_values(), run_vnni_pair(a, r0, cells, out): 1 2 3 4 5 6 7 8)
}

/// Two 256-bit halves as one 512-bit register (`a` low).
#[inline(always)]
pub(super) unsafe fn join(a: __m256i, b: __m256i) -> __m512i {
    _mm512_inserti64x4::<1>(_mm512_castsi256_si512(a), b)
}

/// Two cells' values as 16 lanes (the first cell's 8 low): what the two-group VNNI tile and
/// AMX's tiles ([`super::kcells_amx`]) read, decoded as [`dot_run`] decodes one.
pub(super) struct PairCells {
    /// IQ4_XS's table entries plus 128, which its nibbles index.
    iq4: __m512i,
    low: __m512i,
    fifth: __m512i,
    top: __m512i,
    /// As [`dot_run`]'s shifts, per 256-bit half.
    q5_shift: __m512i,
    q6_shift: __m512i,
    sign: __m512i,
}

impl PairCells {
    /// # Safety
    /// The CPU has AVX-512 F and BW.
    #[inline(always)]
    pub(super) unsafe fn new() -> PairCells {
        PairCells {
            iq4: _mm512_broadcast_i32x4(_mm_loadu_si128(
                kcells::IQ4_STORED.as_ptr() as *const __m128i
            )),
            low: _mm512_set1_epi8(0x0f),
            fifth: _mm512_set1_epi8(0x10),
            top: _mm512_set1_epi8(0x30),
            q5_shift: _mm512_setr_epi64(0, 1, 2, 3, 0, 1, 2, 3),
            q6_shift: _mm512_setr_epi64(0, 0, 2, 2, 0, 0, 2, 2),
            sign: _mm512_set1_epi32(i32::MIN),
        }
    }

    /// Sub-block `s`'s 16 scales `d * sc` and offsets `-(dmin * m)` (`-0.0` for the signed
    /// kinds), from the cells' `d` and `dmin` in f32.
    ///
    /// # Safety
    /// AVX-512 F and F16C are present; `ca` and `cb` point at whole cells of kind `K`.
    #[inline(always)]
    pub(super) unsafe fn sub_scales<const K: u8>(
        &self,
        (ca, cb): (*const u8, *const u8),
        (d, dmin): (__m512, __m512),
        s: usize,
    ) -> (__m512, __m512) {
        let at = Layout::of(of_kind(K));
        let signed = kcells::signed(of_kind(K));
        let both = |p: usize, signed: bool| {
            _mm512_cvtepi32_ps(join(bytes(ca.add(p), signed), bytes(cb.add(p), signed)))
        };
        let scale = _mm512_mul_ps(d, both(at.sc + s * GROUP, signed));
        let offset = if signed {
            _mm512_castsi512_ps(self.sign)
        } else {
            let m = _mm512_mul_ps(dmin, both(at.m + s * GROUP, false));
            _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(m), self.sign))
        };
        (scale, offset)
    }

    /// The cells' `d` and `dmin` (the signed kinds' second is unused) in f32.
    ///
    /// # Safety
    /// As [`Self::sub_scales`].
    #[inline(always)]
    pub(super) unsafe fn heads<const K: u8>(
        &self,
        (ca, cb): (*const u8, *const u8),
    ) -> (__m512, __m512) {
        let halves_ph = |p: usize| {
            _mm512_cvtph_ps(_mm256_set_m128i(
                _mm_loadu_si128(cb.add(p) as *const __m128i),
                _mm_loadu_si128(ca.add(p) as *const __m128i),
            ))
        };
        (halves_ph(0), halves_ph(Layout::of(of_kind(K)).dmin))
    }

    /// Run `r8` (a multiple of 8) of both cells: rows 0-3 of the 16 lanes, 4 per 32-bit lane,
    /// and rows 4-7, as stored (Q6_K's unsigned; IQ4_XS's its table's entries plus 128).
    ///
    /// # Safety
    /// As [`Self::sub_scales`], with the cells in dot order.
    #[inline(always)]
    pub(super) unsafe fn run<const K: u8>(
        &self,
        (ca, cb): (*const u8, *const u8),
        r8: usize,
    ) -> [__m512i; 2] {
        let at = Layout::of(of_kind(K));
        let nib = at.nibbles + r8 / 2 * GROUP;
        let v = join(
            _mm256_loadu_si256(ca.add(nib) as *const __m256i),
            _mm256_loadu_si256(cb.add(nib) as *const __m256i),
        );
        // Cells in dot order, as [`dot_run`] reads them: rows 0-3 of each lane in the
        // low nibbles, rows 4-7 in the high ones.
        let mut rows03 = _mm512_and_si512(v, self.low);
        let mut rows47 = _mm512_and_si512(_mm512_srli_epi16::<4>(v), self.low);
        let high = match of_kind(K) {
            CellValues::Q5K => {
                let word = |p: *const u8| {
                    _mm256_set1_epi64x((p.add(at.high + r8) as *const i64).read_unaligned())
                };
                Some((
                    _mm512_srlv_epi64(join(word(ca), word(cb)), self.q5_shift),
                    self.fifth,
                ))
            }
            CellValues::Q6K => {
                let pairs = |p: *const u8| {
                    _mm256_broadcastsi128_si256(_mm_loadu_si128(
                        p.add(at.high + r8 / 4 * GROUP) as *const __m128i
                    ))
                };
                Some((
                    _mm512_srlv_epi64(join(pairs(ca), pairs(cb)), self.q6_shift),
                    self.top,
                ))
            }
            CellValues::IQ4XS => {
                rows03 = _mm512_shuffle_epi8(self.iq4, rows03);
                rows47 = _mm512_shuffle_epi8(self.iq4, rows47);
                None
            }
            _ => None,
        };
        if let Some((high, top)) = high {
            let low_rows = _mm512_and_si512(_mm512_slli_epi16::<4>(high), top);
            rows03 = _mm512_or_si512(rows03, low_rows);
            rows47 = _mm512_or_si512(rows47, _mm512_and_si512(high, top));
        }
        [rows03, rows47]
    }
}

#[target_feature(enable = "avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")]
unsafe fn run_vnni_pair<const R: usize, const K: u8>(
    a: &QuantizedRows,
    r0: usize,
    (cells_a, cells_b): (*const u8, *const u8),
    out: &mut [f32],
) {
    let values = of_kind(K);
    assert!(
        kcells::has_16_lanes(values),
        "{values:?} cells have no two-group tile"
    );
    let at = Layout::of(values);
    let signed = kcells::signed(values);
    let pair = PairCells::new();
    let cell_bytes = values.cell_bytes(ROWS);
    let (k, blocks) = (a.k, a.k / BLOCK);
    let x = a.q.as_ptr().add(r0 * k) as *const u8;
    let mut y = [_mm512_setzero_ps(); R];
    let subs = ROWS / at.sub_rows;
    let lines_per_sub = cell_bytes.div_ceil(64).div_ceil(subs);
    for c in 0..k / ROWS {
        let cells = (cells_a.add(c * cell_bytes), cells_b.add(c * cell_bytes));
        let (ahead_a, ahead_b) = (
            cells.0.wrapping_add(AHEAD * cell_bytes),
            cells.1.wrapping_add(AHEAD * cell_bytes),
        );
        let heads = pair.heads::<K>(cells);
        for s in 0..subs {
            for line in s * lines_per_sub..(s + 1) * lines_per_sub {
                _mm_prefetch::<_MM_HINT_T0>(ahead_a.wrapping_add(line * 64) as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(ahead_b.wrapping_add(line * 64) as *const i8);
            }
            let (scale, offset) = pair.sub_scales::<K>(cells, heads, s);
            let mut sums = [_mm512_setzero_si512(); R];
            let mut last = [_mm512_setzero_si512(); R];
            for run in 0..at.sub_rows / 8 {
                let r8 = s * at.sub_rows + run * 8;
                let [rows03, rows47] = pair.run::<K>(cells, r8);
                for i in 0..R {
                    let at = x.add(i * k + c * ROWS + r8) as *const i32;
                    let x03 = _mm512_set1_epi32(at.read_unaligned());
                    let x47 = _mm512_set1_epi32(at.add(1).read_unaligned());
                    sums[i] = _mm512_dpbusd_epi32(sums[i], rows03, x03);
                    if R < 4 {
                        last[i] = _mm512_dpbusd_epi32(last[i], rows47, x47);
                    } else {
                        sums[i] = _mm512_dpbusd_epi32(sums[i], rows47, x47);
                    }
                }
            }
            let row0 = c * ROWS + s * at.sub_rows;
            for i in 0..R {
                let mut isum = _mm512_add_epi32(sums[i], last[i]);
                if signed {
                    let sum = a.sub_block_sum(r0 + i, row0, at.sub_rows);
                    let bias = kcells::bias(values) as i32;
                    isum = _mm512_sub_epi32(isum, _mm512_set1_epi32(bias * sum));
                }
                let b = (r0 + i) * blocks + row0 / BLOCK;
                let dx = _mm512_set1_ps(*a.scale.get_unchecked(b));
                y[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum), _mm512_mul_ps(scale, dx), y[i]);
                if !signed {
                    let sx = _mm512_set1_ps(a.sub_block_scaled_sum(r0 + i, row0, at.sub_rows));
                    y[i] = _mm512_fmadd_ps(offset, sx, y[i]);
                }
            }
        }
    }
    for (i, y) in y.iter().enumerate() {
        _mm512_storeu_ps(out.as_mut_ptr().add(i * 2 * GROUP), *y);
    }
}
