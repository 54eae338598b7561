//! The promises of kvb-chunk as properties over random prompts and settings.

use kvb_chunk::{boundary_tokens, split, Chunk, ChunkConfig, ChunkStrategy};
use kvb_hash::Namespace;
use proptest::prelude::*;
use std::collections::HashSet;

fn ns() -> Namespace {
    Namespace::builder().model_fingerprint(b"test").build()
}

fn prompt() -> impl Strategy<Value = Vec<u32>> {
    proptest::collection::vec(0u32..50, 0..700)
}

fn config() -> impl Strategy<Value = ChunkConfig> {
    let strategy = prop_oneof![
        Just(ChunkStrategy::Fixed),
        (0usize..20).prop_map(|window| ChunkStrategy::BoundaryWindow {
            window,
            boundary_tokens: [3u32, 7, 11].into_iter().collect::<HashSet<_>>(),
        }),
        proptest::collection::vec(0usize..700, 0..30)
            .prop_map(|paragraph_starts| ChunkStrategy::Semantic { paragraph_starts }),
        Just(ChunkStrategy::Document),
    ];
    (1usize..200, 0usize..64, strategy).prop_map(|(size, min_tail, strategy)| ChunkConfig {
        size,
        min_tail,
        strategy,
    })
}

fn assert_partition(chunks: &[Chunk], tokens: &[u32]) -> Result<(), TestCaseError> {
    let mut at = 0;
    for c in chunks {
        prop_assert_eq!(c.start, at, "gap or overlap");
        prop_assert!(c.end > c.start, "empty chunk");
        prop_assert_eq!(&c.tokens[..], &tokens[c.start..c.end]);
        at = c.end;
    }
    prop_assert_eq!(at, tokens.len());
    Ok(())
}

proptest! {
    #[test]
    fn chunks_partition_the_prompt_in_order(tokens in prompt(), cfg in config()) {
        assert_partition(&split(&tokens, &cfg, &ns()), &tokens)?;
    }

    #[test]
    fn sizes_stay_within_the_strategy_bounds(tokens in prompt(), cfg in config()) {
        let chunks = split(&tokens, &cfg, &ns());
        let last = chunks.len().saturating_sub(1);
        for (i, c) in chunks.iter().enumerate() {
            match &cfg.strategy {
                ChunkStrategy::Fixed => {
                    prop_assert!(c.len() <= cfg.size);
                    if i < last { prop_assert_eq!(c.len(), cfg.size); }
                }
                ChunkStrategy::BoundaryWindow { window, .. } => {
                    let w = (*window).min(cfg.size - 1);
                    prop_assert!(c.len() <= cfg.size + w);
                    if i < last { prop_assert!(c.len() + w >= cfg.size); }
                }
                ChunkStrategy::Semantic { .. } => prop_assert!(c.len() <= cfg.size),
                ChunkStrategy::Document => prop_assert_eq!(chunks.len(), 1),
            }
            let tail_too_short = i == last && c.len() < cfg.min_tail;
            prop_assert_eq!(c.cacheable, !tail_too_short);
        }
    }

    #[test]
    fn the_same_prompt_always_chunks_the_same_way(tokens in prompt(), cfg in config()) {
        prop_assert_eq!(split(&tokens, &cfg, &ns()), split(&tokens, &cfg, &ns()));
    }

    #[test]
    fn shared_full_chunks_share_prefix_keys(
        shared in proptest::collection::vec(0u32..50, 0..600),
        tail_a in proptest::collection::vec(0u32..50, 1..200),
        tail_b in proptest::collection::vec(0u32..50, 1..200),
        size in 1usize..150,
    ) {
        let cfg = ChunkConfig { size, min_tail: 0, strategy: ChunkStrategy::Fixed };
        let a: Vec<u32> = shared.iter().chain(&tail_a).copied().collect();
        let b: Vec<u32> = shared.iter().chain(&tail_b).copied().collect();
        let (ca, cb) = (split(&a, &cfg, &ns()), split(&b, &cfg, &ns()));
        let k = shared.len() / size;
        for i in 0..k {
            prop_assert_eq!(ca[i].prefix_key, cb[i].prefix_key);
            prop_assert_eq!(ca[i].content_key, cb[i].content_key);
        }
        // The first chunk whose tokens differ has a different prefix key, and so do all after it.
        if let Some(i) = (0..ca.len().min(cb.len())).find(|&i| ca[i].tokens != cb[i].tokens) {
            prop_assert_ne!(ca[i].prefix_key, cb[i].prefix_key);
        }
    }

    #[test]
    fn window_cuts_land_after_a_boundary_token_when_one_is_in_reach(tokens in proptest::collection::vec(0u32..12, 0..600)) {
        let boundary: HashSet<u32> = [3u32].into_iter().collect();
        let cfg = ChunkConfig { size: 50, min_tail: 0, strategy: ChunkStrategy::BoundaryWindow { window: 10, boundary_tokens: boundary } };
        let chunks = split(&tokens, &cfg, &ns());
        for pair in chunks.windows(2) {
            let cut = pair[0].end;
            let target = pair[0].start + 50;
            let reachable = (target.saturating_sub(10)..=(target + 10).min(tokens.len()))
                .any(|c| c > pair[0].start && tokens[c - 1] == 3);
            prop_assert_eq!(tokens[cut - 1] == 3 || cut == target, true);
            if reachable { prop_assert_eq!(tokens[cut - 1], 3); }
        }
    }
}

#[test]
fn boundary_tokens_come_from_the_vocabulary_text() {
    let vocab = [
        (0, "hello"),
        (1, "."),
        (2, " world!"),
        (3, "Ċ"),
        (4, "a?"),
        (5, "x.y"),
    ];
    let b = boundary_tokens(vocab);
    assert_eq!(b, [1, 2, 3, 4].into_iter().collect());
}

#[test]
fn semantic_chunks_follow_paragraphs() {
    let tokens: Vec<u32> = (0..100).collect();
    let cfg = ChunkConfig {
        size: 40,
        min_tail: 0,
        strategy: ChunkStrategy::Semantic {
            paragraph_starts: vec![10, 30, 45, 95],
        },
    };
    let spans: Vec<_> = split(&tokens, &cfg, &ns())
        .iter()
        .map(|c| c.span())
        .collect();
    // [0,10)+[10,30) fit in 40; [30,45) would overflow -> new chunk; [45,95) is 50 > 40 -> cut at
    // 40 tokens, and its last 10 tokens pack with the next paragraph [95,100).
    assert_eq!(spans, vec![0..30, 30..45, 45..85, 85..100]);
}
