//! Which request headers the client-bypass check sends: a fixed list of the replay and cache
//! headers some middlewares trust, and the names the server itself announces in its answers.

use crate::audit::probe::Exchange;
use http::{HeaderName, HeaderValue};

/// The request headers some middlewares trust, whatever the server: replay markers (a client,
/// or a proxy passing the header through, claims "this is a replay") and cache directives
/// (RFC 9111 section 5.2.1.4 `no-cache`, and the legacy `Pragma`), which an idempotency cache
/// must not honour.
const FIXED: [(&str, &str); 7] = [
    ("idempotent-replayed", "true"),
    ("idempotency-replayed", "true"),
    ("x-idempotent-replayed", "true"),
    ("x-idempotency-replayed", "true"),
    ("x-idempotency-replay", "true"),
    ("cache-control", "no-cache"),
    ("pragma", "no-cache"),
];

/// The most headers learned from the server's answers in one round: 4. With the fixed list,
/// at most 11 headers, which the search for the one that changes the behaviour singles out in
/// at most 5 probes: what keeps the check within its allotment of requests.
pub(super) const MAX_LEARNED: usize = 4;

/// A learned value longer than this (128 bytes) is not sent back: markers are short.
const MAX_VALUE_LEN: usize = 128;

/// Response fields that are never candidates: they describe the message, the connection, the
/// resource or the exchange (RFC 9110 and RFC 9111 fields, CORS and security policies, rate
/// limits, request ids and timings), or tell the client whether to retry (`Retry-After`, and
/// the `X-Should-Retry` / `Stripe-Should-Retry` hints generated SDKs read), and sending them
/// back on a request says nothing to an idempotency layer. Prefixes end with `-`.
const NOT_MARKERS: [&str; 46] = [
    "accept-ranges",
    "access-control-",
    "age",
    "allow",
    "alt-svc",
    "authorization",
    "cache-status",
    "connection",
    "content-",
    "cookie",
    "date",
    "etag",
    "expires",
    "keep-alive",
    "last-modified",
    "link",
    "location",
    "nel",
    "permissions-policy",
    "proxy-",
    "ratelimit",
    "referrer-policy",
    "report-to",
    "request-id",
    "retry-after",
    "server",
    "server-timing",
    "set-cookie",
    "strict-transport-security",
    "stripe-should-retry",
    "traceparent",
    "tracestate",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "vary",
    "via",
    "webhook-",
    "www-authenticate",
    "x-amz",
    "x-content-type-options",
    "x-correlation-id",
    "x-frame-options",
    "x-ratelimit-",
    "x-request-id",
    "x-should-retry",
];

/// Per-exchange headers whose value changes on every answer (ids, timings, which node
/// answered): a changed value is no announcement. Absent from the first answer and present in a
/// replay, they still count.
const PER_EXCHANGE: [&str; 8] = [
    "x-trace-id",
    "x-runtime",
    "x-response-time",
    "x-served-by",
    "x-timer",
    "x-envoy-upstream-service-time",
    "x-powered-by",
    "x-cache-hits",
];

/// One request header the check sends.
#[derive(Debug, Clone)]
pub(super) struct Candidate {
    pub(super) name: HeaderName,
    pub(super) value: HeaderValue,
    /// Where the server announced it (`the replay of the baseline request`), `None` for the
    /// fixed list.
    pub(super) learned_from: Option<&'static str>,
}

impl Candidate {
    /// `name: value`, as evidence names it.
    pub(super) fn text(&self) -> String {
        format!(
            "{}: {}",
            self.name,
            String::from_utf8_lossy(self.value.as_bytes())
        )
    }
}

/// The fixed list.
pub(super) fn fixed() -> Vec<Candidate> {
    FIXED
        .iter()
        .map(|(n, v)| Candidate {
            name: HeaderName::from_static(n),
            value: HeaderValue::from_static(v),
            learned_from: None,
        })
        .collect()
}

/// `name: value` of each candidate, joined with `, `.
pub(super) fn texts(c: &[Candidate]) -> String {
    c.iter().map(Candidate::text).collect::<Vec<_>>().join(", ")
}

fn is_marker_name(name: &HeaderName, key_header: Option<&HeaderName>) -> bool {
    let n = name.as_str();
    if key_header == Some(name) {
        return false;
    }
    !NOT_MARKERS.iter().any(|m| {
        if m.ends_with('-') {
            n.starts_with(m)
        } else {
            n == *m
        }
    })
}

