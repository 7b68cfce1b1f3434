//! Writing an answer: the JSON and problem+json answers of the control endpoints, and one
//! scripted step played on the connection, faults included.

use std::time::{Duration, SystemTime};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::net::tcp::{ReadHalf, WriteHalf};

use super::HANG_LIMIT;
use crate::date;
use crate::report::Answer;
use crate::scenario::{Fault, HeaderValue, NamedFault, Step, StepBody};

pub(super) fn problem(status: u16, detail: &str) -> serde_json::Value {
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

pub(super) async fn write_json(
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
pub(super) async fn play(
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
