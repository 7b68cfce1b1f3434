//! The reference API's OpenAPI 3.1 document, served at `GET /openapi.json`.

use serde_json::{Value, json};

fn problem(description: &str) -> Value {
    json!({
        "description": description,
        "headers": {"x-should-retry": {"$ref": "#/components/headers/ShouldRetry"}},
        "content": {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
    })
}

/// A retryable problem: also `Retry-After`.
fn retryable(description: &str) -> Value {
    let mut p = problem(description);
    p["headers"]["Retry-After"] = json!({"$ref": "#/components/headers/RetryAfter"});
    p
}

fn write_responses(created: &str, schema: &str, extra: &[(&str, &str)]) -> Value {
    let mut r = json!({
        "201": {
            "description": created,
            "headers": {
                "Location": {"schema": {"type": "string"}},
                "Idempotent-Replayed": {"description": "`true` on a replay of a stored response.", "schema": {"type": "string", "enum": ["true"]}}
            },
            "content": {"application/json": {"schema": {"$ref": schema}}}
        },
        "202": {
            "description": "Only with `--in-flight-accepted`: another request with this key is running; poll `Location` (the key's state) or retry after `Retry-After`.",
            "headers": {
                "Location": {"schema": {"type": "string"}},
                "Retry-After": {"$ref": "#/components/headers/RetryAfter"}
            },
            "content": {"application/json": {"schema": {"$ref": "#/components/schemas/InFlight"}}}
        },
        "400": problem("`idempotency_key_missing`, `idempotency_key_invalid`, `idempotency_body_not_canonicalizable` (a JSON body that is not I-JSON: a repeated member name, a lone surrogate, an inexact number), `invalid_json` or `idempotency_request_body_unreadable`: nothing was executed."),
        "401": problem("`unauthenticated`: send `Authorization: Bearer <account>`."),
        "409": retryable("`idempotency_request_in_flight` (retryable; see `Retry-After`) or `idempotency_response_not_retained` (not retryable)."),
        "413": problem("`idempotency_request_too_large`."),
        "415": problem("`unsupported_media_type`: send `Content-Type: application/json` (uncompressed)."),
        "422": problem("`idempotency_key_mismatch` (the key was used with another request; never retry), `validation_failed` (nothing executed; correct and retry with the same key) or `database_refused` (the database refused a value for good; nothing was committed)."),
        "503": retryable("`idempotency_store_unavailable`, `upstream_unavailable`, `database_unavailable`, `server_shutting_down` or `unavailable`: nothing ran, or the request stopped at a recovery point; retry with the same key.")
    });
    for (status, description) in extra {
        r[*status] = problem(description);
    }
    r
}

fn read_responses(schema: Value) -> Value {
    json!({
        "200": {"description": "OK", "content": {"application/json": {"schema": schema}}},
        "401": problem("`unauthenticated`."),
        "404": problem("`not_found`."),
        "503": retryable("`unavailable`: the database could not answer; retry later.")
    })
}

/// The document.
pub fn document() -> Value {
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "Oncely reference payments API",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "A reference API built with Oncely. Every POST under /v1 requires an Idempotency-Key (1-255 visible ASCII characters, unique per logical operation; an event-derived key such as `order-confirm-{order_id}` is best). A retry with the same key and the same request replays the stored response with `Idempotent-Replayed: true` for 24 hours. Authentication is a stand-in: `Authorization: Bearer <account>`; the account is the idempotency scope. POST /webhooks/processor receives the card processor's signed Standard Webhooks events, keyed by webhook-id and scoped by the sender."
        },
        "security": [{"bearer": []}],
        "paths": {
            "/v1/payments": {
                "post": {
                    "operationId": "createPayment",
                    "summary": "Create a payment: record it, charge the card, send a receipt.",
                    "parameters": [{"$ref": "#/components/parameters/IdempotencyKey"}],
                    "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/PaymentRequest"}}}},
                    "responses": write_responses("The payment.", "#/components/schemas/Payment", &[("402", "`card_declined`: stored and replayed like a success.")])
                },
                "get": {
                    "operationId": "listPayments",
                    "summary": "The caller's payments.",
                    "responses": read_responses(json!({"type": "object", "properties": {"data": {"type": "array", "items": {"$ref": "#/components/schemas/Payment"}}}}))
                }
            },
            "/v1/payments/{id}": {
                "get": {
                    "operationId": "getPayment",
                    "parameters": [{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}],
                    "responses": read_responses(json!({"$ref": "#/components/schemas/Payment"}))
                }
            },
            "/v1/payments/{id}/events": {
                "get": {
                    "operationId": "listPaymentEvents",
                    "summary": "The webhook events applied to the caller's payment, one row per application.",
                    "parameters": [{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}],
                    "responses": read_responses(json!({"type": "object", "properties": {"data": {"type": "array", "items": {"$ref": "#/components/schemas/AppliedEvent"}}}}))
                }
            },
            "/webhooks/processor": {
                "post": {
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
                        "409": retryable("`idempotency_request_in_flight`: the same event is being applied; the sender retries."),
                        "413": problem("`webhook_body_too_large`."),
                        "422": problem("`idempotency_key_mismatch`: another body under a known event id; never applied."),
                        "503": retryable("`idempotency_store_unavailable`, `database_unavailable`, `server_shutting_down` or `unavailable`: nothing was applied; the sender retries.")
                    }
                }
            },
            "/v1/orders": {
                "post": {
                    "operationId": "createOrder",
                    "summary": "Create an order (one transactional phase).",
                    "parameters": [{"$ref": "#/components/parameters/IdempotencyKey"}],
                    "requestBody": {"required": true, "content": {"application/json": {"schema": {"$ref": "#/components/schemas/OrderRequest"}}}},
                    "responses": write_responses("The order.", "#/components/schemas/Order", &[])
                },
                "get": {
                    "operationId": "listOrders",
                    "responses": read_responses(json!({"type": "object", "properties": {"data": {"type": "array", "items": {"$ref": "#/components/schemas/Order"}}}}))
                }
            },
            "/v1/orders/{id}": {
                "get": {
                    "operationId": "getOrder",
                    "parameters": [{"name": "id", "in": "path", "required": true, "schema": {"type": "string"}}],
                    "responses": read_responses(json!({"$ref": "#/components/schemas/Order"}))
                }
            },
            "/v1/idempotency-keys/{key}": {
                "get": {
                    "operationId": "getIdempotencyKey",
                    "summary": "The state of one of the caller's keys: absent, in_flight or complete, and until when it replays.",
                    "parameters": [{"name": "key", "in": "path", "required": true, "description": "The key as sent in `Idempotency-Key` (unquoted), percent-encoded as one path segment.", "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[!-~]{1,255}$"}}],
                    "responses": {
                        "200": {"description": "The key's state.", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/KeyState"}}}},
                        "400": problem("`idempotency_key_invalid`: the key in the path is not 1 to 255 visible ASCII characters."),
                        "401": problem("`unauthenticated`."),
                        "503": retryable("`unavailable`: the key store could not answer; retry later.")
                    }
                }
            },
            "/metrics": {"get": {"operationId": "metrics", "security": [], "responses": {"200": {"description": "Prometheus text format.", "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
            "/healthz": {"get": {"operationId": "healthz", "security": [], "summary": "Liveness: the process serves HTTP (200 even while the key store is down).", "responses": {"200": {"description": "Alive.", "content": {"text/plain": {"schema": {"type": "string"}}}}}}},
            "/readyz": {"get": {"operationId": "readyz", "security": [], "summary": "Readiness: the key store answers (route traffic here only then).", "responses": {
                "200": {"description": "Ready.", "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Readiness"}}}},
                "503": retryable("`not_ready`: the key store does not answer yet.")
            }}},
            "/openapi.json": {"get": {"operationId": "openapi", "security": [], "responses": {"200": {"description": "This document.", "content": {"application/json": {"schema": {"type": "object"}}}}}}}
        },
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer", "description": "The bearer token is the account id (a stand-in for real authentication)."}},
            "headers": {
                "ShouldRetry": {"description": "`true` when the problem is retryable, `false` otherwise (the convention generated SDKs honour).", "schema": {"type": "string", "enum": ["true", "false"]}},
                "RetryAfter": {"description": "Seconds to wait before retrying the same request.", "schema": {"type": "integer", "minimum": 1}}
            },
            "parameters": {
                "IdempotencyKey": {
                    "name": "Idempotency-Key", "in": "header", "required": true,
                    "description": "1-255 visible ASCII characters; the quoted structured-field form (\"abc\") is accepted. Reuse it on every retry of one logical operation; never reuse it for another.",
                    "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[!-~]{1,255}$"}
                }
            },
            "schemas": {
                "Problem": {
                    "type": "object", "description": "RFC 9457 problem details.",
                    "required": ["type", "title", "status", "code", "retryable"],
                    "properties": {
                        "type": {"type": "string"}, "title": {"type": "string"}, "status": {"type": "integer"},
                        "detail": {"type": "string"}, "code": {"type": "string"}, "retryable": {"type": "boolean"}
                    }
                },
                "PaymentRequest": {
                    "type": "object", "additionalProperties": false, "required": ["amount", "currency", "source"],
                    "properties": {
                        "amount": {"type": "integer", "minimum": 1, "maximum": 99_999_999_999_i64, "description": "Minor units (cents)."},
                        "currency": {"type": "string", "pattern": "^[A-Za-z]{3}$"},
                        "source": {"type": "string", "minLength": 1, "maxLength": 255, "description": "A card token; `tok_decline` is declined."},
                        "description": {"type": ["string", "null"], "maxLength": 1000}
                    }
                },
                "Payment": {
                    "type": "object",
                    "properties": {
                        "id": {"type": "string"}, "amount": {"type": "integer"}, "currency": {"type": "string"},
                        "status": {"type": "string", "enum": ["pending", "succeeded", "declined"]},
                        "charge_id": {"type": ["string", "null"]}, "description": {"type": "string"},
                        "created_at": {"type": "integer", "description": "Epoch milliseconds."}
                    }
                },
                "OrderRequest": {
                    "type": "object", "additionalProperties": false, "required": ["items"],
                    "properties": {"items": {"type": "array", "minItems": 1, "maxItems": 100, "items": {
                        "type": "object", "additionalProperties": false, "required": ["sku", "quantity"],
                        "properties": {"sku": {"type": "string", "minLength": 1, "maxLength": 64}, "quantity": {"type": "integer", "minimum": 1, "maximum": 10000}}
                    }}}
                },
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
                },
                "Order": {"type": "object", "properties": {"id": {"type": "string"}, "items": {"type": "array"}, "created_at": {"type": "integer"}}},
                "InFlight": {
                    "type": "object", "required": ["key", "state", "status_url"],
                    "properties": {"key": {"type": "string"}, "state": {"type": "string", "enum": ["in_flight"]}, "code": {"type": "string"}, "status_url": {"type": "string"}, "detail": {"type": "string"}}
                },
                "Readiness": {"type": "object", "properties": {"status": {"type": "string", "enum": ["ready"]}, "store": {"type": "string"}}},
                "KeyState": {
                    "type": "object",
                    "properties": {
                        "suspended": {"type": "boolean", "description": "In flight but nobody is working on it (stopped at its recovery point, or its owner died): a retry with the same request resumes it at once."},
                        "note": {"type": "string"},
                        "key": {"type": "string"}, "state": {"type": "string", "enum": ["absent", "in_flight", "complete"]},
                        "status": {"type": "integer"}, "completed_at": {"type": "integer"}, "replays_until": {"type": "integer", "description": "Epoch milliseconds."},
                        "lease_expires_at": {"type": "integer"}, "recovery_point": {"type": ["string", "null"]}
                    }
                }
            }
        }
    })
}
