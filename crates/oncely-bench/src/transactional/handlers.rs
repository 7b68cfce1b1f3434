//! The baseline's, floor's and layer's handlers, written once for every database: each
//! database gives its statements and how it runs them ([`Orders`], in `postgres.rs`,
//! `mysql.rs` and `sqlite.rs`), so the three variants differ only in idempotency and the
//! databases only in their SQL.

use super::endpoint::{
    DbError, created, floor_reply, floor_response, items_of, key_of, now_ms, order_id, order_of,
};
use super::{LEASE_MS, RETENTION_MS, SCOPE};
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use oncely_sqlx::{SqlStore, Tx, TxError};
use sha2::{Digest, Sha256};
use sqlx::{Database, Encode, Executor, FromRow, IntoArguments, Pool, Transaction, Type};
use std::future::Future;

/// The database of the store `S`.
pub(super) type Db<S> = <S as SqlStore>::Database;
/// A connection of it (what a transaction, and the layer's [`Tx`], dereference to).
pub(super) type Conn<S> = <Db<S> as Database>::Connection;

/// What the floor's claim inserts (the scope is [`SCOPE`](super::SCOPE)): epoch milliseconds.
pub(super) struct FloorClaim<'a> {
    /// The idempotency key.
    pub key: &'a str,
    /// The request's fingerprint (SHA-256 of the body).
    pub digest: &'a [u8],
    /// Now, the record's creation time.
    pub now: i64,
    /// Now plus the lease ([`LEASE_MS`]).
    pub lease_expires_at: i64,
    /// Now plus the retention ([`RETENTION_MS`]).
    pub expires_at: i64,
}

/// What the floor's completing `UPDATE` writes (the record of [`FloorClaim`], token 1):
/// status `201`, these headers and body, kept until `expires_at` (epoch milliseconds).
pub(super) struct FloorCompletion<'a> {
    /// The idempotency key.
    pub key: &'a str,
    /// The completion time.
    pub completed_at: i64,
    /// The response's header fields as stored.
    pub headers: &'a [u8],
    /// The response's body.
    pub body: &'a [u8],
    /// The claim's retention end.
    pub expires_at: i64,
}

/// A database's statements for the bench, as the store `Self` (whose layer the
/// [`Variant::Layer`](super::Variant::Layer) runs) keeps its records: each one statement on
/// `conn`, in [`SCOPE`](super::SCOPE).
pub(super) trait Orders: SqlStore {
    /// The baseline's and the floor's `BEGIN` (the layer's own, as the store begins it).
    fn begin(
        pool: &Pool<Db<Self>>,
    ) -> impl Future<Output = Result<Transaction<'static, Db<Self>>, sqlx::Error>> + Send;

