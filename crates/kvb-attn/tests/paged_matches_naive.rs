//! Paged attention equals a per-element implementation on random pools: sequences sharing
//! prefix blocks, scattered and consecutive blocks, every block size, GQA, prefill and decode
//! rows, arbitrary visible slots. On the CPU kernel a row's result is also independent of the
//! rest of the batch, of where its blocks sit and of how its rows were chunked, bit for bit.

use crate::common::paged_case::{case, close, shapes, Case, PagedFn as PagedFnOn};
use burn::backend::ndarray::NdArrayTensor;
use burn::backend::NdArray;
use burn::tensor::{Tensor, TensorData, TensorPrimitive};
use kvb_attn::{paged_attention, AttentionBackend, AttnError, PagedBatch, PagedSeq};
use proptest::prelude::*;

type B = NdArray<f32>;

type PagedFn = PagedFnOn<B>;

/// The CPU's ways to run a [`Case`], f16 pools included (f16 bits in a `u16` array, as
/// kvb-model's CPU pool holds them).
trait OnCpu {
    fn run_cpu(&self, f: PagedFn) -> Result<Vec<f32>, AttnError>;
    fn run_f16(&self, f: PagedFn) -> Result<Vec<f32>, AttnError>;
    fn rounded_to_f16(&self) -> Case;
}

impl OnCpu for Case {
    fn run_cpu(&self, f: PagedFn) -> Result<Vec<f32>, AttnError> {
        self.run::<B>(f, &Default::default())
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
}

/// The reference in tensor ops, and the backend's kernel.
const IMPLEMENTATIONS: [PagedFn; 2] = [
    paged_attention::<B>,
    <B as AttentionBackend>::paged_attention,
];

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
            close(&c.run_cpu(*f).unwrap(), &want, &format!("implementation {i}"))?;
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
        let want = c.rounded_to_f16().run_cpu(kernel).unwrap();
        let got = c.run_f16(kernel).unwrap();
        prop_assert_eq!(bits(&got), bits(&want));
    }
}

fn kernel_rows(c: &Case, f: PagedFn) -> Vec<f32> {
    c.run_cpu(f).unwrap()
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
