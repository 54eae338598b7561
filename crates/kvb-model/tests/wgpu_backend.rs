//! The wgpu backend runs the same generic model code as ndarray and gives the same answers: on
//! every tiny family, logits within float tolerance and identical greedy tokens. CI runs it on the
//! CPU through Mesa's lavapipe (`apt-get install mesa-vulkan-drivers`).
#![cfg(feature = "wgpu")]

mod common;

use common::fixtures;
use kvb_model::backends::{Cpu, Wgpu};
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

#[test]
fn wgpu_matches_ndarray_on_every_tiny_family() {
    let gpu = burn::backend::wgpu::WgpuDevice::default();
    for family in [
        "llama",
        "llama-rope-llama3",
        "qwen2",
        "mistral",
        "gemma",
        "phi3",
    ] {
        let cpu_model = load::<Cpu>(family, &Default::default());
        let ids = cpu_model
            .tokenizer
            .encode("Paris is the capital of France. The quick brown fox", false)
            .unwrap();
        let (cpu_logits, cpu_tokens) = run(&cpu_model, &ids);
        let (gpu_logits, gpu_tokens) = run(&load::<Wgpu>(family, &gpu), &ids);
        let d = cpu_logits
            .iter()
            .zip(&gpu_logits)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(d < 1e-3, "{family}: wgpu logits differ from ndarray by {d}");
        assert_eq!(cpu_tokens, gpu_tokens, "{family}: greedy tokens");
    }
}
