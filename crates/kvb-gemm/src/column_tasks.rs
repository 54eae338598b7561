//! Who computes which columns of a product `y [m, n]`: parallel tasks, each owning a range of
//! columns and writing its [`Tile`] of `y` in place.
//!
//! [`in_column_ranges`] cuts `n` into ranges of one width, for the f32 few-row products whose
//! kernels tile by that width. [`in_column_shares`] lets every thread of the pool take ranges
//! from a shared cursor, each a share of the columns still left, so the ranges shrink to one
//! unit towards the end: a decode step's products are short (tens of microseconds each), and
//! with ranges of an eighth of the columns the thread that finished first waited for the other
//! to end its last range (bench/results/2026-12-07-column-shares).
//!
//! Which thread computes a column never changes its value: each column's sums are the
//! kernel's, whatever range it falls in.

use crate::tile::Tile;
use rayon::prelude::*;
use std::sync::atomic::{AtomicUsize, Ordering};

/// `y [m, n]` computed in parallel tasks, each owning columns `j0..j0 + cols` (`width` wide, the
/// last narrower) and filling them through `fill(j0, cols, tile)`, the tile being those columns
/// of `y`'s rows, in place.
pub(crate) fn in_column_ranges(
    m: usize,
    n: usize,
    width: usize,
    fill: impl Fn(usize, usize, &mut Tile) + Sync,
) -> Vec<f32> {
    assert!(width > 0, "column tasks of no width");
    in_place(m, n, |out| {
        (0..n.div_ceil(width)).into_par_iter().for_each(|t| {
            let (j0, cols) = (t * width, width.min(n - t * width));
            // SAFETY: task `t` alone writes columns `j0..j0 + cols`.
            fill(j0, cols, &mut unsafe { out.tile(j0, cols) });
        })
    })
}

/// `y [m, n]` computed by every thread of the pool taking ranges of whole `unit`s of columns
/// (the last unit narrower where `unit` does not divide `n`) until none are left, each range
/// [`share`] of those left, and filling them through `fill(j0, cols, tile)` as
/// [`in_column_ranges`] does.
pub(crate) fn in_column_shares(
    m: usize,
    n: usize,
    unit: usize,
    fill: impl Fn(usize, usize, &mut Tile) + Sync,
) -> Vec<f32> {
    assert!(unit > 0, "column shares of no width");
    let (units, threads) = (n.div_ceil(unit), rayon::current_num_threads());
    let next = AtomicUsize::new(0);
    in_place(m, n, |out| {
        let work = || {
            while let Some((u0, taken)) = take(&next, units, threads) {
                let (j0, cols) = (u0 * unit, (taken * unit).min(n - u0 * unit));
                // SAFETY: the cursor hands each unit to one taker, so this range's columns
                // are written here alone.
                fill(j0, cols, &mut unsafe { out.tile(j0, cols) });
            }
        };
        if threads == 1 || units <= 1 {
            work();
        } else {
            // The caller works too; a helper that starts after the cursor ran out returns at
            // once.
            rayon::scope(|s| {
                for _ in 1..threads {
                    s.spawn(|_| work());
                }
                work();
            });
        }
    })
}

/// How many of the `left` units a taker gets: a half of an even split of them among `threads`,
/// at least one. The first ranges are long (a contiguous run of the weight each) and the last
/// ones a single unit, so the takers end within a unit of each other.
fn share(left: usize, threads: usize) -> usize {
    left.div_ceil(2 * threads).max(1)
}

/// The next range of the `units` from `next`: its first unit and length, or `None` when all are
/// taken.
fn take(next: &AtomicUsize, units: usize, threads: usize) -> Option<(usize, usize)> {
    let mut at = next.load(Ordering::Relaxed);
    loop {
        if at >= units {
            return None;
        }
        let taken = share(units - at, threads);
        match next.compare_exchange_weak(at, at + taken, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return Some((at, taken)),
            Err(now) => at = now,
        }
    }
}

/// `y [m, n]`, zeroed, after `write` has filled it through tiles of its columns.
fn in_place(m: usize, n: usize, write: impl FnOnce(Output)) -> Vec<f32> {
    let mut y = vec![0f32; m * n];
    write(Output {
        first: y.as_mut_ptr(),
        m,
        n,
    });
    y
}

