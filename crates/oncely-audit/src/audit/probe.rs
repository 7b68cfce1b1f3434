//! The one place requests are sent: a bounded HTTP client and the evidence it records.

use super::config::{AuditConfig, KeyPlacement, Targets};
use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, header};
use reqwest::Url;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// What stands for the key in a body whose key is at a JSON Pointer, until a request is sent:
/// the body variants (reordered, mutated) carry it through unchanged, and each request writes
/// its own key in its place.
pub(crate) const KEY_PLACEHOLDER: &str = "__oncely_audit_key__";

/// A Standard Webhooks signer for `secret` (`whsec_<base64>` or bare base64), `None` when the
/// secret is empty or not base64.
pub(crate) fn signer(secret: &str) -> Option<standardwebhooks::Webhook> {
    if secret.strip_prefix("whsec_").unwrap_or(secret).is_empty() {
        return None;
    }
    standardwebhooks::Webhook::new(secret).ok()
}

/// Sets the member named by the JSON Pointer `ptr` (RFC 6901) to `value`, when its parent is
/// an object; `false` otherwise.
fn set_pointer(v: &mut serde_json::Value, ptr: &str, value: serde_json::Value) -> bool {
    let Some((parent, name)) = split_pointer(ptr) else {
        return false;
    };
    match v
        .pointer_mut(parent)
        .and_then(serde_json::Value::as_object_mut)
    {
        Some(o) => {
            o.insert(name, value);
            true
        }
        None => false,
    }
}

/// The body of a probe whose key goes at the JSON Pointer `ptr`: the placeholder replaced by the
/// key (a JSON string), by the key twice (`"id":"a","id":"b"` in one object), or removed with
/// its member for a keyless probe. Bodies without the placeholder are sent as they are.
fn key_in_body(p: &Probe, ptr: &str) -> Option<Bytes> {
    let body = p.body.as_ref()?;
    let token = serde_json::Value::String(KEY_PLACEHOLDER.to_owned()).to_string();
    let text = String::from_utf8_lossy(body);
    if !text.contains(&token) {
        return Some(body.clone());
    }
    let string = |v: &HeaderValue| {
        serde_json::Value::String(String::from_utf8_lossy(v.as_bytes()).into_owned()).to_string()
    };
    let replaced = match &p.key {
        Key::One(v) => text.replace(&token, &string(v)),
        Key::Repeated(a, b) => {
            let name = split_pointer(ptr).map(|(_, n)| n).unwrap_or_default();
            let name = serde_json::Value::String(name).to_string();
            text.replace(&token, &format!("{},{name}:{}", string(a), string(b)))
        }
        Key::Absent => match serde_json::from_str::<serde_json::Value>(&text) {
            Ok(mut v) => {
                if let Some((parent, name)) = split_pointer(ptr)
                    && let Some(o) = v
                        .pointer_mut(parent)
                        .and_then(serde_json::Value::as_object_mut)
                {
                    o.remove(&name);
                }
                v.to_string()
            }
            Err(_) => text.into_owned(),
        },
    };
    Some(Bytes::from(replaced))
}

/// A pointer's parent pointer and its last member name, unescaped (`~1` is `/`, `~0` is `~`).
fn split_pointer(ptr: &str) -> Option<(&str, String)> {
    let i = ptr.rfind('/')?;
    Some((
        &ptr[..i],
        ptr[i + 1..].replace("~1", "/").replace("~0", "~"),
    ))
}

/// The response headers recognised as marking a replay when their value is `true` (or `1`):
/// `Idempotent-Replayed` (Stripe's convention, Oncely's contract) and the variants other
/// middlewares send.
pub(crate) const REPLAY_MARKERS: [&str; 5] = [
    "idempotent-replayed",
    "idempotency-replayed",
    "x-idempotent-replayed",
    "x-idempotency-replayed",
    "x-idempotency-replay",
];

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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Cred {
    /// [`AuditConfig::auth`].
    First,
    /// [`AuditConfig::second_auth`].
    Second,
    /// [`AuditConfig::same_account_auth`].
    SameAccount,
}

impl Cred {
    fn index(self) -> usize {
        match self {
            Self::First => 0,
            Self::Second => 1,
            Self::SameAccount => 2,
        }
    }

