//! The process's peak resident memory, for benchmark reports.

/// Peak resident set size of this process in bytes (Linux `VmHWM`, model loading included);
/// `None` where the platform does not report it.
pub fn peak_rss_bytes() -> Option<u64> {
    status_bytes("VmHWM:")
}

/// Resident set size now (Linux `VmRSS`): after a request, the model plus what the cache holds.
pub fn rss_bytes() -> Option<u64> {
    status_bytes("VmRSS:")
}

fn status_bytes(field: &str) -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with(field))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}
