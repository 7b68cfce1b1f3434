//! The reads outside a handler's transaction: the caller's payments, orders and webhook events,
//! listed or by id, and the count of payments for the metrics.

use super::conn::{Db, Target, dual};
use super::rows::{Order, Payment, order_from, payment_from};
use super::sql::Q;
use super::writes::BusinessDb;
use anyhow::Result;
use sqlx::Row;

impl Db {
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
