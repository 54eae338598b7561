//! `--summary`: what a whole replay did, for benchmarks: wall time, aggregate decode rate, TTFT
//! percentiles, and the pool's memory against the memory of the distinct tokens it served.

use kvb_engine::PoolStats;
use serde::Serialize;
use std::collections::HashMap;

/// The distinct tokens of a set of sequences: the nodes of their prefix trie. A system prompt
/// behind sixteen chats counts once; each chat's own turns and answers count once each.
#[derive(Default)]
pub struct TokenTrie {
    children: Vec<HashMap<u32, usize>>,
}

impl TokenTrie {
    /// Adds a sequence.
    pub fn add(&mut self, tokens: &[u32]) {
        if self.children.is_empty() {
            self.children.push(HashMap::new());
        }
        let mut at = 0;
        for &t in tokens {
            at = match self.children[at].get(&t) {
                Some(&next) => next,
                None => {
                    let next = self.children.len();
                    self.children.push(HashMap::new());
                    self.children[at].insert(t, next);
                    next
                }
            };
        }
    }

    /// Distinct tokens (trie nodes but the root).
    pub fn len(&self) -> usize {
        self.children.len().saturating_sub(1)
    }
}

/// The `p`-th percentile (0..=100) of `v`, nearest rank.
pub fn percentile(v: &[f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * s.len() as f64).ceil().max(1.0) as usize;
    s[rank.min(s.len()) - 1]
}

/// The summary file.
#[derive(Serialize)]
pub struct Summary {
    pub requests: usize,
    pub failed: usize,
    pub clients: usize,
    /// From the first request sent to the last result.
    pub wall_ms: f64,
    pub generated_tokens: usize,
    /// Generated tokens over the wall time: what all clients got together.
    pub aggregate_tokens_per_sec: f64,
    /// The median request's decode rate (tokens after its first, over the time they took) ...
    pub decode_tokens_per_sec_median: f64,
    /// ... times the clients: the decode rate all of them get at once.
    pub aggregate_decode_tokens_per_sec: f64,
    pub ttft_p50_ms: f64,
    pub ttft_p99_ms: f64,
    /// Tokens of all prompts and answers, shared prefixes counted once.
    pub distinct_tokens: usize,
    /// What the pool held at most, and what those distinct tokens take at one slot each.
    pub pool_peak_bytes: usize,
    pub distinct_token_bytes: usize,
    /// `pool_peak_bytes / distinct_token_bytes`.
    pub pool_memory_ratio: f64,
    pub pool: PoolStats,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_prefixes_count_once() {
        let mut t = TokenTrie::default();
        t.add(&[1, 2, 3, 4]);
        t.add(&[1, 2, 3, 5, 6]);
        t.add(&[1, 2]);
        t.add(&[7]);
        assert_eq!(t.len(), 4 + 2 + 1);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 50.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&[3.0], 99.0), 3.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }
}
