//! The bytes of a packed matrix (and of its 8-bit-activation layout). A decode step streams every weight once, so large matrices
//! live in an anonymous map that asks the kernel for huge pages (where it hands them out on
//! request, as Linux does by default): 512x fewer page faults while they are filled at load
//! and fewer TLB misses per step. Small ones, and any map the system refuses, are a `Vec`.

use std::ops::{Deref, DerefMut};
use std::sync::atomic::{AtomicUsize, Ordering};

/// Sizes from which a map is worth it (one huge page).
const MAP_FROM: usize = 2 << 20;

/// Bytes in maps now, and the most at once since [`reset_mapped_peak`].
static MAPPED: AtomicUsize = AtomicUsize::new(0);
static MAPPED_PEAK: AtomicUsize = AtomicUsize::new(0);

/// Bytes of packed weights the process holds in maps (matrices of 2 MiB and more, released
/// pages included), now and at most since [`reset_mapped_peak`]: whether a conversion re-laid
/// its matrices in place or beside copies.
pub fn mapped_bytes() -> (usize, usize) {
    (
        MAPPED.load(Ordering::Relaxed),
        MAPPED_PEAK.load(Ordering::Relaxed),
    )
}

/// Starts [`mapped_bytes`]'s peak again from what is mapped now.
pub fn reset_mapped_peak() {
    MAPPED_PEAK.store(MAPPED.load(Ordering::Relaxed), Ordering::Relaxed);
}

/// Zeroed, owned bytes.
pub(crate) enum Pages {
    Heap(Vec<u8>),
    Map(memmap2::MmapMut),
}

impl Pages {
    /// `len` zero bytes.
    pub(crate) fn zeroed(len: usize) -> Pages {
        if len >= MAP_FROM {
            if let Ok(map) = memmap2::MmapMut::map_anon(len) {
                // Advice only: without huge pages the map still works.
                #[cfg(target_os = "linux")]
                let _ = map.advise(memmap2::Advice::HugePage);
                let now = MAPPED.fetch_add(len, Ordering::Relaxed) + len;
                MAPPED_PEAK.fetch_max(now, Ordering::Relaxed);
                return Pages::Map(map);
            }
        }
        Pages::Heap(vec![0u8; len])
    }

    /// Gives the whole pages within `range` back to the system, so a conversion that has read
    /// them no longer holds them: they read as zeros afterwards. A `Vec` keeps its bytes.
    pub(crate) fn release(&mut self, range: std::ops::Range<usize>) {
        const PAGE: usize = 4096;
        let (start, end) = (
            range.start.next_multiple_of(PAGE),
            range.end.min(self.len()),
        );
        let end = end - end % PAGE;
        #[cfg(unix)]
        if let (Pages::Map(map), true) = (&*self, start < end) {
            // SAFETY: `&mut self` means nothing else reads these bytes; a private anonymous
            // map's dropped pages come back as zeros, valid `u8`s. The map's start is
            // page-aligned, so `start..end` covers whole pages only.
            let _ = unsafe {
                map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, start, end - start)
            };
        }
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        if let Pages::Map(map) = self {
            MAPPED.fetch_sub(map.len(), Ordering::Relaxed);
        }
    }
}

impl Deref for Pages {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Pages::Heap(v) => v,
            Pages::Map(m) => m,
        }
    }
}

impl DerefMut for Pages {
    fn deref_mut(&mut self) -> &mut [u8] {
        match self {
            Pages::Heap(v) => v,
            Pages::Map(m) => m,
        }
    }
}

impl Clone for Pages {
    fn clone(&self) -> Pages {
        let mut copy = Pages::zeroed(self.len());
        copy.copy_from_slice(self);
        copy
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Both kinds start zeroed, keep what is written, clone into bytes of their own and release
    /// whole pages of a map only.
    #[test]
    fn pages_start_zeroed_and_clones_are_copies() {
        for len in [0, 1000, MAP_FROM + 4097] {
            let mut pages = Pages::zeroed(len);
            assert_eq!(pages.len(), len);
            assert!(pages.iter().all(|&b| b == 0), "{len} bytes not zeroed");
            assert_eq!(
                matches!(pages, Pages::Map(_)),
                len >= MAP_FROM,
                "{len} bytes"
            );
            for (i, b) in pages.iter_mut().enumerate() {
                *b = (i * 7 % 251) as u8;
            }
            let copy = pages.clone();
            // Released bytes read as zeros in a map (whole pages only); a `Vec` keeps them.
            let (from, to) = (len / 3, 2 * len / 3);
            let mut released = pages.clone();
            released.release(from..to);
            for (i, &b) in released.iter().enumerate() {
                let gone = matches!(released, Pages::Map(_))
                    && i >= from.next_multiple_of(4096)
                    && i < to - to % 4096;
                assert_eq!(
                    b,
                    if gone { 0 } else { (i * 7 % 251) as u8 },
                    "byte {i} of {len}"
                );
            }
            pages.iter_mut().for_each(|b| *b = 0);
            assert_eq!(copy.len(), len);
            assert!(copy
                .iter()
                .enumerate()
                .all(|(i, &b)| b == (i * 7 % 251) as u8));
        }
    }
}
