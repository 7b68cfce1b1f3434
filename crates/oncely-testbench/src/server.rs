//! The fault server: HTTP/1.1 over tokio TCP, one scripted step per attempt.
//!
//! Requests are parsed with `httparse` (hyper's parser); answers are written by hand, because the
//! faults are exactly what an HTTP server library is built to prevent: a `content-length` that is
//! never honoured, a TCP reset instead of an answer (`SO_LINGER` 0, then close), an answer that
//! never comes, a body trickled out in chunks. While it waits (a delay, a hang, between slow
//! chunks) the testbench keeps reading the socket, so it notices at once when the client gives
//! up and closes, and reports that moment as the attempt's end.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::task::JoinHandle;

use crate::date;
use crate::report::{Answer, Recorded, Runs};
use crate::scenario::{
    FORMAT, Fault, HeaderValue, NamedFault, Scenario, ScenarioFile, Step, StepBody,
};

/// The header naming the scenario.
pub const SCENARIO_HEADER: &str = "x-oncely-scenario";
/// The header naming the run (attempts are counted per run and call).
pub const RUN_HEADER: &str = "x-oncely-run";
/// The header giving the call index.
pub const CALL_HEADER: &str = "x-oncely-call";
/// How long a `hang` step waits for the client to give up before closing, in seconds.
pub const HANG_LIMIT: Duration = Duration::from_secs(120);

/// Largest request head read, in bytes (64 KiB).
const MAX_HEAD: usize = 64 * 1024;
/// Largest request body read, in bytes (16 MiB).
const MAX_BODY: usize = 16 * 1024 * 1024;

struct State {
    /// Per `http` scenario id, per call index (after `repeat`), the steps.
    steps: HashMap<String, Vec<Vec<Step>>>,
    scenarios: usize,
    runs: Runs,
    refused_url: String,
}

/// A running testbench. Dropping it stops the server.
pub struct Testbench {
    url: String,
    refused_url: String,
    addr: SocketAddr,
    state: Arc<State>,
    task: JoinHandle<()>,
    /// Bound and never listening: connecting to it is refused. Kept so no one else takes the port.
    _refused: TcpSocket,
}

impl std::fmt::Debug for Testbench {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Testbench")
            .field("url", &self.url)
            .field("refused_url", &self.refused_url)
            .finish_non_exhaustive()
    }
}

impl Drop for Testbench {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Testbench {
    /// Binds `addr` (port 0 picks a free one) and serves `file`'s `http` scenarios until dropped.
    /// Also reserves a loopback port where nothing listens ([`Testbench::refused_url`]).
    ///
    /// # Errors
    ///
    /// The address cannot be bound.
    pub async fn start(addr: SocketAddr, file: &ScenarioFile) -> std::io::Result<Self> {
        let listener = TcpListener::bind(addr).await?;
        let addr = listener.local_addr()?;
        let refused = TcpSocket::new_v4()?;
        refused.bind(SocketAddr::from(([127, 0, 0, 1], 0)))?;
        let refused_url = format!("http://{}", refused.local_addr()?);
        let mut steps = HashMap::new();
        for s in &file.scenarios {
            if let Scenario::Http(h) = s {
                let calls = h
                    .expanded_calls()
                    .into_iter()
                    .map(|c| c.server.clone())
                    .collect();
                steps.insert(h.id.clone(), calls);
            }
        }
        let state = Arc::new(State {
            steps,
            scenarios: file.scenarios.len(),
            runs: Runs::default(),
            refused_url: refused_url.clone(),
        });
        let shared = state.clone();
        let task = tokio::spawn(async move {
            loop {
                match listener.accept().await {
                    Ok((stream, _)) => {
                        let _ = stream.set_nodelay(true);
                        tokio::spawn(connection(stream, shared.clone()));
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "testbench: accept failed");
                        tokio::time::sleep(Duration::from_millis(10)).await;
                    }
                }
            }
        });
        Ok(Self {
            url: format!("http://{addr}"),
            refused_url,
            addr,
            state,
            task,
            _refused: refused,
        })
    }

