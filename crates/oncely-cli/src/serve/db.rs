//! The reference API's business data (payments, orders) and the atomic phases that commit it.
//!
//! With an SQL key store (SQLite, PostgreSQL) the business tables live in the same database and
//! every phase is one transaction carrying the business write, the recovery point and, in the
//! last phase, the stored response ([`Phase::Sqlite`], [`Phase::Postgres`]). With the memory or Redis key store the
//! business tables live in an embedded SQLite database and a phase commits its business write
//! first, then records the recovery point ([`Phase::Plain`]); every phase's write is idempotent
//! (conflict-free inserts keyed by `(scope, idempotency_key)`, derived keys at the outside
//! systems), so a crash between the two commits only repeats a write that changes nothing.

use anyhow::{Context as _, Result, anyhow};
use oncely_core::{StoreError, StoredResponse};
use oncely_tower::IdempotencyContext;
use serde::Serialize;
use sqlx::Row;
use std::time::Duration;

/// The business schema. Written once for both dialects (`$N` parameters in ascending order work
/// in SQLite and PostgreSQL).
const SCHEMA: &[&str] = &[
    // One row per logical request: a key reused after the replay window is a new request and
    // makes a new row, so (scope, idempotency_key) is indexed, not unique. Which row belongs to
    // a resumed request is carried by its recovery point (`payment_recorded:pay_…`).
    "CREATE TABLE IF NOT EXISTS oncely_payments (
        id TEXT PRIMARY KEY,
        scope TEXT NOT NULL,
        idempotency_key TEXT NOT NULL,
        amount BIGINT NOT NULL,
        currency TEXT NOT NULL,
        source TEXT NOT NULL,
        description TEXT,
        status TEXT NOT NULL,
        charge_id TEXT,
        receipt_id TEXT,
        created_at BIGINT NOT NULL
    )",
    "CREATE INDEX IF NOT EXISTS oncely_payments_by_scope ON oncely_payments (scope, created_at)",
    "CREATE TABLE IF NOT EXISTS oncely_orders (
        id TEXT PRIMARY KEY,
        scope TEXT NOT NULL,
        idempotency_key TEXT NOT NULL,
        items TEXT NOT NULL,
        created_at BIGINT NOT NULL
    )",
    "CREATE INDEX IF NOT EXISTS oncely_orders_by_scope ON oncely_orders (scope, created_at)",
];

/// Serializes concurrent business-schema migrations (PostgreSQL; released at commit).
#[cfg(feature = "postgres")]
const MIGRATION_LOCK: &str = "SELECT pg_advisory_xact_lock(7461621001)";

const INSERT_PAYMENT: &str = "INSERT INTO oncely_payments
    (id, scope, idempotency_key, amount, currency, source, description, status, created_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7, 'pending', $8)
    ON CONFLICT (id) DO NOTHING";
const SELECT_PAYMENT_BY_ID: &str = "SELECT id, amount, currency, source, description, status,
    charge_id, receipt_id, created_at FROM oncely_payments WHERE scope = $1 AND id = $2";
const LIST_PAYMENTS: &str = "SELECT id, amount, currency, source, description, status,
    charge_id, receipt_id, created_at FROM oncely_payments WHERE scope = $1 ORDER BY created_at, id";
const COUNT_PAYMENTS: &str = "SELECT COUNT(*) AS n FROM oncely_payments";
const SET_CHARGE: &str =
    "UPDATE oncely_payments SET charge_id = $1, status = $2 WHERE scope = $3 AND id = $4";
const SET_RECEIPT: &str = "UPDATE oncely_payments SET receipt_id = $1 WHERE scope = $2 AND id = $3";
const INSERT_ORDER: &str =
    "INSERT INTO oncely_orders (id, scope, idempotency_key, items, created_at)
    VALUES ($1, $2, $3, $4, $5) ON CONFLICT (id) DO NOTHING";
const LIST_ORDERS: &str =
    "SELECT id, items, created_at FROM oncely_orders WHERE scope = $1 ORDER BY created_at, id";
const SELECT_ORDER_BY_ID: &str =
    "SELECT id, items, created_at FROM oncely_orders WHERE scope = $1 AND id = $2";

/// A payment as the API shows it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct Payment {
    pub id: String,
    pub amount: i64,
    pub currency: String,
    pub status: String,
    pub charge_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(skip)]
    pub source: String,
    #[serde(skip)]
    pub receipt_id: Option<String>,
    pub created_at: i64,
}

/// An order as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct Order {
    pub id: String,
    pub items: serde_json::Value,
    pub created_at: i64,
}

