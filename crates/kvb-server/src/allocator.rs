//! How the `kvb` process keeps freed memory. A prefill's products, attention and norms allocate
//! and free outputs of a few to tens of megabytes in every layer. glibc maps blocks from 128 KiB
//! up afresh (a threshold it raises only as such blocks are freed) and hands freed heap tops
//! above 128 KiB back to the system, so each layer's outputs were new pages the kernel zeroed
//! on first touch: a sixth of an 8-bit prefill of 512 tokens on a 1.7B model
//! (bench/results/2026-12-07-prefill-in-place). The process keeps blocks up to 32 MiB (glibc's
//! largest threshold) in its heap and up to 256 MiB of freed heap for reuse, in two arenas
//! (glibc's default, 8 per core, left each thread's freed blocks where other threads could not
//! reuse them: 45 MB more at the peak). A library embedding kvb leaves this to its program, as
//! the allocator is the process's. A load gives back the heap it freed
//! (`kvb_model::release_freed_host_memory`), so the policy keeps only what a prefill reuses.

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

// Only where the release does something: `malloc_trim` is glibc's, `/proc/self/statm` Linux's.
#[cfg(all(test, target_os = "linux", target_env = "gnu"))]
mod tests {
    /// Bytes of this process resident in memory (`/proc/self/statm`).
    fn resident() -> usize {
        let statm = std::fs::read_to_string("/proc/self/statm").expect("reading /proc/self/statm");
        let pages: usize = statm.split_whitespace().nth(1).unwrap().parse().unwrap();
        // SAFETY: sysconf reads a constant.
        pages * unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize
    }

    /// Under the policy, 160 freed blocks of 1 MiB below a live one stay resident, and the
    /// release gives them back. In a child process of its own: the policy and the measure are
    /// the whole process's, and other tests allocate meanwhile.
    #[test]
    fn freed_heap_is_given_back() {
        const NAME: &str = "allocator::tests::freed_heap_is_given_back";
        if std::env::var_os("KVB_ALLOCATOR_CHILD").is_none() {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--exact", NAME, "--nocapture", "--test-threads=1"])
                .env("KVB_ALLOCATOR_CHILD", "1")
                .output()
                .expect("running the test in a child process");
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            // A filter that matched nothing would pass too: the child must have run it.
            assert!(
                out.status.success() && stdout.contains("1 passed"),
                "{stdout}\n{stderr}"
            );
            return;
        }
        super::keep_freed_memory();
        let blocks: Vec<Vec<u8>> = (0..160).map(|i| vec![i as u8 | 1; 1 << 20]).collect();
        // Allocated after them and kept: the freed blocks cannot just shrink the heap's top.
        let live = vec![1u8; 4096];
        drop(blocks);
        let kept = resident();
        kvb_model::release_freed_host_memory();
        let after = resident();
        assert!(
            kept >= after + (100 << 20),
            "resident before the release {kept} bytes, after it {after}"
        );
        std::hint::black_box(live);
    }
}
