//! Whatever a sampler picks among the tokens a schema's mask allows, the text ends once it is
//! complete and is JSON valid against the schema. Schemas are drawn at random from a subset
//! this file can validate on its own (objects, arrays, strings, integers, booleans, null, enums).

use kvb_constrain::{ConstrainError, Grammar, TokenMatcher, Vocabulary};
use proptest::prelude::*;
use serde_json::{json, Value};

const EOS: u32 = 1;
/// The tiny models' logits: more ids than the tokenizer has.
const LOGITS: usize = 512;

fn tokenizer() -> tokenizers::Tokenizer {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fixtures/tiny/llama/tokenizer.json"
    );
    tokenizers::Tokenizer::from_file(path).expect("tiny tokenizer")
}

fn vocabulary() -> &'static (Vocabulary, tokenizers::Tokenizer) {
    static V: std::sync::OnceLock<(Vocabulary, tokenizers::Tokenizer)> = std::sync::OnceLock::new();
    V.get_or_init(|| {
        let t = tokenizer();
        (Vocabulary::new(&t, &[EOS], LOGITS).expect("vocabulary"), t)
    })
}

/// A schema of bounded size, so that any walk through it ends.
fn schema(depth: u32) -> BoxedStrategy<Value> {
    let leaf = prop_oneof![
        (0u32..6).prop_map(|n| json!({"type": "string", "maxLength": n})),
        (-50i64..50, 0i64..200)
            .prop_map(|(lo, w)| json!({"type": "integer", "minimum": lo, "maximum": lo + w})),
        Just(json!({"type": "boolean"})),
        Just(json!({"type": "null"})),
        prop::collection::vec("[a-z ]{1,6}", 1..4).prop_map(|v| json!({"enum": v})),
    ];
    if depth == 0 {
        return leaf.boxed();
    }
    let inner = schema(depth - 1);
    prop_oneof![
        2 => leaf,
        1 => (inner.clone(), 0usize..3).prop_map(|(items, max)| json!({"type": "array", "items": items, "maxItems": max})),
        2 => prop::collection::btree_map("[a-z]{1,5}", inner, 1..4).prop_flat_map(|props| {
            let names: Vec<String> = props.keys().cloned().collect();
            (Just(props), prop::sample::subsequence(names.clone(), 0..=names.len()), any::<bool>())
        }).prop_map(|(props, required, said)| {
            // Said or not, no other keys: objects that name their properties are closed.
            let mut s = json!({"type": "object", "properties": props, "required": required});
            if said {
                s["additionalProperties"] = json!(false);
            }
            s
        }),
    ]
    .boxed()
}

/// Whether `v` is valid against `schema` (the generator's subset of JSON Schema).
fn valid(v: &Value, schema: &Value) -> bool {
    if let Some(choices) = schema.get("enum").and_then(Value::as_array) {
        return choices.contains(v);
    }
    match schema["type"].as_str() {
        Some("string") => v
            .as_str()
            .is_some_and(|s| s.chars().count() as u64 <= schema["maxLength"].as_u64().unwrap()),
        // JSON Schema's integers are integral numbers, `-0` among them (serde_json reads it as
        // a float, as it must to keep the sign).
        Some("integer") => v.as_f64().is_some_and(|n| {
            n.fract() == 0.0
                && n >= schema["minimum"].as_f64().unwrap()
                && n <= schema["maximum"].as_f64().unwrap()
        }),
        Some("boolean") => v.is_boolean(),
        Some("null") => v.is_null(),
        Some("array") => v.as_array().is_some_and(|items| {
            items.len() as u64 <= schema["maxItems"].as_u64().unwrap()
                && items.iter().all(|i| valid(i, &schema["items"]))
        }),
        Some("object") => v.as_object().is_some_and(|map| {
            let props = schema["properties"].as_object().unwrap();
            let required = schema["required"].as_array().unwrap();
            required
                .iter()
                .all(|r| map.contains_key(r.as_str().unwrap()))
                && map
                    .iter()
                    .all(|(k, x)| props.get(k).is_some_and(|s| valid(x, s)))
        }),
        other => panic!("the generator makes no type {other:?}"),
    }
}

