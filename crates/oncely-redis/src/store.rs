//! [`RedisStore`]: the [`KeyStore`] on Redis (one endpoint or a Redis Cluster).

use crate::clock::ClockSource;
use crate::conn::{self, Conn, Endpoint};
use crate::decode::{self, Fields};
use crate::durability::{self, Persistence};
use crate::error::{ConnectError, OperationTimedOut, ReplicasDidNotAcknowledge, VolatileRedis};
use crate::keys::{self, DEFAULT_NAMESPACE};
use crate::scripts;
use async_trait::async_trait;
use oncely_core::clock::duration_millis;
use oncely_core::store::lease_millis;
use oncely_core::{
    Claim, ClaimKind, ClaimOutcome, ClaimRequest, FencingToken, KeyStore, Maintenance, ReapReport,
    Record, RecordKey, RecordState, RedriveNote, Redrives, StoreError, StoredResponse, UnixMillis,
};
use redis::{ErrorKind, RedisResult, Script, ServerErrorKind, Value};
use std::collections::{BinaryHeap, HashSet};
use std::future::Future;
use std::sync::LazyLock;
use std::time::Duration;

/// The default operation timeout: 2 seconds per Redis round trip.
pub const DEFAULT_OPERATION_TIMEOUT: Duration = Duration::from_secs(2);

/// The default `WAIT` timeout: 500 milliseconds for the required replicas to acknowledge.
pub const DEFAULT_WAIT_TIMEOUT: Duration = Duration::from_millis(500);

/// Durations sent to the scripts are capped at 10^15 milliseconds (about 31,700 years) so that
/// every time the scripts compute stays an exact integer in Lua's doubles (below 2^53).
const MAX_DURATION_MS: i64 = 1_000_000_000_000_000;

/// How many keys one `SCAN` step asks for (per primary).
const SCAN_COUNT: usize = 1000;

fn millis(d: Duration) -> i64 {
    duration_millis(d).min(MAX_DURATION_MS)
}

/// A script and its source (for `EVAL` when a pipelined `EVALSHA` meets `NOSCRIPT`).
struct Lua {
    script: Script,
    code: &'static str,
}

impl Lua {
    fn new(code: &'static str) -> Self {
        Self {
            script: Script::new(code),
            code,
        }
    }
}

struct Scripts {
    claim: Lua,
    renew: Lua,
    checkpoint: Lua,
    complete: Lua,
    release: Lua,
    reap_one: Lua,
    note_redrive: Lua,
}

/// Compiled once per process; `Script` sends `EVALSHA` and falls back to `EVAL` (loading the
/// script) when the server does not know it, e.g. after a restart or on a promoted replica.
static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    claim: Lua::new(scripts::CLAIM),
    renew: Lua::new(scripts::RENEW),
    checkpoint: Lua::new(scripts::CHECKPOINT),
    complete: Lua::new(scripts::COMPLETE),
    release: Lua::new(scripts::RELEASE),
    reap_one: Lua::new(scripts::REAP_ONE),
    note_redrive: Lua::new(scripts::NOTE_REDRIVE),
});

