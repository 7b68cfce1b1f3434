//! Reading a small error body for problem+json (RFC 9457) fields, bounded in size and time, and
//! handing an equivalent response back with the same bytes.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::{Body as HttpBody, Frame};
use reqwest::{Response, ResponseBuilderExt};

use crate::classify::ProblemFacts;
use crate::error::BoxError;

/// Largest problem+json body read for classification, in bytes (64 KiB).
pub const MAX_PROBLEM_BODY: u64 = 64 * 1024;

fn is_json(headers: &http::HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.to_ascii_lowercase().contains("json"))
}

/// A response body rebuilt after inspection: the bytes already read, then the rest of the
/// original body (or the error that broke it).
struct Replayed {
    prefix: Option<Bytes>,
    rest: Rest,
}

enum Rest {
    Body(reqwest::Body),
    Failed(Option<BoxError>),
}

impl HttpBody for Replayed {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(prefix) = this.prefix.take()
            && !prefix.is_empty()
        {
            return Poll::Ready(Some(Ok(Frame::data(prefix))));
        }
        match &mut this.rest {
            Rest::Body(body) => Pin::new(body)
                .poll_frame(cx)
                .map(|f| f.map(|r| r.map_err(|e| Box::new(e) as BoxError))),
            Rest::Failed(error) => Poll::Ready(error.take().map(Err)),
        }
    }
}

/// How reading a body for classification ended.
enum BodyRead {
    Complete,
    TooLarge,
    Failed(reqwest::Error),
    TimedOut,
}

/// Reads a small JSON error body (bounded to [`MAX_PROBLEM_BODY`] bytes and `limit` of time) to
/// look for problem+json fields, then rebuilds an equivalent response (status, version,
/// headers, URL and the same body bytes, followed by whatever was not read).
///
/// Never fails: a body that breaks, stalls or is too large is logged and yields no problem.
pub(super) async fn inspect_problem(
    mut response: Response,
    limit: Duration,
) -> (Response, Option<ProblemFacts>) {
    let declared_small = response
        .content_length()
        .is_none_or(|n| n <= MAX_PROBLEM_BODY);
    if !declared_small || !is_json(response.headers()) {
        return (response, None);
    }
    let status = response.status();
    let version = response.version();
    let url = response.url().clone();
    let headers = response.headers().clone();
    let mut buf = BytesMut::new();
    let read = tokio::time::timeout(limit, async {
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    buf.extend_from_slice(&chunk);
                    if buf.len() as u64 > MAX_PROBLEM_BODY {
                        return BodyRead::TooLarge;
                    }
                }
                Ok(None) => return BodyRead::Complete,
                Err(e) => return BodyRead::Failed(e),
            }
        }
    })
    .await
    .unwrap_or(BodyRead::TimedOut);
    let read_bytes = buf.len();
    let prefix = buf.freeze();
    let (problem, body) = match read {
        BodyRead::Complete => (
            ProblemFacts::from_json(&prefix),
            reqwest::Body::from(prefix),
        ),
        BodyRead::TooLarge => {
            tracing::debug!(
                status = status.as_u16(),
                "oncely: error body over 64 KiB, not inspected"
            );
            let rest = Rest::Body(reqwest::Body::from(response));
            (
                None,
                reqwest::Body::wrap(Replayed {
                    prefix: Some(prefix),
                    rest,
                }),
            )
        }
        BodyRead::Failed(e) => {
            tracing::warn!(
                status = status.as_u16(),
                read_bytes,
                error = %e,
                "oncely: reading the error body failed; the status decides"
            );
            let rest = Rest::Failed(Some(Box::new(e)));
            (
                None,
                reqwest::Body::wrap(Replayed {
                    prefix: Some(prefix),
                    rest,
                }),
            )
        }
        BodyRead::TimedOut => {
            tracing::warn!(
                status = status.as_u16(),
                read_bytes,
                limit_ms = limit.as_millis() as u64,
                "oncely: the error body did not arrive in time; the status decides"
            );
            let rest = Rest::Body(reqwest::Body::from(response));
            (
                None,
                reqwest::Body::wrap(Replayed {
                    prefix: Some(prefix),
                    rest,
                }),
            )
        }
    };
    let mut rebuilt = http::Response::new(body);
    *rebuilt.status_mut() = status;
    *rebuilt.version_mut() = version;
    *rebuilt.headers_mut() = headers;
    let rebuilt = match http::Response::builder().url(url).body(()) {
        Ok(with_url) => {
            rebuilt
                .extensions_mut()
                .extend(with_url.into_parts().0.extensions);
            rebuilt
        }
        Err(_) => rebuilt,
    };
    (Response::from(rebuilt), problem)
}
