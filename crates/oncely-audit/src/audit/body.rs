//! Body variants: the same JSON written differently, and a JSON that asks for something else.

use serde_json::Value;
use std::fmt::Write as _;

/// `v` serialized with every object's keys in reverse lexicographic order and generous
/// whitespace (spaces around `:` and `,`, newlines, two-space indents): the same JSON value as
/// `serde_json::to_vec(v)` (equal after parsing, RFC 8785-equal), never the same bytes.
pub(crate) fn reordered(v: &Value) -> String {
    let mut out = String::new();
    write_reordered(v, 0, &mut out);
    out.push('\n');
    out
}

fn write_reordered(v: &Value, depth: usize, out: &mut String) {
    let pad = |d: usize| "  ".repeat(d);
    match v {
        Value::Object(map) => {
            out.push_str("{\n");
            let mut keys: Vec<&String> = map.keys().collect();
            keys.sort();
            keys.reverse();
            for (i, k) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(" ,\n");
                }
                out.push_str(&pad(depth + 1));
                out.push_str(&Value::String((*k).clone()).to_string());
                out.push_str(" : ");
                write_reordered(&map[k.as_str()], depth + 1, out);
            }
            let _ = write!(out, "\n{}}}", pad(depth));
        }
        Value::Array(items) => {
            // Arrays keep their order: element order is meaningful in JSON.
            out.push_str("[ ");
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(" , ");
                }
                write_reordered(item, depth + 1, out);
            }
            out.push_str(" ]");
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// A different request: `v` with one value changed, and a description of the change.
///
/// In order of preference (to keep the request valid, so a 4xx means "mismatch", not "invalid"):
/// the first number found (depth-first, keys in sorted order) plus one; else the first string
/// with `-x` appended; else the first boolean flipped; else a top-level field
/// `oncely_audit_probe` added. `None` for a body that is not an object or array.
pub(crate) fn mutated(v: &Value) -> Option<(Value, String)> {
    if !v.is_object() && !v.is_array() {
        return None;
    }
    for kind in [Kind::Number, Kind::String, Kind::Bool] {
        let mut copy = v.clone();
        if let Some(desc) = mutate_first(&mut copy, kind, String::new()) {
            return Some((copy, desc));
        }
    }
    let mut copy = v.clone();
    let map = copy.as_object_mut()?;
    map.insert(
        "oncely_audit_probe".to_owned(),
        Value::String("changed".to_owned()),
    );
    Some((copy, "added the field /oncely_audit_probe".to_owned()))
}

#[derive(Clone, Copy)]
enum Kind {
    Number,
    String,
    Bool,
}

fn mutate_first(v: &mut Value, kind: Kind, pointer: String) -> Option<String> {
    match (v, kind) {
        (Value::Number(n), Kind::Number) => {
            let (old, new) = if let Some(i) = n.as_i64().filter(|i| *i < i64::MAX) {
                (n.to_string(), Value::from(i + 1))
            } else if let Some(f) = n.as_f64() {
                // Past 2^53 adding one may leave the same double (1e308 + 1 is 1e308), and so
                // the same canonical body: negate it instead.
                let changed = if f + 1.0 == f { -f } else { f + 1.0 };
                (
                    n.to_string(),
                    serde_json::Number::from_f64(changed).map(Value::Number)?,
                )
            } else {
                return None;
            };
            let desc = format!("changed {pointer} from {old} to {new}");
            *n = match new {
                Value::Number(new) => new,
                _ => return None,
            };
            Some(desc)
        }
        // The key's place in the body (`AuditConfig::key_placement`) is not the body's to change.
        (Value::String(s), Kind::String) if s == crate::audit::probe::KEY_PLACEHOLDER => None,
        (Value::String(s), Kind::String) => {
            let old = s.clone();
            s.push_str("-x");
            Some(format!("changed {pointer} from {old:?} to {s:?}"))
        }
        (Value::Bool(b), Kind::Bool) => {
            *b = !*b;
            Some(format!("changed {pointer} from {} to {}", !*b, *b))
        }
        (Value::Object(map), _) => {
            let mut keys: Vec<String> = map.keys().cloned().collect();
            keys.sort();
            keys.into_iter().find_map(|k| {
                let child = format!("{pointer}/{}", k.replace('~', "~0").replace('/', "~1"));
                mutate_first(map.get_mut(&k)?, kind, child)
            })
        }
        (Value::Array(items), _) => items
            .iter_mut()
            .enumerate()
            .find_map(|(i, item)| mutate_first(item, kind, format!("{pointer}/{i}"))),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn reordered_is_the_same_value_in_other_bytes() {
        let v = json!({"amount": 100, "currency": "usd", "meta": {"a": [1, {"y": 2, "x": 1}], "b": null}});
        let text = reordered(&v);
        assert_eq!(serde_json::from_str::<Value>(&text).unwrap(), v);
        assert_ne!(text.as_bytes(), serde_json::to_vec(&v).unwrap().as_slice());
        assert!(
            text.find("\"currency\"").unwrap() < text.find("\"amount\"").unwrap(),
            "{text}"
        );
        assert_eq!(reordered(&json!({})), "{\n\n}\n");
        assert_eq!(
            serde_json::from_str::<Value>(&reordered(&json!({}))).unwrap(),
            json!({})
        );
    }

    #[test]
    fn mutation_prefers_numbers_then_strings() {
        let (m, d) = mutated(&json!({"currency": "usd", "customer": {"id": "c", "n": 7}})).unwrap();
        assert_eq!(
            m,
            json!({"currency": "usd", "customer": {"id": "c", "n": 8}})
        );
        assert_eq!(d, "changed /customer/n from 7 to 8");
        let (m, d) = mutated(&json!({"b": "x", "a": "y"})).unwrap();
        assert_eq!(m, json!({"b": "x", "a": "y-x"}));
        assert_eq!(d, r#"changed /a from "y" to "y-x""#);
        let (m, _) = mutated(&json!({"ok": true})).unwrap();
        assert_eq!(m, json!({"ok": false}));
        let (m, _) = mutated(&json!({"n": 1.5})).unwrap();
        assert_eq!(m, json!({"n": 2.5}));
        // Where adding one leaves the same double, the number is negated instead.
        let (m, d) = mutated(&json!({"n": 1e308})).unwrap();
        assert_eq!(m, json!({"n": -1e308}));
        assert_eq!(d, "changed /n from 1e+308 to -1e+308");
        let (m, d) = mutated(&json!({})).unwrap();
        assert_eq!(m, json!({"oncely_audit_probe": "changed"}));
        assert_eq!(d, "added the field /oncely_audit_probe");
        assert_eq!(mutated(&json!([null])), None);
        assert_eq!(mutated(&json!(3)), None);
    }
}
