//! [`StandardWebhooksLayer`]: authenticates Standard Webhooks deliveries before any claim, and
//! makes the sender whose signature verified the idempotency scope.
//!
//! A webhook sender delivers each event at least once, retries on any non-`2xx` answer or
//! timeout, and may deliver the same event concurrently; the receiver is the server that has to
//! collapse the duplicates. Under the [Standard Webhooks] specification every delivery carries
//! `webhook-id` (the event's id, the same on every retry: the idempotency key),
//! `webhook-timestamp` (the attempt's time, integer seconds since the epoch) and
//! `webhook-signature` (`v1,<base64 HMAC-SHA256 of id.timestamp.body>`, space-separated when
//! the sender rotates its secret).
//!
//! This layer verifies the signature with the specification's reference crate
//! [`standardwebhooks`] (constant-time comparison, a 5-minute timestamp tolerance against the
//! system clock), then inserts the sender's [`Scope`] and a [`VerifiedWebhook`] into the request
//! extensions. Put it **outside** an [`IdempotencyLayer`](crate::IdempotencyLayer) whose
//! [`KeySource`](crate::KeySource) is the `webhook-id` header: a delivery that does not verify
//! is answered here and never reaches the claim, so a forged or replayed-stale delivery cannot
//! occupy an event id.
//!
//! | delivery | answer (RFC 9457 problem+json, `retryable: false`) |
//! |---|---|
//! | signature valid for a configured sender, timestamp within 5 minutes | passes, scoped by that sender |
//! | no `webhook-signature`, or no `v1` signature that matches any sender's secret (a tampered body, id or timestamp; a wrong secret) | `401 webhook_signature_invalid` |
//! | `webhook-timestamp` more than 5 minutes before or after now | `400 webhook_timestamp_out_of_tolerance` |
//! | `webhook-id` or `webhook-timestamp` missing, repeated or malformed; a body that is not UTF-8 | `400 webhook_headers_invalid` |
//! | body over the limit (default 1 MiB) | `413 webhook_body_too_large` |
//!
//! The specification leaves the receiver's error statuses open; these follow HTTP's meaning
//! (RFC 9110: `401` for a request without valid credentials, `400` for a malformed one). A
//! sender treats all of them as a failed delivery and retries with a fresh timestamp and
//! signature: a stale attempt is never an event lost.
//!
//! ```
//! use axum::{Router, routing::post, http::StatusCode};
//! use oncely_core::{MemoryStore, Scope};
//! use oncely_tower::{IdempotencyLayer, KeySource, StandardWebhooksLayer, VerifiedWebhook};
//! use std::sync::Arc;
//! use tower::ServiceExt;
//!
//! async fn receive(event: axum::Extension<VerifiedWebhook>, body: String) -> StatusCode {
//!     // Runs once per (sender, webhook-id); a redelivery gets this answer replayed.
//!     assert_eq!(event.sender, Scope::new("processor"));
//!     let _ = body;
//!     StatusCode::NO_CONTENT
//! }
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() {
//! let secret = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
//! let app = Router::new()
//!     .route("/webhooks/processor", post(receive))
//!     .layer(IdempotencyLayer::new(Arc::new(MemoryStore::new()))
//!         .with_key_source(KeySource::header("webhook-id").unwrap()))
//!     .layer(StandardWebhooksLayer::new().with_sender(Scope::new("processor"), secret).unwrap());
//!
//! // What a sender does (here with the same crate).
//! let body = r#"{"type":"charge.succeeded","data":{"id":"ch_1"}}"#;
//! let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
//! let signature = standardwebhooks::Webhook::new(secret).unwrap().sign("msg_1", now, body.as_bytes()).unwrap();
//! let delivery = |signature: &str| {
//!     axum::http::Request::post("/webhooks/processor")
//!         .header("content-type", "application/json")
//!         .header("webhook-id", "msg_1")
//!         .header("webhook-timestamp", now.to_string())
//!         .header("webhook-signature", signature)
//!         .body(axum::body::Body::from(body))
//!         .unwrap()
//! };
//! assert_eq!(app.clone().oneshot(delivery(&signature)).await.unwrap().status(), 204);
//! let again = app.clone().oneshot(delivery(&signature)).await.unwrap();
//! assert_eq!(again.headers()["idempotent-replayed"], "true");
//! let forged = "v1,AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
//! assert_eq!(app.clone().oneshot(delivery(forged)).await.unwrap().status(), 401);
//! # }
//! ```
//!
//! [Standard Webhooks]: https://github.com/standard-webhooks/standard-webhooks/blob/main/spec/standard-webhooks.md

use crate::future::ResponseFuture;
use crate::problem::problem_response;
use crate::{Body, BoxError};
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use oncely_core::Scope;
use oncely_core::{ErrorCode, Problem};
use standardwebhooks::{
    HEADER_WEBHOOK_ID, HEADER_WEBHOOK_SIGNATURE, HEADER_WEBHOOK_TIMESTAMP, Webhook, WebhookError,
};
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::{Layer, Service};

/// How far a delivery's `webhook-timestamp` may be from now, before or after: 300 seconds (5
/// minutes), the `standardwebhooks` crate's fixed tolerance, checked against the system clock.
pub const TIMESTAMP_TOLERANCE_SECS: u64 = 300;

/// The default largest delivery body the layer buffers to verify: 1 MiB (1,048,576 bytes),
/// the same as `Policy::max_request_bytes`.
pub const DEFAULT_MAX_WEBHOOK_BYTES: usize = 1024 * 1024;

/// What a verified delivery carries into the request extensions (next to the sender's
/// [`Scope`]): read it with `axum::Extension<VerifiedWebhook>`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct VerifiedWebhook {
    /// The sender whose secret verified the signature (also the idempotency scope).
    pub sender: Scope,
    /// The `webhook-id` header: the event's id, the same on every redelivery.
    pub id: String,
    /// The `webhook-timestamp` header: when this attempt was signed, in seconds since the Unix
    /// epoch.
    pub timestamp: i64,
}

