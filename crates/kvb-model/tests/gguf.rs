//! GGUF reading: a llama GGUF (with llama.cpp's q/k permutation) loads to the same model as the
//! HF checkpoint it came from, and truncated or corrupted files are errors, never panics.

use crate::common::{
    llama_gguf, llama_gguf_with, random_weights, tiny_llama_config, write_safetensors, GgufStorage,
    Meta, B,
};
use kvb_model::gguf::{GgufHeader, GgufModel};
use kvb_model::weights::SafetensorsDir;
use kvb_model::{load_pretrained, LoadOptions, LogitsFor, Model, ModelConfig};
use proptest::prelude::*;
use std::path::Path;

fn logits(m: &Model<B>) -> Vec<f32> {
    let toks: Vec<u32> = (0..12).map(|i| (i * 7 % 96) as u32).collect();
    let pos: Vec<usize> = (0..12).collect();
    let mut cache = m.new_cache();
    m.forward(&toks, &pos, &mut cache, LogitsFor::All)
        .unwrap()
        .into_data()
        .to_vec()
        .unwrap()
}

fn small_gguf() -> (ModelConfig, Vec<u8>) {
    let config = ModelConfig::from_json(&tiny_llama_config(2), true).unwrap();
    let weights = random_weights(&config, 5);
    (config.clone(), llama_gguf(&config, &weights))
}

#[test]
fn a_llama_gguf_loads_to_the_same_model_as_its_checkpoint() {
    let config = ModelConfig::from_json(&tiny_llama_config(2), true).unwrap();
    let weights = random_weights(&config, 42);
    let dir = tempfile::tempdir().unwrap();
    write_safetensors(&dir.path().join("model.safetensors"), &weights);
    let gguf_path = dir.path().join("m.gguf");
    std::fs::write(&gguf_path, llama_gguf(&config, &weights)).unwrap();

    let gguf = GgufModel::open(&gguf_path).unwrap();
    let gguf_config = gguf.config(true).unwrap();
    assert_eq!(gguf_config.num_kv_heads, 2);
    assert_eq!(gguf_config.eos_token_ids, vec![1]);
    assert!(!gguf_config.tie_word_embeddings);
    let dev = Default::default();
    let from_gguf = Model::<B>::load(&gguf_config, &gguf, &dev, &mut |_, _| {}).unwrap();
    let st = SafetensorsDir::open(dir.path()).unwrap();
    let from_st = Model::<B>::load(&config, &st, &dev, &mut |_, _| {}).unwrap();
    assert_eq!(logits(&from_gguf), logits(&from_st));
}

#[test]
fn every_truncation_of_a_gguf_header_is_an_error() {
    let (_, bytes) = small_gguf();
    let full = GgufHeader::parse(&bytes, Path::new("t.gguf")).unwrap();
    let data_start = full.tensors.values().map(|t| t.range.start).min().unwrap();
    let data_end = full.tensors.values().map(|t| t.range.end).max().unwrap();
    for len in (0..data_start).chain([data_end - 1, data_end - 40]) {
        let r = GgufHeader::parse(&bytes[..len], Path::new("t.gguf"));
        assert!(
            r.is_err(),
            "a file cut at {len} of {} bytes parsed",
            bytes.len()
        );
    }
}

