//! The tensor attention equals a per-element implementation for random shapes, offsets, head
//! counts, slot lists and extra masks.

use burn::backend::NdArray;
use burn::tensor::{Bool, Tensor, TensorData};
use kvb_attn::{attention, AttentionBackend, AttnError, Visibility};
use proptest::prelude::*;

type B = NdArray<f32>;

/// Per-element attention: q `[hq][n][d]`, k/v `[hkv][t][d]`, `visible(i, j)`.
fn naive(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    (hq, hkv, n, t, d): (usize, usize, usize, usize, usize),
    visible: impl Fn(usize, usize) -> bool,
    scale: f32,
) -> Vec<f32> {
    let group = hq / hkv;
    let mut out = vec![0f32; hq * n * d];
    for h in 0..hq {
        let kh = h / group;
        for i in 0..n {
            let mut scores = vec![f64::NEG_INFINITY; t];
            for (j, s) in scores.iter_mut().enumerate() {
                if visible(i, j) {
                    let dot: f64 = (0..d)
                        .map(|x| q[(h * n + i) * d + x] as f64 * k[(kh * t + j) * d + x] as f64)
                        .sum();
                    *s = dot * scale as f64;
                }
            }
            let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
            let sum: f64 = w.iter().sum();
            for x in 0..d {
                let acc: f64 = (0..t).map(|j| w[j] * v[(kh * t + j) * d + x] as f64).sum();
                out[(h * n + i) * d + x] = (acc / sum) as f32;
            }
        }
    }
    out
}

type AttentionFn = fn(
    Tensor<B, 4>,
    Tensor<B, 4>,
    Tensor<B, 4>,
    &Visibility,
    Option<&Tensor<B, 2, Bool>>,
    f32,
) -> Result<Tensor<B, 4>, AttnError>;

/// The reference in tensor ops, and the backend's kernel (burn-ndarray's tiled kernel).
const IMPLEMENTATIONS: [AttentionFn; 2] = [attention::<B>, <B as AttentionBackend>::attention];

fn tensor4(data: &[f32], shape: [usize; 4]) -> Tensor<B, 4> {
    Tensor::from_data(TensorData::new(data.to_vec(), shape), &Default::default())
}

fn values(len: usize) -> impl Strategy<Value = Vec<f32>> {
    proptest::collection::vec(-2.0f32..2.0, len)
}

#[derive(Debug, Clone)]
struct Case {
    kv_heads: usize,
    group: usize,
    n: usize,
    t: usize,
    d: usize,
}

fn case() -> impl Strategy<Value = Case> {
    (
        1usize..4,
        1usize..4,
        1usize..7,
        0usize..9,
        prop::sample::select(vec![2usize, 4, 8]),
    )
        .prop_map(|(kv_heads, group, n, extra, d)| Case {
            kv_heads,
            group,
            n,
            t: n + extra,
            d,
        })
}

fn assert_close(got: &[f32], want: &[f32]) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        prop_assert!((g - w).abs() < 1e-4, "element {i}: {g} vs {w}");
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn causal_offset_gqa_matches_naive(
        c in case(),
        seed in values(4096),
    ) {
        let hq = c.kv_heads * c.group;
        let (qn, kn) = (hq * c.n * c.d, c.kv_heads * c.t * c.d);
        let (q, k, v) = (&seed[..qn], &seed[qn..qn + kn], &seed[qn + kn..qn + 2 * kn]);
        let scale = (c.d as f32).powf(-0.5);
        let offset = c.t - c.n;
        let want = naive(q, k, v, (hq, c.kv_heads, c.n, c.t, c.d), |i, j| j <= offset + i, scale);
        for run in IMPLEMENTATIONS {
            let out = run(
                tensor4(q, [1, hq, c.n, c.d]),
                tensor4(k, [1, c.kv_heads, c.t, c.d]),
                tensor4(v, [1, c.kv_heads, c.t, c.d]),
                &Visibility::Causal,
                None,
                scale,
            ).unwrap();
            assert_close(&out.into_data().to_vec::<f32>().unwrap(), &want)?;
        }
    }

    #[test]
    fn slots_and_extra_mask_match_naive(
        c in case(),
        seed in values(4096),
        slot_seed in proptest::collection::vec(any::<usize>(), 8),
        mask_seed in proptest::collection::vec(any::<bool>(), 8 * 16),
    ) {
        let hq = c.kv_heads * c.group;
        let (qn, kn) = (hq * c.n * c.d, c.kv_heads * c.t * c.d);
        let (q, k, v) = (&seed[..qn], &seed[qn..qn + kn], &seed[qn + kn..qn + 2 * kn]);
        let slots: Vec<usize> = (0..c.n).map(|i| slot_seed[i] % c.t).collect();
        // Key 0 stays visible so that no row is empty.
        let blocked: Vec<bool> = (0..c.n * c.t)
            .map(|x| x % c.t != 0 && mask_seed[x % mask_seed.len()])
            .collect();
        let mask = Tensor::<B, 2, Bool>::from_data(
            TensorData::new(blocked.clone(), [c.n, c.t]),
            &Default::default(),
        );
        let want = naive(
            q, k, v, (hq, c.kv_heads, c.n, c.t, c.d),
            |i, j| j <= slots[i] && !blocked[i * c.t + j],
            0.3,
        );
        for run in IMPLEMENTATIONS {
            let out = run(
                tensor4(q, [1, hq, c.n, c.d]),
                tensor4(k, [1, c.kv_heads, c.t, c.d]),
                tensor4(v, [1, c.kv_heads, c.t, c.d]),
                &Visibility::UpToSlot(slots.clone()),
                Some(&mask),
                0.3,
            ).unwrap();
            assert_close(&out.into_data().to_vec::<f32>().unwrap(), &want)?;
        }
    }
}