    /// Whose cookie jar a credential uses: a refreshed token is the first caller's client
    /// again, so it shares the first caller's jar.
    fn jar(self) -> usize {
        match self {
            Self::Second => 1,
            Self::First | Self::SameAccount => 0,
        }
    }

    fn label(self) -> &'static str {
        match self {
            Self::First => "first credential",
            Self::Second => "second credential",
            Self::SameAccount => "same-account credential",
        }
    }
}

/// Where a request goes.
#[derive(Debug, Clone)]
pub(crate) enum Dest {
    /// The audited endpoint, on the next base URL in turn.
    Endpoint,
    /// The other endpoint, on the next base URL in turn.
    Other,
    /// This URL (the count URL, a `Location`).
    Url(Url),
}

/// One request to send.
#[derive(Debug, Clone)]
pub(crate) struct Probe {
    pub(crate) method: Method,
    pub(crate) dest: Dest,
    pub(crate) key: Key,
    pub(crate) body: Option<Bytes>,
    pub(crate) cred: Cred,
    /// Whose cookie jar the request presents (when cookies are on): usually `cred`'s own.
    pub(crate) cookies_of: Cred,
    /// Extra request headers (the client-bypass check's markers).
    pub(crate) extra: Vec<(HeaderName, HeaderValue)>,
}

impl Probe {
    /// The same probe under another credential (with that credential's own cookies).
    pub(crate) fn with_cred(mut self, cred: Cred) -> Self {
        self.cred = cred;
        self.cookies_of = cred;
        self
    }
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

/// One credential's cookies: `(name, value)` pairs in the order they were set.
type Jar = Vec<(String, String)>;

/// The bounded client. Why no redirects and no proxy: the audit's traffic goes only to the
/// origin the user named. Why no retries: an audit that silently retried would hide the very
/// behaviour it measures.
pub(crate) struct Prober {
    client: reqwest::Client,
    /// The credentials, by [`Cred::index`].
    creds: [Option<HeaderValue>; 3],
    /// One cookie jar per client (by [`Cred::jar`]), `None` when cookies are off.
    jars: Option<Mutex<[Jar; 2]>>,
    /// The next base URL to use (round robin).
    next_base: AtomicUsize,
    max_requests: usize,
    sent: AtomicUsize,
    timeout: Duration,
    pub(crate) targets: Targets,
    pub(crate) method: Method,
    /// The configured body as JSON (`Null`: no body).
    pub(crate) json: serde_json::Value,
    /// The configured body as sent (compact JSON), `None` for `Null`.
    pub(crate) body: Option<Bytes>,
    /// The other endpoint's body as sent: [`AuditConfig::other_body`], else `body`.
    pub(crate) other_body: Option<Bytes>,
    /// Whether [`AuditConfig::other_body`] was given.
    pub(crate) other_body_given: bool,
    /// Where the key goes.
    placement: KeyPlacement,
    /// The Standard Webhooks signers: the first caller's (and the same account's), the second's.
    signers: [Option<std::sync::Arc<standardwebhooks::Webhook>>; 2],
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
        // A key read from the body: the placeholder takes its place in every body sent.
        let mut json = cfg.body.clone();
        let mut other_json = cfg.other_body.clone();
        if let KeyPlacement::JsonPointer(ptr) = &cfg.key_placement {
            let placeholder = serde_json::Value::String(KEY_PLACEHOLDER.to_owned());
            set_pointer(&mut json, ptr, placeholder.clone());
            if let Some(o) = other_json.as_mut() {
                set_pointer(o, ptr, placeholder);
            }
        }
        let to_bytes = |v: &serde_json::Value| {
            (!v.is_null()).then(|| Bytes::from(serde_json::to_vec(v).expect("a Value serializes")))
        };
        let sign = |s: &Option<String>| s.as_deref().and_then(signer).map(std::sync::Arc::new);
        Ok(Self {
            client,
            creds: [
                header(&cfg.auth).map(mark_sensitive),
                header(&cfg.second_auth).map(mark_sensitive),
                header(&cfg.same_account_auth).map(mark_sensitive),
            ],
            jars: cfg.cookies.then(|| Mutex::new(Default::default())),
            next_base: AtomicUsize::new(0),
            max_requests: cfg.max_requests,
            sent: AtomicUsize::new(0),
            timeout: cfg.timeout,
            targets,
            method: cfg.method.clone(),
            body: to_bytes(&json),
            other_body: match &other_json {
                Some(v) => to_bytes(v),
                None => to_bytes(&json),
            },
            json,
            other_body_given: cfg.other_body.is_some(),
            placement: cfg.key_placement.clone(),
            signers: [sign(&cfg.webhook_secret), sign(&cfg.second_webhook_secret)],
        })
    }

