//! How the `kvb` process keeps freed memory. A prefill's products, attention and norms allocate
//! and free outputs of a few to tens of megabytes in every layer. glibc maps blocks from 128 KiB
//! up afresh (a threshold it raises only as such blocks are freed) and hands freed heap tops
//! above 128 KiB back to the system, so each layer's outputs were new pages the kernel zeroed
//! on first touch: a sixth of an 8-bit prefill of 512 tokens on a 1.7B model
//! (bench/results/2026-12-07-prefill-in-place). The process keeps blocks up to 32 MiB (glibc's
//! largest threshold) in its heap and up to 256 MiB of freed heap for reuse, in two arenas
//! (glibc's default, 8 per core, left each thread's freed blocks where other threads could not
//! reuse them: 45 MB more at the peak). A library embedding kvb leaves this to its program, as
//! the allocator is the process's.

/// Sets the policy above where the C library is glibc (elsewhere its allocator's own stays).
/// Call before any thread starts.
pub fn keep_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: `mallopt` sets glibc's malloc parameters and has no other effect; a value it
    // refuses (return 0) leaves its default, which is still correct.
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 32 << 20);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 256 << 20);
        libc::mallopt(libc::M_ARENA_MAX, 2);
    }
}