    /// The base URL, `http://IP:PORT`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A loopback URL where nothing listens: every connection is refused, nothing is sent.
    pub fn refused_url(&self) -> &str {
        &self.refused_url
    }

    /// The report of a run, as `GET /_testbench/runs/<run>` gives it.
    pub fn report(&self, run: &str) -> crate::report::RunReport {
        self.state.runs.report(run)
    }

    /// Serves until the task ends (it does not end by itself: kill the process, or drop the
    /// future).
    pub async fn wait(mut self) {
        let task = std::mem::replace(&mut self.task, tokio::spawn(async {}));
        let _ = task.await;
    }
}

/// A parsed request.
struct Request {
    method: String,
    path: String,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    arrived: Instant,
    close: bool,
}

impl Request {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

enum ReadError {
    /// The peer closed (cleanly or not) before a whole request.
    Closed,
    /// Malformed or too large: answer 400/413 and close.
    Bad(u16, String),
}

async fn connection(mut stream: TcpStream, state: Arc<State>) {
    let mut buf = Vec::with_capacity(8192);
    loop {
        let req = match read_request(&mut stream, &mut buf).await {
            Ok(r) => r,
            Err(ReadError::Closed) => return,
            Err(ReadError::Bad(status, why)) => {
                let _ = write_json(&mut stream, status, &problem(status, &why), true).await;
                return;
            }
        };
        let keep = if req.path.starts_with("/_testbench/") || req.path == "/_testbench" {
            control(&mut stream, &state, &req).await
        } else {
            scenario_request(&mut stream, &mut buf, &state, req).await
        };
        if !keep {
            return;
        }
    }
}

async fn read_more(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Result<(), ReadError> {
    let mut chunk = [0u8; 16 * 1024];
    match stream.read(&mut chunk).await {
        Ok(0) | Err(_) => Err(ReadError::Closed),
        Ok(n) => {
            buf.extend_from_slice(&chunk[..n]);
            Ok(())
        }
    }
}

async fn read_request(stream: &mut TcpStream, buf: &mut Vec<u8>) -> Result<Request, ReadError> {
    let (method, path, headers, head_len) = loop {
        let mut slots = [httparse::EMPTY_HEADER; 128];
        let mut parsed = httparse::Request::new(&mut slots);
        match parsed.parse(buf) {
            Ok(httparse::Status::Complete(n)) => {
                let headers = parsed
                    .headers
                    .iter()
                    .map(|h| {
                        (
                            h.name.to_ascii_lowercase(),
                            String::from_utf8_lossy(h.value).into_owned(),
                        )
                    })
                    .collect::<Vec<_>>();
                break (
                    parsed.method.unwrap_or("GET").to_owned(),
                    parsed.path.unwrap_or("/").to_owned(),
                    headers,
                    n,
                );
            }
            Ok(httparse::Status::Partial) => {
                if buf.len() > MAX_HEAD {
                    return Err(ReadError::Bad(431, "request head over 64 KiB".into()));
                }
                read_more(stream, buf).await?;
            }
            Err(e) => return Err(ReadError::Bad(400, format!("malformed request: {e}"))),
        }
    };
    let arrived = Instant::now();
    buf.drain(..head_len);
    let find = |name: &str| {
        headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.trim().to_ascii_lowercase())
    };
    let chunked = find("transfer-encoding").is_some_and(|v| v.ends_with("chunked"));
    let body = if chunked {
        loop {
            match decode_chunked(buf) {
                Ok(Some((body, used))) => {
                    buf.drain(..used);
                    break body;
                }
                Ok(None) if buf.len() > MAX_BODY => {
                    return Err(ReadError::Bad(413, "request body over 16 MiB".into()));
                }
                Ok(None) => read_more(stream, buf).await?,
                Err(why) => return Err(ReadError::Bad(400, why)),
            }
        }
    } else {
        let len = match find("content-length") {
            None => 0,
            Some(v) => v
                .parse::<usize>()
                .map_err(|_| ReadError::Bad(400, "bad content-length".into()))?,
        };
        if len > MAX_BODY {
            return Err(ReadError::Bad(413, "request body over 16 MiB".into()));
        }
        while buf.len() < len {
            read_more(stream, buf).await?;
        }
        buf.drain(..len).collect()
    };
    let close = find("connection").is_some_and(|v| v.contains("close"));
    Ok(Request {
        method,
        path,
        headers,
        body,
        arrived,
        close,
    })
}

/// Decodes a whole chunked body from the start of `buf`: `Ok(None)` if more bytes are needed,
/// else the body and the bytes used (trailers skipped).
fn decode_chunked(buf: &[u8]) -> Result<Option<(Vec<u8>, usize)>, String> {
    let mut body = Vec::new();
    let mut pos = 0;
    loop {
        let (used, size) = match httparse::parse_chunk_size(&buf[pos..]) {
            Ok(httparse::Status::Complete(c)) => c,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(_) => return Err("malformed chunk size".into()),
        };
        pos += used;
        let size = usize::try_from(size).map_err(|_| "chunk too large".to_owned())?;
        if size == 0 {
            let rest = &buf[pos..];
            if rest.starts_with(b"\r\n") {
                return Ok(Some((body, pos + 2)));
            }
            return Ok(rest
                .windows(4)
                .position(|w| w == b"\r\n\r\n")
                .map(|i| (body, pos + i + 4)));
        }
        if buf.len() < pos + size + 2 {
            return Ok(None);
        }
        body.extend_from_slice(&buf[pos..pos + size]);
        if &buf[pos + size..pos + size + 2] != b"\r\n" {
            return Err("chunk not followed by CRLF".into());
        }
        pos += size + 2;
        if body.len() > MAX_BODY {
            return Err("request body over 16 MiB".into());
        }
    }
}

fn problem(status: u16, detail: &str) -> serde_json::Value {
    serde_json::json!({
        "type": "about:blank",
        "title": reason(status),
        "status": status,
        "detail": detail,
    })
}

fn reason(status: u16) -> &'static str {
    http::StatusCode::from_u16(status)
        .ok()
        .and_then(|s| s.canonical_reason())
        .unwrap_or("Unknown")
}

