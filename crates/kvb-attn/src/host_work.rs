//! Counts of the work the host does for a device: kernel launches, uploads (host to device
//! copies) and reads (device to host copies).
//!
//! A GPU decode step of a small model is bound by this work, not by the device, so it is what
//! to count and cut. kvb counts where its own code launches or copies (its kernels, the model's
//! ops, index uploads, logits and token reads), per thread; a caller takes the difference of
//! [`so_far`] around a forward pass, or runs it under [`counted`]. A burn op that runs several
//! kernels counts as one: kvb-server's `launch_counts` test holds the count to CubeCL's own
//! execution log on a real decode step.

use std::cell::Cell;
use std::ops::{Add, AddAssign, Sub};

/// Launches, uploads and reads: a count of each.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HostWork {
    /// Kernels (or device ops) started.
    pub launches: u64,
    /// Host-to-device copies.
    pub uploads: u64,
    /// Device-to-host copies.
    pub reads: u64,
    /// Bytes those copies brought back.
    pub read_bytes: u64,
}

impl Add for HostWork {
    type Output = HostWork;
    fn add(self, o: HostWork) -> HostWork {
        HostWork {
            launches: self.launches + o.launches,
            uploads: self.uploads + o.uploads,
            reads: self.reads + o.reads,
            read_bytes: self.read_bytes + o.read_bytes,
        }
    }
}

impl AddAssign for HostWork {
    fn add_assign(&mut self, o: HostWork) {
        *self = *self + o;
    }
}

impl Sub for HostWork {
    type Output = HostWork;
    /// What happened between two readings of [`so_far`] (saturating: never negative).
    fn sub(self, o: HostWork) -> HostWork {
        HostWork {
            launches: self.launches.saturating_sub(o.launches),
            uploads: self.uploads.saturating_sub(o.uploads),
            reads: self.reads.saturating_sub(o.reads),
            read_bytes: self.read_bytes.saturating_sub(o.read_bytes),
        }
    }
}

thread_local! {
    static COUNTS: Cell<HostWork> = const {
        Cell::new(HostWork { launches: 0, uploads: 0, reads: 0, read_bytes: 0 })
    };
}

fn bump(f: impl FnOnce(&mut HostWork)) {
    COUNTS.with(|c| {
        let mut w = c.get();
        f(&mut w);
        c.set(w);
    });
}

/// `n` kernel launches (device ops) on this thread.
pub fn launched(n: u64) {
    bump(|w| w.launches += n);
}

/// `n` host-to-device copies on this thread.
pub fn uploaded(n: u64) {
    bump(|w| w.uploads += n);
}

/// A device-to-host copy of `bytes` on this thread.
pub fn read(bytes: u64) {
    bump(|w| {
        w.reads += 1;
        w.read_bytes += bytes;
    });
}

/// Everything counted on this thread so far.
pub fn so_far() -> HostWork {
    COUNTS.with(Cell::get)
}

/// Runs `f` and returns what it counted, leaving this thread's counts as they were: a caller
/// that runs `f` on another thread (a worker pool) adds the result to its own counts with
/// [`add`], and gets the same totals as if `f` had run on its thread.
pub fn counted<R>(f: impl FnOnce() -> R) -> (R, HostWork) {
    let before = so_far();
    let r = f();
    let work = so_far() - before;
    COUNTS.with(|c| c.set(before));
    (r, work)
}

/// Adds `work` (counted elsewhere) to this thread's counts.
pub fn add(work: HostWork) {
    bump(|w| *w += work);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counted_work_moves_to_the_caller_whichever_thread_ran_it() {
        let start = so_far();
        launched(2);
        // On this thread.
        let (_, here) = counted(|| {
            launched(3);
            uploaded(1);
        });
        assert_eq!(
            so_far() - start,
            HostWork {
                launches: 2,
                ..HostWork::default()
            }
        );
        add(here);
        // On another thread.
        let there = std::thread::spawn(|| {
            counted(|| {
                read(4);
                read(8);
                launched(1);
            })
            .1
        })
        .join()
        .unwrap();
        add(there);
        assert_eq!(
            so_far() - start,
            HostWork {
                launches: 6,
                uploads: 1,
                reads: 2,
                read_bytes: 12
            }
        );
    }
}