/// A small generator for the walk's choices.
struct Draw(u64);
impl Draw {
    fn next(&mut self, n: usize) -> usize {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 % n as u64) as usize
    }
}

/// Walks the grammar choosing uniformly among allowed tokens; after `patience` steps, EOS as soon
/// as it is allowed, and before that a token that closes a string, array or object where one
/// is allowed (else a walk through an open schema wanders on). Returns the tokens before EOS.
fn walk(m: &mut TokenMatcher, seed: u64, patience: usize) -> Vec<u32> {
    let tok = &vocabulary().1;
    let mut draw = Draw(seed | 1);
    let mut out = Vec::new();
    for step in 0..2000 {
        // Checked one by one before any mask is worked out, tokens fit exactly as the mask says.
        let mut unprepared = m.clone();
        let mut logits = vec![0.0f32; LOGITS];
        m.mask_logits(&mut logits).unwrap();
        let allowed: Vec<u32> = (0..LOGITS as u32)
            .filter(|&t| logits[t as usize] == 0.0)
            .collect();
        if step % 3 == 0 {
            for t in 0..LOGITS as u32 {
                let fits = unprepared.check(t).unwrap();
                assert_eq!(fits, allowed.contains(&t), "token {t} at step {step}");
            }
        }
        assert!(!allowed.is_empty(), "a mask allows something");
        for &t in &allowed {
            assert!(m.allows(t).unwrap());
        }
        let closers: Vec<u32> = allowed
            .iter()
            .copied()
            .filter(|&t| {
                let text = tok.decode(&[t], false).unwrap_or_default();
                text.contains(['}', ']', '"'])
            })
            .collect();
        let token = if step < patience {
            allowed[draw.next(allowed.len())]
        } else if allowed.contains(&EOS) {
            EOS
        } else if !closers.is_empty() {
            closers[draw.next(closers.len())]
        } else {
            allowed[draw.next(allowed.len())]
        };
        m.accept(token).expect("an allowed token is accepted");
        if token == EOS {
            assert!(m.finished(), "EOS ends the grammar");
            return out;
        }
        out.push(token);
        if m.finished() {
            return out;
        }
    }
    panic!("no end after 2000 tokens");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]

    #[test]
    fn every_walk_is_valid_json_of_its_schema(schema in schema(2), seed: u64, patience in 0usize..40) {
        let (vocab, tok) = vocabulary();
        let mut m = vocab.matcher(&Grammar::JsonSchema(schema.clone())).unwrap();
        let tokens = walk(&mut m, seed, patience);
        let text = tok.decode(&tokens, false).unwrap();
        let value: Value = serde_json::from_str(&text)
            .map_err(|e| TestCaseError::fail(format!("{text:?} is not JSON: {e}")))?;
        prop_assert!(valid(&value, &schema), "{text} does not fit {schema}");
    }
}

#[test]
fn json_object_gives_objects() {
    let (vocab, tok) = vocabulary();
    for seed in 1..20 {
        let mut m = vocab.matcher(&Grammar::JsonObject).unwrap();
        let tokens = walk(&mut m, seed, 30);
        let text = tok.decode(&tokens, false).unwrap();
        let value: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(value.is_object(), "{text}");
    }
}

/// A token outside the mask is refused, and so is any token after the end.
#[test]
fn tokens_outside_the_mask_are_rejected() {
    let (vocab, tok) = vocabulary();
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "additionalProperties": false});
    let mut m = vocab.matcher(&Grammar::JsonSchema(schema)).unwrap();
    let letter = tok.token_to_id("x").unwrap();
    assert!(!m.allows(letter).unwrap());
    assert!(!m.allows(EOS).unwrap(), "nothing complete yet");
    assert!(
        !m.allows(LOGITS as u32 - 1).unwrap(),
        "ids past the tokenizer's"
    );
    assert!(matches!(
        m.accept(letter),
        Err(ConstrainError::Rejected { .. })
    ));
    // A fresh matcher: the whole answer, then EOS, then nothing.
    let mut m = vocab
        .matcher(&Grammar::JsonSchema(json!({"enum": ["ok"]})))
        .unwrap();
    for t in tok.encode("\"ok\"", false).unwrap().get_ids() {
        m.accept(*t).unwrap();
    }
    assert!(m.accepting());
    m.accept(EOS).unwrap();
    assert!(m.finished());
}

