//! The CubeCL backends' fused row kernels (RMSNorm, with and without the residual add before it,
//! the head split with RoPE, the gated activation) and their few-row projections give the
//! reference tensor ops' values on
//! random shapes: rows that are no multiple of a cube's units, strided inputs, any positions,
//! every head layout. One body per promise, run on every CubeCL backend compiled in: wgpu (CI
//! runs it on Mesa's lavapipe) and CUDA (ignored tests, run with `-- --ignored` where an NVIDIA
//! GPU is), each in f32 and in half precision.
//!
//! The reference runs on the CPU in f32 from the inputs as the backend holds them: for f16 and
//! bf16 that is the answer of a kernel that rounds only when it reads and writes, and a kernel
//! that summed squares in f16 (which overflows past 65,504) misses it.
#![cfg(any(feature = "wgpu", feature = "cuda"))]

use burn::tensor::backend::Backend;
use burn::tensor::{DType, Distribution, Element, Tensor};
use kvb_model::backends::Cpu;
use kvb_model::config::Activation;
use kvb_model::model::{gated_activation_reference, rms_norm_reference, PROJECTION_KERNEL_ROWS};
use kvb_model::rope::Rope;
use kvb_model::{ModelBackend, ModelConfig};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

fn values<B: Backend, const D: usize>(t: Tensor<B, D>) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec::<f32>().unwrap()
}

/// `t` (on any backend, in its float type) as an f32 tensor on the CPU.
fn on_cpu<B: Backend, const D: usize>(t: &Tensor<B, D>) -> Tensor<Cpu, D> {
    Tensor::from_data(t.to_data().convert::<f32>(), &Default::default())
}

/// How far a kernel on `B` may be from the f32 reference, relative to `1 + |value|`: f32
/// rounding of sums taken in another order; for f16 (bf16) the rounding of the output, a step
/// of 4.9e-4 (3.9e-3), and a little more.
fn tolerance<B: Backend>() -> f32 {
    match <B::FloatElem as Element>::dtype() {
        DType::F16 => 1e-3,
        DType::BF16 => 8e-3,
        _ => 1e-5,
    }
}

/// Equal within [`tolerance`].
fn close<B: Backend>(got: &[f32], want: &[f32], what: &str) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.len(), want.len(), "{}: length", what);
    let tolerance = tolerance::<B>();
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        prop_assert!(
            (g - w).abs() <= tolerance * (1.0 + w.abs()),
            "{}: value {} is {} where the reference gives {}",
            what,
            i,
            g,
            w
        );
    }
    Ok(())
}

/// A random `[n, width]` input, seeded, of standard deviation `std`; when `strided`, a column
/// slice of a wider tensor (a view whose rows are not contiguous).
fn input<B: Backend>(n: usize, width: usize, std: f64, strided: bool, seed: u64) -> Tensor<B, 2> {
    B::seed(&Default::default(), seed);
    let dev = Default::default();
    let dist = Distribution::Normal(0.0, std);
    if strided {
        Tensor::<B, 2>::random([n, width + 3], dist, kvb_attn::float_on::<B>(&dev))
            .slice([0..n, 2..width + 2])
    } else {
        Tensor::<B, 2>::random([n, width], dist, kvb_attn::float_on::<B>(&dev))
    }
}

/// Rows of standard deviation `std`: a model's residual stream reaches the tens.
fn rms_norm_matches<B: ModelBackend>(
    n: usize,
    h: usize,
    std: f64,
    strided: bool,
    seed: u64,
) -> Result<(), TestCaseError> {
    let x = input::<B>(n, h, std, strided, seed);
    let w = input::<B>(1, h, 1.0, false, seed + 1);
    let got = values(B::rms_norm(x.clone(), w.clone(), 1e-5));
    let want = values(rms_norm_reference(on_cpu(&x), on_cpu(&w), 1e-5));
    close::<B>(&got, &want, "rms_norm")
}

