//! `POST /v1/orders`: one phase, one commit (the claim, the order row and the stored response).

use super::Failure;
use super::body::{invalid, parse_json, require_json};
use super::json_response;
use crate::serve::db::BusinessDb;
use axum::Extension;
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use oncely_core::{Clock, Scope, SystemClock};
use oncely_sqlx::{SqlStore, Tx, TxError};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// The step of a single-phase order: names the order this attempt created, so a resumed
/// request (on a store that cannot commit the response with the row) answers with the same
/// order instead of creating a second one.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum OrderStep {
    /// The order row is recorded.
    Recorded {
        /// The order's id.
        order: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OrderRequest {
    items: Vec<Value>,
}

/// `POST /v1/orders`: one phase, one commit (the claim, the order and the stored response).
pub async fn create_order<S>(
    Extension(scope): Extension<Scope>,
    headers: HeaderMap,
    mut tx: Tx<S>,
    body: Bytes,
) -> Response
where
    S: SqlStore,
    S::Database: BusinessDb,
{
    if let Err(resp) = require_json(&headers) {
        return resp;
    }
    let req: OrderRequest = match parse_json(&body) {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    let mut errors = Vec::new();
    if req.items.is_empty() || req.items.len() > 100 {
        errors.push(json!({"field": "items", "detail": "1 to 100 items"}));
    }
    let mut items = Vec::new();
    for (i, item) in req.items.iter().enumerate() {
        let sku = item["sku"]
            .as_str()
            .filter(|s| !s.is_empty() && s.len() <= 64);
        let qty = item["quantity"]
            .as_i64()
            .or_else(|| {
                item["quantity"]
                    .as_f64()
                    .filter(|f| f.fract() == 0.0 && f.abs() < 1e6)
                    .map(|f| f as i64)
            })
            .filter(|q| *q > 0 && *q <= 10_000);
        let only_known = item
            .as_object()
            .is_some_and(|o| o.keys().all(|k| k == "sku" || k == "quantity"));
        match (sku, qty, only_known) {
            (Some(sku), Some(qty), true) => items.push(json!({"sku": sku, "quantity": qty})),
            _ => errors.push(json!({"field": format!("items[{i}]"), "detail": "{\"sku\": text of 1 to 64 characters, \"quantity\": integer 1 to 10000}"})),
        }
    }
    if !errors.is_empty() {
        return invalid(errors);
    }
    let result: Result<Response, Failure> = async {
        let key = tx.id().key.as_str().to_owned();
        let resumed = tx.resume_from::<OrderStep>()?;
        let (id, existing) = match resumed {
            // A resumed request (its first attempt died before the response was stored, on a
            // split store) keeps the order it recorded, and answers with its row.
            Some(OrderStep::Recorded { order }) => {
                let existing = S::Database::order(&mut tx, scope.as_str(), &order).await?;
                (order, existing)
            }
            None => (format!("ord_{}", uuid::Uuid::now_v7().simple()), None),
        };
        let created_at = SystemClock.now_millis();
        let items = Value::Array(items);
        S::Database::insert_order(
            &mut tx,
            &id,
            scope.as_str(),
            &key,
            &items.to_string(),
            created_at,
        )
        .await?;
        // A fresh request knows its row already (no read on the hot path).
        let order = match existing {
            Some(existing) => serde_json::to_value(existing).map_err(TxError::from)?,
            None => json!({"id": id, "items": items, "created_at": created_at}),
        };
        let resp = json_response(
            StatusCode::CREATED,
            &order,
            Some(format!("/v1/orders/{id}")),
        );
        Ok(tx
            .commit_as(&OrderStep::Recorded { order: id }, resp)
            .await?)
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}
