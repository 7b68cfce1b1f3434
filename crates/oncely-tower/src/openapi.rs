//! The layer in an OpenAPI document: a [`utoipa::Modify`] that adds the `Idempotency-Key`
//! header and every answer the layer can give to each state-changing operation, from the live
//! [`Policy`] (the replay window, the status profile, the in-flight behaviour, the size limit,
//! the `Retry-After`), so the document says what the server really does.
//!
//! ```
//! use oncely_core::{Policy, StatusProfile};
//! use oncely_tower::openapi::IdempotencyDoc;
//! use utoipa::Modify as _;
//! use utoipa::openapi::path::{HttpMethod, OperationBuilder, PathItem};
//! use utoipa::openapi::{OpenApiBuilder, PathsBuilder, ResponseBuilder};
//!
//! let op = OperationBuilder::new()
//!     .response("201", ResponseBuilder::new().description("Created."))
//!     .build();
//! let mut doc = OpenApiBuilder::new()
//!     .paths(PathsBuilder::new().path("/v1/payments", PathItem::new(HttpMethod::Post, op)))
//!     .build();
//! let policy = Policy::default().with_profile(StatusProfile::Stripe);
//! IdempotencyDoc::new(&policy).modify(&mut doc);
//!
//! let json = serde_json::to_value(&doc).unwrap();
//! let post = &json["paths"]["/v1/payments"]["post"];
//! assert_eq!(post["parameters"][0]["name"], "Idempotency-Key");
//! assert_eq!(post["parameters"][0]["required"], true);
//! // Stripe's profile answers a reused key with another request 400, not 422.
//! assert!(post["responses"]["400"]["description"].as_str().unwrap().contains("idempotency_key_mismatch"));
//! assert!(post["responses"].get("422").is_none());
//! assert_eq!(post["responses"]["201"]["headers"]["Idempotent-Replayed"]["schema"]["enum"][0], "true");
//! ```
//!
//! # Which operations
//!
//! Every `POST`, `PUT`, `PATCH` and `DELETE` operation, except one marked
//! `x-oncely-unsafe-to-retry: true` (the vendor extension `oncely lint` honours): so a document
//! this modifier has run over has no lint finding by construction. Apply it to a document
//! whose state-changing operations all sit behind the layer.
//!
//! # Merging
//!
//! A status the operation already documents (say its own `400 invalid_json`) keeps its
//! description and content; the layer's codes are appended to the description, and its headers
//! (`Retry-After`, `x-should-retry`) added. A status the operation does not document gets an
//! `application/problem+json` response whose schema is `#/components/schemas/Problem` (added to
//! the components if the document has none by that name).

use oncely_core::{ErrorCode, InFlightBehavior, Policy, X_SHOULD_RETRY};
use std::time::Duration;
use utoipa::openapi::path::{Operation, Parameter, ParameterBuilder, ParameterIn};
use utoipa::openapi::schema::{ObjectBuilder, Schema, Type};
use utoipa::openapi::{
    ContentBuilder, Header, HeaderBuilder, OpenApi, Ref, RefOr, Required, Response, ResponseBuilder,
};

/// The OpenAPI vendor extension that exempts an operation (see the [module docs](self)).
pub const UNSAFE_TO_RETRY_EXTENSION: &str = "x-oncely-unsafe-to-retry";

/// The name of the problem schema the added responses refer to.
pub const PROBLEM_SCHEMA: &str = "Problem";

/// The schema of [`oncely_core::Problem`] under the name [`PROBLEM_SCHEMA`], for a route's own
/// problem responses (`#[utoipa::path(responses((status = 404, body = ProblemSchema,
/// content_type = "application/problem+json")))]`).
#[derive(Debug, Clone, Copy)]
pub struct ProblemSchema;

impl utoipa::PartialSchema for ProblemSchema {
    fn schema() -> RefOr<Schema> {
        RefOr::T(problem_schema())
    }
}

impl utoipa::ToSchema for ProblemSchema {
    fn name() -> std::borrow::Cow<'static, str> {
        PROBLEM_SCHEMA.into()
    }
}

