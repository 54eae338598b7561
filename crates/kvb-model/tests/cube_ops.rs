//! The CubeCL backends' fused row kernels (RMSNorm, the head split with RoPE, the gated
//! activation) give the reference tensor ops' values on random shapes: rows that are no multiple
//! of a cube's units, strided inputs, any positions, every head layout. One body per promise, run
//! on every CubeCL backend compiled in: wgpu (CI runs it on Mesa's lavapipe) and CUDA (ignored
//! tests, run with `-- --ignored` where an NVIDIA GPU is).
#![cfg(any(feature = "wgpu", feature = "cuda"))]

use burn::tensor::backend::Backend;
use burn::tensor::{Distribution, Tensor};
use kvb_model::config::Activation;
use kvb_model::model::{gated_activation_reference, rms_norm_reference, split_heads_reference};
use kvb_model::rope::Rope;
use kvb_model::{ModelBackend, ModelConfig};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

fn values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec::<f32>().unwrap()
}

/// Equal within f32 rounding of sums taken in another order.
fn close(got: &[f32], want: &[f32], what: &str) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.len(), want.len(), "{}: length", what);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        prop_assert!(
            (g - w).abs() <= 1e-5 + 1e-5 * w.abs(),
            "{}: value {} is {} where the reference gives {}",
            what,
            i,
            g,
            w
        );
    }
    Ok(())
}

/// A random `[n, width]` input, seeded; when `strided`, a column slice of a wider tensor (a view
/// whose rows are not contiguous).
fn input<B: Backend>(n: usize, width: usize, strided: bool, seed: u64) -> Tensor<B, 2> {
    B::seed(&Default::default(), seed);
    let dev = Default::default();
    let dist = Distribution::Normal(0.0, 2.0);
    if strided {
        Tensor::<B, 2>::random([n, width + 3], dist, &dev).slice([0..n, 2..width + 2])
    } else {
        Tensor::<B, 2>::random([n, width], dist, &dev)
    }
}

fn rms_norm_matches<B: ModelBackend>(
    n: usize,
    h: usize,
    strided: bool,
    seed: u64,
) -> Result<(), TestCaseError> {
    let x = input::<B>(n, h, strided, seed);
    let w = input::<B>(1, h, false, seed + 1);
    let got = values(B::rms_norm(x.clone(), w.clone(), 1e-5));
    let want = values(rms_norm_reference(x, w, 1e-5));
    close(&got, &want, "rms_norm")
}

fn split_heads_match<B: ModelBackend>(
    n: usize,
    (hq, hkv, d): (usize, usize, usize),
    strided: bool,
    seed: u64,
) -> Result<(), TestCaseError> {
    let qkv = input::<B>(n, (hq + 2 * hkv) * d, strided, seed);
    // A Llama config whose heads are `d` wide (the rest does not matter to RoPE).
    let json = format!(
        r#"{{"architectures":["LlamaForCausalLM"],"hidden_size":{},"intermediate_size":8,
        "num_hidden_layers":1,"num_attention_heads":{hq},"vocab_size":8,"rope_theta":10000.0}}"#,
        hq * d
    );
    let config = ModelConfig::from_json(&json, true).unwrap();
    // Positions in any order, as CacheBlend's scattered rows have them.
    let positions: Vec<usize> = (0..n).map(|t| (t * 7919 + seed as usize) % 4096).collect();
    let rope = Rope::new(&config).tables::<B>(&positions, &Default::default());
    let got = B::split_heads(qkv.clone(), (hq, hkv, d), &rope);
    let want = split_heads_reference(qkv, (hq, hkv, d), &rope);
    for ((g, w), what) in got.into_iter().zip(want).zip(["q", "k", "v"]) {
        prop_assert_eq!(g.dims(), w.dims(), "{} shape", what);
        close(&values(g), &values(w), what)?;
    }
    Ok(())
}

fn gated_matches<B: ModelBackend>(
    n: usize,
    i: usize,
    act: Activation,
    strided: bool,
    seed: u64,
) -> Result<(), TestCaseError> {
    let gu = input::<B>(n, 2 * i, strided, seed);
    let got = values(B::gated_activation(gu.clone(), act));
    let want = values(gated_activation_reference(gu, act));
    close(&got, &want, "gated activation")
}

/// The promises as tests of one backend module; `$ignore` marks backends that need hardware CI
/// lacks.
macro_rules! on_backend {
    ($name:ident, $feature:literal, $backend:ty $(, #[$ignore:meta])?) => {
        #[cfg(feature = $feature)]
        mod $name {
            use super::*;
            type B = $backend;

            proptest! {
                #![proptest_config(ProptestConfig::with_cases(24))]

                #[test]
                $(#[$ignore])?
                fn cube_rms_norm_matches_the_reference(
                    n in 1usize..20,
                    h in 1usize..700,
                    strided in any::<bool>(),
                    seed in 0u64..1000,
                ) {
                    rms_norm_matches::<B>(n, h, strided, seed)?;
                }

                #[test]
                $(#[$ignore])?
                fn cube_split_heads_match_the_reference(
                    n in 1usize..24,
                    heads in (1usize..4, 1usize..4),
                    d in prop::sample::select(vec![2usize, 8, 32, 64, 128]),
                    strided in any::<bool>(),
                    seed in 0u64..1000,
                ) {
                    let (hkv, group) = heads;
                    split_heads_match::<B>(n, (hkv * group, hkv, d), strided, seed)?;
                }

                #[test]
                $(#[$ignore])?
                fn cube_gated_activation_matches_the_reference(
                    n in 1usize..12,
                    i in 1usize..600,
                    gelu in any::<bool>(),
                    strided in any::<bool>(),
                    seed in 0u64..1000,
                ) {
                    let act = if gelu { Activation::GeluTanh } else { Activation::Silu };
                    gated_matches::<B>(n, i, act, strided, seed)?;
                }
            }
        }
    };
}

on_backend!(wgpu, "wgpu", burn::backend::Wgpu<f32, i32>);
on_backend!(cuda, "cuda", burn::backend::Cuda<f32, i32>, #[ignore = "needs an NVIDIA GPU"]);
