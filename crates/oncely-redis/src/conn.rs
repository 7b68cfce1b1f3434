//! The connection behind the store: one reconnecting endpoint or a Redis Cluster, and routing a
//! command to one primary or to every node.

use crate::url::Endpoint;
use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClientBuilder;
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{
    MultipleNodeRoutingInfo, Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
};
use redis::{Cmd, FromRedisValue, Pipeline, RedisError, RedisFuture, RedisResult, Value};
use std::time::Duration;

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
        Ok(self
            .slots_by_primary()
            .await?
            .into_iter()
            .map(|(p, _)| p)
            .collect())
    }

    /// Each primary with the slots it serves (from `CLUSTER SLOTS`, read now); the one server
    /// with no slots on one endpoint.
    pub(crate) async fn slots_by_primary(&mut self) -> RedisResult<Vec<(Primary, Vec<u16>)>> {
        let Self::Cluster(c) = self else {
            return Ok(vec![(Primary::Only, Vec::new())]);
        };
        let v = c
            .route_command(
                redis::cmd("CLUSTER").arg("SLOTS").clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::RandomPrimary),
            )
            .await?;
        // Each entry: [start, end, [host, port, id, ...], replicas...].
        let rows: Vec<Vec<Value>> = redis::from_redis_value(v)?;
        let mut by_node: Vec<((String, i64), Vec<u16>)> = Vec::new();
        for row in rows {
            let mut it = row.into_iter();
            let (Some(start), Some(end), Some(primary)) = (it.next(), it.next(), it.next()) else {
                return Err(invalid("CLUSTER SLOTS: short entry"));
            };
            let start: i64 = redis::from_redis_value(start)?;
            let end: i64 = redis::from_redis_value(end)?;
            let node: Vec<Value> = redis::from_redis_value(primary)?;
            let mut node = node.into_iter();
            let (Some(host), Some(port)) = (node.next(), node.next()) else {
                return Err(invalid("CLUSTER SLOTS: node without address"));
            };
            let node = (
                redis::from_redis_value::<String>(host)?,
                redis::from_redis_value::<i64>(port)?,
            );
            let (Ok(start), Ok(end)) = (u16::try_from(start), u16::try_from(end)) else {
                return Err(invalid("CLUSTER SLOTS: slot out of range"));
            };
            if end < start || end >= crate::keys::SLOTS {
                return Err(invalid("CLUSTER SLOTS: slot out of range"));
            }
            match by_node.iter_mut().find(|(n, _)| *n == node) {
                Some((_, slots)) => slots.extend(start..=end),
                None => by_node.push((node, (start..=end).collect())),
            }
        }
        if by_node.is_empty() {
            return Err(invalid("CLUSTER SLOTS: no slot is served"));
        }
        Ok(by_node
            .into_iter()
            .map(|(_, slots)| (Primary::Slot(slots[0]), slots))
            .collect())
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
