//! `--activations q8` re-lays a loaded model's K-quant weights in place: no matrix is copied
//! beside the one it replaces (an 8B model's LM head is 430 MB), unless something else still
//! holds the model, which then keeps its own weights as they were. Its own binary: it counts the
//! process's weight maps ([`kvb_model::packed::mapped_bytes`]) while nothing else makes any.

#[allow(dead_code)]
mod common;

use common::{all_logits, llama_gguf_as, random_weights, GgufStorage, B};
use kvb_model::gguf::GgufModel;
use kvb_model::model::{LinearWeight, Packed, Stacked};
use kvb_model::packed::{mapped_bytes, reset_mapped_peak};
use kvb_model::{ActivationPrecision, Model, ModelConfig};
use std::sync::{Arc, Mutex};

/// The tests read one process-wide count.
static MAPS: Mutex<()> = Mutex::new(());

/// Q4_K blocks throughout; gate/up (4.7 MB) and down (2.4 MB) are large enough for maps.
fn k_quant_model() -> Model<B> {
    let json = r#"{"architectures":["LlamaForCausalLM"],"hidden_size":1024,
        "intermediate_size":4096,"num_hidden_layers":1,"num_attention_heads":16,
        "num_key_value_heads":4,"vocab_size":96,"max_position_embeddings":512,
        "rms_norm_eps":1e-5,"rope_theta":10000.0,"tie_word_embeddings":false,"eos_token_id":1}"#;
    let config = ModelConfig::from_json(json, true).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("q4_k.gguf");
    let bytes = llama_gguf_as(&config, &random_weights(&config, 9), GgufStorage::RandomQ4K);
    std::fs::write(&path, bytes).unwrap();
    let gguf = GgufModel::open(&path).unwrap();
    Model::<B>::load(&config, &gguf, &Default::default(), &mut |_, _| {}).unwrap()
}

/// Converted alone, the model maps nothing new; converted while a clone holds it, it copies
/// (and the clone computes as before). Both conversions compute the same logits.
#[test]
fn a_model_nothing_else_holds_converts_in_place() {
    let _one = MAPS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let tokens = [3u32, 17, 40, 2, 77];
    let model = k_quant_model();
    let exact = all_logits(&model, &tokens);
    let kept = model.clone();

    let (held, _) = mapped_bytes();
    assert!(held >= 6 << 20, "the model's maps: {held} bytes");
    reset_mapped_peak();
    let copied = model.with_activations(ActivationPrecision::Q8).unwrap();
    let (_, peak) = mapped_bytes();
    assert!(
        peak >= held + (6 << 20),
        "a shared model is copied: {held} -> {peak} bytes at most"
    );
    assert_eq!(
        all_logits(&kept, &tokens),
        exact,
        "the clone's weights moved"
    );

    let with_copy = all_logits(&copied, &tokens);
    drop(copied);
    let (before, _) = mapped_bytes();
    reset_mapped_peak();
    let alone = kept.with_activations(ActivationPrecision::Q8).unwrap();
    let (after, peak) = mapped_bytes();
    assert_eq!(
        (after, peak),
        (before, before),
        "converting a model nothing else holds mapped more"
    );
    assert_eq!(all_logits(&alone, &tokens), with_copy);
    assert_ne!(with_copy, exact, "8-bit activations did not run");
}

/// A stack of parts (a Q4_K_M file's Q4_K q and k beside a Q6_K v) gives each part up to its
/// own conversion.
#[test]
fn stacked_parts_convert_in_place() {
    let _one = MAPS.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    let part = |format| {
        let (m, _) = kvb_gemm::test_values::packed_matrix(format, 64, 2048, 5);
        Arc::new(Packed(Arc::new(m))) as Arc<dyn LinearWeight<B>>
    };
    let stack: Arc<dyn LinearWeight<B>> = Arc::new(Stacked(vec![part(5), part(2)]));
    let (before, _) = mapped_bytes();
    assert!(before >= 4 << 20, "the parts' maps: {before} bytes");
    reset_mapped_peak();
    let converted = stack
        .into_q8_activations()
        .expect("Q4_K and Q6_K take 8-bit products");
    assert_eq!(mapped_bytes(), (before, before), "a part was copied");
    assert_eq!(converted.out_dim(), 2 * 2048);
}
