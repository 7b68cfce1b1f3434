//! The reference API's business data (payments, orders, applied webhook events): the schema, the reads, and the writes
//! a handler makes inside its [`oncely_sqlx::Tx`] ([`BusinessDb`], one SQL text for the three
//! databases, rewritten for MySQL's placeholders and upsert).
//!
//! With an SQL key store (SQLite, PostgreSQL, MySQL / MariaDB) the business tables live in the
//! same database, so
//! a phase's business writes, its recovery point and (in the last phase) the stored response
//! commit together. With the memory or Redis key store they live in an embedded SQLite
//! database ([`oncely_sqlx::Split`]); every write is idempotent (inserts keyed by the ids the
//! recovery points carry, `ON CONFLICT DO NOTHING`), so a crash between the two stores' commits
//! only repeats a write that changes nothing.

use anyhow::Result;
use serde::Serialize;
use sqlx::Row;

/// The business schema of SQLite and PostgreSQL, written once for both.
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

/// The business schema on MySQL and MariaDB: the same tables, with the indexes declared inside
/// `CREATE TABLE IF NOT EXISTS` (MySQL has no `CREATE INDEX IF NOT EXISTS`) and key columns of
/// bounded length (a `TEXT` column cannot be a key). The scope is bytes (`VARBINARY`), as in the
/// key store: every text collation folds case or ignores trailing spaces, either of which would
/// let one caller read another's rows. The ids are server-made (`pay_…`), so a text collation
/// (`utf8mb4_bin`, the tables' default) is exact enough for them.
#[cfg(feature = "mysql")]
const MYSQL_SCHEMA: &[&str] = &[
    "CREATE TABLE IF NOT EXISTS oncely_payments (
        id VARCHAR(255) PRIMARY KEY,
        scope VARBINARY(1024) NOT NULL,
        idempotency_key TEXT NOT NULL,
        amount BIGINT NOT NULL,
        currency TEXT NOT NULL,
        source TEXT NOT NULL,
        description TEXT,
        status VARCHAR(16) NOT NULL,
        charge_id TEXT,
        receipt_id TEXT,
        created_at BIGINT NOT NULL,
        INDEX oncely_payments_by_scope (scope, created_at)
    ) ENGINE = InnoDB DEFAULT CHARACTER SET = utf8mb4 COLLATE = utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS oncely_orders (
        id VARCHAR(255) PRIMARY KEY,
        scope VARBINARY(1024) NOT NULL,
        idempotency_key TEXT NOT NULL,
        items LONGTEXT NOT NULL,
        created_at BIGINT NOT NULL,
        INDEX oncely_orders_by_scope (scope, created_at)
    ) ENGINE = InnoDB DEFAULT CHARACTER SET = utf8mb4 COLLATE = utf8mb4_bin",
    "CREATE TABLE IF NOT EXISTS oncely_webhook_events (
        id VARCHAR(255) PRIMARY KEY,
        sender TEXT NOT NULL,
        event_id TEXT NOT NULL,
        kind TEXT NOT NULL,
        scope VARBINARY(1024),
        payment_id VARCHAR(255),
        received_at BIGINT NOT NULL,
        INDEX oncely_webhook_events_by_payment (scope, payment_id, received_at)
    ) ENGINE = InnoDB DEFAULT CHARACTER SET = utf8mb4 COLLATE = utf8mb4_bin",
];

/// Serializes concurrent business-schema migrations on MySQL and MariaDB: a named lock of the
/// connection's session, keyed by the database (DDL commits by itself there, so no transaction
/// can hold it), waited for up to the given number of seconds.
#[cfg(feature = "mysql")]
const MYSQL_MIGRATION_LOCK: &str =
    "SELECT GET_LOCK(CONCAT('oncely_business_', MD5(DATABASE())), ?)";
/// Releases [`MYSQL_MIGRATION_LOCK`]'s lock.
#[cfg(feature = "mysql")]
const MYSQL_MIGRATION_UNLOCK: &str =
    "SELECT RELEASE_LOCK(CONCAT('oncely_business_', MD5(DATABASE())))";
/// How long a MySQL migration waits for another server's: 60 seconds.
#[cfg(feature = "mysql")]
const MYSQL_MIGRATION_WAIT_SECS: u64 = 60;

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

/// A statement of the business database: written once, in the `$N` dialect of SQLite and
/// PostgreSQL ([`Q::standard`]), and rewritten for MySQL and MariaDB ([`Q::mysql`]); a
/// [`BusinessDb`] gives its own text with [`BusinessDb::sql`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Q {
    InsertPayment,
    SelectPaymentById,
    ListPayments,
    CountPayments,
    SetCharge,
    SetReceipt,
    InsertOrder,
    ListOrders,
    InsertWebhookEvent,
    ConfirmCharge,
    ListWebhookEvents,
    SelectOrderById,
}

