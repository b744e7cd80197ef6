//! Strict tool schemas: the form OpenAI's and Anthropic's strict tool modes accept, so the
//! provider constrains a call's arguments to the tool's schema instead of the runtime hoping to
//! parse them. Both want every object closed (`additionalProperties: false`) with every property
//! required; an optional property becomes required but nullable, and the `null`s a model writes
//! for them are dropped from the arguments it returns ([`drop_nulls`]), so a tool sees what it
//! would have seen without strict mode. Keywords the strict modes do not take (string lengths,
//! number and list bounds, defaults) are left out: the supervisor keeps its own limits on what a
//! tool accepts, whatever the schema said.

use serde_json::{Map, Value, json};

/// Keywords the strict modes reject or ignore; removed from a strict schema.
const UNSUPPORTED: &[&str] = &[
    "minLength",
    "maxLength",
    "pattern",
    "format",
    "minimum",
    "maximum",
    "exclusiveMinimum",
    "exclusiveMaximum",
    "multipleOf",
    "minItems",
    "maxItems",
    "uniqueItems",
    "minProperties",
    "maxProperties",
    "default",
    "examples",
];

/// A tool as both providers describe it: name, description and its schema under `schema_key`
/// (`parameters`, `input_schema`); with `strict`, the schema's strict form and `strict: true`
/// where it has one.
pub(crate) fn tool_object(tool: &crate::ToolDef, schema_key: &str, strict: bool) -> Value {
    let schema = crate::anthropic::object_schema(&tool.parameters);
    let mut out = json!({"name": tool.name, "description": tool.description});
    match strict.then(|| strict_schema(&schema)).flatten() {
        Some(s) => {
            out[schema_key] = s;
            out["strict"] = json!(true);
        }
        None => out[schema_key] = schema,
    }
    out
}

/// The strict form of a tool's parameter schema, or `None` when it cannot have one (an object
/// open to any key, a `$ref`, a type the strict modes do not know): that tool goes without.
pub(crate) fn strict_schema(schema: &Value) -> Option<Value> {
    let Value::Object(obj) = schema else { return None };
    if obj.get("type").and_then(Value::as_str) != Some("object") {
        return None;
    }
    node(schema)
}

fn node(schema: &Value) -> Option<Value> {
    let Value::Object(obj) = schema else { return None };
    let unsupported = ["$ref", "patternProperties", "oneOf", "allOf", "not", "if"];
    if unsupported.iter().any(|k| obj.contains_key(*k)) {
        return None;
    }
    let mut out = Map::new();
    for (k, v) in obj {
        if UNSUPPORTED.contains(&k.as_str()) {
            continue;
        }
        let v = match k.as_str() {
            "items" => node(v)?,
            "anyOf" => Value::Array(v.as_array()?.iter().map(node).collect::<Option<_>>()?),
            "properties" | "required" | "additionalProperties" => continue,
            _ => v.clone(),
        };
        out.insert(k.clone(), v);
    }
    let is_object = obj.get("type").and_then(Value::as_str) == Some("object");
    if is_object || obj.contains_key("properties") {
        if obj.get("additionalProperties").is_some_and(|a| a != &Value::Bool(false)) {
            return None;
        }
        let empty = Map::new();
        let props = match obj.get("properties") {
            Some(Value::Object(p)) => p,
            None => &empty,
            Some(_) => return None,
        };
        let required: Vec<&str> = obj
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let mut strict_props = Map::new();
        for (name, p) in props {
            let p = node(p)?;
            let p = if required.contains(&name.as_str()) { p } else { nullable(p) };
            strict_props.insert(name.clone(), p);
        }
        out.insert("properties".into(), Value::Object(strict_props));
        out.insert("required".into(), json!(props.keys().collect::<Vec<_>>()));
        out.insert("additionalProperties".into(), Value::Bool(false));
    }
    Some(Value::Object(out))
}

