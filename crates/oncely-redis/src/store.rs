//! [`RedisStore`]: the [`KeyStore`] on Redis.

use crate::clock::ClockSource;
use crate::decode::{self, Fields};
use crate::error::OperationTimedOut;
use crate::keys::{self, DEFAULT_NAMESPACE};
use crate::scripts;
use async_trait::async_trait;
use oncely_core::clock::duration_millis;
use oncely_core::store::lease_millis;
use oncely_core::{
    Claim, ClaimKind, ClaimOutcome, ClaimRequest, FencingToken, KeyStore, ReapReport, Record,
    RecordKey, RecordState, StoreError, StoredResponse, UnixMillis,
};
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::{RedisResult, Script, Value};
use std::future::Future;
use std::sync::LazyLock;
use std::time::Duration;

/// The default operation timeout: 2 seconds per Redis round trip.
pub const DEFAULT_OPERATION_TIMEOUT: Duration = Duration::from_secs(2);

/// Durations sent to the scripts are capped at 10^15 milliseconds (about 31,700 years) so that
/// every time the scripts compute stays an exact integer in Lua's doubles (below 2^53).
const MAX_DURATION_MS: i64 = 1_000_000_000_000_000;

/// How many keys one `SCAN` step asks for.
const SCAN_COUNT: usize = 1000;

fn millis(d: Duration) -> i64 {
    duration_millis(d).min(MAX_DURATION_MS)
}

struct Scripts {
    claim: Script,
    renew: Script,
    checkpoint: Script,
    complete: Script,
    release: Script,
    reap_one: Script,
}

/// Compiled once per process; `Script` sends `EVALSHA` and falls back to `EVAL` (loading the
/// script) when the server does not know it, e.g. after a restart.
static SCRIPTS: LazyLock<Scripts> = LazyLock::new(|| Scripts {
    claim: Script::new(scripts::CLAIM),
    renew: Script::new(scripts::RENEW),
    checkpoint: Script::new(scripts::CHECKPOINT),
    complete: Script::new(scripts::COMPLETE),
    release: Script::new(scripts::RELEASE),
    reap_one: Script::new(scripts::REAP_ONE),
});

/// Connection settings for [`RedisStore::connect_with`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RedisConfig {
    /// The longest one Redis round trip may take before the operation fails with
    /// [`StoreError::Unavailable`] (wrapping [`OperationTimedOut`]). Also used as the
    /// connection's connect and response timeouts. Default: [`DEFAULT_OPERATION_TIMEOUT`]
    /// (2 seconds).
    pub operation_timeout: Duration,
    /// The key prefix, so several applications (or test runs) can share one Redis database
    /// without seeing each other's records. Default: [`DEFAULT_NAMESPACE`] (`oncely`). Braces
    /// and `%` are escaped (see [`record_key`](crate::record_key)).
    pub namespace: String,
}

impl Default for RedisConfig {
    fn default() -> Self {
        Self {
            operation_timeout: DEFAULT_OPERATION_TIMEOUT,
            namespace: DEFAULT_NAMESPACE.to_owned(),
        }
    }
}

impl RedisConfig {
    /// The defaults: a 2-second operation timeout, namespace `oncely`.
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
}