/// The headers the server's own answers add: a header an answer in `answers` carries that
/// `original` (the first answer to the same request) lacks, or carries with another value
/// (`X-Cache: MISS`, then `X-Cache: HIT` on the replay), in the order the answers give them,
/// the answer's value kept. Skipped: the names in `already` (the fixed list, names learned
/// before), the key's own header, the fields of [`NOT_MARKERS`], a changed value of a
/// per-exchange header, values over 128 bytes. At most [`MAX_LEARNED`].
pub(super) fn learn(
    original: &Exchange,
    answers: &[(&'static str, &Exchange)],
    already: &[Candidate],
    key_header: Option<&HeaderName>,
) -> Vec<Candidate> {
    let mut out: Vec<Candidate> = Vec::new();
    for (source, answer) in answers {
        for (name, value) in &answer.headers {
            if out.len() == MAX_LEARNED {
                return out;
            }
            let known = already.iter().chain(&out).any(|c| c.name == *name);
            if known || !is_marker_name(name, key_header) || value.len() > MAX_VALUE_LEN {
                continue;
            }
            let first: Vec<&HeaderValue> = original.headers.get_all(name).iter().collect();
            let added = first.is_empty();
            let changed = !added && !first.contains(&value);
            if added || (changed && !PER_EXCHANGE.contains(&name.as_str())) {
                out.push(Candidate {
                    name: name.clone(),
                    value: value.clone(),
                    learned_from: Some(source),
                });
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use http::{HeaderMap, StatusCode};
    use std::time::Instant;

    fn ex(status: u16, headers: &[(&str, &str)]) -> Exchange {
        let mut h = HeaderMap::new();
        for (k, v) in headers {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        let now = Instant::now();
        Exchange {
            request: String::new(),
            status: StatusCode::from_u16(status).unwrap(),
            headers: h,
            body: Bytes::new(),
            started: now,
            finished: now,
        }
    }

    fn names(c: &[Candidate]) -> Vec<String> {
        c.iter().map(Candidate::text).collect()
    }

    #[test]
    fn learns_what_a_replay_adds_or_changes_and_nothing_else() {
        let original = ex(
            201,
            &[
                ("location", "/v1/p/1"),
                ("content-type", "application/json"),
                ("x-cache", "MISS"),
                ("x-request-id", "r1"),
                ("x-runtime", "0.061"),
                ("x-payment-status", "captured"),
            ],
        );
        let replay = ex(
            201,
            &[
                ("location", "/v1/p/1"),
                ("content-type", "application/json"),
                ("x-cache", "HIT"),
                ("x-request-id", "r2"),
                ("x-runtime", "0.001"),
                ("x-payment-status", "captured"),
                ("idempotent-replayed", "true"),
                ("x-from-cache", "1"),
                ("date", "Sun, 06 Nov 1994 08:49:37 GMT"),
                ("age", "3"),
                ("idempotency-key", "k"),
            ],
        );
        let key = HeaderName::from_static("idempotency-key");
        let learned = learn(&original, &[("the replay", &replay)], &fixed(), Some(&key));
        assert_eq!(names(&learned), ["x-cache: HIT", "x-from-cache: 1"]);
        assert_eq!(learned[0].learned_from, Some("the replay"));
        // An in-flight answer: its problem content type and retry hints are no markers.
        let conflict = ex(
            409,
            &[
                ("content-type", "application/problem+json"),
                ("retry-after", "1"),
                ("x-should-retry", "true"),
                ("x-idempotency-status", "in-progress"),
            ],
        );
        assert_eq!(
            names(&learn(
                &original,
                &[("a 409", &conflict)],
                &learned,
                Some(&key)
            )),
            ["x-idempotency-status: in-progress"]
        );
        // Nothing new: nothing learned.
        assert!(learn(&original, &[("same", &original)], &[], Some(&key)).is_empty());
    }

    #[test]
    fn learns_at_most_four_and_skips_long_values() {
        let original = ex(201, &[]);
        let long = "v".repeat(MAX_VALUE_LEN + 1);
        let replay = ex(
            200,
            &[
                ("x-long", long.as_str()),
                ("x-a", "1"),
                ("x-b", "1"),
                ("x-c", "1"),
                ("x-d", "1"),
                ("x-e", "1"),
            ],
        );
        assert_eq!(
            names(&learn(&original, &[("r", &replay)], &[], None)),
            ["x-a: 1", "x-b: 1", "x-c: 1", "x-d: 1"]
        );
    }
}