/// A sender's secret that cannot be used: not base64 (after an optional `whsec_` prefix), or
/// empty (an empty HMAC key is a key everybody knows).
#[derive(Debug, thiserror::Error)]
#[error("invalid Standard Webhooks secret for sender {sender}: {reason}")]
pub struct WebhookSecretError {
    sender: String,
    reason: String,
}

// `Webhook` is not `Clone` in standardwebhooks 1.0.1: shared behind an `Arc`.
#[derive(Clone)]
struct Sender {
    scope: Scope,
    verifier: Arc<Webhook>,
}

#[derive(Default, Clone)]
struct Senders {
    senders: Vec<Sender>,
}

/// Verifies Standard Webhooks signatures before the request goes further (see the
/// [module docs](self)); wraps a service in [`StandardWebhooks`].
///
/// Defaults: no sender (every delivery is `401`), a body limit of 1 MiB
/// ([`DEFAULT_MAX_WEBHOOK_BYTES`]). Cloning is cheap.
#[derive(Clone)]
pub struct StandardWebhooksLayer {
    senders: Arc<Senders>,
    max_body_bytes: usize,
}

impl Default for StandardWebhooksLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for StandardWebhooksLayer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self
            .senders
            .senders
            .iter()
            .map(|s| s.scope.as_str())
            .collect();
        f.debug_struct("StandardWebhooksLayer")
            .field("senders", &names)
            .field("max_body_bytes", &self.max_body_bytes)
            .finish()
    }
}

impl StandardWebhooksLayer {
    /// A layer with no sender yet.
    pub fn new() -> Self {
        Self {
            senders: Arc::default(),
            max_body_bytes: DEFAULT_MAX_WEBHOOK_BYTES,
        }
    }

    /// Accepts deliveries signed with `secret` (`whsec_<base64>`, the specification's form, or
    /// bare base64) as coming from `sender`, which becomes their idempotency scope. Senders are
    /// tried in the order added; give each sender its own secret (the specification asks for
    /// one per endpoint, 24 to 64 random bytes).
    ///
    /// # Errors
    ///
    /// [`WebhookSecretError`] when the secret is not base64 or decodes to nothing.
    pub fn with_sender(mut self, sender: Scope, secret: &str) -> Result<Self, WebhookSecretError> {
        let fail = |reason: &str| WebhookSecretError {
            sender: sender.as_str().to_owned(),
            reason: reason.to_owned(),
        };
        let raw = secret.strip_prefix("whsec_").unwrap_or(secret);
        if raw.is_empty() {
            return Err(fail("the secret is empty"));
        }
        let verifier = Webhook::new(secret).map_err(|e| fail(&e.to_string()))?;
        Arc::make_mut(&mut self.senders).senders.push(Sender {
            scope: sender,
            verifier: Arc::new(verifier),
        });
        Ok(self)
    }

    /// Sets the largest delivery body buffered to verify, in bytes (default 1 MiB); a larger
    /// one is `413 webhook_body_too_large`.
    pub const fn with_max_body_bytes(mut self, n: usize) -> Self {
        self.max_body_bytes = n;
        self
    }
}

impl<S> Layer<S> for StandardWebhooksLayer {
    type Service = StandardWebhooks<S>;

    fn layer(&self, inner: S) -> Self::Service {
        StandardWebhooks {
            inner,
            layer: self.clone(),
        }
    }
}

/// The Standard Webhooks verifier around a service `S`; made by [`StandardWebhooksLayer`].
///
/// It accepts `http::Request<B>` for any body, hands the inner service the verified request
/// with its body buffered (an `http::Request<`[`Body`]`>`), and answers
/// `http::Response<`[`Body`]`>`; it fails only with the inner service's error.
#[derive(Clone)]
pub struct StandardWebhooks<S> {
    inner: S,
    layer: StandardWebhooksLayer,
}

impl<S: fmt::Debug> fmt::Debug for StandardWebhooks<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("StandardWebhooks")
            .field("inner", &self.inner)
            .field("layer", &self.layer)
            .finish()
    }
}

