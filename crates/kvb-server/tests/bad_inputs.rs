//! docs/reliability.md's table of bad inputs, one test per row: what `kvb` says, that it says it
//! without a panic, and that nothing is lost (the inputs are left as they were; a cache keeps what
//! it held).
//! The server's rows (malformed and oversized requests) are in `serve_tiny.rs`.

use crate::common::tiny_model;
use std::path::{Path, PathBuf};
use std::process::Output;

fn kvb(args: &[&str]) -> Output {
    crate::common::kvb()
        .args(args)
        .env("RUST_BACKTRACE", "0")
        .output()
        .unwrap()
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs `kvb generate` on `model` and expects it to fail with a message holding every one of
/// `expected`, never a panic.
fn refused(model: &Path, extra: &[&str], expected: &[&str]) -> String {
    let mut args = vec!["generate", "--model", model.to_str().unwrap()];
    if !extra.iter().any(|a| a.starts_with("--prompt")) {
        args.extend(["--prompt", "Hello"]);
    }
    args.extend(["--max-new-tokens", "2"]);
    args.extend(extra);
    let out = kvb(&args);
    let err = stderr(&out);
    assert_eq!(out.status.code(), Some(1), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?} panicked: {err}");
    for want in expected {
        assert!(err.contains(want), "{args:?}: wanted {want:?} in: {err}");
    }
    err
}

/// Every file of `dir` with its bytes, to check that nothing was changed.
fn snapshot(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files: Vec<(PathBuf, Vec<u8>)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| {
            let bytes = std::fs::read(&p).unwrap();
            (p, bytes)
        })
        .collect();
    files.sort();
    files
}

/// The tiny model with its `config.json` edited by `edit`.
fn with_config(edit: impl FnOnce(&mut serde_json::Value)) -> (tempfile::TempDir, PathBuf) {
    let (dir, model) = tiny_model();
    let path = model.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(&path, config.to_string()).unwrap();
    (dir, model)
}

fn refused_untouched(model: &Path, extra: &[&str], expected: &[&str]) {
    let before = snapshot(model);
    refused(model, extra, expected);
    assert!(snapshot(model) == before, "kvb changed the model folder");
}

#[test]
fn a_missing_model_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-model");
    refused(
        &missing,
        &[],
        &["no-such-model: no model file or folder here"],
    );
}

#[test]
fn a_truncated_safetensors_file_is_named() {
    let (_d, model) = tiny_model();
    let weights = model.join("model.safetensors");
    let bytes = std::fs::read(&weights).unwrap();
    std::fs::write(&weights, &bytes[..bytes.len() / 2]).unwrap();
    refused_untouched(
        &model,
        &[],
        &["model.safetensors: invalid safetensors header"],
    );
}

#[test]
fn a_truncated_gguf_file_is_named() {
    let seed =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fuzz/seeds/gguf/tiny-bpe-q8_0.gguf");
    let bytes = std::fs::read(seed).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tiny.gguf");
    std::fs::write(&file, &bytes[..bytes.len() - 100]).unwrap();
    let cut = format!("lies beyond the end of the {}-byte file", bytes.len() - 100);
    refused(&file, &[], &["tiny.gguf", &cut]);
    assert_eq!(std::fs::read(&file).unwrap().len(), bytes.len() - 100);
}

#[test]
fn a_config_missing_a_field_names_it() {
    let (_d, model) = with_config(|c| {
        c.as_object_mut().unwrap().remove("hidden_size");
    });
    refused_untouched(&model, &[], &["config.json", "`hidden_size` is missing"]);
}

#[test]
fn a_config_with_zero_layers_is_refused() {
    let (_d, model) = with_config(|c| c["num_hidden_layers"] = 0.into());
    refused_untouched(&model, &[], &["`num_hidden_layers` is missing or zero"]);
}

