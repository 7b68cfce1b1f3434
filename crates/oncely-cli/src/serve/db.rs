//! The reference API's business data (payments, orders, applied webhook events): the schema, the reads, and the writes
//! a handler makes inside its [`oncely_sqlx::Tx`] ([`BusinessDb`], one SQL text for both
//! dialects).
//!
//! With an SQL key store (SQLite, PostgreSQL) the business tables live in the same database, so
//! a phase's business writes, its recovery point and (in the last phase) the stored response
//! commit together. With the memory or Redis key store they live in an embedded SQLite
//! database ([`oncely_sqlx::Split`]); every write is idempotent (inserts keyed by the ids the
//! recovery points carry, `ON CONFLICT DO NOTHING`), so a crash between the two stores' commits
//! only repeats a write that changes nothing.

use anyhow::Result;
use serde::Serialize;
use sqlx::Row;

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
    // One row per application of a webhook event. Deliberately no unique constraint on
    // (sender, event_id): the table counts applications, so a duplicate would show as a second
    // row; the receiver's claim, in the same transaction, is what keeps them to one (the
    // webhook gate counts the rows). A production receiver may add one as a second fence.
    "CREATE TABLE IF NOT EXISTS oncely_webhook_events (
        id TEXT PRIMARY KEY,
        sender TEXT NOT NULL,
        event_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        scope TEXT,
        payment_id TEXT,
        received_at BIGINT NOT NULL
    )",
    "CREATE INDEX IF NOT EXISTS oncely_webhook_events_by_payment ON oncely_webhook_events (scope, payment_id, received_at)",
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
const INSERT_WEBHOOK_EVENT: &str = "INSERT INTO oncely_webhook_events
    (id, sender, event_id, kind, scope, payment_id, received_at)
    VALUES ($1, $2, $3, $4, $5, $6, $7)";
// A charge.succeeded confirms the charge of a payment still pending (its first attempt died
// between the charge and its phase's commit) and names its charge; a payment already settled
// keeps what its own phases recorded.
const CONFIRM_CHARGE: &str = "UPDATE oncely_payments SET status = 'succeeded',
    charge_id = COALESCE(charge_id, $1) WHERE scope = $2 AND id = $3 AND status IN ('pending', 'succeeded')";
const LIST_WEBHOOK_EVENTS: &str = "SELECT id, sender, event_id, kind, received_at
    FROM oncely_webhook_events WHERE scope = $1 AND payment_id = $2 ORDER BY received_at, id";
const SELECT_ORDER_BY_ID: &str =
    "SELECT id, items, created_at FROM oncely_orders WHERE scope = $1 AND id = $2";

/// A payment as the API shows it.
#[derive(Debug, Clone, Serialize, PartialEq, Eq, utoipa::ToSchema)]
pub struct Payment {
    pub id: String,
    /// Minor units (cents).
    pub amount: i64,
    pub currency: String,
    #[schema(schema_with = payment_status)]
    pub status: String,
    pub charge_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(skip)]
    pub source: String,
    #[serde(skip)]
    pub receipt_id: Option<String>,
    /// Epoch milliseconds.
    pub created_at: i64,
}

/// `pending`, `succeeded` or `declined`.
fn payment_status() -> utoipa::openapi::Object {
    utoipa::openapi::ObjectBuilder::new()
        .schema_type(utoipa::openapi::Type::String)
        .enum_values(Some(["pending", "succeeded", "declined"]))
        .build()
}

/// An order as the API shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct Order {
    pub id: String,
    #[schema(value_type = Vec<Object>)]
    pub items: serde_json::Value,
    /// Epoch milliseconds.
    pub created_at: i64,
}

/// A list of `T`: `{"data": [...]}`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct Page<T> {
    /// The items, oldest first.
    pub data: Vec<T>,
}

