//! Which RAM chunk leaves first when the byte budget is full.

/// An eviction policy. Pinned chunks are never evicted under any policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EvictionPolicy {
    /// Least recently used first.
    Lru,
    /// Least frequently used first, counting every hit (not only re-stores), among chunks not used
    /// within the last `recency_window` accesses (so a chunk just stored is not evicted before it
    /// can prove itself); ties go to the least recently used.
    Frequency {
        /// How many of the most recent accesses protect a chunk.
        recency_window: u64,
    },
}

impl Default for EvictionPolicy {
    fn default() -> Self {
        EvictionPolicy::Frequency { recency_window: 64 }
    }
}

/// What a policy sees of a chunk.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Usage {
    pub hits: u64,
    /// Logical time of the last access (store or hit).
    pub last_access: u64,
    pub pinned: bool,
}

impl EvictionPolicy {
    /// The index of the chunk to evict among `usages`, at logical time `now`; `None` if every
    /// chunk is pinned.
    pub(crate) fn victim<K: Copy>(
        &self,
        usages: impl Iterator<Item = (K, Usage)>,
        now: u64,
    ) -> Option<K> {
        let candidates: Vec<(K, Usage)> = usages.filter(|(_, u)| !u.pinned).collect();
        match *self {
            EvictionPolicy::Lru => candidates
                .iter()
                .min_by_key(|(_, u)| u.last_access)
                .map(|(k, _)| *k),
            EvictionPolicy::Frequency { recency_window } => {
                let old_enough = |u: &Usage| now.saturating_sub(u.last_access) >= recency_window;
                let pool: Vec<&(K, Usage)> = if candidates.iter().any(|(_, u)| old_enough(u)) {
                    candidates.iter().filter(|(_, u)| old_enough(u)).collect()
                } else {
                    candidates.iter().collect()
                };
                pool.into_iter()
                    .min_by_key(|(_, u)| (u.hits, u.last_access))
                    .map(|(k, _)| *k)
            }
        }
    }
}
