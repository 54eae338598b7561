//! The CubeCL kernel (run here on wgpu; CUDA compiles the same source) equals the per-element
//! answer on random paged cases: GQA, head dims 8 to 128, block sizes 1 to 32, sequences sharing
//! prefix blocks, scattered blocks, decode rows, prefill rows after cached K/V, lengths that are
//! no multiple of the kernel's tile. The plain `attention` entry point (causal at an offset, and
//! arbitrary slots) agrees with the reference ops. CI runs it on Mesa's lavapipe.
#![cfg(feature = "wgpu")]

mod common;

use burn::backend::wgpu::WgpuDevice;
use burn::tensor::{Distribution, Tensor, TensorData};
use common::paged_case::{case, close};
use kvb_attn::{attention, AttentionBackend, PagedBatch, PagedSeq, Visibility};
use proptest::prelude::*;

type G = burn::backend::Wgpu<f32, i32>;

/// The kernel is opt-in (`KVB_ATTN=kernel`, read once per process); every test here wants it.
fn choose_the_kernel() {
    std::env::set_var("KVB_ATTN", "kernel");
}

fn shapes() -> impl Strategy<Value = (usize, usize, usize, usize)> {
    (
        prop::sample::select(vec![1usize, 2, 3]),
        prop::sample::select(vec![1usize, 2, 3, 4]),
        prop::sample::select(vec![8usize, 32, 64, 96, 128]),
        prop::sample::select(vec![1usize, 4, 16, 32]),
    )
}

fn to_vec(t: Tensor<G, 4>) -> Vec<f32> {
    t.into_data().convert::<f32>().to_vec::<f32>().unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn cube_paged_attention_matches_naive(
        shape in shapes(),
        lens in prop::collection::vec((1usize..200, 1usize..40, any::<bool>()), 1..4),
        shared in 0usize..10,
        scatter in any::<bool>(),
        seed in 0u64..1000,
    ) {
        choose_the_kernel();
        let c = case(shape, &lens, shared, scatter, seed);
        let got = c.run::<G>(<G as AttentionBackend>::paged_attention, &WgpuDevice::default()).unwrap();
        close(&got, &c.naive(), "cube kernel")?;
    }

    /// Causal queries at an offset into longer K/V, and scattered slots (CacheBlend's rows).
    #[test]
    fn cube_attention_matches_the_reference(
        (hkv, group, d) in (1usize..4, 1usize..5, prop::sample::select(vec![8usize, 32, 64])),
        t in 1usize..90,
        n_frac in 0.0f64..1.0,
        scattered in any::<bool>(),
        seed in 0u64..1000,
    ) {
        choose_the_kernel();
        let dev = WgpuDevice::default();
        let n = ((t as f64 * n_frac) as usize).clamp(1, t);
        let hq = hkv * group;
        let visibility = if scattered {
            Visibility::UpToSlot((0..n).map(|i| (i * 7919 + seed as usize) % t).collect())
        } else {
            Visibility::Causal
        };
        let rand = |shape: [usize; 4]| Tensor::<G, 4>::random(shape, Distribution::Normal(0.0, 1.0), &dev);
        let (q, k, v) = (rand([1, hq, n, d]), rand([1, hkv, t, d]), rand([1, hkv, t, d]));
        let scale = (d as f32).powf(-0.5);
        let want = to_vec(attention(q.clone(), k.clone(), v.clone(), &visibility, None, scale).unwrap());
        let got = to_vec(<G as AttentionBackend>::attention(q, k, v, &visibility, None, scale).unwrap());
        close(&got, &want, "cube attention")?;
    }
}

#[test]
fn a_batch_without_rows_gives_an_empty_answer_and_bad_batches_are_errors() {
    choose_the_kernel();
    let dev = WgpuDevice::default();
    let pool = Tensor::<G, 3>::zeros([1, 8, 4], &dev);
    let q = Tensor::<G, 4>::zeros([1, 2, 0, 4], &dev);
    let out = <G as AttentionBackend>::paged_attention(
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

    let q = Tensor::<G, 4>::from_data(TensorData::new(vec![1f32; 8], [1, 2, 1, 4]), &dev);
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
    assert!(<G as AttentionBackend>::paged_attention(q, &pool, &pool, &batch, 0.5).is_err());
}
