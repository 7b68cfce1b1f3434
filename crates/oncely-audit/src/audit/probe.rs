//! The one place requests are sent: a bounded HTTP client and the evidence it records.

use super::config::{AuditConfig, Targets};
use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use reqwest::Url;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// The request header carrying the key (draft-ietf-httpapi-idempotency-key-header section 2).
pub(crate) const KEY_HEADER: HeaderName = HeaderName::from_static("idempotency-key");

/// The response header marking a replay (Stripe's convention, Oncely's contract).
pub(crate) const REPLAYED_HEADER: HeaderName = HeaderName::from_static("idempotent-replayed");

/// Response bodies are read up to this many bytes (1 MiB); the rest is dropped.
const MAX_BODY: usize = 1 << 20;

/// Bodies are shown in evidence up to this many characters.
const EVIDENCE_BODY_CHARS: usize = 200;

/// Headers that legitimately differ between an original response and its replay (they describe
/// the exchange, not the result), so the replay-fidelity check does not compare them.
const PER_EXCHANGE_HEADERS: [&str; 14] = [
    "x-request-id",
    "x-correlation-id",
    "x-trace-id",
    "x-amzn-requestid",
    "x-amz-request-id",
    "x-amzn-trace-id",
    "x-runtime",
    "x-response-time",
    "x-served-by",
    "x-timer",
    "x-cache",
    "x-cache-hits",
    "x-envoy-upstream-service-time",
    "x-powered-by",
];

/// How the `Idempotency-Key` header is sent.
#[derive(Debug, Clone)]
pub(crate) enum Key {
    /// No key header at all.
    Absent,
    /// One key header with this value (any bytes a header value may carry).
    One(HeaderValue),
    /// The header twice, with these two values.
    Repeated(HeaderValue, HeaderValue),
}

impl Key {
    /// A fresh, valid key: `oncely-audit-<uuid v4>` (49 visible ASCII characters).
    pub(crate) fn fresh() -> Self {
        Self::One(fresh_value())
    }
}

/// A fresh, valid key value.
pub(crate) fn fresh_value() -> HeaderValue {
    HeaderValue::try_from(format!("oncely-audit-{}", uuid::Uuid::new_v4()))
        .expect("a uuid is a valid header value")
}

/// Which credential a request carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cred {
    /// [`AuditConfig::auth`].
    First,
    /// [`AuditConfig::second_auth`].
    Second,
}

/// One request to send.
#[derive(Debug, Clone)]
pub(crate) struct Probe {
    pub(crate) method: Method,
    pub(crate) url: Url,
    pub(crate) key: Key,
    pub(crate) body: Option<Bytes>,
    pub(crate) cred: Cred,
}

/// One request and the response it got.
#[derive(Debug, Clone)]
pub(crate) struct Exchange {
    /// The request, as an evidence line.
    pub(crate) request: String,
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Bytes,
    pub(crate) started: Instant,
    pub(crate) finished: Instant,
}

/// Why a request got no response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ProbeError {
    /// [`AuditConfig::max_requests`] requests were already sent; this one was not.
    Budget,
    /// Connect, send, read or timeout failure, described.
    Transport(String),
}

impl std::fmt::Display for ProbeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Budget => f.write_str("not sent: the request budget (max_requests) is spent"),
            Self::Transport(e) => f.write_str(e),
        }
    }
}

/// The bounded client. Why no redirects and no proxy: the audit's traffic goes only to the
/// origin the user named. Why no retries: an audit that silently retried would hide the very
/// behaviour it measures.
pub(crate) struct Prober {
    client: reqwest::Client,
    auth: Option<HeaderValue>,
    second_auth: Option<HeaderValue>,
    max_requests: usize,
    sent: AtomicUsize,
    timeout: Duration,
    pub(crate) targets: Targets,
    pub(crate) method: Method,
    /// The configured body as JSON (`Null`: no body).
    pub(crate) json: serde_json::Value,
    /// The configured body as sent (compact JSON), `None` for `Null`.
    pub(crate) body: Option<Bytes>,
}

