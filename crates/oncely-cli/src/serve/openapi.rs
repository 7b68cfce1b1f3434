//! The reference API's OpenAPI 3.1 document, served at `GET /openapi.json`, generated from the
//! code: each handler's `#[utoipa::path]` (next to it), the request and response types'
//! `ToSchema`, then two modifiers run over it:
//!
//! 1. [`IdempotencyDoc`] from the live [`Policy`]: the `Idempotency-Key` header on every write
//!    and every answer the idempotency layer gives (its statuses follow the status profile,
//!    the replay window, the size limit, the in-flight mode: `409` or `202`), so `oncely lint`
//!    passes on this document by construction;
//! 2. [`ServerDoc`]: the bearer scheme, and on every problem response the headers this server
//!    adds to each problem (`x-should-retry`; `Retry-After` on a `503`).

use super::App;
use super::routes::{keys, orders, payments, reads};
use super::{health, metrics};
use axum::Json;
use axum::extract::State;
use oncely_core::Policy;
use oncely_core::problem::PROBLEM_JSON;
use oncely_tower::openapi::{self, IdempotencyDoc};
use utoipa::openapi::RefOr;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "Oncely reference payments API",
        description = "A reference API built with Oncely. Every POST requires an Idempotency-Key \
            (1-255 visible ASCII characters, unique per logical operation; an event-derived key such as \
            `order-confirm-{order_id}` is best). A retry with the same key and the same request replays \
            the stored response with `Idempotent-Replayed: true` within the replay window (see the \
            header's description). Authentication is a stand-in: `Authorization: Bearer <account>`; \
            the account is the idempotency scope."
    ),
    paths(
        payments::create_payment,
        reads::list_payments,
        reads::get_payment,
        orders::create_order,
        reads::list_orders,
        reads::get_order,
        keys::key_state,
        metrics::metrics,
        health::healthz,
        health::readyz,
        serve_document,
    ),
    security(("bearer" = []))
)]
struct ApiDoc;

/// The document for a server whose layer runs with `policy`.
pub fn document(policy: &Policy) -> utoipa::openapi::OpenApi {
    let mut doc = ApiDoc::openapi();
    IdempotencyDoc::new(policy).modify(&mut doc);
    WebhookDoc.modify(&mut doc);
    ServerDoc.modify(&mut doc);
    doc
}

/// `GET /openapi.json`: this document.
#[utoipa::path(get, path = "/openapi.json", operation_id = "openapi", security(()),
    responses((status = 200, description = "This document.", body = Object)))]
pub async fn serve_document(State(app): State<App>) -> Json<utoipa::openapi::OpenApi> {
    Json(document(app.policy()))
}

/// The server's part of the document (see the [module docs](self)).
#[derive(Debug, Clone, Copy)]
pub struct ServerDoc;

