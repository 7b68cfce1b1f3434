//! The bounded HTTP client: the one place requests are sent, within the audit's budget, to the
//! configured origins only.

use super::cookies::{Jar, store_cookie};
use super::evidence::describe_request;
use super::exchange::Exchange;
use super::placement::{materialize, with_placeholder};
use super::request::{Cred, Dest, Key, Probe};
use crate::audit::config::{AuditConfig, KeyPlacement, Targets};
use crate::audit::signer::{signature_headers, signer};
use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue, Method, header};
use reqwest::Url;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

/// Response bodies are read up to this many bytes (1 MiB); the rest is dropped.
const MAX_BODY: usize = 1 << 20;

/// Why a request got no response.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ProbeError {
    /// [`AuditConfig::max_requests`](crate::audit::AuditConfig::max_requests) requests were already sent; this one was not.
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
    /// The other endpoint's body as sent: [`AuditConfig::other_body`](crate::audit::AuditConfig::other_body), else `body`.
    pub(crate) other_body: Option<Bytes>,
    /// Whether [`AuditConfig::other_body`](crate::audit::AuditConfig::other_body) was given.
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
        let json = with_placeholder(cfg.body.clone(), &cfg.key_placement);
        let other_json = cfg
            .other_body
            .clone()
            .map(|o| with_placeholder(o, &cfg.key_placement));
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
        out.extend(signature_headers(
            signer,
            &id,
            body.map_or(&[][..], |b| &b[..]),
        ));
        out
    }

    /// The request header the key goes in, `None` when it goes in the body.
    pub(crate) fn key_header(&self) -> Option<&HeaderName> {
        match &self.placement {
            KeyPlacement::Header(name) => Some(name),
            KeyPlacement::JsonPointer(_) => None,
        }
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
        let (_, body) = materialize(&self.placement, p);
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
        let (key_headers, body) = materialize(&self.placement, p);
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
