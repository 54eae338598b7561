//! The scheduler's promises on the tiny reference models: a batch does not change what a sequence
//! generates; the engine serves many threads at once; cancelling frees a sequence's blocks at once
//! and a second cancel is an error; a sink whose listener left cancels its request; a pool too small for a request refuses it, one too small for
//! two preempts and still answers both; shared prefixes are held once; no block leaks; a prefill
//! is cut to fill a step only when that saves a step; `generate_batch` answers in order what each
//! prompt generates alone.

use crate::common::{config, engine, opts, prompt, same_bits, FAMILIES};
use kvb_engine::{
    Engine, EngineConfig, EngineError, Event, EventSink, GenerationMode, GenerationResult, Request,
};
use kvb_model::backends::Cpu;
use std::sync::{Arc, Mutex};

/// Sixteen prompts of mixed lengths; several share prefixes of different lengths.
fn mixed_prompts() -> Vec<Vec<u32>> {
    let stem = prompt(40, 30);
    (0..16u32)
        .map(|i| {
            let mut p = match i % 4 {
                0 => Vec::new(),
                1 => stem[..10].to_vec(),
                2 => stem.clone(),
                _ => stem[..23].to_vec(),
            };
            p.extend(prompt(50 + i, 3 + (i as usize * 7) % 40));
            p
        })
        .collect()
}

fn run_alone(
    family: &str,
    cfg: &EngineConfig,
    p: &[u32],
    mode: GenerationMode,
) -> GenerationResult {
    // A fresh engine: nothing cached, nothing else running.
    engine(family, cfg.clone())
        .generate_tokens(p, &opts(mode, 10), &mut |_| {})
        .unwrap()
}

fn run_batch(e: &Engine<Cpu>, prompts: &[Vec<u32>], mode: GenerationMode) -> Vec<GenerationResult> {
    let handles: Vec<_> = prompts
        .iter()
        .map(|p| e.submit(Request::new(p.clone(), opts(mode, 10))).unwrap())
        .collect();
    handles.into_iter().map(|h| h.wait().unwrap()).collect()
}

#[test]
fn a_batch_of_1_4_or_16_mixed_prompts_generates_what_each_generates_alone() {
    // A small step budget, so prefills are cut into slices that share steps with decodes.
    let cfg = EngineConfig {
        max_batch_tokens: 24,
        ..config()
    };
    let prompts = mixed_prompts();
    for family in FAMILIES {
        for mode in [GenerationMode::Baseline, GenerationMode::ChunkReuse] {
            let alone: Vec<GenerationResult> = prompts
                .iter()
                .map(|p| run_alone(family, &cfg, p, mode))
                .collect();
            for size in [1usize, 4, 16] {
                let e = engine(family, cfg.clone());
                for (k, group) in prompts.chunks(size).enumerate() {
                    let got = run_batch(&e, group, mode);
                    for (j, r) in got.iter().enumerate() {
                        let i = k * size + j;
                        let what = format!("{family}, {mode}, batch of {size}, prompt {i}");
                        assert_eq!(r.token_ids, alone[i].token_ids, "{what}");
                        // Batch-invariant kernels: the same bits, well within 1e-5.
                        assert!(
                            same_bits(&r.first_logits, &alone[i].first_logits),
                            "{what}: first-token logits"
                        );
                    }
                }
                e.sync().unwrap();
                let s = e.paged_stats();
                assert_eq!(s.running + s.waiting, 0, "{family}: all served");
                assert_eq!(
                    s.blocks_used, s.blocks_resident,
                    "{family}: only resident blocks stay held"
                );
            }
        }
    }
}