#[test]
fn absurd_counts_are_refused_without_allocating() {
    let mut bytes = b"GGUF".to_vec();
    bytes.extend(3u32.to_le_bytes());
    bytes.extend(u64::MAX.to_le_bytes());
    bytes.extend(0u64.to_le_bytes());
    let err = GgufHeader::parse(&bytes, Path::new("x.gguf"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("tensor count"), "{err}");
    let err = GgufHeader::parse(b"GGML\x03\0\0\0", Path::new("x.gguf"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("bad magic"), "{err}");
}

#[test]
fn a_truncated_gguf_file_is_an_error_at_open() {
    let (_, bytes) = small_gguf();
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("cut.gguf");
    std::fs::write(&p, &bytes[..bytes.len() / 2]).unwrap();
    let err = GgufModel::open(&p)
        .err()
        .expect("a truncated file must not open")
        .to_string();
    assert!(
        err.contains("cut.gguf") && err.contains("beyond the end"),
        "{err}"
    );
}

/// A tensor in a block type kvb does not read (here IQ2_XS) is an error at open naming the
/// tensor and the type, and listing what kvb reads.
#[test]
fn a_tensor_of_an_unread_block_type_is_an_error_naming_it() {
    let (_, mut bytes) = small_gguf();
    // The tensor's info: name (u64 length, bytes), u32 dims count, u64 dims, u32 type.
    let name = b"blk.0.attn_q.weight";
    let at = bytes
        .windows(name.len())
        .position(|w| w == name)
        .expect("the tensor's info")
        + name.len();
    let dims = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()) as usize;
    let type_at = at + 4 + 8 * dims;
    bytes[type_at..type_at + 4].copy_from_slice(&17u32.to_le_bytes());
    let err = GgufModel::from_bytes(Path::new("iq2.gguf"), &bytes)
        .err()
        .expect("an unread type must not open")
        .to_string();
    assert!(
        err.contains("blk.0.attn_q.weight") && err.contains("IQ2_XS") && err.contains("Q3_K"),
        "{err}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn corrupted_gguf_bytes_never_panic(flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 1..8)) {
        let (_, mut bytes) = small_gguf();
        let header_len = 600.min(bytes.len());
        for (at, value) in flips {
            bytes[at % header_len] = value;
        }
        // Either it parses (a flip in a value) or it is an error; it must never panic.
        let _ = GgufHeader::parse(&bytes, Path::new("fuzz.gguf"));
    }
}

/// A GGUF whose vocabulary lists more tokens than the model has embedding rows is refused,
/// naming both counts; one that fits loads, its tokenizer built beside the weights.
#[test]
fn a_gguf_vocabulary_longer_than_the_embedding_is_refused() {
    let config = ModelConfig::from_json(&tiny_llama_config(2), true).unwrap();
    let weights = random_weights(&config, 9);
    let dir = tempfile::tempdir().unwrap();
    for tokens in [config.vocab_size, config.vocab_size + 1] {
        let mut pieces: Vec<String> = ["<unk>", "<s>", "</s>"].map(String::from).to_vec();
        pieces.extend((0..=255u8).map(|b| format!("<0x{b:02X}>")));
        pieces.extend((pieces.len()..tokens).map(|i| format!("t{i}")));
        let types = (0..tokens).map(|i| if i < 3 { 3 } else { 1 }).collect();
        let vocabulary = vec![
            Meta::Str("tokenizer.ggml.model", "llama".into()),
            Meta::F32Array("tokenizer.ggml.scores", vec![0.0; tokens]),
            Meta::I32Array("tokenizer.ggml.token_type", types),
            Meta::StrArray("tokenizer.ggml.tokens", pieces),
        ];
        let path = dir.path().join(format!("v{tokens}.gguf"));
        let file = llama_gguf_with(&config, &weights, GgufStorage::F32, vocabulary);
        std::fs::write(&path, file).unwrap();
        let loaded = load_pretrained::<B>(
            &path,
            LoadOptions::default(),
            &Default::default(),
            &mut |_, _| {},
        );
        match loaded {
            Ok(m) if tokens <= config.vocab_size => {
                assert_eq!(m.tokenizer.vocab_size(), tokens);
            }
            Ok(_) => panic!("a vocabulary of {tokens} tokens loaded"),
            Err(e) => assert!(
                tokens > config.vocab_size
                    && e.to_string().contains(&format!(
                        "the tokenizer has {tokens} tokens but the model's vocabulary has {} rows",
                        config.vocab_size
                    )),
                "{tokens} tokens: {e}"
            ),
        }
    }
}