impl Prober {
    pub(crate) fn new(cfg: &AuditConfig, targets: Targets) -> Result<Self, String> {
        let client = reqwest::Client::builder()
            .timeout(cfg.timeout)
            .connect_timeout(cfg.timeout)
            .redirect(reqwest::redirect::Policy::none())
            .retry(reqwest::retry::never())
            .no_proxy()
            .user_agent(concat!("oncely-audit/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| error_chain(&e))?;
        let header = |v: &Option<String>| v.as_deref().and_then(|s| HeaderValue::from_str(s).ok());
        let mark_sensitive = |mut v: HeaderValue| {
            v.set_sensitive(true);
            v
        };
        Ok(Self {
            client,
            auth: header(&cfg.auth).map(mark_sensitive),
            second_auth: header(&cfg.second_auth).map(mark_sensitive),
            max_requests: cfg.max_requests,
            sent: AtomicUsize::new(0),
            timeout: cfg.timeout,
            targets,
            method: cfg.method.clone(),
            json: cfg.body.clone(),
            body: (!cfg.body.is_null())
                .then(|| Bytes::from(serde_json::to_vec(&cfg.body).expect("a Value serializes"))),
        })
    }

    /// Whether a second credential is configured.
    pub(crate) fn has_second_auth(&self) -> bool {
        self.second_auth.is_some()
    }

    /// How many requests were sent so far.
    pub(crate) fn sent(&self) -> usize {
        self.sent.load(Ordering::SeqCst)
    }

    /// A probe of the audited endpoint with the configured body and the first credential.
    pub(crate) fn probe(&self, key: Key) -> Probe {
        Probe {
            method: self.method.clone(),
            url: self.targets.endpoint.clone(),
            key,
            body: self.body.clone(),
            cred: Cred::First,
        }
    }

    /// Takes one request from the budget, or says it is spent.
    fn take_budget(&self) -> Result<(), ProbeError> {
        self.sent
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| {
                (n < self.max_requests).then_some(n + 1)
            })
            .map(|_| ())
            .map_err(|_| ProbeError::Budget)
    }

    /// Sends one request and reads the whole response (up to 1 MiB of body).
    pub(crate) async fn send(&self, p: &Probe) -> Result<Exchange, ProbeError> {
        let request = describe_request(p);
        self.take_budget()?;
        let mut headers = HeaderMap::new();
        match &p.key {
            Key::Absent => {}
            Key::One(v) => {
                headers.append(KEY_HEADER, v.clone());
            }
            Key::Repeated(a, b) => {
                headers.append(KEY_HEADER, a.clone());
                headers.append(KEY_HEADER, b.clone());
            }
        }
        let cred = match p.cred {
            Cred::First => &self.auth,
            Cred::Second => &self.second_auth,
        };
        if let Some(c) = cred {
            headers.insert(header::AUTHORIZATION, c.clone());
        }
        let mut rb = self.client.request(p.method.clone(), p.url.clone());
        if let Some(body) = &p.body {
            headers.insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            rb = rb.body(body.clone());
        }
        let started = Instant::now();
        let transport = |e: reqwest::Error| {
            if e.is_timeout() {
                ProbeError::Transport(format!("timed out after {} ms", self.timeout.as_millis()))
            } else {
                ProbeError::Transport(error_chain(&e))
            }
        };
        let mut resp = rb.headers(headers).send().await.map_err(transport)?;
        let status = resp.status();
        let headers = resp.headers().clone();
        let mut body = BytesMut::new();
        while let Some(chunk) = resp.chunk().await.map_err(transport)? {
            let room = MAX_BODY - body.len();
            body.extend_from_slice(&chunk[..chunk.len().min(room)]);
            if body.len() >= MAX_BODY {
                break;
            }
        }
        Ok(Exchange {
            request,
            status,
            headers,
            body: body.freeze(),
            started,
            finished: Instant::now(),
        })
    }

    /// Reads the count URL with the first credential: the number of resources it lists.
    ///
    /// Accepted shapes: a JSON array; an object with a numeric `count`, `total`, `total_count`
    /// or `totalCount`; an object with an array under `data`, `items` or `results`.
    pub(crate) async fn count(&self) -> Option<Result<Counted, String>> {
        let url = self.targets.count.clone()?;
        let p = Probe {
            method: Method::GET,
            url,
            key: Key::Absent,
            body: None,
            cred: Cred::First,
        };
        Some(match self.send(&p).await {
            Err(e) => Err(format!("count URL: {e}")),
            Ok(ex) if !ex.status.is_success() => {
                Err(format!("count URL answered {}", describe_response(&ex)))
            }
            Ok(ex) => match serde_json::from_slice::<serde_json::Value>(&ex.body)
                .ok()
                .as_ref()
                .and_then(count_in)
            {
                Some(n) => Ok(Counted {
                    n,
                    evidence: format!("count URL: {n} resource(s)"),
                }),
                None => Err(format!(
                    "count URL body has no recognisable count: {}",
                    truncate_body(&ex.body)
                )),
            },
        })
    }
}

/// A count-URL reading.
#[derive(Debug, Clone)]
pub(crate) struct Counted {
    pub(crate) n: u64,
    pub(crate) evidence: String,
}

fn count_in(v: &serde_json::Value) -> Option<u64> {
    if let Some(a) = v.as_array() {
        return Some(a.len() as u64);
    }
    let o = v.as_object()?;
    for k in ["count", "total", "total_count", "totalCount"] {
        if let Some(n) = o.get(k).and_then(serde_json::Value::as_u64) {
            return Some(n);
        }
    }
    for k in ["data", "items", "results"] {
        if let Some(a) = o.get(k).and_then(serde_json::Value::as_array) {
            return Some(a.len() as u64);
        }
    }
    None
}

fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

impl Exchange {
    /// The body as JSON, if it is JSON.
    pub(crate) fn json(&self) -> Option<serde_json::Value> {
        serde_json::from_slice(&self.body).ok()
    }

