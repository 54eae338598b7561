//! Reading `kvb replay` result lines and reducing repetitions to medians.

use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// Stage times of one request, in ms (the replay's `stages`).
#[derive(Deserialize, Serialize, Debug, Clone, Default)]
pub struct Stages {
    pub tokenize_ms: f64,
    pub lookup_ms: f64,
    pub assemble_ms: f64,
    pub repair_ms: f64,
    pub live_prefill_ms: f64,
    pub decode_ms: f64,
    pub store_ms: f64,
}

impl Stages {
    /// The stages before the first token, in order, with their names.
    pub fn to_first_token(&self) -> [(&'static str, f64); 5] {
        [
            ("tokenize", self.tokenize_ms),
            ("lookup", self.lookup_ms),
            ("assemble", self.assemble_ms),
            ("repair", self.repair_ms),
            ("live prefill", self.live_prefill_ms),
        ]
    }
}

/// One replay result line.
#[derive(Deserialize, Debug, Clone)]
pub struct Line {
    pub id: String,
    pub ttft_ms: f64,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub recomputed_tokens: usize,
    pub stages: Stages,
    pub token_ids: Vec<u32>,
    /// Decode speed of the request (its generated tokens after the first, per second).
    #[serde(default)]
    pub tokens_per_sec: f64,
    /// The host's work per decode step: kernel launches, uploads, reads and their bytes.
    #[serde(default)]
    pub launches_per_decode_step: f64,
    #[serde(default)]
    pub uploads_per_decode_step: f64,
    #[serde(default)]
    pub reads_per_decode_step: f64,
    #[serde(default)]
    pub read_bytes_per_decode_step: f64,
    pub rss_bytes: Option<u64>,
    pub peak_rss_bytes: Option<u64>,
}

/// Reads a replay output; an `error` line fails the benchmark (every request must run).
pub fn read_lines(path: &Path) -> Result<Vec<Line>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut out = Vec::new();
    for (i, l) in text.lines().enumerate() {
        let v: serde_json::Value = serde_json::from_str(l)
            .with_context(|| format!("{} line {}: not JSON", path.display(), i + 1))?;
        if let Some(e) = v.get("error") {
            bail!("{} line {}: request failed: {e}", path.display(), i + 1);
        }
        out.push(
            serde_json::from_value(v)
                .with_context(|| format!("{} line {}: fields", path.display(), i + 1))?,
        );
    }
    Ok(out)
}

/// The median (mean of the middle two for an even count); 0 for none.
pub fn median(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut v = values.to_vec();
    v.sort_by(|a, b| a.total_cmp(b));
    let m = v.len() / 2;
    if v.len() % 2 == 1 {
        v[m]
    } else {
        (v[m - 1] + v[m]) / 2.0
    }
}

/// The nearest-rank `p`-th percentile (0 to 100); 0 for none.
pub fn percentile(values: &[f64], p: f64) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    let mut v = values.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = (p / 100.0 * (v.len() - 1) as f64).round() as usize;
    v[rank.min(v.len() - 1)]
}

/// Fraction of positions (over the longer output) where two greedy outputs agree; the same
/// measure as `kvb_engine::token_agreement`.
pub fn agreement(a: &[u32], b: &[u32]) -> f64 {
    let len = a.len().max(b.len());
    if len == 0 {
        return 1.0;
    }
    a.iter().zip(b).filter(|(x, y)| x == y).count() as f64 / len as f64
}

/// One request under one variant, over every repetition.
#[derive(Serialize, Debug, Clone)]
pub struct Cell {
    pub ttft_ms: f64,
    pub ttft_ms_runs: Vec<f64>,
    /// Baseline's median TTFT over this one's.
    pub speedup: f64,
    pub kv_reuse_ratio: f64,
    /// Recomputed tokens over prompt tokens.
    pub recomputed_fraction: f64,
    /// Mean greedy agreement with Baseline of the same repetition.
    pub agreement: f64,
    /// Output identical to Baseline's in every repetition.
    pub identical: bool,
    /// Median of each stage.
    pub stages: Stages,
}