#[test]
fn bad_shapes_are_errors_not_panics() {
    let q = tensor4(&[0.0; 24], [1, 3, 2, 4]);
    let k = tensor4(&[0.0; 16], [1, 2, 2, 4]);
    let err = attention(q, k.clone(), k, &Visibility::Causal, None, 1.0).unwrap_err();
    assert!(matches!(err, AttnError::Shape(_)), "{err}");

    let q = tensor4(&[0.0; 24], [1, 2, 3, 4]);
    let k = tensor4(&[0.0; 16], [1, 2, 2, 4]);
    let err = attention(
        q.clone(),
        k.clone(),
        k.clone(),
        &Visibility::Causal,
        None,
        1.0,
    )
    .unwrap_err();
    assert!(matches!(err, AttnError::Visibility(_)), "{err}");

    let err = attention(
        q,
        k.clone(),
        k,
        &Visibility::UpToSlot(vec![0, 1, 2]),
        None,
        1.0,
    )
    .unwrap_err();
    assert!(err.to_string().contains("slot 2"), "{err}");
}

#[test]
fn a_fully_masked_row_is_an_error() {
    let q = tensor4(&[0.5; 8], [1, 1, 2, 4]);
    let k = tensor4(&[0.5; 8], [1, 1, 2, 4]);
    let mask = Tensor::<B, 2, Bool>::from_data(
        TensorData::new(vec![false, false, true, true], [2, 2]),
        &Default::default(),
    );
    let err = attention(q, k.clone(), k, &Visibility::Causal, Some(&mask), 1.0).unwrap_err();
    assert_eq!(err, AttnError::Visibility("query 1 can see no key".into()));
}

/// Many queries and keys (several query and key blocks of the tiled kernel), with K/V read as
/// strided slices of a longer cache, as the model passes them.
#[test]
fn the_kernel_handles_multiple_tiles_and_sliced_caches() {
    let (hkv, group, n, t, cap, d) = (2usize, 3usize, 150usize, 700usize, 1024usize, 16usize);
    let hq = hkv * group;
    let gen = |len: usize, salt: usize| -> Vec<f32> {
        (0..len)
            .map(|i| (((i * 7919 + salt * 104_729) % 2003) as f32 / 1001.0) - 1.0)
            .collect()
    };
    let q = gen(hq * n * d, 1);
    let k_full = gen(hkv * cap * d, 2);
    let v_full = gen(hkv * cap * d, 3);
    let slice = |full: &[f32]| -> Vec<f32> {
        (0..hkv)
            .flat_map(|h| full[h * cap * d..h * cap * d + t * d].to_vec())
            .collect()
    };
    let (k, v) = (slice(&k_full), slice(&v_full));
    let want = naive(&q, &k, &v, (hq, hkv, n, t, d), |i, j| j <= t - n + i, 0.25);
    let cache = |full: &[f32]| tensor4(full, [1, hkv, cap, d]).slice([0..1, 0..hkv, 0..t, 0..d]);
    for run in IMPLEMENTATIONS {
        let out = run(
            tensor4(&q, [1, hq, n, d]),
            cache(&k_full),
            cache(&v_full),
            &Visibility::Causal,
            None,
            0.25,
        )
        .unwrap();
        let got = out.into_data().to_vec::<f32>().unwrap();
        let worst = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(worst < 1e-4, "{worst}");
    }
}
