//! GGUF files as llama.cpp writes them: a tiny random Llama quantized by llama.cpp's own
//! quantizer to Q4_0, Q4_1, Q8_0, Q4_K_M, Q5_K_M, Q6_K and F16 (mixes of block types within a
//! file and within a fused projection, as `llama-quantize` makes them), each with llama.cpp's
//! logits for the same tokens and the logits of the same weights computed exactly (in f64, by a
//! plain forward in `fixtures/llama-cpp/make.py`, on the values llama.cpp's `gguf` package
//! expands).
//!
//! kvb, with the weights kept as stored, computes the exact logits to f32 rounding. llama.cpp
//! does not quite: its CPU products round the activations to 8 bits (to f16 for f16 weights)
//! before each dot product. So kvb must be no further from llama.cpp than llama.cpp is from the
//! exact logits, and every position's top token must agree with llama.cpp's unless its own top
//! two are closer than that rounding.

use crate::common::{fixtures, read_f32, B};
use kvb_model::gguf::GgufModel;
use kvb_model::{Model, WeightPrecision};

/// Largest difference from the exact logits, as a share of their standard deviation (f32
/// sums against f64 ones).
const EXACT_ERROR: f32 = 3e-5;

struct Fixture {
    name: String,
    gguf: std::path::PathBuf,
    logits: Vec<f32>,
    exact: Vec<f32>,
}

/// The fixtures' tokens, vocabulary size, files, and the logits of the f32 weights they were
/// quantized from.
fn fixtures_of_llama_cpp() -> (Vec<u32>, usize, Vec<Fixture>, Vec<f32>) {
    let dir = fixtures().join("llama-cpp");
    let json: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("fixtures.json")).unwrap()).unwrap();
    let tokens = json["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    let vocab = json["vocab"].as_u64().unwrap() as usize;
    let files = json["files"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, f)| Fixture {
            name: name.clone(),
            gguf: dir.join(f["gguf"].as_str().unwrap()),
            logits: read_f32(&dir.join(f["logits"].as_str().unwrap())),
            exact: read_f32(&dir.join(f["exact_logits"].as_str().unwrap())),
        })
        .collect();
    let reference = read_f32(&dir.join(json["reference_logits"].as_str().unwrap()));
    (tokens, vocab, files, reference)
}

fn logits(path: &std::path::Path, tokens: &[u32], precision: WeightPrecision) -> Vec<f32> {
    let gguf = GgufModel::open(path).unwrap();
    let config = gguf.config(true).unwrap();
    let model = Model::<B>::load_with(
        &config,
        &gguf,
        precision,
        &Default::default(),
        &mut |_, _| {},
    )
    .unwrap();
    crate::common::all_logits(&model, tokens)
}

fn spread(values: &[f32]) -> f32 {
    let mean = values.iter().sum::<f32>() / values.len() as f32;
    (values.iter().map(|v| (v - mean).powi(2)).sum::<f32>() / values.len() as f32).sqrt()
}

fn argmax(row: &[f32]) -> usize {
    (0..row.len())
        .max_by(|&a, &b| row[a].total_cmp(&row[b]))
        .unwrap()
}

#[test]
fn llama_cpp_quantized_files_give_llama_cpps_logits() {
    let (tokens, vocab, files, _) = fixtures_of_llama_cpp();
    assert!(files.len() >= 13, "every file type of make.py");
    for f in &files {
        let got = logits(&f.gguf, &tokens, WeightPrecision::Auto);
        let want = &f.logits;
        assert_eq!(got.len(), tokens.len() * vocab, "{}", f.name);
        assert_eq!(want.len(), got.len(), "{}", f.name);
        let spread = spread(want);
        let max_diff =
            |a: &[f32], b: &[f32]| a.iter().zip(b).fold(0f32, |m, (x, y)| m.max((x - y).abs()));
        let from_exact = max_diff(&got, &f.exact);
        let from_llama_cpp = max_diff(&got, want);
        let llama_cpp_rounding = max_diff(want, &f.exact);
        println!(
            "{}: logits spread {spread:.3}; largest difference from the exact logits: kvb \
             {from_exact:.2e}, llama.cpp {llama_cpp_rounding:.4}; kvb from llama.cpp \
             {from_llama_cpp:.4}",
            f.name
        );
        assert!(
            from_exact <= EXACT_ERROR * spread,
            "{}: kvb differs from the exact logits by {from_exact} (spread {spread})",
            f.name
        );
        assert!(
            from_llama_cpp <= llama_cpp_rounding * 1.01 + EXACT_ERROR * spread,
            "{}: kvb differs from llama.cpp by {from_llama_cpp}, more than llama.cpp's own \
             rounding ({llama_cpp_rounding})",
            f.name
        );
        let worst = llama_cpp_rounding;
        for (p, (g, w)) in got.chunks(vocab).zip(want.chunks(vocab)).enumerate() {
            let (top, theirs) = (argmax(g), argmax(w));
            if top != theirs {
                let margin = w[theirs] - w[top];
                assert!(
                    margin <= 2.0 * worst,
                    "{} position {p}: kvb's top token {top}, llama.cpp's {theirs} ahead by {margin}",
                    f.name
                );
            }
        }
    }
}