/// The residual add fused into the norm: the sum, and the norm of the sum.
fn add_rms_norm_matches<B: ModelBackend>(
    n: usize,
    h: usize,
    strided: bool,
    seed: u64,
) -> Result<(), TestCaseError> {
    let x = input::<B>(n, h, 20.0, strided, seed);
    let delta = input::<B>(n, h, 5.0, !strided, seed + 1);
    let w = input::<B>(1, h, 1.0, false, seed + 2);
    let [sum, normed] = B::add_rms_norm(x.clone(), delta.clone(), w.clone(), 1e-5);
    let want_sum = on_cpu(&x) + on_cpu(&delta);
    close::<B>(&values(sum), &values(want_sum.clone()), "residual sum")?;
    let want = values(rms_norm_reference(want_sum, on_cpu(&w), 1e-5));
    close::<B>(&values(normed), &want, "norm of the sum")
}

fn split_heads_match<B: ModelBackend>(
    n: usize,
    (hq, hkv, d): (usize, usize, usize),
    strided: bool,
    seed: u64,
) -> Result<(), TestCaseError> {
    let qkv = input::<B>(n, (hq + 2 * hkv) * d, 2.0, strided, seed);
    // A Llama config whose heads are `d` wide (the rest does not matter to RoPE).
    let json = format!(
        r#"{{"architectures":["LlamaForCausalLM"],"hidden_size":{},"intermediate_size":8,
        "num_hidden_layers":1,"num_attention_heads":{hq},"vocab_size":8,"rope_theta":10000.0}}"#,
        hq * d
    );
    let config = ModelConfig::from_json(&json, true).unwrap();
    // Positions in any order, as CacheBlend's scattered rows have them.
    let positions: Vec<usize> = (0..n).map(|t| (t * 7919 + seed as usize) % 4096).collect();
    let tables = Rope::new(&config).tables::<B>(&positions, &Default::default());
    let got = B::split_heads(qkv.clone(), (hq, hkv, d), &tables);
    let want = split_heads_per_value(
        &values(qkv),
        [
            values(tables.cos().clone()),
            values(tables.signed_sin().clone()),
        ],
        (n, hq, hkv, d),
    );
    for ((g, w), what) in got.into_iter().zip(want).zip(["q", "k", "v"]) {
        prop_assert_eq!(g.dims(), [1, w.len() / (n * d), n, d], "{} shape", what);
        close::<B>(&values(g), &w, what)?;
    }
    Ok(())
}

/// q, k and v (`[heads][n][d]` each) of `qkv` (`[n][(hq + 2 hkv) d]`), q and k rotated by the
/// tables (`[n][d]` each), per value in f64 from the values as the backend holds them: HF's
/// `x * cos + rotate_half(x) * sin`. (The reference ops would compute in the backend's type.)
fn split_heads_per_value(
    qkv: &[f32],
    [cos, signed_sin]: [Vec<f32>; 2],
    (n, hq, hkv, d): (usize, usize, usize, usize),
) -> [Vec<f32>; 3] {
    let width = (hq + 2 * hkv) * d;
    let mut out = [Vec::new(), Vec::new(), Vec::new()];
    for head in 0..hq + 2 * hkv {
        let (part, rotate) = match head {
            h if h < hq => (0, true),
            h if h < hq + hkv => (1, true),
            _ => (2, false),
        };
        for t in 0..n {
            for e in 0..d {
                let x = |e: usize| qkv[t * width + head * d + e] as f64;
                let mut v = x(e);
                if rotate {
                    let pair = (e + d / 2) % d;
                    v = v * cos[t * d + e] as f64 + x(pair) * signed_sin[t * d + e] as f64;
                }
                out[part].push(v as f32);
            }
        }
    }
    out
}

fn gated_matches<B: ModelBackend>(
    n: usize,
    i: usize,
    act: Activation,
    strided: bool,
    seed: u64,
) -> Result<(), TestCaseError> {
    let gu = input::<B>(n, 2 * i, 2.0, strided, seed);
    let got = values(B::gated_activation(gu.clone(), act));
    let want = values(gated_activation_reference(on_cpu(&gu), act));
    close::<B>(&got, &want, "gated activation")
}

