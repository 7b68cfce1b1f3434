//! The reference Payments API over gRPC: `oncely.payments.v1.Payments`
//! (`crates/oncely-grpc/proto/oncely/payments/v1/payments.proto`), served on the same port as
//! the REST API. Its methods are routed by path (`/oncely.payments.v1.Payments/<Method>`, which
//! no REST route shares); the server speaks HTTP/1.1 and HTTP/2 without TLS on one port (h2c
//! with prior knowledge, what gRPC clients send to an `http://` address).
//!
//! | method | key | what runs |
//! |---|---|---|
//! | `CreatePayment` | required (`idempotency-key` metadata) | the REST `POST /v1/payments` business function ([`routes::payments::run_payment`](crate::serve::routes::payments)), on the same store and database, with gRPC answers |
//! | `GetPayment` | none | the same read as `GET /v1/payments/{id}` |
//!
//! `CreatePayment` is a transactional handler: its reply (or a stored error, a card decline)
//! commits with the request's last phase, so it is built here, bytes and trailers, with
//! [`oncely_grpc::unary`] instead of by a tonic-generated server. The idempotency layer is the
//! REST one (same store, claimer, policy, metrics and drain) in its gRPC form,
//! [`GrpcIdempotencyLayer`].

use crate::serve::App;
use crate::serve::db::{BusinessDb, Payment};
use crate::serve::routes::payments::{self, PaymentAnswers};
use axum::Extension;
use axum::Router;
use axum::body::{Bytes, to_bytes};
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodRouter, post};
use oncely_core::{Problem, Scope};
use oncely_grpc::payments::v1 as pb;
use oncely_grpc::unary::{decode_request, reply, status_response};
use oncely_grpc::{ERROR_DOMAIN, GrpcIdempotencyLayer, GrpcMethods};
use oncely_sqlx::{SqlStore, Tx, TxError};
use oncely_tower::{HandlerOutcome, IdempotencyLayer};
use std::collections::HashMap;
use tonic::Code;
use tonic_types::{ErrorDetails, StatusExt as _};

/// `/oncely.payments.v1.Payments/CreatePayment`.
pub const CREATE_PAYMENT: &str = "/oncely.payments.v1.Payments/CreatePayment";
/// `/oncely.payments.v1.Payments/GetPayment`.
pub const GET_PAYMENT: &str = "/oncely.payments.v1.Payments/GetPayment";

/// Which methods take a key: `CreatePayment` requires one.
pub fn methods() -> GrpcMethods {
    GrpcMethods::new().require(CREATE_PAYMENT)
}

fn to_message(p: &Payment) -> pb::Payment {
    pb::Payment {
        id: p.id.clone(),
        amount: p.amount,
        currency: p.currency.clone(),
        status: p.status.clone(),
        charge_id: p.charge_id.clone(),
        description: p.description.clone(),
        created_at: p.created_at,
    }
}

/// A status with `ErrorInfo` (our domain, `reason` the code in upper case).
fn status(
    code: Code,
    machine_code: &str,
    message: String,
    extra: &[(&str, String)],
) -> tonic::Status {
    let mut metadata = HashMap::from([("code".to_owned(), machine_code.to_owned())]);
    for (k, v) in extra {
        metadata.insert((*k).to_owned(), v.clone());
    }
    let mut details = ErrorDetails::new();
    details.set_error_info(machine_code.to_ascii_uppercase(), ERROR_DOMAIN, metadata);
    tonic::Status::with_error_details(code, message, details)
}

/// The gRPC answers of a payment: the `Payment` message, or a decline as
/// `FAILED_PRECONDITION` (`CARD_DECLINED`, with the payment's id), both stored and replayed.
struct GrpcAnswers;

impl PaymentAnswers for GrpcAnswers {
    fn created(&self, payment: &Payment) -> Result<Response, TxError> {
        Ok(reply(&to_message(payment)).into_response())
    }

    fn declined(&self, payment: &Payment) -> Response {
        status_response(status(
            Code::FailedPrecondition,
            "card_declined",
            "the card processor declined the charge".to_owned(),
            &[("payment", payment.id.clone())],
        ))
        .into_response()
    }
}

/// An answer that is not stored: nothing was executed, the key is released.
fn not_executed(s: tonic::Status) -> Response {
    let mut res = status_response(s).into_response();
    res.extensions_mut().insert(HandlerOutcome::NotExecuted);
    res
}

