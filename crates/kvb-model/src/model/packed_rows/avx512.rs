//! The 16-lane kernel (AVX-512F): two groups of 8 columns per register. The two groups' values
//! are loaded side by side (8 bytes, or 16 for 16-bit floats, from each), widened and scaled
//! together, so a row of cells costs half the instructions of the 8-lane kernel. Each lane
//! computes what [`super::avx2`] computes for its column, in the same order: the same bits.

use super::*;
use crate::packed::{bytes16, join, widen_pair};
use std::arch::x86_64::*;

/// Columns `j0..j0 + cols` (`j0` a multiple of 8) of `y` into `tile` (`[m, cols]`), in sets of
/// up to 4 pairs of groups (independent accumulator chains); an odd last group is paired with
/// itself and only its own lanes kept.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn columns(
    x: &[f32],
    m: usize,
    w: &PackedMatrix,
    j0: usize,
    cols: usize,
    tile: &mut [f32],
) {
    let (g0, g1) = (j0 / GROUP, (j0 + cols).div_ceil(GROUP));
    let mut g = g0;
    while g < g1 {
        let pairs_left = (g1 - g).div_ceil(2);
        let pairs = match (m, pairs_left) {
            (1 | 2, 4..) => 4,
            (_, 2..) => 2,
            _ => 1,
        };
        let mut out = [0f32; MAX_ROWS * 8 * GROUP];
        let group = |i: usize| w.group_cells((g + i).min(g1 - 1)).as_ptr();
        let args = Args {
            x: x.as_ptr(),
            k: w.k(),
            values: w.cell_values(),
            cell_rows: w.cell_rows(),
            cells: std::array::from_fn(group),
            out: out.as_mut_ptr(),
            stride: pairs * 2 * GROUP,
        };
        match (m, pairs) {
            (1, 4) => run_pairs::<1, 4>(&args),
            (2, 4) => run_pairs::<2, 4>(&args),
            (1, 2) => run_pairs::<1, 2>(&args),
            (2, 2) => run_pairs::<2, 2>(&args),
            (3, 2) => run_pairs::<3, 2>(&args),
            (4, 2) => run_pairs::<4, 2>(&args),
            (1, _) => run_pairs::<1, 1>(&args),
            (2, _) => run_pairs::<2, 1>(&args),
            (3, _) => run_pairs::<3, 1>(&args),
            _ => run_pairs::<4, 1>(&args),
        }
        let first = (g - g0) * GROUP;
        let width = (pairs * 2 * GROUP).min(cols - first);
        let stride = pairs * 2 * GROUP;
        for r in 0..m {
            tile[r * cols + first..r * cols + first + width]
                .copy_from_slice(&out[r * stride..r * stride + width]);
        }
        g += pairs * 2;
    }
}

/// What [`run_pairs`] reads and writes.
struct Args {
    x: *const f32,
    k: usize,
    values: CellValues,
    cell_rows: usize,
    /// The first cell of each group of the set (only the first `2 P` are read).
    cells: [*const u8; 8],
    /// `[R, stride]`: row r's pair i at `out + r * stride + 16 i`.
    out: *mut f32,
    stride: usize,
}

/// Rows `0..R` of x against `P` pairs of groups: per reduction row, each pair's 16 weights are
/// widened, converted and scaled once and multiplied into the R rows' accumulators.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn run_pairs<const R: usize, const P: usize>(a: &Args) {
    let rows = a.cell_rows;
    let cell_bytes = a.values.cell_bytes(rows);
    let cells = a.k / rows;
    let per_block = KC / rows;
    let mut acc = [[_mm512_setzero_ps(); P]; R];
    let low = _mm512_set1_epi32(0x0f);
    for c in 0..cells {
        let mut head = [[std::ptr::null::<u8>(); 2]; P];
        for (i, h) in head.iter_mut().enumerate() {
            *h = [
                a.cells[2 * i].add(c * cell_bytes),
                a.cells[2 * i + 1].add(c * cell_bytes),
            ];
        }
        let xrow = |r: usize, i: usize| *a.x.add(r * a.k + c * rows + i);
        match a.values {
            CellValues::Nibbles | CellValues::Bytes => {
                let mut scale = [_mm512_setzero_ps(); P];
                let mut offset = [_mm512_setzero_ps(); P];
                for (i, h) in head.iter().enumerate() {
                    scale[i] = join(h[0], h[1]);
                    offset[i] = join(h[0].add(GROUP * 4), h[1].add(GROUP * 4));
                }
                let mut wv = [_mm512_setzero_ps(); P];
                if a.values == CellValues::Nibbles {
                    for p in 0..rows / 2 {
                        let mut q = [_mm512_setzero_si512(); P];
                        for (i, h) in head.iter().enumerate() {
                            let at = HEAD_BYTES + p * GROUP;
                            q[i] = _mm512_cvtepu8_epi32(bytes16(h[0].add(at), h[1].add(at)));
                        }
                        for i in 0..P {
                            let lo = _mm512_cvtepi32_ps(_mm512_and_si512(q[i], low));
                            wv[i] = _mm512_fmadd_ps(scale[i], lo, offset[i]);
                        }
                        multiply_into(&mut acc, &wv, |r| xrow(r, 2 * p));
                        for i in 0..P {
                            let hi = _mm512_cvtepi32_ps(_mm512_srli_epi32::<4>(q[i]));
                            wv[i] = _mm512_fmadd_ps(scale[i], hi, offset[i]);
                        }
                        multiply_into(&mut acc, &wv, |r| xrow(r, 2 * p + 1));
                    }
                } else {
                    for p in 0..rows {
                        for (i, h) in head.iter().enumerate() {
                            let at = HEAD_BYTES + p * GROUP;
                            let q = _mm512_cvtepi8_epi32(bytes16(h[0].add(at), h[1].add(at)));
                            wv[i] = _mm512_fmadd_ps(scale[i], _mm512_cvtepi32_ps(q), offset[i]);
                        }
                        multiply_into(&mut acc, &wv, |r| xrow(r, p));
                    }
                }
            }
            CellValues::Bf16 | CellValues::F16 => {
                let mut wv = [_mm512_setzero_ps(); P];
                for p in 0..rows {
                    for (i, h) in head.iter().enumerate() {
                        let at = p * GROUP * 2;
                        wv[i] = widen_pair(a.values, h[0].add(at), h[1].add(at));
                    }
                    multiply_into(&mut acc, &wv, |r| xrow(r, p));
                }
            }
        }
        // The end of a KC block (or of the reduction): out = block sum for the first block,
        // out += block sum after it, as the f32 kernels do.
        if (c + 1) % per_block == 0 || c + 1 == cells {
            let first = c < per_block;
            for (r, row) in acc.iter_mut().enumerate() {
                for (i, v) in row.iter_mut().enumerate() {
                    let o = a.out.add(r * a.stride + i * 2 * GROUP);
                    let sum = if first {
                        *v
                    } else {
                        _mm512_add_ps(_mm512_loadu_ps(o), *v)
                    };
                    _mm512_storeu_ps(o, sum);
                    *v = _mm512_setzero_ps();
                }
            }
        }
    }
}

/// `acc[r][i] += x(r) * w[i]` for every row and pair.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn multiply_into<const R: usize, const P: usize>(
    acc: &mut [[__m512; P]; R],
    w: &[__m512; P],
    x: impl Fn(usize) -> f32,
) {
    for (r, row) in acc.iter_mut().enumerate() {
        let xv = _mm512_set1_ps(x(r));
        for (a, w) in row.iter_mut().zip(w) {
            *a = _mm512_fmadd_ps(xv, *w, *a);
        }
    }
}