/// A projection as the model holds it on a CubeCL backend: the weight `[out, in]` viewed
/// transposed. Up to 16 rows (contiguous, padded as CUDA pads them, or a column slice) take
/// kvb's few-row kernel, more rows burn's matmul.
fn linear_matches<B: ModelBackend>(
    m: usize,
    (k, n): (usize, usize),
    strided: bool,
    seed: u64,
) -> Result<(), TestCaseError> {
    let x = input::<B>(m, k, 1.0, strided, seed);
    let w = input::<B>(n, k, 1.0, false, seed + 1).transpose();
    let got = values(B::linear_matmul(x.clone(), w.clone()));
    // Per output, in f64, with the sum of its terms' magnitudes: f32 sums taken in another
    // order differ by a few ulps of that, however much the terms cancel.
    let (xs, ws) = (values(x), values(w));
    prop_assert_eq!(got.len(), m * n, "projection: length");
    let output_rounding = match <B::FloatElem as Element>::dtype() {
        DType::F16 | DType::BF16 => tolerance::<B>(),
        _ => 0.0,
    };
    // The kernel's f32 sum of one output goes through a product, up to k/32 additions in a
    // unit and five in the group's tree: an ulp of the terms' magnitude for each. More rows
    // take burn's matmul, which on CUDA multiplies f32 on TF32 tensor cores (10-bit
    // mantissas): its own precision, not this kernel's.
    let per_term = if m <= PROJECTION_KERNEL_ROWS {
        (k.div_ceil(32) + 8) as f32 * f32::EPSILON
    } else {
        2e-3
    };
    for (i, g) in got.iter().enumerate() {
        let (r, c) = (i / n, i % n);
        let terms = (0..k).map(|j| xs[r * k + j] as f64 * ws[j * n + c] as f64);
        let (want, magnitude) = terms.fold((0.0, 0.0), |(s, a), t| (s + t, a + t.abs()));
        let bound = per_term as f64 * magnitude + output_rounding as f64 * (1.0 + want.abs());
        prop_assert!(
            (*g as f64 - want).abs() <= bound,
            "projection: value {} is {} where the terms sum to {} (bound {})",
            i,
            g,
            want,
            bound
        );
    }
    Ok(())
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
                    std in prop::sample::select(vec![2.0f64, 30.0]),
                    strided in any::<bool>(),
                    seed in 0u64..1000,
                ) {
                    rms_norm_matches::<B>(n, h, std, strided, seed)?;
                }

                #[test]
                $(#[$ignore])?
                fn cube_add_rms_norm_matches_the_reference(
                    n in 1usize..20,
                    h in 1usize..700,
                    strided in any::<bool>(),
                    seed in 0u64..1000,
                ) {
                    add_rms_norm_matches::<B>(n, h, strided, seed)?;
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

                #[test]
                $(#[$ignore])?
                fn cube_projection_matches_the_reference(
                    m in 1usize..20,
                    k in prop_oneof![1usize..40, 250usize..700],
                    n in 1usize..300,
                    strided in any::<bool>(),
                    seed in 0u64..1000,
                ) {
                    linear_matches::<B>(m, (k, n), strided, seed)?;
                }
            }
        }
    };
}

on_backend!(wgpu, "wgpu", burn::backend::Wgpu<f32, i32>);
on_backend!(wgpu_f16, "wgpu", burn::backend::Wgpu<half::f16, i32>);
on_backend!(cuda, "cuda", burn::backend::Cuda<f32, i32>, #[ignore = "needs an NVIDIA GPU"]);
on_backend!(cuda_f16, "cuda", burn::backend::Cuda<half::f16, i32>, #[ignore = "needs an NVIDIA GPU"]);
on_backend!(cuda_bf16, "cuda", burn::backend::Cuda<half::bf16, i32>, #[ignore = "needs an NVIDIA GPU"]);