impl Q {
    /// Every statement, in declaration order (`Q::ALL[q as usize] == q`).
    #[cfg_attr(not(any(feature = "mysql", test)), allow(dead_code))]
    const ALL: [Self; 12] = [
        Self::InsertPayment,
        Self::SelectPaymentById,
        Self::ListPayments,
        Self::CountPayments,
        Self::SetCharge,
        Self::SetReceipt,
        Self::InsertOrder,
        Self::ListOrders,
        Self::InsertWebhookEvent,
        Self::ConfirmCharge,
        Self::ListWebhookEvents,
        Self::SelectOrderById,
    ];

    /// The statement in SQLite's and PostgreSQL's dialect (`$N` parameters, each used once, in
    /// ascending order).
    const fn standard(self) -> &'static str {
        match self {
            Self::InsertPayment => INSERT_PAYMENT,
            Self::SelectPaymentById => SELECT_PAYMENT_BY_ID,
            Self::ListPayments => LIST_PAYMENTS,
            Self::CountPayments => COUNT_PAYMENTS,
            Self::SetCharge => SET_CHARGE,
            Self::SetReceipt => SET_RECEIPT,
            Self::InsertOrder => INSERT_ORDER,
            Self::ListOrders => LIST_ORDERS,
            Self::InsertWebhookEvent => INSERT_WEBHOOK_EVENT,
            Self::ConfirmCharge => CONFIRM_CHARGE,
            Self::ListWebhookEvents => LIST_WEBHOOK_EVENTS,
            Self::SelectOrderById => SELECT_ORDER_BY_ID,
        }
    }

    /// The statement in MySQL's dialect ([`to_mysql`] of [`Q::standard`], made once).
    #[cfg(feature = "mysql")]
    fn mysql(self) -> &'static str {
        static MYSQL: std::sync::LazyLock<Vec<String>> =
            std::sync::LazyLock::new(|| Q::ALL.iter().map(|q| to_mysql(q.standard())).collect());
        &MYSQL[self as usize]
    }
}

/// `sql` in MySQL's dialect: `?` for each `$N` (so the statements must use each parameter
/// once, in ascending order: checked here), and `ON CONFLICT (id) DO NOTHING` as `ON DUPLICATE
/// KEY UPDATE id = id`, which leaves an existing row as it is (not `INSERT IGNORE`, which would
/// also turn a value the database refuses into a warning).
#[cfg_attr(not(any(feature = "mysql", test)), allow(dead_code))]
fn to_mysql(sql: &str) -> String {
    let sql = sql.replace(
        "ON CONFLICT (id) DO NOTHING",
        "ON DUPLICATE KEY UPDATE id = id",
    );
    let mut out = String::with_capacity(sql.len());
    let mut next = 1;
    let mut rest = sql.as_str();
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let digits = rest[at + 1..]
            .find(|c: char| !c.is_ascii_digit())
            .map_or(rest.len() - at - 1, |n| n);
        assert_eq!(
            rest[at + 1..at + 1 + digits].parse::<u32>().ok(),
            Some(next),
            "parameters used once each, in ascending order: {sql}"
        );
        next += 1;
        out.push('?');
        rest = &rest[at + 1 + digits..];
    }
    out.push_str(rest);
    out
}

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
    /// MySQL or MariaDB (the key store's own database).
    #[cfg(feature = "mysql")]
    Mysql(sqlx::MySqlPool),
}