impl Modify for ServerDoc {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        doc.components
            .get_or_insert_with(Default::default)
            .security_schemes
            .insert(
                "bearer".to_owned(),
                SecurityScheme::Http(
                    HttpBuilder::new()
                        .scheme(HttpAuthScheme::Bearer)
                        .description(Some(
                            "The bearer token is the account id (a stand-in for real authentication).",
                        ))
                        .build(),
                ),
            );
        for item in doc.paths.paths.values_mut() {
            for op in [
                &mut item.get,
                &mut item.post,
                &mut item.put,
                &mut item.patch,
                &mut item.delete,
            ]
            .into_iter()
            .flatten()
            {
                for (status, response) in &mut op.responses.responses {
                    let RefOr::T(r) = response else { continue };
                    if !r.content.contains_key(PROBLEM_JSON) {
                        continue;
                    }
                    r.headers
                        .entry(oncely_core::X_SHOULD_RETRY.to_owned())
                        .or_insert_with(openapi::should_retry_header);
                    if status == "503" {
                        r.headers
                            .entry("Retry-After".to_owned())
                            .or_insert_with(openapi::retry_after_header);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncely_core::{InFlightBehavior, StatusProfile};
    use std::time::Duration;

    fn lint(doc: &utoipa::openapi::OpenApi) -> oncely_audit::lint::LintReport {
        oncely_audit::lint::lint(&serde_json::to_string(doc).unwrap()).unwrap()
    }

    /// `oncely lint` passes on the document whatever the policy, and the live policy shows in
    /// it.
    #[test]
    fn the_document_lints_clean_and_follows_the_policy() {
        let policies = [
            Policy::default(),
            Policy::default()
                .with_profile(StatusProfile::Stripe)
                .with_replay_window(Duration::from_secs(3600))
                .with_retention(Duration::from_secs(3600)),
            Policy::default()
                .with_profile(StatusProfile::Resend)
                .with_in_flight(InFlightBehavior::Accepted {
                    status_url: "/v1/idempotency-keys/{key}",
                }),
        ];
        for policy in &policies {
            let doc = document(policy);
            let report = lint(&doc);
            assert!(report.passed(), "{}", report.render_text());
            // POST /v1/payments, POST /v1/orders and the webhook receiver (keyed by webhook-id).
            assert_eq!(report.to_json()["operations_checked"], 3);
        }
        let v = |p: &Policy| serde_json::to_value(document(p)).unwrap();
        let ietf = v(&policies[0]);
        let post = &ietf["paths"]["/v1/payments"]["post"];
        assert!(
            post["parameters"][0]["description"]
                .as_str()
                .unwrap()
                .contains("for 24 hours")
        );
        // The route's own 422 (validation_failed) and the layer's mismatch share the status.
        let unprocessable = post["responses"]["422"]["description"].as_str().unwrap();
        assert!(
            unprocessable.contains("validation_failed"),
            "{unprocessable}"
        );
        assert!(
            unprocessable.contains("idempotency_key_mismatch"),
            "{unprocessable}"
        );
        assert!(post["responses"].get("202").is_none());
        assert!(
            post["responses"]["415"]["description"]
                .as_str()
                .unwrap()
                .contains("unsupported_media_type")
        );
        for status in ["400", "401", "402", "409", "413", "415", "422", "503"] {
            assert!(
                post["responses"][status]["headers"]["x-should-retry"].is_object(),
                "{status}"
            );
        }
        assert!(post["responses"]["503"]["headers"]["Retry-After"].is_object());

        let stripe = v(&policies[1]);
        let post = &stripe["paths"]["/v1/payments"]["post"];
        assert!(
            post["parameters"][0]["description"]
                .as_str()
                .unwrap()
                .contains("for 1 hour")
        );
        let bad = post["responses"]["400"]["description"].as_str().unwrap();
        assert!(bad.contains("idempotency_key_mismatch"), "{bad}");
        assert!(
            !post["responses"]["422"]["description"]
                .as_str()
                .unwrap()
                .contains("idempotency_key_mismatch")
        );

        let resend = v(&policies[2]);
        let post = &resend["paths"]["/v1/orders"]["post"];
        assert!(post["responses"]["202"]["headers"]["Location"].is_object());
        assert!(
            post["responses"]["409"]["description"]
                .as_str()
                .unwrap()
                .contains("idempotency_key_mismatch")
        );
    }
}

/// The webhook receiver's part of the document: `POST /webhooks/processor` (keyed by the
/// sender's `webhook-id`, not by `Idempotency-Key`, so it is added after [`IdempotencyDoc`],
/// marked with the `x-oncely-key-source` extension `oncely lint` honours) and the read of what
/// it applied, `GET /v1/payments/{id}/events`. [`ServerDoc`] then adds its problem headers.
#[derive(Debug, Clone, Copy)]
pub struct WebhookDoc;

impl WebhookDoc {
    fn paths() -> serde_json::Value {
        let problem = |description: &str| {
            serde_json::json!({
                "description": description,
                "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}
            })
        };
        serde_json::json!({
            "/v1/payments/{id}/events": {"get": {
                "operationId": "listPaymentEvents",
                "summary": "The webhook events applied to the caller's payment, one row per application.",
                "parameters": [{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}],
                "responses": {
                    "200": {"description": "OK", "content": {"application/json": {"schema": {
                        "type": "object",
                        "properties": {"data": {"type": "array", "items": {"$ref": "#/components/schemas/AppliedEvent"}}}
                    }}}},
                    "401": problem("`unauthenticated`."),
                    "404": problem("`not_found`."),
                    "503": problem("`unavailable`: the database could not answer; retry later.")
                }
            }},
            "/webhooks/processor": {"post": {
                "operationId": "receiveProcessorEvent",
                "summary": "The card processor's Standard Webhooks events (charge.succeeded), each applied once.",
                "description": "Signed by the processor (`webhook-signature: v1,<base64 HMAC-SHA256 of webhook-id.webhook-timestamp.body>`), verified before any claim. Keyed by `webhook-id` (not `Idempotency-Key`), scoped by the sender: a redelivery gets the stored answer with `Idempotent-Replayed: true`.",
                "security": [],
                "x-oncely-key-source": "webhook-id",
                "parameters": [
                    {"name": "webhook-id", "in": "header", "required": true, "description": "The event's id, the same on every redelivery: the idempotency key.", "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[!-~]{1,255}$"}},
                    {"name": "webhook-timestamp", "in": "header", "required": true, "description": "When this attempt was signed, seconds since the epoch; within 300 seconds of now.", "schema": {"type": "string", "pattern": "^[0-9]+$"}},
                    {"name": "webhook-signature", "in": "header", "required": true, "description": "Space-separated `v1,<base64>` signatures.", "schema": {"type": "string"}}
                ],
                "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Event"}}}},
                "responses": {
                    "200": {
                        "description": "Applied (or, on a redelivery, the stored answer of its one application).",
                        "headers": {"Idempotent-Replayed": {"description": "`true` on a redelivery.", "schema": {"type": "string", "enum": ["true"]}}},
                        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/EventReceipt"}}}
                    },
                    "400": problem("`webhook_headers_invalid`, `webhook_timestamp_out_of_tolerance`, `idempotency_key_invalid`, `idempotency_body_not_canonicalizable` or `invalid_event`: nothing was applied."),
                    "401": problem("`webhook_signature_invalid`: no signature matches for the processor's secret; nothing was applied."),
                    "409": problem("`idempotency_request_in_flight` (the same event is being applied; the sender retries) or `idempotency_request_needs_attention`."),
                    "413": problem("`webhook_body_too_large`."),
                    "422": problem("`idempotency_key_mismatch`: another body under a known event id; never applied."),
                    "503": problem("`idempotency_store_unavailable`, `database_unavailable`, `server_shutting_down` or `unavailable`: nothing was applied; the sender retries.")
                }
            }}
        })
    }

    fn schemas() -> serde_json::Value {
        serde_json::json!({
            "Event": {
                "type": "object", "required": ["type"],
                "properties": {"id": {"type": "string"}, "type": {"type": "string"}, "created": {"type": "integer"}, "data": {"type": "object"}}
            },
            "EventReceipt": {
                "type": "object",
                "properties": {"received": {"type": "string"}, "type": {"type": "string"}, "payment": {"type": ["string", "null"]}, "confirmed": {"type": "boolean"}, "received_at": {"type": "integer"}}
            },
            "AppliedEvent": {
                "type": "object",
                "properties": {"id": {"type": "string"}, "sender": {"type": "string"}, "event_id": {"type": "string"}, "type": {"type": "string"}, "received_at": {"type": "integer", "description": "Epoch milliseconds."}}
            }
        })
    }
}

impl Modify for WebhookDoc {
    fn modify(&self, doc: &mut utoipa::openapi::OpenApi) {
        let paths: std::collections::BTreeMap<String, utoipa::openapi::path::PathItem> =
            serde_json::from_value(Self::paths()).expect("the webhook paths are valid OpenAPI");
        doc.paths.paths.extend(paths);
        let schemas: std::collections::BTreeMap<String, RefOr<utoipa::openapi::schema::Schema>> =
            serde_json::from_value(Self::schemas()).expect("the webhook schemas are valid OpenAPI");
        doc.components
            .get_or_insert_with(Default::default)
            .schemas
            .extend(schemas);
    }
}
