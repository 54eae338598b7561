//! GGUF files of the layouts people download, built from the tiny reference models the way
//! llama.cpp's converter writes them, load to the model transformers computes (its logits at
//! every position, ~1e-4; and keys after RoPE far from position 0): a Llama 3.1-style file
//! whose RoPE scaling is a `rope_freqs` tensor (no scaling metadata), a Qwen2 file (q/k/v
//! biases, rows not permuted) and a Gemma file (norm weights stored as 1 + w).

use crate::common::{fixtures, gguf_bytes, gguf_name, permute_like_llama_cpp, read_f32, Meta, B};
use kvb_model::gguf::GgufModel;
use kvb_model::weights::{SafetensorsDir, TensorSource};
use kvb_model::{LogitsFor, Model, ModelConfig, RopeScaling};
use std::path::Path;

type Tensors = Vec<(String, Vec<usize>, Vec<f32>)>;

/// The fixture's config and its tensors, with HF names.
fn fixture(family: &str) -> (ModelConfig, Tensors) {
    let dir = fixtures().join("tiny").join(family);
    let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
    let config = ModelConfig::from_json(&text, true).unwrap();
    let st = SafetensorsDir::open(&dir).unwrap();
    let tensors = st
        .names()
        .into_iter()
        .map(|n| {
            let t = st.read(&n).unwrap();
            (n, t.shape, t.data)
        })
        .collect();
    (config, tensors)
}

/// llama.cpp's converter for Llama 3.1/3.2 (`rope_type: llama3`): one divisor per frequency,
/// computed in double precision, stored as the f32 tensor `rope_freqs.weight`.
fn llama_cpp_rope_freqs(text: &serde_json::Value, head_dim: usize) -> Vec<f32> {
    let s = &text["rope_scaling"];
    let f = |k: &str| s[k].as_f64().unwrap();
    let (factor, low, high, old) = (
        f("factor"),
        f("low_freq_factor"),
        f("high_freq_factor"),
        f("original_max_position_embeddings"),
    );
    let base = text["rope_theta"].as_f64().unwrap();
    let (low_wavelen, high_wavelen) = (old / low, old / high);
    (0..head_dim / 2)
        .map(|i| {
            let freq = 1.0 / base.powf((2 * i) as f64 / head_dim as f64);
            let wavelen = 2.0 * std::f64::consts::PI / freq;
            let divisor = if wavelen < high_wavelen {
                1.0
            } else if wavelen > low_wavelen {
                factor
            } else {
                let smooth = (old / wavelen - low) / (high - low);
                1.0 / ((1.0 - smooth) / factor + smooth)
            };
            divisor as f32
        })
        .collect()
}

/// A GGUF of `tensors` for architecture `arch` (llama.cpp permutes llama's q/k rows only).
fn gguf_of(arch: &'static str, c: &ModelConfig, tensors: &Tensors, extra: Tensors) -> Vec<u8> {
    let mut converted: Tensors = tensors
        .iter()
        .map(|(n, s, d)| {
            let heads = if n.contains("q_proj") {
                c.num_heads
            } else {
                c.num_kv_heads
            };
            let permute = arch == "llama" && (n.contains("q_proj") || n.contains("k_proj"));
            let mut data = match (permute, s.len()) {
                (true, 2) => permute_like_llama_cpp(d, s[0], s[1], heads),
                (true, _) => permute_like_llama_cpp(d, s[0], 1, heads),
                (false, _) => d.clone(),
            };
            if arch == "gemma" && n.ends_with("norm.weight") {
                // llama.cpp's converter stores Gemma's (1 + w) RMSNorm weights as 1 + w.
                data.iter_mut().for_each(|x| *x += 1.0);
            }
            (gguf_name(n), s.clone(), data)
        })
        .collect();
    converted.extend(extra);
    let key = |k: &str| -> &'static str { Box::leak(format!("{arch}.{k}").into_boxed_str()) };
    let meta = vec![
        Meta::Str("general.architecture", arch.into()),
        Meta::U32(key("block_count"), c.num_layers as u32),
        Meta::U32(key("context_length"), c.max_position_embeddings as u32),
        Meta::U32(key("embedding_length"), c.hidden_size as u32),
        Meta::U32(key("feed_forward_length"), c.intermediate_size as u32),
        Meta::U32(key("attention.head_count"), c.num_heads as u32),
        Meta::U32(key("attention.head_count_kv"), c.num_kv_heads as u32),
        Meta::U32(key("rope.dimension_count"), c.head_dim as u32),
        Meta::F32(key("rope.freq_base"), c.rope_theta),
        Meta::F32(
            key("attention.layer_norm_rms_epsilon"),
            c.rms_norm_eps as f32,
        ),
        Meta::U32("tokenizer.ggml.eos_token_id", 1),
    ];
    gguf_bytes(&meta, &converted)
}

/// A GGUF file's model.
fn load_gguf(bytes: Vec<u8>) -> (ModelConfig, Model<B>) {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("model.gguf");
    std::fs::write(&path, bytes).unwrap();
    let gguf = GgufModel::open(&path).unwrap();
    let config = gguf.config(true).unwrap();
    let model = Model::<B>::load(&config, &gguf, &Default::default(), &mut |_, _| {}).unwrap();
    (config, model)
}

