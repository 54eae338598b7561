//! The micro-kernel: an `MR x NR` block of `y` from one packed panel of `x` and one of `w`.
//!
//! With AVX2 and FMA, 12 of the 16 vector registers hold the block's sums, two hold the weight
//! row and one the broadcast `x` value: 12 fused multiply-adds per 2 loads and 6 broadcasts,
//! enough to keep both FMA units of a core busy. Elsewhere a portable loop rounds as
//! matrixmultiply's non-FMA kernels do.

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
