//! Every supported family matches transformers on its tiny random-weight reference model:
//! token ids, logits at every position (~1e-4), every top-1 id, and 16 greedy tokens.

use crate::common::{fixtures, read_f32, B};
use kvb_model::generate::{generate, GenerateParams};
use kvb_model::{load_pretrained, LoadOptions, LogitsFor};

fn check_family(family: &str) {
    let dir = fixtures().join("tiny").join(family);
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let m = load_pretrained::<B>(
        &dir,
        LoadOptions::default(),
        &Default::default(),
        &mut |_, _| {},
    )
    .unwrap_or_else(|e| panic!("{family}: {e}"));

    let want_ids: Vec<u32> = serde_json::from_value(reference["ids"].clone()).unwrap();
    let ids = m
        .tokenizer
        .encode(reference["text"].as_str().unwrap(), false)
        .unwrap();
    assert_eq!(ids, want_ids, "{family}: token ids");

    let n = ids.len();
    let positions: Vec<usize> = (0..n).collect();
    let mut cache = m.model.new_cache();
    let logits = m
        .model
        .forward(&ids, &positions, &mut cache, LogitsFor::All)
        .unwrap();
    let got = logits.into_data().to_vec::<f32>().unwrap();
    let want = read_f32(&dir.join("reference.logits.f32"));
    assert_eq!(got.len(), want.len(), "{family}: logits shape");
    let vocab = want.len() / n;
    let max_diff = got
        .iter()
        .zip(&want)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(max_diff < 2e-4, "{family}: max logit difference {max_diff}");
    for row in 0..n {
        let r = |v: &[f32]| kvb_model::generate::argmax(&v[row * vocab..(row + 1) * vocab]);
        assert_eq!(r(&got), r(&want), "{family}: top-1 at position {row}");
    }

    let want_greedy: Vec<u32> = serde_json::from_value(reference["greedy_16"].clone()).unwrap();
    let params = GenerateParams {
        max_new_tokens: 16,
        stop_at_eos: false,
        ..Default::default()
    };
    let out = generate(&m.model, &m.tokenizer, &ids, &params, &mut |_| {}).unwrap();
    assert_eq!(
        out.decoded.tokens, want_greedy,
        "{family}: greedy continuation"
    );
}

#[test]
fn llama_with_gqa_matches_transformers() {
    check_family("llama");
}

#[test]
fn llama_with_llama3_rope_scaling_matches_transformers() {
    check_family("llama-rope-llama3");
}

#[test]
fn qwen2_with_qkv_biases_matches_transformers() {
    check_family("qwen2");
}

#[test]
fn mistral_full_attention_matches_transformers() {
    check_family("mistral");
}

#[test]
fn gemma_matches_transformers() {
    check_family("gemma");
}

#[test]
fn phi3_with_fused_projections_matches_transformers() {
    check_family("phi3");
}
