//! The CubeCL kernel equals the per-element answer on random paged cases: GQA, head dims 8 to
//! 128, block sizes 1 to 32, sequences sharing prefix blocks, scattered blocks, decode rows,
//! prefill rows after cached K/V, lengths that are no multiple of the kernel's tile. The plain
//! `attention` entry point (causal at an offset, and arbitrary slots) agrees with the reference
//! ops. One body per promise, run on every CubeCL backend compiled in: wgpu (CI runs it on
//! Mesa's lavapipe) and CUDA (ignored tests, run with `-- --ignored` where an NVIDIA GPU is).
#![cfg(any(feature = "wgpu", feature = "cuda"))]

use crate::common::paged_case::{as_stored, case, close_within, tolerance};
use burn::tensor::{Distribution, Tensor, TensorData};
use kvb_attn::{
    attention, float_on, AttentionBackend, Kernel, PagedBatch, PagedKernelChoice, PagedSeq,
    PoolBackend, Visibility,
};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

fn shapes() -> impl Strategy<Value = (usize, usize, usize, usize)> {
    (
        prop::sample::select(vec![1usize, 2, 3]),
        prop::sample::select(vec![1usize, 2, 3, 4]),
        prop::sample::select(vec![8usize, 32, 64, 96, 128]),
        prop::sample::select(vec![1usize, 4, 16, 32]),
    )
}

fn to_vec<B: burn::tensor::backend::Backend>(t: Tensor<B, 4>) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec::<f32>().unwrap()
}

type Lens = Vec<(usize, usize, bool)>;

fn paged_matches_naive<B: AttentionBackend>(
    shape: (usize, usize, usize, usize),
    lens: &Lens,
    shared: usize,
    scatter: bool,
    seed: u64,
) -> Result<(), TestCaseError> {
    let dev = Default::default();
    let c = case(shape, lens, shared, scatter, seed).as_stored::<B>(&dev);
    let got = c
        .run::<B>(<B as AttentionBackend>::paged_attention, &dev)
        .unwrap();
    close_within(&got, &c.naive(), c.tolerance::<B>(), "cube kernel")
}

/// Causal queries at an offset into longer K/V, and scattered slots (CacheBlend's rows), against
/// the reference ops on the CPU.
fn attention_matches_the_reference<B: AttentionBackend>(
    (hkv, group, d): (usize, usize, usize),
    t: usize,
    n_frac: f64,
    scattered: bool,
    seed: u64,
) -> Result<(), TestCaseError> {
    let dev = Default::default();
    let n = ((t as f64 * n_frac) as usize).clamp(1, t);
    let hq = hkv * group;
    let visibility = if scattered {
        Visibility::UpToSlot((0..n).map(|i| (i * 7919 + seed as usize) % t).collect())
    } else {
        Visibility::Causal
    };
    let rand = |shape: [usize; 4]| {
        Tensor::<B, 4>::random(shape, Distribution::Normal(0.0, 1.0), float_on::<B>(&dev))
    };
    let (q, k, v) = (
        rand([1, hq, n, d]),
        rand([1, hkv, t, d]),
        rand([1, hkv, t, d]),
    );
    let scale = (d as f32).powf(-0.5);
    // The reference runs on the CPU: on CUDA, burn's own f32 matrix products use TF32 tensor
    // cores (10-bit mantissas), so the same ops on the GPU are no f32 yardstick.
    let on_cpu = |t: &Tensor<B, 4>| {
        Tensor::<burn::backend::NdArray<f32>, 4>::from_data(t.to_data(), &Default::default())
    };
    let want =
        to_vec(attention(on_cpu(&q), on_cpu(&k), on_cpu(&v), &visibility, None, scale).unwrap());
    let got =
        to_vec(<B as AttentionBackend>::attention(q, k, v, &visibility, None, scale).unwrap());
    close_within(&got, &want, tolerance::<B>(), "cube attention")
}

fn empty_and_bad_batches<B: AttentionBackend>() {
    let dev = Default::default();
    let pool = Tensor::<B, 3>::zeros([1, 8, 4], float_on::<B>(&dev));
    let q = Tensor::<B, 4>::zeros([1, 2, 0, 4], float_on::<B>(&dev));
    let out = <B as AttentionBackend>::paged_attention(
        q,
        &pool,
        &pool,
        &PagedBatch {
            block_size: 4,
            seqs: &[],
        },
        0.5,
    )
    .unwrap();
    assert_eq!(out.dims(), [0, 8]);

    let q = Tensor::<B, 4>::from_data(
        TensorData::new(vec![1f32; 8], [1, 2, 1, 4]),
        float_on::<B>(&dev),
    );
    let past_the_pool = [PagedSeq {
        blocks: &[2],
        rows: 0..1,
        last_slot: &[1],
        decode: true,
    }];
    let batch = PagedBatch {
        block_size: 4,
        seqs: &past_the_pool,
    };
    assert!(<B as AttentionBackend>::paged_attention(q, &pool, &pool, &batch, 0.5).is_err());
}

