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
/// Parses a JSON body; a `400 invalid_json` problem otherwise.
pub fn parse_json<T: for<'de> Deserialize<'de>>(body: &Bytes) -> Result<T, Response> {
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
