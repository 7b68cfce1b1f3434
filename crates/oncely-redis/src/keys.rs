//! Where a record lives: one Redis hash per `(scope, key)`, at a key whose hash tag covers the
//! whole identity.
//!
//! The layout is `<namespace>:{<scope-len>:<scope>:<key>}` where `<scope>` and `<key>` are
//! percent-escaped (`%` -> `%25`, `{` -> `%7B`, `}` -> `%7D`) and `<scope-len>` is the byte
//! length of the escaped scope. Why each part:
//!
//! - **The braces** are a Redis Cluster hash tag: Cluster hashes only what is between the first
//!   `{` and the next `}`, so everything one record ever needs maps to one slot, and every
//!   script touches exactly one key (Cluster refuses cross-slot scripts).
//! - **The escaping** keeps a `}` in a scope or key from ending the hash tag early, and keeps a
//!   `{` in the namespace impossible (so the tag is always the identity).
//! - **The length prefix** makes the split between scope and key unambiguous even though both
//!   may contain `:`: `("a:b", "c")` and `("a", "b:c")` are different keys (records are unique
//!   on `(scope, key)`, and two pairs must never collide: `docs/DESIGN.md`, "Keys shared across
//!   tenants").

use oncely_core::{IdempotencyKey, RecordKey, Scope};

/// The default namespace (key prefix): `oncely`.
pub const DEFAULT_NAMESPACE: &str = "oncely";

/// Percent-escapes `%`, `{` and `}` (an injective encoding: `%` itself is escaped).
pub(crate) fn escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '%' => out.push_str("%25"),
            '{' => out.push_str("%7B"),
            '}' => out.push_str("%7D"),
            c => out.push(c),
        }
    }
    out
}

/// The Redis key of one record: `<namespace>:{<scope-len>:<scope>:<key>}` (see the module
/// docs). `namespace` is escaped the same way, so it can never contain a brace.
pub fn record_key(namespace: &str, id: &RecordKey) -> String {
    let scope = escape(id.scope.as_str());
    let key = escape(id.key.as_str());
    format!(
        "{}:{{{}:{}:{}}}",
        escape(namespace),
        scope.len(),
        scope,
        key
    )
}

/// Undoes [`escape`]; `None` for text that [`escape`] cannot have written (a `{`, a `}`, or a
/// `%` not followed by `25`, `7B` or `7D`).
fn unescape(s: &str) -> Option<String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find(['%', '{', '}']) {
        out.push_str(&rest[..i]);
        let c = match rest.get(i..i + 3)? {
            "%25" => '%',
            "%7B" => '{',
            "%7D" => '}',
            _ => return None,
        };
        out.push(c);
        rest = &rest[i + 3..];
    }
    out.push_str(rest);
    Some(out)
}

/// The identity a record key of `namespace` names: the inverse of [`record_key`]. `None` when
/// `key` is not such a key (another namespace, or not of the layout at all).
pub(crate) fn parse_record_key(namespace: &str, key: &[u8]) -> Option<RecordKey> {
    let key = std::str::from_utf8(key).ok()?;
    let tag = key
        .strip_prefix(escape(namespace).as_str())?
        .strip_prefix(":{")?
        .strip_suffix('}')?;
    let (len, rest) = tag.split_once(':')?;
    let len: usize = len.parse().ok()?;
    let scope = rest.get(..len)?;
    let k = rest.get(len..)?.strip_prefix(':')?;
    Some(RecordKey::new(
        Scope::new(unescape(scope)?),
        IdempotencyKey::new(&unescape(k)?).ok()?,
    ))
}

/// The `SCAN ... MATCH` pattern that matches every record key of `namespace` and nothing else:
/// the escaped namespace with glob metacharacters backslash-escaped, then `:{*`.
pub(crate) fn scan_pattern(namespace: &str) -> String {
    let mut out = String::new();
    for c in escape(namespace).chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out.push_str(":{*");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(scope: &str, key: &str) -> RecordKey {
        RecordKey::new(Scope::new(scope), IdempotencyKey::new(key).unwrap())
    }

    #[test]
    fn layout_is_length_prefixed_and_tagged() {
        assert_eq!(
            record_key("oncely", &id("acct_1", "k-1")),
            "oncely:{6:acct_1:k-1}"
        );
        assert_eq!(
            record_key("oncely", &id("a}b", "{x}")),
            "oncely:{5:a%7Db:%7Bx%7D}"
        );
        assert_eq!(record_key("o{n}", &id("a", "b")), "o%7Bn%7D:{1:a:b}");
    }

    #[test]
    fn colons_never_make_two_identities_collide() {
        assert_ne!(
            record_key("oncely", &id("a:b", "c")),
            record_key("oncely", &id("a", "b:c"))
        );
        assert_ne!(
            record_key("oncely", &id("a%7D", "c")),
            record_key("oncely", &id("a}", "c"))
        );
    }

    #[test]
    fn the_hash_tag_is_the_whole_identity() {
        // Cluster hashes the text between the first '{' and the next '}'.
        let k = record_key("ns", &id("te}n{ant", "ke}y"));
        let open = k.find('{').unwrap();
        let close = open + k[open..].find('}').unwrap();
        assert_eq!(close, k.len() - 1, "the tag must end at the last byte: {k}");
    }

    #[test]
    fn record_keys_parse_back_to_their_identity() {
        for (ns, scope, key) in [
            ("oncely", "acct_1", "k-1"),
            ("oncely", "a:b", "c"),
            ("oncely", "a", "b:c"),
            ("o{n}%", "te}n{ant%7D", "ke}y%"),
            ("ns:x", "", "k"),
        ] {
            let want = id(scope, key);
            let k = record_key(ns, &want);
            assert_eq!(parse_record_key(ns, k.as_bytes()), Some(want), "{k}");
        }
        assert_eq!(parse_record_key("other", b"oncely:{1:a:b}"), None);
        for bad in [
            &b"oncely:{1:a:b"[..],
            b"oncely:{9:a:b}",
            b"oncely:{x:a:b}",
            b"oncely:{1:ab}",
            b"oncely:{1:%:b}",
            b"oncely:{1:a:b}c}",
            b"oncely:{1:a:}",
            b"oncely:{1:a:\xff}",
        ] {
            assert_eq!(parse_record_key("oncely", bad), None, "{bad:?}");
        }
    }

    #[test]
    fn scan_pattern_escapes_globs() {
        assert_eq!(scan_pattern("oncely"), "oncely:{*");
        assert_eq!(scan_pattern("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\:{*");
    }
}