#[test]
fn the_engine_serves_many_threads_at_once() {
    let e = Arc::new(engine("llama", config()));
    let prompts = mixed_prompts();
    let alone: Vec<GenerationResult> = prompts
        .iter()
        .map(|p| run_alone("llama", &config(), p, GenerationMode::ChunkReuse))
        .collect();
    std::thread::scope(|scope| {
        for t in 0..8 {
            let e = e.clone();
            let (prompts, alone) = (&prompts, &alone);
            scope.spawn(move || {
                for round in 0..3 {
                    let i = (t * 3 + round) % prompts.len();
                    let r = e
                        .generate_tokens(
                            &prompts[i],
                            &opts(GenerationMode::ChunkReuse, 10),
                            &mut |_| {},
                        )
                        .unwrap();
                    assert_eq!(r.token_ids, alone[i].token_ids, "thread {t}, prompt {i}");
                }
            });
        }
    });
    e.sync().unwrap();
    assert_eq!(e.paged_stats().requests, 24);
}

#[test]
fn cancelling_frees_the_sequence_at_once_and_twice_is_an_error() {
    let e = engine(
        "llama",
        EngineConfig {
            keep_resident: false,
            ..config()
        },
    );
    let h = e
        .submit(Request::new(
            prompt(60, 20),
            opts(GenerationMode::ChunkReuse, 230),
        ))
        .unwrap();
    // Mid-stream: after its first token, which `Started` announces.
    match h.next_event().unwrap() {
        Event::Started(s) => {
            assert_eq!(s.prompt_tokens, 20);
            assert!(s.ttft_ms > 0.0);
        }
        other => panic!("expected `Started` first, got {other:?}"),
    }
    match h.next_event().unwrap() {
        Event::Token { .. } => {}
        other => panic!("expected a token after `Started`, got {other:?}"),
    }
    h.cancel().unwrap();
    assert!(matches!(h.cancel(), Err(EngineError::AlreadyCancelled)));
    let last = loop {
        match h.next_event() {
            Some(Event::Finished(r)) => break *r,
            Some(Event::Token { .. } | Event::Started(_)) => continue,
            None => panic!("no final event"),
        }
    };
    assert!(matches!(last, Err(EngineError::Cancelled)), "{last:?}");
    e.sync().unwrap();
    assert_eq!(e.paged_stats().blocks_used, 0, "its blocks are free");
    // A dropped handle (a client gone) cancels too.
    let h = e
        .submit(Request::new(
            prompt(61, 20),
            opts(GenerationMode::ChunkReuse, 230),
        ))
        .unwrap();
    let _ = h.next_event();
    drop(h);
    e.sync().unwrap();
    let s = e.paged_stats();
    assert_eq!(s.blocks_used, 0);
    assert_eq!(s.running, 0);
    // A finished request cannot be cancelled.
    let h = e
        .submit(Request::new(
            prompt(62, 5),
            opts(GenerationMode::ChunkReuse, 2),
        ))
        .unwrap();
    while let Some(ev) = h.next_event() {
        if matches!(ev, Event::Finished(_)) {
            break;
        }
    }
    assert!(matches!(h.cancel(), Err(EngineError::AlreadyFinished)));
}

/// A sink whose listener leaves after `listens` events, as a client that disconnects.
struct Leaving {
    seen: Arc<Mutex<Vec<Event>>>,
    listens: usize,
}

impl EventSink for Leaving {
    fn push(&self, event: Event) -> bool {
        let mut seen = self.seen.lock().unwrap();
        seen.push(event);
        seen.len() < self.listens
    }
}

#[test]
fn a_sink_whose_listener_left_cancels_its_request() {
    let e = engine(
        "llama",
        EngineConfig {
            keep_resident: false,
            ..config()
        },
    );
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Leaving {
        seen: seen.clone(),
        listens: 3,
    };
    let request = Request::new(prompt(63, 20), opts(GenerationMode::ChunkReuse, 230));
    // The ticket is kept: only the failed push says the listener is gone.
    let ticket = e.submit_to(request, sink).unwrap();
    let finished = |seen: &[Event]| seen.iter().any(|ev| matches!(ev, Event::Finished(_)));
    while !finished(&seen.lock().unwrap()) {
        e.sync().unwrap();
    }
    let seen = seen.lock().unwrap();
    let tokens = seen
        .iter()
        .filter(|ev| matches!(ev, Event::Token { .. }))
        .count();
    // Started, two tokens, then the step that sends the third sees no listener.
    assert!(tokens <= 3, "{tokens} tokens went to a listener that left");
    match seen.last() {
        Some(Event::Finished(r)) => {
            assert!(matches!(**r, Err(EngineError::Cancelled)), "{r:?}")
        }
        other => panic!("the last event is not `Finished`: {other:?}"),
    }
    let stats = e.paged_stats();
    assert_eq!((stats.running, stats.blocks_used), (0, 0), "{stats:?}");
    assert!(matches!(ticket.cancel(), Err(EngineError::AlreadyFinished)));
}

