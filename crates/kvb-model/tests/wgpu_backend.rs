//! The wgpu backend runs the same generic model code as ndarray and gives the same answers: on
//! every tiny family, logits within float tolerance and identical greedy tokens; in f16, within
//! f16's rounding and the same top token wherever f32's is clear of it. CI runs it on the
//! CPU through Mesa's lavapipe (`apt-get install mesa-vulkan-drivers`).
#![cfg(feature = "wgpu")]

use crate::common::fixtures;
use kvb_model::backends::{Cpu, Wgpu, WgpuF16};
use kvb_model::generate::{generate, GenerateParams};
use kvb_model::{load_pretrained, LoadOptions, LogitsFor, ModelBackend, Pretrained};

fn load<B: ModelBackend>(family: &str, device: &B::Device) -> Pretrained<B> {
    let dir = fixtures().join("tiny").join(family);
    load_pretrained::<B>(&dir, LoadOptions::default(), device, &mut |_, _| {})
        .unwrap_or_else(|e| panic!("{family}: {e}"))
}

fn run<B: ModelBackend>(m: &Pretrained<B>, ids: &[u32]) -> (Vec<f32>, Vec<u32>) {
    let positions: Vec<usize> = (0..ids.len()).collect();
    let mut cache = m.model.new_cache();
    let logits = m
        .model
        .forward(ids, &positions, &mut cache, LogitsFor::All)
        .unwrap();
    let logits = logits.into_data().convert::<f32>().to_vec::<f32>().unwrap();
    let params = GenerateParams {
        max_new_tokens: 16,
        stop_at_eos: false,
        ..Default::default()
    };
    let tokens = generate(&m.model, &m.tokenizer, ids, &params, &mut |_| {})
        .unwrap()
        .decoded
        .tokens;
    (logits, tokens)
}

const FAMILIES: [&str; 6] = [
    "llama",
    "llama-rope-llama3",
    "qwen2",
    "mistral",
    "gemma",
    "phi3",
];

const TEXT: &str = "Paris is the capital of France. The quick brown fox";

#[test]
fn wgpu_matches_ndarray_on_every_tiny_family() {
    let gpu = burn::backend::wgpu::WgpuDevice::default();
    for family in FAMILIES {
        let cpu_model = load::<Cpu>(family, &Default::default());
        let ids = cpu_model.tokenizer.encode(TEXT, false).unwrap();
        let (cpu_logits, cpu_tokens) = run(&cpu_model, &ids);
        let (gpu_logits, gpu_tokens) = run(&load::<Wgpu>(family, &gpu), &ids);
        let d = max_abs_diff(&cpu_logits, &gpu_logits);
        assert!(d < 1e-3, "{family}: wgpu logits differ from ndarray by {d}");
        assert_eq!(cpu_tokens, gpu_tokens, "{family}: greedy tokens");
    }
}

/// wgpu computing in f16 (`--dtype f16`: weights, activations and the K/V pool rounded to f16,
/// sums inside kvb's kernels in f32): on every tiny family its logits stay within f16's rounding
/// of ndarray's f32 answer, and every position whose two best f32 logits are farther apart than
/// twice that error picks the same token. A kernel that summed in f16 or misread an f16 tensor
/// misses these bounds.
#[test]
fn wgpu_f16_stays_within_half_precision_of_ndarray() {
    let gpu = burn::backend::wgpu::WgpuDevice::default();
    for family in FAMILIES {
        let cpu_model = load::<Cpu>(family, &Default::default());
        let ids = cpu_model.tokenizer.encode(TEXT, false).unwrap();
        let (cpu_logits, _) = run(&cpu_model, &ids);
        let f16_model = load::<WgpuF16>(family, &gpu);
        // Really f16, not f32 under another name (burn's device default, see `float_on`). Beside
        // wgpu in f32, not the CPU: there a tied head is a transposed copy of the embedding,
        // on a GPU the embedding itself.
        assert_eq!(
            2 * f16_model.model.weight_bytes(),
            load::<Wgpu>(family, &gpu).model.weight_bytes(),
            "{family}: f16 weights take half of f32's bytes"
        );
        let (f16_logits, _) = run(&f16_model, &ids);
        assert_eq!(cpu_logits.len(), f16_logits.len(), "{family}");
        let vocab = cpu_logits.len() / ids.len();
        let error = max_abs_diff(&cpu_logits, &f16_logits);
        let scale = cpu_logits.iter().fold(1f32, |m, x| m.max(x.abs()));
        eprintln!("{family}: f16 logits within {error} of f32 (largest logit {scale})");
        assert!(
            error <= F16_LOGIT_ERROR * scale,
            "{family}: f16 logits differ from f32 by {error}, over {F16_LOGIT_ERROR} x {scale}"
        );
        let mut decided = 0;
        for (row, (c, h)) in cpu_logits
            .chunks(vocab)
            .zip(f16_logits.chunks(vocab))
            .enumerate()
        {
            let (best, margin) = best_and_margin(c);
            if margin > 2.0 * error {
                decided += 1;
                assert_eq!(
                    best_and_margin(h).0,
                    best,
                    "{family}: position {row}'s top token"
                );
            }
        }
        assert!(
            decided > 0,
            "{family}: no position is decided beyond f16's error {error}"
        );
    }
}

/// Logits of an f16 forward pass differ from f32's by at most this, relative to the largest
/// logit: f16 keeps 11 significant bits (4.9e-4 relative), and a pass rounds each layer's
/// activations once more.
const F16_LOGIT_ERROR: f32 = 5e-3;

/// The index of the largest value and how far it is above the second.
fn best_and_margin(row: &[f32]) -> (usize, f32) {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    let second = row
        .iter()
        .enumerate()
        .filter(|&(i, _)| i != best)
        .fold(f32::NEG_INFINITY, |m, (_, &x)| m.max(x));
    (best, row[best] - second)
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0f32, f32::max)
}
