//! A random paged-attention case (a pool, sequences over it, queries) and its per-element
//! answer in f64, for every backend's tests.
#![allow(dead_code)]

use burn::tensor::backend::Backend;
use burn::tensor::{Tensor, TensorData};
use kvb_attn::{float_on, AttnError, PagedBatch, PagedSeq};
use proptest::prelude::*;

/// A pool and a batch over it, owned.
#[derive(Debug, Clone)]
pub struct Case {
    pub hq: usize,
    pub hkv: usize,
    pub d: usize,
    pub bs: usize,
    pub pool_blocks: usize,
    /// `[hkv][slots][d]` each.
    pub k: Vec<f32>,
    pub v: Vec<f32>,
    pub seqs: Vec<Seq>,
    /// `[hq][rows][d]`.
    pub q: Vec<f32>,
}

#[derive(Debug, Clone)]
pub struct Seq {
    pub blocks: Vec<u32>,
    pub last: Vec<usize>,
    pub decode: bool,
}

impl Case {
    /// The same case with its q, K and V rounded to `B`'s float type, as a kernel on `B` sees
    /// them: the exact answer to compare a half-precision kernel with.
    pub fn as_stored<B: Backend>(&self, device: &B::Device) -> Case {
        Case {
            k: as_stored::<B>(&self.k, device),
            v: as_stored::<B>(&self.v, device),
            q: as_stored::<B>(&self.q, device),
            ..self.clone()
        }
    }

    /// [`tolerance`] for `B`, or the f32 rounding of this case's scores where that is more.
    /// An f32 score of `d` products is off by a few ulps of the sum of their magnitudes, and a
    /// score off by `e` scales its key's weight by about `1 + e`, moving an output by up to
    /// `e * max |v|`: with values up to 2.5 and head dim 128, scores of magnitude ~70 put the
    /// exact answer's f32 neighbourhood beyond the plain bound.
    pub fn tolerance<B: Backend>(&self) -> f32 {
        let max_abs = |x: &[f32]| x.iter().fold(0f32, |m, v| m.max(v.abs()));
        let score_bound = max_abs(&self.q) * max_abs(&self.k) * (self.d as f32).sqrt();
        tolerance::<B>().max(4.0 * f32::EPSILON * score_bound * max_abs(&self.v))
    }

    pub fn rows(&self) -> usize {
        self.seqs.iter().map(|s| s.last.len()).sum()
    }

    /// Runs `f` on `device` over an f32 pool holding the case's K/V.
    pub fn run<B: Backend>(
        &self,
        f: PagedFn<B>,
        device: &B::Device,
    ) -> Result<Vec<f32>, AttnError> {
        let shape = [self.hkv, self.pool_blocks * self.bs, self.d];
        let pool = |v: &[f32]| {
            Tensor::<B, 3>::from_data(TensorData::new(v.to_vec(), shape), float_on::<B>(device))
        };
        self.run_on(f, (pool(&self.k), pool(&self.v)))
    }

    /// Runs `f` over the given pool tensors (on their device).
    pub fn run_on<B: Backend>(
        &self,
        f: PagedFn<B>,
        (kp, vp): (Tensor<B, 3>, Tensor<B, 3>),
    ) -> Result<Vec<f32>, AttnError> {
        let dev = kp.device();
        let rows = self.rows();
        let q = Tensor::<B, 4>::from_data(
            TensorData::new(self.q.clone(), [1, self.hq, rows, self.d]),
            float_on::<B>(&dev),
        );
        let mut start = 0;
        let seqs: Vec<PagedSeq> = self
            .seqs
            .iter()
            .map(|s| {
                let p = PagedSeq {
                    blocks: &s.blocks,
                    rows: start..start + s.last.len(),
                    last_slot: &s.last,
                    decode: s.decode,
                };
                start += s.last.len();
                p
            })
            .collect();
        let batch = PagedBatch {
            block_size: self.bs,
            seqs: &seqs,
        };
        let scale = (self.d as f32).powf(-0.5);
        Ok(f(q, &kp, &vp, &batch, scale)?
            .into_data()
            .convert::<f32>()
            .to_vec::<f32>()
            .unwrap())
    }

    /// Per element in f64: `[rows][hq][d]`.
    pub fn naive(&self) -> Vec<f32> {
        let (hq, d, bs) = (self.hq, self.d, self.bs);
        let slots = self.pool_blocks * bs;
        let group = hq / self.hkv;
        let rows = self.rows();
        let mut out = vec![0f32; rows * hq * d];
        let mut row = 0;
        for s in &self.seqs {
            for &last in &s.last {
                for h in 0..hq {
                    let kh = h / group;
                    let key = |j: usize| s.blocks[j / bs] as usize * bs + j % bs;
                    let scores: Vec<f64> = (0..=last)
                        .map(|j| {
                            (0..d)
                                .map(|x| {
                                    self.q[(h * rows + row) * d + x] as f64
                                        * self.k[(kh * slots + key(j)) * d + x] as f64
                                })
                                .sum::<f64>()
                                / (d as f64).sqrt()
                        })
                        .collect();
                    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    let w: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
                    let sum: f64 = w.iter().sum();
                    for x in 0..d {
                        let acc: f64 = (0..=last)
                            .map(|j| w[j] * self.v[(kh * slots + key(j)) * d + x] as f64)
                            .sum();
                        out[(row * hq + h) * d + x] = (acc / sum) as f32;
                    }
                }
                row += 1;
            }
        }
        out
    }
}

