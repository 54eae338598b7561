//! A malformed model folder is an error that names the problem, and never a panic.

use crate::common::{random_weights, tiny_llama_config, write_safetensors, B};
use kvb_model::{load_pretrained, LoadOptions, ModelConfig};
use std::path::Path;

fn try_load(dir: &Path) -> String {
    load_pretrained::<B>(
        dir,
        LoadOptions::default(),
        &Default::default(),
        &mut |_, _| {},
    )
    .map(|_| ())
    .expect_err("loading must fail")
    .to_string()
}

fn folder(edit: impl FnOnce(&mut Vec<(String, Vec<usize>, Vec<f32>)>)) -> tempfile::TempDir {
    let json = tiny_llama_config(2);
    let config = ModelConfig::from_json(&json, true).unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), json).unwrap();
    std::fs::copy(
        crate::common::fixtures().join("tiny/llama/tokenizer.json"),
        dir.path().join("tokenizer.json"),
    )
    .unwrap();
    let mut w = random_weights(&config, 3);
    edit(&mut w);
    write_safetensors(&dir.path().join("model.safetensors"), &w);
    dir
}

#[test]
fn a_missing_tensor_is_named() {
    let dir = folder(|w| w.retain(|(n, _, _)| n != "model.layers.1.mlp.up_proj.weight"));
    let err = try_load(dir.path());
    assert!(
        err.contains("model.layers.1.mlp.up_proj.weight") && err.contains("missing"),
        "{err}"
    );
}

#[test]
fn a_tensor_of_the_wrong_shape_is_named() {
    let dir = folder(|w| {
        let t = w
            .iter_mut()
            .find(|(n, _, _)| n == "model.norm.weight")
            .unwrap();
        t.1 = vec![16];
        t.2.truncate(16);
    });
    let err = try_load(dir.path());
    assert!(
        err.contains("model.norm.weight") && err.contains("[16]"),
        "{err}"
    );
}

#[test]
fn an_unused_tensor_is_named() {
    let dir = folder(|w| {
        w.push((
            "model.layers.0.self_attn.q_norm.weight".into(),
            vec![8],
            vec![1.0; 8],
        ))
    });
    let err = try_load(dir.path());
    assert!(err.contains("q_norm") && err.contains("not used"), "{err}");
}

#[test]
fn a_missing_or_broken_config_is_reported() {
    let dir = folder(|_| {});
    std::fs::write(dir.path().join("config.json"), "{\"hidden_size\": 64,").unwrap();
    let err = try_load(dir.path());
    assert!(
        err.contains("config.json") && err.contains("invalid JSON"),
        "{err}"
    );
    std::fs::remove_file(dir.path().join("config.json")).unwrap();
    let err = try_load(dir.path());
    assert!(err.contains("no config.json"), "{err}");
}

#[test]
fn a_corrupt_safetensors_file_is_reported() {
    let dir = folder(|_| {});
    std::fs::write(
        dir.path().join("model.safetensors"),
        b"\xff\xff\xff\xff\xff\xff\xff\x7fgarbage",
    )
    .unwrap();
    let err = try_load(dir.path());
    assert!(
        err.contains("model.safetensors") && err.contains("header"),
        "{err}"
    );
}

#[test]
fn a_broken_tokenizer_is_reported() {
    let dir = folder(|_| {});
    std::fs::write(dir.path().join("tokenizer.json"), "{\"model\": 3}").unwrap();
    let err = try_load(dir.path());
    assert!(err.contains("tokenizer.json"), "{err}");
}