    /// Whether this credential is configured (for the second caller: an `Authorization` value
    /// or a second sender's webhook secret).
    pub(crate) fn has(&self, cred: Cred) -> bool {
        self.creds[cred.index()].is_some() || (cred == Cred::Second && self.signers[1].is_some())
    }

    /// The key's headers and the body a probe sends: the key in its header, or written into the
    /// body at its JSON Pointer (removed for "no key", written twice for "the key twice").
    fn materialize(&self, p: &Probe) -> (Vec<(HeaderName, HeaderValue)>, Option<Bytes>) {
        let name = match &self.placement {
            KeyPlacement::Header(name) => name,
            KeyPlacement::JsonPointer(ptr) => return (Vec::new(), key_in_body(p, ptr)),
        };
        let headers = match &p.key {
            Key::Absent => Vec::new(),
            Key::One(v) => vec![(name.clone(), v.clone())],
            Key::Repeated(a, b) => vec![(name.clone(), a.clone()), (name.clone(), b.clone())],
        };
        (headers, p.body.clone())
    }

    /// The Standard Webhooks headers of a request to the endpoint (or the other endpoint) whose
    /// key headers and body are these, when a webhook secret is configured: a fresh timestamp
    /// and signature for every attempt, over the body actually sent.
    fn webhook_headers(
        &self,
        p: &Probe,
        key_headers: &[(HeaderName, HeaderValue)],
        body: Option<&Bytes>,
    ) -> Vec<(HeaderName, HeaderValue)> {
        let signer = match p.cred {
            Cred::Second => self.signers[1].as_ref().or(self.signers[0].as_ref()),
            Cred::First | Cred::SameAccount => self.signers[0].as_ref(),
        };
        let Some(signer) = signer else {
            return Vec::new();
        };
        let id_header = HeaderName::from_static(standardwebhooks::HEADER_WEBHOOK_ID);
        let key_is_id = matches!(&self.placement, KeyPlacement::Header(h) if *h == id_header);
        let mut out = Vec::new();
        // The id: the key when the key is the webhook-id header (sent as the key headers say,
        // absent for a keyless request); otherwise the request's key, or a fresh id.
        let id = if key_is_id {
            key_headers
                .iter()
                .find(|(n, _)| *n == id_header)
                .map(|(_, v)| String::from_utf8_lossy(v.as_bytes()).into_owned())
                .unwrap_or_default()
        } else {
            let id = match &p.key {
                Key::One(v) | Key::Repeated(v, _) => v.to_str().ok().map(str::to_owned),
                Key::Absent => None,
            }
            .unwrap_or_else(|| format!("msg_oncely_audit_{}", uuid::Uuid::new_v4().simple()));
            if let Ok(v) = HeaderValue::from_str(&id) {
                out.push((id_header, v));
            }
            id
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs() as i64);
        let payload = body.map_or(&[][..], |b| &b[..]);
        if let Ok(sig) = signer.sign(&id, now, payload)
            && let Ok(mut v) = HeaderValue::from_str(&sig)
        {
            v.set_sensitive(true);
            out.push((
                HeaderName::from_static(standardwebhooks::HEADER_WEBHOOK_TIMESTAMP),
                HeaderValue::from(now),
            ));
            out.push((
                HeaderName::from_static(standardwebhooks::HEADER_WEBHOOK_SIGNATURE),
                v,
            ));
        }
        out
    }

    /// Whether cookie jars are on.
    pub(crate) fn cookies_on(&self) -> bool {
        self.jars.is_some()
    }

