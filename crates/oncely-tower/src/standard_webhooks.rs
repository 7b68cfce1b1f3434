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
//! This layer verifies the signature as the specification's reference crate [`standardwebhooks`]
//! does (HMAC-SHA256 by the `hmac-sha256` crate it uses, with its constant-time check; the secret
//! decoded as it decodes it; the same answers for the same faults), with one difference: the
//! 5-minute timestamp tolerance is checked against the layer's [`Clock`]
//! ([`StandardWebhooksLayer::with_clock`]; pass the key store's, so that one clock decides every
//! window of a delivery), not the system clock the crate reads. Then it inserts the sender's
//! [`Scope`] and a [`VerifiedWebhook`] into the request extensions. Put it **outside** an [`IdempotencyLayer`](crate::IdempotencyLayer) whose
//! [`KeySource`](crate::KeySource) is the `webhook-id` header: a delivery that does not verify
//! is answered here and never reaches the claim, so a forged or replayed-stale delivery cannot
//! occupy an event id.
//!
//! | delivery | answer (RFC 9457 problem+json, `retryable: false`) |
//! |---|---|
//! | signature valid for a configured sender, timestamp within 5 minutes | passes, scoped by that sender |
//! | no `webhook-signature`, or no `v1` signature that matches any sender's secret (a tampered body, id or timestamp; a wrong secret) | `401 webhook_signature_invalid`, with `WWW-Authenticate: Standard-Webhooks` |
//! | `webhook-timestamp` more than 5 minutes before or after now (the layer's clock) | `400 webhook_timestamp_out_of_tolerance` |
//! | `webhook-id` or `webhook-timestamp` missing, repeated or malformed; a body that is not UTF-8 | `400 webhook_headers_invalid` |
//! | body over the limit (default 1 MiB) | `413 webhook_body_too_large` |
//!
//! The specification leaves the receiver's error statuses open; these follow HTTP's meaning
//! (RFC 9110: `401` for a request without valid credentials, `400` for a malformed one). A `401`
//! carries a challenge, as RFC 9110 section 11.6.1 requires of every one; Standard Webhooks
//! registers no authentication scheme, so the challenge is named after the specification. A
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
use base64::Engine as _;
use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full, LengthLimitError, Limited};
use oncely_core::response::{Body, BoxError};
use oncely_core::{Clock, ErrorCode, Problem, Scope, SystemClock};
use standardwebhooks::{
    HEADER_WEBHOOK_ID, HEADER_WEBHOOK_SIGNATURE, HEADER_WEBHOOK_TIMESTAMP, Webhook, WebhookError,
};
use std::fmt;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::{Layer, Service};

/// How far a delivery's `webhook-timestamp` may be from now, before or after: 300 seconds (5
/// minutes), the `standardwebhooks` crate's fixed tolerance, checked against the layer's clock
/// ([`StandardWebhooksLayer::with_clock`]).
pub const TIMESTAMP_TOLERANCE_SECS: u64 = 300;

/// The challenge of every `401` the layer answers (`WWW-Authenticate`, RFC 9110 section
/// 11.6.1): `Standard-Webhooks`, after the specification, which registers no scheme of its own.
pub const WEBHOOK_CHALLENGE: &str = "Standard-Webhooks";

/// The version of the signatures the layer checks: `v1` (HMAC-SHA256), the one the
/// specification defines for symmetric secrets.
const SIGNATURE_VERSION: &str = "v1";

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

#[derive(Clone)]
struct Sender {
    scope: Scope,
    /// The HMAC key: the secret after `whsec_`, base64-decoded.
    key: Arc<[u8]>,
}

#[derive(Default, Clone)]
struct Senders {
    senders: Vec<Sender>,
}

/// Verifies Standard Webhooks signatures before the request goes further (see the
/// [module docs](self)); wraps a service in [`StandardWebhooks`].
///
/// Defaults: no sender (every delivery is `401`), a body limit of 1 MiB
/// ([`DEFAULT_MAX_WEBHOOK_BYTES`]), the system clock. Cloning is cheap.
#[derive(Clone)]
pub struct StandardWebhooksLayer {
    senders: Arc<Senders>,
    max_body_bytes: usize,
    clock: Arc<dyn Clock>,
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
            .field("now_millis", &self.clock.now_millis())
            .finish()
    }
}

