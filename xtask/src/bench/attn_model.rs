//! The default model's prefill and decode on one GPU backend, with the attention kernel and with
//! burn's reference ops (`KVB_ATTN=reference`): the model half of `cargo xtask bench attn`.
//!
//! One `kvb replay --mode baseline` per attention path, in a fresh process each: a request that
//! compiles the kernels, then independent long prompts (nothing reused), each generating the
//! same number of tokens. Medians over the long prompts; the greedy tokens of the two paths are
//! compared as a check that the kernel changes nothing a user sees.

use super::results::{median, read_lines, Line};
use anyhow::{bail, Context, Result};
use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

/// Prompt size and answer length of one run.
pub struct Size {
    /// Characters of corpus text per prompt (about four per token).
    pub prompt_chars: usize,
    pub new_tokens: usize,
    pub prompts: usize,
}

impl Size {
    /// The 4,096-token prompt.
    pub const FULL: Size = Size {
        prompt_chars: 16_500,
        new_tokens: 64,
        prompts: 3,
    };
    /// Small enough for lavapipe on 2 cores.
    pub const QUICK: Size = Size {
        prompt_chars: 1_000,
        new_tokens: 4,
        prompts: 3,
    };
}

/// The requests file: text of the `corpus` folder repeated to `size.prompt_chars`, each prompt
/// opened by its own line so that no two share a chunk.
fn requests(size: &Size, corpus_dir: &Path) -> Result<String> {
    let mut corpus = String::new();
    for f in ["long_document.md", "code_sample.rs", "few_shot.txt"] {
        let p = corpus_dir.join(f);
        corpus.push_str(
            &std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?,
        );
    }
    let text: String = corpus.chars().cycle().take(size.prompt_chars).collect();
    let line = |id: &str, prompt: String, new: usize| {
        serde_json::json!({"id": id, "prompt": prompt, "max_new_tokens": new, "reset": true})
            .to_string()
    };
    let mut out = line("compile", text.chars().take(400).collect(), 4) + "\n";
    for i in 0..size.prompts {
        out += &line(
            &format!("prompt-{i}"),
            format!("Request {i}.\n{text}"),
            size.new_tokens,
        );
        out.push('\n');
    }
    Ok(out)
}

/// Medians of one attention path's long prompts.
struct PathResult {
    prompt_tokens: usize,
    ttft_ms: f64,
    decode_tokens_per_sec: f64,
    /// Per decode step: launches, uploads, reads, bytes read.
    host_work: [f64; 4],
    tokens: Vec<Vec<u32>>,
}

fn reduce(lines: &[Line]) -> Result<PathResult> {
    let long: Vec<&Line> = lines.iter().filter(|l| l.id != "compile").collect();
    if long.is_empty() {
        bail!("the replay answered no long prompt");
    }
    Ok(PathResult {
        prompt_tokens: long[0].prompt_tokens,
        ttft_ms: median(&long.iter().map(|l| l.ttft_ms).collect::<Vec<_>>()),
        decode_tokens_per_sec: median(&long.iter().map(|l| l.tokens_per_sec).collect::<Vec<_>>()),
        host_work: [
            |l: &&Line| l.launches_per_decode_step,
            |l: &&Line| l.uploads_per_decode_step,
            |l: &&Line| l.reads_per_decode_step,
            |l: &&Line| l.read_bytes_per_decode_step,
        ]
        .map(|f| median(&long.iter().map(f).collect::<Vec<_>>())),
        tokens: long.iter().map(|l| l.token_ids.clone()).collect(),
    })
}