async fn write_json(
    stream: &mut TcpStream,
    status: u16,
    value: &serde_json::Value,
    close: bool,
) -> std::io::Result<()> {
    let body = serde_json::to_vec_pretty(value).unwrap_or_default();
    let ctype = if status >= 400 {
        "application/problem+json"
    } else {
        "application/json"
    };
    let head = format!(
        "HTTP/1.1 {status} {}\r\ncontent-type: {ctype}\r\ncontent-length: {}\r\n{}\r\n",
        reason(status),
        body.len(),
        if close { "connection: close\r\n" } else { "" }
    );
    stream.write_all(head.as_bytes()).await?;
    stream.write_all(&body).await?;
    stream.flush().await
}

/// The control endpoints; returns whether to keep the connection.
async fn control(stream: &mut TcpStream, state: &State, req: &Request) -> bool {
    let path = req.path.split('?').next().unwrap_or_default();
    let rest = path.trim_start_matches("/_testbench");
    let (status, value) = match (req.method.as_str(), rest) {
        ("GET", "/info") => (
            200,
            serde_json::json!({
                "format": FORMAT,
                "scenarios": state.scenarios,
                "refused_url": state.refused_url,
            }),
        ),
        ("GET", r) if r.starts_with("/runs/") => {
            let run = &r["/runs/".len()..];
            (
                200,
                serde_json::to_value(state.runs.report(run)).unwrap_or_default(),
            )
        }
        ("DELETE", r) if r.starts_with("/runs/") => {
            let run = &r["/runs/".len()..];
            state.runs.forget(run);
            (200, serde_json::json!({ "forgotten": run }))
        }
        _ => (
            404,
            problem(
                404,
                "unknown control endpoint: GET /_testbench/info, GET or DELETE /_testbench/runs/<run>",
            ),
        ),
    };
    write_json(stream, status, &value, req.close).await.is_ok() && !req.close
}

