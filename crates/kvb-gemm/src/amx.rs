//! Whether this process may run Intel AMX's tile instructions (8-bit tile products,
//! [`crate::int8`]'s prefill kernel): the CPU lists AMX-TILE and AMX-INT8, the OS saves the
//! tile state (XCR0), Linux grants it to this process (`ARCH_REQ_XCOMP_PERM`), and a child
//! process runs one tile product without dying. The last check is there because some KVM
//! guests pass every other check and then kill the process on the first tile instruction
//! (bench/results/2026-12-06-peers-llama3.2-1b-q4_k_m-emr).

/// The tile configuration `ldtilecfg` reads (palette 1): each tile's rows and bytes per row.
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
#[repr(C, align(64))]
pub(crate) struct TileConfig {
    palette: u8,
    start_row: u8,
    reserved: [u8; 14],
    bytes_per_row: [u16; 16],
    rows: [u8; 16],
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
impl TileConfig {
    /// Tiles `0..shapes.len()` with `(rows, bytes per row)` each; the others unused.
    pub(crate) fn new(shapes: &[(u8, u16)]) -> TileConfig {
        let mut config = TileConfig {
            palette: 1,
            start_row: 0,
            reserved: [0; 14],
            bytes_per_row: [0; 16],
            rows: [0; 16],
        };
        for (t, &(rows, bytes)) in shapes.iter().enumerate() {
            (config.rows[t], config.bytes_per_row[t]) = (rows, bytes);
        }
        config
    }
}

/// Whether AMX's 8-bit tile products run here, checked once per process (the permission
/// it asks for is the process's, for every thread).
pub(crate) fn usable() -> bool {
    static USABLE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *USABLE.get_or_init(check)
}

#[cfg(not(all(target_arch = "x86_64", target_os = "linux")))]
fn check() -> bool {
    false
}

#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn check() -> bool {
    use std::arch::x86_64::{__cpuid, __cpuid_count};
    // Leaf 7's EDX: AMX-TILE (bit 24) and AMX-INT8 (25); leaf 1's ECX: OSXSAVE (27).
    if __cpuid(0).eax < 7 || __cpuid(1).ecx & (1 << 27) == 0 {
        return false;
    }
    let listed = __cpuid_count(7, 0).edx;
    if listed & (3 << 24) != 3 << 24 {
        return false;
    }
    // XCR0's tile configuration (17) and tile data (18) state.
    let (low, _high): (u32, u32);
    // SAFETY: OSXSAVE is set, so `xgetbv` runs; it reads a register and touches no memory.
    unsafe {
        std::arch::asm!("xgetbv", in("ecx") 0, out("eax") low, out("edx") _high,
            options(nomem, nostack, preserves_flags));
    }
    if low & (3 << 17) != 3 << 17 {
        return false;
    }
    const ARCH_REQ_XCOMP_PERM: libc::c_long = 0x1023;
    const XFEATURE_XTILEDATA: libc::c_long = 18;
    // SAFETY: a system call with two integer arguments; it changes what this process may run.
    if unsafe {
        libc::syscall(
            libc::SYS_arch_prctl,
            ARCH_REQ_XCOMP_PERM,
            XFEATURE_XTILEDATA,
        )
    } != 0
    {
        return false;
    }
    runs_in_a_child()
}

/// Runs one tile product in a forked child: whether it exited normally (a guest that does not
/// run AMX kills it with SIGILL, and this process lives on).
#[cfg(all(target_arch = "x86_64", target_os = "linux"))]
fn runs_in_a_child() -> bool {
    let config = TileConfig::new(&[(1, 4), (1, 4), (1, 4)]);
    let bytes = [1u8; 64];
    // SAFETY: the child only runs the tile instructions on memory it already has and leaves by
    // `_exit`, which is safe after `fork` in a threaded process (no lock, no allocation).
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: the permission was granted above; the tiles read `bytes` and `config`.
        unsafe {
            std::arch::asm!(
                "ldtilecfg [{config}]",
                "tilezero tmm0",
                "tileloadd tmm1, [{bytes} + {stride}]",
                "tileloadd tmm2, [{bytes} + {stride}]",
                "tdpbsud tmm0, tmm1, tmm2",
                "tilerelease",
                config = in(reg) &config,
                bytes = in(reg) bytes.as_ptr(),
                stride = in(reg) 4usize,
                options(nostack, readonly),
            );
            libc::_exit(0);
        }
    }
    if pid < 0 {
        return false;
    }
    let mut status = 0;
    loop {
        // SAFETY: waits for the child made above; `status` is a valid out-pointer.
        let done = unsafe { libc::waitpid(pid, &mut status, 0) };
        if done == pid {
            return libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 0;
        }
        if std::io::Error::last_os_error().kind() != std::io::ErrorKind::Interrupted {
            return false;
        }
    }
}