#[test]
fn a_pool_too_small_refuses_or_preempts_and_nothing_is_lost() {
    // 40 blocks of 4 slots: one 150-token sequence fits, two do not at once.
    let small = |blocks: usize| {
        let c = config();
        let e = engine("llama", c.clone());
        let block = e.paged_stats().block_bytes;
        EngineConfig {
            max_pool_bytes: Some(blocks * block),
            ..c
        }
    };
    let e = engine("llama", small(40));
    let err = e
        .submit(Request::new(
            prompt(70, 100),
            opts(GenerationMode::ChunkReuse, 100),
        ))
        .unwrap_err();
    assert!(
        matches!(
            err,
            EngineError::PoolTooSmall {
                pool_blocks: 40,
                ..
            }
        ),
        "{err}"
    );
    let prompts = [prompt(71, 30), prompt(72, 34)];
    let alone: Vec<GenerationResult> = prompts
        .iter()
        .map(|p| {
            engine("llama", small(40))
                .generate_tokens(p, &opts(GenerationMode::Baseline, 110), &mut |_| {})
                .unwrap()
        })
        .collect();
    let handles: Vec<_> = prompts
        .iter()
        .map(|p| {
            e.submit(Request::new(p.clone(), opts(GenerationMode::Baseline, 110)))
                .unwrap()
        })
        .collect();
    let got: Vec<GenerationResult> = handles.into_iter().map(|h| h.wait().unwrap()).collect();
    let preempted: usize = got.iter().map(|r| r.preemptions).sum();
    assert!(
        preempted >= 1,
        "two 140-token sequences in 160 slots: one must give way"
    );
    for (r, a) in got.iter().zip(&alone) {
        assert_eq!(
            r.token_ids, a.token_ids,
            "a preempted sequence still answers as it would alone"
        );
    }
    e.sync().unwrap();
    let s = e.paged_stats();
    assert!(s.preemptions >= 1);
    assert_eq!(s.blocks_used, 0, "Baseline keeps nothing");
    assert!(s.peak_blocks_used <= 40);
}

#[test]
fn sequences_sharing_a_prefix_hold_it_once() {
    let e = engine("llama", config());
    let stem = prompt(80, 40);
    let prompts: Vec<Vec<u32>> = (0..4)
        .map(|i| {
            let mut p = stem.clone();
            p.extend(prompt(81 + i, 6));
            p
        })
        .collect();
    let handles: Vec<_> = prompts
        .iter()
        .map(|p| {
            e.submit(Request::new(
                p.clone(),
                opts(GenerationMode::ChunkReuse, 150),
            ))
            .unwrap()
        })
        .collect();
    // All four running: each has produced a token, the 40-token stem cached for all but the
    // first (they wait for its prefill, then read its blocks).
    let mut cached = Vec::new();
    for h in &handles {
        match h.next_event() {
            Some(Event::Started(s)) => cached.push(s.cached_tokens()),
            other => panic!("expected `Started` first, got {other:?}"),
        }
        assert!(matches!(h.next_event(), Some(Event::Token { .. })));
    }
    cached.sort();
    assert_eq!(cached, [0, 40, 40, 40]);
    e.sync().unwrap();
    let s = e.paged_stats();
    // The 40-token stem is 10 blocks, computed once (later requests wait for the first one's
    // prefill to index it) and read by all four.
    assert!(s.blocks_shared >= 10, "{s:?}");
    assert!(s.bytes_saved_by_sharing >= 3 * 10 * s.block_bytes, "{s:?}");
    let distinct_tokens = 40 + 4 * (6 + 150);
    assert!(
        s.peak_blocks_used * s.block_size <= distinct_tokens + 4 * 2 * s.block_size,
        "{s:?}"
    );
    for h in handles {
        h.cancel().unwrap();
    }
    e.sync().unwrap();
    // Only the resident tree holds blocks now; a reset frees them all.
    let s = e.paged_stats();
    assert_eq!(s.blocks_used, s.blocks_resident);
    e.reset_cache().unwrap();
    e.sync().unwrap();
    assert_eq!(e.paged_stats().blocks_used, 0, "no block leaks");
}

