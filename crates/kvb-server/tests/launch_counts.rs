//! The host's work per decode step on a GPU backend (wgpu; CI runs it on Mesa's lavapipe), as
//! `kvb replay` reports it, held to CubeCL's own execution log and to issue 44's targets: at
//! most 12 kernel launches per layer and exactly one device-to-host read per decode step, of
//! the token chosen on the device (the logits stay there).
//!
//! CubeCL writes a line per kernel it runs when a `cubecl.toml` in the working folder asks
//! (`[profiling.logger] level = "minimal"`). Two replays of the same prompt, one generating more
//! tokens than the other, differ only by decode steps: the difference of their logs is CubeCL's
//! count for those steps, compile-time and prefill launches cancelled out.
#![cfg(feature = "wgpu")]

use crate::common::{tiny_model, words};
use serde_json::{json, Value};
use std::path::Path;

/// Layers of the tiny fixture.
const LAYERS: f64 = 2.0;

/// Per-step counts of one replay, its generated tokens, and CubeCL's log lines.
struct Run {
    launches: f64,
    uploads: f64,
    reads: f64,
    read_bytes: f64,
    tokens: usize,
    token_ids: Vec<u64>,
    logged: usize,
}

impl Run {
    /// Launches kvb counted over all decode steps.
    fn decode_launches(&self) -> f64 {
        self.launches * (self.tokens - 1) as f64
    }
}

fn replay(model: &Path, new_tokens: usize) -> Run {
    replay_on(model, new_tokens, "wgpu")
}

fn replay_on(model: &Path, new_tokens: usize, backend: &str) -> Run {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("launches.log");
    std::fs::write(
        dir.path().join("cubecl.toml"),
        format!(
            "[profiling.logger]\nlevel = \"minimal\"\nfile = {:?}\n",
            log.display().to_string()
        ),
    )
    .unwrap();
    let requests = dir.path().join("requests.jsonl");
    let request = json!({"id": "r", "prompt": words(7, 40), "max_new_tokens": new_tokens});
    std::fs::write(&requests, request.to_string()).unwrap();
    let out = dir.path().join("out.jsonl");
    let o = crate::common::kvb()
        .current_dir(dir.path())
        .args(["replay", "--backend", backend, "--mode", "baseline"])
        .arg("--model")
        .arg(model)
        .arg("--requests")
        .arg(&requests)
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "replay failed:\n{stderr}");
    let line: Value = serde_json::from_str(std::fs::read_to_string(&out).unwrap().trim()).unwrap();
    let f = |k: &str| {
        line[k]
            .as_f64()
            .unwrap_or_else(|| panic!("`{k}` in the result line: {line}"))
    };
    // The CPU backend runs no CubeCL kernel and writes no log.
    let logged = std::fs::read_to_string(&log)
        .map(|t| t.lines().filter(|l| l.starts_with("Executing")).count())
        .unwrap_or(0);
    Run {
        launches: f("launches_per_decode_step"),
        uploads: f("uploads_per_decode_step"),
        reads: f("reads_per_decode_step"),
        read_bytes: f("read_bytes_per_decode_step"),
        tokens: line["token_ids"].as_array().unwrap().len(),
        token_ids: line["token_ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap())
            .collect(),
        logged,
    }
}

#[test]
fn a_decode_step_launches_what_kvb_counts_within_the_targets() {
    let (_dir, model) = tiny_model();
    let short = replay(&model, 3);
    let long = replay(&model, 9);
    assert!(
        short.tokens == 3 && long.tokens == 9,
        "the prompt must not reach EOS early ({} and {} tokens): pick another",
        short.tokens,
        long.tokens
    );
    eprintln!(
        "per decode step: {} launches, {} uploads, {} reads of {} bytes; CubeCL's log: {} and \
         {} lines",
        long.launches, long.uploads, long.reads, long.read_bytes, short.logged, long.logged
    );
    // kvb's counter against CubeCL's log, over the 6 decode steps the longer run adds.
    assert!(short.logged > 0, "CubeCL wrote no execution log");
    let cubecl = long.logged as f64 - short.logged as f64;
    let kvb = long.decode_launches() - short.decode_launches();
    assert_eq!(
        kvb, cubecl,
        "kvb counted {kvb} launches for 6 decode steps, CubeCL ran {cubecl}"
    );
    // The embedding lookup, the final norm, the LM head and the argmax's two are outside the
    // layers.
    let per_layer = (long.launches - 5.0) / LAYERS;
    assert!(
        per_layer <= 12.0,
        "{per_layer} launches per layer ({} a step)",
        long.launches
    );
    assert_eq!(long.reads, 1.0, "one read per decode step");
    // Tokens chosen on the device are the CPU's, which reads the logits.
    let cpu = replay_on(&model, 9, "cpu");
    assert_eq!(
        long.token_ids, cpu.token_ids,
        "greedy tokens on wgpu and on the CPU"
    );
    assert!(cpu.read_bytes > 4.0 * 500.0, "the CPU reads the logits");
    // The token chosen on the device (an int of at most 8 bytes), not a vocabulary of logits.
    assert!(
        long.read_bytes <= 8.0,
        "{} bytes read a decode step",
        long.read_bytes
    );
    // Token ids, the two RoPE tables, the attention's block tables and the pool write's slots:
    // each uploaded once a step, whatever the number of layers.
    assert!(long.uploads <= 7.0, "{} uploads a step", long.uploads);
}