    /// The business write of every variant: one row of `bench_orders`.
    fn insert_order(
        conn: &mut Conn<Self>,
        id: &str,
        key: &str,
        items: String,
        created_at: i64,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// The floor's claim; `true` when it inserted the record, `false` for a duplicate.
    fn floor_claim(
        conn: &mut Conn<Self>,
        claim: FloorClaim<'_>,
    ) -> impl Future<Output = Result<bool, sqlx::Error>> + Send;

    /// The floor's completing `UPDATE`.
    fn floor_complete(
        conn: &mut Conn<Self>,
        completion: FloorCompletion<'_>,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;
}

/// [`Variant::Baseline`](super::Variant::Baseline): `BEGIN`, the order, `COMMIT`.
pub(super) async fn baseline<S: Orders>(
    State(pool): State<Pool<Db<S>>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, DbError> {
    let Some(order) = order_of(&body) else {
        return Ok(StatusCode::BAD_REQUEST.into_response());
    };
    let id = order_id();
    let mut tx = S::begin(&pool).await?;
    S::insert_order(&mut tx, &id, &key_of(&headers), items_of(&order), now_ms()).await?;
    tx.commit().await?;
    Ok(created(&id, &order).into_response())
}

/// [`Variant::Floor`](super::Variant::Floor): `BEGIN`, the claim, the order, the completing
/// `UPDATE`, `COMMIT`.
pub(super) async fn floor<S: Orders>(
    State(pool): State<Pool<Db<S>>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Result<Response, DbError> {
    let key = key_of(&headers);
    let digest = Sha256::digest(&body);
    let Some(order) = order_of(&body) else {
        return Ok(StatusCode::BAD_REQUEST.into_response());
    };
    let now = now_ms();
    let mut tx = S::begin(&pool).await?;
    let claim = FloorClaim {
        key: &key,
        digest: &digest,
        now,
        lease_expires_at: now + LEASE_MS,
        expires_at: now + RETENTION_MS,
    };
    if !S::floor_claim(&mut tx, claim).await? {
        // The floor measures first executions only (every key is fresh).
        return Ok(StatusCode::CONFLICT.into_response());
    }
    let id = order_id();
    S::insert_order(&mut tx, &id, &key, items_of(&order), now).await?;
    let (stored_headers, body) = floor_response(&id, &order);
    let completion = FloorCompletion {
        key: &key,
        completed_at: now_ms(),
        headers: &stored_headers,
        body: &body,
        expires_at: now + RETENTION_MS,
    };
    S::floor_complete(&mut tx, completion).await?;
    tx.commit().await?;
    Ok(floor_reply(body))
}

/// [`Variant::Layer`](super::Variant::Layer): the order in the layer's transaction, committed
/// with the stored response.
pub(super) async fn layer<S: Orders>(
    mut tx: Tx<S>,
    body: axum::body::Bytes,
) -> Result<Response, TxError> {
    let Some(order) = order_of(&body) else {
        return Ok(StatusCode::BAD_REQUEST.into_response());
    };
    let id = order_id();
    let key = tx.id().key.as_str().to_owned();
    S::insert_order(&mut tx, &id, &key, items_of(&order), now_ms()).await?;
    tx.commit(created(&id, &order)).await
}

/// The statements of a database that keeps the scope and key as text, numbers its parameters
/// (PostgreSQL's `$n`, SQLite's `?n`) and tells a claim's insert from a duplicate by
/// `RETURNING`: [`Orders`] is then these statements, bound in one order (below) for every such
/// database.
pub(super) trait TextOrders: SqlStore {
    /// The baseline's and the floor's `BEGIN`, or `None` for sqlx's plain `BEGIN`.
    const BEGIN: Option<&'static str>;
    /// The order's insert: `id`, scope, key, `items`, `created_at`.
    const INSERT_ORDER: &'static str;
    /// The floor's claim: scope, key, fingerprint, lease expiry, now, expiry; returns the token
    /// when it inserted, no row for a duplicate.
    const FLOOR_CLAIM: &'static str;
    /// The floor's completion: scope, key, token, completion time, headers, body, expiry.
    const FLOOR_COMPLETE: &'static str;
}

impl<S> Orders for S
where
    S: TextOrders,
    for<'c> &'c mut Conn<S>: Executor<'c, Database = Db<S>>,
    <Db<S> as Database>::Arguments: IntoArguments<Db<S>>,
    for<'a> &'a str: Encode<'a, Db<S>> + Type<Db<S>>,
    for<'a> &'a [u8]: Encode<'a, Db<S>> + Type<Db<S>>,
    for<'a> String: Encode<'a, Db<S>> + Type<Db<S>>,
    for<'a> i64: Encode<'a, Db<S>> + Type<Db<S>>,
    for<'r> (i64,): FromRow<'r, <Db<S> as Database>::Row>,
{
    async fn begin(pool: &Pool<Db<S>>) -> Result<Transaction<'static, Db<S>>, sqlx::Error> {
        match S::BEGIN {
            Some(begin) => pool.begin_with(begin).await,
            None => pool.begin().await,
        }
    }

    async fn insert_order(
        conn: &mut Conn<S>,
        id: &str,
        key: &str,
        items: String,
        created_at: i64,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(S::INSERT_ORDER)
            .bind(id)
            .bind(SCOPE)
            .bind(key)
            .bind(items)
            .bind(created_at)
            .execute(conn)
            .await
            .map(drop)
    }

    async fn floor_claim(conn: &mut Conn<S>, c: FloorClaim<'_>) -> Result<bool, sqlx::Error> {
        let claimed: Option<(i64,)> = sqlx::query_as(S::FLOOR_CLAIM)
            .bind(SCOPE)
            .bind(c.key)
            .bind(c.digest)
            .bind(c.lease_expires_at)
            .bind(c.now)
            .bind(c.expires_at)
            .fetch_optional(conn)
            .await?;
        Ok(claimed.is_some())
    }

    async fn floor_complete(conn: &mut Conn<S>, c: FloorCompletion<'_>) -> Result<(), sqlx::Error> {
        sqlx::query(S::FLOOR_COMPLETE)
            .bind(SCOPE)
            .bind(c.key)
            .bind(1_i64)
            .bind(c.completed_at)
            .bind(c.headers)
            .bind(c.body)
            .bind(c.expires_at)
            .execute(conn)
            .await
            .map(drop)
    }
}