    /// The names of the cookies in `cred`'s jar.
    pub(crate) fn cookie_names(&self, cred: Cred) -> Vec<String> {
        match &self.jars {
            Some(j) => j.lock().expect("jar lock")[cred.jar()]
                .iter()
                .map(|(n, _)| n.clone())
                .collect(),
            None => Vec::new(),
        }
    }

    /// How many base URLs requests are spread across.
    pub(crate) fn instances(&self) -> usize {
        self.targets.endpoints.len()
    }

    /// How many requests were sent so far.
    pub(crate) fn sent(&self) -> usize {
        self.sent.load(Ordering::SeqCst)
    }

    /// A probe of the audited endpoint with the configured body and the first credential.
    pub(crate) fn probe(&self, key: Key) -> Probe {
        Probe {
            method: self.method.clone(),
            dest: Dest::Endpoint,
            key,
            body: self.body.clone(),
            cred: Cred::First,
            cookies_of: Cred::First,
            extra: Vec::new(),
        }
    }

    /// The URL a probe goes to; `advance` takes the next base URL in turn.
    fn resolve(&self, dest: &Dest, advance: bool) -> Url {
        let pick = |urls: &[Url]| {
            let i = if advance {
                self.next_base.fetch_add(1, Ordering::SeqCst)
            } else {
                0
            };
            urls[i % urls.len()].clone()
        };
        match dest {
            Dest::Endpoint => pick(&self.targets.endpoints),
            Dest::Other => pick(
                &self
                    .targets
                    .other
                    .as_ref()
                    .expect("Dest::Other is used only with another endpoint")
                    .1,
            ),
            Dest::Url(u) => u.clone(),
        }
    }