/// `schema`, also allowing `null` (an optional property under strict mode).
fn nullable(mut schema: Value) -> Value {
    let Value::Object(obj) = &mut schema else { return schema };
    if let Some(Value::Array(values)) = obj.get_mut("enum")
        && !values.contains(&Value::Null)
    {
        values.push(Value::Null);
    }
    match obj.get_mut("type") {
        Some(Value::String(t)) => {
            let t = std::mem::take(t);
            obj.insert("type".into(), json!([t, "null"]));
            schema
        }
        Some(Value::Array(types)) => {
            if !types.contains(&json!("null")) {
                types.push(json!("null"));
            }
            schema
        }
        _ => json!({"anyOf": [schema, {"type": "null"}]}),
    }
}

/// The arguments a strict call returned, without the `null`s written for optional properties
/// (in every object, at any depth).
pub(crate) fn drop_nulls(arguments: &str) -> String {
    fn walk(v: &mut Value) {
        match v {
            Value::Object(obj) => {
                obj.retain(|_, v| !v.is_null());
                obj.values_mut().for_each(walk);
            }
            Value::Array(items) => items.iter_mut().for_each(walk),
            _ => {}
        }
    }
    match serde_json::from_str::<Value>(arguments) {
        Ok(mut v @ Value::Object(_)) => {
            walk(&mut v);
            v.to_string()
        }
        _ => arguments.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_schema_becomes_closed_with_optional_properties_nullable() {
        let schema = json!({
            "type": "object",
            "properties": {
                "to": {"type": "string", "enum": ["pm", "dev"], "description": "who"},
                "text": {"type": "string", "maxLength": 1200},
                "mode": {"type": "string", "enum": ["append", "replace"]},
                "tags": {"type": "array", "items": {"type": "string", "maxLength": 30}, "maxItems": 4},
                "where": {"type": "object", "properties": {"line": {"type": "integer", "minimum": 1}}},
            },
            "required": ["to", "text"],
        });
        let s = strict_schema(&schema).unwrap();
        assert_eq!(s["additionalProperties"], false);
        let mut required: Vec<_> =
            s["required"].as_array().unwrap().iter().map(|v| v.as_str().unwrap()).collect();
        required.sort();
        assert_eq!(required, ["mode", "tags", "text", "to", "where"]);
        assert_eq!(
            s["properties"]["to"],
            json!({"type": "string", "enum": ["pm", "dev"], "description": "who"})
        );
        assert_eq!(s["properties"]["text"], json!({"type": "string"}));
        assert_eq!(
            s["properties"]["mode"],
            json!({"type": ["string", "null"], "enum": ["append", "replace", null]})
        );
        assert_eq!(
            s["properties"]["tags"],
            json!({"type": ["array", "null"], "items": {"type": "string"}})
        );
        let nested = &s["properties"]["where"];
        assert_eq!(nested["type"], json!(["object", "null"]));
        assert_eq!(nested["additionalProperties"], false);
        assert_eq!(nested["required"], json!(["line"]));
        assert_eq!(nested["properties"]["line"], json!({"type": ["integer", "null"]}));
    }

    #[test]
    fn open_objects_and_non_objects_have_no_strict_form() {
        assert_eq!(strict_schema(&json!({"type": "string"})), None);
        assert_eq!(strict_schema(&Value::Null), None);
        let open = json!({"type": "object", "properties": {"x": {"type": "string"}},
                          "additionalProperties": true});
        assert_eq!(strict_schema(&open), None);
        let nested_open = json!({"type": "object", "properties": {
            "data": {"type": "object", "additionalProperties": {"type": "string"}}}});
        assert_eq!(strict_schema(&nested_open), None);
        let reference = json!({"type": "object", "properties": {"x": {"$ref": "#/defs/x"}}});
        assert_eq!(strict_schema(&reference), None);
        // An object with no properties is fine: closed and empty.
        let empty = strict_schema(&json!({"type": "object"})).unwrap();
        assert_eq!(
            empty,
            json!({"type": "object", "properties": {}, "required": [], "additionalProperties": false})
        );
    }

    #[test]
    fn nulls_for_optional_properties_are_dropped_from_the_arguments() {
        let args = r#"{"to":"pm","mode":null,"where":{"line":null,"col":3},"list":[{"a":null}]}"#;
        let v: Value = serde_json::from_str(&drop_nulls(args)).unwrap();
        assert_eq!(v, json!({"to": "pm", "where": {"col": 3}, "list": [{}]}));
        assert_eq!(drop_nulls("not json"), "not json");
    }
}
