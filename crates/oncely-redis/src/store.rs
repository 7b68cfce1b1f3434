//! [`RedisStore`]: the [`KeyStore`](oncely_core::KeyStore) on Redis (one endpoint or a Redis
//! Cluster): connecting, and how every script is run. The operations are in `keystore.rs` (the
//! request path) and `maintenance.rs` (the reaper's and the completer's).

use crate::clock::ClockSource;
use crate::config::RedisConfig;
use crate::conn::Conn;
use crate::decode;
use crate::durability;
use crate::error::{ConnectError, OperationTimedOut, ReplicasDidNotAcknowledge, VolatileRedis};
use crate::keys::{self, IndexKind};
use crate::persistence::Persistence;
use crate::scripts::Lua;
use crate::url::{self, Endpoint};
use oncely_core::clock::duration_millis;
use oncely_core::{RecordKey, StoreError, UnixMillis};
use redis::{ErrorKind, RedisResult, ServerErrorKind, Value};
use std::future::Future;
use std::time::Duration;

/// Durations sent to the scripts are capped at 10^15 milliseconds (about 31,700 years) so that
/// every time the scripts compute stays an exact integer in Lua's doubles (below 2^53).
pub(crate) const MAX_DURATION_MS: i64 = 1_000_000_000_000_000;

/// `d` in milliseconds, capped at [`MAX_DURATION_MS`].
pub(crate) fn millis(d: Duration) -> i64 {
    duration_millis(d).min(MAX_DURATION_MS)
}

