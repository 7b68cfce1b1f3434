//! A fault-injecting HTTP proxy for the fleet gate: it sits between the retrying clients and the
//! API and, by a seeded random draw per request, forwards it, answers `503` with `Retry-After`
//! without forwarding, or forwards it and then drops the connection without answering (the
//! side effect happened; the client never learns). While the upstream is down (killed), every
//! request gets `502`.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use tokio::net::TcpListener;

/// What the proxy did, counted.
#[derive(Debug, Default)]
pub struct ProxyStats {
    /// Requests forwarded and answered.
    pub forwarded: AtomicU64,
    /// Requests forwarded whose response was dropped.
    pub dropped: AtomicU64,
    /// Requests answered 503 without forwarding.
    pub unavailable: AtomicU64,
    /// Requests answered 502 because the upstream was down.
    pub upstream_down: AtomicU64,
    /// Forwarded answers that were `409 idempotency_request_in_flight` (a retry that found its
    /// key still held).
    pub in_flight: AtomicU64,
    /// Forwarded answers that were `503 server_shutting_down` (a draining server refused a new
    /// request before claiming it).
    pub shutting_down: AtomicU64,
}

/// A running proxy.
pub struct Proxy {
    /// Its base URL.
    pub url: String,
    upstream: Arc<RwLock<String>>,
    /// Counters.
    pub stats: Arc<ProxyStats>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The fault mix, in percent of requests.
#[derive(Debug, Clone, Copy)]
pub struct Faults {
    /// Forward, then drop the response.
    pub drop_pct: u64,
    /// Answer 503 + `Retry-After: 1` without forwarding.
    pub unavailable_pct: u64,
}

impl Proxy {
    /// Starts a proxy to `upstream` on a free port.
    pub async fn start(upstream: String, faults: Faults, seed: u64) -> anyhow::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let upstream = Arc::new(RwLock::new(upstream));
        let stats = Arc::new(ProxyStats::default());
        let rng = Arc::new(Mutex::new(seed.max(1)));
        let client = reqwest::Client::builder()
            .timeout(std::time::Duration::from_secs(30))
            .build()?;
        let (up, st) = (upstream.clone(), stats.clone());
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (up, st, rng, client) = (up.clone(), st.clone(), rng.clone(), client.clone());
                tokio::spawn(async move {
                    let svc = service_fn(move |req: Request<Incoming>| {
                        let (up, st, rng, client) =
                            (up.clone(), st.clone(), rng.clone(), client.clone());
                        async move {
                            let draw = {
                                // xorshift64: deterministic for a seed, no extra dependency.
                                let mut x = rng.lock().unwrap_or_else(|e| e.into_inner());
                                *x ^= *x << 13;
                                *x ^= *x >> 7;
                                *x ^= *x << 17;
                                *x % 100
                            };
                            handle(req, draw, faults, &up, &st, &client).await
                        }
                    });
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        Ok(Self {
            url,
            upstream,
            stats,
            task,
        })
    }

    /// Points the proxy at a new upstream (after a restart).
    pub fn set_upstream(&self, url: String) {
        *self.upstream.write().unwrap_or_else(|e| e.into_inner()) = url;
    }
}

/// The error that makes hyper close the connection without an answer.
#[derive(Debug)]
struct Dropped;
impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("response dropped on purpose")
    }
}
impl std::error::Error for Dropped {}

fn plain(status: StatusCode, retry_after: bool, body: &'static str) -> Response<Full<Bytes>> {
    let mut b = Response::builder()
        .status(status)
        .header("content-type", "application/problem+json");
    if retry_after {
        b = b.header("retry-after", "1");
    }
    b.body(Full::new(Bytes::from_static(body.as_bytes())))
        .unwrap_or_default()
}

async fn handle(
    req: Request<Incoming>,
    draw: u64,
    faults: Faults,
    upstream: &RwLock<String>,
    stats: &ProxyStats,
    client: &reqwest::Client,
) -> Result<Response<Full<Bytes>>, Dropped> {
    if draw < faults.unavailable_pct {
        stats.unavailable.fetch_add(1, Ordering::Relaxed);
        return Ok(plain(
            StatusCode::SERVICE_UNAVAILABLE,
            true,
            r#"{"status":503,"code":"injected_unavailable","retryable":true}"#,
        ));
    }
    let drop_response = draw < faults.unavailable_pct + faults.drop_pct;
    let base = upstream.read().unwrap_or_else(|e| e.into_inner()).clone();
    let (parts, body) = req.into_parts();
    let Ok(body) = body.collect().await.map(|b| b.to_bytes()) else {
        return Err(Dropped);
    };
    let uri = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    let mut out = client.request(parts.method.clone(), format!("{base}{uri}"));
    for (name, value) in &parts.headers {
        if name != "host" && name != "content-length" {
            out = out.header(name, value);
        }
    }
    let resp = match out.body(body).send().await {
        Ok(r) => r,
        Err(_) => {
            stats.upstream_down.fetch_add(1, Ordering::Relaxed);
            return Ok(plain(
                StatusCode::BAD_GATEWAY,
                false,
                r#"{"status":502,"code":"upstream_down","retryable":true}"#,
            ));
        }
    };
    let status = resp.status();
    let headers = resp.headers().clone();
    let bytes = resp.bytes().await.unwrap_or_default();
    if drop_response {
        stats.dropped.fetch_add(1, Ordering::Relaxed);
        return Err(Dropped);
    }
    stats.forwarded.fetch_add(1, Ordering::Relaxed);
    let has = |code: &str| bytes.windows(code.len()).any(|w| w == code.as_bytes());
    if status == StatusCode::CONFLICT && has("\"idempotency_request_in_flight\"") {
        stats.in_flight.fetch_add(1, Ordering::Relaxed);
    }
    if status == StatusCode::SERVICE_UNAVAILABLE && has("\"server_shutting_down\"") {
        stats.shutting_down.fetch_add(1, Ordering::Relaxed);
    }
    let mut r = Response::builder().status(status);
    for (name, value) in &headers {
        if name != "transfer-encoding" && name != "connection" && name != "content-length" {
            r = r.header(name, value);
        }
    }
    Ok(r.body(Full::new(bytes)).unwrap_or_default())
}
