//! Reading an OpenAPI document from JSON or YAML text into one order-preserving tree.

use super::error::LintError;
use serde_norway::Value;

/// Parses `text` as JSON when its first non-blank character is `{`, as YAML otherwise.
///
/// Both land in a [`serde_norway::Value`], whose mappings keep document order (so findings come
/// out in the order a reader sees the operations) and whose keys may be non-strings (YAML's
/// unquoted `200:` response codes). Why not "try JSON, then YAML": a broken JSON document would
/// then be reported with a YAML parser's message, which points at the wrong problem.
pub(crate) fn parse(text: &str) -> Result<Value, LintError> {
    let trimmed = text.trim_start_matches('\u{feff}').trim_start();
    if trimmed.is_empty() {
        return Err(LintError::Empty);
    }
    let mut value = if trimmed.starts_with('{') {
        serde_json::from_str::<Value>(trimmed).map_err(|e| LintError::Json {
            line: e.line(),
            column: e.column(),
            message: e.to_string(),
        })?
    } else {
        let mut v = serde_norway::from_str::<Value>(trimmed).map_err(|e| {
            let (line, column) = e.location().map_or((0, 0), |l| (l.line(), l.column()));
            LintError::Yaml {
                line,
                column,
                message: e.to_string(),
            }
        })?;
        // `<<: *anchor` merge keys, common in hand-written specs.
        v.apply_merge().map_err(|e| LintError::Yaml {
            line: 0,
            column: 0,
            message: e.to_string(),
        })?;
        v
    };
    // Tags (`!something`) carry no meaning in OpenAPI; look through them.
    strip_tags(&mut value);
    Ok(value)
}

fn strip_tags(value: &mut Value) {
    match value {
        Value::Tagged(tagged) => {
            let inner = std::mem::take(&mut tagged.value);
            *value = inner;
            strip_tags(value);
        }
        Value::Sequence(seq) => seq.iter_mut().for_each(strip_tags),
        Value::Mapping(map) => map.values_mut().for_each(strip_tags),
        _ => {}
    }
}

/// The mapping entry whose key, as text, is `key` (YAML keys may be numbers or booleans).
pub(crate) fn get<'a>(value: &'a Value, key: &str) -> Option<&'a Value> {
    let Value::Mapping(map) = value else {
        return None;
    };
    map.iter()
        .find(|(k, _)| key_text(k).as_deref() == Some(key))
        .map(|(_, v)| v)
}

/// A mapping key as text: strings as they are, numbers and booleans printed.
pub(crate) fn key_text(key: &Value) -> Option<String> {
    match key {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Null => Some("null".to_owned()),
        _ => None,
    }
}
