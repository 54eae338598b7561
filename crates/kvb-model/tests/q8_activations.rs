//! `--activations q8`: products whose inputs are quantized to 8 bits per value, as llama.cpp
//! computes on a quantized model. Checked against llama.cpp's own logits for files its quantizer
//! wrote (`fixtures/llama-cpp`, see `llama_cpp_files.rs`): rounding the activations costs kvb no
//! more than it costs llama.cpp, measured from the exact logits of the same weights.
//! (Not bit for bit llama.cpp's: it keeps each block's scale in f16 and rounds other steps its
//! own way, so the two land about as far from each other as each from the exact logits.)

use crate::common::{
    all_logits as logits, fixtures, max_abs_diff as max_diff, random_model_dir, read_f32,
    tiny_llama_config, B,
};
use kvb_model::gguf::GgufModel;
use kvb_model::{load_pretrained, ActivationPrecision, LoadOptions, Model, WeightPrecision};

/// For every integer file (Q4_0, Q4_1, Q8_0, Q5_0, Q5_1, IQ4_NL, and the K-quant files Q2_K,
/// Q3_K_M, Q4_K_M, Q5_K_M, Q6_K, IQ4_XS, read as loaded): the largest logit difference from the
/// exact logits with 8-bit activations, against llama.cpp's. Measured (logits spread 7.8): q4_0
/// 0.272 vs llama.cpp 0.378, q4_1 0.292 vs 0.300, q8_0 0.298 vs 0.321, q5_0 0.319 vs 0.320, q5_1
/// 0.265 vs 0.345, iq4_nl 0.339 vs 0.295, q2_k 0.284 vs 0.441, q3_k_m 0.292 vs 0.396, q4_k_m
/// 0.291 vs 0.470, q5_k_m 0.274 vs 0.449, q6_k 0.257 vs 0.418, iq4_xs 0.311 vs 0.441 (llama.cpp
/// rounds a K-quant's activations per 256 values, kvb per 32). A wrong block scale or offset
/// term shows as a difference of several units.
#[test]
fn q8_activations_cost_what_they_cost_llama_cpp() {
    let dir = fixtures().join("llama-cpp");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("fixtures.json")).unwrap()).unwrap();
    let tokens: Vec<u32> = json["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    let names = [
        "q4_0", "q4_1", "q8_0", "q5_0", "q5_1", "iq4_nl", "q2_k", "q3_k_m", "q4_k_m", "q5_k_m",
        "q6_k", "iq4_xs",
    ];
    for name in names {
        let f = &json["files"][name];
        let llama_cpp = read_f32(&dir.join(f["logits"].as_str().unwrap()));
        let exact = read_f32(&dir.join(f["exact_logits"].as_str().unwrap()));
        let gguf = GgufModel::open(&dir.join(f["gguf"].as_str().unwrap())).unwrap();
        let config = gguf.config(true).unwrap();
        let model = Model::<B>::load(&config, &gguf, &Default::default(), &mut |_, _| {})
            .unwrap()
            .with_activations(ActivationPrecision::Q8)
            .unwrap();
        assert_eq!(model.activation_precision(), ActivationPrecision::Q8);
        let q8 = logits(&model, &tokens);
        let (ours, theirs) = (max_diff(&q8, &exact), max_diff(&llama_cpp, &exact));
        println!(
            "{name}: from the exact logits: kvb with q8 activations {ours:.4}, llama.cpp \
             {theirs:.4}; kvb from llama.cpp {:.4}",
            max_diff(&q8, &llama_cpp)
        );
        assert!(
            ours > 0.0,
            "{name}: the exact logits: 8-bit activations did not run"
        );
        assert!(
            ours <= 1.2 * theirs,
            "{name}: 8-bit activations move kvb's logits {ours} from the exact ones, llama.cpp's \
             {theirs}"
        );
    }
}

fn tiny_dir(seed: u64) -> tempfile::TempDir {
    let dir = random_model_dir(&tiny_llama_config(2), seed);
    std::fs::copy(
        fixtures().join("tiny/llama/tokenizer.json"),
        dir.path().join("tokenizer.json"),
    )
    .unwrap();
    dir
}

/// `--weights q8_0 --activations q8`: the tiny models' f32 weights quantized, then multiplied
/// with 8-bit activations.
const Q8: LoadOptions = LoadOptions {
    strict: true,
    weights: WeightPrecision::Q8_0,
    activations: ActivationPrecision::Q8,
};

fn load(dir: &std::path::Path, options: LoadOptions) -> kvb_model::Result<Model<B>> {
    load_pretrained::<B>(dir, options, &Default::default(), &mut |_, _| {}).map(|m| m.model)
}

/// f32 weights have no integers to multiply: a clear error naming the way out, not a silent f32
/// run. With `--weights q8_0` the same model runs, close to its f32 self.
#[test]
fn q8_activations_need_integer_weights() {
    let dir = tiny_dir(3);
    let err = load(
        dir.path(),
        LoadOptions {
            activations: ActivationPrecision::Q8,
            ..LoadOptions::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("--weights q8_0"), "{err}");

    let f32_model = load(dir.path(), LoadOptions::default()).unwrap();
    let q8 = load(dir.path(), Q8).unwrap();
    let tokens: Vec<u32> = (0..40).map(|i| (i * 7 + 3) % 96).collect();
    let (a, b) = (logits(&f32_model, &tokens), logits(&q8, &tokens));
    let spread = a.iter().fold(0f32, |m, v| m.max(v.abs()));
    let diff = max_diff(&a, &b);
    assert!(diff > 0.0, "8-bit activations changed nothing: not running");
    assert!(
        diff <= 0.05 * spread,
        "{diff} against logits up to {spread}"
    );
}

/// Asking an 8-bit model for a bf16 forward (the fidelity noise floor) is an error, not a
/// silently mixed model.
#[test]
fn a_q8_model_has_no_bf16_forward() {
    let dir = tiny_dir(5);
    let q8 = load(dir.path(), Q8).unwrap();
    assert!(q8.with_bf16_compute().is_err());
    assert!(q8.with_activations(ActivationPrecision::F32).is_err());
}

/// Whether a model takes 8-bit activations is decided by its weights: integer blocks do (Q4_0's
/// of 32, Q6_K's K-quant cells with 16-weight sub-blocks), 16-bit floats do not (and asking for
/// it is then an error).
#[test]
fn the_model_says_whether_it_takes_q8_activations() {
    let dir = fixtures().join("llama-cpp");
    let model = |name: &str| {
        let gguf = GgufModel::open(&dir.join(format!("model.{name}.gguf"))).unwrap();
        let config = gguf.config(true).unwrap();
        Model::<B>::load(&config, &gguf, &Default::default(), &mut |_, _| {}).unwrap()
    };
    assert!(model("q4_0").takes_q8_activations());
    let q6_k = model("q6_k");
    assert!(q6_k.has_quantized_weights() && q6_k.takes_q8_activations());
    let f16 = model("f16");
    assert!(!f16.has_quantized_weights() && !f16.takes_q8_activations());
    let err = f16.with_activations(ActivationPrecision::Q8).unwrap_err();
    assert!(err.to_string().contains("integers in blocks"), "{err}");
}