    /// The created resource's identifier: the body's top-level `id` (string or number), or
    /// `data.id`.
    pub(crate) fn id(&self) -> Option<String> {
        let v = self.json()?;
        let id = v
            .get("id")
            .or_else(|| v.get("data").and_then(|d| d.get("id")))?;
        match id {
            serde_json::Value::String(s) => Some(s.clone()),
            serde_json::Value::Number(n) => Some(n.to_string()),
            _ => None,
        }
    }

    /// Whether the response carries `Idempotent-Replayed: true`.
    pub(crate) fn marked_replay(&self) -> bool {
        self.headers
            .get(REPLAYED_HEADER)
            .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"true"))
    }

    /// A machine-readable error code in the body: problem+json's `code` extension, a Stripe-style
    /// `error.code` / `error.type`, or a problem `type` other than `about:blank`.
    pub(crate) fn error_code(&self) -> Option<String> {
        let v = self.json()?;
        let s = |x: Option<&serde_json::Value>| x.and_then(|x| x.as_str()).map(str::to_owned);
        s(v.get("code"))
            .or_else(|| s(v.get("error").and_then(|e| e.get("code"))))
            .or_else(|| s(v.get("error").and_then(|e| e.get("type"))))
            .or_else(|| s(v.get("type")).filter(|t| t != "about:blank"))
            .filter(|c| !c.is_empty())
    }

    /// Whether the body is a problem document (RFC 9457) or at least a JSON error with a code.
    pub(crate) fn is_problem(&self) -> bool {
        let ct = self
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        (ct.starts_with("application/problem+json") && self.json().is_some())
            || self.error_code().is_some()
    }

    /// `Retry-After` as given, and whether it is valid (delta-seconds or an HTTP-date, RFC 9110
    /// section 10.2.3).
    pub(crate) fn retry_after(&self) -> Option<(String, bool)> {
        let v = self.headers.get(header::RETRY_AFTER)?;
        let text = String::from_utf8_lossy(v.as_bytes()).into_owned();
        let t = text.trim();
        let valid = (!t.is_empty() && t.bytes().all(|b| b.is_ascii_digit()))
            || httpdate::parse_http_date(t).is_ok();
        Some((text, valid))
    }

    /// How long the exchange took, in milliseconds.
    pub(crate) fn millis(&self) -> u128 {
        self.finished.duration_since(self.started).as_millis()
    }

    /// The response as an evidence line.
    pub(crate) fn response_line(&self) -> String {
        describe_response(self)
    }
}

