//! A task's block of a product's output, written in place: `rows` rows of `cols` values, each
//! row `stride` values after the last. Column tasks ([`crate::column_tasks`]) each
//! own one, side by side in the same rows, so no task fills a scratch tile to be copied: a
//! prefill's tiles were fresh allocations the kernel zeroed page by page, then copied (about a
//! tenth of an 8-bit prefill on a 1.7B model, bench/results/2026-12-07-prefill-in-place).

use std::marker::PhantomData;

/// Rows of `cols` values, `stride` apart, borrowed mutably (see the module doc).
pub(crate) struct Tile<'a> {
    at: *mut f32,
    rows: usize,
    cols: usize,
    stride: usize,
    _out: PhantomData<&'a mut [f32]>,
}

impl<'a> Tile<'a> {
    /// All of `out` as `rows` contiguous rows of `cols` values.
    #[cfg(test)]
    pub(crate) fn whole(out: &'a mut [f32], rows: usize, cols: usize) -> Self {
        assert!(
            out.len() >= rows * cols,
            "a tile of [{rows}, {cols}] over {} values",
            out.len()
        );
        Tile {
            at: out.as_mut_ptr(),
            rows,
            cols,
            stride: cols,
            _out: PhantomData,
        }
    }

    /// The tile at `at`.
    ///
    /// # Safety
    /// For `r < rows`, the `cols` values from `at + r * stride` are valid to write for `'a`,
    /// and nothing else reads or writes them meanwhile.
    pub(crate) unsafe fn from_raw(at: *mut f32, rows: usize, cols: usize, stride: usize) -> Self {
        debug_assert!(rows <= 1 || cols <= stride);
        Tile {
            at,
            rows,
            cols,
            stride,
            _out: PhantomData,
        }
    }

    pub(crate) fn rows(&self) -> usize {
        self.rows
    }

    pub(crate) fn cols(&self) -> usize {
        self.cols
    }

    /// Values from one row's start to the next's.
    pub(crate) fn stride(&self) -> usize {
        self.stride
    }

    /// Row `r`'s `cols` values.
    pub(crate) fn row(&mut self, r: usize) -> &mut [f32] {
        assert!(r < self.rows, "row {r} of a tile of {}", self.rows);
        // SAFETY: row `r` is the tile's, which it borrows mutably (`from_raw`'s promise).
        unsafe { std::slice::from_raw_parts_mut(self.at.add(r * self.stride), self.cols) }
    }

    /// The first row's first value, for kernels that write rows `stride` apart.
    pub(crate) fn as_mut_ptr(&mut self) -> *mut f32 {
        self.at
    }
}
