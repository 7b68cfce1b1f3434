//! The store URL (one endpoint or a Redis Cluster, plus Oncely's own options) and the
//! connection behind it.

use crate::error::InvalidUrl;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use redis::{Cmd, FromRedisValue, Pipeline, RedisError, RedisFuture, RedisResult, Value};
use std::time::Duration;

/// Where the store connects, parsed from its URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Endpoint {
    /// One Redis: the URL as the redis crate takes it (Oncely's options removed).
    Single(String),
    /// A Redis Cluster: one `redis://` or `rediss://` URL per seed node.
    Cluster(Vec<String>),
}

/// Oncely's own query parameters, removed from the URL before the redis crate sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct UrlOptions {
    pub(crate) namespace: Option<String>,
    pub(crate) accept_volatile: Option<bool>,
    pub(crate) wait_replicas: Option<u32>,
    pub(crate) wait_timeout: Option<Duration>,
}

fn bool_param(name: &str, v: &str) -> Result<bool, InvalidUrl> {
    match v {
        "true" | "1" | "yes" => Ok(true),
        "false" | "0" | "no" => Ok(false),
        _ => Err(InvalidUrl(format!("{name}={v:?}: expected true or false"))),
    }
}

/// Splits `url` into the endpoint and Oncely's options.
///
/// Forms: `redis://…` and `rediss://…` (one endpoint, as the redis crate reads it), and
/// `redis+cluster://[user[:password]@]host:port[,host:port…]` (or `rediss+cluster://` for
/// TLS): the seed nodes of a Redis Cluster, credentials shared by every node, no database
/// number (a cluster has only database 0). Oncely's query parameters are `namespace`,
/// `accept_volatile`, `wait_replicas` and `wait_timeout_ms`; any other parameter is passed on
/// to the redis crate.
pub(crate) fn parse(url: &str) -> Result<(Endpoint, UrlOptions), InvalidUrl> {
    let (base, query) = match url.split_once('?') {
        Some((b, q)) => (b, Some(q)),
        None => (url, None),
    };
    let mut options = UrlOptions::default();
    let mut rest: Vec<&str> = Vec::new();
    for pair in query
        .into_iter()
        .flat_map(|q| q.split('&'))
        .filter(|p| !p.is_empty())
    {
        let (name, value) = pair.split_once('=').unwrap_or((pair, ""));
        match name {
            "namespace" => {
                if value.is_empty() {
                    return Err(InvalidUrl(
                        "namespace=\"\": expected a key prefix of at least one character".into(),
                    ));
                }
                options.namespace = Some(value.to_owned());
            }
            "accept_volatile" => options.accept_volatile = Some(bool_param(name, value)?),
            "wait_replicas" => {
                options.wait_replicas = Some(value.parse().map_err(|_| {
                    InvalidUrl(format!(
                        "wait_replicas={value:?}: expected a number of replicas (0 or more)"
                    ))
                })?);
            }
            "wait_timeout_ms" => {
                let ms: u64 = value.parse().ok().filter(|ms| *ms > 0).ok_or_else(|| {
                    InvalidUrl(format!(
                        "wait_timeout_ms={value:?}: expected milliseconds, at least 1"
                    ))
                })?;
                options.wait_timeout = Some(Duration::from_millis(ms));
            }
            _ => rest.push(pair),
        }
    }
    let passthrough = if rest.is_empty() {
        String::new()
    } else {
        format!("?{}", rest.join("&"))
    };
    let (scheme, after) = base
        .split_once("://")
        .ok_or_else(|| InvalidUrl(format!("{url:?} has no scheme (expected redis://…)")))?;
    let endpoint = match scheme {
        "redis+cluster" | "rediss+cluster" => {
            let node_scheme = scheme.trim_end_matches("+cluster");
            let (userinfo, hosts) = match after.rsplit_once('@') {
                Some((u, h)) => (Some(u), h),
                None => (None, after),
            };
            let hosts = hosts.strip_suffix('/').unwrap_or(hosts);
            if hosts.contains('/') {
                return Err(InvalidUrl(format!(
                    "{scheme}:// takes host:port seeds and no database number (a Redis Cluster has only database 0): {hosts:?}"
                )));
            }
            let seeds: Vec<String> = hosts
                .split(',')
                .map(|h| {
                    if h.is_empty() {
                        return Err(InvalidUrl(format!("empty seed node in {hosts:?}")));
                    }
                    let auth = userinfo.map(|u| format!("{u}@")).unwrap_or_default();
                    Ok(format!("{node_scheme}://{auth}{h}{passthrough}"))
                })
                .collect::<Result<_, _>>()?;
            Endpoint::Cluster(seeds)
        }
        "redis" | "rediss" | "redis+unix" | "unix" | "valkey" | "valkeys" => {
            Endpoint::Single(format!("{base}{passthrough}"))
        }
        other => {
            return Err(InvalidUrl(format!(
                "unknown scheme {other}:// (expected redis://, rediss://, redis+cluster:// or rediss+cluster://)"
            )));
        }
    };
    Ok((endpoint, options))
}