/// `CreatePayment`, for any store the server runs on.
pub async fn create_payment<S>(
    State(app): State<App>,
    Extension(scope): Extension<Scope>,
    tx: Tx<S>,
    body: Bytes,
) -> Response
where
    S: SqlStore,
    S::Database: BusinessDb,
{
    let req: pb::CreatePaymentRequest = match decode_request(&body) {
        Ok(r) => r,
        Err(s) => return not_executed(s),
    };
    let valid = match payments::check_payment(
        &req.amount.into(),
        &req.currency.into(),
        &req.source.into(),
        req.description.map(Into::into),
    ) {
        Ok(v) => v,
        Err(errors) => {
            let mut details = ErrorDetails::new();
            for e in &errors {
                details.add_bad_request_violation(
                    e["field"].as_str().unwrap_or_default(),
                    e["detail"].as_str().unwrap_or_default(),
                );
            }
            return not_executed(tonic::Status::with_error_details(
                Code::InvalidArgument,
                "the request has invalid fields; nothing was executed, correct it and retry with the same key",
                details,
            ));
        }
    };
    match payments::run_payment(&app, &scope, tx, &valid, &GrpcAnswers).await {
        Ok(res) => res,
        Err(failure) => grpc_failure(failure.into_response()).await,
    }
}

/// A failure of the payment flow (a rolled-back phase, an outside system down) as the REST
/// API says it, a problem, said as a gRPC status; the response's extensions (what the layer
/// does with the key) are kept.
async fn grpc_failure(res: Response) -> Response {
    let (parts, body) = res.into_parts();
    let bytes = to_bytes(body, 64 * 1024).await.unwrap_or_default();
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    let retry_after = parts
        .headers
        .get(axum::http::header::RETRY_AFTER)
        .and_then(|h| h.to_str().ok())
        .and_then(|s| s.parse::<u64>().ok());
    let problem = Problem::custom(
        parts.status.as_u16(),
        v["code"].as_str().unwrap_or("internal"),
        v["title"].as_str().unwrap_or("Error"),
        v["detail"].as_str().unwrap_or("the request failed"),
    )
    .with_retryable(v["retryable"].as_bool().unwrap_or(false));
    let problem = match retry_after {
        Some(secs) => problem.with_retry_after(secs),
        None => problem,
    };
    let mut out = status_response(oncely_grpc::status_of(&problem)).into_response();
    *out.extensions_mut() = parts.extensions;
    out
}

/// `GetPayment`: the caller's payment by id, or `NOT_FOUND`.
pub async fn get_payment(
    State(app): State<App>,
    scope: Option<Extension<Scope>>,
    body: Bytes,
) -> Response {
    let Some(Extension(scope)) = scope else {
        return status_response(tonic::Status::unauthenticated(
            "send Authorization: Bearer <account> metadata",
        ))
        .into_response();
    };
    let req: pb::GetPaymentRequest = match decode_request(&body) {
        Ok(r) => r,
        Err(s) => return status_response(s).into_response(),
    };
    match app.db().payment_by_id(scope.as_str(), &req.id).await {
        Ok(Some(p)) => reply(&to_message(&p)).into_response(),
        Ok(None) => status_response(status(
            Code::NotFound,
            "not_found",
            format!("no payment {:?} for this caller", req.id),
            &[],
        ))
        .into_response(),
        Err(e) => {
            tracing::warn!(error = %e, "reading a payment failed");
            status_response(tonic::Status::unavailable("the database could not be read"))
                .into_response()
        }
    }
}

/// The keyed methods' routes, with handlers whose transactions run on store type `S`, each
/// method router passed through `keyed` (which puts [`layer`] or, for the baseline, a plain
/// transaction on the route's own methods).
pub fn routes<S>(keyed: &dyn Fn(MethodRouter<App>) -> MethodRouter<App>) -> Router<App>
where
    S: SqlStore,
    S::Database: BusinessDb,
{
    Router::new().route(CREATE_PAYMENT, keyed(post(create_payment::<S>)))
}

/// The gRPC form of the REST API's idempotency layer `rest` (the same store, claimer, policy,
/// metrics and drain). The in-flight mode `accepted` (`202` with a status URL) has no gRPC form:
/// under it, in-flight gRPC calls are rejected (`ABORTED` with `RetryInfo`).
pub fn layer(rest: IdempotencyLayer) -> GrpcIdempotencyLayer {
    match GrpcIdempotencyLayer::from_layer(rest.clone(), methods()) {
        Ok(l) => l,
        Err(_) => {
            let policy = rest
                .policy()
                .clone()
                .with_in_flight(oncely_core::InFlightBehavior::Reject);
            GrpcIdempotencyLayer::from_layer(rest.with_policy(policy), methods())
                .unwrap_or_else(|e| unreachable!("reject is served: {e}"))
        }
    }
}
