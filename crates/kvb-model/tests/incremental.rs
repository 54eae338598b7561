//! The forward pass is position-explicit and cache-consistent: prefill in parts, decode token by
//! token, or recompute tokens in place, and you get what one full prefill gives.

use crate::common::{random_model_dir, tiny_llama_config, B};
use burn::tensor::Tensor;
use kvb_model::{load_pretrained, KvCache, LoadOptions, LogitsFor, Model};
use proptest::prelude::*;

fn model(kv_heads: usize, seed: u64) -> Model<B> {
    let dir = random_model_dir(&tiny_llama_config(kv_heads), seed);
    std::fs::copy(
        crate::common::fixtures().join("tiny/llama/tokenizer.json"),
        dir.path().join("tokenizer.json"),
    )
    .unwrap();
    load_pretrained::<B>(
        dir.path(),
        LoadOptions::default(),
        &Default::default(),
        &mut |_, _| {},
    )
    .unwrap()
    .model
}

fn values(t: Tensor<B, 2>) -> Vec<f32> {
    t.into_data().to_vec::<f32>().unwrap()
}

/// Largest difference relative to the reference's scale. Summation order changes with the number
/// of rows computed (GEMM blocking; up to 8 rows take the GEMV path), and these random models
/// amplify rounding through their layers: measured worst case 1.8e-4 over 600 random recomputes.
/// A wrong mask, position or slot shows up as an O(1) difference.
fn max_diff(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(1f32, |m, x| m.max(x.abs()));
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
        / scale
}

fn kv_values(cache: &KvCache<B>, layer: usize, range: std::ops::Range<usize>) -> Vec<f32> {
    let (k, v) = cache.read(layer, range).unwrap();
    let mut out = k.into_data().to_vec::<f32>().unwrap();
    out.extend(v.into_data().to_vec::<f32>().unwrap());
    out
}

fn tokens(seed: u64, n: usize) -> Vec<u32> {
    (0..n as u64)
        .map(|i| ((seed * 31 + i * 17 + i * i) % 96) as u32)
        .collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(12))]

    #[test]
    fn two_part_prefill_at_explicit_positions_equals_one_prefill(
        kv_heads in prop::sample::select(vec![1usize, 2, 4]),
        n in 2usize..40,
        split_seed in any::<usize>(),
        seed in 0u64..1000,
    ) {
        let m = model(kv_heads, seed);
        let toks = tokens(seed, n);
        let split = 1 + split_seed % (n - 1);
        let all: Vec<usize> = (0..n).collect();

        let mut full = m.new_cache();
        let want = values(m.forward(&toks, &all, &mut full, LogitsFor::All).unwrap());

        let mut parts = m.new_cache();
        m.forward(&toks[..split], &all[..split], &mut parts, LogitsFor::Nothing).unwrap();
        let got = values(m.forward(&toks[split..], &all[split..], &mut parts, LogitsFor::All).unwrap());
        let vocab = want.len() / n;
        prop_assert!(max_diff(&got, &want[split * vocab..]) < 1e-3);
        for layer in 0..2 {
            prop_assert!(max_diff(&kv_values(&parts, layer, 0..n), &kv_values(&full, layer, 0..n)) < 1e-3);
        }
    }

    #[test]
    fn recomputing_tokens_in_place_reproduces_their_kv_and_logits(
        kv_heads in prop::sample::select(vec![1usize, 2, 4]),
        n in 3usize..40,
        pick in proptest::collection::vec(any::<bool>(), 40),
        seed in 0u64..1000,
    ) {
        let m = model(kv_heads, seed);
        let toks = tokens(seed + 1, n);
        let all: Vec<usize> = (0..n).collect();
        let mut cache = m.new_cache();
        let full = values(m.forward(&toks, &all, &mut cache, LogitsFor::All).unwrap());
        let before: Vec<Vec<f32>> = (0..2).map(|l| kv_values(&cache, l, 0..n)).collect();

        let mut slots: Vec<usize> = (0..n).filter(|&i| pick[i]).collect();
        if slots.is_empty() { slots.push(n - 1); }
        let sub: Vec<u32> = slots.iter().map(|&s| toks[s]).collect();
        let rows: Vec<usize> = (0..slots.len()).collect();
        let got = values(m.forward_at_slots(&sub, &slots, &slots, &mut cache, LogitsFor::Rows(rows)).unwrap());
        let vocab = full.len() / n;
        for (r, &s) in slots.iter().enumerate() {
            prop_assert!(max_diff(&got[r * vocab..(r + 1) * vocab], &full[s * vocab..(s + 1) * vocab]) < 1e-3);
        }
        for (layer, want) in before.iter().enumerate() {
            prop_assert!(max_diff(&kv_values(&cache, layer, 0..n), want) < 1e-3);
        }
    }
}