/// One application of a webhook event, as recorded.
pub struct WebhookEvent<'a> {
    /// This application's own id (`whe_…`).
    pub id: &'a str,
    /// The sender whose signature verified.
    pub sender: &'a str,
    /// The event's id (`webhook-id`).
    pub event_id: &'a str,
    /// The event's type (`charge.succeeded`).
    pub kind: &'a str,
    /// The account the event is about, if it names one.
    pub scope: Option<&'a str>,
    /// The payment the event is about, if it names one.
    pub payment: Option<&'a str>,
    /// When it was applied, epoch milliseconds.
    pub received_at: i64,
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
                    Ok(row.as_ref().map(order_from).transpose()?)
                })
            })
        })
        .await
    }

    /// The webhook events applied to the caller's payment `id`, oldest first: one row per
    /// application (`id`, `sender`, `event_id`, `type`, `received_at`).
    pub async fn webhook_events(&self, scope: &str, id: &str) -> Result<Vec<serde_json::Value>> {
        let (scope, id) = (scope.to_owned(), id.to_owned());
        self.with_conn(move |t| {
            Box::pin(async move {
                dual!(t, c => {
                    let rows = sqlx::query(LIST_WEBHOOK_EVENTS).bind(&scope).bind(&id).fetch_all(c).await?;
                    rows.iter()
                        .map(|r| {
                            Ok(serde_json::json!({
                                "id": r.try_get::<String, _>("id")?,
                                "sender": r.try_get::<String, _>("sender")?,
                                "event_id": r.try_get::<String, _>("event_id")?,
                                "type": r.try_get::<String, _>("kind")?,
                                "received_at": r.try_get::<i64, _>("received_at")?,
                            }))
                        })
                        .collect::<Result<Vec<_>>>()
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
                    Ok(rows.iter().map(order_from).collect::<sqlx::Result<Vec<_>>>()?)
                })
            })
        })
        .await
    }
}

