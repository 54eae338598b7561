//! Objects closed by default: an object schema that names its properties but says nothing of
//! others gets `"additionalProperties": false`, as xgrammar's strict mode (vLLM's default) does.
//! Left open, a small model invents keys, even the same key again, until its tokens run out,
//! and a cut-off answer is no answer (a tool call LangChain sends without `additionalProperties`
//! never ended this way). A schema that wants other keys says `"additionalProperties": true`.

use serde_json::Value;

/// Keywords whose value is one subschema.
const ONE: [&str; 9] = [
    "items",
    "additionalProperties",
    "additionalItems",
    "contains",
    "not",
    "if",
    "then",
    "else",
    "propertyNames",
];
/// Keywords whose value is a list of subschemas (`allOf` is not here: see `close_objects`).
const LISTS: [&str; 4] = ["anyOf", "oneOf", "prefixItems", "items"];
/// Keywords whose value maps names to subschemas.
const MAPS: [&str; 5] = [
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
];
/// Siblings that can admit keys `properties` does not name: a schema with one stays as written.
const OPENERS: [&str; 9] = [
    "additionalProperties",
    "unevaluatedProperties",
    "patternProperties",
    "allOf",
    "anyOf",
    "oneOf",
    "$ref",
    "if",
    "dependentSchemas",
];

/// Closes every object schema in `schema` that lists `properties` and nothing that could admit
/// other keys. A schema using `allOf` anywhere is left as written: its parts are meant to be
/// intersected, and closing one part would forbid the keys another part adds.
pub(crate) fn close_objects(schema: &mut Value) {
    if uses_all_of(schema) {
        return;
    }
    close(schema);
}

fn close(schema: &mut Value) {
    let Value::Object(map) = schema else { return };
    if map.contains_key("properties") && !OPENERS.iter().any(|k| map.contains_key(*k)) {
        map.insert("additionalProperties".into(), Value::Bool(false));
    }
    for (key, value) in map.iter_mut() {
        let key = key.as_str();
        match value {
            Value::Object(sub) if MAPS.contains(&key) => sub.values_mut().for_each(close),
            Value::Object(_) if ONE.contains(&key) => close(value),
            Value::Array(list) if LISTS.contains(&key) => list.iter_mut().for_each(close),
            _ => {}
        }
    }
}

fn uses_all_of(v: &Value) -> bool {
    match v {
        Value::Object(map) => map.contains_key("allOf") || map.values().any(uses_all_of),
        Value::Array(list) => list.iter().any(uses_all_of),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn closed(mut v: Value) -> Value {
        close_objects(&mut v);
        v
    }

    #[test]
    fn objects_with_properties_are_closed_at_every_depth() {
        let s = closed(json!({
            "type": "object",
            "properties": {
                "a": {"type": "object", "properties": {"x": {}}},
                "b": {"type": "array", "items": {"properties": {"y": {}}}},
                "c": {"anyOf": [{"properties": {"z": {}}}, {"type": "null"}]},
            },
            "$defs": {"D": {"properties": {"w": {}}}},
        }));
        assert_eq!(s["additionalProperties"], false);
        assert_eq!(s["properties"]["a"]["additionalProperties"], false);
        assert_eq!(s["properties"]["b"]["items"]["additionalProperties"], false);
        assert_eq!(
            s["properties"]["c"]["anyOf"][0]["additionalProperties"],
            false
        );
        assert_eq!(s["$defs"]["D"]["additionalProperties"], false);
    }

    #[test]
    fn what_a_schema_says_of_other_keys_stands() {
        let open = json!({"properties": {"a": {}}, "additionalProperties": true});
        assert_eq!(closed(open.clone()), open);
        let typed = json!({"properties": {"a": {}}, "additionalProperties": {"type": "integer"}});
        assert_eq!(closed(typed.clone()), typed);
        let free = json!({"type": "object"});
        assert_eq!(closed(free.clone()), free, "no properties named: any keys");
        let with_ref = json!({"properties": {"a": {}}, "$ref": "#/$defs/B", "$defs": {"B": {}}});
        assert_eq!(closed(with_ref.clone()), with_ref);
        let intersected = json!({"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}}]});
        assert_eq!(closed(intersected.clone()), intersected);
    }
}
