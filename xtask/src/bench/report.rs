//! The benchmark's report: per-workload tables, a summary, the targets, as markdown
//! and JSON.

use super::concurrency::{self, ConcurrencyResult};
use super::results::{median, RequestResult};
use super::workloads::Workload;
use super::VARIANTS;
use anyhow::{Context, Result};
use serde::Serialize;
use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::Path;

/// Where and how the benchmark ran.
#[derive(Serialize, Debug, Clone)]
pub struct Meta {
    pub date: String,
    pub model: String,
    pub reps: usize,
    pub quick: bool,
    pub size: String,
    pub cores: usize,
}

/// One workload's results.
#[derive(Serialize, Debug, Clone)]
pub struct WorkloadResult {
    pub name: String,
    pub title: String,
    pub requests: Vec<RequestResult>,
}

impl WorkloadResult {
    /// Requests whose context an earlier request of the workload already read.
    pub fn warm(&self) -> Vec<&RequestResult> {
        self.requests.iter().filter(|r| !r.cold).collect()
    }

    /// Median over warm requests of `f(cell of variant)`.
    pub fn warm_median(&self, variant: &str, f: impl Fn(&super::results::Cell) -> f64) -> f64 {
        let v: Vec<f64> = self
            .warm()
            .iter()
            .filter_map(|r| r.cells.get(variant))
            .map(&f)
            .collect();
        median(&v)
    }
}

/// A target of the issue, checked.
#[derive(Serialize, Debug, Clone)]
pub struct Target {
    pub what: String,
    pub goal: String,
    pub measured: String,
    pub met: bool,
}

/// Everything the benchmark reports.
#[derive(Serialize, Debug, Clone)]
pub struct Report {
    pub meta: Meta,
    pub variants: Vec<String>,
    pub workloads: Vec<WorkloadResult>,
    /// Per variant: (peak RSS, model loading included; largest RSS after a request).
    pub memory_bytes: BTreeMap<String, (u64, u64)>,
    /// The concurrency workload, per client count.
    pub concurrency: Vec<ConcurrencyResult>,
    pub targets: Vec<Target>,
}

impl Report {
    /// The workload named `name`.
    pub fn workload(&self, name: &str) -> Option<&WorkloadResult> {
        self.workloads.iter().find(|w| w.name == name)
    }
}

const REUSE: &str = "ChunkReuse";
const STORE: &str = "ChunkReuse store";
const STORE_INT8: &str = "ChunkReuse store int8";

/// Groups the reduced requests by workload and checks the targets.
pub fn build(
    meta: &Meta,
    workloads: &[Workload],
    reduced: &[RequestResult],
    peak: &BTreeMap<String, (u64, u64)>,
    concurrency: Vec<ConcurrencyResult>,
) -> Result<Report> {
    let mut it = reduced.iter();
    let mut grouped = Vec::new();
    for w in workloads {
        let requests: Vec<RequestResult> = it
            .by_ref()
            .zip(&w.requests)
            .take(w.requests.len())
            .map(|(r, q)| RequestResult {
                cold: q.cold,
                ..r.clone()
            })
            .collect();
        grouped.push(WorkloadResult {
            name: w.name.to_string(),
            title: w.title.to_string(),
            requests,
        });
    }
    let mut report = Report {
        meta: meta.clone(),
        variants: VARIANTS.iter().map(|v| v.name.to_string()).collect(),
        workloads: grouped,
        memory_bytes: peak.clone(),
        concurrency,
        targets: Vec::new(),
    };
    report.targets = targets(&report);
    Ok(report)
}

fn ratio_target(r: &Report, workload: &str, what: &str, at_most: f64) -> Option<Target> {
    let w = r.workload(workload)?;
    let ratio = w.warm_median(REUSE, |c| 1.0 / c.speedup);
    let identical = w
        .warm()
        .iter()
        .filter(|q| q.cells.get(REUSE).is_some_and(|c| c.identical))
        .count();
    Some(Target {
        what: what.into(),
        goal: format!(
            "TTFT <= 1/{:.0} of Baseline, output identical",
            1.0 / at_most
        ),
        measured: format!(
            "1/{:.1} ({:.3}); identical {identical} of {}",
            1.0 / ratio.max(1e-9),
            ratio,
            w.warm().len()
        ),
        met: ratio <= at_most && identical == w.warm().len(),
    })
}

/// Engine overhead per 1,000 cached tokens: lookup + assembly (dequantization and copy
/// included), median over the warm requests of `workloads`.
fn overhead_ms_per_1k(r: &Report, variant: &str, workloads: &[&str]) -> f64 {
    let mut v = Vec::new();
    for name in workloads {
        if let Some(w) = r.workload(name) {
            for q in w.warm() {
                if let Some(c) = q.cells.get(variant) {
                    let cached = c.kv_reuse_ratio * q.prompt_tokens as f64;
                    if cached >= 1.0 {
                        v.push((c.stages.lookup_ms + c.stages.assemble_ms) * 1000.0 / cached);
                    }
                }
            }
        }
    }
    median(&v)
}

