//! The claim on a connection, written once (`PostgresStore::claim_on`, by the shared rule
//! [`oncely_core::decide`]): on a pooled connection for
//! [`KeyStore::claim`](oncely_core::KeyStore::claim) (`keystore.rs`), inside the caller's
//! transaction for [`PostgresStore::claim_in`], and in the first phase's own transaction for
//! `oncely-sqlx`'s claimer ([`PostgresStore::claim_tx`]), which waits in short tries for a key
//! that another transaction holds. See [`PostgresStore`], "How a claim is arbitrated".

use crate::error::{PostgresStoreError, map, retry_transient};
use crate::sql;
use crate::store::{PostgresStore, duration_millis_u64};
use crate::within::read;
use oncely_core::clock::duration_millis;
use oncely_core::store::lease_millis;
use oncely_core::{
    Claim, ClaimKind, ClaimOutcome, ClaimRequest, Decision, FencingToken, Record, RecordState,
    StoreError, StoredRequest, UnixMillis, decide,
};
use sqlx::postgres::PgConnection;
use std::time::Duration;

/// `55P03 lock_not_available`: a statement waited longer than `lock_timeout` for a lock.
fn is_lock_timeout(e: &StoreError) -> bool {
    matches!(
        e,
        StoreError::Unavailable(source)
            if matches!(
                source.downcast_ref::<sqlx::Error>(),
                Some(sqlx::Error::Database(db)) if db.code().as_deref() == Some("55P03")
            )
    )
}

/// Where a claim runs, which decides the order of its statements and what a lock wait means.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ClaimPath {
    /// [`KeyStore::claim`](oncely_core::KeyStore::claim): autocommit statements on a pooled
    /// connection. The record is read first (a plain MVCC read never waits for a lock, so a
    /// claim against a record whose owner has a phase open answers at once), and a round that
    /// failed with a transient conflict runs again.
    Pooled,
    /// [`PostgresStore::claim_in`]: inside the caller's transaction. The insert comes first (a
    /// new key's whole claim is one statement), and a wait for the key past the transaction's
    /// `lock_timeout` is answered in flight (the transaction is then aborted).
    InTransaction,
    /// [`PostgresStore::claim_tx`]: as [`ClaimPath::InTransaction`], in a transaction begun
    /// with the short lock wait of one try ([`sql::BEGIN_CLAIM`]), which the claim restores to
    /// the phase's bound once it holds the key; a wait past the try's bound is returned as the
    /// lock timeout, for `claim_tx` to try again with no connection held in between.
    Claimer,
}

impl PostgresStore {
    /// Reads `id`'s record on an idle connection taken without the pool's check of it before
    /// use (`test_before_acquire`, a round trip of its own): the read checks the connection as
    /// well, and a read that fails on it runs again on a connection from
    /// [`PgPool::acquire`](sqlx::PgPool::acquire), checked. Without an idle connection, the
    /// read waits for one as any statement does. For a replay after a claim sent with its
    /// `BEGIN`, whose connection sqlx gave back to the pool when the message failed.
    async fn read_on_an_idle_connection(
        &self,
        id: &oncely_core::RecordKey,
    ) -> Result<Option<Record>, StoreError> {
        if let Some(mut idle) = self.pool().try_acquire()
            && let Ok(found) = read(&mut *idle, id).await
        {
            return Ok(found);
        }
        read(self.pool(), id).await
    }
}

/// What one try of a claim sent with its `BEGIN` came to.
enum BeginTry {
    /// A new key, claimed in the returned open transaction.
    Claimed(ClaimOutcome, sqlx::Transaction<'static, sqlx::Postgres>),
    /// The existing record's answer (a replay, in flight, a mismatch): no transaction.
    Answer(ClaimOutcome),
    /// Another open transaction holds the key past the try's wait.
    Held,
    /// The existing record is to be claimed (a takeover, a claim anew), or was reaped: the
    /// usual try does it.
    Exists,
}

/// What one claim round writes, from one reading of the clock.
struct ClaimTimes {
    now: UnixMillis,
    lease_expires_at: UnixMillis,
    expires_at: UnixMillis,
}

impl PostgresStore {
    /// How long one try of [`claim_tx`](Self::claim_tx) waits for a key that another open
    /// transaction holds: 10 milliseconds (its `lock_timeout`).
    pub const CLAIM_TRY_LOCK_TIMEOUT: Duration = Duration::from_millis(10);