/// The same files with every weight expanded to f32 give the same bits as kept as stored (the
/// packed products compute the f32 expansion's sums), so the comparison above holds for both.
#[test]
fn llama_cpp_files_kept_as_stored_compute_their_f32_expansion() {
    let (tokens, _, files, _) = fixtures_of_llama_cpp();
    for f in &files {
        let packed = logits(&f.gguf, &tokens, WeightPrecision::Auto);
        let expanded = logits(&f.gguf, &tokens, WeightPrecision::F32);
        let differing = packed
            .iter()
            .zip(&expanded)
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        assert_eq!(differing, 0, "{}: {differing} logits differ", f.name);
    }
}

/// What each format costs against the f32 weights it was quantized from: the share of positions
/// whose top token is the f32 model's. kvb loses what the format loses and nothing more: where
/// its top token differs from that of the file's exact logits, those were a tie to f32 rounding.
#[test]
fn each_formats_top_token_agreement_with_the_f32_weights() {
    let (tokens, vocab, files, reference) = fixtures_of_llama_cpp();
    assert_eq!(reference.len(), tokens.len() * vocab);
    let tops = |logits: &[f32]| logits.chunks(vocab).map(argmax).collect::<Vec<_>>();
    let share = |a: &[usize], b: &[usize]| {
        a.iter().zip(b).filter(|(x, y)| x == y).count() as f64 / a.len() as f64
    };
    let f32_tops = tops(&reference);
    println!(
        "| format | top-1 agreement with the f32 weights (kvb) | (exact logits of the file) | \
         largest logit difference from the f32 weights' (share of their spread) |"
    );
    let spread_f32 = spread(&reference);
    for f in &files {
        let got = logits(&f.gguf, &tokens, WeightPrecision::Auto);
        let (kvb, exact) = (tops(&got), tops(&f.exact));
        let largest = got
            .iter()
            .zip(&reference)
            .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        println!(
            "| {} | {:.0}% | {:.0}% | {:.4} ({:.2}%) |",
            f.name,
            100.0 * share(&kvb, &f32_tops),
            100.0 * share(&exact, &f32_tops),
            largest,
            100.0 * largest / spread_f32
        );
        let tie = 2.0 * EXACT_ERROR * spread(&f.exact);
        for (p, row) in f.exact.chunks(vocab).enumerate() {
            let margin = row[exact[p]] - row[kvb[p]];
            assert!(
                margin <= tie,
                "{} position {p}: kvb's top token {} trails the exact top {} by {margin}",
                f.name,
                kvb[p],
                exact[p]
            );
        }
        // A format that keeps 8 bits or more loses (almost) nothing on this model.
        if ["q8_0", "f16", "q6_k"].contains(&f.name.as_str()) {
            assert!(share(&kvb, &f32_tops) >= 0.9, "{}", f.name);
        }
    }
}

/// Kept as stored, a file's matrices take the file's bytes: K-quant files (Q2_K, Q3_K_M,
/// Q4_K_M, Q5_K_M, Q6_K, whose fused q/k/v mix two K-quant types), IQ4_XS files, and Q4_0, Q4_1,
/// Q5_0, Q5_1, Q8_0 and IQ4_NL files (their f16 scales kept) within 5% of the bytes of the file's
/// matrices, where widening their blocks (or their scales to f32) took 1.2-2.4x. F16 is held at
/// its 16 bits.
#[test]
fn quantized_files_kept_as_stored_take_the_files_bytes() {
    let (_, _, files, _) = fixtures_of_llama_cpp();
    let mut checked = 0;
    for f in &files {
        let gguf = GgufModel::open(&f.gguf).unwrap();
        let config = gguf.config(true).unwrap();
        let file_bytes: usize = gguf
            .header()
            .tensors
            .values()
            .filter(|t| t.shape.len() == 2)
            .map(|t| t.range.len())
            .sum();
        let model = Model::<B>::load_with(
            &config,
            &gguf,
            WeightPrecision::Auto,
            &Default::default(),
            &mut |_, _| {},
        )
        .unwrap();
        let ratio = model.weight_bytes() as f64 / file_bytes as f64;
        println!(
            "{}: {} bytes held, {file_bytes} in the file ({ratio:.3}x)",
            f.name,
            model.weight_bytes()
        );
        assert!(ratio <= 1.05, "{}: {ratio:.3}x the file's bytes", f.name);
        checked += 1;
    }
    assert_eq!(checked, 13, "every file type of make.py");
}