fn targets(r: &Report) -> Vec<Target> {
    let mut t = Vec::new();
    if let Some(w) = r.workload("conversation") {
        if let Some(last) = w.requests.last() {
            if let Some(c) = last.cells.get(REUSE) {
                t.push(Target {
                    what: format!("conversation, last turn ({})", last.id),
                    goal: "TTFT <= 1/6 of Baseline, output identical".into(),
                    measured: format!(
                        "1/{:.1} ({:.3}); identical: {}",
                        c.speedup,
                        1.0 / c.speedup,
                        if c.identical { "yes" } else { "no" }
                    ),
                    met: c.speedup >= 6.0 && c.identical,
                });
            }
        }
    }
    t.extend(ratio_target(r, "code", "code context, warm questions", 0.1));
    t.extend(ratio_target(
        r,
        "long_document",
        "long document, warm questions",
        0.05,
    ));
    // The RAG workload's documents read back: from resident pool blocks (the default), and from
    // the chunk store's RAM tier when nothing stays resident (copy, dequantization at int8).
    for (variant, path, limit) in [
        (REUSE, "blocks resident", 2.0),
        (STORE, "RAM tier", 10.0),
        (STORE_INT8, "RAM tier, int8", 10.0),
    ] {
        let o = overhead_ms_per_1k(r, variant, &["rag"]);
        t.push(Target {
            what: format!("RAG engine overhead, {path} ({variant})"),
            goal: format!("< {limit} ms per 1,000 cached tokens (lookup + assembly)"),
            measured: format!("{o:.2} ms"),
            met: o < limit,
        });
    }
    if let Some(w) = r.workload("moved_document") {
        let ratio = w.warm_median(REUSE, |c| 1.0 / c.speedup);
        let agree = w.warm_median(REUSE, |c| c.agreement);
        t.push(Target {
            what: "interior reuse (moved document), cacheblend".into(),
            goal: "TTFT <= 1/2 of Baseline at >= 95% greedy agreement".into(),
            measured: format!("{ratio:.3} of Baseline at {:.0}% agreement", 100.0 * agree),
            met: ratio <= 0.5 && agree >= 0.95,
        });
    }
    for (what, goal, measured, met) in concurrency::targets(&r.concurrency) {
        t.push(Target {
            what,
            goal,
            measured,
            met,
        });
    }
    t
}

fn cell_text(q: &RequestResult, variant: &str) -> String {
    match q.cells.get(variant) {
        Some(c) if variant == VARIANTS[0].name => format!("{:.0} ms", c.ttft_ms),
        Some(c) => format!(
            "{:.0} ms ({:.1}x, {:.0}%{})",
            c.ttft_ms,
            c.speedup,
            100.0 * c.agreement,
            if c.recomputed_fraction > 0.0 {
                format!(", re {:.0}%", 100.0 * c.recomputed_fraction)
            } else {
                String::new()
            }
        ),
        None => "-".into(),
    }
}

/// The summary table: warm requests of each workload, medians.
pub fn summary_markdown(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "| workload | warm requests | Baseline TTFT | {} |",
        r.variants[1..].join(" | ")
    );
    let _ = writeln!(s, "|---|---:|---:|{}", "---:|".repeat(r.variants.len() - 1));
    for w in &r.workloads {
        let base = w.warm_median(&r.variants[0], |c| c.ttft_ms);
        let cells: Vec<String> = r.variants[1..]
            .iter()
            .map(|v| {
                let ttft = w.warm_median(v, |c| c.ttft_ms);
                let agree = w.warm_median(v, |c| c.agreement);
                let reuse = w.warm_median(v, |c| c.kv_reuse_ratio);
                format!(
                    "{ttft:.0} ms, **{:.1}x**, reuse {:.0}%, agree {:.0}%",
                    base / ttft.max(1e-9),
                    100.0 * reuse,
                    100.0 * agree
                )
            })
            .collect();
        let _ = writeln!(
            s,
            "| {} | {} | {base:.0} ms | {} |",
            w.name,
            w.warm().len(),
            cells.join(" | ")
        );
    }
    s
}

/// The targets as a markdown table.
pub fn targets_markdown(r: &Report) -> String {
    let mut s = String::from("| target | goal | measured | met |\n|---|---|---|---|\n");
    for t in &r.targets {
        let _ = writeln!(
            s,
            "| {} | {} | {} | {} |",
            t.what,
            t.goal,
            t.measured,
            if t.met { "yes" } else { "**no**" }
        );
    }
    s
}