impl StandardWebhooksLayer {
    /// A layer with no sender yet.
    pub fn new() -> Self {
        Self {
            senders: Arc::default(),
            max_body_bytes: DEFAULT_MAX_WEBHOOK_BYTES,
            clock: Arc::new(SystemClock),
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
        // The reference crate's own check of the secret, then the key it would sign with.
        Webhook::new(secret).map_err(|e| fail(&e.to_string()))?;
        let key = base64::engine::general_purpose::STANDARD
            .decode(raw)
            .map_err(|e| fail(&e.to_string()))?;
        Arc::make_mut(&mut self.senders).senders.push(Sender {
            scope: sender,
            key: key.into(),
        });
        Ok(self)
    }

    /// Replaces the clock the timestamp tolerance is checked against (default the system
    /// clock): pass the key store's, the one that decides the deliveries' leases and replay
    /// windows, so that a test on a `ManualClock` (or an application clock) moves them all.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
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
            let now_secs = layer.clock.now_millis().div_euclid(1000);
            let verified = match layer.senders.verify(&parts.headers, &body, now_secs) {
                Ok(v) => v,
                Err(res) => return Ok(*res),
            };
            parts.extensions.insert(verified.sender.clone());
            parts.extensions.insert(verified);
            let req = Request::from_parts(
                parts,
                Body::new(Full::new(body).map_err(|never| match never {})),
            );
            let res = crate::body::call_boxed(&mut inner, req).await?;
            Ok(res.map(|b| Body::new(b.map_err(Into::into))))
        }))
    }
}

impl Senders {
    /// The verified delivery, or the problem response that refuses it; `now_secs` is the
    /// layer's clock in seconds since the Unix epoch.
    fn verify(
        &self,
        headers: &http::HeaderMap,
        body: &[u8],
        now_secs: i64,
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
        if self.senders.is_empty() {
            // No secret to check it with: unsigned, whatever else is wrong with it.
            return Err(Box::new(refusal(&WebhookError::InvalidSignature)));
        }
        let delivery =
            Delivery::read(headers, body, now_secs).map_err(|e| Box::new(refusal(&e)))?;
        // Another sender's secret may match: every one is tried, in the order added.
        match self.senders.iter().find(|s| delivery.signed_with(&s.key)) {
            Some(sender) => Ok(VerifiedWebhook {
                sender: sender.scope.clone(),
                id: delivery.id.to_owned(),
                timestamp: delivery.timestamp,
            }),
            None => Err(Box::new(refusal(&WebhookError::InvalidSignature))),
        }
    }
}

/// A delivery's signed parts, read and checked in the order `standardwebhooks`'
/// `Webhook::verify` reads them (so that each fault gets the answer the crate gives it): the
/// three headers, the timestamp's tolerance, the body as UTF-8.
struct Delivery<'a> {
    id: &'a str,
    timestamp: i64,
    signatures: &'a str,
    /// `id.timestamp.body`, the content every signature signs.
    signed: String,
}

impl<'a> Delivery<'a> {
    fn read(
        headers: &'a http::HeaderMap,
        body: &'a [u8],
        now_secs: i64,
    ) -> Result<Self, WebhookError> {
        let text = |name: &str, what: &'static str| {
            headers
                .get(name)
                .ok_or(WebhookError::MissingHeader(what))?
                .to_str()
                .map_err(|_| WebhookError::InvalidHeader(what))
        };
        let id = text(HEADER_WEBHOOK_ID, "id")?;
        let signatures = text(HEADER_WEBHOOK_SIGNATURE, "signature")?;
        let timestamp: i64 = text(HEADER_WEBHOOK_TIMESTAMP, "timestamp")?
            .parse()
            .map_err(|_| WebhookError::InvalidTimestamp)?;
        let tolerance = TIMESTAMP_TOLERANCE_SECS as i64;
        if now_secs.saturating_sub(timestamp) > tolerance {
            return Err(WebhookError::TimestampTooOldError);
        }
        if timestamp > now_secs.saturating_add(tolerance) {
            return Err(WebhookError::FutureTimestampError);
        }
        let payload = std::str::from_utf8(body).map_err(|_| WebhookError::InvalidPayload)?;
        Ok(Self {
            id,
            timestamp,
            signatures,
            // The timestamp as the crate signs it: the number, not the header's spelling.
            signed: format!("{id}.{timestamp}.{payload}"),
        })
    }

    /// Whether one of the space-separated `v1,<base64>` signatures is the HMAC-SHA256 of the
    /// signed content under `key` (checked in constant time by `hmac-sha256`).
    fn signed_with(&self, key: &[u8]) -> bool {
        self.signatures
            .split(' ')
            .filter_map(|s| s.split_once(','))
            .filter(|(version, _)| *version == SIGNATURE_VERSION)
            .filter_map(|(_, mac)| base64::engine::general_purpose::STANDARD.decode(mac).ok())
            .filter_map(|mac| <[u8; 32]>::try_from(mac).ok())
            .any(|mac| hmac_sha256::HMAC::verify(self.signed.as_bytes(), key, &mac))
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
    let mut res = problem_response(&Problem::from_code(code, detail));
    if res.status() == http::StatusCode::UNAUTHORIZED {
        res.headers_mut().insert(
            http::header::WWW_AUTHENTICATE,
            http::HeaderValue::from_static(WEBHOOK_CHALLENGE),
        );
    }
    res
}