/// Runs `$body` with `$c` bound to a connection of the target's database and the type `$db` to
/// that database (a [`BusinessDb`], whose [`BusinessDb::sql`] gives the statements' text).
macro_rules! dual {
    ($target:expr, $db:ident, $c:ident => $body:expr) => {
        match $target {
            Target::Sqlite($c) => {
                type $db = sqlx::Sqlite;
                $body
            }
            #[cfg(feature = "postgres")]
            Target::Postgres($c) => {
                type $db = sqlx::Postgres;
                $body
            }
            #[cfg(feature = "mysql")]
            Target::Mysql($c) => {
                type $db = sqlx::MySql;
                $body
            }
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
    #[cfg(feature = "mysql")]
    Mysql(&'a mut sqlx::MySqlConnection),
}

impl Db {
    /// Creates the business tables if missing. Safe when several servers start at once: on
    /// PostgreSQL, concurrent `CREATE TABLE IF NOT EXISTS` can still collide, so the statements
    /// run in one transaction under an advisory lock; on MySQL and MariaDB, under a named lock
    /// (`GET_LOCK`) of one connection, waited for up to 60 seconds.
    ///
    /// # Errors
    ///
    /// The database's error, or (MySQL) another server held the lock for longer than the wait.
    pub async fn migrate(&self) -> Result<()> {
        #[cfg(feature = "mysql")]
        if let Db::Mysql(p) = self {
            use sqlx::Connection as _;
            let mut c = p.acquire().await?;
            let got: Option<i64> = sqlx::query_scalar(MYSQL_MIGRATION_LOCK)
                .bind(MYSQL_MIGRATION_WAIT_SECS)
                .fetch_one(&mut *c)
                .await?;
            if got != Some(1) {
                anyhow::bail!(
                    "another server held the business schema's lock for over {MYSQL_MIGRATION_WAIT_SECS} seconds"
                );
            }
            let mut ran = Ok(());
            for stmt in MYSQL_SCHEMA {
                if let Err(e) = sqlx::query(*stmt).execute(&mut *c).await {
                    ran = Err(e);
                    break;
                }
            }
            // A named lock belongs to the session: a pooled connection must not keep it.
            if sqlx::query(MYSQL_MIGRATION_UNLOCK)
                .execute(&mut *c)
                .await
                .is_err()
            {
                let _ = c.detach().close().await;
            }
            return Ok(ran?);
        }
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
                #[cfg(feature = "mysql")]
                Db::Mysql(_) => unreachable!("migrated above"),
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
            #[cfg(feature = "mysql")]
            Db::Mysql(p) => {
                let mut c = p.acquire().await?;
                f(Target::Mysql(&mut c)).await
            }
        }
    }

    /// The caller's payment by id.
    pub async fn payment_by_id(&self, scope: &str, id: &str) -> Result<Option<Payment>> {
        let (scope, id) = (scope.to_owned(), id.to_owned());
        self.with_conn(move |t| {
            Box::pin(async move {
                dual!(t, D, c => {
                    let row = sqlx::query(D::sql(Q::SelectPaymentById)).bind(&scope).bind(&id).fetch_optional(c).await?;
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
                dual!(t, D, c => {
                    let rows = sqlx::query(D::sql(Q::ListPayments)).bind(&scope).fetch_all(c).await?;
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
                dual!(t, D, c => {
                    let row = sqlx::query(D::sql(Q::CountPayments)).fetch_one(c).await?;
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
                dual!(t, D, c => {
                    let row = sqlx::query(D::sql(Q::SelectOrderById)).bind(&scope).bind(&id).fetch_optional(c).await?;
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
                dual!(t, D, c => {
                    let rows = sqlx::query(D::sql(Q::ListWebhookEvents)).bind(&scope).bind(&id).fetch_all(c).await?;
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
                dual!(t, D, c => {
                    let rows = sqlx::query(D::sql(Q::ListOrders)).bind(&scope).fetch_all(c).await?;
                    Ok(rows.iter().map(order_from).collect::<sqlx::Result<Vec<_>>>()?)
                })
            })
        })
        .await
    }
}

/// The business writes (and the reads a resumed request needs), on the connection of the
/// handler's transaction. The SQL is written once ([`Q`]), in each database's dialect by
/// [`BusinessDb::sql`].
#[async_trait::async_trait]
pub trait BusinessDb: sqlx::Database {
    /// The text of statement `q` in this database's dialect.
    fn sql(q: Q) -> &'static str;
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
    ($db:ty, $sql:expr) => {
        #[async_trait::async_trait]
        impl BusinessDb for $db {
            fn sql(q: Q) -> &'static str {
                $sql(q)
            }
            async fn insert_payment(
                c: &mut <$db as sqlx::Database>::Connection,
                p: &NewPayment<'_>,
            ) -> sqlx::Result<()> {
                sqlx::query(Self::sql(Q::InsertPayment))
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
                sqlx::query(Self::sql(Q::SetCharge))
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
                sqlx::query(Self::sql(Q::SetReceipt))
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
                let row = sqlx::query(Self::sql(Q::SelectPaymentById))
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
                sqlx::query(Self::sql(Q::InsertOrder))
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
                let row = sqlx::query(Self::sql(Q::SelectOrderById))
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
                sqlx::query(Self::sql(Q::InsertWebhookEvent))
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
                sqlx::query(Self::sql(Q::ConfirmCharge))
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

business_db!(sqlx::Sqlite, Q::standard);
#[cfg(feature = "postgres")]
business_db!(sqlx::Postgres, Q::standard);
#[cfg(feature = "mysql")]
business_db!(sqlx::MySql, Q::mysql);

#[cfg(test)]
mod tests {
    use super::{Q, to_mysql};

    #[test]
    fn every_statement_is_listed_in_order_and_has_a_mysql_form() {
        for (i, q) in Q::ALL.iter().enumerate() {
            assert_eq!(*q as usize, i);
            let mysql = to_mysql(q.standard());
            assert!(
                !mysql.contains('$') && !mysql.contains("ON CONFLICT"),
                "{mysql}"
            );
        }
    }

    #[test]
    fn the_mysql_form_has_question_marks_and_on_duplicate_key() {
        assert_eq!(
            to_mysql("INSERT INTO t (id, a) VALUES ($1, $2) ON CONFLICT (id) DO NOTHING"),
            "INSERT INTO t (id, a) VALUES (?, ?) ON DUPLICATE KEY UPDATE id = id"
        );
        assert_eq!(
            to_mysql("UPDATE t SET a = $1 WHERE id = $2"),
            "UPDATE t SET a = ? WHERE id = ?"
        );
    }

    #[test]
    #[should_panic(expected = "ascending order")]
    fn parameters_out_of_order_are_refused() {
        to_mysql("UPDATE t SET a = $2 WHERE id = $1");
    }
}