/// A [`utoipa::Modify`] documenting the layer under one [`Policy`] (see the
/// [module docs](self)). Build it from the policy the layer runs with, so the document never
/// drifts from it.
#[derive(Debug, Clone)]
pub struct IdempotencyDoc {
    policy: Policy,
}

impl IdempotencyDoc {
    /// A modifier for a layer running with `policy`.
    pub fn new(policy: &Policy) -> Self {
        Self {
            policy: policy.clone(),
        }
    }

    /// The `Idempotency-Key` header parameter: required, 1 to 255 visible ASCII characters
    /// (draft-ietf-httpapi-idempotency-key-header section 2.1; the quoted structured-field form
    /// is accepted too), with the replay window in its description.
    pub fn key_parameter(&self) -> Parameter {
        ParameterBuilder::new()
            .name("Idempotency-Key")
            .parameter_in(ParameterIn::Header)
            .required(Required::True)
            .description(Some(format!(
                "1-255 visible ASCII characters; the quoted structured-field form (\"abc\") is accepted. \
                 Reuse it on every retry of one logical operation, never for another: a retry with the \
                 same key and the same request replays the stored response (with `Idempotent-Replayed: true`) \
                 for {} after it completed.",
                human(self.policy.replay_window)
            )))
            .schema(Some(
                ObjectBuilder::new()
                    .schema_type(Type::String)
                    .min_length(Some(1))
                    .max_length(Some(255))
                    .pattern(Some("^[!-~]{1,255}$")),
            ))
            .build()
    }

    /// The layer's problem answers as `(status, description, retryable)`, one entry per
    /// status, under this policy.
    pub fn problems(&self) -> Vec<(u16, String, bool)> {
        let p = &self.policy;
        let status = |c: ErrorCode| p.profile.status(c);
        let mut answers: Vec<(u16, String, bool)> = Vec::new();
        let mut add = |status: u16, text: String, retryable: bool| {
            if let Some(a) = answers.iter_mut().find(|a| a.0 == status) {
                a.1.push_str("; ");
                a.1.push_str(&text);
                a.2 |= retryable;
            } else {
                answers.push((status, text, retryable));
            }
        };
        add(
            status(ErrorCode::KeyMissing),
            format!(
                "`{}`, `{}` (not 1-255 visible ASCII characters, or the header repeated), `{}` (a JSON body \
                 that is not I-JSON: a repeated member name or a lone surrogate) or \
                 `{}`: nothing was executed",
                ErrorCode::KeyMissing,
                ErrorCode::KeyInvalid,
                ErrorCode::BodyNotCanonicalizable,
                ErrorCode::RequestBodyUnreadable
            ),
            false,
        );
        add(
            status(ErrorCode::ScopeMissing),
            format!(
                "`{}`: the caller is not authenticated",
                ErrorCode::ScopeMissing
            ),
            false,
        );
        add(
            status(ErrorCode::KeyMismatch),
            format!(
                "`{}`: the key was used with another request; never retry it",
                ErrorCode::KeyMismatch
            ),
            false,
        );
        let in_flight = match p.in_flight {
            InFlightBehavior::Reject => format!(
                "`{}` (retryable after `Retry-After`: another request with this key is running)",
                ErrorCode::RequestInFlight
            ),
            InFlightBehavior::Wait { max, .. } => format!(
                "`{}` (retryable after `Retry-After`: another request with this key still runs after a wait of {})",
                ErrorCode::RequestInFlight,
                human(max)
            ),
            InFlightBehavior::Accepted { .. } => {
                "(in-flight duplicates are answered `202`)".to_owned()
            }
            _ => format!(
                "`{}` (retryable after `Retry-After`)",
                ErrorCode::RequestInFlight
            ),
        };
        add(
            status(ErrorCode::RequestInFlight),
            in_flight,
            !matches!(p.in_flight, InFlightBehavior::Accepted { .. }),
        );
        add(
            status(ErrorCode::ResponseNotRetained),
            format!(
                "`{}`: the request completed but its response (over {} bytes) was not kept; not retried",
                ErrorCode::ResponseNotRetained,
                p.max_response_bytes
            ),
            false,
        );
        add(
            status(ErrorCode::RequestNeedsAttention),
            format!(
                "`{}`: the request was abandoned part-way and the completer gave up on it; it is \
                 marked for a person and never runs again, so do not retry it, not even with a new key",
                ErrorCode::RequestNeedsAttention
            ),
            false,
        );
        add(
            status(ErrorCode::RequestTooLarge),
            format!(
                "`{}`: the body is over {} bytes; nothing was executed",
                ErrorCode::RequestTooLarge,
                p.max_request_bytes
            ),
            false,
        );
        add(
            status(ErrorCode::StoreUnavailable),
            format!(
                "`{}` or `{}`: nothing was executed; retry with the same key after `Retry-After` ({} second(s))",
                ErrorCode::StoreUnavailable,
                ErrorCode::ServerShuttingDown,
                p.retry_after_secs
            ),
            true,
        );
        answers
    }

