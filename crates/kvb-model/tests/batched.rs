//! A sequence run in a ragged batch with others gives the same logits as run alone, bit for bit
//! on the CPU: whatever else shares the forward pass, wherever its blocks sit in the pool, when
//! its first blocks are another sequence's shared ones, and however its prefill is chunked.

use crate::common::{random_model_dir, tiny_llama_config, B};
use burn::tensor::Tensor;
use kvb_model::generate::argmax;
use kvb_model::{
    load_pretrained, ActivationPrecision, ForwardBatch, KvPool, LoadOptions, LogitsFor, Model,
    SeqRows, WeightPrecision,
};
use proptest::prelude::*;

/// A tiny random model; with `q8`, its weights quantized to Q8_0 and its products run with 8-bit
/// activations (`--weights q8_0 --activations q8`), whose batches must be as invariant.
fn model(kv_heads: usize, seed: u64, q8: bool) -> Model<B> {
    let dir = random_model_dir(&tiny_llama_config(kv_heads), seed);
    std::fs::copy(
        crate::common::fixtures().join("tiny/llama/tokenizer.json"),
        dir.path().join("tokenizer.json"),
    )
    .unwrap();
    let options = if q8 {
        LoadOptions {
            weights: WeightPrecision::Q8_0,
            activations: ActivationPrecision::Q8,
            ..LoadOptions::default()
        }
    } else {
        LoadOptions::default()
    };
    load_pretrained::<B>(dir.path(), options, &Default::default(), &mut |_, _| {})
        .unwrap()
        .model
}

fn values(t: Tensor<B, 2>) -> Vec<f32> {
    t.into_data().to_vec::<f32>().unwrap()
}

fn tokens(seed: u64, n: usize) -> Vec<u32> {
    (0..n as u64)
        .map(|i| ((seed * 31 + i * 17 + i * i) % 96) as u32)
        .collect()
}

/// Alone: one prefill of the prompt, then `steps` greedy decode steps; the logits of each.
fn alone(m: &Model<B>, prompt: &[u32], steps: usize) -> Vec<Vec<f32>> {
    let mut cache = m.new_cache();
    let positions: Vec<usize> = (0..prompt.len()).collect();
    let mut out = vec![values(
        m.forward(prompt, &positions, &mut cache, LogitsFor::Last)
            .unwrap(),
    )];
    for step in 0..steps {
        let token = argmax(out.last().unwrap()) as u32;
        let p = prompt.len() + step;
        out.push(values(
            m.forward(&[token], &[p], &mut cache, LogitsFor::Last)
                .unwrap(),
        ));
    }
    out
}