/// Logits at every position of `ids` placed at `positions`.
fn logits(model: &Model<B>, ids: &[u32], positions: &[usize]) -> Vec<f32> {
    let mut cache = model.new_cache();
    model
        .forward(ids, positions, &mut cache, LogitsFor::All)
        .unwrap()
        .into_data()
        .to_vec::<f32>()
        .unwrap()
}

/// The first layer's keys (after RoPE) of `ids` placed at `positions`: where RoPE shows
/// directly (random tiny weights attend almost uniformly, so logits hardly feel it).
fn first_keys(model: &Model<B>, ids: &[u32], positions: &[usize]) -> Vec<f32> {
    let mut cache = model.new_cache();
    model
        .forward(ids, positions, &mut cache, LogitsFor::Last)
        .unwrap();
    let (k, _) = cache.read(0, 0..ids.len()).unwrap();
    k.into_data().to_vec::<f32>().unwrap()
}

fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max)
}

/// The fixture's reference prompt.
fn reference_ids(family: &str) -> Vec<u32> {
    let dir = fixtures().join("tiny").join(family);
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    serde_json::from_value(reference["ids"].clone()).unwrap()
}

/// The model's logits on the fixture's reference prompt equal transformers'.
fn check(family: &str, model: &Model<B>) {
    let ids = reference_ids(family);
    let positions: Vec<usize> = (0..ids.len()).collect();
    let got = logits(model, &ids, &positions);
    let want = read_f32(
        &fixtures()
            .join("tiny")
            .join(family)
            .join("reference.logits.f32"),
    );
    let d = max_diff(&got, &want);
    assert!(d < 2e-4, "{family}: max logit difference {d}");
}

#[test]
fn a_llama_3_gguf_with_rope_freqs_matches_transformers() {
    let family = "llama-rope-llama3";
    let (config, tensors) = fixture(family);
    let text: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(fixtures().join("tiny").join(family).join("config.json")).unwrap(),
    )
    .unwrap();
    let freqs = llama_cpp_rope_freqs(&text, config.head_dim);
    assert!(
        freqs.contains(&1.0) && freqs.iter().any(|&f| f > 1.0),
        "the fixture scales some frequencies and keeps others: {freqs:?}"
    );
    let extra = vec![(
        "rope_freqs.weight".to_string(),
        vec![freqs.len()],
        freqs.clone(),
    )];
    let (loaded, from_gguf) = load_gguf(gguf_of("llama", &config, &tensors, extra));
    assert_eq!(loaded.rope_scaling, RopeScaling::FreqFactors(freqs));
    check(family, &from_gguf);

    // Far from position 0, where the scaled low frequencies turn the most, the file computes
    // what the HF folder (its `rope_scaling`, checked against transformers above) computes,
    // and without its rope_freqs it would not.
    let folder = kvb_model::load_pretrained::<B>(
        &fixtures().join("tiny").join(family),
        kvb_model::LoadOptions::default(),
        &Default::default(),
        &mut |_, _| {},
    )
    .unwrap();
    let ids = reference_ids(family);
    let far: Vec<usize> = (0..ids.len()).map(|p| 200 + 3 * p).collect();
    let want = first_keys(&folder.model, &ids, &far);
    let d = max_diff(&first_keys(&from_gguf, &ids, &far), &want);
    assert!(d < 1e-5, "rope_freqs vs rope_scaling far out: {d}");
    let (_, plain) = load_gguf(gguf_of("llama", &config, &tensors, Vec::new()));
    let d = max_diff(&first_keys(&plain, &ids, &far), &want);
    assert!(
        d > 1e-2,
        "the keys hardly depend on rope_freqs ({d}): a weak test"
    );
}

#[test]
fn a_qwen2_gguf_with_biases_matches_transformers() {
    let (config, tensors) = fixture("qwen2");
    assert!(tensors.iter().any(|(n, _, _)| n.ends_with("q_proj.bias")));
    let (loaded, model) = load_gguf(gguf_of("qwen2", &config, &tensors, Vec::new()));
    assert_eq!(loaded.family, config.family);
    assert!(loaded.attention_bias);
    check("qwen2", &model);
}

#[test]
fn a_gemma_gguf_matches_transformers() {
    let (config, tensors) = fixture("gemma");
    let (loaded, model) = load_gguf(gguf_of("gemma", &config, &tensors, Vec::new()));
    assert_eq!(loaded.family, config.family);
    assert_eq!(loaded.head_dim, config.head_dim);
    check("gemma", &model);
}

#[test]
fn rope_freqs_of_the_wrong_length_are_an_error() {
    let (config, tensors) = fixture("llama-rope-llama3");
    let extra = vec![("rope_freqs.weight".to_string(), vec![3], vec![1.0; 3])];
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("bad.gguf");
    std::fs::write(&path, gguf_of("llama", &config, &tensors, extra)).unwrap();
    let err = GgufModel::open(Path::new(&path))
        .unwrap()
        .config(true)
        .unwrap_err()
        .to_string();
    assert!(err.contains("rope frequency factors"), "{err}");
}