#[test]
fn a_config_with_an_absurd_size_is_refused_before_any_allocation() {
    let (_d, model) = with_config(|c| c["num_hidden_layers"] = 1_000_000_000_000u64.into());
    refused_untouched(
        &model,
        &[],
        &["`num_hidden_layers` is 1000000000000, beyond"],
    );
}

#[test]
fn heads_that_do_not_divide_the_hidden_size_are_refused() {
    let (_d, model) = with_config(|c| {
        c["num_attention_heads"] = 5.into();
        c["num_key_value_heads"] = 5.into();
        c.as_object_mut().unwrap().remove("head_dim");
    });
    refused_untouched(&model, &[], &["not divisible by 5 heads"]);
}

#[test]
fn a_vocabulary_smaller_than_the_tokenizers_is_refused() {
    let (_d, model) = with_config(|c| c["vocab_size"] = 100.into());
    refused_untouched(
        &model,
        &[],
        &["the tokenizer has 407 tokens but the model's vocabulary has 100 rows"],
    );
}

#[test]
fn a_tokenizer_of_another_model_is_refused() {
    let (_d, model) = tiny_model();
    // A word-level tokenizer of 600 words: more ids than the model's 512 embedding rows.
    let vocab: serde_json::Map<String, serde_json::Value> =
        (0..600).map(|i| (format!("w{i}"), i.into())).collect();
    let tokenizer = serde_json::json!({
        "version": "1.0", "added_tokens": [], "normalizer": null, "post_processor": null,
        "pre_tokenizer": {"type": "Whitespace"}, "decoder": null,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "w0"},
    });
    std::fs::write(model.join("tokenizer.json"), tokenizer.to_string()).unwrap();
    refused_untouched(&model, &[], &["tokenizer", "belongs to another model"]);
}

#[test]
fn an_unsupported_architecture_says_why() {
    let (_d, model) = with_config(|c| c["architectures"] = serde_json::json!(["GPT2LMHeadModel"]));
    refused_untouched(&model, &[], &["GPT2LMHeadModel", "cannot reuse K/V"]);
}

#[test]
fn a_prompt_over_the_context_is_refused() {
    let (_d, model) = tiny_model();
    let long = "word ".repeat(400);
    refused_untouched(&model, &["--prompt", &long], &["context"]);
}

#[test]
fn an_empty_prompt_is_refused() {
    let (_d, model) = tiny_model();
    refused_untouched(&model, &["--prompt", ""], &["empty"]);
}

#[test]
fn a_float_type_the_backend_lacks_is_refused_with_the_reason() {
    let (_d, model) = tiny_model();
    refused_untouched(
        &model,
        &["--dtype", "f16"],
        &["--dtype f16", "CPU backend computes in f32"],
    );
    refused_untouched(
        &model,
        &["--pool-dtype", "bf16"],
        &["K/V pool: this backend cannot hold bf16 values"],
    );
    #[cfg(feature = "wgpu")]
    refused_untouched(
        &model,
        &["--backend", "wgpu", "--dtype", "bf16"],
        &["--dtype bf16 needs CUDA"],
    );
}

#[test]
fn a_prompt_file_that_is_not_utf8_names_the_byte() {
    let (dir, model) = tiny_model();
    let file = dir.path().join("prompt.txt");
    std::fs::write(&file, b"Hello \xff world").unwrap();
    refused_untouched(
        &model,
        &["--prompt-file", file.to_str().unwrap()],
        &["prompt.txt is not UTF-8 text: invalid byte at offset 6"],
    );
}

#[test]
fn a_cache_folder_that_cannot_be_written_is_named() {
    // Tests run as root here, so permissions cannot make a folder read-only; /proc refuses new
    // folders to everyone.
    let (_d, model) = tiny_model();
    refused_untouched(
        &model,
        &["--disk-dir", "/proc/kvb-cache"],
        &["disk tier: /proc/kvb-cache"],
    );
}