    fn apply(&self, op: &mut Operation) {
        if op
            .extensions
            .as_ref()
            .and_then(|e| e.get(UNSAFE_TO_RETRY_EXTENSION))
            .and_then(serde_json::Value::as_bool)
            == Some(true)
        {
            return;
        }
        let params = op.parameters.get_or_insert_with(Vec::new);
        if !params.iter().any(|p| {
            p.parameter_in == ParameterIn::Header && p.name.eq_ignore_ascii_case("idempotency-key")
        }) {
            params.insert(0, self.key_parameter());
        }
        let responses = &mut op.responses.responses;
        for (status, response) in responses.iter_mut() {
            if let (true, RefOr::T(r)) = (status.starts_with('2'), response) {
                r.headers
                    .entry("Idempotent-Replayed".to_owned())
                    .or_insert_with(replayed_header);
            }
        }
        if let InFlightBehavior::Accepted { status_url } = self.policy.in_flight {
            responses.entry("202".to_owned()).or_insert_with(|| {
                RefOr::T(accepted_response(
                    status_url,
                    self.policy.profile.status(ErrorCode::RequestInFlight),
                ))
            });
        }
        for (status, text, retryable) in self.problems() {
            let entry = responses
                .entry(status.to_string())
                .or_insert_with(|| RefOr::T(problem_response(String::new())));
            let RefOr::T(r) = entry else { continue };
            if r.description.is_empty() {
                r.description = format!("From the idempotency layer: {text}.");
            } else {
                r.description = format!("{} From the idempotency layer: {text}.", r.description);
            }
            if r.content.is_empty() {
                r.content.insert(
                    oncely_core::problem::PROBLEM_JSON.to_owned(),
                    problem_content(),
                );
            }
            r.headers
                .entry(X_SHOULD_RETRY.to_owned())
                .or_insert_with(should_retry_header);
            if retryable {
                r.headers
                    .entry("Retry-After".to_owned())
                    .or_insert_with(retry_after_header);
            }
        }
    }
}

impl utoipa::Modify for IdempotencyDoc {
    fn modify(&self, openapi: &mut OpenApi) {
        for item in openapi.paths.paths.values_mut() {
            for op in [
                &mut item.post,
                &mut item.put,
                &mut item.patch,
                &mut item.delete,
            ]
            .into_iter()
            .flatten()
            {
                self.apply(op);
            }
        }
        openapi
            .components
            .get_or_insert_with(Default::default)
            .schemas
            .entry(PROBLEM_SCHEMA.to_owned())
            .or_insert_with(|| RefOr::T(problem_schema()));
    }
}

/// `application/problem+json` with the [`PROBLEM_SCHEMA`] schema.
fn problem_content() -> utoipa::openapi::Content {
    ContentBuilder::new()
        .schema(Some(Ref::from_schema_name(PROBLEM_SCHEMA)))
        .build()
}

fn problem_response(description: String) -> Response {
    let mut r = ResponseBuilder::new().description(description).build();
    r.content.insert(
        oncely_core::problem::PROBLEM_JSON.to_owned(),
        problem_content(),
    );
    r
}

fn string_enum(values: &[&str]) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .enum_values(Some(values.iter().copied()))
}

fn replayed_header() -> Header {
    HeaderBuilder::new()
        .schema(string_enum(&["true"]))
        .description(Some(
            "`true` on a replay of the stored response (absent on the first execution).",
        ))
        .build()
}

