//! Weights kept in their stored precision: a GGUF's Q4_0, Q4_1 and Q8_0 tensors, and f16/bf16
//! tensors of a GGUF or a safetensors folder, stay packed on the CPU and the model computes, bit
//! for bit, what it computes with the same file expanded to f32 — for a long prefill (many-row
//! products) and for decode steps (few-row products), with a tied and an untied LM head — in a
//! fraction of the memory. `--weights q8_0` and `--weights bf16` round f32 weights and stay
//! close to them.

use crate::common::{
    llama_gguf_as, random_weights, tiny_llama_config, write_safetensors_as, GgufStorage, B,
};
use kvb_model::gguf::GgufModel;
use kvb_model::weights::SafetensorsDir;
use kvb_model::{LogitsFor, Model, ModelConfig, WeightPrecision};
use safetensors::Dtype;

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

/// Fails unless `a` and `b` hold the same bits.
fn assert_same_bits(a: &[f32], b: &[f32], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: lengths");
    for (i, (x, y)) in a.iter().zip(b).enumerate() {
        assert_eq!(
            x.to_bits(),
            y.to_bits(),
            "{what}, logit {i}: packed {x} vs f32 {y}"
        );
    }
}

/// 16-bit float weights (f16 and bf16 GGUFs, bf16 and f16 safetensors folders) stay 16-bit and
/// compute what their f32 expansion computes.
#[test]
fn sixteen_bit_weights_stay_16_bit_and_give_the_f32_expansions_outputs_bit_for_bit() {
    let dir = tempfile::tempdir().unwrap();
    for tied in [false, true] {
        let config = config(tied);
        let weights = random_weights(&config, 17);
        for storage in [GgufStorage::F16, GgufStorage::Bf16] {
            let path = dir.path().join(format!("{storage:?}-{tied}.gguf"));
            std::fs::write(&path, llama_gguf_as(&config, &weights, storage)).unwrap();
            let packed = load(&path, WeightPrecision::Auto);
            let f32s = load(&path, WeightPrecision::F32);
            assert_same_bits(
                &run(&packed),
                &run(&f32s),
                &format!("{storage:?} GGUF (tied: {tied})"),
            );
            let ratio = packed.weight_bytes() as f64 / f32s.weight_bytes() as f64;
            assert!(
                ratio < 0.55,
                "{storage:?} (tied: {tied}): 16-bit weights take {ratio:.2} of f32's"
            );
        }
        for dtype in [Dtype::BF16, Dtype::F16] {
            let folder = dir.path().join(format!("{dtype:?}-{tied}"));
            std::fs::create_dir_all(&folder).unwrap();
            write_safetensors_as(&folder.join("model.safetensors"), &weights, dtype);
            let source = SafetensorsDir::open(&folder).unwrap();
            let load = |precision| {
                Model::<B>::load_with(
                    &config,
                    &source,
                    precision,
                    &Default::default(),
                    &mut |_, _| {},
                )
                .unwrap()
            };
            let (packed, f32s) = (load(WeightPrecision::Auto), load(WeightPrecision::F32));
            assert_same_bits(
                &run(&packed),
                &run(&f32s),
                &format!("{dtype:?} safetensors (tied: {tied})"),
            );
            assert!(
                packed.weight_bytes() * 100 < f32s.weight_bytes() * 55,
                "{dtype:?}: kept at 16 bits"
            );
        }
    }
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
            assert_same_bits(
                &run(&packed),
                &run(&f32s),
                &format!("{storage:?} (tied: {tied})"),
            );
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

/// `--weights q8_0` and `--weights bf16` round f32 weights: smaller, close, not equal.
#[test]
fn rounded_f32_weights_stay_close_to_f32() {
    let dir = tempfile::tempdir().unwrap();
    let config = config(false);
    let path = dir.path().join("f32.gguf");
    std::fs::write(
        &path,
        llama_gguf_as(&config, &random_weights(&config, 3), GgufStorage::F32),
    )
    .unwrap();
    let f32s = load(&path, WeightPrecision::F32);
    let b = run(&f32s);
    let scale = b.iter().fold(0f32, |m, v| m.max(v.abs()));
    // (precision, at most this share of f32's bytes, at most this error relative to the largest logit)
    for (precision, share, error) in [
        (WeightPrecision::Q8_0, 0.34, 0.05),
        (WeightPrecision::Bf16, 0.55, 0.02),
    ] {
        let rounded = load(&path, precision);
        assert_eq!(rounded.weight_precision(), precision);
        let bytes = rounded.weight_bytes() as f64 / f32s.weight_bytes() as f64;
        assert!(bytes < share, "{precision}: {bytes:.2} of f32's bytes");
        let a = run(&rounded);
        let worst = a
            .iter()
            .zip(&b)
            .fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        assert!(
            worst > 0.0,
            "{precision} should not be the f32 weights exactly"
        );
        assert!(
            worst < error * scale,
            "{precision} logits differ from f32 by {worst} (logits up to {scale})"
        );
    }
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

/// An untied embedding of a GGUF file is read in place from the file's map, a row per token
/// (none of it held in memory), and gives, bit for bit, what the table held packed gives (the
/// same file read from bytes, which has no file to map); a tied one is the head's, held.
#[test]
fn an_untied_embedding_is_read_in_place_from_the_file() {
    let dir = tempfile::tempdir().unwrap();
    for storage in [GgufStorage::Q4_0, GgufStorage::Q8_0, GgufStorage::F16] {
        for tied in [false, true] {
            let config = config(tied);
            let bytes = llama_gguf_as(&config, &random_weights(&config, 23), storage);
            let path = dir.path().join(format!("{storage:?}-{tied}.gguf"));
            std::fs::write(&path, &bytes).unwrap();
            let from_file = load(&path, WeightPrecision::Auto);
            let gguf = GgufModel::from_bytes(&path, &bytes).unwrap();
            let held = Model::<B>::load_with(
                &gguf.config(true).unwrap(),
                &gguf,
                WeightPrecision::Auto,
                &Default::default(),
                &mut |_, _| {},
            )
            .unwrap();
            let what = format!("{storage:?} (tied: {tied})");
            assert_same_bits(&run(&from_file), &run(&held), &what);
            assert_eq!(held.mapped_weight_bytes(), 0, "{what}");
            if tied {
                assert_eq!(from_file.mapped_weight_bytes(), 0, "{what}");
                assert_eq!(from_file.weight_bytes(), held.weight_bytes(), "{what}");
                continue;
            }
            let table = gguf.header().tensors["token_embd.weight"].range.len();
            assert_eq!(from_file.mapped_weight_bytes(), table, "{what}");
            assert!(
                from_file.weight_bytes() + table / 2 < held.weight_bytes(),
                "{what}: {} bytes held beside the map, {} without one",
                from_file.weight_bytes(),
                held.weight_bytes()
            );
        }
    }
}