/// Replays the requests with each attention path on `backend` computing in `dtype` and returns a
/// markdown section.
pub fn run(kvb: &Path, backend: &str, dtype: &str, size: &Size, raw: &Path) -> Result<String> {
    std::fs::create_dir_all(raw).with_context(|| format!("creating {}", raw.display()))?;
    let requests_file = raw.join("model-requests.jsonl");
    std::fs::write(&requests_file, requests(size, Path::new("bench/corpus"))?)
        .with_context(|| format!("writing {}", requests_file.display()))?;
    let mut results = Vec::new();
    for attention in ["kernel", "reference"] {
        eprintln!("bench attn: the default model on {backend} in {dtype}, {attention} attention");
        let out = raw.join(format!("model-{backend}-{dtype}-{attention}.jsonl"));
        let mut cmd = Command::new(kvb);
        cmd.args([
            "replay",
            "--backend",
            backend,
            "--dtype",
            dtype,
            "--mode",
            "baseline",
        ])
        .args(["--temperature", "0", "--requests"])
        .arg(&requests_file)
        .arg("--out")
        .arg(&out)
        .env("KVB_ATTN", attention);
        crate::run(&mut cmd)?;
        results.push((attention, reduce(&read_lines(&out)?)?));
    }
    let (kernel, reference) = (&results[0].1, &results[1].1);
    let mut md = format!(
        "\n## The default model ({backend}, {dtype})\n\n`kvb replay --mode baseline`: {} independent \
         prompts of {} tokens, {} generated tokens each, after a request that compiles the \
         kernels; medians. Host work per decode step: kernel launches, host-to-device uploads, \
         device-to-host reads (and their bytes), as kvb counts them (burn's reference attention \
         runs several kernels and counts as one).\n\n| attention | TTFT \
         (prefill) | decode tokens/s | launches | uploads | reads (bytes) |\n\
         |---|---:|---:|---:|---:|---:|\n",
        size.prompts, kernel.prompt_tokens, size.new_tokens
    );
    for (name, r) in &results {
        let [launches, uploads, reads, bytes] = r.host_work;
        let _ = writeln!(
            md,
            "| {name} | {:.0} ms | {:.1} | {launches:.0} | {uploads:.1} | {reads:.1} ({bytes:.0}) |",
            r.ttft_ms, r.decode_tokens_per_sec
        );
    }
    let _ = writeln!(
        md,
        "\nPrefill {:.1}x and decode {:.1}x faster with the kernel; greedy tokens {}.",
        reference.ttft_ms / kernel.ttft_ms,
        kernel.decode_tokens_per_sec / reference.decode_tokens_per_sec,
        if kernel.tokens == reference.tokens {
            "identical"
        } else {
            "DIFFER"
        }
    );
    Ok(md)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(id: &str, ttft_ms: f64, tokens_per_sec: f64) -> Line {
        Line {
            id: id.into(),
            ttft_ms,
            prompt_tokens: 100,
            cached_tokens: 0,
            recomputed_tokens: 0,
            stages: Default::default(),
            token_ids: vec![1, 2],
            tokens_per_sec,
            launches_per_decode_step: 0.0,
            uploads_per_decode_step: 0.0,
            reads_per_decode_step: 0.0,
            read_bytes_per_decode_step: 0.0,
            rss_bytes: None,
            peak_rss_bytes: None,
        }
    }

    #[test]
    fn the_compile_request_is_left_out_of_the_medians() {
        let lines = [
            line("compile", 9_000.0, 1.0),
            line("prompt-0", 300.0, 20.0),
            line("prompt-1", 100.0, 40.0),
            line("prompt-2", 200.0, 30.0),
        ];
        let r = reduce(&lines).unwrap();
        assert_eq!((r.ttft_ms, r.decode_tokens_per_sec), (200.0, 30.0));
        assert_eq!(r.tokens.len(), 3);
        assert!(reduce(&lines[..1]).is_err());
    }

    #[test]
    fn every_long_prompt_is_distinct_and_of_the_asked_size() {
        let corpus = Path::new(env!("CARGO_MANIFEST_DIR")).join("../bench/corpus");
        let text = requests(&Size::QUICK, &corpus).unwrap();
        let prompts: Vec<serde_json::Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(prompts.len(), Size::QUICK.prompts + 1);
        let long: Vec<&str> = prompts[1..]
            .iter()
            .map(|p| p["prompt"].as_str().unwrap())
            .collect();
        for (i, p) in long.iter().enumerate() {
            assert!(p.chars().count() > Size::QUICK.prompt_chars);
            assert!(long[..i]
                .iter()
                .all(|q| q.lines().next() != p.lines().next()));
        }
    }
}