/// A new payment's fields.
pub struct NewPayment<'a> {
    pub id: &'a str,
    pub scope: &'a str,
    pub key: &'a str,
    pub amount: i64,
    pub currency: &'a str,
    pub source: &'a str,
    pub description: Option<&'a str>,
    pub created_at: i64,
}

/// Where the business tables live.
#[derive(Clone)]
pub enum Db {
    /// SQLite (the key store's own database, or an embedded one).
    Sqlite(sqlx::SqlitePool),
    /// PostgreSQL (the key store's own database).
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgPool),
}

/// Runs `$body` with `$c` bound to a connection-like executor of either dialect.
macro_rules! dual {
    ($target:expr, $c:ident => $body:expr) => {
        match $target {
            Target::Sqlite($c) => $body,
            #[cfg(feature = "postgres")]
            Target::Postgres($c) => $body,
        }
    };
}

fn payment_from<R: Row>(row: &R) -> Result<Payment>
where
    for<'r> &'r str: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> Option<String>: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    Ok(Payment {
        id: row.try_get("id")?,
        amount: row.try_get("amount")?,
        currency: row.try_get("currency")?,
        source: row.try_get("source")?,
        description: row.try_get("description")?,
        status: row.try_get("status")?,
        charge_id: row.try_get("charge_id")?,
        receipt_id: row.try_get("receipt_id")?,
        created_at: row.try_get("created_at")?,
    })
}

enum Target<'a> {
    Sqlite(&'a mut sqlx::SqliteConnection),
    #[cfg(feature = "postgres")]
    Postgres(&'a mut sqlx::PgConnection),
}

impl Db {
    /// Creates the business tables if missing. Safe when several servers start at once: on
    /// PostgreSQL, concurrent `CREATE TABLE IF NOT EXISTS` can still collide, so the statements
    /// run in one transaction under an advisory lock.
    pub async fn migrate(&self) -> Result<()> {
        #[cfg(feature = "postgres")]
        if let Db::Postgres(p) = self {
            let mut tx = p.begin().await?;
            sqlx::query(MIGRATION_LOCK).execute(&mut *tx).await?;
            for stmt in SCHEMA {
                sqlx::query(*stmt).execute(&mut *tx).await?;
            }
            tx.commit().await?;
            return Ok(());
        }
        for stmt in SCHEMA {
            match self {
                Db::Sqlite(p) => {
                    sqlx::query(*stmt).execute(p).await?;
                }
                #[cfg(feature = "postgres")]
                Db::Postgres(_) => unreachable!("migrated above"),
            }
        }
        Ok(())
    }

    async fn with_conn<T>(
        &self,
        f: impl for<'c> FnOnce(Target<'c>) -> futures::future::BoxFuture<'c, Result<T>>,
    ) -> Result<T> {
        match self {
            Db::Sqlite(p) => {
                let mut c = p.acquire().await?;
                f(Target::Sqlite(&mut c)).await
            }
            #[cfg(feature = "postgres")]
            Db::Postgres(p) => {
                let mut c = p.acquire().await?;
                f(Target::Postgres(&mut c)).await
            }
        }
    }

    /// The caller's payment by id.
    pub async fn payment_by_id(&self, scope: &str, id: &str) -> Result<Option<Payment>> {
        let (scope, id) = (scope.to_owned(), id.to_owned());
        self.with_conn(move |t| {
            Box::pin(async move {
                dual!(t, c => {
                    let row = sqlx::query(SELECT_PAYMENT_BY_ID).bind(&scope).bind(&id).fetch_optional(c).await?;
                    row.as_ref().map(payment_from).transpose()
                })
            })
        })
        .await
    }

    /// The caller's payments, oldest first.
    pub async fn payments(&self, scope: &str) -> Result<Vec<Payment>> {
        let scope = scope.to_owned();
        self.with_conn(move |t| {
            Box::pin(async move {
                dual!(t, c => {
                    let rows = sqlx::query(LIST_PAYMENTS).bind(&scope).fetch_all(c).await?;
                    rows.iter().map(payment_from).collect()
                })
            })
        })
        .await
    }

    /// Every payment of every scope (for metrics).
    pub async fn payment_count(&self) -> Result<i64> {
        self.with_conn(move |t| {
            Box::pin(async move {
                dual!(t, c => {
                    let row = sqlx::query(COUNT_PAYMENTS).fetch_one(c).await?;
                    Ok(row.try_get::<i64, _>("n")?)
                })
            })
        })
        .await
    }

    /// The caller's order by id.
    pub async fn order_by_id(&self, scope: &str, id: &str) -> Result<Option<Order>> {
        let (scope, id) = (scope.to_owned(), id.to_owned());
        self.with_conn(move |t| {
            Box::pin(async move {
                dual!(t, c => {
                    let row = sqlx::query(SELECT_ORDER_BY_ID).bind(&scope).bind(&id).fetch_optional(c).await?;
                    row.map(|r| -> Result<Order> {
                        let items: String = r.try_get("items")?;
                        Ok(Order { id: r.try_get("id")?, items: serde_json::from_str(&items)?, created_at: r.try_get("created_at")? })
                    }).transpose()
                })
            })
        })
        .await
    }

    /// The caller's orders, oldest first.
    pub async fn orders(&self, scope: &str) -> Result<Vec<Order>> {
        let scope = scope.to_owned();
        self.with_conn(move |t| {
            Box::pin(async move {
                dual!(t, c => {
                    let rows = sqlx::query(LIST_ORDERS).bind(&scope).fetch_all(c).await?;
                    rows.iter().map(|r| -> Result<Order> {
                        let items: String = r.try_get("items")?;
                        Ok(Order { id: r.try_get("id")?, items: serde_json::from_str(&items)?, created_at: r.try_get("created_at")? })
                    }).collect()
                })
            })
        })
        .await
    }
}

