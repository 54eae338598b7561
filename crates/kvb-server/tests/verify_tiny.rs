//! `kvb verify` on the tiny model, as a user runs it: a requests file with a warmed document moved
//! behind a preamble and one repeated exactly; the printed table and the JSON lines say what each
//! comparison saw, and a request it cannot score is refused before the model loads.

use crate::common::{tiny_model, words};
use serde_json::{json, Value};
use std::path::Path;
use std::process::Output;

/// Runs `kvb verify` on `model` with the requests file `requests` and `extra` flags.
fn verify(model: &Path, requests: &Path, extra: &[&str]) -> Output {
    crate::common::kvb()
        .arg("verify")
        .arg("--model")
        .arg(model)
        .arg("--requests")
        .arg(requests)
        .args(extra)
        .output()
        .unwrap()
}

#[test]
fn verify_prints_reuse_beside_the_noise_floor() {
    let (dir, model) = tiny_model();
    let doc = words(1, 18);
    let requests = dir.path().join("requests.jsonl");
    let lines = [
        json!({"id": "moved", "warm": doc, "prompt": format!("{} {doc} {}", words(2, 5), words(3, 3)), "reset": true}),
        json!({"id": "exact", "warm": doc, "prompt": doc, "max_new_tokens": 4}),
    ];
    std::fs::write(
        &requests,
        lines
            .iter()
            .map(|l| l.to_string() + "\n")
            .collect::<String>(),
    )
    .unwrap();
    let json_out = dir.path().join("out.jsonl");
    let out = verify(
        &model,
        &requests,
        &[
            "--json",
            json_out.to_str().unwrap(),
            "--max-new-tokens",
            "6",
            "--chunk-size",
            "16",
            "--block-size",
            "8",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for kind in [
        "reuse",
        "K/V stored int8",
        "K/V stored int4",
        "bf16 forward",
    ] {
        assert!(
            stdout.contains(&format!("| {kind} | 2 |")),
            "{kind} missing: {stdout}"
        );
    }
    let rows: Vec<Value> = std::fs::read_to_string(&json_out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let row = |id: &str, compared: &str| {
        rows.iter()
            .find(|r| r["id"] == id && r["compared"] == compared)
            .unwrap_or_else(|| panic!("no {id} / {compared} in {rows:?}"))
            .clone()
    };
    let moved = row("moved", "reuse");
    assert_eq!(moved["answer_tokens"], 6);
    assert!(moved["cached_tokens"].as_u64().unwrap() >= 48, "{moved}");
    assert!(moved["recomputed_tokens"].as_u64().unwrap() > 0, "{moved}");
    let exact = row("exact", "reuse");
    assert_eq!(exact["answer_tokens"], 4);
    assert_eq!(exact["identical"], true);
    assert_eq!(exact["top1_agreement"], 1.0);
    assert!(exact["max_kl"].as_f64().unwrap() < 1e-9, "{exact}");
    assert!(exact["cached_tokens"].as_u64().unwrap() >= 48, "{exact}");
    assert_eq!(row("exact", "bf16 forward")["cached_tokens"], 0);
    let summaries: Vec<&Value> = rows.iter().filter(|r| r.get("summary").is_some()).collect();
    assert_eq!(summaries.len(), 4);
    assert!(summaries
        .iter()
        .all(|s| s["prompts"] == 2 && s["positions"] == 10));
}

#[test]
fn verify_refuses_what_it_cannot_score() {
    let (dir, model) = tiny_model();
    let requests = dir.path().join("requests.jsonl");
    std::fs::write(
        &requests,
        "{\"id\": 1, \"prompt\": \"a b c\"}\n{\"id\": 2, \"prompt\": \" d\", \"continue\": true}\n",
    )
    .unwrap();
    let out = verify(&model, &requests, &[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("request 2") && err.contains("`continue`"),
        "{err}"
    );
    assert!(!err.contains("panicked"), "{err}");
}
