//! The reference API's write endpoints, built with Oncely the way a user would build them.
//!
//! `POST /v1/payments` is a multi-step request split into atomic phases at each outside call:
//!
//! | recovery point | committed with it | next step |
//! |---|---|---|
//! | (none) | — | record the payment |
//! | `payment_recorded` | the payment row (`pending`) | charge at the card processor |
//! | `charge_created` | the charge id (`succeeded`) | send the receipt through the mailer |
//! | `receipt_sent` | the receipt id | store the response |
//!
//! Each outside call carries an idempotency key derived from ours (and the scope), so a retry
//! that resumes at a recovery point never repeats an outside call that already succeeded, and
//! even a repeated call is collapsed by the outside system.

use super::App;
use super::db::{FencedError, NewPayment, Phase, PhaseEnd, Stored};
use anyhow::{Result, anyhow};
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use oncely_core::{Clock, SystemClock};
use oncely_tower::{HandlerOutcome, IdempotencyContext};
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

/// A problem+json response that the layer must not store: nothing was executed (validation
/// failed before any effect), so the key is released and the client may correct and retry.
pub fn not_executed(
    status: StatusCode,
    code: &str,
    detail: impl Into<String>,
    extra: Value,
) -> Response {
    let mut body = json!({
        "type": format!("urn:oncely:problem:{code}"),
        "title": match status.as_u16() { 400 => "Malformed request", 422 => "Invalid request", 409 => "Conflict", _ => "Service unavailable" },
        "status": status.as_u16(),
        "detail": detail.into(),
        "code": code,
        "retryable": status.is_server_error() || status == StatusCode::CONFLICT,
    });
    if let (Some(obj), Value::Object(more)) = (body.as_object_mut(), extra) {
        obj.extend(more);
    }
    let mut resp = (status, body.to_string()).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    if status.is_server_error() || status == StatusCode::CONFLICT {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    resp.extensions_mut().insert(HandlerOutcome::NotExecuted);
    resp
}

/// Maps a failure in the middle of a multi-step request. The recovery point already committed
/// stays; the key is released so that the client's retry converges (every phase is idempotent).
fn failure(e: anyhow::Error) -> Response {
    if e.downcast_ref::<FencedError>().is_some() {
        return not_executed(
            StatusCode::CONFLICT,
            "idempotency_request_in_flight",
            "another attempt took this idempotency key over; retry to get its result",
            json!({}),
        );
    }
    tracing::warn!(error = %e, "request failed in the middle; the key is released for a retry");
    not_executed(
        StatusCode::SERVICE_UNAVAILABLE,
        "upstream_unavailable",
        format!("a dependency failed: {e:#}; retry with the same Idempotency-Key"),
        json!({}),
    )
}

/// A stable key for an outside call, derived from the scope, our key and the step, so every
/// retry of the same logical request sends the same one.
pub fn derived_key(ctx: &IdempotencyContext, step: &str) -> String {
    derived_key_for(ctx.id.scope.as_str(), ctx.id.key.as_str(), step)
}

/// [`derived_key`] from the parts (the gates use it to find a request's outside calls).
pub fn derived_key_for(scope: &str, key: &str, step: &str) -> String {
    let mut h = Sha256::new();
    for part in [scope, key, step] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    format!("oncely-{step}-{}", &hex::encode(h.finalize())[..32])
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PaymentRequest {
    amount: Value,
    currency: Value,
    source: Value,
    #[serde(default)]
    description: Option<Value>,
}

struct ValidPayment {
    amount: i64,
    currency: String,
    source: String,
    description: Option<String>,
}

// axum's idiom: the rejection is the response itself.
#[allow(clippy::result_large_err)]
fn parse_json<T: for<'de> Deserialize<'de>>(body: &Bytes) -> Result<T, Response> {
    serde_json::from_slice(body).map_err(|e| {
        not_executed(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            format!("the body is not the expected JSON object: {e}"),
            json!({}),
        )
    })
}

fn invalid(errors: Vec<Value>) -> Response {
    not_executed(
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation_failed",
        "the request has invalid fields; nothing was executed, correct it and retry with the same key",
        json!({ "errors": errors }),
    )
}

#[allow(clippy::result_large_err)]
fn validate_payment(body: &Bytes) -> Result<ValidPayment, Response> {
    let req: PaymentRequest = parse_json(body)?;
    let mut errors = Vec::new();
    let amount = req
        .amount
        .as_i64()
        .filter(|a| *a > 0 && *a <= 99_999_999_999);
    if amount.is_none() {
        errors.push(json!({"field": "amount", "detail": "an integer number of minor units, 1 to 99999999999"}));
    }
    let currency = req
        .currency
        .as_str()
        .filter(|c| c.len() == 3 && c.bytes().all(|b| b.is_ascii_alphabetic()))
        .map(str::to_ascii_uppercase);
    if currency.is_none() {
        errors.push(json!({"field": "currency", "detail": "an ISO 4217 code of three letters, e.g. \"EUR\""}));
    }
    let source = req
        .source
        .as_str()
        .filter(|s| !s.is_empty() && s.len() <= 255)
        .map(str::to_owned);
    if source.is_none() {
        errors.push(json!({"field": "source", "detail": "a card token, 1 to 255 characters"}));
    }
    let description = match req.description {
        None | Some(Value::Null) => Some(None),
        Some(Value::String(s)) if s.chars().count() <= 1000 => Some(Some(s)),
        Some(_) => {
            errors.push(
                json!({"field": "description", "detail": "a string of at most 1000 characters"}),
            );
            None
        }
    };
    match (amount, currency, source, description) {
        (Some(amount), Some(currency), Some(source), Some(description)) if errors.is_empty() => {
            Ok(ValidPayment {
                amount,
                currency,
                source,
                description,
            })
        }
        _ => Err(invalid(errors)),
    }
}

/// The response and its stored form, built from the same bytes.
fn respond(
    status: StatusCode,
    body: &Value,
    location: Option<String>,
) -> (Response, oncely_core::StoredResponse) {
    let bytes = serde_json::to_vec(body).unwrap_or_default();
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    if let Some(loc) = location.and_then(|l| HeaderValue::from_str(&l).ok()) {
        headers.insert(header::LOCATION, loc);
    }
    let stored = oncely_tower::stored_response(status, &headers, &bytes);
    let mut resp = (status, bytes).into_response();
    resp.headers_mut().extend(headers);
    (resp, stored)
}

fn mark(mut resp: Response, stored: Stored) -> Response {
    if stored == Stored::InTransaction {
        resp.extensions_mut().insert(HandlerOutcome::AlreadyStored);
    }
    resp
}

/// The phases a payment has committed, from the recovery point and from the row itself (the
/// later of the two wins: a released and re-claimed key resumes where the data says).
fn progress(recovery_point: Option<&str>, payment: Option<&super::db::Payment>) -> u8 {
    let from_rp = match recovery_point {
        None => 0,
        Some("payment_recorded") => 1,
        Some("charge_created") => 2,
        Some("receipt_sent") => 3,
        Some(_) => 0,
    };
    let from_row = match payment {
        None => 0,
        Some(p) if p.receipt_id.is_some() => 3,
        Some(p) if p.charge_id.is_some() => 2,
        Some(_) => 1,
    };
    from_rp.max(from_row)
}

/// `POST /v1/payments`.
pub async fn create_payment(
    State(app): State<App>,
    ctx: IdempotencyContext,
    body: Bytes,
) -> Response {
    let req = match validate_payment(&body) {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    match run_payment(&app, &ctx, &req).await {
        Ok(resp) => resp,
        Err(e) => failure(e),
    }
}

async fn run_payment(app: &App, ctx: &IdempotencyContext, req: &ValidPayment) -> Result<Response> {
    let scope = ctx.id.scope.as_str();
    let key = ctx.id.key.as_str();
    let mut payment = app.db().payment_by_key(scope, key).await?;
    let mut step = progress(ctx.recovery_point.as_deref(), payment.as_ref());

    if step < 1 {
        let id = format!("pay_{}", uuid::Uuid::now_v7().simple());
        let mut phase = app.begin_phase(ctx).await?;
        phase
            .insert_payment(&NewPayment {
                id: &id,
                scope,
                key,
                amount: req.amount,
                currency: &req.currency,
                source: &req.source,
                description: req.description.as_deref(),
                created_at: SystemClock.now_millis(),
            })
            .await?;
        phase
            .commit(PhaseEnd::Checkpoint("payment_recorded"))
            .await?;
        app.crash_point("payment_recorded");
        payment = app.db().payment_by_key(scope, key).await?;
        step = 1;
    }
    let mut payment =
        payment.ok_or_else(|| anyhow!("payment row missing after it was recorded"))?;

    if step < 2 {
        let charge = app
            .outside_call(
                "charges",
                &derived_key(ctx, "charge"),
                json!({"amount": payment.amount, "currency": payment.currency, "source": payment.source}),
            )
            .await?;
        let mut phase = app.begin_phase(ctx).await?;
        if charge.0 == 402 {
            phase.set_charge(scope, key, None, "declined").await?;
            payment.status = "declined".into();
            let body = json!({
                "type": "urn:oncely:problem:card_declined",
                "title": "Card declined",
                "status": 402,
                "detail": "the card processor declined the charge",
                "code": "card_declined",
                "retryable": false,
                "payment": payment,
            });
            let (mut resp, mut stored) = respond(StatusCode::PAYMENT_REQUIRED, &body, None);
            let problem = HeaderValue::from_static("application/problem+json");
            resp.headers_mut()
                .insert(header::CONTENT_TYPE, problem.clone());
            stored = oncely_tower::stored_response(
                StatusCode::PAYMENT_REQUIRED,
                resp.headers(),
                &stored.body,
            );
            let how = phase
                .commit(PhaseEnd::Complete(stored, app.retention()))
                .await?;
            app.crash_point("response_stored");
            return Ok(mark(resp, how));
        }
        if charge.0 != 201 {
            return Err(anyhow!("the card processor answered {}", charge.0));
        }
        let charge_id = charge.1["id"].as_str().unwrap_or_default().to_owned();
        phase
            .set_charge(scope, key, Some(&charge_id), "succeeded")
            .await?;
        phase.commit(PhaseEnd::Checkpoint("charge_created")).await?;
        app.crash_point("charge_created");
        payment.charge_id = Some(charge_id);
        payment.status = "succeeded".into();
        step = 2;
    }

    if step < 3 {
        let email = app
            .outside_call(
                "emails",
                &derived_key(ctx, "receipt"),
                json!({"to": scope, "subject": format!("Receipt for {}", payment.id), "payment": payment.id}),
            )
            .await?;
        if email.0 != 202 {
            return Err(anyhow!("the mailer answered {}", email.0));
        }
        let receipt_id = email.1["id"].as_str().unwrap_or_default().to_owned();
        let mut phase = app.begin_phase(ctx).await?;
        phase.set_receipt(scope, key, &receipt_id).await?;
        phase.commit(PhaseEnd::Checkpoint("receipt_sent")).await?;
        app.crash_point("receipt_sent");
    }

    // The last phase: the response, built from the committed row, stored with it.
    let payment = app
        .db()
        .payment_by_key(scope, key)
        .await?
        .ok_or_else(|| anyhow!("payment row missing"))?;
    let (resp, stored) = respond(
        StatusCode::CREATED,
        &serde_json::to_value(&payment)?,
        Some(format!("/v1/payments/{}", payment.id)),
    );
    let phase = app.begin_phase(ctx).await?;
    let how = phase
        .commit(PhaseEnd::Complete(stored, app.retention()))
        .await?;
    app.crash_point("response_stored");
    app.payment_created();
    Ok(mark(resp, how))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OrderRequest {
    items: Vec<Value>,
}

/// `POST /v1/orders`: one transactional phase.
pub async fn create_order(
    State(app): State<App>,
    ctx: IdempotencyContext,
    body: Bytes,
) -> Response {
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
        let qty = item["quantity"].as_i64().filter(|q| *q > 0 && *q <= 10_000);
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
    let result: Result<Response> = async {
        let id = format!("ord_{}", uuid::Uuid::now_v7().simple());
        let created_at = SystemClock.now_millis();
        let items = Value::Array(items);
        let mut phase = app.begin_phase(&ctx).await?;
        phase
            .insert_order(
                &id,
                ctx.id.scope.as_str(),
                ctx.id.key.as_str(),
                &items.to_string(),
                created_at,
            )
            .await?;
        let (resp, stored) = respond(
            StatusCode::CREATED,
            &json!({"id": id, "items": items, "created_at": created_at}),
            Some(format!("/v1/orders/{id}")),
        );
        let how = phase
            .commit(PhaseEnd::Complete(stored, app.retention()))
            .await?;
        Ok(mark(resp, how))
    }
    .await;
    result.unwrap_or_else(failure)
}

impl App {
    /// Begins one atomic phase for the owner of `ctx`.
    pub async fn begin_phase(&self, ctx: &IdempotencyContext) -> Result<Phase> {
        let map = |e: oncely_core::StoreError| match e {
            oncely_core::StoreError::Fenced => anyhow!(FencedError),
            other => anyhow!(other),
        };
        Ok(match &self.inner.backend {
            super::Backend::Sqlite(s) => Phase::Sqlite(
                s.begin_phase(&ctx.id, ctx.token, ctx.lease)
                    .await
                    .map_err(map)?,
            ),
            #[cfg(feature = "postgres")]
            super::Backend::Postgres(s) => Phase::Postgres(
                s.begin_phase(&ctx.id, ctx.token, ctx.lease)
                    .await
                    .map_err(map)?,
            ),
            super::Backend::Plain => {
                // Infallible only when built without PostgreSQL.
                #[allow(clippy::infallible_destructuring_match)]
                let pool = match &self.inner.db {
                    super::db::Db::Sqlite(pool) => pool,
                    #[cfg(feature = "postgres")]
                    _ => return Err(anyhow!("plain phases need an SQLite business database")),
                };
                Phase::Plain {
                    tx: pool.begin().await?,
                    ctx: ctx.clone(),
                }
            }
        })
    }
}
