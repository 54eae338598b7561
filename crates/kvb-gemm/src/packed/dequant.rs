//! Expanding one group's cells to f32 rows: with AVX2 and FMA (F16C for f16) where the CPU has
//! them (detected at run time), a portable loop elsewhere. Both compute `scale * q + offset`
//! with the product exact, or widen a 16-bit float (exact), so they agree bit for bit (see the
//! parent module).

use super::{kcells, CellOrder, CellValues, Scales, GROUP};
use kvb_modelfile::gguf::blocks::IQ4_VALUES;

/// Row `r`, lane `lane` of `cell` (K-quant cells' bits in `order`) as f32.
pub(super) fn value(
    values: CellValues,
    order: CellOrder,
    cell: &[u8],
    r: usize,
    lane: usize,
) -> f32 {
    if values.is_k_quant() {
        let (q, scale, offset) = kcells::parts(values, order, cell, r, lane);
        return q as f32 * scale + offset;
    }
    let v = &cell[values.head_bytes()..];
    let half = || [v[(r * GROUP + lane) * 2], v[(r * GROUP + lane) * 2 + 1]];
    let (q, scales) = match values {
        CellValues::Nibbles(s) => (
            ((v[r / 2 * GROUP + lane] >> (4 * (r % 2))) & 0x0f) as f32,
            s,
        ),
        CellValues::Iq4Nl => {
            let nibble = (v[r / 2 * GROUP + lane] >> (4 * (r % 2))) & 0x0f;
            (IQ4_VALUES[nibble as usize] as f32, Scales::HalfOnly)
        }
        CellValues::FiveBits(s) => (super::five_bits::value(s, v, r, lane) as f32, s),
        CellValues::Bytes(s) => (v[r * GROUP + lane] as i8 as f32, s),
        CellValues::Bf16 => return half::bf16::from_le_bytes(half()).to_f32(),
        CellValues::F16 => return half::f16::from_le_bytes(half()).to_f32(),
        CellValues::Q2K
        | CellValues::Q3K
        | CellValues::Q4K
        | CellValues::Q5K
        | CellValues::Q6K
        | CellValues::IQ4XS => unreachable!("read above"),
    };
    let (scale, offset) = scales.read(cell, lane);
    q * scale + offset
}

/// Writes the 8 columns of `cells` (consecutive cells of `cell_rows` rows, of one group) into
/// `out`: reduction row `i` of the run at `out[i * stride..i * stride + 8]`.
pub(super) fn group(
    values: CellValues,
    cell_rows: usize,
    cells: &[u8],
    out: &mut [f32],
    stride: usize,
) {
    let cell_bytes = values.cell_bytes(cell_rows);
    let rows = cells.len() / cell_bytes * cell_rows;
    assert!(
        rows == 0 || out.len() >= (rows - 1) * stride + GROUP,
        "dequant::group: output too short"
    );
    #[cfg(target_arch = "x86_64")]
    if values.vectorised() {
        // SAFETY: the CPU has AVX2, FMA and F16C (checked above); every cell is `cell_bytes` long
        // (chunks_exact) and `out` holds `rows` rows of `stride` with 8 lanes each (asserted).
        unsafe {
            for (c, cell) in cells.chunks_exact(cell_bytes).enumerate() {
                let at = out.as_mut_ptr().add(c * cell_rows * stride);
                avx2::cell(values, cell_rows, cell, at, stride);
            }
        }
        return;
    }
    for (c, cell) in cells.chunks_exact(cell_bytes).enumerate() {
        portable(
            values,
            cell_rows,
            cell,
            &mut out[c * cell_rows * stride..],
            stride,
        );
    }
}

/// Whether [`pair`] runs its 16-lane kernel here (AVX-512F; Q2_K's and Q3_K's cells have only
/// the 8-lane one).
pub(super) fn pairs_vectorised(values: CellValues) -> bool {
    values.vectorised() && crate::isa() == crate::Isa::Avx512 && kcells::has_16_lanes(values)
}

/// How many cells ahead of the one being expanded the kernels ask for.
pub(crate) const AHEAD: usize = 4;

