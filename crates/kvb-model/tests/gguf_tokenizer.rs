//! SentencePiece GGUF vocabularies (`tokenizer.ggml.model = "llama"`: Llama 2, Mistral, Gemma)
//! tokenize as llama.cpp does. The reference below is llama.cpp's algorithm written plainly:
//! join the adjacent pair whose joined text is the highest-scoring piece (leftmost on ties)
//! until none is, then spell what is no piece as `<0xXX>` byte pieces. Random vocabularies and
//! texts; decoding gives the text back.

use crate::common::{gguf_bytes, Meta};
use kvb_model::gguf::GgufModel;
use kvb_model::Tokenizer;
use proptest::prelude::*;
use std::collections::HashMap;

const SPACE: &str = "\u{2581}";
const NORMAL: i32 = 1;

/// A SentencePiece vocabulary: `<unk>`, `<s>`, `</s>`, the 256 byte pieces, single characters,
/// then pieces joined from earlier ones (distinct scores, longer pieces not always better).
struct Vocab {
    tokens: Vec<String>,
    scores: Vec<f32>,
    types: Vec<i32>,
}

fn vocab(joins: &[(usize, usize, i16)]) -> Vocab {
    let mut v = Vocab {
        tokens: vec!["<unk>".into(), "<s>".into(), "</s>".into()],
        scores: vec![0.0; 3],
        types: vec![2, 3, 3],
    };
    for b in 0..=255u8 {
        v.tokens.push(format!("<0x{b:02X}>"));
        v.scores.push(0.0);
        v.types.push(6);
    }
    // 'é' and '\n' are no pieces: they come out as bytes.
    let first_normal = v.tokens.len();
    for (i, c) in [SPACE, "a", "b", "c"].iter().enumerate() {
        v.tokens.push(c.to_string());
        v.scores.push(-1000.0 - i as f32);
        v.types.push(NORMAL);
    }
    for (k, &(i, j, score)) in joins.iter().enumerate() {
        let n = v.tokens.len() - first_normal;
        let joined = format!(
            "{}{}",
            v.tokens[first_normal + i % n],
            v.tokens[first_normal + j % n]
        );
        if v.tokens.contains(&joined) {
            continue;
        }
        v.tokens.push(joined);
        v.scores.push(score as f32 + k as f32 * 1e-3);
        v.types.push(NORMAL);
    }
    v
}

/// llama.cpp's SentencePiece tokenization, plainly.
fn reference(v: &Vocab, text: &str, add_prefix: bool) -> Vec<u32> {
    let ids: HashMap<&str, usize> = v
        .tokens
        .iter()
        .enumerate()
        .filter(|(id, _)| v.types[*id] == NORMAL)
        .map(|(id, t)| (t.as_str(), id))
        .collect();
    if text.is_empty() {
        return Vec::new(); // no fragment, so no space prefix either
    }
    let text = format!("{}{text}", if add_prefix { " " } else { "" }).replace(' ', SPACE);
    let mut symbols: Vec<String> = text.chars().map(String::from).collect();
    loop {
        let mut best: Option<(usize, f32)> = None;
        for i in 0..symbols.len().saturating_sub(1) {
            let joined = format!("{}{}", symbols[i], symbols[i + 1]);
            if let Some(&id) = ids.get(joined.as_str()) {
                if best.is_none_or(|(_, s)| v.scores[id] > s) {
                    best = Some((i, v.scores[id]));
                }
            }
        }
        let Some((i, _)) = best else { break };
        let right = symbols.remove(i + 1);
        symbols[i].push_str(&right);
    }
    let mut out = Vec::new();
    for s in symbols {
        match ids.get(s.as_str()) {
            Some(&id) => out.push(id as u32),
            None => out.extend(s.bytes().map(|b| 3 + b as u32)),
        }
    }
    out
}

/// The tokenizer kvb builds from a GGUF file holding `v`.
fn from_gguf(v: &Vocab, add_prefix: Option<bool>) -> Tokenizer {
    let mut meta = vec![
        Meta::Str("general.architecture", "llama".into()),
        Meta::Str("tokenizer.ggml.model", "llama".into()),
        Meta::StrArray("tokenizer.ggml.tokens", v.tokens.clone()),
        Meta::F32Array("tokenizer.ggml.scores", v.scores.clone()),
        Meta::I32Array("tokenizer.ggml.token_type", v.types.clone()),
    ];
    if let Some(p) = add_prefix {
        meta.push(Meta::Bool("tokenizer.ggml.add_space_prefix", p));
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("spm.gguf");
    std::fs::write(&path, gguf_bytes(&meta, &[])).unwrap();
    let json = GgufModel::open(&path).unwrap().tokenizer_json().unwrap();
    Tokenizer::from_json(&json.to_string()).unwrap()
}

fn text() -> impl Strategy<Value = String> {
    prop::collection::vec(
        prop::sample::select(vec!["a", "b", "c", " ", "é", "\n"]),
        0..40,
    )
    .prop_map(|parts| parts.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn sentencepiece_gguf_tokenizes_as_llama_cpp(
        joins in prop::collection::vec((0usize..64, 0usize..64, -500i16..0), 0..60),
        texts in prop::collection::vec(text(), 1..6),
        add_prefix in prop::option::of(any::<bool>()),
    ) {
        let v = vocab(&joins);
        let tokenizer = from_gguf(&v, add_prefix);
        for t in &texts {
            let ids = tokenizer.encode(t, false).unwrap();
            prop_assert_eq!(&ids, &reference(&v, t, add_prefix.unwrap_or(true)), "text {:?}", t);
            prop_assert_eq!(&tokenizer.decode(&ids, true).unwrap(), t);
        }
    }
}

/// Control pieces are matched whole in text (a chat template writes them) and skipped when
/// decoding; the file's bos/eos pieces are what they say.
#[test]
fn control_pieces_are_special_tokens() {
    let v = vocab(&[(1, 2, -5), (0, 4, -3)]);
    let tokenizer = from_gguf(&v, None);
    let ids = tokenizer.encode("<s>ab</s>", false).unwrap();
    assert_eq!(ids.first(), Some(&1));
    assert_eq!(ids.last(), Some(&2));
    assert_eq!(tokenizer.decode(&ids, true).unwrap(), "ab");
}

/// A vocabulary whose scores do not line up with its tokens is an error naming the problem.
#[test]
fn scores_of_the_wrong_length_are_an_error() {
    let v = vocab(&[]);
    let meta = vec![
        Meta::Str("general.architecture", "llama".into()),
        Meta::Str("tokenizer.ggml.model", "llama".into()),
        Meta::StrArray("tokenizer.ggml.tokens", v.tokens.clone()),
        Meta::F32Array("tokenizer.ggml.scores", v.scores[1..].to_vec()),
    ];
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bad.gguf");
    std::fs::write(&path, gguf_bytes(&meta, &[])).unwrap();
    let err = GgufModel::open(&path)
        .unwrap()
        .tokenizer_json()
        .unwrap_err()
        .to_string();
    assert!(err.contains("scores"), "{err}");
}