/// A request of a workload with its cells per variant.
#[derive(Serialize, Debug, Clone)]
pub struct RequestResult {
    pub id: String,
    /// Its context was new (the first question on a document, the first turn).
    pub cold: bool,
    pub prompt_tokens: usize,
    pub cached_tokens: usize,
    pub cells: BTreeMap<String, Cell>,
}

/// Reduces `runs[variant][rep]` (each a replay's lines, in request order) to one result per
/// request. `baseline` names the reference variant.
pub fn reduce(
    runs: &BTreeMap<String, Vec<Vec<Line>>>,
    baseline: &str,
) -> Result<Vec<RequestResult>> {
    let base = runs.get(baseline).context("no baseline runs")?;
    let first = base.first().context("no repetitions")?;
    let mut out = Vec::new();
    for (r, line) in first.iter().enumerate() {
        let mut cells = BTreeMap::new();
        let base_ttft: Vec<f64> = base.iter().map(|rep| rep[r].ttft_ms).collect();
        let base_median = median(&base_ttft);
        let mut cached = 0;
        for (variant, reps) in runs {
            let lines: Vec<&Line> = reps.iter().map(|rep| &rep[r]).collect();
            if lines.iter().any(|l| l.id != line.id) {
                bail!("{variant}: request {r} is not {}", line.id);
            }
            let ttft: Vec<f64> = lines.iter().map(|l| l.ttft_ms).collect();
            let agree: Vec<f64> = lines
                .iter()
                .zip(base)
                .map(|(l, b)| agreement(&l.token_ids, &b[r].token_ids))
                .collect();
            let stage = |f: fn(&Stages) -> f64| {
                median(&lines.iter().map(|l| f(&l.stages)).collect::<Vec<_>>())
            };
            let m = median(&ttft);
            let l0 = lines[0];
            if variant != baseline {
                cached = cached.max(l0.cached_tokens);
            }
            cells.insert(
                variant.clone(),
                Cell {
                    ttft_ms: m,
                    ttft_ms_runs: ttft.clone(),
                    speedup: base_median / m.max(1e-9),
                    kv_reuse_ratio: l0.cached_tokens as f64 / l0.prompt_tokens.max(1) as f64,
                    recomputed_fraction: l0.recomputed_tokens as f64
                        / l0.prompt_tokens.max(1) as f64,
                    agreement: agree.iter().sum::<f64>() / agree.len() as f64,
                    identical: agree.iter().all(|&a| a == 1.0),
                    stages: Stages {
                        tokenize_ms: stage(|s| s.tokenize_ms),
                        lookup_ms: stage(|s| s.lookup_ms),
                        assemble_ms: stage(|s| s.assemble_ms),
                        repair_ms: stage(|s| s.repair_ms),
                        live_prefill_ms: stage(|s| s.live_prefill_ms),
                        decode_ms: stage(|s| s.decode_ms),
                        store_ms: stage(|s| s.store_ms),
                    },
                },
            );
        }
        out.push(RequestResult {
            id: line.id.clone(),
            cold: false,
            prompt_tokens: line.prompt_tokens,
            cached_tokens: cached,
            cells,
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
        assert_eq!(median(&[]), 0.0);
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let v: Vec<f64> = (1..=100).map(f64::from).collect();
        assert_eq!(percentile(&v, 50.0), 51.0);
        assert_eq!(percentile(&v, 99.0), 99.0);
        assert_eq!(percentile(&v, 100.0), 100.0);
        assert_eq!(percentile(&[7.0], 99.0), 7.0);
        assert_eq!(percentile(&[], 50.0), 0.0);
    }

    #[test]
    fn agreement_counts_positions_over_the_longer_output() {
        assert_eq!(agreement(&[1, 2, 3, 4], &[1, 2, 9, 4]), 0.75);
        assert_eq!(agreement(&[1, 2], &[1, 2, 3, 4]), 0.5);
        assert_eq!(agreement(&[], &[]), 1.0);
    }
}
