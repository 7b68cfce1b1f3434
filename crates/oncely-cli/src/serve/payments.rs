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
use axum::Extension;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use oncely_core::{Clock, Scope, SystemClock};
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
    let title = match status.as_u16() {
        400 => "Malformed request",
        409 => "Conflict",
        415 => "Unsupported media type",
        422 => "Invalid request",
        _ => "Service unavailable",
    };
    let retryable = status.is_server_error() || status == StatusCode::CONFLICT;
    let mut resp = super::problem_with(status, code, title, detail.into(), retryable, extra);
    if retryable {
        resp.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
    }
    resp.extensions_mut().insert(HandlerOutcome::NotExecuted);
    resp
}

/// Maps a failure in the middle of a multi-step request: the request is suspended at its last
/// committed recovery point (the record stays in flight with a lapsed lease), so the client's
/// retry with the same key resumes there and never repeats an outside call that succeeded.
fn failure(e: anyhow::Error) -> Response {
    let mut resp = if e.downcast_ref::<FencedError>().is_some() {
        not_executed(
            StatusCode::CONFLICT,
            "idempotency_request_in_flight",
            "another attempt took this idempotency key over; retry to get its result",
            json!({}),
        )
    } else {
        // The full error (addresses, driver messages) goes to the log, not to the client.
        tracing::warn!(error = %format!("{e:#}"), "request suspended at its recovery point; a retry resumes it");
        not_executed(
            StatusCode::SERVICE_UNAVAILABLE,
            "upstream_unavailable",
            "a system this request depends on failed part-way; the request stopped at its last completed step: retry it with the same Idempotency-Key to resume there",
            json!({}),
        )
    };
    resp.extensions_mut().insert(HandlerOutcome::Suspended);
    resp
}