/// A paged attention entry point on backend `B`.
pub type PagedFn<B> = fn(
    Tensor<B, 4>,
    &Tensor<B, 3>,
    &Tensor<B, 3>,
    &PagedBatch,
    f32,
) -> Result<Tensor<B, 2>, AttnError>;

pub fn values(seed: u64, n: usize) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            let x = (i.wrapping_mul(2654435761).wrapping_add(seed * 97)) % 2003;
            (x as f32 - 1001.0) / 400.0
        })
        .collect()
}

/// A random case: `n_seqs` sequences, the first `shared` blocks of each shared with sequence 0,
/// the rest private, blocks placed by a seeded shuffle (or consecutively).
pub fn case(
    (hkv, group, d, bs): (usize, usize, usize, usize),
    lens: &[(usize, usize, bool)],
    shared: usize,
    scatter: bool,
    seed: u64,
) -> Case {
    let blocks_of: Vec<usize> = lens.iter().map(|&(len, _, _)| len.div_ceil(bs)).collect();
    let pool_blocks: usize = blocks_of.iter().sum::<usize>() + 3;
    let mut order: Vec<u32> = (0..pool_blocks as u32).collect();
    if scatter {
        let mut x = seed | 1;
        for i in (1..order.len()).rev() {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            order.swap(i, (x >> 33) as usize % (i + 1));
        }
    }
    let mut next = 0;
    let mut seqs: Vec<Seq> = Vec::new();
    for (i, &(len, rows, decode)) in lens.iter().enumerate() {
        let mut blocks = Vec::new();
        for b in 0..blocks_of[i] {
            if i > 0 && b < shared.min(seqs[0].blocks.len()) {
                blocks.push(seqs[0].blocks[b]);
            } else {
                blocks.push(order[next]);
                next += 1;
            }
        }
        // Decode rows see everything; prefill rows are the last `rows` slots, causally.
        let rows = if decode { 1 } else { rows.clamp(1, len) };
        let last = (len - rows..len).collect();
        seqs.push(Seq {
            blocks,
            last,
            decode,
        });
    }
    let hq = hkv * group;
    let rows: usize = seqs.iter().map(|s| s.last.len()).sum();
    let slots = pool_blocks * bs;
    Case {
        hq,
        hkv,
        d,
        bs,
        pool_blocks,
        k: values(seed, hkv * slots * d),
        v: values(seed + 1, hkv * slots * d),
        seqs,
        q: values(seed + 2, hq * rows * d),
    }
}

pub fn close(got: &[f32], want: &[f32], what: &str) -> Result<(), TestCaseError> {
    close_within(got, want, F32_TOLERANCE, what)
}

/// An f32 kernel against an answer computed in f64, relative to `1 + |value|`.
pub const F32_TOLERANCE: f32 = 2e-5;

/// `got` within `tolerance * (1 + |want|)` of `want`, element by element.
pub fn close_within(
    got: &[f32],
    want: &[f32],
    tolerance: f32,
    what: &str,
) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        prop_assert!(
            (g - w).abs() <= tolerance * (1.0 + w.abs()),
            "{what}: element {i}: {g} vs {w}"
        );
    }
    Ok(())
}

/// The tolerance of a kernel whose tensors hold `B`'s float type, against an answer computed
/// exactly from the same (already rounded) inputs: the output's own rounding and a little more.
/// f16 keeps 11 significant bits (a step of 4.9e-4 relative), bf16 8 (3.9e-3). A kernel that
/// accumulated in half precision misses these by several times on a few hundred keys.
pub fn tolerance<B: Backend>() -> f32 {
    use burn::tensor::{DType, Element};
    match <B::FloatElem as Element>::dtype() {
        DType::F16 => 1e-3,
        DType::BF16 => 8e-3,
        _ => F32_TOLERANCE,
    }
}

/// `values` as `B` stores them (rounded to its float type), back in f32.
pub fn as_stored<B: Backend>(values: &[f32], device: &B::Device) -> Vec<f32> {
    Tensor::<B, 1>::from_data(
        TensorData::new(values.to_vec(), [values.len()]),
        float_on::<B>(device),
    )
    .into_data()
    .convert::<f32>()
    .to_vec::<f32>()
    .unwrap()
}

pub fn shapes() -> impl Strategy<Value = (usize, usize, usize, usize)> {
    (
        prop::sample::select(vec![1usize, 2, 3]),
        prop::sample::select(vec![1usize, 2, 3]),
        prop::sample::select(vec![4usize, 8, 12, 16, 64]),
        prop::sample::select(vec![1usize, 2, 4, 8, 16, 32]),
    )
}