/// One connection for the whole store: a reconnecting single-endpoint manager, or a cluster
/// connection (which keeps one multiplexed connection per node, follows `MOVED`/`ASK`
/// redirects and refreshes the slot map after a failover by itself).
#[derive(Clone)]
pub(crate) enum Conn {
    Single(ConnectionManager),
    Cluster(ClusterConnection),
}

/// One primary to walk with `SCAN`.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Primary {
    /// The only server.
    Only,
    /// The primary serving this slot (one slot per primary, from `CLUSTER SLOTS`).
    Slot(u16),
}

impl Conn {
    pub(crate) async fn open(endpoint: &Endpoint, timeout: Duration) -> RedisResult<Self> {
        match endpoint {
            Endpoint::Single(url) => {
                let client = redis::Client::open(url.as_str())?;
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(Some(timeout))
                    .set_min_delay(Duration::from_millis(50))
                    .set_max_delay(Duration::from_millis(500))
                    .set_number_of_retries(6);
                Ok(Self::Single(
                    ConnectionManager::new_with_config(client, config).await?,
                ))
            }
            Endpoint::Cluster(seeds) => {
                let client = ClusterClientBuilder::new(seeds.iter().map(String::as_str))
                    .connection_timeout(timeout)
                    .response_timeout(timeout)
                    // Redirects and a topology refresh after a failover are retried within the
                    // store's own operation timeout (which bounds every call).
                    .retries(6)
                    .min_retry_wait(50)
                    .max_retry_wait(500)
                    .build()?;
                Ok(Self::Cluster(client.get_async_connection().await?))
            }
        }
    }

    pub(crate) fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }

    /// The primaries to walk: the one server, or one slot per primary of the cluster (read
    /// from `CLUSTER SLOTS` now, so a failover since the last walk is taken into account).
    pub(crate) async fn primaries(&mut self) -> RedisResult<Vec<Primary>> {
        let Self::Cluster(c) = self else {
            return Ok(vec![Primary::Only]);
        };
        let v = c
            .route_command(
                redis::cmd("CLUSTER").arg("SLOTS").clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary),
            )
            .await?;
        // Each entry: [start, end, [host, port, id, ...], replicas...].
        let ranges: Vec<(i64, i64, (String, i64))> = {
            let rows: Vec<Vec<Value>> = redis::from_redis_value(v)?;
            let mut out = Vec::new();
            for row in rows {
                let mut it = row.into_iter();
                let (Some(start), Some(end), Some(primary)) = (it.next(), it.next(), it.next())
                else {
                    return Err(invalid("CLUSTER SLOTS: short entry"));
                };
                let start: i64 = redis::from_redis_value(start)?;
                let end: i64 = redis::from_redis_value(end)?;
                let node: Vec<Value> = redis::from_redis_value(primary)?;
                let mut node = node.into_iter();
                let (Some(host), Some(port)) = (node.next(), node.next()) else {
                    return Err(invalid("CLUSTER SLOTS: node without address"));
                };
                out.push((
                    start,
                    end,
                    (
                        redis::from_redis_value::<String>(host)?,
                        redis::from_redis_value::<i64>(port)?,
                    ),
                ));
            }
            out
        };
        let mut seen = std::collections::HashSet::new();
        let mut primaries = Vec::new();
        for (start, end, node) in ranges {
            if !(0..16384).contains(&start) || end < start {
                return Err(invalid("CLUSTER SLOTS: slot out of range"));
            }
            if seen.insert(node) {
                primaries.push(Primary::Slot(start as u16));
            }
        }
        if primaries.is_empty() {
            return Err(invalid("CLUSTER SLOTS: no slot is served"));
        }
        Ok(primaries)
    }

    /// Runs `cmd` on `primary`.
    pub(crate) async fn query_on<T: FromRedisValue>(
        &mut self,
        primary: Primary,
        cmd: &Cmd,
    ) -> RedisResult<T> {
        match (self, primary) {
            (Self::Cluster(c), Primary::Slot(slot)) => {
                let v = c
                    .route_command(
                        cmd.clone(),
                        RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(Route::new(
                            slot,
                            SlotAddr::Master,
                        ))),
                    )
                    .await?;
                Ok(redis::from_redis_value(v)?)
            }
            (conn, _) => cmd.query_async(conn).await,
        }
    }

    /// Runs `pipe` on `primary` (its commands may name keys of different slots, as long as
    /// that primary serves them all).
    pub(crate) async fn pipeline_on<T: FromRedisValue>(
        &mut self,
        primary: Primary,
        pipe: &Pipeline,
    ) -> RedisResult<T> {
        match (self, primary) {
            (Self::Cluster(c), Primary::Slot(slot)) => {
                let n = pipe.len();
                let values = c
                    .route_pipeline(
                        pipe.clone(),
                        0,
                        n,
                        SingleNodeRoutingInfo::SpecificNode(Route::new(slot, SlotAddr::Master)),
                    )
                    .await?;
                for v in &values {
                    if let Value::ServerError(e) = v {
                        return Err(RedisError::from(e.clone()));
                    }
                }
                Ok(redis::from_redis_value(Value::Array(values))?)
            }
            (conn, _) => pipe.query_async(conn).await,
        }
    }

    /// Runs `cmd` on every node (primaries and replicas) and returns each node's answer, a
    /// server error as `Err`.
    pub(crate) async fn on_every_node(
        &mut self,
        cmd: &Cmd,
    ) -> RedisResult<Vec<(String, RedisResult<Value>)>> {
        match self {
            Self::Single(c) => {
                let r: RedisResult<Value> = cmd.query_async(c).await;
                Ok(vec![(String::new(), r)])
            }
            Self::Cluster(c) => {
                let v = c
                    .route_command(
                        cmd.clone(),
                        RoutingInfo::MultiNode((MultipleNodeRoutingInfo::AllNodes, None)),
                    )
                    .await?;
                let Value::Map(entries) = v else {
                    return Err(invalid("expected one answer per node"));
                };
                let mut out = Vec::with_capacity(entries.len());
                for (node, answer) in entries {
                    let node: String = redis::from_redis_value(node)?;
                    let answer = match answer {
                        Value::ServerError(e) => Err(RedisError::from(e)),
                        v => Ok(v),
                    };
                    out.push((node, answer));
                }
                out.sort_by(|a, b| a.0.cmp(&b.0));
                Ok(out)
            }
        }
    }
}

