//! The first step of a keyed request, before any claim: the key, the scope, the buffered body,
//! the fingerprint and the stored request, or the answer that refuses it (nothing runs).

use super::answers::key_refused;
use crate::body::full_body;
use crate::config::Config;
use crate::dialect::code_response;
use crate::key_source::BodyKeyError;
use crate::metrics::Counter;
use bytes::Bytes;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, HeaderValue};
use http::{Request, Response, Uri};
use http_body_util::{BodyExt, LengthLimitError, Limited};
use oncely_core::fingerprint::{FingerprintError, RequestParts};
use oncely_core::response::{Body, BoxError};
use oncely_core::{ErrorCode, Fingerprint, KeyError, Problem, RecordKey, StoredRequest};

/// What the layer does with a request, once it has looked at it.
pub(super) enum Prepared<B> {
    /// Not the layer's: the route ignores keys, or it is optional and none was sent.
    PassThrough(Request<B>),
    /// The same, found once the body was read (a key source in the body, absent on an optional
    /// route): the buffered body goes on.
    PassThroughRead(Request<Body>),
    /// Refused before any claim (a missing or invalid key, no scope, a body too large, not
    /// I-JSON): nothing runs.
    Answer(Response<Body>),
    /// Ready for its claim.
    Keyed(Keyed),
}

/// A keyed request, ready for its claim.
pub(super) struct Keyed {
    pub(super) parts: http::request::Parts,
    pub(super) body: Bytes,
    pub(super) id: RecordKey,
    pub(super) fingerprint: Fingerprint,
    pub(super) request: StoredRequest,
}

/// Looks at `req` (see [`Prepared`]): the key from its source, the scope, the body buffered up
/// to `Policy::max_request_bytes`, the fingerprint of the bytes received (never credentials: the
/// configured fingerprint headers exclude them, see `with_fingerprint_headers`).
pub(super) async fn prepare<B>(config: &Config, req: Request<B>) -> Prepared<B>
where
    B: http_body::Body + Send + 'static,
    B::Error: Into<BoxError>,
{
    let policy = &config.policy;
    let uri = original_uri(&req).clone();
    let requirement = config.key_rule.requirement(req.method(), uri.path());
    if requirement == crate::KeyRequirement::Ignored {
        return Prepared::PassThrough(req);
    }
    config.keeper.ensure(config.store_timeout);
    // A header source is read before anything else; a body source once the body is in.
    let header_key = config.key_source.key_in_headers(req.headers());
    let key = match header_key {
        None => None,
        Some(Ok(k)) => Some(k),
        Some(Err(KeyError::Missing)) if requirement == crate::KeyRequirement::Optional => {
            return Prepared::PassThrough(req);
        }
        Some(Err(e)) => {
            return Prepared::Answer(key_refused(config, req.method(), uri.path(), &e));
        }
    };
    let (parts, body) = req.into_parts();
    let Some(scope) = config.scope.scope(&parts) else {
        return Prepared::Answer(code_response(
            &*config.dialect,
            ErrorCode::ScopeMissing,
            policy.profile,
            "the caller is not authenticated, so the idempotency key cannot be scoped",
            policy.retry_after_secs,
        ));
    };
    let body = match read_body(config, &parts.headers, body).await {
        Ok(b) => b,
        Err(res) => return Prepared::Answer(res),
    };
    let key = match key {
        Some(k) => k,
        None => match config.key_source.key_in_body(&body) {
            Ok(k) => k,
            Err(BodyKeyError::Key(KeyError::Missing))
                if requirement == crate::KeyRequirement::Optional =>
            {
                return Prepared::PassThroughRead(Request::from_parts(parts, full_body(body)));
            }
            Err(BodyKeyError::Key(e)) => {
                return Prepared::Answer(key_refused(config, &parts.method, uri.path(), &e));
            }
            Err(BodyKeyError::NotAString(kind)) => {
                config.metrics.inc(Counter::key_invalid);
                return Prepared::Answer(code_response(
                    &*config.dialect,
                    ErrorCode::KeyInvalid,
                    policy.profile,
                    format!(
                        "{} is {kind}; a key is a string of 1 to 255 visible ASCII characters",
                        config.key_source
                    ),
                    policy.retry_after_secs,
                ));
            }
            Err(BodyKeyError::NotIJson(why)) => {
                config.metrics.inc(Counter::body_not_canonicalizable);
                return Prepared::Answer(code_response(
                    &*config.dialect,
                    ErrorCode::BodyNotCanonicalizable,
                    policy.profile,
                    format!(
                        "the request body is not I-JSON ({why}), so {} cannot be read unambiguously; nothing was executed",
                        config.key_source
                    ),
                    policy.retry_after_secs,
                ));
            }
        },
    };

    // The fingerprint and the stored request, from the bytes received (never credentials:
    // the configured headers exclude them, see `with_fingerprint_headers`).
    let content_type = parts.headers.get(CONTENT_TYPE).map(HeaderValue::as_bytes);
    let extra: Vec<(&str, Vec<&[u8]>)> = config
        .fingerprint_headers
        .iter()
        .map(|n| {
            let values = parts
                .headers
                .get_all(n)
                .iter()
                .map(HeaderValue::as_bytes)
                .collect();
            (n.as_str(), values)
        })
        .collect();
    let request_parts = RequestParts::new(parts.method.as_str(), uri.path(), &body)
        .with_query(uri.query())
        .with_content_type(content_type)
        .with_extra_headers(&extra);
    let fingerprint = match config.fingerprinter.try_fingerprint(&request_parts) {
        Ok(f) => f,
        Err(e) => {
            // Refused before any claim: a body with no canonical form could be matched with
            // (and replay) the record of a request that its handler would read differently.
            config.metrics.inc(Counter::body_not_canonicalizable);
            let e: FingerprintError = e;
            return Prepared::Answer(code_response(
                &*config.dialect,
                ErrorCode::BodyNotCanonicalizable,
                policy.profile,
                format!(
                    "{e}, so it cannot be compared with an earlier request; nothing was executed. Send it without the repeated member name or lone surrogate"
                ),
                policy.retry_after_secs,
            ));
        }
    };
    let mut stored_headers = Vec::new();
    if let Some(ct) = content_type {
        stored_headers.push((CONTENT_TYPE.as_str().to_owned(), ct.to_vec()));
    }
    for (name, values) in &extra {
        for v in values {
            stored_headers.push(((*name).to_owned(), v.to_vec()));
        }
    }
    let stored_request = StoredRequest::new(
        parts.method.as_str(),
        uri.path_and_query()
            .map_or_else(|| uri.path().to_owned(), |pq| pq.as_str().to_owned()),
        stored_headers,
        body.to_vec(),
    );
    drop(extra);

    Prepared::Keyed(Keyed {
        parts,
        body,
        id: RecordKey::new(scope, key),
        fingerprint,
        request: stored_request,
    })
}