/// A [`KeyStore`](oncely_core::KeyStore) on Redis: one hash per `(scope, key)`, every write one
/// Lua script; on one endpoint or on a Redis Cluster.
///
/// # Guarantees
///
/// - **Atomic claims.** The claim is one script that implements [`oncely_core::decide`] on the
///   server: it reads the record, compares the fingerprint on every path that finds one
///   (`docs/DESIGN.md`, "Validation skipped on one path"), and writes the new in-flight record,
///   all in one atomic step. There is no `SET NX` lock; losing a race is simply finding the
///   winner's record.
/// - **Fencing.** Every claim sets the record's token to the previous token plus one (a
///   released or past-window record keeps its token, so tokens never restart while the hash
///   lives). `renew`, `checkpoint`, `complete` and `release` each check, in the same script,
///   that the record is in flight with the caller's token; otherwise they change nothing and
///   return [`StoreError::Fenced`].
/// - **Redis Cluster.** Each script touches one record, whose hash tag is the whole
///   `(scope, key)` identity (see [`record_key`](crate::record_key)), and that record's entries
///   in the index keys of its own slot (see "The maintenance index" below), so every script
///   runs atomically on one primary. With a `redis+cluster://` URL the store keeps one
///   connection per node, follows `MOVED`/`ASK` redirects and re-reads the slot map after a
///   failover.
/// - **Durability on restart.** At connect the store reads every node's persistence settings
///   ([`Persistence`]) and refuses a node that keeps nothing ([`ConnectError::Volatile`])
///   unless [`RedisConfig::accept_volatile`] says losing the replay window on restart is
///   acceptable; it logs a warning (`tracing`) for `appendfsync everysec` (up to about one
///   second of records lost in a crash), `appendfsync no` and snapshots only. See
///   [`RedisStore::persistence`].
/// - **Time.** See [`ClockSource`] for the clock rule (the server's clock by default; after a
///   failover, the promoted replica's clock).
/// - **Retention.** Every write sets the hash's TTL to its retention end, so Redis deletes
///   records by itself; [`Maintenance::reap`](oncely_core::Maintenance::reap) only has work to
///   do when an application clock runs ahead of the server's (see there). A record's retention
///   end is never before its live lease's end.
/// - **Failing closed.** A lost connection, a refused one or a round trip slower than the
///   operation timeout is [`StoreError::Unavailable`] (the layer answers `503`); nothing is
///   retried here. The connection reconnects in the background (retries with jittered backoff
///   capped at 500 milliseconds), so the service recovers when Redis does, without a restart.
///   The call that first hits a dropped connection fails; later calls use the new connection
///   once it is up.
///
/// # Failover
///
/// Redis replicates asynchronously: a primary acknowledges a write before any replica has it,
/// and a replica promoted after the primary fails has only what reached it. With
/// [`RedisConfig::wait_replicas`] = N (1 by default on a cluster) every claim, renewal, recovery
/// point and completion is followed, on the same connection, by `WAIT N timeout`, and the store
/// returns `Ok` only when N replicas acknowledged it. What that gives, precisely:
///
/// - **Promised:** a write the store acknowledged (`claim` returned `Claimed`, or `renew`,
///   `checkpoint`, `complete` returned `Ok`) was held by at least N replicas. When the primary
///   fails and one of those replicas is promoted, the record is there: a retry of a claimed
///   request finds it in flight (`409`, then a takeover from its last acknowledged recovery
///   point once the lease lapses), never absent, so it does not execute as new; a retry of a
///   completed request replays the stored response; the fencing token never goes back. Redis
///   Cluster promotes the replica with the largest replication offset, so with one replica per
///   primary and N = 1 (the test setup) the promoted replica always holds every acknowledged
///   write.
/// - **Answered `503`:** when fewer than N replicas acknowledge within the timeout, the store
///   returns [`StoreError::Unavailable`] wrapping [`ReplicasDidNotAcknowledge`] (the layer
///   answers `503 idempotency_store_unavailable`). The write is on the primary and may or may
///   not survive a failover; a claim answered so was never run, and holds the key until its
///   lease lapses. After a failover the new primary has no replica until one (re)joins, so its
///   writes are answered `503` until then.
/// - **Not promised:** with more replicas than N, Redis may promote a replica that had not
///   acknowledged (`WAIT` does not make Redis strongly consistent; the promotion prefers the
///   largest offset but does not check); a replica that restarts without its own persistence
///   loses what it acknowledged; a network partition in which the old primary keeps accepting
///   writes for up to `cluster-node-timeout` loses those writes when it rejoins (they are never
///   acknowledged to us once replicas stop answering, which is why N >= 1 matters). Releases are
///   not waited for: a lost release only keeps the key in flight until its lease lapses.
///   Records read but not written (a replay, an in-flight answer) are answered after the
///   same `WAIT`, so a replay is never served from a write the replicas do not have yet.
///
/// # The maintenance index
///
/// The completer and the reaper ([`Maintenance`](oncely_core::Maintenance)) never walk the
/// records: what they look for is kept in sorted sets ([`IndexKind`]) that the scripts changing
/// a record write in the same atomic step, from the record's fields as they end up: the
/// **lease** index holds the in-flight records not marked for a person, scored by lease end
/// (the abandoned ones are its entries up to `now - grace`); the **marked** index the marked
/// ones, scored by mark time; and, only under [`ClockSource::Application`], the **retention**
/// index every record, scored by retention end (under the server clock Redis expiry reaps and
/// this index is not written). An entry's member is the record's Redis key. A pass reads the
/// entries it needs (lowest score first) and the records they name, and nothing else: its
/// cost follows the work to do, not the records held (`tests/index.rs` counts the commands).
///
/// **Where the index keys live (Redis Cluster).** Cluster refuses a script whose keys are in
/// different hash slots, and every record is in its own slot (its hash tag is its identity,
/// which keeps records spread over the primaries and a record's every operation on one). So a
/// record's entries go to index keys *in the record's slot*: one key per kind and slot,
/// `<namespace>:index:<kind>:{<tag>}`, where `<tag>` is a fixed string that hashes to that slot
/// (the smallest decimal number that does, computed once per process). A single namespace-wide
/// sorted set would be in one slot and could not be written in the same script as the record
/// (a second, non-atomic write would drift on every crash between the two); resharding moves
/// an index key with the records it indexes. The price is that a pass reads one index key per
/// slot, 16,384 `ZRANGE`s pipelined per primary, most of them on keys that do not exist: a
/// fixed cost, whatever the number of records. On one endpoint there is one key per kind,
/// `<namespace>:index:<kind>`, and a pass reads three. An index key's TTL is kept at least
/// as long as its longest-kept entry's record, so Redis expires index keys with the records.
/// A pass that meets a resharding (a slot moved between reading the slot map and reading its
/// index key) fails with [`StoreError::Unavailable`]; the next pass reads the new map.
///
/// **Entries that no longer match.** A record that Redis expired (an abandoned request whose
/// retention ended) leaves its entries behind, and a write by an older version of this crate
/// changes a record without them. A pass that reads such an entry does not list it, and
/// rewrites that record's entries from its fields (or removes them) in one script.
///
/// **Records without entries: the walk.** Records written before the index existed (or by an
/// older version during a rolling upgrade) have no entries. A walk of the whole namespace
/// ([`RedisStore::rebuild_index`]: `SCAN` on every primary, then one script per in-flight
/// record) writes them. The passes start it by themselves on the first pass ever on a
/// namespace (so an upgrade's first pass finds every older record) and then at most once per
/// [`RedisConfig::index_walk_every`] (1 hour by default) across every process sharing the
/// namespace (the key `<namespace>:index:walk`, set with `NX` and that expiry, says who walks).
/// It is the only maintenance that reads every record, and never the per-pass path.
///
/// Cloning is cheap and shares the connection.
#[derive(Clone)]
pub struct RedisStore {
    pub(crate) conn: Conn,
    pub(crate) clock: ClockSource,
    pub(crate) namespace: String,
    timeout: Duration,
    wait: Option<(u32, Duration)>,
    persistence: Vec<(String, Persistence)>,
    pub(crate) walk_every: Option<Duration>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("cluster", &self.conn.is_cluster())
            .field("clock", &self.clock)
            .field("namespace", &self.namespace)
            .field("timeout", &self.timeout)
            .field("wait", &self.wait)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connects to `url` with the default [`RedisConfig`] and the server clock; see
    /// [`RedisStore::connect_with`] for the URL forms.
    ///
    /// # Errors
    ///
    /// As [`RedisStore::connect_with`].
    pub async fn connect(url: &str) -> Result<Self, ConnectError> {
        Self::connect_with(url, RedisConfig::default()).await
    }

