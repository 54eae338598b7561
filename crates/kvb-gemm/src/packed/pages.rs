//! The bytes of a packed matrix (and of its 8-bit-activation layout). A decode step streams every weight once, so large matrices
//! live in an anonymous map that asks the kernel for huge pages (where it hands them out on
//! request, as Linux does by default): 512x fewer page faults while they are filled at load
//! and fewer TLB misses per step. Small ones, and any map the system refuses, are a `Vec`.

use std::ops::{Deref, DerefMut};

/// Sizes from which a map is worth it (one huge page).
const MAP_FROM: usize = 2 << 20;

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
                return Pages::Map(map);
            }
        }
        Pages::Heap(vec![0u8; len])
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

    /// Both kinds start zeroed, keep what is written and clone into bytes of their own.
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
            pages.iter_mut().for_each(|b| *b = 0);
            assert_eq!(copy.len(), len);
            assert!(copy
                .iter()
                .enumerate()
                .all(|(i, &b)| b == (i * 7 % 251) as u8));
        }
    }
}