fn valid_run(run: &str) -> bool {
    (1..=128).contains(&run.len())
        && run
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
}

/// A scripted request; returns whether to keep the connection.
async fn scenario_request(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    state: &State,
    req: Request,
) -> bool {
    let scenario = req.header(SCENARIO_HEADER).map(str::to_owned);
    let run = req.header(RUN_HEADER).map(str::to_owned);
    let call = req.header(CALL_HEADER).map(|c| c.trim().parse::<u32>());
    let (scenario, run, call) = match (scenario, run, call) {
        (Some(s), Some(r), Some(Ok(c))) if valid_run(&r) => (s, r, c),
        _ => {
            let why = format!(
                "a scripted request needs {SCENARIO_HEADER}, {RUN_HEADER} (1 to 128 of [A-Za-z0-9._-]) and {CALL_HEADER} (a call index)"
            );
            return write_json(stream, 400, &problem(400, &why), req.close)
                .await
                .is_ok()
                && !req.close;
        }
    };
    let Some(steps) = state
        .steps
        .get(&scenario)
        .and_then(|calls| calls.get(call as usize))
        .filter(|s| !s.is_empty())
    else {
        let why = format!(
            "no http scenario {scenario:?} with server steps for call {call} in this testbench's file"
        );
        return write_json(stream, 400, &problem(400, &why), req.close)
            .await
            .is_ok()
            && !req.close;
    };
    let recorded = Recorded {
        call,
        attempt: 0,
        step: 0,
        method: req.method.clone(),
        path: req.path.clone(),
        headers: req.headers.clone(),
        body_len: req.body.len(),
        body_sha256: hex::encode(Sha256::digest(&req.body)),
        arrived: req.arrived,
        ended: None,
        answer: Answer::InProgress,
    };
    let last = steps.len() - 1;
    let (attempt, index, slot) = state
        .runs
        .arrive(&run, &scenario, recorded, |n| (n as usize - 1).min(last));
    let step = &steps[index];
    let answer = play(stream, buf, step, attempt, req.method == "HEAD").await;
    if answer == Answer::Reset {
        // SO_LINGER 0: the close that follows (the connection is dropped) sends a RST.
        if let Err(e) = stream.set_zero_linger() {
            tracing::warn!(error = %e, "testbench: SO_LINGER 0 failed; the close will be a FIN");
        }
    }
    state.runs.finish(&slot, answer);
    answer == Answer::Complete && !req.close
}

