//! Response capture and replay (feature `http`): what of an HTTP response is stored, and how it
//! comes back. The layer (`oncely-tower`) and the transactional handlers (`oncely-sqlx`) both
//! store responses through this one module, so the two cannot differ.
//!
//! # What is stored
//!
//! The status, the headers that describe the representation, the body bytes and the trailers
//! (gRPC's `grpc-status`, `grpc-message` and `grpc-status-details-bin` travel there), so that
//! the replay is indistinguishable from the original on the wire. The allowlist is every
//! end-to-end header; a fixed denylist always drops:
//!
//! - credentials and session state: `Set-Cookie`, `Authorization`, `Proxy-Authorization`,
//!   `Proxy-Authenticate` (a replay must never hand one caller's session to a retry, and
//!   `Set-Cookie` is per-response state, RFC 6265);
//! - hop-by-hop headers (RFC 9110 section 7.6.1): `Connection` and every header it names,
//!   `Keep-Alive`, `Proxy-Connection`, `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`;
//! - headers the server recomputes for every message: `Content-Length` (from the replayed body)
//!   and `Date` (the time of the replay, RFC 9110 section 6.6.1);
//! - `Idempotent-Replayed` itself (the layer adds it to every replay).
//!
//! Multi-valued headers are kept as repeated entries, in the order they were sent. Trailers go
//! through the same filter and come back, in order, as the replay's trailers.
//!
//! # Size limit and streaming bodies
//!
//! The layer reads the response body up to `Policy::max_response_bytes`. A body that fits is
//! stored and replayed byte for byte; the first caller gets the same bytes (and trailers).
//! A body over the limit, whether one large buffer or a long stream, is still delivered whole
//! to the first caller (the captured prefix, then the rest of the stream as it comes), and the
//! record is completed with its status and headers but `body_retained: false`. A later replay
//! of such a record answers `409 idempotency_response_not_retained` (not retryable, with
//! `Idempotent-Replayed: true` and a detail naming the original status): never an empty or
//! partial body presented as the original, and never a second execution (docs/DESIGN.md, "Streaming
//! responses"). A body stream that fails while being captured is treated the same way: the first
//! caller gets the bytes read and then the error, the record is completed as not retained.
//!
//! Note the cost of capture: a response under the limit reaches the first caller only once its
//! whole body was produced. Routes that stream long-lived responses (server-sent events)
//! should not be idempotent routes.

use crate::StoredResponse;
use bytes::{Bytes, BytesMut};
use http::header::{CONNECTION, HeaderMap, HeaderName, HeaderValue};
use http::{Response, StatusCode};
use http_body::{Frame, SizeHint};
use http_body_util::{BodyExt, Full};
use std::pin::Pin;
use std::task::{Context, Poll};

/// The body type of captured and replayed responses: a boxed body of [`Bytes`] chunks (what
/// `oncely-tower` hands its inner service and answers with; axum accepts it both ways).
pub type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

/// A type-erased error, as tower and axum use.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The response header on every replay: `Idempotent-Replayed: true` (lower case, as
/// `http::HeaderName` wants it).
pub const IDEMPOTENT_REPLAYED: &str = "idempotent-replayed";

/// Headers never stored for replay (lower case). See the module docs for why.
pub const DENIED_RESPONSE_HEADERS: &[&str] = &[
    "set-cookie",
    "authorization",
    "proxy-authorization",
    "proxy-authenticate",
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "content-length",
    "date",
    IDEMPOTENT_REPLAYED,
];

/// Builds the [`StoredResponse`] the layer stores for a response: `status`, the headers that
/// pass the filter described in the [module docs](self) (multi-valued headers kept in order),
/// and `body` (with `body_retained: true`).
///
/// ```
/// use http::{HeaderMap, StatusCode};
/// let mut h = HeaderMap::new();
/// h.append("x-a", "1".parse().unwrap());
/// h.append("set-cookie", "s=1".parse().unwrap());
/// h.append("x-a", "2".parse().unwrap());
/// let s = oncely_core::response::stored_response(StatusCode::CREATED, &h, b"{}");
/// assert_eq!(s.status, 201);
/// assert_eq!(s.headers, vec![("x-a".to_owned(), b"1".to_vec()), ("x-a".to_owned(), b"2".to_vec())]);
/// assert!(s.body_retained);
/// ```
pub fn stored_response(status: StatusCode, headers: &HeaderMap, body: &[u8]) -> StoredResponse {
    StoredResponse::new(status.as_u16(), filter_headers(headers), body.to_vec())
}

