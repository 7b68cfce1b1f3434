//! What Redis keeps of an acknowledged write: the persistence check at connect time (the `WAIT`
//! for replicas after each write that matters is in [`RedisStore`](crate::RedisStore)'s
//! writes).

use crate::conn::Conn;
use crate::persistence::{Persistence, classify};
use redis::{RedisResult, Value};
use std::collections::HashMap;

fn config_value(v: Value, name: &str) -> RedisResult<Option<String>> {
    let map: HashMap<String, String> = redis::from_redis_value(v)?;
    Ok(map.get(name).cloned())
}

/// Reads the persistence of every node (the one endpoint, or every primary and replica of a
/// cluster): `(node, persistence)`, the node empty for a single endpoint.
pub(crate) async fn read(conn: &mut Conn) -> RedisResult<Vec<(String, Persistence)>> {
    let mut settings: HashMap<String, [Option<String>; 3]> = HashMap::new();
    let mut refused: HashMap<String, String> = HashMap::new();
    for (i, name) in ["appendonly", "appendfsync", "save"]
        .into_iter()
        .enumerate()
    {
        let answers = conn
            .on_every_node(redis::cmd("CONFIG").arg("GET").arg(name))
            .await?;
        for (node, answer) in answers {
            match answer {
                Ok(v) => settings.entry(node).or_default()[i] = config_value(v, name)?,
                Err(e) => {
                    refused.entry(node).or_insert_with(|| e.to_string());
                }
            }
        }
    }
    let mut out = Vec::new();
    for (node, [appendonly, appendfsync, save]) in settings {
        if refused.contains_key(&node) {
            continue;
        }
        out.push((
            node,
            classify(
                appendonly.as_deref(),
                appendfsync.as_deref(),
                save.as_deref(),
            ),
        ));
    }
    if !refused.is_empty() {
        // Managed services often rename or forbid CONFIG; INFO says at least whether the
        // append-only file is on.
        let answers = conn
            .on_every_node(redis::cmd("INFO").arg("persistence"))
            .await?;
        for (node, answer) in answers {
            let Some(why) = refused.get(&node) else {
                continue;
            };
            let info: String = match answer {
                Ok(v) => redis::from_redis_value(v)?,
                Err(e) => return Err(e),
            };
            let aof_on = info.lines().any(|l| l.trim() == "aof_enabled:1");
            out.push((
                node,
                if aof_on {
                    Persistence::AppendOnlyUnknownFsync
                } else {
                    Persistence::Unconfirmed(why.clone())
                },
            ));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    Ok(out)
}

/// The eviction risk of one node, from its `INFO memory`: `Some(warning)` when it has a memory
/// limit (`maxmemory` above 0) and a `maxmemory_policy` other than `noeviction`. Every policy
/// but `noeviction` may delete idempotency records under memory pressure (`volatile-*` ones
/// too: every record carries its retention as a TTL), and a retry of an evicted record runs
/// again as new.
pub(crate) fn eviction_warning(info: &str) -> Option<String> {
    let field = |name: &str| {
        info.lines()
            .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
            .map(str::trim)
    };
    let limit: u64 = field("maxmemory")?.parse().ok()?;
    let policy = field("maxmemory_policy")?;
    (limit > 0 && policy != "noeviction").then(|| {
        format!(
            "maxmemory-policy {policy} with maxmemory {limit} bytes: Redis may evict idempotency records under memory pressure, and a retry of an evicted one executes again (a split store's progress ledger still replays it or answers a mismatch). Set maxmemory-policy noeviction: a full Redis then refuses new claims (503) instead of forgetting old ones"
        )
    })
}

/// [`eviction_warning`] of every node that has one: `(node, warning)`; a node whose `INFO`
/// is refused is left out (nothing to say about it).
pub(crate) async fn eviction(conn: &mut Conn) -> RedisResult<Vec<(String, String)>> {
    let answers = conn.on_every_node(redis::cmd("INFO").arg("memory")).await?;
    let mut out = Vec::new();
    for (node, answer) in answers {
        let Ok(v) = answer else { continue };
        let info: String = redis::from_redis_value(v)?;
        if let Some(w) = eviction_warning(&info) {
            out.push((node, w));
        }
    }
    out.sort();
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::eviction_warning;

    /// `INFO memory` as Redis 7 prints it (CRLF line ends), cut to the lines read.
    fn info(limit: &str, policy: &str) -> String {
        format!(
            "# Memory\r\nused_memory:1045000\r\nmaxmemory:{limit}\r\nmaxmemory_human:0B\r\nmaxmemory_policy:{policy}\r\n"
        )
    }

    #[test]
    fn a_memory_limit_with_an_evicting_policy_is_warned_about() {
        let w = eviction_warning(&info("3145728", "allkeys-lru")).unwrap();
        assert!(
            w.starts_with("maxmemory-policy allkeys-lru with maxmemory 3145728 bytes"),
            "{w}"
        );
        assert!(eviction_warning(&info("3145728", "volatile-ttl")).is_some());
        // No limit: nothing is ever evicted, whatever the policy.
        assert_eq!(eviction_warning(&info("0", "allkeys-lru")), None);
        assert_eq!(eviction_warning(&info("3145728", "noeviction")), None);
        // `maxmemory_human` must not be read as `maxmemory`.
        assert_eq!(
            eviction_warning("maxmemory_human:3M\r\nmaxmemory_policy:allkeys-lru"),
            None
        );
    }
}
