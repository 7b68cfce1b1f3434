//! The business rows as the API shows them ([`Payment`], [`Order`], [`Page`]) and what a write
//! is given ([`NewPayment`], [`WebhookEvent`]).

use anyhow::Result;
use serde::Serialize;
use sqlx::Row;

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

pub(super) fn payment_from<R: Row>(row: &R) -> Result<Payment>
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

pub(super) fn order_from<R: Row>(r: &R) -> sqlx::Result<Order>
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