async fn read_body<B>(
    config: &Config,
    headers: &http::HeaderMap,
    body: B,
) -> Result<Bytes, Response<Body>>
where
    B: http_body::Body + Send + 'static,
    B::Error: Into<BoxError>,
{
    let max = config.policy.max_request_bytes;
    let too_large = || {
        tracing::info!(
            max_request_bytes = max,
            "refused a request body over Policy::max_request_bytes (413)"
        );
        code_response(
            &*config.dialect,
            ErrorCode::RequestTooLarge,
            config.policy.profile,
            format!(
                "the request body is larger than {max} bytes, the most this route accepts; nothing was executed"
            ),
            config.policy.retry_after_secs,
        )
    };
    // A declared length over the limit is refused before reading a byte.
    let declared = headers
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > max as u64) {
        return Err(too_large());
    }
    match Limited::new(body, max).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.downcast_ref::<LengthLimitError>().is_some() => Err(too_large()),
        Err(e) => {
            tracing::debug!(error = %e, "could not read the request body");
            let p = Problem::from_code(
                ErrorCode::RequestBodyUnreadable,
                "the request body could not be read completely; nothing was executed",
            );
            Err(config.dialect.render(&p))
        }
    }
}

/// The URI as the client sent it: under axum, a nested router's request still carries its
/// prefix in `OriginalUri`, and two routes must never share records by sharing a suffix.
fn original_uri<B>(req: &Request<B>) -> &Uri {
    #[cfg(feature = "axum")]
    if let Some(axum::extract::OriginalUri(uri)) = req.extensions().get() {
        return uri;
    }
    req.uri()
}