/// Connection settings for [`RedisStore::connect_with`]. The store URL's query parameters
/// `namespace`, `accept_volatile`, `wait_replicas` and `wait_timeout_ms`, when present,
/// override the fields of the same name.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RedisConfig {
    /// The longest one Redis round trip may take before the operation fails with
    /// [`StoreError::Unavailable`] (wrapping [`OperationTimedOut`]). Also used as the
    /// connection's connect and response timeouts. A write that waits for replicas may take
    /// this plus [`RedisConfig::wait_timeout`]. Default: [`DEFAULT_OPERATION_TIMEOUT`]
    /// (2 seconds).
    pub operation_timeout: Duration,
    /// The key prefix, so several applications (or test runs) can share one Redis database
    /// without seeing each other's records: every operation, the reaper's and the completer's
    /// walks included, reaches only the records of its own namespace. Default:
    /// [`DEFAULT_NAMESPACE`] (`oncely`). Braces and `%` are escaped (see
    /// [`record_key`](crate::record_key)). URL: `namespace=NAME` (at least one character,
    /// taken as written, no percent-decoding).
    pub namespace: String,
    /// Accept a Redis that keeps nothing across a restart (see [`Persistence`]): the store
    /// then connects, and a restart loses the replay window of every key (a retry across it
    /// executes again). Default: `false`, and [`RedisStore::connect_with`] refuses such a
    /// Redis with [`ConnectError::Volatile`]. URL: `accept_volatile=true`.
    pub accept_volatile: bool,
    /// How many replicas must acknowledge each claim, renewal, recovery point and completion
    /// (`WAIT numreplicas timeout` after the write, on the same connection) before the store
    /// answers; fewer within [`RedisConfig::wait_timeout`] is [`StoreError::Unavailable`]
    /// wrapping [`ReplicasDidNotAcknowledge`]. `None` (the default) means 1 on a Redis
    /// Cluster and 0 (no `WAIT`) on one endpoint; `Some(0)` turns it off. URL:
    /// `wait_replicas=N`. Read [`RedisStore`] ("Failover") for what this does and does not
    /// promise.
    pub wait_replicas: Option<u32>,
    /// The `WAIT` timeout. Default: [`DEFAULT_WAIT_TIMEOUT`] (500 milliseconds). URL:
    /// `wait_timeout_ms=M`.
    pub wait_timeout: Duration,
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            operation_timeout: DEFAULT_OPERATION_TIMEOUT,
            namespace: DEFAULT_NAMESPACE.to_owned(),
            accept_volatile: false,
            wait_replicas: None,
            wait_timeout: DEFAULT_WAIT_TIMEOUT,
        }
    }
}

impl RedisConfig {
    /// The defaults: a 2-second operation timeout, namespace `oncely`, a Redis that persists
    /// nothing refused, `WAIT` for 1 replica (500 ms) on a cluster and none on one endpoint.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets [`RedisConfig::operation_timeout`].
    #[must_use]
    pub fn with_operation_timeout(mut self, timeout: Duration) -> Self {
        self.operation_timeout = timeout;
        self
    }

    /// Sets [`RedisConfig::namespace`].
    #[must_use]
    pub fn with_namespace(mut self, namespace: impl Into<String>) -> Self {
        self.namespace = namespace.into();
        self
    }

    /// Sets [`RedisConfig::accept_volatile`].
    #[must_use]
    pub fn with_accept_volatile(mut self, accept: bool) -> Self {
        self.accept_volatile = accept;
        self
    }

    /// Sets [`RedisConfig::wait_replicas`] and [`RedisConfig::wait_timeout`].
    #[must_use]
    pub fn with_wait(mut self, replicas: u32, timeout: Duration) -> Self {
        self.wait_replicas = Some(replicas);
        self.wait_timeout = timeout;
        self
    }
}