#[test]
fn decoding_token_by_token_equals_one_prefill() {
    for kv_heads in [1, 2, 4] {
        let m = model(kv_heads, 7);
        let toks = tokens(3, 24);
        let all: Vec<usize> = (0..24).collect();
        let mut full = m.new_cache();
        let want = values(m.forward(&toks, &all, &mut full, LogitsFor::All).unwrap());
        let vocab = want.len() / 24;

        let mut inc = m.new_cache();
        m.forward(&toks[..5], &all[..5], &mut inc, LogitsFor::Nothing)
            .unwrap();
        for i in 5..24 {
            let got = values(
                m.forward(&toks[i..i + 1], &[i], &mut inc, LogitsFor::Last)
                    .unwrap(),
            );
            let d = max_diff(&got, &want[i * vocab..(i + 1) * vocab]);
            assert!(d < 1e-3, "kv_heads {kv_heads}, step {i}: {d}");
        }
        assert_eq!(inc.len(), 24);
    }
}

#[test]
fn kv_restored_into_a_new_cache_continues_bit_identically() {
    let m = model(2, 11);
    let toks = tokens(5, 30);
    let all: Vec<usize> = (0..30).collect();
    let mut first = m.new_cache();
    m.forward(&toks[..20], &all[..20], &mut first, LogitsFor::Nothing)
        .unwrap();
    let saved: Vec<_> = (0..2).map(|l| first.read(l, 0..20).unwrap()).collect();
    let mut restored = m.new_cache();
    restored.append(saved).unwrap();

    // Same inputs on a restored cache: the very same operations, so the very same bits.
    let want = values(
        m.forward(&toks[20..], &all[20..], &mut first, LogitsFor::Last)
            .unwrap(),
    );
    let got = values(
        m.forward(&toks[20..], &all[20..], &mut restored, LogitsFor::Last)
            .unwrap(),
    );
    assert_eq!(got, want);

    // And within float tolerance of one full prefill.
    let mut full = m.new_cache();
    let one = values(m.forward(&toks, &all, &mut full, LogitsFor::Last).unwrap());
    assert!(max_diff(&got, &one) < 1e-3);
}

#[test]
fn positions_beyond_the_context_and_bad_tokens_are_errors() {
    let m = model(2, 1);
    let mut cache = m.new_cache();
    let err = m
        .forward(&[1, 2], &[510, 511 + 1], &mut cache, LogitsFor::Last)
        .unwrap_err();
    assert!(
        err.to_string().contains("beyond the model's context"),
        "{err}"
    );
    let err = m
        .forward(&[1, 600], &[0, 1], &mut cache, LogitsFor::Last)
        .unwrap_err();
    assert!(err.to_string().contains("outside the vocabulary"), "{err}");
    let err = m
        .forward(&[1], &[0, 1], &mut cache, LogitsFor::Last)
        .unwrap_err();
    assert!(err.to_string().contains("positions"), "{err}");
    assert!(
        cache.is_empty(),
        "a failed forward leaves the cache untouched"
    );
}