/// Whether a response header should be identical in a replay: `Location`, `Content-Type`,
/// `Content-Location`, `ETag`, `Link`, and every `x-*` header except the per-exchange ones
/// (request ids, timings, cache diagnostics).
pub(crate) fn is_significant(name: &HeaderName) -> bool {
    let n = name.as_str();
    matches!(
        n,
        "location" | "content-type" | "content-location" | "etag" | "link"
    ) || (n.starts_with("x-")
        && !PER_EXCHANGE_HEADERS.contains(&n)
        && !n.starts_with("x-ratelimit"))
}

fn describe_key(v: &HeaderValue) -> String {
    let b = v.as_bytes();
    if b.len() > 60 {
        format!("\"{}...\" ({} bytes)", b[..24].escape_ascii(), b.len())
    } else {
        format!("\"{}\"", b.escape_ascii())
    }
}

/// A request as an evidence line: `> METHOD /path Idempotency-Key: "k" Authorization: <first
/// credential> body: {...}`.
pub(crate) fn describe_request(p: &Probe) -> String {
    let mut s = format!("> {} {}", p.method, path_and_query(&p.url));
    match &p.key {
        Key::Absent => s.push_str(" (no Idempotency-Key)"),
        Key::One(v) => s.push_str(&format!(" Idempotency-Key: {}", describe_key(v))),
        Key::Repeated(a, b) => s.push_str(&format!(
            " Idempotency-Key: {} Idempotency-Key: {}",
            describe_key(a),
            describe_key(b)
        )),
    }
    match p.cred {
        Cred::First => {}
        Cred::Second => s.push_str(" Authorization: <second credential>"),
    }
    if let Some(b) = &p.body {
        s.push_str(&format!(" body: {}", truncate_body(b)));
    }
    s
}

fn path_and_query(u: &Url) -> String {
    match u.query() {
        Some(q) => format!("{}?{q}", u.path()),
        None => u.path().to_owned(),
    }
}

/// A response as an evidence line: `< 201 Created Location: ...; Content-Type: ... body: {...}
/// (123 bytes, 64 ms)`.
pub(crate) fn describe_response(ex: &Exchange) -> String {
    let mut s = format!("< {}", ex.status);
    let mut shown = Vec::new();
    for (name, value) in &ex.headers {
        let n = name.as_str();
        if is_significant(name) || matches!(n, "retry-after" | "idempotent-replayed") {
            shown.push(format!(
                "{name}: {}",
                String::from_utf8_lossy(value.as_bytes())
            ));
        }
    }
    if !shown.is_empty() {
        s.push(' ');
        s.push_str(&shown.join("; "));
    }
    s.push_str(&format!(
        " body: {} ({} bytes, {} ms)",
        truncate_body(&ex.body),
        ex.body.len(),
        ex.millis()
    ));
    s
}