    /// A request as an evidence line, before it is sent (the first base URL is shown).
    pub(crate) fn describe(&self, p: &Probe) -> String {
        let (_, body) = self.materialize(p);
        describe_request(
            p,
            &self.resolve(&p.dest, false),
            self.instances() > 1,
            &self.placement,
            body.as_ref(),
        )
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
        self.take_budget()?;
        let url = self.resolve(&p.dest, true);
        let (key_headers, body) = self.materialize(p);
        let request = describe_request(
            p,
            &url,
            self.instances() > 1,
            &self.placement,
            body.as_ref(),
        );
        let mut headers = HeaderMap::new();
        if !matches!(p.dest, Dest::Url(_)) {
            for (name, value) in self.webhook_headers(p, &key_headers, body.as_ref()) {
                headers.append(name, value);
            }
        }
        for (name, value) in key_headers {
            headers.append(name, value);
        }
        if let Some(c) = &self.creds[p.cred.index()] {
            headers.insert(header::AUTHORIZATION, c.clone());
        }
        if let Some(jars) = &self.jars {
            let jar = &jars.lock().expect("jar lock")[p.cookies_of.jar()];
            if !jar.is_empty() {
                let text: Vec<String> = jar.iter().map(|(n, v)| format!("{n}={v}")).collect();
                if let Ok(mut v) = HeaderValue::from_str(&text.join("; ")) {
                    v.set_sensitive(true);
                    headers.insert(header::COOKIE, v);
                }
            }
        }
        for (name, value) in &p.extra {
            headers.append(name.clone(), value.clone());
        }
        let mut rb = self.client.request(p.method.clone(), url);
        if let Some(body) = &body {
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
        if let Some(jars) = &self.jars {
            let jar = &mut jars.lock().expect("jar lock")[p.cred.jar()];
            for v in headers.get_all(header::SET_COOKIE) {
                store_cookie(jar, v.as_bytes());
            }
        }
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
        self.count_as(Cred::First).await.map(|r| r.map(|(c, _)| c))
    }

    /// Reads the count URL with `cred`: the count and the ids listed (when the listing is an
    /// array of objects with `id`s).
    pub(crate) async fn count_as(
        &self,
        cred: Cred,
    ) -> Option<Result<(Counted, Vec<String>), String>> {
        let url = self.targets.count.clone()?;
        let p = Probe {
            method: Method::GET,
            dest: Dest::Url(url),
            key: Key::Absent,
            body: None,
            cred,
            cookies_of: cred,
            extra: Vec::new(),
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
                Some(n) => Ok((
                    Counted {
                        n,
                        evidence: match cred {
                            Cred::First => format!("count URL: {n} resource(s)"),
                            c => format!("count URL read with the {}: {n} resource(s)", c.label()),
                        },
                    },
                    ex.json().map(|v| ids_in(&v)).unwrap_or_default(),
                )),
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

/// The `id`s of the objects a listing holds (a JSON array, or one under `data` / `items` /
/// `results`).
fn ids_in(v: &serde_json::Value) -> Vec<String> {
    let list = v.as_array().or_else(|| {
        ["data", "items", "results"]
            .iter()
            .find_map(|k| v.get(*k).and_then(serde_json::Value::as_array))
    });
    list.map(|a| a.iter().filter_map(id_of).collect())
        .unwrap_or_default()
}

fn id_of(v: &serde_json::Value) -> Option<String> {
    match v.get("id")? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// Applies one `Set-Cookie` (RFC 6265 section 5.2, simplified: the name and value; a
/// `Max-Age` of zero or less, or an empty value, deletes the cookie; `Domain`, `Path` and
/// `Expires` are ignored, as every request goes to the audited API).
fn store_cookie(jar: &mut Jar, raw: &[u8]) {
    let text = String::from_utf8_lossy(raw);
    let mut parts = text.split(';');
    let Some((name, value)) = parts.next().and_then(|nv| nv.split_once('=')) else {
        return;
    };
    let (name, value) = (name.trim().to_owned(), value.trim().to_owned());
    if name.is_empty() {
        return;
    }
    let deleted = value.is_empty()
        || parts.any(|a| {
            a.trim().split_once('=').is_some_and(|(k, v)| {
                k.trim().eq_ignore_ascii_case("max-age")
                    && v.trim().parse::<i64>().is_ok_and(|n| n <= 0)
            })
        });
    jar.retain(|(n, _)| *n != name);
    if !deleted {
        jar.push((name, value));
    }
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
        id_of(&v).or_else(|| v.get("data").and_then(id_of))
    }

    /// The replay marker the response carries with the value `true` (or `1`), if any: one of
    /// [`REPLAY_MARKERS`] (`Idempotent-Replayed`, `Idempotency-Replayed`,
    /// `X-Idempotent-Replayed`, ...).
    pub(crate) fn replay_marker(&self) -> Option<&'static str> {
        REPLAY_MARKERS.into_iter().find(|m| {
            self.headers.get(*m).is_some_and(|v| {
                let v = v.as_bytes();
                v.eq_ignore_ascii_case(b"true") || v == b"1"
            })
        })
    }

    /// Whether the response carries a replay marker ([`Self::replay_marker`]).
    pub(crate) fn marked_replay(&self) -> bool {
        self.replay_marker().is_some()
    }

    /// The names of the cookies the response sets.
    pub(crate) fn set_cookie_names(&self) -> Vec<String> {
        self.headers
            .get_all(header::SET_COOKIE)
            .iter()
            .filter_map(|v| {
                let t = String::from_utf8_lossy(v.as_bytes()).into_owned();
                t.split(';')
                    .next()
                    .and_then(|nv| nv.split_once('='))
                    .map(|(n, _)| n.trim().to_owned())
            })
            .collect()
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
        && !REPLAY_MARKERS.contains(&n)
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

/// A request as an evidence line: `> METHOD /path Idempotency-Key: "k" Authorization: <second
/// credential> body: {...}` (with several base URLs, the path is preceded by `host:port`).
pub(crate) fn describe_request(
    p: &Probe,
    url: &Url,
    show_origin: bool,
    placement: &KeyPlacement,
    body: Option<&Bytes>,
) -> String {
    let origin = match (show_origin, url.host_str()) {
        (true, Some(h)) => match url.port() {
            Some(port) => format!("{h}:{port}"),
            None => h.to_owned(),
        },
        _ => String::new(),
    };
    let mut s = format!("> {} {origin}{}", p.method, path_and_query(url));
    match &p.key {
        Key::Absent => s.push_str(&format!(" (no {placement})")),
        Key::One(v) => s.push_str(&format!(" {placement}: {}", describe_key(v))),
        Key::Repeated(a, b) => s.push_str(&format!(
            " {placement}: {} {placement}: {}",
            describe_key(a),
            describe_key(b)
        )),
    }
    match p.cred {
        Cred::First => {}
        c => s.push_str(&format!(" Authorization: <{}>", c.label())),
    }
    if p.cookies_of != p.cred {
        s.push_str(&format!(
            " Cookie: <the {}'s cookies>",
            p.cookies_of.label()
        ));
    }
    for (name, value) in &p.extra {
        s.push_str(&format!(
            " {name}: {}",
            String::from_utf8_lossy(value.as_bytes())
        ));
    }
    if let Some(b) = body {
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
        if is_significant(name) || n == "retry-after" || REPLAY_MARKERS.contains(&n) {
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
    fn recognises_replay_marker_variants() {
        for m in [
            "Idempotent-Replayed",
            "Idempotency-Replayed",
            "X-Idempotent-Replayed",
        ] {
            let e = ex(200, &[(m, "true")], "{}");
            assert_eq!(
                e.replay_marker().map(str::to_owned),
                Some(m.to_ascii_lowercase())
            );
            assert!(e.marked_replay(), "{m}");
            assert!(!is_significant(
                &HeaderName::from_bytes(m.as_bytes()).unwrap()
            ));
        }
        assert!(ex(200, &[("Idempotency-Replayed", "1")], "{}").marked_replay());
        assert!(!ex(200, &[("Idempotent-Replayed", "false")], "{}").marked_replay());
        assert!(!ex(200, &[("Replayed", "true")], "{}").marked_replay());
    }

    #[test]
    fn cookie_jar_keeps_names_and_values_and_deletes() {
        let mut jar = Vec::new();
        store_cookie(&mut jar, b"sid=abc; Path=/; HttpOnly");
        store_cookie(&mut jar, b"theme=dark");
        store_cookie(&mut jar, b"sid=def; Max-Age=60");
        assert_eq!(
            jar,
            vec![
                ("theme".to_owned(), "dark".to_owned()),
                ("sid".to_owned(), "def".to_owned())
            ]
        );
        store_cookie(&mut jar, b"theme=x; Max-Age=0");
        store_cookie(&mut jar, b"garbage");
        assert_eq!(jar, vec![("sid".to_owned(), "def".to_owned())]);
        assert_eq!(
            ex(200, &[("set-cookie", "sid=1; Path=/")], "").set_cookie_names(),
            vec!["sid".to_owned()]
        );
    }

    #[test]
    fn counts_common_list_shapes() {
        use serde_json::json;
        assert_eq!(count_in(&json!([1, 2, 3])), Some(3));
        assert_eq!(count_in(&json!({"total_count": 4, "data": []})), Some(4));
        assert_eq!(count_in(&json!({"data": [1, 2]})), Some(2));
        assert_eq!(count_in(&json!({"nothing": 1})), None);
        assert_eq!(
            ids_in(&json!({"data": [{"id": "a"}, {"id": 2}, {}]})),
            vec!["a".to_owned(), "2".to_owned()]
        );
    }

    #[test]
    fn evidence_lines_hide_credentials_and_truncate() {
        let url = Url::parse("http://127.0.0.1:1/v1/p?x=1").unwrap();
        let mut p = Probe {
            method: Method::POST,
            dest: Dest::Url(url.clone()),
            key: Key::One(HeaderValue::from_bytes(b"caf\xc3\xa9").unwrap()),
            body: Some(Bytes::from_static(b"{\"a\":1}")),
            cred: Cred::Second,
            cookies_of: Cred::Second,
            extra: Vec::new(),
        };
        assert_eq!(
            describe_request(&p, &url, false, &KeyPlacement::default(), p.body.as_ref()),
            r#"> POST /v1/p?x=1 Idempotency-Key: "caf\xc3\xa9" Authorization: <second credential> body: {"a":1}"#
        );
        p.cookies_of = Cred::First;
        p.extra = vec![(
            HeaderName::from_static("x-idempotency-replay"),
            HeaderValue::from_static("true"),
        )];
        p.body = None;
        assert_eq!(
            describe_request(&p, &url, true, &KeyPlacement::default(), p.body.as_ref()),
            r#"> POST 127.0.0.1:1/v1/p?x=1 Idempotency-Key: "caf\xc3\xa9" Authorization: <second credential> Cookie: <the first credential's cookies> x-idempotency-replay: true"#
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