/// Asks for the cell at `cell` (`bytes` long) to be brought into L1, where the hardware
/// prefetchers do not: a product walks many short runs of cells, one run per group. `cell` may
/// lie past the data (a prefetch never faults).
#[cfg(target_arch = "x86_64")]
#[inline]
pub(crate) fn prefetch_cell(cell: *const u8, bytes: usize) {
    use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
    for line in (0..bytes).step_by(64) {
        // SAFETY: a prefetch is a hint; it reads nothing and never faults, whatever the
        // address (SSE, which every x86_64 has).
        unsafe { _mm_prefetch::<_MM_HINT_T0>(cell.wrapping_add(line) as *const i8) };
    }
}

/// [`group`] for two adjacent groups at once: group `i`'s columns go to lanes `8 i..8 i + 8`
/// of each output row. Only where [`pairs_vectorised`] holds.
pub(super) fn pair(
    values: CellValues,
    cell_rows: usize,
    cells: [&[u8]; 2],
    out: &mut [f32],
    stride: usize,
) {
    let cell_bytes = values.cell_bytes(cell_rows);
    let rows = cells[0].len() / cell_bytes * cell_rows;
    assert!(
        pairs_vectorised(values)
            && cells[0].len() == cells[1].len()
            && (rows == 0 || out.len() >= (rows - 1) * stride + 2 * GROUP),
        "dequant::pair: operands"
    );
    #[cfg(target_arch = "x86_64")]
    // SAFETY: the CPU has AVX-512F (checked above); both runs hold whole cells of equal count
    // and `out` holds `rows` rows of `stride` with 16 lanes each (asserted).
    unsafe {
        for c in 0..cells[0].len() / cell_bytes {
            let at = out.as_mut_ptr().add(c * cell_rows * stride);
            let cell = |i: usize| cells[i][c * cell_bytes..].as_ptr();
            for i in 0..2 {
                prefetch_cell(cell(i).wrapping_add(AHEAD * cell_bytes), cell_bytes);
            }
            avx512::cell_pair(values, cell_rows, [cell(0), cell(1)], at, stride);
        }
    }
}

