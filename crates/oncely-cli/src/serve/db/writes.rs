//! [`BusinessDb`]: the business writes (and the reads a resumed request needs), on the
//! connection of the handler's transaction, for each of the three databases.

use super::rows::{NewPayment, Payment, WebhookEvent, payment_from};
use super::sql::Q;

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
