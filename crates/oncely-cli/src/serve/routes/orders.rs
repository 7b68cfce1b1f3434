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
use oncely_sqlx::{SqlStore, Tx};
use serde::Deserialize;
use serde_json::{Value, json};

/// The body of `POST /v1/orders` (read loosely: every invalid item is reported in one `422`).
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct OrderRequest {
    #[schema(value_type = Vec<OrderItem>, min_items = 1, max_items = 100)]
    items: Vec<Value>,
}

/// One item of an order (the schema of an element of [`OrderRequest::items`]).
#[derive(Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
struct OrderItem {
    #[schema(min_length = 1, max_length = 64)]
    sku: String,
    #[schema(minimum = 1, maximum = 10000)]
    quantity: i64,
}

/// `POST /v1/orders`: one phase, one commit (the claim, the order and the stored response).
#[utoipa::path(post, path = "/v1/orders", operation_id = "createOrder",
    summary = "Create an order (one transactional phase).",
    request_body = OrderRequest,
    responses(
        (status = 201, description = "The order.", body = crate::serve::db::Order,
            headers(("Location" = String, description = "The order's URL."))),
        (status = 400, description = "`invalid_json`: the body is not a JSON object with the documented fields; nothing was executed.", content_type = "application/problem+json", body = oncely_tower::openapi::ProblemSchema),
        (status = 401, description = "`unauthenticated`: send `Authorization: Bearer <account>`.", content_type = "application/problem+json", body = oncely_tower::openapi::ProblemSchema),
        (status = 415, description = "`unsupported_media_type`: send `Content-Type: application/json` (uncompressed).", content_type = "application/problem+json", body = oncely_tower::openapi::ProblemSchema),
        (status = 422, description = "`validation_failed` (nothing executed; correct and retry with the same key) or `database_refused`.", content_type = "application/problem+json", body = oncely_tower::openapi::ProblemSchema),
        (status = 503, description = "`database_unavailable` or `unavailable`: nothing was committed; retry with the same key.", content_type = "application/problem+json", body = oncely_tower::openapi::ProblemSchema),
    ))]
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
        let id = format!("ord_{}", uuid::Uuid::now_v7().simple());
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
        let order = json!({"id": id, "items": items, "created_at": created_at});
        let resp = json_response(
            StatusCode::CREATED,
            &order,
            Some(format!("/v1/orders/{id}")),
        );
        Ok(tx.commit(resp).await?)
    }
    .await;
    result.unwrap_or_else(IntoResponse::into_response)
}