/// A sequence in the batched run.
struct Seq {
    prompt: Vec<u32>,
    /// Tokens so far (prompt, then generated).
    tokens: Vec<u32>,
    blocks: Vec<u32>,
    /// Slots whose K/V is computed.
    done: usize,
    logits: Vec<Vec<f32>>,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(32))]

    #[test]
    fn a_sequence_in_a_ragged_batch_computes_what_it_computes_alone(
        kv_heads in prop::sample::select(vec![1usize, 2, 4]),
        lens in prop::collection::vec(2usize..50, 2..6),
        chunk in 1usize..24,
        block_size in prop::sample::select(vec![1usize, 4, 8, 16]),
        share in any::<bool>(),
        q8 in any::<bool>(),
        seed in 0u64..500,
    ) {
        let m = model(kv_heads, seed, q8);
        prop_assert_eq!(m.activation_precision() == ActivationPrecision::Q8, q8);
        let steps = 3;
        let c = m.config();
        let mut prompts: Vec<Vec<u32>> = lens.iter().enumerate().map(|(i, &n)| tokens(seed + i as u64, n)).collect();
        // The second sequence starts with the first one's prompt when `share`: it will read the
        // first one's full blocks instead of computing its own.
        let shared_blocks = if share && prompts[0].len() >= block_size {
            let head = prompts[0].clone();
            prompts[1] = head.iter().chain(&prompts[1]).copied().collect();
            (head.len() / block_size).min((prompts[1].len() - 1) / block_size)
        } else {
            0
        };
        let want: Vec<Vec<Vec<f32>>> = prompts.iter().map(|p| alone(&m, p, steps)).collect();

        let total_slots: usize = prompts.iter().map(|p| p.len() + steps).sum();
        let pool_blocks = 2 * total_slots.div_ceil(block_size) + 4;
        let mut pool = KvPool::<B>::new(c.num_layers, (c.num_kv_heads, c.head_dim), block_size, pool_blocks, &Default::default()).unwrap();
        // Blocks handed out from the top of the pool down, interleaved between sequences, so no
        // sequence's blocks are consecutive.
        let mut free: Vec<u32> = (0..pool_blocks as u32).collect();
        let mut seqs: Vec<Seq> = prompts.iter().map(|p| Seq { prompt: p.clone(), tokens: p.clone(), blocks: Vec::new(), done: 0, logits: Vec::new() }).collect();
        for s in 0..seqs.len() {
            let needed = (seqs[s].prompt.len() + steps).div_ceil(block_size);
            for b in 0..needed {
                if s == 1 && b < shared_blocks {
                    let shared = seqs[0].blocks[b];
                    seqs[1].blocks.push(shared);
                } else {
                    seqs[s].blocks.push(free.pop().unwrap());
                }
            }
        }
        // The shared blocks are computed by sequence 0: sequence 1 starts after them, once sequence
        // 0 has passed them.
        seqs[1].done = shared_blocks * block_size;
        let mut guard = 0;
        while seqs.iter().any(|s| s.logits.len() <= steps) {
            guard += 1;
            prop_assert!(guard < 1000);
            // Each step: every sequence takes up to `chunk` prompt rows, or one decode row.
            let mut rows_tokens = Vec::new();
            let mut rows_positions = Vec::new();
            let mut slots: Vec<Vec<usize>> = Vec::new();
            let mut members = Vec::new();
            let mut decode = Vec::new();
            for (i, s) in seqs.iter().enumerate() {
                if s.logits.len() > steps || (i == 1 && seqs[0].done < shared_blocks * block_size) {
                    continue;
                }
                let (from, to, is_decode) = if s.done < s.prompt.len() {
                    (s.done, (s.done + chunk).min(s.prompt.len()), false)
                } else {
                    (s.done, s.done + 1, true)
                };
                rows_tokens.extend(&s.tokens[from..to]);
                rows_positions.extend(from..to);
                slots.push((from..to).collect());
                members.push(i);
                decode.push(is_decode);
            }
            let rows: Vec<SeqRows> = members.iter().zip(&slots).zip(&decode).map(|((&i, sl), &d)| SeqRows { blocks: &seqs[i].blocks, slots: sl, decode: d }).collect();
            // Logits for each member whose last prompt row or decode row is in this step.
            let mut wanted = Vec::new();
            let mut row = 0;
            for (k, &i) in members.iter().enumerate() {
                row += slots[k].len();
                if *slots[k].last().unwrap() + 1 >= seqs[i].prompt.len() {
                    wanted.push((i, row - 1));
                }
            }
            let batch = ForwardBatch { tokens: &rows_tokens, positions: &rows_positions, seqs: &rows };
            let out = values(m.forward_batch(&batch, &mut pool, LogitsFor::Rows(wanted.iter().map(|w| w.1).collect())).unwrap());
            for (k, &i) in members.iter().enumerate() {
                seqs[i].done = slots[k].last().unwrap() + 1;
            }
            for (j, &(i, _)) in wanted.iter().enumerate() {
                let l = out[j * c.vocab_size..(j + 1) * c.vocab_size].to_vec();
                let next = argmax(&l) as u32;
                seqs[i].logits.push(l);
                seqs[i].tokens.push(next);
            }
        }
        for (i, s) in seqs.iter().enumerate() {
            for (step, (got, w)) in s.logits.iter().zip(&want[i]).enumerate() {
                let same = got.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits());
                prop_assert!(same, "sequence {} step {}: logits differ", i, step);
            }
        }
    }
}

#[test]
fn a_batch_writing_another_sequences_slot_is_an_error() {
    let m = model(2, 1, false);
    let c = m.config();
    let mut pool = KvPool::<B>::new(
        c.num_layers,
        (c.num_kv_heads, c.head_dim),
        4,
        8,
        &Default::default(),
    )
    .unwrap();
    let blocks = [3u32, 5];
    let (a, b) = ([0usize, 1], [1usize, 2]);
    // Two sequences whose tables name the same block, both writing slot 1 of it.
    let seqs = [
        SeqRows {
            blocks: &blocks,
            slots: &a,
            decode: false,
        },
        SeqRows {
            blocks: &blocks,
            slots: &b,
            decode: false,
        },
    ];
    let batch = ForwardBatch {
        tokens: &[1, 2, 3, 4],
        positions: &[0, 1, 1, 2],
        seqs: &seqs,
    };
    assert!(m
        .forward_batch(&batch, &mut pool, LogitsFor::Nothing)
        .is_err());
    // A slot beyond the table, and a block beyond the pool.
    let seqs = [SeqRows {
        blocks: &blocks,
        slots: &[8],
        decode: true,
    }];
    let batch = ForwardBatch {
        tokens: &[1],
        positions: &[8],
        seqs: &seqs,
    };
    assert!(m.forward_batch(&batch, &mut pool, LogitsFor::Last).is_err());
    let far = [99u32];
    let seqs = [SeqRows {
        blocks: &far,
        slots: &[0],
        decode: false,
    }];
    let batch = ForwardBatch {
        tokens: &[1],
        positions: &[0],
        seqs: &seqs,
    };
    assert!(m.forward_batch(&batch, &mut pool, LogitsFor::Last).is_err());
}