fn markdown(r: &Report) -> String {
    let m = &r.meta;
    let mut s = format!(
        "# kvb benchmark, {}\n\nModel: {}. {} repetition(s), medians; {} cores; workload size {}{}.\n\n\
         Each cell: TTFT median (speedup over Baseline, greedy token agreement with Baseline, share of \
         the prompt recomputed by repair). TTFT runs from the request's arrival to the first token id, \
         everything included. \"Warm\" requests are those whose context an earlier request of the workload read (not the first turn, not the first question on a document).\n\n",
        m.date,
        m.model,
        m.reps,
        m.cores,
        m.size,
        if m.quick { " (quick)" } else { "" }
    );
    s += "## Summary (warm requests)\n\n";
    s += &summary_markdown(r);
    s += "\n## Targets\n\n";
    s += &targets_markdown(r);
    s += "\n## Concurrency\n\n1, 4 and 16 clients at once, each an 8-turn chat behind one shared \
          system prompt (~1,000 tokens), each turn continuing from the model's own answer. Output \
          tokens/s: generated tokens of all clients over the run's wall time; decode tokens/s: the \
          median request's rate after its first token, times the clients. Pool memory: its peak \
          against the memory the distinct tokens served take (shared prefixes counted once).\n\n";
    s += &concurrency::markdown(&r.concurrency);
    s += "\n## Memory (process RSS)\n\nThe peak includes loading the model (the default model's \
          Q4_1 weights stay packed, 115 MB); the largest RSS after a request is the model plus what the cache then \
          holds.\n\n| variant | peak | largest after a request |\n|---|---:|---:|\n";
    let mib = |b: u64| b as f64 / (1 << 20) as f64;
    for (v, (p, after)) in &r.memory_bytes {
        let _ = writeln!(s, "| {v} | {:.0} MiB | {:.0} MiB |", mib(*p), mib(*after));
    }
    for w in &r.workloads {
        let _ = write!(
            s,
            "\n## {}\n\n| request | prompt tokens | {} |\n|---|---:|{}\n",
            w.title,
            r.variants.join(" | "),
            "---:|".repeat(r.variants.len())
        );
        for q in &w.requests {
            let cells: Vec<String> = r.variants.iter().map(|v| cell_text(q, v)).collect();
            let _ = writeln!(
                s,
                "| {} | {} | {} |",
                q.id,
                q.prompt_tokens,
                cells.join(" | ")
            );
        }
    }
    s += "\n## Plots\n\n![TTFT per turn](conversation_ttft.svg)\n![TTFT vs prompt length](ttft_vs_length.svg)\n![Speedup per workload](speedup.svg)\n![Stage breakdown](stages.svg)\n![Concurrent chats](concurrency.svg)\n";
    s
}

/// Writes `results.json` and `README.md` into `dir`.
pub fn write(dir: &Path, r: &Report) -> Result<()> {
    let json = dir.join("results.json");
    std::fs::write(&json, serde_json::to_string_pretty(r)?)
        .with_context(|| format!("writing {}", json.display()))?;
    let md = dir.join("README.md");
    std::fs::write(&md, markdown(r)).with_context(|| format!("writing {}", md.display()))?;
    Ok(())
}

const BEGIN: &str = "<!-- bench:begin -->";
const END: &str = "<!-- bench:end -->";

/// Replaces the benchmark section of `readme` (between the markers) with the latest summary,
/// targets and plots, linked relative to `readme`'s folder.
pub fn update_readme(readme: &Path, dir: &Path, r: &Report) -> Result<()> {
    let text =
        std::fs::read_to_string(readme).with_context(|| format!("reading {}", readme.display()))?;
    let (Some(a), Some(b)) = (text.find(BEGIN), text.find(END)) else {
        anyhow::bail!("{} has no {BEGIN} ... {END} section", readme.display());
    };
    // Links from the document's folder (a relative `dir` is from the workspace root).
    let d = if dir.is_absolute() {
        dir.display().to_string()
    } else {
        let depth = readme.parent().map_or(0, |p| p.components().count());
        format!("{}{}", "../".repeat(depth), dir.display())
    };
    let section = format!(
        "{BEGIN}\nFrom `cargo xtask bench` on {} ({} cores, {} repetitions, medians; full tables in \
         [{d}/README.md]({d}/README.md)). Warm requests: those whose context an earlier request of the workload read.\n\n{}\n\
         Concurrency (8-turn chats behind one ~1,000-token system prompt, each turn continuing the \
         model's own answer):\n\n{}\n{}\n\
         ![TTFT per turn]({d}/conversation_ttft.svg)\n![Speedup per workload]({d}/speedup.svg)\n\
         ![TTFT vs prompt length]({d}/ttft_vs_length.svg)\n![Stage breakdown]({d}/stages.svg)\n\
         ![Concurrent chats]({d}/concurrency.svg)\n",
        r.meta.date,
        r.meta.cores,
        r.meta.reps,
        summary_markdown(r),
        concurrency::markdown(&r.concurrency),
        targets_markdown(r)
    );
    let new = format!("{}{}{}", &text[..a], section, &text[b..]);
    std::fs::write(readme, new).with_context(|| format!("writing {}", readme.display()))?;
    Ok(())
}
