//! # kvb-fuzz: the bodies of kvb's fuzz targets
//!
//! Every input kvb reads without having written it has a target here: model files (GGUF,
//! safetensors, `config.json`, `tokenizer.json`, each through the loader), the disk tier's
//! records, segments and indexes and the chunk codec, `kvb replay`'s request lines, and the
//! server's request bodies. The property of each: no panic, no allocation sized by a length field
//! beyond what the input holds (libFuzzer's `-malloc_limit_mb` catches those), and whatever
//! parses obeys the target's own checks (round trips, keys, budgets).
//!
//! The libFuzzer binaries (`fuzz_targets/`, built by `cargo fuzz` on nightly; `cargo xtask fuzz`
//! runs each for a bounded time) call these functions; `tests/corpus.rs` runs them on stable over
//! the committed seeds (`seeds/<target>/`), every crash ever found (`regressions/<target>/`) and
//! random mutations of the seeds, in every `cargo test`.

use arbitrary::{Arbitrary, Unstructured};
use kvb_model::gguf::GgufModel;
use kvb_model::weights::{SafetensorsDir, TensorSource};
use kvb_model::{Model, ModelConfig, Tokenizer, WeightPrecision};
use std::path::Path;
use std::sync::OnceLock;

type Cpu = kvb_model::backends::Cpu;

/// A target: its name (the folder of its seeds) and its body.
pub type Target = (&'static str, fn(&[u8]));

/// Every target, by name.
pub const TARGETS: &[Target] = &[
    ("gguf", gguf),
    ("safetensors", safetensors),
    ("config_json", config_json),
    ("tokenizer_json", tokenizer_json),
    ("store_codec", store_codec),
    ("store_segment", store_segment),
    ("store_damaged_segment", store_damaged_segment),
    ("store_index", store_index),
    ("store_folder", store_folder),
    ("replay_lines", replay_lines),
    ("server_body", server_body),
];

/// A GGUF file: opened from memory, its config, tokenizer and chat template read, then the model
/// built from its tensors as `kvb` loads it.
pub fn gguf(data: &[u8]) {
    let Ok(file) = GgufModel::from_bytes(Path::new("fuzz.gguf"), data) else {
        return;
    };
    let _ = file.chat_template();
    let _ = file.special_token("tokenizer.ggml.eos_token_id");
    if let Ok(json) = file.tokenizer_json() {
        if let Ok(tokenizer) = Tokenizer::from_json(&json.to_string()) {
            use_tokenizer(&tokenizer);
        }
    }
    for name in file.names() {
        let _ = file.shape(&name);
        let _ = file.read_stored(&name);
    }
    if let Ok(config) = file.config(false) {
        build_model(&config, &file);
    }
}

/// A safetensors file: its header and tensor table read, every tensor read as stored and as f32.
pub fn safetensors(data: &[u8]) {
    let Ok(file) = SafetensorsDir::from_bytes(Path::new("fuzz.safetensors"), data) else {
        return;
    };
    for name in file.names() {
        let _ = file.shape(&name);
        if let Ok(t) = file.read(&name) {
            let count: usize = t.shape.iter().product();
            assert_eq!(
                count,
                t.data.len(),
                "a tensor read with another element count"
            );
        }
        let _ = file.read_stored(&name);
    }
}

/// A `config.json`: parsed strictly and leniently; a config that parses writes back as JSON that
/// parses to the same config, and a model built from it over no weights is an error, not a crash
/// (this is where a size field would turn into an allocation).
pub fn config_json(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let _ = ModelConfig::from_json(text, true);
    let Ok(config) = ModelConfig::from_json(text, false) else {
        return;
    };
    let written = config.to_hf_json();
    let again =
        ModelConfig::from_json(&written.to_string(), false).expect("a config written back parses");
    // Compared as written JSON, numbers to 1e-12: serde_json's float parsing may miss by an ulp.
    assert!(
        same_json(&again.to_hf_json(), &written),
        "a config written back differs: {config:?} became {again:?}"
    );
    let no_weights = SafetensorsDir::from_bytes(Path::new("empty.safetensors"), EMPTY_SAFETENSORS)
        .expect("an empty safetensors file opens");
    build_model(&config, &no_weights);
}

/// `a` and `b` equal, numbers within a relative 1e-12.
fn same_json(a: &serde_json::Value, b: &serde_json::Value) -> bool {
    use serde_json::Value::{Array, Number, Object};
    match (a, b) {
        (Number(x), Number(y)) => {
            let (x, y) = (
                x.as_f64().unwrap_or(f64::NAN),
                y.as_f64().unwrap_or(f64::NAN),
            );
            x == y || (x - y).abs() <= 1e-12 * x.abs().max(y.abs())
        }
        (Array(x), Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(x, y)| same_json(x, y)),
        (Object(x), Object(y)) => {
            x.len() == y.len()
                && x.iter()
                    .all(|(k, v)| y.get(k).is_some_and(|w| same_json(v, w)))
        }
        _ => a == b,
    }
}

/// A safetensors file holding no tensor: an 8-byte header length, then `{}`.
const EMPTY_SAFETENSORS: &[u8] = b"\x02\0\0\0\0\0\0\0{}";

/// A `tokenizer.json`: built, then used on text with special tokens and its ids decoded back.
pub fn tokenizer_json(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(tokenizer) = Tokenizer::from_json(text) {
        use_tokenizer(&tokenizer);
    }
}

/// The chunk codec on arbitrary bytes ([`kvb_store::fuzzing::codec`]).
pub fn store_codec(data: &[u8]) {
    kvb_store::fuzzing::codec(data);
}

/// A disk segment of arbitrary bytes ([`kvb_store::fuzzing::segment`]).
pub fn store_segment(data: &[u8]) {
    kvb_store::fuzzing::segment(data);
}

/// Records written whole, then damaged ([`kvb_store::fuzzing::damaged_segment`]).
pub fn store_damaged_segment(data: &[u8]) {
    #[derive(Arbitrary, Debug)]
    struct Damage {
        records: Vec<(u8, u8, Vec<u8>)>,
        flip: (usize, u8),
        cut: usize,
    }
    if let Ok(d) = Damage::arbitrary_take_rest(Unstructured::new(data)) {
        kvb_store::fuzzing::damaged_segment(&d.records, d.flip, d.cut % 4096);
    }
}

/// A segment index: the segment's length (8 bytes), then the index body
/// ([`kvb_store::fuzzing::segment_index`]).
pub fn store_index(data: &[u8]) {
    if data.len() < 8 {
        return;
    }
    let (len, body) = data.split_at(8);
    let len = u64::from_le_bytes(len.try_into().expect("8 bytes"));
    kvb_store::fuzzing::segment_index(body, len);
}

/// A disk folder: the budget (u32), the index body's length (u32; all ones for none), the index
/// body, then the segment, opened as a tier ([`kvb_store::fuzzing::disk_folder`]).
pub fn store_folder(data: &[u8]) {
    let word = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(data.get(at..at + 4)?.try_into().ok()?))
    };
    let (Some(max_bytes), Some(index_len)) = (word(0), word(4)) else {
        return;
    };
    let rest = &data[8..];
    let (index, segment) = match usize::try_from(index_len) {
        Ok(n) if n <= rest.len() => (Some(&rest[..n]), &rest[n..]),
        _ => (None, rest),
    };
    kvb_store::fuzzing::disk_folder(segment, index, u64::from(max_bytes));
}