fn invalid(what: &'static str) -> RedisError {
    RedisError::from((redis::ErrorKind::UnexpectedReturnType, what))
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_urls_pass_through_without_oncely_options() {
        let (e, o) =
            parse("redis://:pw@h:6379/2?accept_volatile=true&protocol=resp3&namespace=run-1:a")
                .unwrap();
        assert_eq!(
            e,
            Endpoint::Single("redis://:pw@h:6379/2?protocol=resp3".into())
        );
        assert_eq!(o.accept_volatile, Some(true));
        assert_eq!(o.namespace.as_deref(), Some("run-1:a"));
        assert_eq!(o.wait_replicas, None);
        let (e, o) = parse("redis://127.0.0.1:6379").unwrap();
        assert_eq!(e, Endpoint::Single("redis://127.0.0.1:6379".into()));
        assert_eq!(o, UrlOptions::default());
    }

    #[test]
    fn cluster_urls_become_one_seed_per_node() {
        let (e, o) = parse(
            "redis+cluster://u:p@127.0.0.1:7100,127.0.0.1:7101/?wait_replicas=2&wait_timeout_ms=250",
        )
        .unwrap();
        assert_eq!(
            e,
            Endpoint::Cluster(vec![
                "redis://u:p@127.0.0.1:7100".into(),
                "redis://u:p@127.0.0.1:7101".into()
            ])
        );
        assert_eq!(o.wait_replicas, Some(2));
        assert_eq!(o.wait_timeout, Some(Duration::from_millis(250)));
        let (e, _) = parse("rediss+cluster://a:1").unwrap();
        assert_eq!(e, Endpoint::Cluster(vec!["rediss://a:1".into()]));
    }

    #[test]
    fn bad_urls_say_what_is_wrong() {
        for (url, says) in [
            ("redis+cluster://a:1,a:2/3", "no database number"),
            ("redis+cluster://a:1,,a:2", "empty seed"),
            ("redis://a?wait_replicas=-1", "wait_replicas"),
            ("redis://a?wait_timeout_ms=0", "wait_timeout_ms"),
            ("redis://a?accept_volatile=maybe", "accept_volatile"),
            ("redis://a?namespace=", "namespace"),
            ("http://a", "unknown scheme"),
            ("a:1", "no scheme"),
        ] {
            let e = parse(url).unwrap_err().to_string();
            assert!(e.contains(says), "{url}: {e}");
        }
    }
}
