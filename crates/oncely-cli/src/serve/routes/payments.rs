//! `POST /v1/payments`, built with Oncely the way a user would build it: a multi-step request split into atomic phases at each outside call:
//!
//! | phase | commits together | then, with no transaction open |
//! |---|---|---|
//! | 1 | the claim, the payment row (`pending`), step [`PaymentStep::Recorded`] | charge at the card processor |
//! | 2 | the charge (`succeeded`), step [`PaymentStep::Charged`]; or, declined, the stored `402` | send the receipt through the mailer |
//! | 3 | the receipt id and the stored `201` | — |
//!
//! Every outside call is made between two phases ([`oncely_sqlx::Between::call`]), never inside
//! one: the intent commits first, the call runs while no transaction is open (the layer's
//! heartbeat renews the lease meanwhile, however long the call takes), and its result is
//! recorded by the next phase. `Between::call` also refuses the call when this request lost
//! its claim to another one, which then makes the call itself.
//!
//! Each handler takes an [`oncely_sqlx::Tx`] that already holds its claim; a failed step rolls
//! back ([`TxError`] renders the answer), and a retry after a crash resumes at the last committed
//! step ([`Tx::resume_from`]). Each outside call carries an idempotency key derived from ours
//! ([`oncely_sqlx::derived_key`]), so a resumed request never repeats an outside call whose step
//! committed, and even a repeated call is collapsed by the outside system.
//!
//! The file reads in the order a request runs: the steps, the handler (check the body), the
//! phases (`run_payment`), the answers, then the body's validation.

use super::Failure;
use super::body::{invalid, parse_json, require_json};
use super::json_response;
use crate::serve::App;
use crate::serve::db::{BusinessDb, NewPayment, Payment};
use axum::Extension;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use oncely_core::problem::PROBLEM_JSON;
use oncely_core::{Clock, Problem, Scope, SystemClock};
use oncely_sqlx::{SqlStore, Tx, TxError};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

/// Where a payment stands: its typed recovery point. Every step carries the payment's id, so a
/// resumed request finds its own row even when an earlier request with the same key (before the
/// replay window ended) left one.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum PaymentStep {
    /// The payment row is recorded (`pending`); next, the charge.
    Recorded {
        /// The payment's id.
        payment: String,
    },
    /// The charge succeeded and is recorded; next, the receipt.
    Charged {
        /// The payment's id.
        payment: String,
    },
}

impl PaymentStep {
    fn payment(&self) -> &str {
        match self {
            Self::Recorded { payment } | Self::Charged { payment } => payment,
        }
    }
}

/// `POST /v1/payments`, for any store the server runs on.
#[utoipa::path(post, path = "/v1/payments", operation_id = "createPayment",
    summary = "Create a payment: record it, charge the card, send a receipt.",
    request_body = PaymentRequest,
    responses(
        (status = 201, description = "The payment.", body = Payment,
            headers(("Location" = String, description = "The payment's URL."))),
        (status = 400, description = "`invalid_json`: the body is not a JSON object with the documented fields; nothing was executed.", content_type = "application/problem+json", body = oncely_tower::openapi::ProblemSchema),
        (status = 401, description = "`unauthenticated`: send `Authorization: Bearer <account>`.", content_type = "application/problem+json", body = oncely_tower::openapi::ProblemSchema),
        (status = 402, description = "`card_declined`: stored and replayed like a success.", content_type = "application/problem+json", body = oncely_tower::openapi::ProblemSchema),
        (status = 415, description = "`unsupported_media_type`: send `Content-Type: application/json` (uncompressed).", content_type = "application/problem+json", body = oncely_tower::openapi::ProblemSchema),
        (status = 422, description = "`validation_failed` (nothing executed; correct and retry with the same key) or `database_refused` (the database refused a value for good; nothing was committed).", content_type = "application/problem+json", body = oncely_tower::openapi::ProblemSchema),
        (status = 503, description = "`upstream_unavailable`, `request_suspended`, `database_unavailable` or `unavailable`: nothing ran, or the request stopped at a recovery point; retry with the same key.", content_type = "application/problem+json", body = oncely_tower::openapi::ProblemSchema),
    ))]
pub async fn create_payment<S>(
    State(app): State<App>,
    Extension(scope): Extension<Scope>,
    headers: HeaderMap,
    tx: Tx<S>,
    body: Bytes,
) -> Response
where
    S: SqlStore,
    S::Database: BusinessDb,
{
    if let Err(resp) = require_json(&headers) {
        return resp;
    }
    let req = match validate_payment(&body) {
        Ok(r) => r,
        Err(resp) => return resp,
    };
    run_payment(&app, &scope, tx, &req, &JsonAnswers)
        .await
        .unwrap_or_else(IntoResponse::into_response)
}