/// The `x-should-retry` response header ([`X_SHOULD_RETRY`]) of every problem.
pub fn should_retry_header() -> Header {
    HeaderBuilder::new()
        .schema(string_enum(&["true", "false"]))
        .description(Some(
            "`true` when the problem is retryable with the same key, `false` otherwise (the convention generated SDKs honour).",
        ))
        .build()
}

/// The `Retry-After` response header: whole seconds, at least 1.
pub fn retry_after_header() -> Header {
    HeaderBuilder::new()
        .schema(ObjectBuilder::new().schema_type(Type::Integer).minimum(Some(1)))
        .description(Some(
            "Seconds to wait before retrying the same request with the same key (RFC 9110 section 10.2.3).",
        ))
        .build()
}

fn accepted_response(status_url: &str, conflict_status: u16) -> Response {
    let string = || ObjectBuilder::new().schema_type(Type::String);
    let body = ObjectBuilder::new()
        .property("key", string())
        .property("state", string_enum(&["in_flight"]))
        .property("code", string())
        .property("status_url", string())
        .property("detail", string())
        .required("key")
        .required("state")
        .required("status_url");
    ResponseBuilder::new()
        .description(format!(
            "Another request with this key is running (instead of `{conflict_status}`): poll `Location` \
             ({status_url}, the key's state) or retry the same request after `Retry-After`. Not stored."
        ))
        .header(
            "Location",
            HeaderBuilder::new()
                .schema(ObjectBuilder::new().schema_type(Type::String))
                .build(),
        )
        .header("Retry-After", retry_after_header())
        .content(
            "application/json",
            ContentBuilder::new().schema(Some(body)).build(),
        )
        .build()
}

/// RFC 9457 problem details with Oncely's `code` and `retryable` members
/// ([`oncely_core::Problem`]); further extension members (e.g. `errors`) are allowed.
fn problem_schema() -> Schema {
    let string = || ObjectBuilder::new().schema_type(Type::String);
    ObjectBuilder::new()
        .description(Some(
            "RFC 9457 problem details, with the machine-readable `code` and `retryable`.",
        ))
        .property("type", string())
        .property("title", string())
        .property("status", ObjectBuilder::new().schema_type(Type::Integer))
        .property("detail", string())
        .property("code", string())
        .property("retryable", ObjectBuilder::new().schema_type(Type::Boolean))
        .required("type")
        .required("title")
        .required("status")
        .required("code")
        .required("retryable")
        .into()
}

/// `d` in the largest whole unit: "24 hours", "90 seconds", "250 milliseconds".
fn human(d: Duration) -> String {
    let (n, unit) = match (d.as_millis(), d.as_secs()) {
        (ms, _) if ms % 1000 != 0 => (ms as u64, "millisecond"),
        (_, s) if s != 0 && s % 3600 == 0 => (s / 3600, "hour"),
        (_, s) if s != 0 && s % 60 == 0 => (s / 60, "minute"),
        (_, s) => (s, "second"),
    };
    format!("{n} {unit}{}", if n == 1 { "" } else { "s" })
}

#[cfg(test)]
mod tests {
    use super::*;
    use utoipa::Modify as _;
    use utoipa::openapi::path::{HttpMethod, OperationBuilder, PathItem};
    use utoipa::openapi::{OpenApiBuilder, PathsBuilder};

    fn doc_with(item: PathItem, policy: &Policy) -> serde_json::Value {
        let mut doc = OpenApiBuilder::new()
            .paths(PathsBuilder::new().path("/x", item))
            .build();
        IdempotencyDoc::new(policy).modify(&mut doc);
        serde_json::to_value(&doc).unwrap()
    }

    fn created() -> Operation {
        OperationBuilder::new()
            .response("201", ResponseBuilder::new().description("Created."))
            .response("400", ResponseBuilder::new().description("`invalid_json`."))
            .build()
    }