impl<S, B, ResBody> Service<Request<B>> for StandardWebhooks<S>
where
    S: Service<Request<Body>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
    ResBody: http_body::Body<Data = Bytes> + Send + 'static,
    ResBody::Error: Into<BoxError>,
{
    type Response = Response<Body>;
    type Error = S::Error;
    type Future = ResponseFuture<S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let clone = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, clone);
        let layer = self.layer.clone();
        ResponseFuture::new(Box::pin(async move {
            let (mut parts, body) = req.into_parts();
            let body = match Limited::new(body, layer.max_body_bytes).collect().await {
                Ok(c) => c.to_bytes(),
                Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => {
                    return Ok(refuse(
                        ErrorCode::WebhookBodyTooLarge,
                        &format!(
                            "the delivery's body is larger than {} bytes, the most this receiver verifies",
                            layer.max_body_bytes
                        ),
                    ));
                }
                Err(_) => {
                    return Ok(refuse(
                        ErrorCode::WebhookHeadersInvalid,
                        "the delivery's body could not be read completely; nothing was executed",
                    ));
                }
            };
            let verified = match layer.senders.verify(&parts.headers, &body) {
                Ok(v) => v,
                Err(res) => return Ok(*res),
            };
            parts.extensions.insert(verified.sender.clone());
            parts.extensions.insert(verified);
            let req = Request::from_parts(
                parts,
                Body::new(Full::new(body).map_err(|never| match never {})),
            );
            let res = crate::service::call_boxed(&mut inner, req).await?;
            Ok(res.map(|b| Body::new(b.map_err(Into::into))))
        }))
    }
}

impl Senders {
    /// The verified delivery, or the problem response that refuses it.
    fn verify(
        &self,
        headers: &http::HeaderMap,
        body: &[u8],
    ) -> Result<VerifiedWebhook, Box<Response<Body>>> {
        // The crate reads the first value of each header; a repeated one is ambiguous (the
        // idempotency key could be another id than the signed one), so it is refused here.
        for name in [
            HEADER_WEBHOOK_ID,
            HEADER_WEBHOOK_TIMESTAMP,
            HEADER_WEBHOOK_SIGNATURE,
        ] {
            if headers.get_all(name).iter().count() > 1 {
                return Err(Box::new(headers_invalid(&format!(
                    "the {name} header was sent more than once; send it once"
                ))));
            }
        }
        let mut last = WebhookError::InvalidSignature;
        for sender in &self.senders {
            match sender.verifier.verify(body, headers) {
                Ok(()) => {
                    let text = |n: &str| {
                        headers
                            .get(n)
                            .and_then(|v| v.to_str().ok())
                            .unwrap_or_default()
                            .to_owned()
                    };
                    return Ok(VerifiedWebhook {
                        sender: sender.scope.clone(),
                        id: text(HEADER_WEBHOOK_ID),
                        timestamp: text(HEADER_WEBHOOK_TIMESTAMP).parse().unwrap_or_default(),
                    });
                }
                // Another sender's secret may match.
                Err(WebhookError::InvalidSignature) => {}
                // The same for every secret (headers, timestamp, payload): answer it now.
                Err(e) => {
                    last = e;
                    break;
                }
            }
        }
        Err(Box::new(refusal(&last)))
    }
}

fn refusal(e: &WebhookError) -> Response<Body> {
    match e {
        WebhookError::InvalidSignature => refuse(
            ErrorCode::WebhookSignatureInvalid,
            "no signature in webhook-signature matches this delivery's id, timestamp and body for any configured sender; nothing was executed",
        ),
        WebhookError::MissingHeader("signature") | WebhookError::InvalidHeader("signature") => {
            refuse(
                ErrorCode::WebhookSignatureInvalid,
                "the delivery has no readable webhook-signature header; nothing was executed",
            )
        }
        WebhookError::TimestampTooOldError => refuse(
            ErrorCode::WebhookTimestampOutOfTolerance,
            "webhook-timestamp is more than 5 minutes old (a replayed delivery?); a sender's retry signs again with the current time; nothing was executed",
        ),
        WebhookError::FutureTimestampError => refuse(
            ErrorCode::WebhookTimestampOutOfTolerance,
            "webhook-timestamp is more than 5 minutes in the future (check the sender's clock); nothing was executed",
        ),
        WebhookError::InvalidPayload => headers_invalid(
            "the delivery's body is not UTF-8, so it cannot carry a Standard Webhooks signature",
        ),
        other => headers_invalid(&format!(
            "{other} (Standard Webhooks deliveries carry webhook-id, webhook-timestamp in integer seconds and webhook-signature, each once)"
        )),
    }
}

fn headers_invalid(detail: &str) -> Response<Body> {
    refuse(
        ErrorCode::WebhookHeadersInvalid,
        &format!("{detail}; nothing was executed"),
    )
}

fn refuse(code: ErrorCode, detail: &str) -> Response<Body> {
    problem_response(&Problem::from_code(code, detail), None)
}
