//! A real local HTTP server (axum on 127.0.0.1, ephemeral port) that records every request that
//! reaches it, and a virtual clock for waits too long to sleep for real.

#![allow(dead_code, unreachable_pub)]

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use bytes::Bytes;
use http::{HeaderName, HeaderValue, Method, StatusCode};
use oncely_client::timer::{Sleep, Timer};

/// One request as the server saw it.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: Method,
    pub path: String,
    pub key: Option<String>,
    pub body: Bytes,
    pub at: Instant,
    /// 1-based index of this request among those to the same path.
    pub nth_path: u32,
    /// 1-based index of this request among those with the same key (0 without a key).
    pub nth_key: u32,
}

/// What the server answers.
#[derive(Clone, Debug)]
pub struct Reply {
    pub status: StatusCode,
    pub headers: Vec<(HeaderName, String)>,
    pub body: Bytes,
    pub delay: Duration,
}

impl Reply {
    pub fn status(status: u16) -> Self {
        Self {
            status: StatusCode::from_u16(status).unwrap(),
            headers: Vec::new(),
            body: Bytes::new(),
            delay: Duration::ZERO,
        }
    }

    pub fn header(mut self, name: &'static str, value: impl Into<String>) -> Self {
        self.headers
            .push((HeaderName::from_static(name), value.into()));
        self
    }

    pub fn problem(self, code: &str, retryable: bool) -> Self {
        let status = self.status.as_u16();
        let body = format!(
            r#"{{"type":"https://example.invalid/problems/{code}","title":"{code}","status":{status},"detail":"test","code":"{code}","retryable":{retryable}}}"#
        );
        let mut r = self.header("content-type", "application/problem+json");
        r.body = Bytes::from(body);
        r
    }

    pub fn body(mut self, body: &'static str) -> Self {
        self.body = Bytes::from_static(body.as_bytes());
        self
    }

    /// Answer only after this delay (a slow or hung server).
    pub fn after(mut self, delay: Duration) -> Self {
        self.delay = delay;
        self
    }
}

type Responder = dyn Fn(&Seen) -> Reply + Send + Sync;

struct Inner {
    seen: Mutex<Vec<Seen>>,
    responder: Box<Responder>,
}

/// The server handle.
#[derive(Clone)]
pub struct TestServer {
    pub base: String,
    inner: Arc<Inner>,
}

async fn handle(State(inner): State<Arc<Inner>>, req: axum::extract::Request) -> Response {
    let (parts, body) = req.into_parts();
    let body = axum::body::to_bytes(body, usize::MAX)
        .await
        .unwrap_or_default();
    let key = parts
        .headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let path = parts.uri.path().to_owned();
    let reply = {
        let mut seen = inner.seen.lock().unwrap();
        let nth_path = seen.iter().filter(|s| s.path == path).count() as u32 + 1;
        let nth_key = match &key {
            Some(k) => seen.iter().filter(|s| s.key.as_ref() == Some(k)).count() as u32 + 1,
            None => 0,
        };
        let s = Seen {
            method: parts.method.clone(),
            path,
            key,
            body,
            at: Instant::now(),
            nth_path,
            nth_key,
        };
        let reply = (inner.responder)(&s);
        seen.push(s);
        reply
    };
    if !reply.delay.is_zero() {
        tokio::time::sleep(reply.delay).await;
    }
    let mut response = Response::new(Body::from(reply.body));
    *response.status_mut() = reply.status;
    for (name, value) in reply.headers {
        response
            .headers_mut()
            .append(name, HeaderValue::from_str(&value).unwrap());
    }
    response
}

