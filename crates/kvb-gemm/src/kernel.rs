//! The micro-kernel: an `MR x NR` block of `y` from one packed panel of `x` and one of `w`.
//!
//! With AVX2 and FMA, 12 of the 16 vector registers hold the block's sums, two hold the weight
//! row and one the broadcast `x` value: 12 fused multiply-adds per 2 loads and 6 broadcasts,
//! enough to keep both FMA units of a core busy. With AVX-512 a row of a panel is one 16-lane
//! register, and [`sweep`] runs two row panels by two column panels at once (a 12 x 32 block:
//! 24 of the 32 registers, 24 multiply-adds per 2 loads and 12 broadcasts). Elsewhere a portable
//! loop rounds as matrixmultiply's non-FMA kernels do.
//!
//! Every variant sums each output the same way (from zero, one multiply-add per reduction step
//! in order, then `alpha *` and the store or add), so which one ran never shows in the bits.

use crate::Isa;

/// Rows of the output block.
pub const MR: usize = 6;
/// Columns of the output block.
pub const NR: usize = 16;

/// One reduction block of one output block.
pub(crate) struct Block<'a> {
    /// Reduction length (at most `KC`).
    pub kc: usize,
    /// `[kc, MR]`: row `r`'s value `p` at `p * MR + r`.
    pub a: &'a [f32],
    /// `[kc, NR]`: column `j`'s value `p` at `p * NR + j`.
    pub b: &'a [f32],
    /// Output rows and columns to store (the rest of the block is padding).
    pub rows: usize,
    pub cols: usize,
    /// The sums are multiplied by this (and rounded) before they are stored or added, as BLAS's
    /// alpha; the same wherever the block lies (matrixmultiply fuses the multiply and the add
    /// in whole blocks only: the same bits when alpha is 1).
    pub alpha: f32,
    /// The first reduction block stores its sums; later ones add theirs to the output.
    pub first: bool,
}

/// One reduction block over a run of output blocks: every `MR`-row panel of `a` against every
/// `NR`-column panel of `b`.
pub(crate) struct Sweep<'a> {
    /// Reduction length (at most `KC`).
    pub kc: usize,
    /// Row panels, each `[kc, MR]`, the one of rows `i..i + MR` at `(i / MR) * a_step`.
    pub a: &'a [f32],
    pub a_step: usize,
    /// Output rows (the last panel may be partly padding).
    pub rows: usize,
    /// Column panels, each `[kc, NR]`, the one of columns `j..j + NR` at `(j / NR) * b_step`.
    pub b: &'a [f32],
    pub b_step: usize,
    /// Output columns.
    pub cols: usize,
    /// As [`Block::alpha`] and [`Block::first`].
    pub alpha: f32,
    pub first: bool,
}

/// Stores (or adds) the sums of every output block of `s` at `c` (row `i`, column `j` at
/// `c + i * ldc + j`), with the widest kernel `isa` allows.
///
/// # Safety
/// `c` must address `s.rows` rows of `s.cols` writable values, `ldc` apart, that no other thread
/// touches during the call; `isa` must be one this CPU runs ([`Isa::supported`]).
pub(crate) unsafe fn sweep(s: &Sweep, c: *mut f32, ldc: usize, isa: Isa) {
    let (row_panels, col_panels) = (s.rows.div_ceil(MR), s.cols.div_ceil(NR));
    assert!(
        s.rows == 0
            || s.cols == 0
            || (s.a.len() >= (row_panels - 1) * s.a_step + s.kc * MR
                && s.b.len() >= (col_panels - 1) * s.b_step + s.kc * NR),
        "gemm sweep: operand sizes"
    );
    #[cfg(target_arch = "x86_64")]
    if isa == Isa::Avx512 {
        // SAFETY: the caller checked the CPU and the output; the panels were checked above.
        unsafe { avx512::sweep(s, c, ldc) };
        return;
    }
    for j in (0..s.cols).step_by(NR) {
        for i in (0..s.rows).step_by(MR) {
            let block = Block {
                kc: s.kc,
                a: &s.a[i / MR * s.a_step..][..s.kc * MR],
                b: &s.b[j / NR * s.b_step..][..s.kc * NR],
                rows: MR.min(s.rows - i),
                cols: NR.min(s.cols - j),
                alpha: s.alpha,
                first: s.first,
            };
            // SAFETY: the block lies inside the output the caller handed over.
            unsafe { run(&block, c.add(i * ldc + j), ldc, isa >= Isa::Avx2Fma) };
        }
    }
}