/// The body as text, cut to 200 characters (lossy UTF-8; `<empty>` for no body).
pub(crate) fn truncate_body(b: &[u8]) -> String {
    if b.is_empty() {
        return "<empty>".to_owned();
    }
    let text = String::from_utf8_lossy(b);
    let mut out: String = text.chars().take(EVIDENCE_BODY_CHARS).collect();
    if text.chars().count() > EVIDENCE_BODY_CHARS {
        out.push_str("...");
    }
    out.replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ex(status: u16, headers: &[(&str, &str)], body: &str) -> Exchange {
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
            body: Bytes::from(body.to_owned()),
            started: now,
            finished: now,
        }
    }

    #[test]
    fn reads_ids_codes_and_retry_after() {
        assert_eq!(
            ex(201, &[], r#"{"id":"pay_1"}"#).id().as_deref(),
            Some("pay_1")
        );
        assert_eq!(
            ex(201, &[], r#"{"data":{"id":7}}"#).id().as_deref(),
            Some("7")
        );
        assert_eq!(ex(201, &[], r#"[1]"#).id(), None);
        let e = ex(
            409,
            &[
                ("content-type", "application/problem+json"),
                ("retry-after", "1"),
            ],
            r#"{"type":"about:blank","code":"idempotency_request_in_flight"}"#,
        );
        assert_eq!(
            e.error_code().as_deref(),
            Some("idempotency_request_in_flight")
        );
        assert!(e.is_problem());
        assert_eq!(e.retry_after(), Some(("1".to_owned(), true)));
        let e = ex(
            409,
            &[("retry-after", "soon")],
            r#"{"error":{"type":"idempotency_error"}}"#,
        );
        assert_eq!(e.error_code().as_deref(), Some("idempotency_error"));
        assert_eq!(e.retry_after(), Some(("soon".to_owned(), false)));
        let e = ex(
            409,
            &[("retry-after", "Sun, 06 Nov 1994 08:49:37 GMT")],
            "busy",
        );
        assert!(e.retry_after().unwrap().1);
        assert_eq!(e.error_code(), None);
        assert!(!e.is_problem());
    }

    #[test]
    fn counts_common_list_shapes() {
        use serde_json::json;
        assert_eq!(count_in(&json!([1, 2, 3])), Some(3));
        assert_eq!(count_in(&json!({"total_count": 4, "data": []})), Some(4));
        assert_eq!(count_in(&json!({"data": [1, 2]})), Some(2));
        assert_eq!(count_in(&json!({"nothing": 1})), None);
    }

    #[test]
    fn evidence_lines_hide_credentials_and_truncate() {
        let p = Probe {
            method: Method::POST,
            url: Url::parse("http://127.0.0.1:1/v1/p?x=1").unwrap(),
            key: Key::One(HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap()),
            body: Some(Bytes::from_static(b"{\"a\":1}")),
            cred: Cred::Second,
        };
        assert_eq!(
            describe_request(&p),
            r#"> POST /v1/p?x=1 Idempotency-Key: "caf\xc3\xa9" Authorization: <second credential> body: {"a":1}"#
        );
        let long = "x".repeat(300);
        let t = truncate_body(long.as_bytes());
        assert_eq!(t.len(), 203);
        let e = ex(
            201,
            &[
                ("location", "/v1/p/1"),
                ("date", "today"),
                ("x-request-id", "r1"),
            ],
            "{}",
        );
        assert_eq!(
            describe_response(&e),
            "< 201 Created location: /v1/p/1 body: {} (2 bytes, 0 ms)"
        );
    }

    #[tokio::test]
    async fn the_budget_is_a_hard_bound() {
        // Nothing listens on this port (bound, then released): every send that is allowed fails
        // at connect, the one over the budget is not attempted at all.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut cfg = AuditConfig::new(
            Url::parse(&format!("http://127.0.0.1:{port}")).unwrap(),
            Method::POST,
            "/v1/p",
            serde_json::json!({"a": 1}),
        );
        cfg.max_requests = 2;
        let targets = cfg.targets_unchecked_for_tests();
        let p = Prober::new(&cfg, targets).unwrap();
        for _ in 0..2 {
            assert!(matches!(
                p.send(&p.probe(Key::fresh())).await,
                Err(ProbeError::Transport(_))
            ));
        }
        assert_eq!(
            p.send(&p.probe(Key::fresh())).await.unwrap_err(),
            ProbeError::Budget
        );
        assert_eq!(
            p.count().await.map(|r| r.is_err()),
            None,
            "no count URL configured"
        );
        assert_eq!(p.sent(), 2);
    }

    #[test]
    fn significant_headers() {
        for n in ["location", "content-type", "x-payment-status", "etag"] {
            assert!(is_significant(&HeaderName::from_static(n)), "{n}");
        }
        for n in [
            "date",
            "x-request-id",
            "x-ratelimit-remaining",
            "server",
            "content-length",
        ] {
            assert!(!is_significant(&HeaderName::from_static(n)), "{n}");
        }
    }
}