/// A plain business transaction with no claim behind it (the baseline without the layer).
pub enum BareTx {
    /// On SQLite.
    Sqlite(sqlx::Transaction<'static, sqlx::Sqlite>),
    /// On PostgreSQL.
    #[cfg(feature = "postgres")]
    Postgres(sqlx::Transaction<'static, sqlx::Postgres>),
}

/// One atomic phase of a request.
pub enum Phase {
    /// No idempotency layer: the business write alone (`serve --idempotency off`).
    Bare(BareTx),
    /// A key-store transaction on SQLite: business writes, recovery point and response commit
    /// together.
    Sqlite(oncely_sqlite::Phase),
    /// A key-store transaction on PostgreSQL.
    #[cfg(feature = "postgres")]
    Postgres(oncely_postgres::Phase),
    /// An embedded-SQLite business transaction; the recovery point is recorded in the key store
    /// after it commits.
    Plain {
        tx: sqlx::Transaction<'static, sqlx::Sqlite>,
        ctx: IdempotencyContext,
    },
}

/// How a phase ends.
pub enum PhaseEnd<'a> {
    /// Commit with this recovery point. Plain phases commit the business write first, then
    /// record the recovery point (a resumed request re-reads the row to see how far it got).
    Checkpoint(&'a str),
    /// Commit with this recovery point, which names what the phase creates (an intent). Plain
    /// phases record it *before* committing the business write, so a crash in between resumes
    /// with the same id instead of creating a second row.
    Intent(&'a str),
    /// Commit with the final response stored (transactional stores) or ready for the layer to
    /// store (plain).
    Complete(StoredResponse, Duration),
    /// [`PhaseEnd::Complete`] for a single-phase request that creates a row: plain phases
    /// record the intent (the recovery point) first, like [`PhaseEnd::Intent`].
    CompleteWithIntent(&'a str, StoredResponse, Duration),
}

/// Whether the phase stored the response itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stored {
    /// The response is in the key store, committed with the business write.
    InTransaction,
    /// The layer stores it after the handler returns.
    ByLayer,
}

fn store_err(e: StoreError) -> anyhow::Error {
    match e {
        StoreError::Fenced => anyhow!(FencedError),
        other => anyhow!(other),
    }
}

/// The phase's owner lost its claim (another request took over): stop without writing.
#[derive(Debug)]
pub struct FencedError;

impl std::fmt::Display for FencedError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("fenced: another request took over this idempotency key")
    }
}
impl std::error::Error for FencedError {}

impl Phase {
    fn target(&mut self) -> Target<'_> {
        match self {
            Phase::Sqlite(p) => Target::Sqlite(&mut *p.tx()),
            #[cfg(feature = "postgres")]
            Phase::Postgres(p) => Target::Postgres(&mut *p.tx()),
            Phase::Plain { tx, .. } => Target::Sqlite(&mut *tx),
            Phase::Bare(BareTx::Sqlite(tx)) => Target::Sqlite(&mut *tx),
            #[cfg(feature = "postgres")]
            Phase::Bare(BareTx::Postgres(tx)) => Target::Postgres(&mut *tx),
        }
    }

    /// Records a payment (no-op if this id is already recorded: a resumed phase).
    pub async fn insert_payment(&mut self, p: &NewPayment<'_>) -> Result<()> {
        dual!(self.target(), c => {
            sqlx::query(INSERT_PAYMENT)
                .bind(p.id).bind(p.scope).bind(p.key).bind(p.amount).bind(p.currency)
                .bind(p.source).bind(p.description).bind(p.created_at)
                .execute(c).await.context("insert payment")?;
        });
        Ok(())
    }