    #[test]
    fn every_layer_answer_is_documented_from_the_policy() {
        let policy = Policy::default()
            .with_replay_window(Duration::from_secs(3600))
            .with_retry_after_secs(2)
            .with_max_request_bytes(4096);
        let doc = doc_with(PathItem::new(HttpMethod::Post, created()), &policy);
        let op = &doc["paths"]["/x"]["post"];
        let key = &op["parameters"][0];
        assert_eq!(
            (&key["name"], &key["in"], &key["required"]),
            (
                &serde_json::json!("Idempotency-Key"),
                &serde_json::json!("header"),
                &serde_json::json!(true)
            )
        );
        assert!(key["description"].as_str().unwrap().contains("for 1 hour"));
        let r = &op["responses"];
        // The route's own 400 is kept, the layer's codes appended.
        let bad = r["400"]["description"].as_str().unwrap();
        assert!(bad.starts_with("`invalid_json`."), "{bad}");
        assert!(bad.contains("idempotency_key_missing"), "{bad}");
        assert!(
            r["422"]["description"]
                .as_str()
                .unwrap()
                .contains("idempotency_key_mismatch")
        );
        assert!(
            r["409"]["description"]
                .as_str()
                .unwrap()
                .contains("idempotency_request_in_flight")
        );
        assert!(r["409"]["headers"]["Retry-After"].is_object());
        assert!(
            r["413"]["description"]
                .as_str()
                .unwrap()
                .contains("4096 bytes")
        );
        assert!(
            r["503"]["description"]
                .as_str()
                .unwrap()
                .contains("(2 second(s))")
        );
        assert_eq!(
            r["503"]["headers"]["x-should-retry"]["schema"]["enum"],
            serde_json::json!(["true", "false"])
        );
        assert!(r["422"]["headers"].get("Retry-After").is_none());
        assert_eq!(
            r["401"]["content"]["application/problem+json"]["schema"]["$ref"],
            "#/components/schemas/Problem"
        );
        assert!(r.get("202").is_none());
        assert_eq!(
            r["201"]["headers"]["Idempotent-Replayed"]["schema"]["enum"][0],
            "true"
        );
        assert!(doc["components"]["schemas"]["Problem"]["required"].is_array());
    }

    #[test]
    fn profiles_and_in_flight_modes_change_the_statuses() {
        let resend = Policy::default()
            .with_profile(oncely_core::StatusProfile::Resend)
            .with_in_flight(InFlightBehavior::Accepted {
                status_url: "/keys/{key}",
            });
        let doc = doc_with(PathItem::new(HttpMethod::Put, created()), &resend);
        let r = &doc["paths"]["/x"]["put"]["responses"];
        assert!(r.get("422").is_none());
        let conflict = r["409"]["description"].as_str().unwrap();
        assert!(conflict.contains("idempotency_key_mismatch"), "{conflict}");
        assert!(conflict.contains("answered `202`"), "{conflict}");
        assert!(
            r["202"]["description"]
                .as_str()
                .unwrap()
                .contains("/keys/{key}")
        );
        assert!(r["202"]["headers"]["Retry-After"].is_object());
    }

    #[test]
    fn reads_and_exempt_operations_are_left_alone() {
        let get = OperationBuilder::new()
            .response("200", ResponseBuilder::new().description("OK."))
            .build();
        let doc = doc_with(PathItem::new(HttpMethod::Get, get), &Policy::default());
        assert!(doc["paths"]["/x"]["get"].get("parameters").is_none());
        let mut exempt = created();
        let mut ext = utoipa::openapi::extensions::Extensions::default();
        ext.insert(
            UNSAFE_TO_RETRY_EXTENSION.to_owned(),
            serde_json::json!(true),
        );
        exempt.extensions = Some(ext);
        let doc = doc_with(PathItem::new(HttpMethod::Post, exempt), &Policy::default());
        assert!(doc["paths"]["/x"]["post"].get("parameters").is_none());
        assert!(doc["paths"]["/x"]["post"]["responses"].get("409").is_none());
    }

    #[test]
    fn durations_read_in_their_largest_unit() {
        assert_eq!(human(Duration::from_secs(86_400)), "24 hours");
        assert_eq!(human(Duration::from_secs(60)), "1 minute");
        assert_eq!(human(Duration::from_secs(90)), "90 seconds");
        assert_eq!(human(Duration::from_millis(1500)), "1500 milliseconds");
    }
}