/// Reads `response`'s body up to `limit` bytes and returns the response to send (every byte,
/// trailer and error of the original, by the rules in the [module docs](self)), the
/// [`StoredResponse`] to store for it (the status and filtered headers of what is sent, and the
/// body when it fit, else `body_retained: false`, never a partial body), and whether the body
/// stream **failed** while it was read (then the body was not retained either, and a caller
/// that can still back out, such as a transaction that has not committed, should).
///
/// This is what the layer stores for a claimed request, and what a transactional handler
/// stores when it completes its record in its own transaction, so the two cannot differ.
pub async fn capture_response(
    response: Response<Body>,
    limit: usize,
) -> (Response<Body>, StoredResponse, bool) {
    let (parts, body) = response.into_parts();
    let captured = capture(body, limit).await;
    let failed = matches!(captured, Captured::Failed { .. });
    let stored = match &captured {
        Captured::Complete { data, trailers } => {
            stored_response(parts.status, &parts.headers, data)
                .with_trailers(trailers.as_ref().map(filter_headers).unwrap_or_default())
        }
        Captured::Overflow { .. } | Captured::Failed { .. } => StoredResponse::new(
            parts.status.as_u16(),
            filter_headers(&parts.headers),
            Vec::new(),
        )
        .with_body_retained(false),
    };
    (
        Response::from_parts(parts, captured.into_body()),
        stored,
        failed,
    )
}

/// The headers of `headers` that are stored, as `(lower-case name, value)` pairs in order
/// (the denylist of [`DENIED_RESPONSE_HEADERS`] and the headers `Connection` names left out).
pub fn filter_headers(headers: &HeaderMap) -> Vec<(String, Vec<u8>)> {
    // Headers the `Connection` header nominates are hop-by-hop too (RFC 9110 section 7.6.1).
    let nominated: Vec<String> = headers
        .get_all(CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim().to_ascii_lowercase())
        .filter(|t| !t.is_empty())
        .collect();
    // `HeaderMap::iter` yields every value of a name together, in insertion order.
    headers
        .iter()
        .filter(|(name, _)| {
            let n = name.as_str();
            !DENIED_RESPONSE_HEADERS.contains(&n) && !nominated.iter().any(|t| t == n)
        })
        .map(|(name, value)| (name.as_str().to_owned(), value.as_bytes().to_vec()))
        .collect()
}

/// The response a replay of `stored` sends: its status, headers, body and trailers verbatim,
/// plus `Idempotent-Replayed: true`. The caller must check `body_retained` first.
/// The response that replays `stored`: its status, headers, body and trailers, plus
/// `Idempotent-Replayed: true`.
pub fn replay_response(stored: &StoredResponse) -> Response<Body> {
    let body = if stored.trailers.is_empty() {
        Full::new(Bytes::from(stored.body.clone()))
            .map_err(|never| match never {})
            .boxed_unsync()
    } else {
        Body::new(CapturedBody {
            prefix: Some(Bytes::from(stored.body.clone())),
            rest: None,
            error: None,
            trailers: Some(header_map(&stored.trailers)),
        })
    };
    let mut res = Response::new(body);
    *res.status_mut() = StatusCode::from_u16(stored.status).unwrap_or(StatusCode::OK);
    let headers = res.headers_mut();
    *headers = header_map(&stored.headers);
    headers.insert(
        HeaderName::from_static(IDEMPOTENT_REPLAYED),
        HeaderValue::from_static("true"),
    );
    res
}

/// Stored `(name, value)` pairs as a header map, in order. A stored header that no longer parses
/// (a corrupt record) is skipped, not fatal.
fn header_map(pairs: &[(String, Vec<u8>)]) -> HeaderMap {
    let mut map = HeaderMap::with_capacity(pairs.len());
    for (name, value) in pairs {
        if let (Ok(n), Ok(v)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_bytes(value),
        ) {
            map.append(n, v);
        }
    }
    map
}

/// The result of reading a response body up to the limit.
pub(crate) enum Captured {
    /// The whole body fit: its bytes and trailers.
    Complete {
        data: Bytes,
        trailers: Option<HeaderMap>,
    },
    /// The body went over the limit: the bytes read so far, and the rest of the stream.
    Overflow { prefix: Bytes, rest: Body },
    /// The body stream failed after `prefix`.
    Failed { prefix: Bytes, error: BoxError },
}