impl TestServer {
    pub async fn start(responder: impl Fn(&Seen) -> Reply + Send + Sync + 'static) -> Self {
        let inner = Arc::new(Inner {
            seen: Mutex::new(Vec::new()),
            responder: Box::new(responder),
        });
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(inner.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self {
            base: format!("http://{addr}"),
            inner,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub fn seen(&self) -> Vec<Seen> {
        self.inner.seen.lock().unwrap().clone()
    }

    pub fn seen_on(&self, path: &str) -> Vec<Seen> {
        self.seen().into_iter().filter(|s| s.path == path).collect()
    }

    pub fn count(&self, path: &str) -> usize {
        self.seen_on(path).len()
    }
}

/// A clock whose sleeps return at once and advance its own time: checks a 120-second
/// `Retry-After` against a real server without waiting 120 seconds.
#[derive(Clone, Debug, Default)]
pub struct VirtualClock {
    offset: Arc<Mutex<Duration>>,
    sleeps: Arc<Mutex<Vec<Duration>>>,
}

impl VirtualClock {
    pub fn sleeps(&self) -> Vec<Duration> {
        self.sleeps.lock().unwrap().clone()
    }
}

impl Timer for VirtualClock {
    fn now(&self) -> Instant {
        Instant::now() + *self.offset.lock().unwrap()
    }

    fn system_now(&self) -> SystemTime {
        SystemTime::now() + *self.offset.lock().unwrap()
    }

    fn sleep(&self, duration: Duration) -> Sleep {
        self.sleeps.lock().unwrap().push(duration);
        *self.offset.lock().unwrap() += duration;
        Box::pin(std::future::ready(()))
    }
}

/// A Retry-After HTTP-date `secs` seconds from now, in one of the three RFC 9110 forms.
pub fn http_date_in(secs: u64, form: DateForm) -> String {
    let imf = httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(secs));
    // "Sun, 06 Nov 1994 08:49:37 GMT"
    let parts: Vec<&str> = imf.split_whitespace().collect();
    let (wkday, day, month, year, time) = (
        parts[0].trim_end_matches(','),
        parts[1],
        parts[2],
        parts[3],
        parts[4],
    );
    match form {
        DateForm::Imf => imf,
        DateForm::Rfc850 => {
            let long = match wkday {
                "Mon" => "Monday",
                "Tue" => "Tuesday",
                "Wed" => "Wednesday",
                "Thu" => "Thursday",
                "Fri" => "Friday",
                "Sat" => "Saturday",
                _ => "Sunday",
            };
            format!("{long}, {day}-{month}-{} {time} GMT", &year[2..])
        }
        DateForm::Asctime => {
            let day: u32 = day.parse().unwrap();
            format!("{wkday} {month} {day:>2} {time} {year}")
        }
    }
}

#[derive(Clone, Copy, Debug)]
pub enum DateForm {
    Imf,
    Rfc850,
    Asctime,
}

/// One step of a raw HTTP/1.1 answer written by [`RawServer`].
#[derive(Clone, Debug)]
pub enum Step {
    Write(Vec<u8>),
    Sleep(Duration),
}

/// A request as the raw server parsed it.
#[derive(Clone, Debug)]
pub struct RawSeen {
    pub method: String,
    pub path: String,
    pub key: Option<String>,
    /// Every `Idempotency-Key` value received (to see a repeated header).
    pub keys: Vec<String>,
}

type RawResponder = dyn Fn(usize, &RawSeen) -> Vec<Step> + Send + Sync;

/// A TCP server on 127.0.0.1 that parses each request's head and body, then plays a script of
/// raw writes and pauses and closes the connection: broken, slow, cut-off and chunked bodies
/// that axum would not produce on purpose.
#[derive(Clone)]
pub struct RawServer {
    pub base: String,
    seen: Arc<Mutex<Vec<RawSeen>>>,
}

impl RawServer {
    pub async fn start(
        script: impl Fn(usize, &RawSeen) -> Vec<Step> + Send + Sync + 'static,
    ) -> Self {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let seen: Arc<Mutex<Vec<RawSeen>>> = Arc::default();
        let script: Arc<RawResponder> = Arc::new(script);
        let s = seen.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut socket, _)) = listener.accept().await else {
                    return;
                };
                let seen = s.clone();
                let script = script.clone();
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    let head_end = loop {
                        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break i + 4;
                        }
                        match socket.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
                    let mut lines = head.split("\r\n");
                    let mut first = lines.next().unwrap_or("").split(' ');
                    let method = first.next().unwrap_or("").to_owned();
                    let path = first.next().unwrap_or("").to_owned();
                    let mut keys = Vec::new();
                    let mut length = 0usize;
                    for line in lines {
                        if let Some((name, value)) = line.split_once(':') {
                            let value = value.trim().to_owned();
                            match name.trim().to_ascii_lowercase().as_str() {
                                "idempotency-key" => keys.push(value),
                                "content-length" => length = value.parse().unwrap_or(0),
                                _ => {}
                            }
                        }
                    }
                    while buf.len() < head_end + length {
                        match socket.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let request = RawSeen {
                        method,
                        path,
                        key: keys.first().cloned(),
                        keys,
                    };
                    let steps = {
                        let mut seen = seen.lock().unwrap();
                        let n = seen.len() + 1;
                        let steps = script(n, &request);
                        seen.push(request);
                        steps
                    };
                    for step in steps {
                        match step {
                            Step::Write(bytes) => {
                                if socket.write_all(&bytes).await.is_err() {
                                    return;
                                }
                                let _ = socket.flush().await;
                            }
                            Step::Sleep(d) => tokio::time::sleep(d).await,
                        }
                    }
                    // Closing the connection ends a body that promised more bytes.
                });
            }
        });
        Self {
            base: format!("http://{addr}"),
            seen,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    pub fn seen(&self) -> Vec<RawSeen> {
        self.seen.lock().unwrap().clone()
    }
}

/// A response head with `Connection: close` and the given extra header lines.
pub fn head(status: &str, headers: &[&str]) -> Vec<u8> {
    let mut s = format!("HTTP/1.1 {status}\r\nconnection: close\r\n");
    for h in headers {
        s.push_str(h);
        s.push_str("\r\n");
    }
    s.push_str("\r\n");
    s.into_bytes()
}

/// One chunk of a chunked body.
pub fn chunk(data: &[u8]) -> Vec<u8> {
    let mut out = format!("{:x}\r\n", data.len()).into_bytes();
    out.extend_from_slice(data);
    out.extend_from_slice(b"\r\n");
    out
}