/// Reads until the peer closes (EOF or an error), keeping any bytes it sends (a pipelined
/// request) in `buf`.
async fn closed(read: &mut ReadHalf<'_>, buf: &mut Vec<u8>) {
    let mut chunk = [0u8; 4096];
    loop {
        match read.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

/// Waits `d`, or until the peer closes; `false` if it closed.
async fn wait_open(read: &mut ReadHalf<'_>, buf: &mut Vec<u8>, d: Duration) -> bool {
    tokio::select! {
        () = tokio::time::sleep(d) => true,
        () = closed(read, buf) => false,
    }
}

fn head(step: &Step, attempt: u32, body_len: usize) -> String {
    let status = step.status;
    let mut out = format!("HTTP/1.1 {status} {}\r\n", reason(status));
    let mut has_type = false;
    for (name, value) in &step.headers {
        let value = match value {
            HeaderValue::Literal(v) => v.clone(),
            HeaderValue::Template(t) => date::format(
                date::whole_second_after(SystemTime::now(), t.http_date.in_ms),
                t.http_date.form,
            ),
        };
        has_type |= name.eq_ignore_ascii_case("content-type");
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    if !has_type && matches!(step.body, Some(StepBody::Json { .. })) {
        out.push_str("content-type: application/json\r\n");
    }
    if !(status < 200 || status == 204 || status == 304) {
        out.push_str(&format!("content-length: {body_len}\r\n"));
    }
    out.push_str(&format!("x-oncely-attempt: {attempt}\r\n\r\n"));
    out
}

async fn send(write: &mut WriteHalf<'_>, bytes: &[u8]) -> std::io::Result<()> {
    write.write_all(bytes).await?;
    write.flush().await
}

/// Plays one step on the connection.
async fn play(
    stream: &mut TcpStream,
    buf: &mut Vec<u8>,
    step: &Step,
    attempt: u32,
    head_only: bool,
) -> Answer {
    let (mut read, mut write) = stream.split();
    if step.delay_ms > 0 && !wait_open(&mut read, buf, Duration::from_millis(step.delay_ms)).await {
        return Answer::ClientClosed;
    }
    match &step.fault {
        Some(Fault::Named(NamedFault::Reset)) => return Answer::Reset,
        Some(Fault::Named(NamedFault::Hang)) => {
            return if wait_open(&mut read, buf, HANG_LIMIT).await {
                Answer::Abandoned
            } else {
                Answer::ClientClosed
            };
        }
        _ => {}
    }
    let body = step.body.as_ref().map(StepBody::bytes).unwrap_or_default();
    let head = head(step, attempt, body.len());
    let body: &[u8] = if head_only { &[] } else { &body };
    match &step.fault {
        Some(Fault::CutOff {
            cut_off_after_bytes,
        }) => {
            let n = (*cut_off_after_bytes).min(body.len());
            let mut bytes = head.into_bytes();
            bytes.extend_from_slice(&body[..n]);
            if send(&mut write, &bytes).await.is_err() {
                return Answer::ClientClosed;
            }
            let _ = write.shutdown().await;
            Answer::CutOff
        }
        Some(Fault::Slow { slow_body }) => {
            if send(&mut write, head.as_bytes()).await.is_err() {
                return Answer::ClientClosed;
            }
            let chunks: Vec<&[u8]> = body.chunks(slow_body.chunk_bytes.max(1)).collect();
            for (i, chunk) in chunks.iter().enumerate() {
                if i > 0
                    && !wait_open(&mut read, buf, Duration::from_millis(slow_body.interval_ms))
                        .await
                {
                    return Answer::ClientClosed;
                }
                if send(&mut write, chunk).await.is_err() {
                    return Answer::ClientClosed;
                }
            }
            Answer::Complete
        }
        _ => {
            let mut bytes = head.into_bytes();
            bytes.extend_from_slice(body);
            match send(&mut write, &bytes).await {
                Ok(()) => Answer::Complete,
                Err(_) => Answer::ClientClosed,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunked_bodies_decode_with_and_without_trailers() {
        assert_eq!(
            decode_chunked(b"5\r\nhello\r\n6\r\n world\r\n0\r\n\r\nGET"),
            Ok(Some((b"hello world".to_vec(), 26)))
        );
        assert_eq!(
            decode_chunked(b"3\r\nabc\r\n0\r\nx-t: 1\r\n\r\n"),
            Ok(Some((b"abc".to_vec(), 21)))
        );
        assert_eq!(decode_chunked(b"5\r\nhel"), Ok(None));
        assert_eq!(decode_chunked(b"3\r\nabc\r\n0\r\n"), Ok(None));
        assert!(decode_chunked(b"zz\r\n").is_err());
    }

    #[test]
    fn run_ids_are_checked() {
        assert!(valid_run("py-post-503-1a2b.c_d"));
        assert!(!valid_run(""));
        assert!(!valid_run("a/b"));
        assert!(!valid_run(&"a".repeat(129)));
    }
}
