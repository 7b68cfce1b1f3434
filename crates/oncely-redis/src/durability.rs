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
