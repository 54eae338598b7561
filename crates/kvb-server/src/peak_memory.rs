//! The process's peak resident memory, for benchmark reports.

/// Peak resident set size of this process in bytes (Linux `VmHWM`); `None` where the platform does
/// not report it.
pub fn peak_rss_bytes() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