/// A [`KeyStore`] on Redis: one hash per `(scope, key)`, every write one Lua script; on one
/// endpoint or on a Redis Cluster.
///
/// # Guarantees
///
/// - **Atomic claims.** The claim is one script that implements [`oncely_core::decide`] on the
///   server: it reads the record, compares the fingerprint on every path that finds one (case
///   S3), and writes the new in-flight record, all in one atomic step. There is no `SET NX`
///   lock; losing a race is simply finding the winner's record.
/// - **Fencing.** Every claim sets the record's token to the previous token plus one (a
///   released or past-window record keeps its token, so tokens never restart while the hash
///   lives). `renew`, `checkpoint`, `complete` and `release` each check, in the same script,
///   that the record is in flight with the caller's token; otherwise they change nothing and
///   return [`StoreError::Fenced`].
/// - **Redis Cluster.** Each script touches exactly one key, whose hash tag is the whole
///   `(scope, key)` identity (see [`record_key`](crate::record_key)), so a record lives in one
///   slot on one primary and every script runs atomically there. With a
///   `redis+cluster://` URL the store keeps one connection per node, follows `MOVED`/`ASK`
///   redirects and re-reads the slot map after a failover. [`Maintenance::reap`] and
///   [`Maintenance::list_abandoned`] walk every primary.
/// - **Durability on restart.** At connect the store reads every node's persistence settings
///   ([`Persistence`]) and refuses a node that keeps nothing ([`ConnectError::Volatile`])
///   unless [`RedisConfig::accept_volatile`] says losing the replay window on restart is
///   acceptable; it logs a warning (`tracing`) for `appendfsync everysec` (up to about one
///   second of records lost in a crash), `appendfsync no` and snapshots only. See
///   [`RedisStore::persistence`].
/// - **Time.** See [`ClockSource`] for the clock rule (the server's clock by default; after a
///   failover, the promoted replica's clock).
/// - **Retention.** Every write sets the hash's TTL to its retention end, so Redis deletes
///   records by itself; [`Maintenance::reap`] only has work to do when an application clock runs
///   ahead of the server's (see there). A record's retention end is never before its live
///   lease's end.
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
/// Cloning is cheap and shares the connection.
#[derive(Clone)]
pub struct RedisStore {
    conn: Conn,
    clock: ClockSource,
    namespace: String,
    timeout: Duration,
    wait: Option<(u32, Duration)>,
    persistence: Vec<(String, Persistence)>,
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
        let (endpoint, options) = conn::parse(url)?;
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
        let mut warnings: Vec<(String, Vec<&str>)> = Vec::new();
        for (node, p) in &persistence {
            let Some(mut w) = p.warning() else { continue };
            if p.keeps_nothing() {
                w.push_str(" (accepted: accept_volatile is set)");
            }
            match warnings.iter_mut().find(|(seen, _)| *seen == w) {
                Some((_, nodes)) => nodes.push(node),
                None => warnings.push((w, vec![node])),
            }
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

    fn now_arg(&self) -> String {
        match &self.clock {
            ClockSource::Server => String::new(),
            ClockSource::Application(c) => c.now_millis().to_string(),
        }
    }

    /// "Now" for the scans that run outside a script: the application clock, or the server's
    /// `TIME`.
    async fn now(&self) -> Result<UnixMillis, StoreError> {
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

    async fn run<T>(&self, fut: impl Future<Output = RedisResult<T>>) -> Result<T, StoreError> {
        within(self.timeout, fut).await
    }

    /// Runs `lua` on `key`. With `durable` and a configured `WAIT`, the script and `WAIT`
    /// go in one pipeline on the connection of the key's primary (so `WAIT` covers this
    /// write), and fewer acknowledgements than required is [`ReplicasDidNotAcknowledge`].
    async fn eval(
        &self,
        lua: &'static Lua,
        key: String,
        args: Vec<Vec<u8>>,
        durable: bool,
    ) -> Result<Value, StoreError> {
        let mut conn = self.conn.clone();
        let wait = if durable { self.wait } else { None };
        let Some((replicas, wait_timeout)) = wait else {
            return self
                .run(async move {
                    let mut inv = lua.script.key(key);
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
            pipe.arg(1).arg(&key);
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
    async fn write(
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

    /// Walks every record key of the namespace with `SCAN` on every primary and reads
    /// `fields` of each (one pipelined `HMGET` per `SCAN` step); keeps the `limit` smallest
    /// values `keep` returns, each key once, smallest first.
    ///
    /// Cost: `SCAN` visits each primary's whole database (Redis has no prefix index), about
    /// one round trip per 1000 keys per primary plus one pipelined read per step. Memory is
    /// bounded: one step's keys plus the `limit` kept so far.
    async fn scan_fields<T: Ord + Clone>(
        &self,
        fields: &[&str],
        limit: usize,
        mut keep: impl FnMut(&[Option<Vec<u8>>]) -> Option<T>,
    ) -> Result<Vec<(T, Vec<u8>)>, StoreError> {
        let pattern = keys::scan_pattern(&self.namespace);
        // A max-heap of the `limit` smallest so far, and the keys in it (SCAN may return a
        // key more than once).
        let mut best: BinaryHeap<(T, Vec<u8>)> = BinaryHeap::new();
        let mut in_best: HashSet<Vec<u8>> = HashSet::new();
        let mut conn = self.conn.clone();
        let primaries = self.run(conn.primaries()).await?;
        for primary in primaries {
            let mut cursor: u64 = 0;
            loop {
                let mut scan = redis::cmd("SCAN");
                scan.arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(SCAN_COUNT);
                let (next, found): (u64, Vec<Vec<u8>>) =
                    self.run(conn.query_on(primary, &scan)).await?;
                let found: Vec<Vec<u8>> = found
                    .into_iter()
                    .filter(|k| !in_best.contains(k))
                    .collect::<HashSet<_>>()
                    .into_iter()
                    .collect();
                if !found.is_empty() {
                    let mut pipe = redis::pipe();
                    for k in &found {
                        pipe.cmd("HMGET").arg(k).arg(fields);
                    }
                    let rows: Vec<Vec<Option<Vec<u8>>>> =
                        self.run(conn.pipeline_on(primary, &pipe)).await?;
                    for (k, row) in found.into_iter().zip(rows) {
                        let Some(t) = keep(&row) else { continue };
                        if best.len() == limit {
                            match best.peek() {
                                Some((worst, _)) if t < *worst => {}
                                _ => continue,
                            }
                            if let Some((_, out)) = best.pop() {
                                in_best.remove(&out);
                            }
                        }
                        in_best.insert(k.clone());
                        best.push((t, k));
                    }
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        Ok(best.into_sorted_vec())
    }
}

impl RedisStore {
    /// Reads whole records by their Redis keys (pipelined on one endpoint, in parallel on a
    /// cluster, where they live in different slots); keys that no longer exist are left out.
    async fn fetch(&self, names: Vec<Vec<u8>>) -> Result<Vec<Record>, StoreError> {
        if names.is_empty() {
            return Ok(Vec::new());
        }
        let rows: Vec<Fields> = if self.conn.is_cluster() {
            futures::future::try_join_all(names.iter().map(|k| {
                let mut conn = self.conn.clone();
                self.run(async move { redis::cmd("HGETALL").arg(k).query_async(&mut conn).await })
            }))
            .await?
        } else {
            let mut pipe = redis::pipe();
            for k in &names {
                pipe.cmd("HGETALL").arg(k);
            }
            let mut conn = self.conn.clone();
            self.run(async move { pipe.query_async(&mut conn).await })
                .await?
        };
        let mut out = Vec::with_capacity(rows.len());
        for (k, fields) in names.iter().zip(&rows) {
            // The Redis key names the record (records no longer store scope and key).
            let id = keys::parse_record_key(&self.namespace, k);
            if let Some(rec) = decode::record(fields, id.as_ref())? {
                out.push(rec);
            }
        }
        Ok(out)
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

#[async_trait]
impl KeyStore for RedisStore {
    async fn claim(&self, req: ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let key = self.key_of(&req.id);
        let args: Vec<Vec<u8>> = vec![
            self.now_arg().into_bytes(),
            req.fingerprint.version().to_string().into_bytes(),
            req.fingerprint.digest().to_vec(),
            lease_millis(req.lease)
                .min(MAX_DURATION_MS)
                .to_string()
                .into_bytes(),
            millis(req.replay_window).to_string().into_bytes(),
            millis(req.retention).to_string().into_bytes(),
            req.id.scope.as_str().as_bytes().to_vec(),
            req.id.key.as_str().as_bytes().to_vec(),
            req.request.as_ref().map(|r| r.encode()).unwrap_or_default(),
        ];
        let v = self.eval(&SCRIPTS.claim, key, args, true).await?;
        let r = decode::reply(v)?;
        match decode::reply_bytes(&r, 0) {
            Some(b"claimed") => {
                let kind = match decode::reply_bytes(&r, 3) {
                    Some(b"new") => ClaimKind::New,
                    Some(b"takeover") => ClaimKind::Takeover,
                    Some(b"after_window") => ClaimKind::AfterReplayWindow,
                    other => {
                        return Err(StoreError::Corrupt(format!(
                            "redis: unknown claim kind {other:?}"
                        )));
                    }
                };
                let recovery_point = match decode::reply_bytes(&r, 4) {
                    Some(b) => Some(String::from_utf8(b.to_vec()).map_err(|_| {
                        StoreError::Corrupt("redis: recovery point is not UTF-8".into())
                    })?),
                    None => None,
                };
                Ok(ClaimOutcome::Claimed(
                    Claim::new(
                        FencingToken(decode::reply_int(&r, 1)?),
                        decode::reply_int(&r, 2)?,
                        kind,
                    )
                    .with_recovery_point(recovery_point),
                ))
            }
            Some(b"in_flight") => Ok(ClaimOutcome::InFlight {
                lease_expires_at: decode::reply_int(&r, 1)?,
            }),
            Some(b"replay") => Ok(ClaimOutcome::Replay {
                response: decode::response(
                    decode::reply_bytes(&r, 1),
                    decode::reply_bytes(&r, 2),
                    decode::reply_bytes(&r, 3),
                    decode::reply_bytes(&r, 4),
                )?,
                completed_at: decode::reply_int(&r, 5)?,
            }),
            Some(b"mismatch") => Ok(ClaimOutcome::Mismatch),
            Some(b"needs_attention") => Ok(ClaimOutcome::NeedsAttention {
                marked_at: decode::reply_int(&r, 1)?,
                attempts: u32::try_from(decode::reply_int(&r, 2)?)
                    .map_err(|_| StoreError::Corrupt("redis: attempts out of range".into()))?,
                recovery_point: match decode::reply_bytes(&r, 3) {
                    Some(b) => Some(String::from_utf8(b.to_vec()).map_err(|_| {
                        StoreError::Corrupt("redis: recovery point is not UTF-8".into())
                    })?),
                    None => None,
                },
            }),
            Some(b"corrupt") => Err(StoreError::Corrupt(format!(
                "redis record: bad field {}",
                String::from_utf8_lossy(decode::reply_bytes(&r, 1).unwrap_or_default())
            ))),
            _ => Err(StoreError::Corrupt(format!(
                "redis: unexpected claim reply {r:?}"
            ))),
        }
    }

    async fn renew(
        &self,
        id: &RecordKey,
        token: FencingToken,
        lease: Duration,
    ) -> Result<UnixMillis, StoreError> {
        let lease = lease_millis(lease).min(MAX_DURATION_MS);
        let r = self
            .write(
                &SCRIPTS.renew,
                id,
                vec![
                    token.0.to_string().into_bytes(),
                    lease.to_string().into_bytes(),
                ],
                true,
            )
            .await?;
        decode::reply_int(&r, 1)
    }

    async fn checkpoint(
        &self,
        id: &RecordKey,
        token: FencingToken,
        recovery_point: &str,
        lease: Duration,
    ) -> Result<(), StoreError> {
        let lease = lease_millis(lease).min(MAX_DURATION_MS);
        self.write(
            &SCRIPTS.checkpoint,
            id,
            vec![
                token.0.to_string().into_bytes(),
                recovery_point.as_bytes().to_vec(),
                lease.to_string().into_bytes(),
            ],
            true,
        )
        .await
        .map(drop)
    }

    async fn complete(
        &self,
        id: &RecordKey,
        token: FencingToken,
        response: StoredResponse,
        retention: Duration,
    ) -> Result<(), StoreError> {
        let headers = response.encode_headers();
        self.write(
            &SCRIPTS.complete,
            id,
            vec![
                token.0.to_string().into_bytes(),
                response.status.to_string().into_bytes(),
                headers,
                response.body,
                if response.body_retained { b"1" } else { b"0" }.to_vec(),
                millis(retention).to_string().into_bytes(),
            ],
            true,
        )
        .await
        .map(drop)
    }

    async fn release(&self, id: &RecordKey, token: FencingToken) -> Result<(), StoreError> {
        // Not waited for: a release lost in a failover only keeps the key in flight until its
        // lease lapses.
        self.write(
            &SCRIPTS.release,
            id,
            vec![token.0.to_string().into_bytes()],
            false,
        )
        .await
        .map(drop)
    }

    async fn get(&self, id: &RecordKey) -> Result<Option<Record>, StoreError> {
        let key = self.key_of(id);
        let mut conn = self.conn.clone();
        let fields: Fields = self
            .run(async move { redis::cmd("HGETALL").arg(key).query_async(&mut conn).await })
            .await?;
        decode::record(&fields, Some(id))
    }
}

#[async_trait]
impl Maintenance for RedisStore {
    /// Deletes up to `batch` records whose stored retention end is at or before "now", oldest
    /// first.
    ///
    /// **Redis expiry is the primary reaper here**: every write sets the hash's TTL to its
    /// retention end, and Redis never returns an expired key. So:
    ///
    /// - Under [`ClockSource::Server`] the TTL and the stored `expires_at` run on the same
    ///   clock, no record past retention is ever visible, and this returns an empty report at
    ///   once, without touching Redis. (Records deleted by Redis expiry are not counted, so the
    ///   `orphaned` count is not available on this backend with the server clock.)
    /// - Under [`ClockSource::Application`] the TTL is set relative to the application's "now",
    ///   so an application clock running ahead of the server's (a test's manual clock, or skew)
    ///   can see records past retention that Redis still keeps. This walks the namespace with
    ///   `SCAN` on every primary (cost: each primary's whole database, about one round trip per
    ///   1000 keys; memory: one step's keys plus `batch`), then deletes the oldest `batch` of
    ///   them, each with a script that checks the retention end again, so a record claimed
    ///   again meanwhile is kept.
    async fn reap(&self, batch: usize) -> Result<ReapReport, StoreError> {
        let ClockSource::Application(clock) = &self.clock else {
            return Ok(ReapReport::default());
        };
        if batch == 0 {
            return Ok(ReapReport::default());
        }
        let now = clock.now_millis();
        let due = self
            .scan_fields(&["expires"], batch, |row| {
                row.first()
                    .and_then(Option::as_deref)
                    .and_then(decode::parse_int)
                    .filter(|at| *at <= now)
            })
            .await?;
        let mut report = ReapReport::default();
        let now_arg = now.to_string().into_bytes();
        for (_, key) in due {
            let key = String::from_utf8(key)
                .map_err(|_| StoreError::Corrupt("redis: a record key is not UTF-8".into()))?;
            let v = self
                .eval(&SCRIPTS.reap_one, key, vec![now_arg.clone()], false)
                .await?;
            let r = decode::reply(v)?;
            if decode::reply_bytes(&r, 0) == Some(b"deleted") {
                report.deleted += 1;
                if decode::reply_bytes(&r, 1) == Some(b"in_flight") {
                    report.orphaned += 1;
                }
            }
        }
        Ok(report)
    }

    /// Lists up to `limit` in-flight records whose lease ended at least `grace` ago, oldest
    /// lease first.
    ///
    /// Cost: one `SCAN` walk of every primary's whole database (about one round trip per 1000
    /// keys, each with a pipelined `HMGET` of the matching keys; memory: one step's keys plus
    /// `limit`), then one `HGETALL` of each chosen record (pipelined on one endpoint, in
    /// parallel on a cluster). A failover during the walk can make it miss records; the next
    /// pass finds them. A per-namespace index (a sorted set of leases) would be cheaper but
    /// would live in a different Cluster slot than the records and could not be updated in the
    /// same atomic script, so it is deliberately not kept. A record that changes between the
    /// walk and the read is re-checked and dropped if it no longer qualifies.
    async fn list_abandoned(
        &self,
        grace: Duration,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let now = self.now().await?;
        let cutoff = now.saturating_sub(millis(grace));
        let due = |next: Option<&Option<Vec<u8>>>| match next {
            Some(Some(at)) => decode::parse_int(at).is_some_and(|at| at <= now),
            _ => true,
        };
        let lapsed = self
            .scan_fields(
                &["state", "lease", "marked", "next_attempt"],
                limit,
                |row| match (
                    row.first().and_then(Option::as_deref),
                    row.get(1),
                    row.get(2),
                ) {
                    (Some(b"in_flight"), Some(Some(lease)), Some(None)) if due(row.get(3)) => {
                        decode::parse_int(lease).filter(|at| *at <= cutoff)
                    }
                    _ => None,
                },
            )
            .await?;
        let mut out: Vec<Record> = self
            .fetch(lapsed.into_iter().map(|(_, k)| k).collect())
            .await?
            .into_iter()
            .filter(|rec| {
                matches!(rec.state, RecordState::InFlight { lease_expires_at, .. }
                    if lease_expires_at <= cutoff)
                    && !rec.redrives.is_marked()
                    && rec.redrives.next_attempt_at.is_none_or(|at| at <= now)
            })
            .collect();
        out.sort_by_key(|r| match r.state {
            RecordState::InFlight {
                lease_expires_at, ..
            } => lease_expires_at,
            _ => 0,
        });
        Ok(out)
    }

    async fn note_redrive(
        &self,
        id: &RecordKey,
        token: FencingToken,
        attempts_seen: u32,
        note: RedriveNote,
    ) -> Result<Redrives, StoreError> {
        let (kind, backoff): (&[u8], i64) = match note {
            RedriveNote::Attempt { backoff } => (b"attempt", millis(backoff)),
            RedriveNote::Mark => (b"mark", 0),
            _ => return Err(StoreError::Fenced),
        };
        let r = self
            .write(
                &SCRIPTS.note_redrive,
                id,
                vec![
                    token.0.to_string().into_bytes(),
                    attempts_seen.to_string().into_bytes(),
                    kind.to_vec(),
                    backoff.to_string().into_bytes(),
                ],
                true,
            )
            .await?;
        let opt = |i: usize| match decode::reply_bytes(&r, i) {
            Some(_) => decode::reply_int(&r, i).map(Some),
            None => Ok(None),
        };
        Ok(Redrives::new(
            u32::try_from(decode::reply_int(&r, 1)?)
                .map_err(|_| StoreError::Corrupt("redis: attempts out of range".into()))?,
            opt(2)?,
            opt(3)?,
        ))
    }

    /// Lists up to `limit` in-flight records marked for a person, oldest mark first.
    ///
    /// Cost: one `SCAN` walk of every primary, as [`Maintenance::list_abandoned`] (Redis has no
    /// index to read them from), then one `HGETALL` per listed record.
    async fn list_marked(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let marked = self
            .scan_fields(&["state", "marked"], limit, |row| {
                match (row.first().and_then(Option::as_deref), row.get(1)) {
                    (Some(b"in_flight"), Some(Some(at))) => decode::parse_int(at),
                    _ => None,
                }
            })
            .await?;
        let mut out: Vec<Record> = self
            .fetch(marked.into_iter().map(|(_, k)| k).collect())
            .await?
            .into_iter()
            .filter(Record::is_marked)
            .collect();
        out.sort_by(|x, y| {
            (x.redrives.marked_at, &x.scope, &x.key).cmp(&(y.redrives.marked_at, &y.scope, &y.key))
        });
        Ok(out)
    }
}
