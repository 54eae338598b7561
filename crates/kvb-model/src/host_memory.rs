//! The host heap that a pass over many rows, or a load, freed, handed back to the system: glibc
//! keeps freed pages in its arenas (and a program may ask it to keep more, as the `kvb` binary
//! does), so they would count as the process's memory for the whole run.

/// Returns the heap's free pages to the system where the C library is glibc (`malloc_trim`);
/// elsewhere nothing.
pub fn release_freed_host_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free pages; it touches no live allocation.
    unsafe {
        libc::malloc_trim(0);
    }
}