/// How a payment's final answers are said: JSON for `POST /v1/payments`, protobuf for the gRPC
/// `CreatePayment` ([`crate::serve::grpc`]). Each is committed with the phase that ends the
/// request and replayed verbatim, so it is made before the commit.
pub trait PaymentAnswers {
    /// The payment succeeded: `201` with the payment, or the `Payment` message.
    ///
    /// # Errors
    ///
    /// The payment could not be encoded (the phase rolls back).
    fn created(&self, payment: &Payment) -> Result<Response, TxError>;
    /// The card was declined: a final answer, stored and replayed.
    fn declined(&self, payment: &Payment) -> Response;
}

/// The REST answers: `201` JSON with `Location`, or the `402 card_declined` problem.
struct JsonAnswers;

impl PaymentAnswers for JsonAnswers {
    fn created(&self, payment: &Payment) -> Result<Response, TxError> {
        Ok(json_response(
            StatusCode::CREATED,
            &serde_json::to_value(payment).map_err(TxError::from)?,
            Some(format!("/v1/payments/{}", payment.id)),
        ))
    }

    fn declined(&self, payment: &Payment) -> Response {
        declined(payment)
    }
}

/// How far a payment got, by what its row shows, not by its [`PaymentStep`].
///
/// The step alone is exact only where it commits with the writes (SQLite, PostgreSQL). On a
/// split store ([`oncely_sqlx::Split`]: keys in memory or Redis, the payment in SQLite) the
/// step is the *intent*, recorded before the business commit: after a crash between the two,
/// the step says `Charged` while the charge write is lost, and trusting it would send a receipt
/// for an uncharged payment. The row is the truth on every store (a write a crash lost counts
/// as not done), and reading it costs nothing extra: a resumed request reads it anyway, to
/// answer with the payment. It also knows what no step carries: a decline committed to the
/// row whose stored answer a split store's crash lost.
fn done(payment: Option<&Payment>) -> u8 {
    match payment {
        None => 0,
        Some(p) if p.receipt_id.is_some() => 3,
        Some(p) if p.charge_id.is_some() || p.status == "declined" => 2,
        Some(_) => 1,
    }
}

/// The three phases of a valid payment request (see the [module docs](self)), answered by
/// `answers` (REST or gRPC: the business logic is this one function).
///
/// # Errors
///
/// [`Failure`]: a phase rolled back, or an outside system failed part-way.
pub async fn run_payment<S>(
    app: &App,
    scope: &Scope,
    mut tx: Tx<S>,
    req: &ValidPayment,
    answers: &impl PaymentAnswers,
) -> Result<Response, Failure>
where
    S: SqlStore,
    S::Database: BusinessDb,
{
    let scope = scope.as_str();
    let key = tx.id().key.as_str().to_owned();
    let step = tx.resume_from::<PaymentStep>()?;
    let id = step.as_ref().map_or_else(
        || format!("pay_{}", uuid::Uuid::now_v7().simple()),
        |s| s.payment().to_owned(),
    );
    // Only a resumed request has a row to read: a fresh one costs no read.
    let mut payment = match &step {
        Some(_) => S::Database::payment(&mut tx, scope, &id).await?,
        None => None,
    };

    // Phase 1: the payment row, committed with the claim and the intent (its id), so a retry
    // after a crash resumes with the same payment, never a second one.
    if payment.is_none() {
        let p = NewPayment {
            id: &id,
            scope,
            key: &key,
            amount: req.amount,
            currency: &req.currency,
            source: &req.source,
            description: req.description.as_deref(),
            created_at: SystemClock.now_millis(),
        };
        S::Database::insert_payment(&mut tx, &p).await?;
        payment = Some(Payment {
            id: id.clone(),
            amount: p.amount,
            currency: p.currency.to_owned(),
            status: "pending".into(),
            charge_id: None,
            description: p.description.map(str::to_owned),
            source: p.source.to_owned(),
            receipt_id: None,
            created_at: p.created_at,
        });
    }
    let mut payment = payment.expect("read or recorded above");
    let progress = done(Some(&payment));
    if progress == 2 && payment.status == "declined" {
        // Declined, and the answer was not stored before a crash: answer the decline.
        return Ok(tx.commit(answers.declined(&payment)).await?);
    }
    // Commit phase 1 (on a takeover this also commits the new claim) before the outside call.
    let recorded = step.clone().unwrap_or(PaymentStep::Recorded {
        payment: id.clone(),
    });
    let between = tx.checkpoint(&recorded).await?;
    if step.is_none() {
        app.crash_point("payment_recorded");
    }
    let metadata = json!({"account": scope, "idempotency_key": key, "payment": id});

    // Phase 2: charge the card (the processor collapses repeats of our derived key).
    if progress < 2 {
        let key = oncely_sqlx::derived_key(between.id(), &id, "charge");
        let charge = between
            .call(|| {
                app.outside_call(
                    "charges",
                    &key,
                    json!({"amount": payment.amount, "currency": payment.currency, "source": payment.source, "metadata": metadata}),
                )
            })
            .await?
            .map_err(|e| Failure::Upstream(format!("{e:#}")))?;
        let mut tx = between.begin().await?;
        if charge.0 == 402 {
            S::Database::set_charge(&mut tx, scope, &id, None, "declined").await?;
            payment.status = "declined".into();
            let resp = tx.commit(answers.declined(&payment)).await?;
            app.crash_point("response_stored");
            return Ok(resp);
        }
        if charge.0 != 201 {
            return Err(Failure::Upstream(format!(
                "the card processor answered {}",
                charge.0
            )));
        }
        let charge_id = charge.1["id"].as_str().unwrap_or_default().to_owned();
        S::Database::set_charge(&mut tx, scope, &id, Some(&charge_id), "succeeded").await?;
        tx.checkpoint(&PaymentStep::Charged {
            payment: id.clone(),
        })
        .await?;
        app.crash_point("charge_created");
        payment.charge_id = Some(charge_id);
        payment.status = "succeeded".into();
    }

    // Send the receipt with no transaction open, then phase 3: record it with the stored
    // response (one commit).
    let receipt = if progress < 3 {
        let key = oncely_sqlx::derived_key(between.id(), &id, "receipt");
        let email = between
            .call(|| {
                app.outside_call(
                    "emails",
                    &key,
                    json!({"to": scope, "subject": format!("Receipt for {id}"), "payment": id, "metadata": metadata}),
                )
            })
            .await?
            .map_err(|e| Failure::Upstream(format!("{e:#}")))?;
        if email.0 != 202 {
            return Err(Failure::Upstream(format!(
                "the mailer answered {}",
                email.0
            )));
        }
        Some(email.1["id"].as_str().unwrap_or_default().to_owned())
    } else {
        None
    };
    let mut tx = between.begin().await?;
    if let Some(receipt_id) = receipt {
        S::Database::set_receipt(&mut tx, scope, &id, &receipt_id).await?;
        payment.receipt_id = Some(receipt_id);
    }
    let resp = tx.commit(answers.created(&payment)?).await?;
    app.crash_point("receipt_sent");
    app.crash_point("response_stored");
    app.payment_created();
    Ok(resp)
}