    /// Connects to `url` with `config`, on the server clock, and checks every node's
    /// persistence.
    ///
    /// URL forms:
    ///
    /// - one endpoint: `redis://[user[:password]@]host[:port][/db]`, `rediss://…` (TLS),
    ///   `redis+unix:///path` (as the redis crate reads them);
    /// - a Redis Cluster: `redis+cluster://[user[:password]@]host:port[,host:port…]` (or
    ///   `rediss+cluster://` for TLS): the seed nodes (any reachable one is enough; the rest
    ///   of the cluster is discovered), credentials shared by every node, no database number;
    /// - Oncely's query parameters, on either form: `namespace=NAME`
    ///   ([`RedisConfig::namespace`]), `accept_volatile=true`
    ///   ([`RedisConfig::accept_volatile`]), `wait_replicas=N`
    ///   ([`RedisConfig::wait_replicas`]), `wait_timeout_ms=M` ([`RedisConfig::wait_timeout`]),
    ///   e.g. `redis+cluster://127.0.0.1:7100,127.0.0.1:7101?wait_replicas=1&wait_timeout_ms=500`.
    ///   Other query parameters go to the redis crate.
    ///
    /// # Errors
    ///
    /// [`ConnectError::InvalidUrl`] for a malformed URL or option;
    /// [`ConnectError::Unavailable`] when Redis cannot be reached, or its persistence
    /// settings read, within `config.operation_timeout`; [`ConnectError::Volatile`] when a
    /// node keeps nothing across a restart and `accept_volatile` is not set.
    pub async fn connect_with(url: &str, config: RedisConfig) -> Result<Self, ConnectError> {
        let (endpoint, options) = url::parse(url)?;
        let accept_volatile = options.accept_volatile.unwrap_or(config.accept_volatile);
        let wait_timeout = options.wait_timeout.unwrap_or(config.wait_timeout);
        let default_replicas = match endpoint {
            Endpoint::Cluster(_) => 1,
            Endpoint::Single(_) => 0,
        };
        let replicas = options
            .wait_replicas
            .or(config.wait_replicas)
            .unwrap_or(default_replicas);
        let timeout = config.operation_timeout;
        let mut conn = within(timeout, Conn::open(&endpoint, timeout))
            .await
            .map_err(ConnectError::Unavailable)?;
        let persistence = within(timeout, durability::read(&mut conn))
            .await
            .map_err(ConnectError::Unavailable)?;
        let volatile: Vec<(String, Persistence)> = persistence
            .iter()
            .filter(|(_, p)| p.keeps_nothing())
            .cloned()
            .collect();
        if !volatile.is_empty() && !accept_volatile {
            return Err(ConnectError::Volatile(VolatileRedis { nodes: volatile }));
        }
        // One warning per kind of loss, naming the nodes it applies to.
        let mut warnings: Vec<(String, Vec<String>)> = Vec::new();
        for (node, p) in &persistence {
            let Some(mut w) = p.warning() else { continue };
            if p.keeps_nothing() {
                w.push_str(" (accepted: accept_volatile is set)");
            }
            match warnings.iter_mut().find(|(seen, _)| *seen == w) {
                Some((_, nodes)) => nodes.push(node.clone()),
                None => warnings.push((w, vec![node.clone()])),
            }
        }
        // Eviction is a loss of its own (a warning, like `appendfsync everysec`); unreadable,
        // it is not checked.
        match within(timeout, durability::eviction(&mut conn)).await {
            Ok(evicting) => {
                for (node, w) in evicting {
                    match warnings.iter_mut().find(|(seen, _)| *seen == w) {
                        Some((_, nodes)) => nodes.push(node),
                        None => warnings.push((w, vec![node])),
                    }
                }
            }
            Err(e) => tracing::debug!(error = %e, "redis key store: could not read INFO memory"),
        }
        for (w, nodes) in warnings {
            if nodes.iter().all(|n| n.is_empty()) {
                tracing::warn!("redis key store: {w}");
            } else {
                tracing::warn!(nodes = %nodes.join(","), "redis key store: {w}");
            }
        }
        Ok(Self {
            conn,
            clock: ClockSource::Server,
            namespace: options.namespace.unwrap_or(config.namespace),
            timeout,
            wait: (replicas > 0).then_some((replicas, wait_timeout)),
            persistence,
            walk_every: config.index_walk_every,
        })
    }

