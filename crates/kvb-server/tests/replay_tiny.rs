//! `kvb replay` on the tiny model, as the benchmarks run it: several clients' chats at once
//! through one engine; every request gets its result line (a prompt longer than the context an
//! error line, and a non-zero exit at the end), a chat's next turn continues from its resident
//! blocks, prefill is cut by the step budget, and the summary counts what ran.

use crate::common::{tiny_model, words};
use serde_json::{json, Value};
use std::collections::HashMap;

#[test]
fn replay_answers_every_line_and_each_chat_continues_from_its_blocks() {
    let (dir, model) = tiny_model();
    let requests = dir.path().join("requests.jsonl");
    let lines = [
        json!({"id": "a1", "client": "a", "prompt": words(1, 30)}),
        json!({"id": "b1", "client": "b", "prompt": words(2, 30)}),
        json!({"id": "a2", "client": "a", "continue": true, "prompt": words(3, 6)}),
        json!({"id": "b2", "client": "b", "continue": true, "prompt": words(4, 6)}),
        json!({"id": "long", "client": "c", "prompt": words(5, 400)}),
    ];
    let text: Vec<String> = lines.iter().map(Value::to_string).collect();
    std::fs::write(&requests, text.join("\n")).unwrap();
    let (out, summary) = (
        dir.path().join("out.jsonl"),
        dir.path().join("summary.json"),
    );
    // A step computes at most 16 prompt rows, 8 while others decode.
    let budget = 16;
    let o = crate::common::kvb()
        .args(["replay", "--block-size", "8", "--max-new-tokens", "4"])
        .args(["--max-batch-tokens", &budget.to_string()])
        .args(["--prefill-tokens-while-decoding", "8"])
        .arg("--model")
        .arg(&model)
        .arg("--requests")
        .arg(&requests)
        .arg("--out")
        .arg(&out)
        .arg("--summary")
        .arg(&summary)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(
        !o.status.success(),
        "a failed request makes the exit non-zero"
    );
    let results: HashMap<String, Value> = std::fs::read_to_string(&out)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .map(|v| (v["id"].as_str().unwrap().to_string(), v))
        .collect();
    assert_eq!(
        results.len(),
        5,
        "one line per request: {results:?}\n{stderr}"
    );
    let error = results["long"]["error"].as_str().unwrap_or_default();
    assert!(error.contains("context"), "{:?}", results["long"]);

    let n = |id: &str, field: &str| results[id][field].as_u64().unwrap() as usize;
    for id in ["a1", "b1", "a2", "b2"] {
        let r = &results[id];
        assert!(r["ttft_ms"].as_f64().unwrap() > 0.0, "{r}");
        assert!(
            (1..=4).contains(&r["token_ids"].as_array().unwrap().len()),
            "{r}"
        );
        let computed = n(id, "prompt_tokens") - n(id, "cached_tokens");
        // No step computes more than the budget of one prompt's rows.
        assert!(
            n(id, "prefill_passes") >= computed.div_ceil(budget).max(1),
            "{r}"
        );
    }
    for (first, next) in [("a1", "a2"), ("b1", "b2")] {
        // The next turn's prompt is the first one, its answer and new text: all of the first
        // prompt is resident, in the pool, and is not computed again.
        assert!(n(next, "prompt_tokens") > n(first, "prompt_tokens"));
        assert!(
            n(next, "pool_tokens") >= n(first, "prompt_tokens"),
            "{first}: {}\n{next}: {}",
            results[first],
            results[next]
        );
        assert_eq!(n(next, "cached_tokens"), n(next, "pool_tokens"));
    }

    let s: Value = serde_json::from_str(&std::fs::read_to_string(&summary).unwrap()).unwrap();
    assert_eq!(s["requests"], 5, "{s}");
    assert_eq!(s["failed"], 1, "{s}");
    assert_eq!(s["clients"], 3, "{s}");
    let generated: usize = ["a1", "b1", "a2", "b2"]
        .iter()
        .map(|id| results[*id]["token_ids"].as_array().unwrap().len())
        .sum();
    assert_eq!(s["generated_tokens"], generated, "{s}");
}