/// Stores (or adds) the block's sums at `c`, `ldc` values per output row.
///
/// # Safety
/// `c` must address `block.rows` rows of `block.cols` writable values, `ldc` apart, that no other
/// thread touches during the call; `fused` only where the CPU has AVX2 and FMA (elsewhere the
/// portable loop runs, with separate multiplies and adds).
pub(crate) unsafe fn run(block: &Block, c: *mut f32, ldc: usize, fused: bool) {
    assert!(
        block.a.len() >= block.kc * MR
            && block.b.len() >= block.kc * NR
            && block.rows <= MR
            && block.cols <= NR,
        "gemm kernel: operand sizes"
    );
    #[cfg(target_arch = "x86_64")]
    if fused {
        // SAFETY: the caller checked the CPU; the operands were checked above.
        unsafe { avx2::run(block, c, ldc) };
        return;
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = fused;
    let mut sums = [[0f32; NR]; MR];
    for p in 0..block.kc {
        let b = &block.b[p * NR..][..NR];
        for (r, row) in sums.iter_mut().enumerate() {
            let a = block.a[p * MR + r];
            for (s, &bv) in row.iter_mut().zip(b) {
                *s += a * bv;
            }
        }
    }
    // SAFETY: as the caller promised.
    unsafe { store(&sums, block, c, ldc) };
}

/// Writes `sums` into the output block's valid part.
///
/// # Safety
/// As for [`run`].
unsafe fn store(sums: &[[f32; NR]; MR], block: &Block, c: *mut f32, ldc: usize) {
    for (r, row) in sums.iter().enumerate().take(block.rows) {
        for (j, &s) in row.iter().enumerate().take(block.cols) {
            // SAFETY: row r < rows, column j < cols, inside the block the caller handed over.
            let out = unsafe { &mut *c.add(r * ldc + j) };
            let s = block.alpha * s;
            *out = if block.first { s } else { *out + s };
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{Block, MR, NR};
    use std::arch::x86_64::*;

    /// # Safety
    /// The CPU has AVX2 and FMA; the operands are as [`super::run`] checked and promised.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn run(block: &Block, c: *mut f32, ldc: usize) {
        let mut sums = [[_mm256_setzero_ps(); 2]; MR];
        let (mut a, mut b) = (block.a.as_ptr(), block.b.as_ptr());
        let alpha = _mm256_set1_ps(block.alpha);
        for _ in 0..block.kc {
            // SAFETY: p < kc, and a holds kc * MR values, b kc * NR.
            unsafe {
                let b0 = _mm256_loadu_ps(b);
                let b1 = _mm256_loadu_ps(b.add(8));
                for (r, s) in sums.iter_mut().enumerate() {
                    let av = _mm256_broadcast_ss(&*a.add(r));
                    s[0] = _mm256_fmadd_ps(av, b0, s[0]);
                    s[1] = _mm256_fmadd_ps(av, b1, s[1]);
                }
                a = a.add(MR);
                b = b.add(NR);
            }
        }
        if block.rows == MR && block.cols == NR {
            for (r, s) in sums.iter().enumerate() {
                // SAFETY: a whole block: MR rows of NR values from c, ldc apart.
                unsafe {
                    let out = c.add(r * ldc);
                    let (lo, hi) = (_mm256_mul_ps(alpha, s[0]), _mm256_mul_ps(alpha, s[1]));
                    if block.first {
                        _mm256_storeu_ps(out, lo);
                        _mm256_storeu_ps(out.add(8), hi);
                    } else {
                        _mm256_storeu_ps(out, _mm256_add_ps(_mm256_loadu_ps(out), lo));
                        _mm256_storeu_ps(
                            out.add(8),
                            _mm256_add_ps(_mm256_loadu_ps(out.add(8)), hi),
                        );
                    }
                }
            }
            return;
        }
        let mut values = [[0f32; NR]; MR];
        for (row, s) in values.iter_mut().zip(&sums) {
            // SAFETY: each row of `values` holds NR = 16 floats.
            unsafe {
                _mm256_storeu_ps(row.as_mut_ptr(), s[0]);
                _mm256_storeu_ps(row.as_mut_ptr().add(8), s[1]);
            }
        }
        // SAFETY: as the caller promised.
        unsafe { super::store(&values, block, c, ldc) };
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::{Sweep, MR, NR};
    use std::arch::x86_64::*;

    /// [`super::sweep`] in blocks of up to two row panels by two column panels.
    ///
    /// # Safety
    /// The CPU has AVX-512F; the rest as [`super::sweep`] checked and promised.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn sweep(s: &Sweep, c: *mut f32, ldc: usize) {
        let (a, b) = (s.a.as_ptr(), s.b.as_ptr());
        for j in (0..s.cols).step_by(2 * NR) {
            let bp = b.add(j / NR * s.b_step);
            let b_pair = [bp, bp.add(if s.cols - j > NR { s.b_step } else { 0 })];
            for i in (0..s.rows).step_by(2 * MR) {
                let ap = a.add(i / MR * s.a_step);
                let out = c.add(i * ldc + j);
                let (rows, cols) = ((s.rows - i).min(2 * MR), (s.cols - j).min(2 * NR));
                // SAFETY: panels i / MR (and the next one where rows > MR) of a, j / NR (and the
                // next where cols > NR) of b exist (checked by the caller); the output block
                // `rows x cols` at `out` lies inside c.
                unsafe {
                    match (rows > MR, cols > NR) {
                        (true, true) => {
                            block::<2, 2>(s, [ap, ap.add(s.a_step)], b_pair, out, ldc, rows, cols)
                        }
                        (true, false) => {
                            block::<2, 1>(s, [ap, ap.add(s.a_step)], [bp], out, ldc, rows, cols)
                        }
                        (false, true) => block::<1, 2>(s, [ap], b_pair, out, ldc, rows, cols),
                        (false, false) => block::<1, 1>(s, [ap], [bp], out, ldc, rows, cols),
                    }
                }
            }
        }
    }

    /// `RP` row panels by `CP` column panels, `rows x cols` of it stored: the sums in
    /// `RP * MR * CP` registers, one 16-lane register per panel row.
    #[target_feature(enable = "avx512f")]
    #[inline]
    #[allow(clippy::too_many_arguments)]
    unsafe fn block<const RP: usize, const CP: usize>(
        s: &Sweep,
        a: [*const f32; RP],
        b: [*const f32; CP],
        out: *mut f32,
        ldc: usize,
        rows: usize,
        cols: usize,
    ) {
        let mut sums = [[[_mm512_setzero_ps(); CP]; MR]; RP];
        for p in 0..s.kc {
            // SAFETY: p < kc, and every panel holds kc rows of MR (a) or NR (b) values.
            unsafe {
                let mut bv = [_mm512_setzero_ps(); CP];
                for (v, panel) in bv.iter_mut().zip(&b) {
                    *v = _mm512_loadu_ps(panel.add(p * NR));
                }
                for (panel_sums, panel) in sums.iter_mut().zip(&a) {
                    for (r, row) in panel_sums.iter_mut().enumerate() {
                        let av = _mm512_set1_ps(*panel.add(p * MR + r));
                        for (acc, w) in row.iter_mut().zip(&bv) {
                            *acc = _mm512_fmadd_ps(av, *w, *acc);
                        }
                    }
                }
            }
        }
        let alpha = _mm512_set1_ps(s.alpha);
        for (q, panel_sums) in sums.iter().enumerate() {
            for (r, row) in panel_sums.iter().enumerate() {
                let i = q * MR + r;
                if i >= rows {
                    return;
                }
                for (h, acc) in row.iter().enumerate() {
                    let j = h * NR;
                    if j >= cols {
                        break;
                    }
                    let width = (cols - j).min(NR);
                    let mask: __mmask16 = if width == NR { !0 } else { (1 << width) - 1 };
                    let v = _mm512_mul_ps(alpha, *acc);
                    // SAFETY: row i < rows and columns j..j + width < cols of the block; the
                    // masked lanes are neither read nor written.
                    unsafe {
                        let o = out.add(i * ldc + j);
                        let v = if s.first {
                            v
                        } else {
                            _mm512_add_ps(_mm512_maskz_loadu_ps(mask, o), v)
                        };
                        _mm512_mask_storeu_ps(o, mask, v);
                    }
                }
            }
        }
    }
}
