//! The token-level cache: budgets, eviction orders, quantization error and memory accounting.

use kvb_quant::Bits;
use kvb_store::token_cache::{TokenCacheConfig, TokenEviction, TokenKvCache, ENTRY_OVERHEAD};
use proptest::prelude::*;

fn cache(eviction: TokenEviction, bits: Option<Bits>) -> TokenKvCache {
    TokenKvCache::new(TokenCacheConfig {
        num_heads: 2,
        head_dim: 8,
        bits,
        group_size: 8,
        max_seq_len: 64,
        num_layers: 4,
        eviction,
    })
    .unwrap()
}

fn vector(i: usize) -> Vec<f32> {
    (0..16)
        .map(|j| ((i * 16 + j) as f32 * 0.37).sin())
        .collect()
}

fn policy() -> impl Strategy<Value = TokenEviction> {
    prop_oneof![
        (0usize..10).prop_map(|recent| TokenEviction::H2o { recent }),
        (0usize..10).prop_map(|recent| TokenEviction::PyramidKv { recent }),
        (0usize..10).prop_map(|sink_tokens| TokenEviction::SlidingWindow { sink_tokens }),
    ]
}

proptest! {
    #[test]
    fn eviction_respects_the_budget(policy in policy(), n in 0usize..120, budget in 0usize..80, scores in proptest::collection::vec(0.0f64..1.0, 120)) {
        let mut c = cache(policy, Some(Bits::Eight));
        for i in 0..n { c.append(&vector(i), &vector(i + 1), i % 4).unwrap(); }
        c.update_attention_scores(&scores[..n]).unwrap();
        c.evict(budget);
        prop_assert!(c.len() <= budget);
        let memory = c.memory_bytes();
        let per_entry = 2 * (16 + 4 * 2) + ENTRY_OVERHEAD; // 8-bit codes + f16 scale/zero per group of 8
        prop_assert_eq!(memory, c.len() * per_entry);
    }

    #[test]
    fn h2o_keeps_the_recent_and_the_heaviest(scores in proptest::collection::vec(0.0f64..1.0, 30)) {
        let mut c = cache(TokenEviction::H2o { recent: 4 }, None);
        for i in 0..30 { c.append(&vector(i), &vector(i), 0).unwrap(); }
        c.update_attention_scores(&scores).unwrap();
        c.evict(10);
        let kept = c.positions();
        prop_assert!((26..30).all(|p| kept.contains(&p)), "recent tokens kept");
        let mut older: Vec<usize> = (0..26).collect();
        older.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(b.cmp(&a)));
        for p in &older[..6] { prop_assert!(kept.contains(p)); }
    }
}

#[test]
fn sliding_window_keeps_sinks_and_the_newest() {
    let mut c = cache(TokenEviction::SlidingWindow { sink_tokens: 3 }, None);
    for i in 0..20 {
        c.append(&vector(i), &vector(i), 0).unwrap();
    }
    c.evict(8);
    assert_eq!(c.positions(), vec![0, 1, 2, 15, 16, 17, 18, 19]);
    let (k, v) = c.get(&[16, 5]);
    assert_eq!((k.len(), v.len()), (1, 1), "position 5 was evicted");
    assert_eq!(k[0], vector(16));
}

#[test]
fn pyramid_budgets_shrink_with_depth_and_average_the_context() {
    let c = cache(TokenEviction::PyramidKv { recent: 0 }, None);
    let budgets: Vec<usize> = (0..4).map(|l| c.pyramid_budget(l, 4)).collect();
    assert!(budgets.windows(2).all(|w| w[0] > w[1]), "{budgets:?}");
    let mean = budgets.iter().sum::<usize>() as f64 / 4.0;
    assert!((mean - 64.0).abs() <= 1.0, "{mean}");
}

#[test]
fn quantized_entries_come_back_within_a_step_and_ratios_are_exact() {
    let mut c = cache(TokenEviction::H2o { recent: 0 }, Some(Bits::Four));
    c.append(&vector(3), &vector(4), 1).unwrap();
    let (k, _) = c.get(&[0]);
    let err = k[0]
        .iter()
        .zip(vector(3))
        .map(|(a, b)| (a - b).abs())
        .fold(0f32, f32::max);
    assert!(err <= 2.0 / 15.0 / 2.0 + 1e-3, "{err}");
    // 16 values: 8 bytes of 4-bit codes + 2 groups x (f16 scale + f16 zero) = 16 bytes vs 64.
    assert_eq!(c.compression_ratio(), 4.0);
    assert!(c.append(&[0.0; 3], &vector(0), 0).is_err());
    assert!(c.update_attention_scores(&[1.0, 2.0]).is_err());
}