/// A [`KeyStore`] on Redis: one hash per `(scope, key)`, every write one Lua script.
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
/// - **Redis Cluster layout.** Each script touches exactly one key, whose hash tag is the whole
///   `(scope, key)` identity (see [`record_key`](crate::record_key)). Note that the connection
///   used here is a single-endpoint [`ConnectionManager`]; running against a Cluster needs a
///   cluster-aware connection, which this crate does not provide yet.
/// - **Time.** See [`ClockSource`] for the clock rule (the server's clock by default).
/// - **Retention.** Every write sets the hash's TTL to its retention end, so Redis deletes
///   records by itself; [`KeyStore::reap`] only has work to do when an application clock runs
///   ahead of the server's (see there). A record's retention end is never before its live
///   lease's end.
/// - **Failing closed.** A lost connection, a refused one or a round trip slower than the
///   operation timeout is [`StoreError::Unavailable`] (the layer answers `503`); nothing is
///   retried here. The [`ConnectionManager`] reconnects in the background (retries with
///   jittered backoff capped at 500 milliseconds), so the service recovers when Redis does,
///   without a restart. The call that first hits a dropped connection fails; later calls use
///   the new connection once it is up.
///
/// Cloning is cheap and shares the connection.
#[derive(Clone)]
pub struct RedisStore {
    conn: ConnectionManager,
    clock: ClockSource,
    namespace: String,
    timeout: Duration,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("clock", &self.clock)
            .field("namespace", &self.namespace)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl RedisStore {
    /// Connects to `url` (e.g. `redis://127.0.0.1:6379`, `rediss://...`, `redis://:pw@host/2`)
    /// with the default [`RedisConfig`] and the server clock.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the URL is invalid or Redis cannot be reached within
    /// the operation timeout.
    pub async fn connect(url: &str) -> Result<Self, StoreError> {
        Self::connect_with(url, RedisConfig::default()).await
    }

    /// Connects to `url` with `config`, on the server clock.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the URL is invalid or Redis cannot be reached within
    /// `config.operation_timeout`.
    pub async fn connect_with(url: &str, config: RedisConfig) -> Result<Self, StoreError> {
        let client = redis::Client::open(url).map_err(StoreError::unavailable)?;
        let manager_config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(config.operation_timeout))
            .set_response_timeout(Some(config.operation_timeout))
            .set_min_delay(Duration::from_millis(50))
            .set_max_delay(Duration::from_millis(500))
            .set_number_of_retries(6);
        let timeout = config.operation_timeout;
        let conn = within(
            timeout,
            ConnectionManager::new_with_config(client, manager_config),
        )
        .await?;
        Ok(Self {
            conn,
            clock: ClockSource::Server,
            namespace: config.namespace,
            timeout,
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

    /// The Redis key of a record (for operators: `HGETALL`, `PTTL`).
    pub fn key_of(&self, id: &RecordKey) -> String {
        keys::record_key(&self.namespace, id)
    }

    /// One `PING` round trip (a readiness probe).
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when Redis does not answer within the operation timeout.
    pub async fn ping(&self) -> Result<(), StoreError> {
        let mut conn = self.conn.clone();
        let _: String = self
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

    /// Runs a write script that answers `{'ok', ...}` or `{'fenced'}`.
    async fn write(
        &self,
        script: &'static Script,
        id: &RecordKey,
        args: Vec<Vec<u8>>,
    ) -> Result<Vec<Option<Vec<u8>>>, StoreError> {
        let key = self.key_of(id);
        let mut conn = self.conn.clone();
        let now = self.now_arg();
        let v: Value = self
            .run(async move {
                let mut inv = script.key(key);
                inv.arg(now);
                for a in args {
                    inv.arg(a);
                }
                inv.invoke_async(&mut conn).await
            })
            .await?;
        let r = decode::reply(v)?;
        match decode::reply_bytes(&r, 0) {
            Some(b"ok") => Ok(r),
            Some(b"fenced") => Err(StoreError::Fenced),
            _ => Err(StoreError::Corrupt(format!(
                "redis: unexpected write script reply {r:?}"
            ))),
        }
    }

    /// Walks every record key of the namespace with `SCAN` and reads `fields` of each (one
    /// pipelined `HMGET` per `SCAN` step); keeps the keys `keep` accepts, each once.
    ///
    /// Cost: `SCAN` visits the whole database (Redis has no prefix index), about one round
    /// trip per 1000 keys plus one pipelined read per step; memory holds only the kept keys.
    async fn scan_fields<T>(
        &self,
        fields: &[&str],
        mut keep: impl FnMut(&[Option<Vec<u8>>]) -> Option<T>,
    ) -> Result<Vec<(T, Vec<u8>)>, StoreError> {
        let pattern = keys::scan_pattern(&self.namespace);
        let mut out: Vec<(T, Vec<u8>)> = Vec::new();
        let mut seen = std::collections::HashSet::new();
        let mut cursor: u64 = 0;
        loop {
            let mut conn = self.conn.clone();
            let pat = pattern.clone();
            let (next, found): (u64, Vec<Vec<u8>>) = self
                .run(async move {
                    redis::cmd("SCAN")
                        .arg(cursor)
                        .arg("MATCH")
                        .arg(pat)
                        .arg("COUNT")
                        .arg(SCAN_COUNT)
                        .query_async(&mut conn)
                        .await
                })
                .await?;
            // SCAN may return a key more than once.
            let found: Vec<Vec<u8>> = found
                .into_iter()
                .filter(|k| seen.insert(k.clone()))
                .collect();
            if !found.is_empty() {
                let mut pipe = redis::pipe();
                for k in &found {
                    pipe.cmd("HMGET").arg(k).arg(fields);
                }
                let mut conn = self.conn.clone();
                let rows: Vec<Vec<Option<Vec<u8>>>> = self
                    .run(async move { pipe.query_async(&mut conn).await })
                    .await?;
                for (k, row) in found.into_iter().zip(rows) {
                    if let Some(t) = keep(&row) {
                        out.push((t, k));
                    }
                }
            }
            if next == 0 {
                return Ok(out);
            }
            cursor = next;
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

#[async_trait]
impl KeyStore for RedisStore {
    async fn claim(&self, req: ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let key = self.key_of(&req.id);
        let mut conn = self.conn.clone();
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
        let v: Value = self
            .run(async move {
                let mut inv = SCRIPTS.claim.key(key);
                for a in args {
                    inv.arg(a);
                }
                inv.invoke_async(&mut conn).await
            })
            .await?;
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
                Ok(ClaimOutcome::Claimed(Claim {
                    token: FencingToken(decode::reply_int(&r, 1)?),
                    lease_expires_at: decode::reply_int(&r, 2)?,
                    recovery_point,
                    kind,
                }))
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
        )
        .await
        .map(drop)
    }

    async fn release(&self, id: &RecordKey, token: FencingToken) -> Result<(), StoreError> {
        self.write(&SCRIPTS.release, id, vec![token.0.to_string().into_bytes()])
            .await
            .map(drop)
    }

    async fn get(&self, id: &RecordKey) -> Result<Option<Record>, StoreError> {
        let key = self.key_of(id);
        let mut conn = self.conn.clone();
        let fields: Fields = self
            .run(async move { redis::cmd("HGETALL").arg(key).query_async(&mut conn).await })
            .await?;
        decode::record(&fields)
    }

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
    ///   `SCAN` (cost: the whole database, about one round trip per 1000 keys), then deletes the
    ///   oldest `batch` of them, each with a script that checks the retention end again, so a
    ///   record claimed again meanwhile is kept.
    async fn reap(&self, batch: usize) -> Result<ReapReport, StoreError> {
        let ClockSource::Application(clock) = &self.clock else {
            return Ok(ReapReport::default());
        };
        if batch == 0 {
            return Ok(ReapReport::default());
        }
        let now = clock.now_millis();
        let mut due = self
            .scan_fields(&["expires"], |row| {
                row.first()
                    .and_then(Option::as_deref)
                    .and_then(decode::parse_int)
                    .filter(|at| *at <= now)
            })
            .await?;
        due.sort();
        due.truncate(batch);
        let mut report = ReapReport::default();
        let now_arg = now.to_string();
        for (_, key) in due {
            let mut conn = self.conn.clone();
            let now_arg = now_arg.clone();
            let v: Value = self
                .run(async move {
                    SCRIPTS
                        .reap_one
                        .key(key)
                        .arg(now_arg)
                        .invoke_async(&mut conn)
                        .await
                })
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
    /// Cost: one `SCAN` walk of the whole database (about one round trip per 1000 keys, each
    /// with a pipelined `HMGET` of the matching keys), then one pipelined `HGETALL` of the
    /// chosen records. A per-namespace index (a sorted set of leases) would be cheaper but
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
        let cutoff = self.now().await?.saturating_sub(millis(grace));
        let mut lapsed = self
            .scan_fields(&["state", "lease"], |row| {
                match (row.first().and_then(Option::as_deref), row.get(1)) {
                    (Some(b"in_flight"), Some(Some(lease))) => {
                        decode::parse_int(lease).filter(|at| *at <= cutoff)
                    }
                    _ => None,
                }
            })
            .await?;
        lapsed.sort();
        lapsed.truncate(limit);
        if lapsed.is_empty() {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for (_, k) in &lapsed {
            pipe.cmd("HGETALL").arg(k);
        }
        let mut conn = self.conn.clone();
        let rows: Vec<Fields> = self
            .run(async move { pipe.query_async(&mut conn).await })
            .await?;
        let mut out = Vec::with_capacity(rows.len());
        for fields in &rows {
            if let Some(rec) = decode::record(fields)?
                && let RecordState::InFlight {
                    lease_expires_at, ..
                } = rec.state
                && lease_expires_at <= cutoff
            {
                out.push(rec);
            }
        }
        out.sort_by_key(|r| match r.state {
            RecordState::InFlight {
                lease_expires_at, ..
            } => lease_expires_at,
            _ => 0,
        });
        Ok(out)
    }
}