impl Captured {
    /// The body to hand the first caller: every byte (and trailer, and error) of the original.
    pub(crate) fn into_body(self) -> Body {
        let b = match self {
            Self::Complete { data, trailers } => CapturedBody {
                prefix: Some(data),
                rest: None,
                error: None,
                trailers,
            },
            Self::Overflow { prefix, rest } => CapturedBody {
                prefix: Some(prefix),
                rest: Some(rest),
                error: None,
                trailers: None,
            },
            Self::Failed { prefix, error } => CapturedBody {
                prefix: Some(prefix),
                rest: None,
                error: Some(error),
                trailers: None,
            },
        };
        Body::new(b)
    }
}

/// Reads `body` until it ends or holds more than `limit` bytes.
pub(crate) async fn capture(mut body: Body, limit: usize) -> Captured {
    let mut buf = BytesMut::new();
    let mut trailers: Option<HeaderMap> = None;
    loop {
        match body.frame().await {
            None => {
                return Captured::Complete {
                    data: buf.freeze(),
                    trailers,
                };
            }
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => {
                    // A body that is one data frame (a handler's buffered response, the usual
                    // case) is kept as it is, without copying it into `buf`.
                    if buf.is_empty()
                        && trailers.is_none()
                        && data.len() <= limit
                        && http_body::Body::is_end_stream(&body)
                    {
                        return Captured::Complete {
                            data,
                            trailers: None,
                        };
                    }
                    buf.extend_from_slice(&data);
                    if buf.len() > limit {
                        return Captured::Overflow {
                            prefix: buf.freeze(),
                            rest: body,
                        };
                    }
                }
                Err(frame) => {
                    if let Ok(t) = frame.into_trailers() {
                        match &mut trailers {
                            Some(existing) => existing.extend(t),
                            None => trailers = Some(t),
                        }
                    }
                }
            },
            Some(Err(error)) => {
                return Captured::Failed {
                    prefix: buf.freeze(),
                    error,
                };
            }
        }
    }
}

/// A body that yields a captured prefix, then the rest of the original stream (or its error),
/// then its trailers.
struct CapturedBody {
    prefix: Option<Bytes>,
    rest: Option<Body>,
    error: Option<BoxError>,
    trailers: Option<HeaderMap>,
}