/// `kvb generate` on `model` with a disk tier in `disk` and `extra` flags: (stdout, stderr).
fn generate_with_disk_and(
    model: &Path,
    disk: &Path,
    prompt: &str,
    extra: &[&str],
) -> (String, String) {
    let mut args = vec![
        "generate",
        "--model",
        model.to_str().unwrap(),
        "--disk-dir",
        disk.to_str().unwrap(),
        "--no-resident",
        "--prompt",
        prompt,
        "--max-new-tokens",
        "8",
    ];
    args.extend(extra);
    let out = kvb(&args);
    let err = stderr(&out);
    assert!(out.status.success(), "{err}");
    (String::from_utf8_lossy(&out.stdout).into_owned(), err)
}

/// [`generate_with_disk_and`] with no extra flag.
fn generate_with_disk(model: &Path, disk: &Path, prompt: &str) -> (String, String) {
    generate_with_disk_and(model, disk, prompt, &[])
}

/// The cached-token count of a `kvb generate` summary line.
fn cached(summary: &str) -> usize {
    let after = summary.split("cached: ").nth(1).expect("a summary line");
    after.split_whitespace().next().unwrap().parse().unwrap()
}

const PROMPT: &str = "The quick brown fox jumps over the lazy dog. The quick brown fox jumps over \
                      the lazy dog again and again, until the dog wakes up and";

#[test]
fn a_corrupt_cache_folder_costs_only_the_damaged_records() {
    let (dir, model) = tiny_model();
    let disk = dir.path().join("cache");
    let (first, _) = generate_with_disk(&model, &disk, PROMPT);
    // Flip a byte every 97 in every segment, so that every record is hit: each is dropped and
    // recomputed, none is used.
    // (The disk tier keeps one folder per namespace: model and settings.)
    let mut flipped = 0;
    let namespaces = std::fs::read_dir(&disk).unwrap().map(|e| e.unwrap().path());
    for (path, mut bytes) in namespaces.flat_map(|ns| snapshot(&ns)) {
        if path.extension().is_some_and(|e| e == "kvb") {
            for at in (0..bytes.len()).step_by(97) {
                bytes[at] ^= 0x55;
                flipped += 1;
            }
            std::fs::write(&path, bytes).unwrap();
        }
    }
    assert!(flipped > 0, "the first run stored nothing");
    let (second, err) = generate_with_disk(&model, &disk, PROMPT);
    assert_eq!(second, first, "a corrupt cache changed the answer");
    assert_eq!(cached(&err), 0, "a damaged record was used: {err}");
    // What was recomputed is stored again: the third run reuses the whole cacheable prefix.
    let (third, err3) = generate_with_disk(&model, &disk, PROMPT);
    assert_eq!(third, first);
    assert!(cached(&err3) > cached(&err), "{err} / {err3}");
}

#[test]
fn a_cache_folder_of_another_model_or_settings_is_never_mixed_in_and_keeps_its_records() {
    let (dir, model) = tiny_model();
    let other = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/tiny/qwen2");
    let disk = dir.path().join("cache");
    let (llama, _) = generate_with_disk(&model, &disk, PROMPT);
    // Another model on the same folder: no hit, and the same answer as with an empty cache.
    let (qwen, err) = generate_with_disk(&other, &disk, PROMPT);
    assert_eq!(cached(&err), 0, "{err}");
    let fresh = dir.path().join("fresh");
    assert_eq!(qwen, generate_with_disk(&other, &fresh, PROMPT).0);
    // Other settings (an 8-bit store): no hit either.
    let (_, err) = generate_with_disk_and(&model, &disk, PROMPT, &["--kv-precision", "int8"]);
    assert_eq!(cached(&err), 0, "{err}");
    // The first model's records are still there and still reused.
    let (again, err) = generate_with_disk(&model, &disk, PROMPT);
    assert_eq!(again, llama);
    assert!(cached(&err) > 0, "{err}");
}