/// Whether the matcher takes `text`, tokenized, whole and complete.
fn takes(schema: Value, text: &str) -> bool {
    let (vocab, tok) = vocabulary();
    let mut m = vocab.matcher(&Grammar::JsonSchema(schema)).unwrap();
    let ids = tok.encode(text, false).unwrap();
    ids.get_ids().iter().all(|&t| m.accept(t).is_ok()) && m.accepting()
}

/// Keys a schema does not name are refused unless it admits them.
#[test]
fn other_keys_only_where_the_schema_admits_them() {
    let named = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    assert!(takes(named.clone(), r#"{"a": 1}"#));
    assert!(!takes(named.clone(), r#"{"a": 1, "zz": 2}"#));
    let mut open = named;
    open["additionalProperties"] = json!(true);
    assert!(takes(open, r#"{"a": 1, "zz": 2}"#));
    assert!(takes(json!({"type": "object"}), r#"{"zz": 2}"#));
}

#[test]
fn bad_schemas_are_errors_before_any_token() {
    let (vocab, _) = vocabulary();
    for bad in [
        json!({"type": "no-such-type"}),
        json!({"type": "integer", "minimum": 5, "maximum": 1}),
        json!(17),
    ] {
        match vocab.matcher(&Grammar::JsonSchema(bad.clone())) {
            Err(ConstrainError::Grammar(_)) => {}
            other => panic!("{bad}: {other:?}"),
        }
    }
}

#[test]
fn regex_and_lark_grammars_constrain_too() {
    let (vocab, tok) = vocabulary();
    for seed in 1..10 {
        let mut m = vocab
            .matcher(&Grammar::Regex("(yes|no)[0-9]{2}".into()))
            .unwrap();
        let text = tok.decode(&walk(&mut m, seed, 0), false).unwrap();
        assert!(text.len() == 4 || text.len() == 5, "{text}");
        assert!(text.starts_with("yes") || text.starts_with("no"), "{text}");
        assert!(
            text[text.len() - 2..].chars().all(|c| c.is_ascii_digit()),
            "{text}"
        );
    }
    let mut m = vocab
        .matcher(&Grammar::Lark("start: \"a\" (\"b\" | \"c\")".into()))
        .unwrap();
    let text = tok.decode(&walk(&mut m, 3, 0), false).unwrap();
    assert!(text == "ab" || text == "ac", "{text}");
}

/// A Lark grammar names a control token by its id (`<[id]>`, as Mistral's `[TOOL_CALLS]` is
/// named): that token opens the call, and text cannot spell it.
#[test]
fn a_lark_grammar_names_a_control_token_by_id() {
    let (vocab, tok) = vocabulary();
    let bos = tok.token_to_id("<s>").unwrap();
    let grammar = Grammar::Lark(format!(
        "start: TEXT | <[{bos}]> \" [\" \"a\" \"]\"\nTEXT: /[^\\[]+/\n"
    ));
    let mut m = vocab.matcher(&grammar).unwrap();
    let bracket = tok.encode("[", false).unwrap().get_ids()[0];
    assert!(m.allows(bos).unwrap());
    assert!(!m.allows(bracket).unwrap(), "text cannot start the call");
    m.accept(bos).unwrap();
    let call = tok.decode(&walk(&mut m, 1, 0), false).unwrap();
    assert_eq!(call.trim_start(), "[a]");
    for seed in 0..10 {
        let mut m = vocab.matcher(&grammar).unwrap();
        let ids = walk(&mut m, seed, 3);
        let text = tok.decode(&ids, false).unwrap();
        assert!(!ids.contains(&bos) && !text.contains('['), "{text}");
    }
}
