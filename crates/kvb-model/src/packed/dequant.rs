//! Expanding one group's cells to f32 rows: with AVX2 and FMA where the CPU has them (detected
//! at run time), a portable loop elsewhere. Both compute `scale * q + offset` with the product
//! exact, so they agree bit for bit (see the parent module).

use super::{CellValues, GROUP, HEAD_BYTES};

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
    if kvb_gemm::has_fma() {
        // SAFETY: the CPU has AVX2 and FMA (checked above); every cell is `cell_bytes` long
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

fn portable(values: CellValues, rows: usize, cell: &[u8], out: &mut [f32], stride: usize) {
    let f = |o: usize| f32::from_le_bytes([cell[o], cell[o + 1], cell[o + 2], cell[o + 3]]);
    let scale: [f32; GROUP] = std::array::from_fn(|l| f(l * 4));
    let offset: [f32; GROUP] = std::array::from_fn(|l| f(GROUP * 4 + l * 4));
    let v = &cell[HEAD_BYTES..];
    for r in 0..rows {
        let row = &mut out[r * stride..r * stride + GROUP];
        for (l, o) in row.iter_mut().enumerate() {
            let q = match values {
                CellValues::Nibbles => ((v[r / 2 * GROUP + l] >> (4 * (r % 2))) & 0x0f) as f32,
                CellValues::Bytes => v[r * GROUP + l] as i8 as f32,
            };
            *o = q * scale[l] + offset[l];
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{CellValues, GROUP, HEAD_BYTES};
    use std::arch::x86_64::*;

    /// One cell's rows of 8 values to `out` (row r at `out + r * stride`): one 8-byte load,
    /// a widening, a conversion and a fused multiply-add per 8 values (the product is exact,
    /// so fusing rounds as the unfused expansion does).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn cell(
        values: CellValues,
        rows: usize,
        cell: &[u8],
        out: *mut f32,
        stride: usize,
    ) {
        let p = cell.as_ptr();
        let scale = _mm256_loadu_ps(p as *const f32);
        let offset = _mm256_loadu_ps(p.add(GROUP * 4) as *const f32);
        let v = p.add(HEAD_BYTES);
        match values {
            CellValues::Nibbles => {
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
            CellValues::Bytes => {
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
