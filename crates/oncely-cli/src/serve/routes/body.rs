//! The write routes' request bodies: JSON only (`415` otherwise), parsed with errors in the
//! API's terms (`400`), field errors collected into one `422`. Every refusal happens before any
//! effect, so the key is released ([`not_executed`]).

use crate::serve::problems::not_executed;
use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::Response;
use serde::Deserialize;
use serde_json::{Value, json};

/// Write bodies are JSON: anything else is refused before any effect (`415`).
#[allow(clippy::result_large_err)]
pub fn require_json(headers: &HeaderMap) -> Result<(), Response> {
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
                "send the body as JSON with Content-Type: application/json ({})",
                if essence.is_empty() {
                    "no Content-Type was sent".to_owned()
                } else {
                    format!("got {essence:?}")
                }
            ),
            json!({}),
        ))
    }
}

// axum's idiom: the rejection is the response itself.
#[allow(clippy::result_large_err)]
/// Parses a JSON object body; a `400 invalid_json` problem otherwise (also for valid JSON
/// that is not an object: serde would read an array into a struct, field by field).
pub fn parse_json<T: for<'de> Deserialize<'de>>(body: &Bytes) -> Result<T, Response> {
    let first = body.iter().find(|b| !b" \t\r\n".contains(b));
    if first.is_some_and(|b| *b != b'{')
        && serde_json::from_slice::<serde::de::IgnoredAny>(body).is_ok()
    {
        return Err(not_executed(
            StatusCode::BAD_REQUEST,
            "invalid_json",
            "the body must be a JSON object with the documented fields (see /openapi.json)",
            json!({}),
        ));
    }
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

/// `422 validation_failed` with the invalid fields (`errors`: `{"field", "detail"}` objects).
pub fn invalid(errors: Vec<Value>) -> Response {
    not_executed(
        StatusCode::UNPROCESSABLE_ENTITY,
        "validation_failed",
        "the request has invalid fields; nothing was executed, correct it and retry with the same key",
        json!({ "errors": errors }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    struct Payment {
        #[allow(dead_code)]
        amount: i64,
    }

    fn code(r: Result<Payment, Response>) -> StatusCode {
        r.map_or_else(|resp| resp.status(), |_| StatusCode::OK)
    }

    #[test]
    fn only_an_object_is_a_body() {
        // serde reads a sequence into a struct field by field: `[1999]` would be a payment.
        assert_eq!(
            code(parse_json(&Bytes::from_static(b" [1999]"))),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            code(parse_json(&Bytes::from_static(b"1999"))),
            StatusCode::BAD_REQUEST
        );
        assert_eq!(
            code(parse_json(&Bytes::from_static(b"\n{\"amount\": 1999}"))),
            StatusCode::OK
        );
        // Not JSON at all: the syntax error is still what is reported.
        assert_eq!(
            code(parse_json(&Bytes::from_static(b"[1999"))),
            StatusCode::BAD_REQUEST
        );
    }
}
