//! Where a request's key goes: in its header, or written into the JSON body at a pointer.

use super::request::{Key, Probe};
use crate::audit::config::KeyPlacement;
use bytes::Bytes;
use http::{HeaderName, HeaderValue};

/// What stands for the key in a body whose key is at a JSON Pointer, until a request is sent:
/// the body variants (reordered, mutated) carry it through unchanged, and each request writes
/// its own key in its place.
pub(crate) const KEY_PLACEHOLDER: &str = "__oncely_audit_key__";

/// The body as the audit holds it until a request is sent: with the key at a JSON Pointer,
/// the member at that pointer is set to [`KEY_PLACEHOLDER`] (when its parent is an object);
/// with the key in a header, the body unchanged.
pub(crate) fn with_placeholder(
    mut body: serde_json::Value,
    placement: &KeyPlacement,
) -> serde_json::Value {
    if let KeyPlacement::JsonPointer(ptr) = placement {
        set_pointer(
            &mut body,
            ptr,
            serde_json::Value::String(KEY_PLACEHOLDER.to_owned()),
        );
    }
    body
}

/// The key's headers and the body a probe sends: the key in its header, or written into the
/// body at its JSON Pointer (removed for "no key", written twice for "the key twice").
pub(crate) fn materialize(
    placement: &KeyPlacement,
    p: &Probe,
) -> (Vec<(HeaderName, HeaderValue)>, Option<Bytes>) {
    let name = match placement {
        KeyPlacement::Header(name) => name,
        KeyPlacement::JsonPointer(ptr) => return (Vec::new(), key_in_body(p, ptr)),
    };
    let headers = match &p.key {
        Key::Absent => Vec::new(),
        Key::One(v) => vec![(name.clone(), v.clone())],
        Key::Repeated(a, b) => vec![(name.clone(), a.clone()), (name.clone(), b.clone())],
    };
    (headers, p.body.clone())
}

/// Sets the member named by the JSON Pointer `ptr` (RFC 6901) to `value`, when its parent is
/// an object; `false` otherwise.
fn set_pointer(v: &mut serde_json::Value, ptr: &str, value: serde_json::Value) -> bool {
    let Some((parent, name)) = split_pointer(ptr) else {
        return false;
    };
    match v
        .pointer_mut(parent)
        .and_then(serde_json::Value::as_object_mut)
    {
        Some(o) => {
            o.insert(name, value);
            true
        }
        None => false,
    }
}

/// The body of a probe whose key goes at the JSON Pointer `ptr`: the placeholder replaced by the
/// key (a JSON string), by the key twice (`"id":"a","id":"b"` in one object), or removed with
/// its member for a keyless probe. Bodies without the placeholder are sent as they are.
fn key_in_body(p: &Probe, ptr: &str) -> Option<Bytes> {
    let body = p.body.as_ref()?;
    let token = serde_json::Value::String(KEY_PLACEHOLDER.to_owned()).to_string();
    let text = String::from_utf8_lossy(body);
    if !text.contains(&token) {
        return Some(body.clone());
    }
    let string = |v: &HeaderValue| {
        serde_json::Value::String(String::from_utf8_lossy(v.as_bytes()).into_owned()).to_string()
    };
    let replaced = match &p.key {
        Key::One(v) => text.replace(&token, &string(v)),
        Key::Repeated(a, b) => {
            let name = split_pointer(ptr).map(|(_, n)| n).unwrap_or_default();
            let name = serde_json::Value::String(name).to_string();
            text.replace(&token, &format!("{},{name}:{}", string(a), string(b)))
        }
        Key::Absent => match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(mut v) => {
                if let Some((parent, name)) = split_pointer(ptr)
                    && let Some(o) = v
                        .pointer_mut(parent)
                        .and_then(serde_json::Value::as_object_mut)
                {
                    o.remove(&name);
                }
                v.to_string()
            }
            Err(_) => text.into_owned(),
        },
    };
    Some(Bytes::from(replaced))
}

/// A pointer's parent pointer and its last member name, unescaped (`~1` is `/`, `~0` is `~`).
fn split_pointer(ptr: &str) -> Option<(&str, String)> {
    let i = ptr.rfind('/')?;
    Some((
        &ptr[..i],
        ptr[i + 1..].replace("~1", "/").replace("~0", "~"),
    ))
}