/// The business writes (and the reads a resumed request needs), on the connection of the
/// handler's transaction. The SQL is the same for both dialects (`$N` parameters in ascending
/// order work in SQLite and PostgreSQL).
#[async_trait::async_trait]
pub trait BusinessDb: sqlx::Database {
    /// Records a payment (a no-op if this id is already recorded: a resumed phase).
    async fn insert_payment(c: &mut Self::Connection, p: &NewPayment<'_>) -> sqlx::Result<()>;
    /// Records the charge's outcome.
    async fn set_charge(
        c: &mut Self::Connection,
        scope: &str,
        id: &str,
        charge_id: Option<&str>,
        status: &str,
    ) -> sqlx::Result<()>;
    /// Records the receipt's id.
    async fn set_receipt(
        c: &mut Self::Connection,
        scope: &str,
        id: &str,
        receipt_id: &str,
    ) -> sqlx::Result<()>;
    /// The caller's payment by id.
    async fn payment(
        c: &mut Self::Connection,
        scope: &str,
        id: &str,
    ) -> sqlx::Result<Option<Payment>>;
    /// Records an order (a no-op if this id is already recorded: a resumed request).
    async fn insert_order(
        c: &mut Self::Connection,
        id: &str,
        scope: &str,
        key: &str,
        items: &str,
        created_at: i64,
    ) -> sqlx::Result<()>;
    /// The caller's order by id.
    async fn order(c: &mut Self::Connection, scope: &str, id: &str) -> sqlx::Result<Option<Order>>;
    /// Records one application of a webhook event.
    async fn record_webhook_event(
        c: &mut Self::Connection,
        e: &WebhookEvent<'_>,
    ) -> sqlx::Result<()>;
    /// Confirms the charge `charge_id` of the payment `id` of `scope`; returns the rows changed.
    async fn confirm_charge(
        c: &mut Self::Connection,
        scope: &str,
        id: &str,
        charge_id: &str,
    ) -> sqlx::Result<u64>;
}

fn order_from<R: Row>(r: &R) -> sqlx::Result<Order>
where
    for<'r> &'r str: sqlx::ColumnIndex<R>,
    for<'r> String: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
    for<'r> i64: sqlx::Decode<'r, R::Database> + sqlx::Type<R::Database>,
{
    let items: String = r.try_get("items")?;
    Ok(Order {
        id: r.try_get("id")?,
        items: serde_json::from_str(&items).map_err(|e| sqlx::Error::Decode(Box::new(e)))?,
        created_at: r.try_get("created_at")?,
    })
}

macro_rules! business_db {
    ($db:ty) => {
        #[async_trait::async_trait]
        impl BusinessDb for $db {
            async fn insert_payment(
                c: &mut <$db as sqlx::Database>::Connection,
                p: &NewPayment<'_>,
            ) -> sqlx::Result<()> {
                sqlx::query(INSERT_PAYMENT)
                    .bind(p.id)
                    .bind(p.scope)
                    .bind(p.key)
                    .bind(p.amount)
                    .bind(p.currency)
                    .bind(p.source)
                    .bind(p.description)
                    .bind(p.created_at)
                    .execute(c)
                    .await
                    .map(drop)
            }
            async fn set_charge(
                c: &mut <$db as sqlx::Database>::Connection,
                scope: &str,
                id: &str,
                charge_id: Option<&str>,
                status: &str,
            ) -> sqlx::Result<()> {
                sqlx::query(SET_CHARGE)
                    .bind(charge_id)
                    .bind(status)
                    .bind(scope)
                    .bind(id)
                    .execute(c)
                    .await
                    .map(drop)
            }
            async fn set_receipt(
                c: &mut <$db as sqlx::Database>::Connection,
                scope: &str,
                id: &str,
                receipt_id: &str,
            ) -> sqlx::Result<()> {
                sqlx::query(SET_RECEIPT)
                    .bind(receipt_id)
                    .bind(scope)
                    .bind(id)
                    .execute(c)
                    .await
                    .map(drop)
            }
            async fn payment(
                c: &mut <$db as sqlx::Database>::Connection,
                scope: &str,
                id: &str,
            ) -> sqlx::Result<Option<Payment>> {
                let row = sqlx::query(SELECT_PAYMENT_BY_ID)
                    .bind(scope)
                    .bind(id)
                    .fetch_optional(c)
                    .await?;
                row.as_ref()
                    .map(|r| payment_from(r).map_err(|e| sqlx::Error::Decode(e.into())))
                    .transpose()
            }
            async fn insert_order(
                c: &mut <$db as sqlx::Database>::Connection,
                id: &str,
                scope: &str,
                key: &str,
                items: &str,
                created_at: i64,
            ) -> sqlx::Result<()> {
                sqlx::query(INSERT_ORDER)
                    .bind(id)
                    .bind(scope)
                    .bind(key)
                    .bind(items)
                    .bind(created_at)
                    .execute(c)
                    .await
                    .map(drop)
            }
            async fn order(
                c: &mut <$db as sqlx::Database>::Connection,
                scope: &str,
                id: &str,
            ) -> sqlx::Result<Option<Order>> {
                let row = sqlx::query(SELECT_ORDER_BY_ID)
                    .bind(scope)
                    .bind(id)
                    .fetch_optional(c)
                    .await?;
                row.as_ref().map(order_from).transpose()
            }
            async fn record_webhook_event(
                c: &mut <$db as sqlx::Database>::Connection,
                e: &WebhookEvent<'_>,
            ) -> sqlx::Result<()> {
                sqlx::query(INSERT_WEBHOOK_EVENT)
                    .bind(e.id)
                    .bind(e.sender)
                    .bind(e.event_id)
                    .bind(e.kind)
                    .bind(e.scope)
                    .bind(e.payment)
                    .bind(e.received_at)
                    .execute(c)
                    .await
                    .map(drop)
            }
            async fn confirm_charge(
                c: &mut <$db as sqlx::Database>::Connection,
                scope: &str,
                id: &str,
                charge_id: &str,
            ) -> sqlx::Result<u64> {
                sqlx::query(CONFIRM_CHARGE)
                    .bind(charge_id)
                    .bind(scope)
                    .bind(id)
                    .execute(c)
                    .await
                    .map(|r| r.rows_affected())
            }
        }
    };
}

business_db!(sqlx::Sqlite);
#[cfg(feature = "postgres")]
business_db!(sqlx::Postgres);