fn portable(values: CellValues, rows: usize, cell: &[u8], out: &mut [f32], stride: usize) {
    for r in 0..rows {
        let row = &mut out[r * stride..r * stride + GROUP];
        for (l, o) in row.iter_mut().enumerate() {
            *o = value(values, CellOrder::Rows, cell, r, l);
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx2 {
    use super::{CellValues, Scales, GROUP, IQ4_VALUES};
    use crate::packed::five_bits;
    use std::arch::x86_64::*;

    /// The table entries the low and the high nibbles of the 8 bytes at `p` index (two rows of
    /// an IQ4_NL cell), as 8 i32 lanes each: looked up in bytes (`vpshufb`), then widened.
    #[inline(always)]
    pub(crate) unsafe fn iq4_rows(p: *const u8) -> [__m256i; 2] {
        let table = _mm_loadu_si128(IQ4_VALUES.as_ptr() as *const __m128i);
        let (raw, low) = (_mm_loadl_epi64(p as *const __m128i), _mm_set1_epi8(0x0f));
        let lo = _mm_and_si128(raw, low);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(raw), low);
        [
            _mm256_cvtepi8_epi32(_mm_shuffle_epi8(table, lo)),
            _mm256_cvtepi8_epi32(_mm_shuffle_epi8(table, hi)),
        ]
    }

    /// The 8 lanes' scales and offsets of an integer cell's head at `p`, as
    /// [`Scales::read`] gives them. Inlined into callers compiled with AVX2 and F16C.
    #[inline(always)]
    pub(crate) unsafe fn head(scales: Scales, p: *const u8) -> (__m256, __m256) {
        head_lanes(scales, p, GROUP, 0)
    }

    /// Lanes `first..first + 8` of a head of `lanes` columns at `p`, as [`Scales::read_of`]
    /// gives them (the 8-bit products' heads have 16 lanes).
    #[inline(always)]
    pub(crate) unsafe fn head_lanes(
        scales: Scales,
        p: *const u8,
        lanes: usize,
        first: usize,
    ) -> (__m256, __m256) {
        let halves = |at: usize| _mm256_cvtph_ps(_mm_loadu_si128(p.add(at) as *const __m128i));
        match scales {
            Scales::F32 => (
                _mm256_loadu_ps((p as *const f32).add(first)),
                _mm256_loadu_ps((p as *const f32).add(lanes + first)),
            ),
            Scales::Half => (halves(2 * first), halves(2 * (lanes + first))),
            Scales::HalfCentred => {
                let d = halves(2 * first);
                (d, _mm256_mul_ps(_mm256_set1_ps(-8.0), d))
            }
            Scales::HalfOnly => (halves(2 * first), _mm256_set1_ps(-0.0)),
        }
    }

    /// The 8 16-bit floats (of `values`: bf16 or f16) at `p` widened to f32, exactly. Inlined
    /// into callers compiled with AVX2 and F16C.
    #[inline(always)]
    pub(crate) unsafe fn widen_floats(values: CellValues, p: *const u8) -> __m256 {
        let raw = _mm_loadu_si128(p as *const __m128i);
        match values {
            CellValues::F16 => _mm256_cvtph_ps(raw),
            // bf16 is the top half of an f32.
            _ => _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16)),
        }
    }

    /// One cell's rows of 8 values to `out` (row r at `out + r * stride`): one 8-byte load,
    /// a widening, a conversion and a fused multiply-add per 8 values (the product is exact,
    /// so fusing rounds as the unfused expansion does); for 16-bit floats a 16-byte load and a
    /// widening.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub(super) unsafe fn cell(
        values: CellValues,
        rows: usize,
        cell: &[u8],
        out: *mut f32,
        stride: usize,
    ) {
        let p = cell.as_ptr();
        let v = p.add(values.head_bytes());
        if values.is_k_quant() {
            let ahead = p.wrapping_add(super::kcells::AHEAD * values.cell_bytes(rows));
            macro_rules! run {
                ($k:expr) => {
                    super::kcells::avx2::each_row::<1, $k>([p], [ahead], |r, [w]| {
                        _mm256_storeu_ps(out.add(r * stride), *w)
                    })
                };
            }
            super::kcells::by_kind!(values, run);
            return;
        }
        if let CellValues::Bf16 | CellValues::F16 = values {
            for r in 0..rows {
                let w = widen_floats(values, v.add(r * GROUP * 2));
                _mm256_storeu_ps(out.add(r * stride), w);
            }
            return;
        }
        if values == CellValues::Iq4Nl {
            let (scale, offset) = head(Scales::HalfOnly, p);
            for r in 0..rows / 2 {
                for (half, q) in iq4_rows(v.add(r * GROUP)).into_iter().enumerate() {
                    let w = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(q), offset);
                    _mm256_storeu_ps(out.add((2 * r + half) * stride), w);
                }
            }
            return;
        }
        if let CellValues::FiveBits(scales) = values {
            let (scale, offset) = head(scales, p);
            let signed = five_bits::signed(scales);
            for r8 in (0..rows).step_by(8) {
                let runs = five_bits::avx2::run_bytes(v, r8, signed);
                for (half, run) in runs.into_iter().enumerate() {
                    for (i, q) in five_bits::avx2::quarters(run).into_iter().enumerate() {
                        let q = _mm256_cvtepi32_ps(five_bits::avx2::widen(q, signed));
                        let w = _mm256_fmadd_ps(scale, q, offset);
                        _mm256_storeu_ps(out.add((r8 + 2 * i + half) * stride), w);
                    }
                }
            }
            return;
        }
        let (CellValues::Nibbles(scales) | CellValues::Bytes(scales)) = values else {
            unreachable!("16-bit, 5-bit, IQ4_NL and K-quant cells returned above")
        };
        let (scale, offset) = head(scales, p);
        match values {
            CellValues::Nibbles(_) => {
                let low = _mm256_set1_epi32(0x0f);
                for r in 0..rows / 2 {
                    let bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(v.add(r * GROUP) as *const _));
                    let lo = _mm256_cvtepi32_ps(_mm256_and_si256(bytes, low));
                    let hi = _mm256_cvtepi32_ps(_mm256_srli_epi32(bytes, 4));
                    _mm256_storeu_ps(out.add(2 * r * stride), _mm256_fmadd_ps(scale, lo, offset));
                    _mm256_storeu_ps(
                        out.add((2 * r + 1) * stride),
                        _mm256_fmadd_ps(scale, hi, offset),
                    );
                }
            }
            _ => {
                for r in 0..rows {
                    let q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(v.add(r * GROUP) as *const _));
                    _mm256_storeu_ps(
                        out.add(r * stride),
                        _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(q), offset),
                    );
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use super::{CellValues, Scales, GROUP};
    use crate::packed::five_bits;
    use std::arch::x86_64::*;

    /// The scales and offsets of the heads at `a` (low 8 lanes) and `b`, as
    /// [`super::avx2::head`] gives each.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn head_pair(scales: Scales, a: *const u8, b: *const u8) -> (__m512, __m512) {
        let halves = |at: usize| {
            _mm512_cvtph_ps(_mm256_inserti128_si256::<1>(
                _mm256_castsi128_si256(_mm_loadu_si128(a.add(at) as *const __m128i)),
                _mm_loadu_si128(b.add(at) as *const __m128i),
            ))
        };
        match scales {
            Scales::F32 => (join(a, b), join(a.add(GROUP * 4), b.add(GROUP * 4))),
            Scales::Half => (halves(0), halves(GROUP * 2)),
            Scales::HalfCentred => {
                let d = halves(0);
                (d, _mm512_mul_ps(_mm512_set1_ps(-8.0), d))
            }
            Scales::HalfOnly => (halves(0), _mm512_set1_ps(-0.0)),
        }
    }

    /// 16 bytes widened to i32 lanes, as signed values or not.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn widen16(q: __m128i, signed: bool) -> __m512i {
        if signed {
            _mm512_cvtepi8_epi32(q)
        } else {
            _mm512_cvtepu8_epi32(q)
        }
    }

    /// Two 8-value halves at `a` and `b` (f32) as one register. (Inserted as 4 f64s, an
    /// AVX-512F instruction: the f32 form is AVX-512DQ, which these kernels do not enable, so
    /// it would be an out-of-line call per cell.)
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn join(a: *const u8, b: *const u8) -> __m512 {
        _mm512_castpd_ps(_mm512_insertf64x4::<1>(
            _mm512_castpd256_pd512(_mm256_loadu_pd(a as *const f64)),
            _mm256_loadu_pd(b as *const f64),
        ))
    }

    /// 8 bytes at `a` and 8 at `b`, as one 16-byte register.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn bytes16(a: *const u8, b: *const u8) -> __m128i {
        _mm_unpacklo_epi64(
            _mm_loadl_epi64(a as *const __m128i),
            _mm_loadl_epi64(b as *const __m128i),
        )
    }

    /// The 8 16-bit floats (bf16 or f16) at `a` and the 8 at `b`, widened to f32 (exactly).
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub(crate) unsafe fn widen_pair(values: CellValues, a: *const u8, b: *const u8) -> __m512 {
        let raw = _mm256_inserti128_si256::<1>(
            _mm256_castsi128_si256(_mm_loadu_si128(a as *const __m128i)),
            _mm_loadu_si128(b as *const __m128i),
        );
        match values {
            CellValues::F16 => _mm512_cvtph_ps(raw),
            // bf16 is the top half of an f32.
            _ => _mm512_castsi512_ps(_mm512_slli_epi32::<16>(_mm512_cvtepu16_epi32(raw))),
        }
    }

    /// The same cell of two groups: row r's 16 values (8 of each) at `out + r * stride`, each
    /// lane computed as [`super::avx2::cell`] computes it.
    #[target_feature(enable = "avx512f")]
    pub(super) unsafe fn cell_pair(
        values: CellValues,
        rows: usize,
        cells: [*const u8; 2],
        out: *mut f32,
        stride: usize,
    ) {
        let head = values.head_bytes();
        let [a, b] = cells;
        if values.is_k_quant() {
            let bytes = values.cell_bytes(super::kcells::ROWS);
            let ahead = cells.map(|c| c.wrapping_add(super::kcells::AHEAD * bytes));
            macro_rules! run {
                ($k:expr) => {
                    super::kcells::avx512::each_row::<1, $k, false>(
                        [cells],
                        [ahead],
                        false,
                        |r, [w]| _mm512_storeu_ps(out.add(r * stride), *w),
                    )
                };
            }
            super::kcells::by_kind!(values, run);
            return;
        }
        if let CellValues::Bf16 | CellValues::F16 = values {
            for r in 0..rows {
                let at = head + r * GROUP * 2;
                _mm512_storeu_ps(
                    out.add(r * stride),
                    widen_pair(values, a.add(at), b.add(at)),
                );
            }
            return;
        }
        if values == CellValues::Iq4Nl {
            let (scale, offset) = head_pair(Scales::HalfOnly, a, b);
            let table = super::kcells::avx512::iq4_values();
            for r in 0..rows / 2 {
                let at = head + r * GROUP;
                let q = _mm512_cvtepu8_epi32(bytes16(a.add(at), b.add(at)));
                for (half, n) in [q, _mm512_srli_epi32::<4>(q)].into_iter().enumerate() {
                    // `vpermps` reads an index's low 4 bits: the nibble, unmasked.
                    let w = _mm512_fmadd_ps(scale, _mm512_permutexvar_ps(n, table), offset);
                    _mm512_storeu_ps(out.add((2 * r + half) * stride), w);
                }
            }
            return;
        }
        if let CellValues::FiveBits(scales) = values {
            let (scale, offset) = head_pair(scales, a, b);
            let signed = five_bits::signed(scales);
            for r8 in (0..rows).step_by(8) {
                let runs_a = five_bits::avx2::run_bytes(a.add(head), r8, signed);
                let runs_b = five_bits::avx2::run_bytes(b.add(head), r8, signed);
                for half in 0..2 {
                    let qa = five_bits::avx2::quarters(runs_a[half]);
                    let qb = five_bits::avx2::quarters(runs_b[half]);
                    for i in 0..4 {
                        let q = widen16(_mm_unpacklo_epi64(qa[i], qb[i]), signed);
                        let w = _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(q), offset);
                        _mm512_storeu_ps(out.add((r8 + 2 * i + half) * stride), w);
                    }
                }
            }
            return;
        }
        let (CellValues::Nibbles(scales) | CellValues::Bytes(scales)) = values else {
            unreachable!("16-bit, 5-bit, IQ4_NL and K-quant cells returned above")
        };
        let (scale, offset) = head_pair(scales, a, b);
        if let CellValues::Nibbles(_) = values {
            let low = _mm512_set1_epi32(0x0f);
            for r in 0..rows / 2 {
                let at = head + r * GROUP;
                let q = _mm512_cvtepu8_epi32(bytes16(a.add(at), b.add(at)));
                let lo = _mm512_cvtepi32_ps(_mm512_and_si512(q, low));
                let hi = _mm512_cvtepi32_ps(_mm512_srli_epi32::<4>(q));
                _mm512_storeu_ps(out.add(2 * r * stride), _mm512_fmadd_ps(scale, lo, offset));
                _mm512_storeu_ps(
                    out.add((2 * r + 1) * stride),
                    _mm512_fmadd_ps(scale, hi, offset),
                );
            }
        } else {
            for r in 0..rows {
                let at = head + r * GROUP;
                let q = _mm512_cvtepi8_epi32(bytes16(a.add(at), b.add(at)));
                _mm512_storeu_ps(
                    out.add(r * stride),
                    _mm512_fmadd_ps(scale, _mm512_cvtepi32_ps(q), offset),
                );
            }
        }
    }
}