impl http_body::Body for CapturedBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = &mut *self;
        if let Some(p) = this.prefix.take()
            && !p.is_empty()
        {
            return Poll::Ready(Some(Ok(Frame::data(p))));
        }
        if let Some(rest) = &mut this.rest {
            match Pin::new(rest).poll_frame(cx) {
                Poll::Ready(None) => this.rest = None,
                other => return other,
            }
        }
        if let Some(e) = this.error.take() {
            return Poll::Ready(Some(Err(e)));
        }
        if let Some(t) = this.trailers.take() {
            return Poll::Ready(Some(Ok(Frame::trailers(t))));
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.prefix.as_ref().is_none_or(Bytes::is_empty)
            && self.rest.is_none()
            && self.error.is_none()
            && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        let prefix = self.prefix.as_ref().map_or(0, |p| p.len() as u64);
        match &self.rest {
            // Exact when the whole body was captured, so the server can send Content-Length,
            // just as it would have for the original body.
            None => SizeHint::with_exact(prefix),
            Some(rest) => {
                let h = rest.size_hint();
                let mut out = SizeHint::new();
                out.set_lower(h.lower().saturating_add(prefix));
                if let Some(u) = h.upper() {
                    out.set_upper(u.saturating_add(prefix));
                }
                out
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::SET_COOKIE;

    fn body_of(chunks: Vec<&'static [u8]>) -> Body {
        let stream = futures::stream::iter(
            chunks
                .into_iter()
                .map(|c| Ok::<_, BoxError>(Frame::data(Bytes::from_static(c)))),
        );
        Body::new(http_body_util::StreamBody::new(stream))
    }

    #[test]
    fn filter_drops_the_denylist_and_connection_nominated_headers() {
        let mut h = HeaderMap::new();
        for (n, v) in [
            ("content-type", "application/json"),
            ("set-cookie", "a=1"),
            ("x-multi", "1"),
            ("connection", "x-hop, keep-alive"),
            ("x-hop", "h"),
            ("transfer-encoding", "chunked"),
            ("content-length", "2"),
            ("date", "Mon, 30 Nov 2026 00:00:00 GMT"),
            ("authorization", "Bearer t"),
            ("idempotent-replayed", "true"),
            ("location", "/v1/x/1"),
            ("x-multi", "2"),
        ] {
            h.append(HeaderName::from_static(n), HeaderValue::from_static(v));
        }
        h.append(SET_COOKIE, HeaderValue::from_static("b=2"));
        let got = filter_headers(&h);
        let names: Vec<(&str, &[u8])> = got
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_slice()))
            .collect();
        assert_eq!(
            names,
            vec![
                ("content-type", &b"application/json"[..]),
                ("x-multi", b"1"),
                ("x-multi", b"2"),
                ("location", b"/v1/x/1"),
            ]
        );
    }

    #[tokio::test]
    async fn capture_under_the_limit_is_complete_and_exact() {
        let c = capture(body_of(vec![b"ab", b"cd", b"ef"]), 6).await;
        let Captured::Complete { data, .. } = &c else {
            panic!("expected complete")
        };
        assert_eq!(&data[..], b"abcdef");
        let body = c.into_body();
        assert_eq!(http_body::Body::size_hint(&body).exact(), Some(6));
        assert_eq!(&body.collect().await.unwrap().to_bytes()[..], b"abcdef");
    }

    #[tokio::test]
    async fn a_one_frame_body_is_captured_without_a_copy() {
        let sent = Bytes::from(b"{\"id\":1}".to_vec());
        let c = capture(
            Body::new(Full::new(sent.clone()).map_err(|n| match n {})),
            64,
        )
        .await;
        let Captured::Complete { data, trailers } = &c else {
            panic!("expected complete")
        };
        assert_eq!(data.as_ptr(), sent.as_ptr(), "the frame's own bytes");
        assert_eq!(&data[..], b"{\"id\":1}");
        assert!(trailers.is_none());
        assert_eq!(
            &c.into_body().collect().await.unwrap().to_bytes()[..],
            &sent[..]
        );
        // Over the limit, the one frame is still an overflow.
        let c = capture(
            Body::new(Full::new(sent.clone()).map_err(|n| match n {})),
            3,
        )
        .await;
        assert!(matches!(c, Captured::Overflow { .. }));
        assert_eq!(
            &c.into_body().collect().await.unwrap().to_bytes()[..],
            &sent[..]
        );
    }

    #[tokio::test]
    async fn capture_over_the_limit_keeps_every_byte_for_the_first_caller() {
        let c = capture(body_of(vec![b"ab", b"cd", b"ef"]), 3).await;
        let Captured::Overflow { prefix, .. } = &c else {
            panic!("expected overflow")
        };
        assert_eq!(&prefix[..], b"abcd");
        let bytes = c.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&bytes[..], b"abcdef");
    }

    #[test]
    fn replay_adds_the_replayed_header_and_keeps_order() {
        let s = StoredResponse::new(
            201,
            vec![("x-m".into(), b"1".to_vec()), ("x-m".into(), b"2".to_vec())],
            b"{}".to_vec(),
        );
        let r = replay_response(&s);
        assert_eq!(r.status(), 201);
        let vals: Vec<_> = r.headers().get_all("x-m").iter().collect();
        assert_eq!(vals, vec!["1", "2"]);
        assert_eq!(r.headers()[IDEMPOTENT_REPLAYED], "true");
    }

    #[tokio::test]
    async fn trailers_are_captured_and_replayed_in_order() {
        let mut t = HeaderMap::new();
        t.append("grpc-status", HeaderValue::from_static("3"));
        t.append("grpc-message", HeaderValue::from_static("bad%20id"));
        t.append("x-t", HeaderValue::from_static("1"));
        t.append("x-t", HeaderValue::from_static("2"));
        let frames = vec![
            Ok::<_, BoxError>(Frame::data(Bytes::from_static(b"\0\0\0\0\x01a"))),
            Ok(Frame::trailers(t.clone())),
        ];
        let body = Body::new(http_body_util::StreamBody::new(futures::stream::iter(
            frames,
        )));
        let (sent, stored, failed) = capture_response(Response::new(body), 1024).await;
        assert!(!failed);
        let want: Vec<(String, Vec<u8>)> = [
            ("grpc-status", "3"),
            ("grpc-message", "bad%20id"),
            ("x-t", "1"),
            ("x-t", "2"),
        ]
        .iter()
        .map(|(n, v)| ((*n).to_owned(), v.as_bytes().to_vec()))
        .collect();
        assert_eq!(stored.trailers, want);
        // The first caller gets the trailers too.
        let first = sent.into_body().collect().await.unwrap();
        assert_eq!(first.trailers(), Some(&t));
        // And so does the replay, after the same bytes.
        let replay = replay_response(&stored)
            .into_body()
            .collect()
            .await
            .unwrap();
        assert_eq!(replay.trailers(), Some(&t));
        assert_eq!(&replay.to_bytes()[..], b"\0\0\0\0\x01a");
    }
}