    /// How long [`claim_tx`](Self::claim_tx) goes on trying to claim a key that another open
    /// transaction holds before it answers [`ClaimOutcome::InFlight`]: 1 second.
    pub const CLAIM_WAIT: Duration = Duration::from_secs(1);

    /// The pause after the first try of [`claim_tx`](Self::claim_tx) that found the key held
    /// (20 milliseconds), doubling up to 200 milliseconds.
    const CLAIM_PAUSE: Duration = Duration::from_millis(20);

    /// The claim of a transactional handler (`oncely-sqlx`'s claimer): begins the first
    /// phase's transaction and claims in it as [`claim_in`](Self::claim_in) does. Returns the
    /// outcome and, exactly when it is [`ClaimOutcome::Claimed`], the open transaction that
    /// holds the claim (commit it with the business writes; dropping it rolls the claim back).
    /// On PostgreSQL a claim is decided inside its transaction (the insert first): a read
    /// before it would cost every first execution a round trip.
    ///
    /// A key that another open transaction holds (a duplicate of a request that another
    /// process is running in its first phase) is waited for in short tries, so that a burst
    /// of such duplicates cannot hold a pool's connections (docs/DESIGN.md, "Duplicates while
    /// the first transaction is open"): each try waits at most
    /// [`CLAIM_TRY_LOCK_TIMEOUT`](Self::CLAIM_TRY_LOCK_TIMEOUT) for the key, then gives its
    /// connection back and pauses (20 milliseconds, doubling up to 200) with no connection
    /// held; the next try replays the first request's response once it committed, or claims
    /// the key if it rolled back. After [`CLAIM_WAIT`](Self::CLAIM_WAIT) the answer is
    /// [`ClaimOutcome::InFlight`] (`409` with `Retry-After` from the layer). Once the claim
    /// holds the key, the rest of the transaction has the phase's `lock_timeout` again
    /// ([`TX_LOCK_TIMEOUT`](Self::TX_LOCK_TIMEOUT), or the session's shorter one the store
    /// relies on), restored by the claim's own statement.
    ///
    /// # Errors
    ///
    /// As [`claim_in`](Self::claim_in), and [`StoreError::Unavailable`] when no connection
    /// could be had.
    pub async fn claim_tx(
        &self,
        req: &ClaimRequest,
    ) -> Result<
        (
            ClaimOutcome,
            Option<sqlx::Transaction<'static, sqlx::Postgres>>,
        ),
        StoreError,
    > {
        let started = std::time::Instant::now();
        let mut pause = Self::CLAIM_PAUSE;
        loop {
            let waited = if self.claim_sent_with_begin() {
                match self.try_claim_with_begin(req).await? {
                    BeginTry::Claimed(outcome, tx) => return Ok((outcome, Some(tx))),
                    BeginTry::Answer(outcome) => return Ok((outcome, None)),
                    BeginTry::Held => true,
                    BeginTry::Exists => false,
                }
            } else {
                false
            };
            if !waited {
                let mut tx = self
                    .pool()
                    .begin_with(sql::BEGIN_CLAIM)
                    .await
                    .map_err(map)?;
                match self.claim_on(&mut tx, req, ClaimPath::Claimer).await {
                    Ok(outcome @ ClaimOutcome::Claimed(_)) => return Ok((outcome, Some(tx))),
                    // Nothing was written: dropping `tx` rolls the empty transaction back.
                    Ok(other) => return Ok((other, None)),
                    // The aborted transaction's rollback is queued, and its connection goes
                    // back to the pool for the pause.
                    Err(e) if is_lock_timeout(&e) => drop(tx),
                    Err(e) => return Err(e),
                }
            }
            let left = Self::CLAIM_WAIT.saturating_sub(started.elapsed());
            if left.is_zero() {
                return Ok((
                    ClaimOutcome::InFlight {
                        lease_expires_at: self.clock().now_millis(),
                    },
                    None,
                ));
            }
            tokio::time::sleep(pause.min(left)).await;
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }

    /// One try of [`claim_tx`](Self::claim_tx) with the claim sent with its `BEGIN`
    /// ([`with_claim_sent_with_begin`](Self::with_claim_sent_with_begin),
    /// [`sql::begin_with_claim`]). A new key: claimed, in the open transaction, one round
    /// trip. A key that exists: its record is read on the pool and [`decide`]d; an answer (a
    /// replay, in flight, a mismatch) needs no transaction at all, and a claim of the existing
    /// record (a takeover, a claim anew) is [`BeginTry::Exists`], for the usual try, which
    /// writes it under its row lock. A key that another open transaction holds past the try's
    /// wait: [`BeginTry::Held`].
    async fn try_claim_with_begin(&self, req: &ClaimRequest) -> Result<BeginTry, StoreError> {
        let now = self.clock().now_millis();
        let lease_expires_at = now.saturating_add(lease_millis(req.lease));
        let message = sql::begin_with_claim(
            req.id.scope.as_str(),
            req.id.key.as_str(),
            i32::from(req.fingerprint.version()),
            &req.fingerprint.digest()[..],
            lease_expires_at,
            req.request.as_ref().map(StoredRequest::encode).as_deref(),
            now,
            now.saturating_add(duration_millis(req.retention)),
            duration_millis_u64(Self::CLAIM_TRY_LOCK_TIMEOUT),
            self.phase_lock_timeout_ms,
        );
        match self.pool().begin_with(sqlx::AssertSqlSafe(message)).await {
            Ok(tx) => Ok(BeginTry::Claimed(
                ClaimOutcome::Claimed(Claim::new(
                    FencingToken(1),
                    lease_expires_at,
                    ClaimKind::New,
                )),
                tx,
            )),
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("55P03") => {
                Ok(BeginTry::Held)
            }
            Err(sqlx::Error::Database(db)) if db.code().as_deref() == Some("23505") => {
                // The record is committed (an insert that met an uncommitted one waited for it,
                // and failed on its commit); a statement of its own reads it.
                match self.read_on_an_idle_connection(&req.id).await? {
                    Some(existing) => match decide(Some(&existing), req, self.clock().now_millis())
                    {
                        Decision::Answer(answer) => Ok(BeginTry::Answer(answer)),
                        Decision::Claim { .. } => Ok(BeginTry::Exists),
                    },
                    // Reaped in between: the usual try inserts it again.
                    None => Ok(BeginTry::Exists),
                }
            }
            Err(e) => Err(map(e)),
        }
    }

    /// Claims `(scope, key)` on `conn` by the shared rule ([`oncely_core::decide`]), without
    /// committing, for a claim that rides inside the caller's transaction.
    ///
    /// The insert comes first (`INSERT ... ON CONFLICT (scope, key) DO NOTHING RETURNING`): for
    /// a new key that is the whole claim, one statement. When it inserted nothing, a `SELECT`
    /// of its own reads the record, so a replay costs two statements. While the caller's
    /// transaction is open, its uncommitted row holds the key: a concurrent claim of the same
    /// key through `claim_in` waits for it in its own insert, then, under `READ COMMITTED`
    /// (PostgreSQL's default), finds the committed record with its `SELECT`, a statement with
    /// a fresh snapshot (and replays it, or answers in flight), or, if this transaction rolled
    /// back, inserts and executes. Under `REPEATABLE READ` or `SERIALIZABLE` (a server whose
    /// default isolation is one of them), a claim that waited for a committed row fails
    /// instead with a serialization failure, returned as [`StoreError::Unavailable`] (a `503`
    /// from the layer: the client's retry replays). The wait is
    /// bounded by the transaction's `lock_timeout` ([`PostgresStore::TX_LOCK_TIMEOUT`], 4
    /// seconds, when it was begun with [`PostgresStore::begin_tx`]); when it runs out the answer
    /// is [`ClaimOutcome::InFlight`] (and the caller's transaction is aborted: roll it back).
    ///
    /// For an existing record the claim reads it, [`decide`]s, and for a takeover or a claim
    /// anew writes it with the same guarded `UPDATE` as
    /// [`KeyStore::claim`](oncely_core::KeyStore::claim), which takes the row lock until the
    /// caller's transaction ends.
    ///
    /// # Errors
    ///
    /// [`StoreError::Unavailable`] when the database fails (the caller's transaction is then
    /// aborted); [`StoreError::Corrupt`] when the record cannot be decoded.
    pub async fn claim_in(
        &self,
        conn: &mut PgConnection,
        req: &ClaimRequest,
    ) -> Result<ClaimOutcome, StoreError> {
        self.claim_on(conn, req, ClaimPath::InTransaction).await
    }

    /// The claim's rounds on `conn` (at most [`PostgresStore::MAX_CLAIM_ROUNDS`]; each extra
    /// round means another request changed the record in between).
    pub(crate) async fn claim_on(
        &self,
        conn: &mut PgConnection,
        req: &ClaimRequest,
        path: ClaimPath,
    ) -> Result<ClaimOutcome, StoreError> {
        let request = req.request.as_ref().map(StoredRequest::encode);
        let request = request.as_deref();
        for _ in 0..Self::MAX_CLAIM_ROUNDS {
            let round = match path {
                ClaimPath::Pooled => {
                    retry_transient!(self.claim_round(conn, req, request, path).await)
                }
                ClaimPath::InTransaction | ClaimPath::Claimer => {
                    self.claim_round(conn, req, request, path).await
                }
            };
            match round {
                Ok(Some(outcome)) => return Ok(outcome),
                Ok(None) => {}
                Err(e) if path == ClaimPath::InTransaction && is_lock_timeout(&e) => {
                    // The key is held by an open transaction longer than we may wait: to
                    // the client that is "in flight" (409 with Retry-After), never a 5xx.
                    return Ok(ClaimOutcome::InFlight {
                        lease_expires_at: self.clock().now_millis(),
                    });
                }
                Err(e) => return Err(e),
            }
        }
        Err(PostgresStoreError::ClaimContention {
            scope: req.id.scope.to_string(),
            key: req.id.key.to_string(),
            rounds: Self::MAX_CLAIM_ROUNDS,
        }
        .into())
    }

    /// One round: the record (read first on the pool, after the insert in a transaction), then
    /// [`decide`] and the guarded write. `None` when another write got in between (the caller
    /// runs another round).
    async fn claim_round(
        &self,
        conn: &mut PgConnection,
        req: &ClaimRequest,
        request: Option<&[u8]>,
        path: ClaimPath,
    ) -> Result<Option<ClaimOutcome>, StoreError> {
        let now = self.clock().now_millis();
        let t = ClaimTimes {
            now,
            lease_expires_at: now.saturating_add(lease_millis(req.lease)),
            expires_at: now.saturating_add(duration_millis(req.retention)),
        };
        let existing = match path {
            ClaimPath::Pooled => read(&mut *conn, &req.id).await?,
            ClaimPath::InTransaction | ClaimPath::Claimer => None,
        };
        let existing = match existing {
            Some(existing) => existing,
            None => {
                let restore = (path == ClaimPath::Claimer).then_some(self.phase_lock_timeout_ms);
                if insert_claim(conn, req, &t, request, restore).await? {
                    return Ok(Some(ClaimOutcome::Claimed(Claim::new(
                        FencingToken(1),
                        t.lease_expires_at,
                        ClaimKind::New,
                    ))));
                }
                if path == ClaimPath::Pooled {
                    // Another claim inserted it since the read: read it again.
                    return Ok(None);
                }
                // The record exists (the normal path: docs/DESIGN.md, "Unique violation
                // surfaced as 500"). A statement of its own reads it: under READ COMMITTED it
                // sees the latest committed version, also one committed while the insert
                // waited for its inserter's transaction (under REPEATABLE READ that insert
                // has failed instead, see `claim_in`).
                match read(&mut *conn, &req.id).await? {
                    Some(existing) => existing,
                    // Deleted (reaped) in between: insert again.
                    None => return Ok(None),
                }
            }
        };
        let outcome = claim_existing(conn, req, &t, request, &existing).await?;
        if path == ClaimPath::Claimer && matches!(outcome, Some(ClaimOutcome::Claimed(_))) {
            sqlx::query(sql::RESTORE_LOCK_TIMEOUT)
                .bind(format!("{}ms", self.phase_lock_timeout_ms))
                .execute(&mut *conn)
                .await
                .map_err(map)?;
        }
        Ok(outcome)
    }
}

/// The claim of an absent key (see [`sql::INSERT_CLAIM`]): `true` when this insert won it.
/// With `restore_ms`, the row it inserts also sets the transaction's `lock_timeout` to that
/// many milliseconds ([`sql::INSERT_CLAIM_RESTORING`]).
async fn insert_claim(
    conn: &mut PgConnection,
    req: &ClaimRequest,
    t: &ClaimTimes,
    request: Option<&[u8]>,
    restore_ms: Option<u64>,
) -> Result<bool, StoreError> {
    let statement = match restore_ms {
        Some(_) => sql::INSERT_CLAIM_RESTORING,
        None => sql::INSERT_CLAIM,
    };
    let mut query = sqlx::query_scalar::<_, i64>(statement)
        .bind(req.id.scope.as_str())
        .bind(req.id.key.as_str())
        .bind(i32::from(req.fingerprint.version()))
        .bind(&req.fingerprint.digest()[..])
        .bind(t.lease_expires_at)
        .bind(request)
        .bind(t.now)
        .bind(t.expires_at);
    if let Some(ms) = restore_ms {
        query = query.bind(format!("{ms}ms"));
    }
    let inserted = query.fetch_optional(conn).await.map_err(map)?;
    Ok(inserted.is_some())
}

/// [`decide`] on an existing record, and for a claim (a takeover, a claim anew) the `UPDATE`
/// guarded by everything `decide` looked at (see `sql::claim_guard!`). `None` when the guard
/// matched no row: the record changed since it was read.
async fn claim_existing(
    conn: &mut PgConnection,
    req: &ClaimRequest,
    t: &ClaimTimes,
    request: Option<&[u8]>,
    existing: &Record,
) -> Result<Option<ClaimOutcome>, StoreError> {
    let (token, kind, recovery_point) = match decide(Some(existing), req, t.now) {
        Decision::Answer(answer) => return Ok(Some(answer)),
        Decision::Claim {
            token,
            kind,
            recovery_point,
        } => (token, kind, recovery_point),
    };
    let (old_lease, old_completed) = match &existing.state {
        RecordState::InFlight {
            lease_expires_at, ..
        } => (Some(*lease_expires_at), None),
        RecordState::Complete { completed_at, .. } => (None, Some(*completed_at)),
        RecordState::Released => (None, None),
        _ => {
            return Err(StoreError::Corrupt(format!(
                "unknown state {}",
                existing.state_name()
            )));
        }
    };
    let guarded = |q: &'static str| {
        sqlx::query(q)
            .bind(req.id.scope.as_str())
            .bind(req.id.key.as_str())
            .bind(existing.token.0)
            .bind(existing.state_name())
            .bind(old_lease)
            .bind(old_completed)
            .bind(existing.recovery_point())
            .bind(token.0)
    };
    let updated = if kind == ClaimKind::Takeover {
        guarded(sql::CLAIM_TAKEOVER)
            .bind(t.lease_expires_at)
            .bind(request)
            .bind(t.expires_at)
            .execute(conn)
            .await
    } else {
        guarded(sql::CLAIM_ANEW)
            .bind(i32::from(req.fingerprint.version()))
            .bind(&req.fingerprint.digest()[..])
            .bind(t.lease_expires_at)
            .bind(request)
            .bind(t.now)
            .bind(t.expires_at)
            .execute(conn)
            .await
    }
    .map_err(map)?;
    if updated.rows_affected() == 0 {
        return Ok(None);
    }
    Ok(Some(ClaimOutcome::Claimed(
        Claim::new(token, t.lease_expires_at, kind).with_recovery_point(recovery_point),
    )))
}