#[test]
fn a_prefill_is_cut_to_fill_a_step_only_when_that_saves_a_step() {
    // 16 prefill rows a step while sequences decode, however many do.
    let e = engine(
        "llama",
        EngineConfig {
            max_batch_tokens: 64,
            prefill_tokens_while_decoding: 16,
            ..config()
        },
    );
    // A sequence decoding all along keeps the step budget at 16.
    let long = e
        .submit(Request::new(
            prompt(70, 8),
            opts(GenerationMode::ChunkReuse, 230),
        ))
        .unwrap();
    assert!(matches!(long.next_event(), Some(Event::Started(_))));
    // Submitted as one batch, the prompts reach the scheduler in one step.
    let passes = |seeds: &[u32]| -> Vec<usize> {
        let requests = seeds
            .iter()
            .map(|&seed| Request::new(prompt(seed, 12), opts(GenerationMode::ChunkReuse, 2)))
            .collect();
        e.submit_batch(requests)
            .into_iter()
            .map(|h| h.unwrap().wait().unwrap().prefill_passes)
            .collect()
    };
    for round in 0..4 {
        // 12 + 12 rows, two steps either way: the second is not cut into 4 rows beside the first
        // and 8 in the next step; it waits for the next step, whole.
        assert_eq!(passes(&[80 + round, 90 + round]), [1, 1], "round {round}");
        // 4 x 12 rows: three steps of 16 if cut, four if each waited whole; so the second and
        // third are cut (4 + 8, 8 + 4) and the fourth fits whole.
        let four = [100 + round, 110 + round, 120 + round, 130 + round];
        assert_eq!(passes(&four), [1, 2, 2, 1], "round {round}");
    }
    // A bad request in a batch gets its error; the others run.
    let mixed = e.submit_batch(vec![
        Request::new(prompt(140, 5), opts(GenerationMode::ChunkReuse, 2)),
        Request::new(Vec::new(), opts(GenerationMode::ChunkReuse, 2)),
    ]);
    assert!(matches!(mixed[1], Err(EngineError::EmptyPrompt)));
    let mut mixed = mixed.into_iter();
    assert_eq!(
        mixed.next().unwrap().unwrap().wait().unwrap().prompt_tokens,
        5
    );
    // Longer than a step's budget: cut, 16 rows at a time.
    let r = e
        .submit(Request::new(
            prompt(99, 40),
            opts(GenerationMode::ChunkReuse, 2),
        ))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(r.prefill_passes, 3);
    long.cancel().unwrap();
}

#[test]
fn generate_batch_answers_in_order_what_each_prompt_generates_alone() {
    let texts = [
        "the cat sat on the mat",
        "a b c d e f g",
        "hello world, once more",
    ];
    let options = opts(GenerationMode::ChunkReuse, 6);
    let batch = engine("llama", config()).generate_batch(&texts, &options);
    assert_eq!(batch.len(), texts.len());
    for (text, got) in texts.iter().zip(batch) {
        let alone = engine("llama", config())
            .generate(text, &options, &mut |_| {})
            .unwrap();
        let got = got.unwrap();
        assert_eq!(got.prompt_tokens, alone.prompt_tokens, "{text}");
        assert_eq!(got.token_ids, alone.token_ids, "{text}");
    }
}