/// A `kvb replay` requests file: checked as a whole before any model loads.
pub fn replay_lines(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(requests) = kvb_server::commands::replay::requests::parse_requests(text, "fuzz") {
        assert!(
            !requests.is_empty(),
            "a requests file accepted with no request"
        );
    }
}

/// A request body: the first byte picks the route (chat, completions, warm), the rest is the
/// body, read as the server reads it; chat messages are then rendered with a real chat template
/// (SmolLM2's).
pub fn server_body(data: &[u8]) {
    let Some((&pick, body)) = data.split_first() else {
        return;
    };
    let route = body_route(pick);
    if let Ok(Some(messages)) = kvb_server::serve::read_body(route, body) {
        assert!(!messages.is_empty(), "a chat accepted with no message");
        let _ = chat_tokenizer().apply_chat_template(&messages, true);
    }
}

/// The POST route a `server_body` input's first byte picks.
pub fn body_route(pick: u8) -> &'static str {
    const ROUTES: [&str; 3] = ["/v1/chat/completions", "/v1/completions", "/v1/warm"];
    ROUTES[usize::from(pick) % ROUTES.len()]
}

/// A tokenizer with SmolLM2's chat template (and the tiny Llama fixture's vocabulary).
fn chat_tokenizer() -> &'static Tokenizer {
    static TOKENIZER: OnceLock<Tokenizer> = OnceLock::new();
    TOKENIZER.get_or_init(|| {
        Tokenizer::from_json(include_str!("../seeds/tokenizer_json/tiny-llama.json"))
            .expect("the fixture tokenizer")
            .with_chat_template(
                Some(include_str!("smollm2_chat_template.jinja").to_string()),
                Some("<|im_start|>".into()),
                Some("<|im_end|>".into()),
            )
    })
}

/// Encodes text that holds special tokens and odd characters, and decodes the ids back.
fn use_tokenizer(tokenizer: &Tokenizer) {
    for text in [
        "Hello, world!",
        "<|im_start|>user\n\u{1F600} \0 ünï<s></s>",
        "",
    ] {
        if let Ok(ids) = tokenizer.encode(text, true) {
            let _ = tokenizer.decode(&ids, false);
            let _ = tokenizer.decode(&ids, true);
        }
    }
    let _ = tokenizer.decode(&[0, 1, u32::MAX], false);
    let _ = tokenizer.apply_chat_template(&[kvb_model::ChatMessage::new("user", "hi")], true);
}

/// Builds the model of `config` from `source` on the CPU, as `kvb` loads one.
fn build_model(config: &ModelConfig, source: &dyn TensorSource) {
    let _ = Model::<Cpu>::load_with(
        config,
        source,
        WeightPrecision::Auto,
        &Default::default(),
        &mut |_, _| {},
    );
}