/// The answer to a declined card: a problem+json that is a result (stored and replayed).
fn declined(payment: &Payment) -> Response {
    let p = Problem::custom(
        402,
        "card_declined",
        "Card declined",
        "the card processor declined the charge",
    )
    .with_extension("payment", json!(payment));
    // Stored and replayed as is: no x-should-retry here (the edge adds it, from `retryable`).
    (
        StatusCode::PAYMENT_REQUIRED,
        [(header::CONTENT_TYPE, PROBLEM_JSON)],
        p.to_json(),
    )
        .into_response()
}

/// The body of `POST /v1/payments`. Read loosely (any JSON value per field) so that every
/// invalid field is reported at once in one `422` by [`validate_payment`]; the schema says what
/// is valid.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
struct PaymentRequest {
    /// Minor units (cents).
    #[serde(default)]
    #[schema(value_type = i64, required = true, minimum = 1, maximum = 99_999_999_999_i64)]
    amount: Value,
    /// An ISO 4217 code of three letters.
    #[serde(default)]
    #[schema(value_type = String, required = true, pattern = "^[A-Za-z]{3}$")]
    currency: Value,
    /// A card token; `tok_decline` is declined.
    #[serde(default)]
    #[schema(value_type = String, required = true, min_length = 1, max_length = 255)]
    source: Value,
    #[serde(default)]
    #[schema(value_type = Option<String>, max_length = 1000)]
    description: Option<Value>,
}

/// A payment request that passed validation.
pub struct ValidPayment {
    amount: i64,
    currency: String,
    source: String,
    description: Option<String>,
}

#[allow(clippy::result_large_err)]
fn validate_payment(body: &Bytes) -> Result<ValidPayment, Response> {
    let req: PaymentRequest = parse_json(body)?;
    check(req).map_err(invalid)
}

/// The payment rules, for both APIs: the fields as JSON values (the gRPC message's fields
/// converted), checked; the errors are `{"field", "detail"}` objects.
///
/// # Errors
///
/// The list of invalid fields, never empty.
pub fn check_payment(
    amount: &Value,
    currency: &Value,
    source: &Value,
    description: Option<Value>,
) -> Result<ValidPayment, Vec<Value>> {
    let req = PaymentRequest {
        amount: amount.clone(),
        currency: currency.clone(),
        source: source.clone(),
        description,
    };
    check(req)
}

fn check(req: PaymentRequest) -> Result<ValidPayment, Vec<Value>> {
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
        .filter(|s| !s.is_empty() && s.chars().count() <= 255)
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
        _ => Err(errors),
    }
}
