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
use std::sync::LazyLock;

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
    format!("{}:{{*", glob_escape(&escape(namespace)))
}

/// `s` with the glob metacharacters of `SCAN ... MATCH` backslash-escaped.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The `SCAN ... MATCH` pattern that matches every record key of `scope` in `namespace` and
/// nothing else: the record key's layout up to the key, then `*`.
pub(crate) fn scope_scan_pattern(namespace: &str, scope: &str) -> String {
    let scope = escape(scope);
    format!(
        "{}:{{{}:{}:*",
        glob_escape(&escape(namespace)),
        scope.len(),
        glob_escape(&scope)
    )
}

/// How many hash slots a Redis Cluster has.
pub(crate) const SLOTS: u16 = 16_384;

/// The Redis Cluster slot of `key`: CRC16 (XMODEM) of its hash tag (the text between the first
/// `{` and the next `}`, when not empty), or of the whole key, modulo 16384 (the Redis Cluster
/// specification, "Keys distribution model").
pub(crate) fn slot_of(key: &[u8]) -> u16 {
    let tag = key.iter().position(|b| *b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|b| *b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tag.unwrap_or(key)) % SLOTS
}

/// For each slot, a hash tag that lands in it: the smallest decimal number whose CRC16 does
/// (found once per process, about 150,000 CRCs; every process finds the same ones).
static SLOT_TAGS: LazyLock<Vec<u32>> = LazyLock::new(|| {
    let mut tags = vec![u32::MAX; usize::from(SLOTS)];
    let mut missing = usize::from(SLOTS);
    let mut n: u32 = 0;
    while missing > 0 {
        let slot = usize::from(slot_of(n.to_string().as_bytes()));
        if tags[slot] == u32::MAX {
            tags[slot] = n;
            missing -= 1;
        }
        n += 1;
    }
    tags
});

/// One of a record's maintenance indexes (see [`RedisStore`](crate::RedisStore), "The
/// maintenance index").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum IndexKind {
    /// In-flight records not marked for a person, scored by lease end (epoch milliseconds):
    /// what [`Maintenance::list_abandoned`](oncely_core::Maintenance::list_abandoned) reads.
    Lease,
    /// In-flight records marked for a person, scored by when they were marked (epoch
    /// milliseconds): what [`Maintenance::list_marked`](oncely_core::Maintenance::list_marked)
    /// reads.
    Marked,
    /// Every record written under [`ClockSource::Application`](crate::ClockSource), scored by
    /// retention end (epoch milliseconds): what
    /// [`Maintenance::reap`](oncely_core::Maintenance::reap) reads under that clock (under the
    /// server clock Redis expiry reaps, and this index is not written).
    Retention,
}

impl IndexKind {
    /// The three kinds, in the order the scripts take their keys (`KEYS[2]`, `KEYS[3]`,
    /// `KEYS[4]`).
    pub(crate) const ALL: [Self; 3] = [Self::Lease, Self::Marked, Self::Retention];

    fn name(self) -> &'static str {
        match self {
            Self::Lease => "lease",
            Self::Marked => "marked",
            Self::Retention => "retention",
        }
    }
}

/// The index key of `kind`: `<namespace>:index:<kind>` on one endpoint, and on a Redis Cluster
/// one per slot, `<namespace>:index:<kind>:{<tag>}` with a tag that lands in `slot` (so that a
/// script can change a record and its index entries in one atomic step: Cluster refuses a
/// script whose keys are in different slots). `slot` is `None` on one endpoint.
pub(crate) fn index_key(namespace: &str, kind: IndexKind, slot: Option<u16>) -> String {
    let base = format!("{}:index:{}", escape(namespace), kind.name());
    match slot {
        None => base,
        Some(slot) => format!("{base}:{{{}}}", SLOT_TAGS[usize::from(slot % SLOTS)]),
    }
}

/// The key that records when the last walk of the whole namespace started (see
/// [`RedisStore::rebuild_index`](crate::RedisStore::rebuild_index)): `<namespace>:index:walk`.
pub(crate) fn walk_key(namespace: &str) -> String {
    format!("{}:index:walk", escape(namespace))
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
        assert_eq!(scope_scan_pattern("oncely", "acct_1"), "oncely:{6:acct_1:*");
        // The length is the escaped scope's, and the glob escapes come after it.
        assert_eq!(scope_scan_pattern("n*", "a}*"), "n\\*:{5:a%7D\\*:*");
    }

    #[test]
    fn slots_follow_the_cluster_spec() {
        // The examples of the Redis Cluster specification, and what `CLUSTER KEYSLOT` answers.
        for (key, slot) in [
            (&b"123456789"[..], 12739),
            (b"foo", 12182),
            (b"foo{}{bar}", 8363),
            (b"foo{{bar}}zap", 4015),
            (b"{user1000}.following", 3443),
            (b"oncely:{6:acct_1:k-1}", 13525),
        ] {
            assert_eq!(slot_of(key), slot, "{}", String::from_utf8_lossy(key));
        }
    }

    #[test]
    fn every_slot_has_an_index_key_in_it() {
        for slot in 0..SLOTS {
            let k = index_key("o{n}", IndexKind::Lease, Some(slot));
            assert_eq!(slot_of(k.as_bytes()), slot, "{k}");
            assert!(k.starts_with("o%7Bn%7D:index:lease:{"), "{k}");
            // Never a record key, whatever the namespace: a record's tag has two colons.
            assert_eq!(parse_record_key("o{n}:index:lease", k.as_bytes()), None);
        }
        let rec = record_key("oncely", &id("acct_1", "k-1"));
        let slot = slot_of(rec.as_bytes());
        for kind in IndexKind::ALL {
            let k = index_key("oncely", kind, Some(slot));
            assert_eq!(slot_of(k.as_bytes()), slot_of(rec.as_bytes()), "{k} {rec}");
        }
        assert_eq!(
            index_key("oncely", IndexKind::Marked, None),
            "oncely:index:marked"
        );
    }
}