/// `pool_scatter` writes every value at its slot and nothing else, from values in any layout (here
/// transposed, as attention hands them over); a pool another tensor still reads is left as it was
/// (the write goes to a copy). `pool_scatter_pair` does the same for K and V at once.
fn pool_scatter_writes_the_slots<B: AttentionBackend>(
    (heads, slots, d): (usize, usize, usize),
    picks: &[usize],
    seed: u64,
) -> Result<(), TestCaseError> {
    let dev = Default::default();
    // Distinct slots (the contract), in a scrambled order.
    let mut seen = std::collections::HashSet::new();
    let mut chosen: Vec<usize> = picks
        .iter()
        .map(|p| p % slots)
        .filter(|s| seen.insert(*s))
        .collect();
    chosen.sort_unstable_by_key(|&s| ((s * 7919) ^ seed as usize, s));
    let n = chosen.len();
    let value = |h: usize, i: usize, e: usize| (h * 1000 + i * 10 + e) as f32 + 0.5;
    let before: Vec<f32> = (0..heads * slots * d).map(|x| -(x as f32)).collect();
    let pool = Tensor::<B, 3>::from_data(
        TensorData::new(before.clone(), [heads, slots, d]),
        float_on::<B>(&dev),
    );
    // [n, heads, d] in memory, viewed as [heads, n, d].
    let mut raw = vec![0f32; n * heads * d];
    for i in 0..n {
        for h in 0..heads {
            for e in 0..d {
                raw[(i * heads + h) * d + e] = value(h, i, e);
            }
        }
    }
    // V's values are K's negated, made on the host: burn's own ops launch kernels of zero
    // cubes on empty tensors, which CUDA rejects.
    let negated: Vec<f32> = raw.iter().map(|x| -x).collect();
    let as_values = |raw: Vec<f32>| {
        Tensor::<B, 3>::from_data(TensorData::new(raw, [n, heads, d]), float_on::<B>(&dev))
            .swap_dims(0, 1)
    };
    let (values, negated) = (as_values(raw), as_values(negated));
    // What the pool and the values hold in `B`'s float type (f16 rounds the larger ones).
    let before = as_stored::<B>(&before, &dev);
    let value = |h: usize, i: usize, e: usize| as_stored::<B>(&[value(h, i, e)], &dev)[0];
    let mut want = before.clone();
    for (i, &s) in chosen.iter().enumerate() {
        for h in 0..heads {
            for e in 0..d {
                want[(h * slots + s) * d + e] = value(h, i, e);
            }
        }
    }
    let read = |t: Tensor<B, 3>| t.into_data().convert::<f32>().to_vec::<f32>().unwrap();
    let shared = pool.clone();
    let written = <B as PoolBackend>::pool_scatter(pool, &chosen, values.clone());
    prop_assert_eq!(read(written), want.clone(), "a shared pool's copy");
    prop_assert_eq!(read(shared), before.clone(), "the shared pool itself");
    let alone = Tensor::<B, 3>::from_data(
        TensorData::new(before.clone(), [heads, slots, d]),
        float_on::<B>(&dev),
    );
    let written = <B as PoolBackend>::pool_scatter(alone, &chosen, values.clone());
    prop_assert_eq!(read(written), want.clone(), "in place");
    // K and V together (one launch where both pools are unshared): V gets the values negated.
    let fresh = || {
        Tensor::<B, 3>::from_data(
            TensorData::new(before.clone(), [heads, slots, d]),
            float_on::<B>(&dev),
        )
    };
    let mut want_v = before.clone();
    for (i, &s) in chosen.iter().enumerate() {
        for h in 0..heads {
            for e in 0..d {
                want_v[(h * slots + s) * d + e] = -value(h, i, e);
            }
        }
    }
    let shared_v = fresh();
    for v_pool in [fresh(), shared_v.clone()] {
        let [k, v] = <B as PoolBackend>::pool_scatter_pair(
            [fresh(), v_pool],
            &chosen,
            [values.clone(), negated.clone()],
        );
        prop_assert_eq!(read(k), want.clone(), "K of a pair");
        prop_assert_eq!(read(v), want_v.clone(), "V of a pair");
    }
    prop_assert_eq!(read(shared_v), before, "a shared V pool itself");
    Ok(())
}

/// Decode batches, short suffixes and f32 tensors never take tensor cores; f16 and bf16 long
/// prefills take them on CUDA (`tensor_cores`: the backend is known to have them for its dtype).
fn the_kernel_choice<B: PagedKernelChoice>(tensor_cores: bool) {
    let dev = Default::default();
    assert_eq!(B::paged_kernel(&dev, 128, 32, &[1; 8]), Kernel::Vector);
    assert_eq!(B::paged_kernel(&dev, 128, 32, &[128]), Kernel::Vector);
    assert_eq!(B::paged_kernel(&dev, 8, 32, &[4096]), Kernel::Vector);
    let prefill = B::paged_kernel(&dev, 128, 32, &[4096]);
    if tensor_cores {
        assert_eq!(prefill, Kernel::TensorCore);
    } else if <B::FloatElem as burn::tensor::Element>::dtype() == burn::tensor::DType::F32 {
        assert_eq!(prefill, Kernel::Vector);
    }
}

