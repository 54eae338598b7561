//! The grammars a request can ask for, and how each becomes llguidance's grammar.

use crate::error::{ConstrainError, Result};
use llguidance::api::TopLevelGrammar;
use serde_json::{json, Value};

/// What generated text must match.
#[derive(Debug, Clone, PartialEq)]
pub enum Grammar {
    /// Any JSON object (OpenAI's `response_format: {type: json_object}`).
    JsonObject,
    /// A JSON value valid against this JSON Schema (`json_schema`). An object schema that
    /// names its `properties` and says nothing of other keys admits no others (see
    /// `closed.rs`); `"additionalProperties": true` admits them.
    JsonSchema(Value),
    /// Text matching this regular expression in full.
    Regex(String),
    /// A grammar in llguidance's Lark dialect.
    Lark(String),
}

/// JSON laid out one way, `{"a": 1, "b": [2, 3]}`: free whitespace lets a small model spin
/// in newlines until its tokens run out, and a fixed layout is what most chat models write.
/// The value of a schema's `x-guidance` key (the grammars here add it; a Lark grammar's
/// `%json {...}` can too).
pub fn json_layout() -> Value {
    json!({
        "whitespace_flexible": false,
        "item_separator": ", ",
        "key_separator": ": ",
    })
}

impl Grammar {
    pub(crate) fn to_llguidance(&self) -> Result<TopLevelGrammar> {
        Ok(match self {
            Grammar::JsonObject => schema_grammar(json!({"type": "object"})),
            Grammar::JsonSchema(schema) => match schema {
                Value::Bool(_) | Value::Object(_) => schema_grammar(schema.clone()),
                other => {
                    return Err(ConstrainError::Grammar(format!(
                        "a JSON Schema is an object or a boolean, not {other}"
                    )))
                }
            },
            Grammar::Regex(rx) => TopLevelGrammar::from_regex(rx),
            Grammar::Lark(lark) => TopLevelGrammar::from_lark(lark.clone()),
        })
    }
}

fn schema_grammar(schema: Value) -> TopLevelGrammar {
    TopLevelGrammar::from_json_schema(lark_json_schema(schema))
}

/// `schema` as [`Grammar::JsonSchema`] follows it, for a Lark grammar's `%json {...}`: objects
/// that name their properties closed, and laid out as [`json_layout`] says unless the schema
/// sets its own `x-guidance`.
pub fn lark_json_schema(mut schema: Value) -> Value {
    if let Value::Bool(b) = schema {
        // llguidance reads its layout options off an object; `true` is `{}`, `false` is
        // `{"not": {}}`.
        schema = if b { json!({}) } else { json!({"not": {}}) };
    }
    crate::closed::close_objects(&mut schema);
    if let Value::Object(map) = &mut schema {
        map.entry("x-guidance").or_insert_with(json_layout);
    }
    schema
}
