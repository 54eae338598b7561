//! Paged attention equals a per-element implementation on random pools: sequences sharing
//! prefix blocks, scattered and consecutive blocks, every block size, GQA, prefill and decode
//! rows, arbitrary visible slots. On the CPU kernel a row's result is also independent of the
//! rest of the batch, of where its blocks sit and of how its rows were chunked, bit for bit.

use burn::backend::ndarray::NdArrayTensor;
use burn::backend::NdArray;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};
use kvb_attn::{paged_attention, AttentionBackend, AttnError, PagedBatch, PagedSeq};
use proptest::prelude::*;

type B = NdArray<f32>;

/// A pool and a batch over it, owned.
#[derive(Debug, Clone)]
struct Case {
    hq: usize,
    hkv: usize,
    d: usize,
    bs: usize,
    pool_blocks: usize,
    /// `[hkv][slots][d]` each.
    k: Vec<f32>,
    v: Vec<f32>,
    seqs: Vec<Seq>,
    /// `[hq][rows][d]`.
    q: Vec<f32>,
}

#[derive(Debug, Clone)]
struct Seq {
    blocks: Vec<u32>,
    last: Vec<usize>,
    decode: bool,
}

impl Case {
    fn rows(&self) -> usize {
        self.seqs.iter().map(|s| s.last.len()).sum()
    }

    fn run(&self, f: PagedFn) -> Result<Vec<f32>, AttnError> {
        let shape = [self.hkv, self.pool_blocks * self.bs, self.d];
        let pool = |v: &[f32]| {
            Tensor::<B, 3>::from_data(TensorData::new(v.to_vec(), shape), &Default::default())
        };
        self.run_on(f, (pool(&self.k), pool(&self.v)))
    }

    /// As [`Case::run`] over an f16 pool as kvb-model's CPU pool holds it (f16 bits in a `u16`
    /// array) of the case's values rounded to f16.
    fn run_f16(&self, f: PagedFn) -> Result<Vec<f32>, AttnError> {
        let shape = [self.hkv, self.pool_blocks * self.bs, self.d];
        let pool = |v: &[f32]| {
            let bits: Vec<u16> = v
                .iter()
                .map(|&x| half::f16::from_f32(x).to_bits())
                .collect();
            let primitive = NdArrayTensor::from_data(TensorData::new(bits, shape));
            Tensor::<B, 3>::from_primitive(TensorPrimitive::Float(primitive))
        };
        self.run_on(f, (pool(&self.k), pool(&self.v)))
    }

    /// The case with its K/V rounded to f16 (and held in f32).
    fn rounded_to_f16(&self) -> Case {
        let round = |v: &[f32]| v.iter().map(|&x| half::f16::from_f32(x).to_f32()).collect();
        Case {
            k: round(&self.k),
            v: round(&self.v),
            ..self.clone()
        }
    }

    fn run_on(
        &self,
        f: PagedFn,
        (kp, vp): (Tensor<B, 3>, Tensor<B, 3>),
    ) -> Result<Vec<f32>, AttnError> {
        let dev = Default::default();
        let rows = self.rows();
        let q = Tensor::<B, 4>::from_data(
            TensorData::new(self.q.clone(), [1, self.hq, rows, self.d]),
            &dev,
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
            .to_vec::<f32>()
            .unwrap())
    }

