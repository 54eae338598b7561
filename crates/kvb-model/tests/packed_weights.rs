//! Weights kept in their stored precision: a GGUF's Q4_0, Q4_1 and Q8_0 tensors stay packed on the
//! CPU and the model computes, bit for bit, what it computes with the same file expanded to f32 —
//! for a long prefill (many-row products) and for decode steps (few-row products), with a tied
//! and an untied LM head — in a fraction of the memory. `--weights q8_0` quantizes f32 weights
//! and stays close to them.

mod common;

use common::{llama_gguf_as, random_weights, tiny_llama_config, GgufStorage, B};
use kvb_model::gguf::GgufModel;
use kvb_model::{LogitsFor, Model, ModelConfig, WeightPrecision};

/// Logits of a 40-token prefill (more rows than the few-row kernels take) followed by 6 decode
/// steps, all concatenated.
fn run(m: &Model<B>) -> Vec<f32> {
    let prompt: Vec<u32> = (0..40).map(|i| (i * 7 % 96) as u32).collect();
    let mut cache = m.new_cache();
    let pos: Vec<usize> = (0..prompt.len()).collect();
    let mut out: Vec<f32> = m
        .forward(&prompt, &pos, &mut cache, LogitsFor::All)
        .unwrap()
        .into_data()
        .to_vec()
        .unwrap();
    for step in 0..6u32 {
        let p = cache.len();
        let logits = m
            .forward(&[(step * 13) % 96], &[p], &mut cache, LogitsFor::Last)
            .unwrap();
        out.extend(logits.into_data().to_vec::<f32>().unwrap());
    }
    out
}

fn config(tied: bool) -> ModelConfig {
    let json = tiny_llama_config(2).replace(
        "\"tie_word_embeddings\":false",
        &format!("\"tie_word_embeddings\":{tied}"),
    );
    ModelConfig::from_json(&json, true).unwrap()
}

fn load(path: &std::path::Path, precision: WeightPrecision) -> Model<B> {
    let gguf = GgufModel::open(path).unwrap();
    let config = gguf.config(true).unwrap();
    Model::<B>::load_with(
        &config,
        &gguf,
        precision,
        &Default::default(),
        &mut |_, _| {},
    )
    .unwrap()
}

#[test]
fn packed_gguf_weights_give_the_f32_expansions_outputs_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    for storage in [GgufStorage::Q4_0, GgufStorage::Q4_1, GgufStorage::Q8_0] {
        for tied in [false, true] {
            let config = config(tied);
            let path = dir.path().join(format!("{storage:?}-{tied}.gguf"));
            let bytes = llama_gguf_as(&config, &random_weights(&config, 11), storage);
            std::fs::write(&path, bytes).unwrap();
            let packed = load(&path, WeightPrecision::Auto);
            let f32s = load(&path, WeightPrecision::F32);
            let (a, b) = (run(&packed), run(&f32s));
            assert_eq!(a.len(), b.len());
            for (i, (x, y)) in a.iter().zip(&b).enumerate() {
                assert_eq!(
                    x.to_bits(),
                    y.to_bits(),
                    "{storage:?} (tied: {tied}), logit {i}: packed {x} vs f32 {y}"
                );
            }
            // 4-bit cells take 6 bits per weight and 8-bit ones 10, against 32.
            let ratio = packed.weight_bytes() as f64 / f32s.weight_bytes() as f64;
            let most = if storage == GgufStorage::Q8_0 {
                0.33
            } else {
                0.2
            };
            assert!(
                ratio < most,
                "{storage:?} (tied: {tied}): packed weights take {ratio:.2} of f32's"
            );
        }
    }
}

#[test]
fn q8_0_quantized_f32_weights_stay_close_to_f32() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(false);
    let path = dir.path().join("f32.gguf");
    std::fs::write(
        &path,
        llama_gguf_as(&config, &random_weights(&config, 3), GgufStorage::F32),
    )
    .unwrap();
    let q8 = load(&path, WeightPrecision::Q8_0);
    let f32s = load(&path, WeightPrecision::F32);
    assert_eq!(q8.weight_precision(), WeightPrecision::Q8_0);
    assert!(q8.weight_bytes() * 3 < f32s.weight_bytes());
    let (a, b) = (run(&q8), run(&f32s));
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    let worst = a
        .iter()
        .zip(&b)
        .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
    assert!(worst > 0.0, "q8_0 should not be the f32 weights exactly");
    assert!(
        worst < 0.05 * scale,
        "q8_0 logits differ from f32 by {worst} (logits up to {scale})"
    );
}

#[test]
fn weight_precisions_parse_and_unknown_ones_are_errors() {
    for name in WeightPrecision::NAMES {
        let p: WeightPrecision = name.parse().unwrap();
        assert_eq!(p.to_string(), name);
    }
    let err = "q3_k".parse::<WeightPrecision>().unwrap_err();
    assert!(err.contains("q3_k") && err.contains("auto"), "{err}");
}

/// K-quant GGUFs (Q4_K, Q5_K, Q6_K, whose rows are 256-weight blocks) kept packed compute what
/// their f32 expansion computes, as the 32-weight formats do.
#[test]
fn packed_k_quant_weights_give_the_f32_expansions_outputs_bit_for_bit() {
    let json = r#"{"architectures":["LlamaForCausalLM"],"hidden_size":256,"intermediate_size":512,
        "num_hidden_layers":1,"num_attention_heads":4,"num_key_value_heads":2,
        "vocab_size":96,"max_position_embeddings":512,"rms_norm_eps":1e-5,"rope_theta":10000.0,
        "tie_word_embeddings":true,"eos_token_id":1}"#;
    let config = ModelConfig::from_json(json, true).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for storage in [
        GgufStorage::RandomQ4K,
        GgufStorage::RandomQ5K,
        GgufStorage::RandomQ6K,
    ] {
        let path = dir.path().join(format!("{storage:?}.gguf"));
        std::fs::write(
            &path,
            llama_gguf_as(&config, &random_weights(&config, 5), storage),
        )
        .unwrap();
        let (a, b) = (
            run(&load(&path, WeightPrecision::Auto)),
            run(&load(&path, WeightPrecision::F32)),
        );
        assert!(
            a.iter().all(|v| v.is_finite()),
            "{storage:?}: finite logits"
        );
        let differing = a
            .iter()
            .zip(&b)
            .filter(|(x, y)| x.to_bits() != y.to_bits())
            .count();
        assert_eq!(
            differing,
            0,
            "{storage:?}: {differing} of {} logits differ",
            a.len()
        );
    }
}
