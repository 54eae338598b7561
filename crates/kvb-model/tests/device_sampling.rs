//! Tokens chosen on the device ([`top_candidates`]) are the best of the logits as the device
//! holds them: the argmax for one candidate, else the `k` highest logits, highest first, each
//! with its own logit, read back in one copy. Run on every CubeCL backend compiled in: wgpu (CI
//! runs it on Mesa's lavapipe) and CUDA (ignored tests, run with `-- --ignored` on a GPU), in
//! f32 and half precision, where ties are common.
#![cfg(any(feature = "wgpu", feature = "cuda"))]

use burn::tensor::{Distribution, Tensor};
use kvb_model::generate::{top_candidates, MAX_DEVICE_K};
use kvb_model::{host_work, ModelBackend};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

/// Vocabulary sizes: a few, since CubeCL tunes its reductions anew for each shape (minutes over
/// a test's worth of random sizes on CUDA); below, at and above the top-k size, not multiples of
/// a cube, and a real one (SmolLM2's), which the argmax splits into spans.
const VOCABS: [usize; 6] = [2, 64, 77, 1000, 2999, 49_152];

fn candidates_are_the_best<B: ModelBackend>(
    rows: usize,
    vocab: usize,
    k: usize,
    seed: u64,
) -> Result<(), TestCaseError> {
    B::seed(&Default::default(), seed);
    let dev = Default::default();
    let logits = Tensor::<B, 2>::random(
        [rows, vocab],
        Distribution::Normal(0.0, 3.0),
        kvb_attn::float_on::<B>(&dev),
    );
    // The logits as the device holds them (f16 rounds), widened.
    let held = logits.to_data().convert::<f32>().to_vec::<f32>().unwrap();
    let before = host_work::so_far();
    let c = top_candidates(logits, k).unwrap();
    let work = host_work::so_far() - before;
    prop_assert_eq!(work.reads, 1, "one copy back");
    let k = k.min(vocab);
    prop_assert_eq!((c.rows(), c.k()), (rows, k));
    for r in 0..rows {
        let row = &held[r * vocab..(r + 1) * vocab];
        let mut best: Vec<f32> = row.to_vec();
        best.sort_by(|a, b| b.total_cmp(a));
        let ids = c.ids(r);
        let mut seen = std::collections::HashSet::new();
        prop_assert!(ids.iter().all(|&i| (i as usize) < vocab && seen.insert(i)));
        if k == 1 {
            // The best logit, at its lowest index (f16 logits tie often).
            let first = row.iter().position(|&v| v == best[0]);
            prop_assert_eq!(Some(ids[0] as usize), first, "row {}: the argmax", r);
            continue;
        }
        let values = c.values(r);
        // Highest first, each its token's logit, and the k highest of the row.
        for (j, (&id, &v)) in ids.iter().zip(values).enumerate() {
            prop_assert_eq!(row[id as usize], v, "row {} candidate {}", r, j);
            prop_assert_eq!(v, best[j], "row {}: rank {}", r, j);
        }
        for w in ids.windows(2).zip(values.windows(2)) {
            let ((a, b), (va, vb)) = ((w.0[0], w.0[1]), (w.1[0], w.1[1]));
            prop_assert!(va > vb || (va == vb && a < b), "row {}: order", r);
        }
    }
    Ok(())
}

macro_rules! on_backend {
    ($name:ident, $feature:literal, $backend:ty, #[$top_k_ignore:meta] $(, #[$ignore:meta])?) => {
        #[cfg(feature = $feature)]
        mod $name {
            use super::*;
            type B = $backend;

            proptest! {
                #![proptest_config(ProptestConfig::with_cases(16))]

                #[test]
                $(#[$ignore])?
                fn device_argmax_is_the_best_logit(
                    rows in 1usize..5,
                    vocab in prop::sample::select(VOCABS.to_vec()),
                    seed in 0u64..1000,
                ) {
                    candidates_are_the_best::<B>(rows, vocab, 1, seed)?;
                }

                /// The engine's one top-k size, and a whole small vocabulary. CUDA only: on
                /// lavapipe the top-k shader takes minutes to compile per size and type.
                #[test]
                #[$top_k_ignore]
                fn device_top_k_are_the_best_logits(
                    rows in 1usize..5,
                    vocab in prop::sample::select(VOCABS.to_vec()),
                    seed in 0u64..1000,
                ) {
                    candidates_are_the_best::<B>(rows, vocab, MAX_DEVICE_K, seed)?;
                }
            }
        }
    };
}

on_backend!(wgpu, "wgpu", burn::backend::Wgpu<f32, i32>, #[ignore = "compiles for minutes on lavapipe"]);
on_backend!(wgpu_f16, "wgpu", burn::backend::Wgpu<half::f16, i32>, #[ignore = "compiles for minutes on lavapipe"]);
on_backend!(cuda, "cuda", burn::backend::Cuda<f32, i32>, #[ignore = "needs an NVIDIA GPU"], #[ignore = "needs an NVIDIA GPU"]);
on_backend!(cuda_f16, "cuda", burn::backend::Cuda<half::f16, i32>, #[ignore = "needs an NVIDIA GPU"], #[ignore = "needs an NVIDIA GPU"]);
on_backend!(cuda_bf16, "cuda", burn::backend::Cuda<half::bf16, i32>, #[ignore = "needs an NVIDIA GPU"], #[ignore = "needs an NVIDIA GPU"]);
