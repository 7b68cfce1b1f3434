//! # oncely-grpc
//!
//! The same guarantee for tonic gRPC services as `oncely-tower` gives HTTP services: a call
//! whose `idempotency-key` metadata entry was seen before, in the caller's scope and the replay
//! window, gets the stored response again, messages and trailers, and its handler runs once.
//! tonic is tower, so this crate is `oncely-tower`'s layer with a gRPC
//! [`Dialect`](oncely_tower::Dialect): the claim, lease heartbeat, fencing, transactional
//! claimers (`oncely-sqlx`), drain and metrics are the same code.
//!
//! ```no_run
//! use oncely_core::{MemoryStore, Scope};
//! use oncely_grpc::payments::v1::payments_server::{Payments, PaymentsServer};
//! use oncely_grpc::payments::v1::{CreatePaymentRequest, GetPaymentRequest, Payment};
//! use oncely_grpc::{GrpcIdempotencyLayer, GrpcMethods};
//! use std::sync::Arc;
//! use tonic::{Request, Response, Status};
//!
//! struct Svc;
//!
//! #[tonic::async_trait]
//! impl Payments for Svc {
//!     async fn create_payment(&self, req: Request<CreatePaymentRequest>) -> Result<Response<Payment>, Status> {
//!         // Runs once per (caller, key); retries get the stored response.
//!         let r = req.into_inner();
//!         Ok(Response::new(Payment { id: "pay_1".into(), amount: r.amount, currency: r.currency, ..Default::default() }))
//!     }
//!     async fn get_payment(&self, _: Request<GetPaymentRequest>) -> Result<Response<Payment>, Status> {
//!         Err(Status::not_found("no such payment"))
//!     }
//! }
//!
//! # #[tokio::main] async fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let methods = GrpcMethods::new().require("/oncely.payments.v1.Payments/CreatePayment");
//! let idempotency = GrpcIdempotencyLayer::new(Arc::new(MemoryStore::new()), methods);
//! tonic::transport::Server::builder()
//!     // Authentication first (outer): it decides whose key it is.
//!     .layer(tower::util::MapRequestLayer::new(|mut req: http::Request<tonic::body::Body>| {
//!         let account = req.headers().get("x-account").and_then(|v| v.to_str().ok()).map(str::to_owned);
//!         if let Some(a) = account { req.extensions_mut().insert(Scope::new(a)); }
//!         req
//!     }))
//!     .layer(idempotency)
//!     .add_service(PaymentsServer::new(Svc))
//!     .serve("127.0.0.1:50051".parse()?)
//!     .await?;
//! # Ok(()) }
//! ```
//!
//! # What a call gets
//!
//! | situation | answer |
//! |---|---|
//! | method not declared, or declared `accept` and called without a key | passes through |
//! | declared `require`, no key | `INVALID_ARGUMENT`, `ErrorInfo` reason `IDEMPOTENCY_KEY_MISSING` |
//! | key malformed (empty, over 255 characters, not visible ASCII, sent twice) | `INVALID_ARGUMENT`, `IDEMPOTENCY_KEY_INVALID` |
//! | key on a client-streaming or bidirectional method | `UNIMPLEMENTED`, `IDEMPOTENCY_STREAMING_UNSUPPORTED` ([`methods`]) |
//! | first call | runs the handler; its response (messages and trailers) is stored |
//! | same call while the first runs | `ABORTED` + `RetryInfo`, `IDEMPOTENCY_REQUEST_IN_FLIGHT` |
//! | same call after it completed | the stored response verbatim, trailers included, plus `idempotent-replayed: true` |
//! | same key, different call (method or message) | `FAILED_PRECONDITION`, `IDEMPOTENCY_KEY_MISMATCH` |
//! | store down or slow | `UNAVAILABLE` + `RetryInfo`, `IDEMPOTENCY_STORE_UNAVAILABLE`; nothing runs |
//!
//! The full table, and the A6 retry policy it is made for, are in [`status`].
//!
//! # Guarantee
//!
//! Effectively-once, not "exactly-once": inside one scope and replay window, a call's side
//! effects run once however often it is retried, provided they happen inside the handler.

pub mod deadline;
pub mod fingerprint;
mod layer;
pub mod methods;
pub mod status;
pub mod unary;

pub use deadline::{GrpcDeadline, parse_grpc_timeout};
pub use fingerprint::GrpcFingerprinter;
pub use layer::{GrpcIdempotency, GrpcIdempotencyLayer, GrpcResponseFuture, UnsupportedPolicy};
pub use methods::GrpcMethods;
pub use status::{
    ERROR_DOMAIN, GRPC_STATUS_TABLE, GrpcDialect, RETRY_PUSHBACK_MS, RETRYABLE_STATUS_CODES,
    StatusRow, decode_details, grpc_code_of, status_of,
};

/// The reference Payments service's messages, server and client, generated from
/// `proto/oncely/payments/v1/payments.proto` (in this crate) at build time, without a system
/// `protoc`. `oncely serve` serves it; any gRPC stack can generate its own from the same file.
pub mod payments {
    /// `oncely.payments.v1`.
    #[allow(missing_docs, clippy::all, clippy::pedantic, unreachable_pub)]
    pub mod v1 {
        tonic::include_proto!("oncely.payments.v1");
    }
}

/// The path of the Payments `.proto`, relative to this crate's directory.
pub const PAYMENTS_PROTO: &str = "proto/oncely/payments/v1/payments.proto";