    /// Records the charge's outcome.
    pub async fn set_charge(
        &mut self,
        scope: &str,
        key: &str,
        charge_id: Option<&str>,
        status: &str,
    ) -> Result<()> {
        dual!(self.target(), c => {
            sqlx::query(SET_CHARGE).bind(charge_id).bind(status).bind(scope).bind(key)
                .execute(c).await.context("record charge")?;
        });
        Ok(())
    }

    /// Records the receipt's id.
    pub async fn set_receipt(&mut self, scope: &str, id: &str, receipt_id: &str) -> Result<()> {
        dual!(self.target(), c => {
            sqlx::query(SET_RECEIPT).bind(receipt_id).bind(scope).bind(id)
                .execute(c).await.context("record receipt")?;
        });
        Ok(())
    }

    /// The caller's order by id, read inside this phase's transaction.
    pub async fn order(&mut self, scope: &str, id: &str) -> Result<Option<Order>> {
        dual!(self.target(), c => {
            let row = sqlx::query(SELECT_ORDER_BY_ID).bind(scope).bind(id).fetch_optional(c).await?;
            row.map(|r| -> Result<Order> {
                let items: String = r.try_get("items")?;
                Ok(Order { id: r.try_get("id")?, items: serde_json::from_str(&items)?, created_at: r.try_get("created_at")? })
            }).transpose()
        })
    }

    /// Records an order (no-op if this id is already recorded: a resumed phase).
    pub async fn insert_order(
        &mut self,
        id: &str,
        scope: &str,
        key: &str,
        items: &str,
        created_at: i64,
    ) -> Result<()> {
        dual!(self.target(), c => {
            sqlx::query(INSERT_ORDER).bind(id).bind(scope).bind(key).bind(items).bind(created_at)
                .execute(c).await.context("insert order")?;
        });
        Ok(())
    }

    /// Commits the phase.
    ///
    /// # Errors
    ///
    /// [`FencedError`] when another request took the key over (nothing committed, for the
    /// transactional stores), or a database error.
    pub async fn commit(self, end: PhaseEnd<'_>) -> Result<Stored> {
        match (self, end) {
            (Phase::Bare(tx), _) => {
                match tx {
                    BareTx::Sqlite(tx) => tx.commit().await.context("commit")?,
                    #[cfg(feature = "postgres")]
                    BareTx::Postgres(tx) => tx.commit().await.context("commit")?,
                }
                Ok(Stored::ByLayer)
            }
            (Phase::Plain { tx, ctx }, PhaseEnd::Intent(rp)) => {
                ctx.checkpoint(rp).await.map_err(store_err)?;
                tx.commit().await.context("commit phase")?;
                Ok(Stored::InTransaction)
            }
            (Phase::Plain { tx, ctx }, PhaseEnd::CompleteWithIntent(rp, ..)) => {
                ctx.checkpoint(rp).await.map_err(store_err)?;
                tx.commit().await.context("commit phase")?;
                Ok(Stored::ByLayer)
            }
            (phase, PhaseEnd::Intent(rp)) => Box::pin(phase.commit(PhaseEnd::Checkpoint(rp))).await,
            (phase, PhaseEnd::CompleteWithIntent(_, r, retention)) => {
                Box::pin(phase.commit(PhaseEnd::Complete(r, retention))).await
            }
            (Phase::Sqlite(p), PhaseEnd::Checkpoint(rp)) => p
                .checkpoint(rp)
                .await
                .map_err(store_err)
                .map(|_| Stored::InTransaction),
            (Phase::Sqlite(p), PhaseEnd::Complete(r, retention)) => p
                .complete(r, retention)
                .await
                .map_err(store_err)
                .map(|_| Stored::InTransaction),
            #[cfg(feature = "postgres")]
            (Phase::Postgres(p), PhaseEnd::Checkpoint(rp)) => p
                .checkpoint(rp)
                .await
                .map_err(store_err)
                .map(|_| Stored::InTransaction),
            #[cfg(feature = "postgres")]
            (Phase::Postgres(p), PhaseEnd::Complete(r, retention)) => p
                .complete(r, retention)
                .await
                .map_err(store_err)
                .map(|_| Stored::InTransaction),
            (Phase::Plain { tx, ctx }, PhaseEnd::Checkpoint(rp)) => {
                tx.commit().await.context("commit phase")?;
                ctx.checkpoint(rp).await.map_err(store_err)?;
                Ok(Stored::InTransaction)
            }
            (Phase::Plain { tx, .. }, PhaseEnd::Complete(..)) => {
                tx.commit().await.context("commit phase")?;
                Ok(Stored::ByLayer)
            }
        }
    }
}