/// A stable idempotency key for an outside call, derived from the scope, the payment (one per
/// logical request: a key reused after the replay window makes a new payment) and the step,
/// so every retry and resumption of one logical request sends the same key.
pub fn derived_key_for(scope: &str, payment_id: &str, step: &str) -> String {
    let mut h = Sha256::new();
    for part in [scope, payment_id, step] {
        h.update((part.len() as u64).to_be_bytes());
        h.update(part.as_bytes());
    }
    format!("oncely-{step}-{}", &hex::encode(h.finalize())[..32])
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PaymentRequest {
    #[serde(default)]
    amount: Value,
    #[serde(default)]
    currency: Value,
    #[serde(default)]
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

/// Write bodies are JSON: anything else is refused before any effect (`415`).
#[allow(clippy::result_large_err)]
fn require_json(headers: &HeaderMap) -> Result<(), Response> {
    if let Some(enc) = headers.get(header::CONTENT_ENCODING)
        && enc.as_bytes() != b"identity"
    {
        return Err(not_executed(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!(
                "Content-Encoding {:?} is not accepted: send the JSON body uncompressed",
                String::from_utf8_lossy(enc.as_bytes())
            ),
            json!({}),
        ));
    }
    let essence = headers
        .get(header::CONTENT_TYPE)
        .map(|v| oncely_core::fingerprint::media_type_essence(v.as_bytes()))
        .unwrap_or_default();
    if oncely_core::fingerprint::is_json_media_type(&essence) {
        Ok(())
    } else {
        Err(not_executed(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
            format!(
                "send the body as JSON with Content-Type: application/json (got {:?})",
                if essence.is_empty() {
                    "none"
                } else {
                    essence.as_str()
                }
            ),
            json!({}),
        ))
    }
}

// axum's idiom: the rejection is the response itself.
#[allow(clippy::result_large_err)]
fn parse_json<T: for<'de> Deserialize<'de>>(body: &Bytes) -> Result<T, Response> {
    serde_json::from_slice(body).map_err(|e| {
        // serde's message names Rust types ("struct PaymentRequest"): say it in the API's terms.
        let detail = if e.is_syntax() || e.is_eof() {
            format!("the body is not valid JSON ({e})")
        } else if e.to_string().starts_with("unknown field") {
            let field = e.to_string();
            let name = field.split('`').nth(1).unwrap_or("?").to_owned();
            format!("the body has a field this endpoint does not take: {name:?}")
        } else {
            "the body must be a JSON object with the documented fields (see /openapi.json)"
                .to_owned()
        };
        not_executed(StatusCode::BAD_REQUEST, "invalid_json", detail, json!({}))
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
    // An integer; 1999.0 and 1.999e3 are the same JSON number (and the same fingerprint), so
    // they are accepted as 1999 too.
    let amount = req
        .amount
        .as_i64()
        .or_else(|| {
            req.amount
                .as_f64()
                .filter(|f| f.fract() == 0.0 && f.abs() < 1e15)
                .map(|f| f as i64)
        })
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

/// Where a payment stands: the recovery point names the step and carries the payment's id
/// (`payment_recorded:pay_…`), so a resumed request finds its own row even when an earlier
/// request with the same key (before the replay window ended) left one.
fn parse_recovery_point(rp: Option<&str>) -> (u8, Option<String>) {
    let Some((step, id)) = rp.and_then(|rp| rp.split_once(':')) else {
        return (0, None);
    };
    let step = match step {
        "payment_recorded" => 1,
        "charge_created" => 2,
        "receipt_sent" => 3,
        _ => return (0, None),
    };
    (step, Some(id.to_owned()))
}

/// The later of the recovery point and what the row itself shows (with the memory or Redis
/// key store a phase's business write commits just before its recovery point is recorded).
fn progress(step: u8, payment: &super::db::Payment) -> u8 {
    let from_row = if payment.receipt_id.is_some() {
        3
    } else if payment.charge_id.is_some() || payment.status == "declined" {
        2
    } else {
        1
    };
    step.max(from_row)
}

/// Who is asking and under which claim. Without the idempotency layer (`serve --idempotency
/// off`, the benchmark baseline) there is no claim: the same handlers run with plain
/// transactions and no recovery point.
pub struct Caller {
    scope: String,
    key: String,
    ctx: Option<IdempotencyContext>,
}

impl Caller {
    fn new(scope: &Scope, headers: &HeaderMap, ctx: Option<IdempotencyContext>) -> Self {
        let key = match &ctx {
            Some(c) => c.id.key.as_str().to_owned(),
            None => headers
                .get("idempotency-key")
                .and_then(|v| v.to_str().ok())
                .map_or_else(|| uuid::Uuid::new_v4().to_string(), str::to_owned),
        };
        Self {
            scope: scope.as_str().to_owned(),
            key,
            ctx,
        }
    }

    fn recovery_point(&self) -> Option<&str> {
        self.ctx.as_ref().and_then(|c| c.recovery_point.as_deref())
    }
}

/// `POST /v1/payments`.
pub async fn create_payment(
    State(app): State<App>,
    Extension(scope): Extension<Scope>,
    headers: HeaderMap,
    ctx: Option<IdempotencyContext>,
    body: Bytes,
) -> Response {
    if let Err(resp) = require_json(&headers) {
        return resp;
    }
    let req = match validate_payment(&body) {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    let caller = Caller::new(&scope, &headers, ctx);
    match run_payment(&app, &caller, &req).await {
        Ok(resp) => resp,
        Err(e) => failure(e),
    }
}

async fn run_payment(app: &App, ctx: &Caller, req: &ValidPayment) -> Result<Response> {
    let scope = ctx.scope.as_str();
    let key = ctx.key.as_str();
    let (step, id) = parse_recovery_point(ctx.recovery_point());
    // Only a resumed request has a row to find: a fresh id costs no read.
    let (id, existing) = match id {
        Some(id) => {
            let existing = app.db().payment_by_id(scope, &id).await?;
            (id, existing)
        }
        None => (format!("pay_{}", uuid::Uuid::now_v7().simple()), None),
    };

    // Phase 1: record the payment. The intent (its id) is recorded with it, so a retry
    // after a crash resumes with the same payment, never a second one.
    let mut payment = match existing {
        Some(p) => p,
        None => {
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
            let rp = format!("payment_recorded:{id}");
            phase.commit(PhaseEnd::Intent(&rp)).await?;
            app.crash_point("payment_recorded");
            app.db()
                .payment_by_id(scope, &id)
                .await?
                .ok_or_else(|| anyhow!("payment row missing after it was recorded"))?
        }
    };
    let step = progress(step, &payment);
    let metadata = json!({"account": scope, "idempotency_key": key, "payment": id});

    // Phase 2: charge the card (the processor collapses repeats of our derived key).
    if step < 2 {
        let charge = app
            .outside_call(
                "charges",
                &derived_key_for(scope, &id, "charge"),
                json!({"amount": payment.amount, "currency": payment.currency, "source": payment.source, "metadata": metadata}),
            )
            .await?;
        let mut phase = app.begin_phase(ctx).await?;
        let rp = format!("charge_created:{id}");
        if charge.0 == 402 {
            phase.set_charge(scope, &id, None, "declined").await?;
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
            let (resp, stored) = respond_problem(StatusCode::PAYMENT_REQUIRED, &body);
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
            .set_charge(scope, &id, Some(&charge_id), "succeeded")
            .await?;
        phase.commit(PhaseEnd::Checkpoint(&rp)).await?;
        app.crash_point("charge_created");
        payment.charge_id = Some(charge_id);
        payment.status = "succeeded".into();
    }

    // A declined payment that crashed before its response was stored: answer the decline.
    if payment.status == "declined" {
        let body = json!({
            "type": "urn:oncely:problem:card_declined", "title": "Card declined", "status": 402,
            "detail": "the card processor declined the charge", "code": "card_declined",
            "retryable": false, "payment": payment,
        });
        let (resp, stored) = respond_problem(StatusCode::PAYMENT_REQUIRED, &body);
        let phase = app.begin_phase(ctx).await?;
        let how = phase
            .commit(PhaseEnd::Complete(stored, app.retention()))
            .await?;
        return Ok(mark(resp, how));
    }

    // Phase 3: send the receipt.
    if step < 3 {
        let email = app
            .outside_call(
                "emails",
                &derived_key_for(scope, &id, "receipt"),
                json!({"to": scope, "subject": format!("Receipt for {id}"), "payment": id, "metadata": metadata}),
            )
            .await?;
        if email.0 != 202 {
            return Err(anyhow!("the mailer answered {}", email.0));
        }
        let receipt_id = email.1["id"].as_str().unwrap_or_default().to_owned();
        let mut phase = app.begin_phase(ctx).await?;
        phase.set_receipt(scope, &id, &receipt_id).await?;
        let rp = format!("receipt_sent:{id}");
        phase.commit(PhaseEnd::Checkpoint(&rp)).await?;
        app.crash_point("receipt_sent");
    }

    // The last phase: the response, built from the committed row, stored with it.
    let payment = app
        .db()
        .payment_by_id(scope, &id)
        .await?
        .ok_or_else(|| anyhow!("payment row missing"))?;
    let (resp, stored) = respond(
        StatusCode::CREATED,
        &serde_json::to_value(&payment)?,
        Some(format!("/v1/payments/{id}")),
    );
    let phase = app.begin_phase(ctx).await?;
    let how = phase
        .commit(PhaseEnd::Complete(stored, app.retention()))
        .await?;
    app.crash_point("response_stored");
    app.payment_created();
    Ok(mark(resp, how))
}

/// A problem+json response that is a result (stored and replayed), e.g. a card decline.
fn respond_problem(status: StatusCode, body: &Value) -> (Response, oncely_core::StoredResponse) {
    let (mut resp, stored) = respond(status, body, None);
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/problem+json"),
    );
    let stored = oncely_tower::stored_response(status, resp.headers(), &stored.body);
    (resp, stored)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct OrderRequest {
    items: Vec<Value>,
}

/// `POST /v1/orders`: one transactional phase.
pub async fn create_order(
    State(app): State<App>,
    Extension(scope): Extension<Scope>,
    headers: HeaderMap,
    ctx: Option<IdempotencyContext>,
    body: Bytes,
) -> Response {
    let ctx = Caller::new(&scope, &headers, ctx);
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
    let result: Result<Response> = async {
        // A resumed request (its first attempt died before the response was stored) keeps the
        // order id it recorded as its intent.
        let resumed = ctx
            .recovery_point()
            .and_then(|rp| rp.strip_prefix("order_recorded:"));
        let id = match resumed {
            Some(id) => id.to_owned(),
            None => format!("ord_{}", uuid::Uuid::now_v7().simple()),
        };
        let created_at = SystemClock.now_millis();
        let items = Value::Array(items);
        let mut phase = app.begin_phase(&ctx).await?;
        phase
            .insert_order(&id, &ctx.scope, &ctx.key, &items.to_string(), created_at)
            .await?;
        // A resumed request answers with the row its first attempt wrote; a fresh one knows its
        // row already (no read on the hot path).
        let existing = match resumed {
            Some(_) => phase.order(&ctx.scope, &id).await?,
            None => None,
        };
        let order = match existing {
            Some(existing) => serde_json::to_value(existing)?,
            None => json!({"id": id, "items": items, "created_at": created_at}),
        };
        let (resp, stored) = respond(
            StatusCode::CREATED,
            &order,
            Some(format!("/v1/orders/{id}")),
        );
        let rp = format!("order_recorded:{id}");
        let how = phase
            .commit(PhaseEnd::CompleteWithIntent(&rp, stored, app.retention()))
            .await?;
        Ok(mark(resp, how))
    }
    .await;
    result.unwrap_or_else(failure)
}

impl App {
    /// Begins one atomic phase for the owner of the caller's claim (a plain transaction when
    /// there is no claim: the baseline without the layer).
    pub async fn begin_phase(&self, caller: &Caller) -> Result<Phase> {
        let Some(ctx) = &caller.ctx else {
            return Ok(Phase::Bare(match &self.inner.db {
                super::db::Db::Sqlite(pool) => super::db::BareTx::Sqlite(pool.begin().await?),
                #[cfg(feature = "postgres")]
                super::db::Db::Postgres(pool) => super::db::BareTx::Postgres(pool.begin().await?),
            }));
        };
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