    /// Per element in f64: `[rows][hq][d]`.
    fn naive(&self) -> Vec<f32> {
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

type PagedFn = fn(
    Tensor<B, 4>,
    &Tensor<B, 3>,
    &Tensor<B, 3>,
    &PagedBatch,
    f32,
) -> Result<Tensor<B, 2>, AttnError>;

/// The reference in tensor ops, and the backend's kernel.
const IMPLEMENTATIONS: [PagedFn; 2] = [
    paged_attention::<B>,
    <B as AttentionBackend>::paged_attention,
];

fn values(seed: u64, n: usize) -> Vec<f32> {
    (0..n as u64)
        .map(|i| {
            let x = (i.wrapping_mul(2654435761).wrapping_add(seed * 97)) % 2003;
            (x as f32 - 1001.0) / 400.0
        })
        .collect()
}

/// A random case: `n_seqs` sequences, the first `shared` blocks of each shared with sequence 0,
/// the rest private, blocks placed by a seeded shuffle (or consecutively).
fn case(
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

fn close(got: &[f32], want: &[f32], what: &str) -> Result<(), TestCaseError> {
    prop_assert_eq!(got.len(), want.len());
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        prop_assert!(
            (g - w).abs() <= 2e-5 * (1.0 + w.abs()),
            "{what}: element {i}: {g} vs {w}"
        );
    }
    Ok(())
}

fn shapes() -> impl Strategy<Value = (usize, usize, usize, usize)> {
    (
        prop::sample::select(vec![1usize, 2, 3]),
        prop::sample::select(vec![1usize, 2, 3]),
        prop::sample::select(vec![4usize, 8, 12, 16, 64]),
        prop::sample::select(vec![1usize, 2, 4, 8, 16, 32]),
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn paged_attention_matches_naive(
        shape in shapes(),
        lens in prop::collection::vec((1usize..300, 1usize..80, any::<bool>()), 1..5),
        shared in 0usize..10,
        scatter in any::<bool>(),
        seed in 0u64..1000,
    ) {
        let c = case(shape, &lens, shared, scatter, seed);
        let want = c.naive();
        for (i, f) in IMPLEMENTATIONS.iter().enumerate() {
            close(&c.run(*f).unwrap(), &want, &format!("implementation {i}"))?;
        }
    }

    /// A row's result on the CPU kernel is the same bits whether its sequence runs alone or with
    /// others, wherever its blocks sit in the pool, and however its prefill rows are chunked.
    #[test]
    fn cpu_rows_are_batch_invariant(
        shape in shapes(),
        lens in prop::collection::vec((1usize..300, 1usize..80, any::<bool>()), 2..5),
        shared in 0usize..10,
        seed in 0u64..1000,
        cut in 1usize..80,
    ) {
        let kernel = IMPLEMENTATIONS[1];
        let batch = case(shape, &lens, shared, true, seed);
        let all = kernel_rows(&batch, kernel);
        let (hq, d) = (batch.hq, batch.d);
        let width = hq * d;
        // Sequence 0 alone, its blocks moved to other places, its prefill rows cut in two.
        let mut alone = batch.clone();
        alone.seqs.truncate(1);
        let rows0 = alone.seqs[0].last.len();
        alone.q = (0..hq)
            .flat_map(|h| batch.q[h * batch.rows() * d..(h * batch.rows() + rows0) * d].to_vec())
            .collect();
        let relocate = |c: &mut Case| {
            // Copy every block of sequence 0 to a fresh block at the end of the pool, reversed.
            let slots = c.pool_blocks * c.bs;
            let n = c.seqs[0].blocks.len();
            let grown = (c.pool_blocks + n) * c.bs;
            for data in [&mut c.k, &mut c.v] {
                let mut g = vec![0f32; c.hkv * grown * c.d];
                for kh in 0..c.hkv {
                    g[kh * grown * c.d..(kh * grown + slots) * c.d]
                        .copy_from_slice(&data[kh * slots * c.d..(kh + 1) * slots * c.d]);
                    for (i, &b) in c.seqs[0].blocks.iter().enumerate() {
                        let to = c.pool_blocks + n - 1 - i;
                        let src = (kh * slots + b as usize * c.bs) * c.d;
                        let dst = (kh * grown + to * c.bs) * c.d;
                        g[dst..dst + c.bs * c.d].copy_from_slice(&data[src..src + c.bs * c.d]);
                    }
                }
                *data = g;
            }
            c.seqs[0].blocks = (0..n).map(|i| (c.pool_blocks + n - 1 - i) as u32).collect();
            c.pool_blocks += n;
        };
        relocate(&mut alone);
        let alone_rows = kernel_rows(&alone, kernel);
        prop_assert_eq!(&bits(&alone_rows[..rows0 * width]), &bits(&all[..rows0 * width]));
        if !alone.seqs[0].decode && rows0 > 1 {
            // Its rows in two calls: the first `cut` rows, then the rest.
            let cut = cut.min(rows0 - 1);
            let mut first = alone.clone();
            first.seqs[0].last.truncate(cut);
            first.q = (0..hq).flat_map(|h| alone.q[h * rows0 * d..(h * rows0 + cut) * d].to_vec()).collect();
            let mut second = alone.clone();
            second.seqs[0].last.drain(..cut);
            second.q = (0..hq).flat_map(|h| alone.q[(h * rows0 + cut) * d..(h + 1) * rows0 * d].to_vec()).collect();
            let mut chunked = kernel_rows(&first, kernel);
            chunked.extend(kernel_rows(&second, kernel));
            prop_assert_eq!(bits(&chunked), bits(&all[..rows0 * width]));
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// The CPU kernel over an f16 pool gives the bits it gives over an f32 pool holding the same
    /// values widened: prefill and decode rows, scattered and consecutive blocks, shared ones.
    #[test]
    fn an_f16_pool_reads_as_its_values_widened(
        shape in shapes(),
        lens in prop::collection::vec((1usize..300, 1usize..80, any::<bool>()), 1..5),
        shared in 0usize..10,
        scatter in any::<bool>(),
        seed in 0u64..1000,
    ) {
        let kernel = IMPLEMENTATIONS[1];
        let c = case(shape, &lens, shared, scatter, seed);
        let want = c.rounded_to_f16().run(kernel).unwrap();
        let got = c.run_f16(kernel).unwrap();
        prop_assert_eq!(bits(&got), bits(&want));
    }
}

fn kernel_rows(c: &Case, f: PagedFn) -> Vec<f32> {
    c.run(f).unwrap()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn bad_batches_are_errors() {
    let c = case((1, 2, 8, 4), &[(10, 3, false), (7, 1, true)], 1, false, 3);
    let dev = Default::default();
    let slots = c.pool_blocks * c.bs;
    let kp = Tensor::<B, 3>::from_data(TensorData::new(c.k.clone(), [1, slots, 8]), &dev);
    let q = Tensor::<B, 4>::from_data(TensorData::new(c.q.clone(), [1, 2, 4, 8]), &dev);
    let blocks = c.seqs[0].blocks.clone();
    let bad: Vec<(Vec<PagedSeq>, &str)> = vec![
        // Rows not covered in order.
        (
            vec![PagedSeq {
                blocks: &blocks,
                rows: 1..4,
                last_slot: &[7, 8, 9],
                decode: false,
            }],
            "rows",
        ),
        // A slot beyond the sequence's blocks.
        (
            vec![PagedSeq {
                blocks: &blocks[..1],
                rows: 0..4,
                last_slot: &[1, 2, 3, 9],
                decode: false,
            }],
            "slot",
        ),
        // Too few rows for the queries.
        (
            vec![PagedSeq {
                blocks: &blocks,
                rows: 0..2,
                last_slot: &[1, 2],
                decode: false,
            }],
            "cover",
        ),
    ];
    for (seqs, what) in bad {
        let batch = PagedBatch {
            block_size: c.bs,
            seqs: &seqs,
        };
        for f in IMPLEMENTATIONS {
            assert!(f(q.clone(), &kp, &kp, &batch, 0.3).is_err(), "{what}");
        }
    }
    let out_of_pool = [1000u32, 1001, 1002];
    let seqs = [PagedSeq {
        blocks: &out_of_pool,
        rows: 0..4,
        last_slot: &[1, 2, 3, 4],
        decode: false,
    }];
    let batch = PagedBatch {
        block_size: c.bs,
        seqs: &seqs,
    };
    for f in IMPLEMENTATIONS {
        assert!(
            f(q.clone(), &kp, &kp, &batch, 0.3).is_err(),
            "a block outside the pool"
        );
    }
}
