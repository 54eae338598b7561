//! The 8-lane kernel (AVX2, FMA, F16C): one group of 8 columns per register.

use super::*;
use std::arch::x86_64::*;

/// Columns `j0..j0 + cols` (`j0` a multiple of 8) of `y` into `tile` (`[m, cols]`), groups of
/// columns 4 or 2 at a time (independent accumulator chains), the last ones one at a time.
#[target_feature(enable = "avx2,fma,f16c")]
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
        let left = g1 - g;
        let run = match (m, left) {
            (1 | 2, 4..) => 4,
            (_, 2..) => 2,
            _ => 1,
        };
        // Accumulate into a full-width scratch row per group set, then copy the lanes that
        // exist (the last group of an odd width is padded).
        let mut out = [0f32; MAX_ROWS * 4 * GROUP];
        let args = Args {
            x: x.as_ptr(),
            k: w.k(),
            values: w.cell_values(),
            cell_rows: w.cell_rows(),
            cells: [0, 1, 2, 3].map(|i| w.group_cells((g + i).min(g1 - 1)).as_ptr()),
            out: out.as_mut_ptr(),
            stride: run * GROUP,
        };
        match (m, run) {
            (1, 4) => run_groups::<1, 4>(&args),
            (2, 4) => run_groups::<2, 4>(&args),
            (1, 2) => run_groups::<1, 2>(&args),
            (2, 2) => run_groups::<2, 2>(&args),
            (3, 2) => run_groups::<3, 2>(&args),
            (4, 2) => run_groups::<4, 2>(&args),
            (1, _) => run_groups::<1, 1>(&args),
            (2, _) => run_groups::<2, 1>(&args),
            (3, _) => run_groups::<3, 1>(&args),
            _ => run_groups::<4, 1>(&args),
        }
        let first = (g - g0) * GROUP;
        let width = (run * GROUP).min(cols - first);
        for r in 0..m {
            tile[r * cols + first..r * cols + first + width]
                .copy_from_slice(&out[r * run * GROUP..r * run * GROUP + width]);
        }
        g += run;
    }
}

/// What [`run_groups`] reads and writes.
struct Args {
    x: *const f32,
    k: usize,
    values: CellValues,
    cell_rows: usize,
    /// The first cell of each group of the set (only the first `G` are read).
    cells: [*const u8; 4],
    /// `[R, stride]`: row r's group i at `out + r * stride + 8 i`.
    out: *mut f32,
    stride: usize,
}

/// Rows `0..R` of x against `G` groups: per reduction row, each group's 8 weights are
/// widened, converted and scaled once and multiplied into the R rows' accumulators.
#[inline(always)]
unsafe fn run_groups<const R: usize, const G: usize>(a: &Args) {
    let rows = a.cell_rows;
    let cell_bytes = a.values.cell_bytes(rows);
    let cells = a.k / rows;
    let per_block = KC / rows;
    let mut acc = [[_mm256_setzero_ps(); G]; R];
    let low = _mm256_set1_epi32(0x0f);
    for c in 0..cells {
        let head: [*const u8; G] = std::array::from_fn(|i| a.cells[i].add(c * cell_bytes));
        let xrow = |r: usize, i: usize| _mm256_broadcast_ss(&*a.x.add(r * a.k + c * rows + i));
        // Each group's 8 scales and offsets, for integer cells.
        let scales = || -> ([__m256; G], [__m256; G]) {
            (
                std::array::from_fn(|i| _mm256_loadu_ps(head[i] as *const f32)),
                std::array::from_fn(|i| _mm256_loadu_ps(head[i].add(GROUP * 4) as *const f32)),
            )
        };
        match a.values {
            CellValues::Nibbles => {
                let (scale, offset) = scales();
                for p in 0..rows / 2 {
                    let bytes: [__m256i; G] = std::array::from_fn(|i| {
                        _mm256_cvtepu8_epi32(_mm_loadl_epi64(
                            head[i].add(HEAD_BYTES + p * GROUP) as *const _
                        ))
                    });
                    let lo: [__m256; G] = std::array::from_fn(|i| {
                        let q = _mm256_cvtepi32_ps(_mm256_and_si256(bytes[i], low));
                        _mm256_fmadd_ps(scale[i], q, offset[i])
                    });
                    multiply_into(&mut acc, &lo, |r| xrow(r, 2 * p));
                    let hi: [__m256; G] = std::array::from_fn(|i| {
                        let q = _mm256_cvtepi32_ps(_mm256_srli_epi32(bytes[i], 4));
                        _mm256_fmadd_ps(scale[i], q, offset[i])
                    });
                    multiply_into(&mut acc, &hi, |r| xrow(r, 2 * p + 1));
                }
            }
            CellValues::Bytes => {
                let (scale, offset) = scales();
                for p in 0..rows {
                    let wv: [__m256; G] = std::array::from_fn(|i| {
                        let q = _mm256_cvtepi8_epi32(_mm_loadl_epi64(
                            head[i].add(HEAD_BYTES + p * GROUP) as *const _,
                        ));
                        _mm256_fmadd_ps(scale[i], _mm256_cvtepi32_ps(q), offset[i])
                    });
                    multiply_into(&mut acc, &wv, |r| xrow(r, p));
                }
            }
            CellValues::Bf16 | CellValues::F16 => {
                for p in 0..rows {
                    let wv: [__m256; G] =
                        std::array::from_fn(|i| widen_floats(a.values, head[i].add(p * GROUP * 2)));
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
                    let o = a.out.add(r * a.stride + i * GROUP);
                    let sum = if first {
                        *v
                    } else {
                        _mm256_add_ps(_mm256_loadu_ps(o), *v)
                    };
                    _mm256_storeu_ps(o, sum);
                    *v = _mm256_setzero_ps();
                }
            }
        }
    }
}

/// `acc[r][i] += x(r) * w[i]` for every row and group.
#[inline(always)]
unsafe fn multiply_into<const R: usize, const G: usize>(
    acc: &mut [[__m256; G]; R],
    w: &[__m256; G],
    x: impl Fn(usize) -> __m256,
) {
    for (r, row) in acc.iter_mut().enumerate() {
        let xv = x(r);
        for (a, w) in row.iter_mut().zip(w) {
            *a = _mm256_fmadd_ps(xv, *w, *a);
        }
    }
}