/// Long prefills, with enough rows to take tensor cores where the device has them (the random
/// cases above stay under that size): a whole prompt, a prompt after cached blocks, and two
/// sequences sharing prefix blocks, over scattered blocks. CUDA only: on lavapipe these sizes
/// come back wrong past row 240 from the vector kernel and everywhere from burn's reference
/// ops (a buffer limit of that driver, suspected, not yet found).
fn long_prefills_match_naive<B: AttentionBackend + PagedKernelChoice>(tensor_cores: bool) {
    let dev = Default::default();
    let cases = [
        ((8, 4, 128, 16), vec![(1100, 1100, false)]),
        ((8, 4, 64, 32), vec![(1300, 1040, false)]),
        ((2, 16, 96, 16), vec![(700, 700, false), (650, 600, false)]),
    ];
    for (i, (shape, lens)) in cases.into_iter().enumerate() {
        let c = case(shape, &lens, 3, true, i as u64).as_stored::<B>(&dev);
        let rows: Vec<usize> = c.seqs.iter().map(|s| s.last.len()).collect();
        if tensor_cores {
            assert_eq!(B::paged_kernel(&dev, c.d, c.hq, &rows), Kernel::TensorCore);
        }
        let got = c
            .run::<B>(<B as AttentionBackend>::paged_attention, &dev)
            .unwrap();
        close_within(&got, &c.naive(), c.tolerance::<B>(), "long prefill").unwrap();
    }
}

/// The promises as tests of one backend module; `$ignore` marks backends that need
/// hardware CI lacks.
macro_rules! on_backend {
    ($name:ident, $feature:literal, $backend:ty, $tensor_cores:expr $(, #[$ignore:meta])?) => {
        #[cfg(feature = $feature)]
        mod $name {
            use super::*;
            type B = $backend;

            proptest! {
                #![proptest_config(ProptestConfig::with_cases(32))]

                #[test]
                $(#[$ignore])?
                fn cube_paged_attention_matches_naive(
                    shape in shapes(),
                    lens in prop::collection::vec((1usize..200, 1usize..40, any::<bool>()), 1..4),
                    shared in 0usize..10,
                    scatter in any::<bool>(),
                    seed in 0u64..1000,
                ) {
                    paged_matches_naive::<B>(shape, &lens, shared, scatter, seed)?;
                }

                #[test]
                $(#[$ignore])?
                fn cube_attention_matches_the_reference(
                    heads in (1usize..4, 1usize..5, prop::sample::select(vec![8usize, 32, 64])),
                    t in 1usize..90,
                    n_frac in 0.0f64..1.0,
                    scattered in any::<bool>(),
                    seed in 0u64..1000,
                ) {
                    attention_matches_the_reference::<B>(heads, t, n_frac, scattered, seed)?;
                }

                #[test]
                $(#[$ignore])?
                fn cube_pool_scatter_writes_the_slots(
                    shape in (1usize..4, 1usize..70, prop::sample::select(vec![1usize, 8, 64, 128])),
                    picks in prop::collection::vec(0usize..1000, 0..40),
                    seed in 0u64..1000,
                ) {
                    pool_scatter_writes_the_slots::<B>(shape, &picks, seed)?;
                }
            }

            #[test]
            $(#[$ignore])?
            fn a_batch_without_rows_gives_an_empty_answer_and_bad_batches_are_errors() {
                empty_and_bad_batches::<B>();
            }

            #[test]
            $(#[$ignore])?
            fn prefill_takes_tensor_cores_where_the_device_has_them() {
                the_kernel_choice::<B>($tensor_cores);
            }
        }
    };
}

// wgpu rows assert only what holds on every adapter (lavapipe in CI has no cooperative matrices).
on_backend!(wgpu, "wgpu", burn::backend::Wgpu<f32, i32>, false);
on_backend!(wgpu_f16, "wgpu", burn::backend::Wgpu<half::f16, i32>, false);
on_backend!(cuda, "cuda", burn::backend::Cuda<f32, i32>, false, #[ignore = "needs an NVIDIA GPU"]);
on_backend!(cuda_f16, "cuda", burn::backend::Cuda<half::f16, i32>, true, #[ignore = "needs an NVIDIA GPU"]);
on_backend!(cuda_bf16, "cuda", burn::backend::Cuda<half::bf16, i32>, true, #[ignore = "needs an NVIDIA GPU"]);

/// [`long_prefills_match_naive`] on CUDA: f32 on the vector kernel, f16 and bf16 on tensor cores.
#[cfg(feature = "cuda")]
mod long_prefills_on_cuda {
    use super::*;

    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn f32_vector_kernel() {
        long_prefills_match_naive::<burn::backend::Cuda<f32, i32>>(false);
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn f16_tensor_cores() {
        long_prefills_match_naive::<burn::backend::Cuda<half::f16, i32>>(true);
    }

    #[test]
    #[ignore = "needs an NVIDIA GPU"]
    fn bf16_tensor_cores() {
        long_prefills_match_naive::<burn::backend::Cuda<half::bf16, i32>>(true);
    }
}
