//! Chunk reuse in candle through kvb's seam, on the default model (`cargo xtask fetch-model`).

use candle_chunk_reuse::{
    default_model_path, generate, plain_greedy, texts, CandleLlama, Chat, ChunkReuse, KvCache,
};
use kvb_store::seam::{KvPart, RuntimeKv};
use std::sync::OnceLock;

const MAX_NEW: usize = 16;

fn model() -> &'static (CandleLlama, Chat) {
    static MODEL: OnceLock<(CandleLlama, Chat)> = OnceLock::new();
    MODEL.get_or_init(|| {
        let path = default_model_path();
        assert!(
            path.is_file(),
            "{} is missing: run `cargo xtask fetch-model` (or set KVB_MODELS_DIR)",
            path.display()
        );
        (
            CandleLlama::load(&path).expect("loading the default GGUF in candle"),
            Chat::load(&path).expect("the GGUF's tokenizer"),
        )
    })
}

fn reuse(model: &CandleLlama) -> ChunkReuse {
    ChunkReuse::new(model, b"default gguf, tests", 64, 256 << 20).unwrap()
}

/// Layer `layer`'s keys of tokens `range`, as f32.
fn keys(cache: &KvCache, layer: usize, range: std::ops::Range<usize>) -> Vec<f32> {
    cache
        .read(layer, KvPart::K, range)
        .unwrap()
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()))
        .collect()
}

#[test]
fn exact_prefix_hits_decode_like_candle_without_the_cache() {
    let (model, chat) = model();
    let reuse = reuse(model);
    let eos = &model.config.eos_token_ids;
    let mut history = vec![chat.message("system", texts::SYSTEM).unwrap()];
    for (turn, question) in texts::QUESTIONS.iter().take(2).enumerate() {
        history.push(chat.message("user", question).unwrap());
        let mut segments = history.clone();
        segments.push(chat.generation_prompt().unwrap());
        let tokens = segments.concat();

        let (plain, _) = plain_greedy(model, &tokens, MAX_NEW).unwrap();
        let mut warm = reuse.prefill(model, &segments).unwrap();
        let stats = warm.stats.clone();
        let answer = generate(model, &mut warm, MAX_NEW).unwrap();
        assert_eq!(
            answer, plain,
            "turn {turn}: greedy tokens with and without the cache"
        );
        assert_eq!(stats.moved_tokens, 0, "turn {turn}: {stats:?}");
        assert_eq!(
            stats.exact_tokens + stats.computed_tokens,
            tokens.len(),
            "turn {turn}: every token is reused or computed once"
        );
        if turn > 0 {
            // The system prompt and the first question come back whole (full chunks).
            let earlier = history[..2].concat().len();
            assert!(
                stats.exact_tokens >= earlier / 64 * 64,
                "turn {turn}: only {} tokens reused of an earlier {earlier}",
                stats.exact_tokens
            );
        }
        history.push(chat.answer(&answer, eos).unwrap());
    }

    // The same prompt again: everything but the last token comes from the store, same answer.
    let mut segments = history[..history.len() - 1].to_vec();
    segments.push(chat.generation_prompt().unwrap());
    let tokens = segments.concat();
    let (plain, _) = plain_greedy(model, &tokens, MAX_NEW).unwrap();
    let mut warm = reuse.prefill(model, &segments).unwrap();
    assert_eq!(
        warm.stats.exact_tokens,
        tokens.len() - 1,
        "{:?}",
        warm.stats
    );
    assert_eq!(warm.stats.computed_tokens, 1);
    assert_eq!(generate(model, &mut warm, MAX_NEW).unwrap(), plain);
}

#[test]
fn a_moved_document_is_reused_with_keys_at_its_new_positions() {
    let (model, chat) = model();
    let reuse = reuse(model);
    let document = chat.encode(texts::DOCUMENT).unwrap();
    let prompt = |preamble: &str| -> Vec<Vec<u32>> {
        vec![
            chat.encode(&format!("<|im_start|>user\n{preamble}\n\n"))
                .unwrap(),
            document.clone(),
            chat.encode(&format!("\n\n{}<|im_end|>\n", texts::DOCUMENT_QUESTION))
                .unwrap(),
            chat.generation_prompt().unwrap(),
        ]
    };
    let first = reuse.prefill(model, &prompt(texts::PREAMBLES[0])).unwrap();
    assert_eq!(first.stats.moved_tokens, 0);

    let segments = prompt(texts::PREAMBLES[1]);
    let (start, full) = (segments[0].len(), document.len() / 64 * 64);
    assert_ne!(
        start,
        prompt(texts::PREAMBLES[0])[0].len(),
        "the document must move"
    );
    let stored = reuse.store().stats().ram_chunks;
    let warm = reuse.prefill(model, &segments).unwrap();
    assert_eq!(
        reuse.store().stats().ram_chunks - stored,
        start.div_ceil(64),
        "only the new preamble's chunks are stored: what follows a moved chunk is approximate"
    );
    assert!(
        warm.stats.moved_tokens >= full,
        "the document's full chunks ({full} tokens) come from the store: {:?}",
        warm.stats
    );

    // Layer 0's keys depend on the token and its position only: re-rotated, they must be the
    // keys candle computes at the new positions (RoPE's pairing and angles agree).
    let mut cold = model.new_cache();
    model.forward(&segments.concat(), &mut cold).unwrap();
    let moved = start..start + full;
    let (got, want) = (keys(&warm.cache, 0, moved.clone()), keys(&cold, 0, moved));
    let scale = want.iter().fold(0f32, |m, v| m.max(v.abs()));
    let worst = got
        .iter()
        .zip(&want)
        .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
    assert!(
        worst <= 1e-4 * scale.max(1.0),
        "re-rotated keys differ from candle's by {worst} (largest key {scale})"
    );
    // Deeper layers saw the other preamble: they are not the same (no repair here).
    let last = model.config.num_layers - 1;
    let deep = start..start + full;
    assert_ne!(
        keys(&warm.cache, last, deep.clone()),
        keys(&cold, last, deep)
    );

    // The same prompt again reuses only its preamble exactly and moves the document again.
    let again = reuse.prefill(model, &segments).unwrap();
    assert_eq!(
        again.stats.exact_tokens, start,
        "exact reuse must cover the preamble ({start} tokens) and stop before approximate K/V: {:?}",
        again.stats
    );
    assert_eq!(again.stats.moved_tokens, warm.stats.moved_tokens);
}