/// Where the column tasks write: `y`'s first value and its shape.
#[derive(Clone, Copy)]
struct Output {
    first: *mut f32,
    m: usize,
    n: usize,
}

// SAFETY: the tasks write disjoint columns through it.
unsafe impl Send for Output {}
unsafe impl Sync for Output {}

impl Output {
    /// Columns `j0..j0 + cols` of every row of `y` (a method, so closures capture the `Sync`
    /// wrapper).
    ///
    /// # Safety
    /// `y` outlives `'a`, `j0 + cols <= n`, and no other tile holds these columns meanwhile.
    unsafe fn tile<'a>(self, j0: usize, cols: usize) -> Tile<'a> {
        // SAFETY: `first` points at `m` rows of `n` values (the caller's promises do the rest).
        unsafe { Tile::from_raw(self.first.wrapping_add(j0), self.m, cols, self.n) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::Mutex;

    /// Writes `r * 1000 + column` at each of the tile's places, checking its shape.
    fn mark(m: usize, j0: usize, cols: usize, tile: &mut Tile) {
        assert_eq!((tile.rows(), tile.cols()), (m, cols));
        for r in 0..m {
            for (c, v) in tile.row(r).iter_mut().enumerate() {
                *v = (r * 1000 + j0 + c) as f32;
            }
        }
    }

    fn each_marked(y: &[f32], m: usize, n: usize) -> Result<(), TestCaseError> {
        prop_assert_eq!(y.len(), m * n);
        for (i, v) in y.iter().enumerate() {
            prop_assert_eq!(*v, ((i / n) * 1000 + i % n) as f32, "element {}", i);
        }
        Ok(())
    }

    proptest! {
        /// The column tasks write their tiles in place: every value of `y` comes from the task
        /// owning its column, at its row, whatever the widths (a last task narrower).
        #[test]
        fn column_tasks_fill_their_own_columns(m in 1usize..9, n in 1usize..70, width in 1usize..20) {
            let y = in_column_ranges(m, n, width, |j0, cols, tile| mark(m, j0, cols, tile));
            each_marked(&y, m, n)?;
        }

        /// The shares cover every column once, start on whole units and end narrower only at
        /// `n`, on any number of threads.
        #[test]
        fn column_shares_cover_each_column_once(
            m in 1usize..5,
            n in 1usize..300,
            unit in 1usize..40,
            threads in 1usize..5,
        ) {
            let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().unwrap();
            let ranges = Mutex::new(Vec::new());
            let y = pool.install(|| {
                in_column_shares(m, n, unit, |j0, cols, tile| {
                    ranges.lock().unwrap().push((j0, cols));
                    mark(m, j0, cols, tile);
                })
            });
            each_marked(&y, m, n)?;
            let mut ranges = ranges.into_inner().unwrap();
            ranges.sort_unstable();
            let mut end = 0;
            for (j0, cols) in ranges {
                prop_assert_eq!(j0, end, "ranges overlap or leave a gap");
                prop_assert!(j0 % unit == 0 && cols > 0);
                prop_assert!(cols % unit == 0 || j0 + cols == n, "a narrow range inside");
                end = j0 + cols;
            }
            prop_assert_eq!(end, n);
        }
    }

    /// The ranges shrink to a single unit towards the end, from long first ones.
    #[test]
    fn shares_shrink_to_one_unit() {
        let next = AtomicUsize::new(0);
        let lengths: Vec<usize> = std::iter::from_fn(|| take(&next, 192, 2))
            .map(|(_, taken)| taken)
            .collect();
        assert_eq!(lengths.iter().sum::<usize>(), 192);
        assert_eq!(lengths[0], 48, "{lengths:?}");
        assert!(lengths.windows(2).all(|w| w[1] <= w[0]), "{lengths:?}");
        assert_eq!(*lengths.last().unwrap(), 1, "{lengths:?}");
        assert!(lengths.len() < 32, "{} ranges: {lengths:?}", lengths.len());
    }
}