    /// Uses `clock` for "now" (default: [`ClockSource::Server`]; read the clock rule there).
    #[must_use]
    pub fn with_clock_source(mut self, clock: ClockSource) -> Self {
        self.clock = clock;
        self
    }

    /// The clock source in use.
    pub fn clock_source(&self) -> &ClockSource {
        &self.clock
    }

    /// The key prefix in use.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Whether this store runs on a Redis Cluster.
    pub fn is_cluster(&self) -> bool {
        self.conn.is_cluster()
    }

    /// The `WAIT` in use after each write that matters: `(replicas, timeout)`, or `None`.
    pub fn replica_wait(&self) -> Option<(u32, Duration)> {
        self.wait
    }

    /// What each node keeps across a restart, as read at connect: `(node, persistence)` with
    /// the node as `host:port` on a cluster and empty for one endpoint.
    pub fn persistence(&self) -> &[(String, Persistence)] {
        &self.persistence
    }

    /// The Redis key of a record (for operators: `HGETALL`, `PTTL`).
    pub fn key_of(&self, id: &RecordKey) -> String {
        keys::record_key(&self.namespace, id)
    }

    /// One `PING` round trip (on a cluster: to every node), a readiness probe.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when Redis does not answer within the operation timeout.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let _: Value = self
            .run(async move { redis::cmd("PING").query_async(&mut conn).await })
            .await?;
        Ok(())
    }

    pub(crate) fn now_arg(&self) -> String {
        match &self.clock {
            ClockSource::Server => String::new(),
            ClockSource::Application(c) => c.now_millis().to_string(),
        }
    }

    /// "Now" for the scans that run outside a script: the application clock, or the server's
    /// `TIME`.
    pub(crate) async fn now(&self) -> Result<UnixMillis, StoreError> {
        match &self.clock {
            ClockSource::Application(c) => Ok(c.now_millis()),
            ClockSource::Server => {
                let mut conn = self.conn.clone();
                let (secs, micros): (i64, i64) = self
                    .run(async move { redis::cmd("TIME").query_async(&mut conn).await })
                    .await?;
                Ok(secs.saturating_mul(1000).saturating_add(micros / 1000))
            }
        }
    }

    pub(crate) async fn run<T>(
        &self,
        fut: impl Future<Output = RedisResult<T>>,
    ) -> Result<T, StoreError> {
        within(self.timeout, fut).await
    }

    /// The keys a script takes for the record at `key`: the record, then its slot's lease,
    /// marked and retention index keys (see "The maintenance index").
    pub(crate) fn script_keys(&self, key: String) -> [String; 4] {
        let slot = self
            .conn
            .is_cluster()
            .then(|| keys::slot_of(key.as_bytes()));
        let [lease, marked, retention] =
            IndexKind::ALL.map(|kind| keys::index_key(&self.namespace, kind, slot));
        [key, lease, marked, retention]
    }

    /// The key of `kind`'s index that holds the entry of the record at `id` (for operators and
    /// tests: `ZSCORE <index key> <record key>` is the entry's score, in epoch milliseconds).
    /// On one endpoint there is one index key per kind; on a Redis Cluster one per kind and
    /// hash slot, in the record's slot (see "The maintenance index").
    pub fn index_key_of(&self, id: &RecordKey, kind: IndexKind) -> String {
        let slot = self
            .conn
            .is_cluster()
            .then(|| keys::slot_of(self.key_of(id).as_bytes()));
        keys::index_key(&self.namespace, kind, slot)
    }

    /// Runs `lua` on `key` (and its index keys). With `durable` and a configured `WAIT`, the script
    /// and `WAIT` go in one pipeline on the connection of the key's primary (so `WAIT` covers this
    /// write), and fewer acknowledgements than required is [`ReplicasDidNotAcknowledge`].
    pub(crate) async fn eval(
        &self,
        lua: &'static Lua,
        key: String,
        args: Vec<Vec<u8>>,
        durable: bool,
    ) -> Result<Value, StoreError> {
        let keys = self.script_keys(key);
        let mut conn = self.conn.clone();
        let wait = if durable { self.wait } else { None };
        let Some((replicas, wait_timeout)) = wait else {
            return self
                .run(async move {
                    let mut inv = lua.script.prepare_invoke();
                    for k in &keys {
                        inv.key(k);
                    }
                    for a in args {
                        inv.arg(a);
                    }
                    inv.invoke_async(&mut conn).await
                })
                .await;
        };
        let wait_ms = duration_millis(wait_timeout).max(1);
        let pipeline = |by_hash: bool| {
            let mut pipe = redis::pipe();
            if by_hash {
                pipe.cmd("EVALSHA").arg(lua.script.get_hash());
            } else {
                pipe.cmd("EVAL").arg(lua.code);
            }
            pipe.arg(keys.len()).arg(&keys[..]);
            for a in &args {
                pipe.arg(a);
            }
            pipe.cmd("WAIT").arg(replicas).arg(wait_ms);
            pipe
        };
        let (reply, acknowledged): (Value, i64) = within(self.timeout + wait_timeout, async {
            match pipeline(true).query_async(&mut conn).await {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    pipeline(false).query_async(&mut conn).await
                }
                r => r,
            }
        })
        .await?;
        if acknowledged < i64::from(replicas) {
            return Err(StoreError::unavailable(ReplicasDidNotAcknowledge {
                required: replicas,
                acknowledged,
                timeout: wait_timeout,
            }));
        }
        Ok(reply)
    }

    /// Runs a write script that answers `{'ok', ...}` or `{'fenced'}`.
    pub(crate) async fn write(
        &self,
        lua: &'static Lua,
        id: &RecordKey,
        args: Vec<Vec<u8>>,
        durable: bool,
    ) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let mut all = Vec::with_capacity(args.len() + 1);
        all.push(self.now_arg().into_bytes());
        all.extend(args);
        let v = self.eval(lua, self.key_of(id), all, durable).await?;
        let r = decode::reply(v)?;
        match decode::reply_bytes(&r, 0) {
            Some(b"ok") => Ok(r),
            Some(b"fenced") => Err(StoreError::Fenced),
            _ => Err(StoreError::Corrupt(format!(
                "redis: unexpected write script reply {r:?}"
            ))),
        }
    }
}

async fn within<T>(
    timeout: Duration,
    fut: impl Future<Output = RedisResult<T>>,
) -> Result<T, StoreError> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(e)) => Err(StoreError::unavailable(e)),
        Err(_) => Err(StoreError::unavailable(OperationTimedOut(timeout))),
    }
}
