//! How `oncely records` shows records: the list table, the `show` text, the JSON of a record,
//! and times and spans for a person.

use oncely_core::{Record, RecordState, UnixMillis};
use serde_json::{Value, json};
use std::time::Duration;

/// An epoch-milliseconds time as an HTTP date (UTC, to the second) and the milliseconds.
pub fn when(at: UnixMillis) -> String {
    let t = std::time::UNIX_EPOCH + Duration::from_millis(u64::try_from(at).unwrap_or(0));
    format!("{} ({at})", httpdate::fmt_http_date(t))
}

/// A span of milliseconds for a person: `42 s`, `3 min`, `5 h`, `2 d`.
pub fn span(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    match s {
        0..120 => format!("{s} s"),
        120..7200 => format!("{} min", s / 60),
        7200..172_800 => format!("{} h", s / 3600),
        _ => format!("{} d", s / 86_400),
    }
}

/// The state in a few words: `in flight, marked for a person`, `complete 201`...
pub fn status_line(rec: &Record, now: UnixMillis) -> String {
    match &rec.state {
        RecordState::InFlight {
            lease_expires_at, ..
        } if rec.redrives.is_marked() => format!(
            "in flight, marked for a person {} ago",
            span(now - rec.redrives.marked_at.unwrap_or(now))
        ),
        RecordState::InFlight {
            lease_expires_at, ..
        } if *lease_expires_at > now => {
            format!("in flight, lease live for {}", span(lease_expires_at - now))
        }
        RecordState::InFlight {
            lease_expires_at, ..
        } => format!(
            "in flight, abandoned (lease lapsed {} ago)",
            span(now - lease_expires_at)
        ),
        RecordState::Complete { response, .. } => format!("complete {}", response.status),
        RecordState::Released => "released".into(),
        _ => rec.state_name().into(),
    }
}

/// The list table.
pub fn table(records: &[Record], now: UnixMillis) -> String {
    let rows: Vec<[String; 6]> = records
        .iter()
        .map(|r| {
            [
                r.scope.as_str().to_owned(),
                r.key.as_str().to_owned(),
                status_line(r, now),
                r.request
                    .as_ref()
                    .map_or_else(|| "-".into(), |q| format!("{} {}", q.method, q.uri)),
                r.redrives.attempts.to_string(),
                span(now - r.created_at),
            ]
        })
        .collect();
    let head = ["SCOPE", "KEY", "STATE", "REQUEST", "RE-DRIVES", "AGE"];
    let mut widths = head.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let line = |cells: &[String]| {
        let mut out = String::new();
        for (i, (cell, w)) in cells.iter().zip(widths).enumerate() {
            if i + 1 == cells.len() {
                out.push_str(cell);
            } else {
                out.push_str(&format!("{cell:<w$}  "));
            }
        }
        out.trim_end().to_owned() + "\n"
    };
    let mut out = line(&head.map(String::from));
    for row in &rows {
        out.push_str(&line(row));
    }
    out
}

/// Bytes as text when UTF-8, else hex.
fn bytes_text(b: &[u8]) -> Value {
    match std::str::from_utf8(b) {
        Ok(s) => json!(s),
        Err(_) => json!({"hex": hex::encode(b)}),
    }
}

/// Every field of a record, as JSON (the `show` and `list --json` form).
pub fn view(rec: &Record, now: UnixMillis, window: Option<Duration>, body: bool) -> Value {
    let mut v = json!({
        "scope": rec.scope.as_str(),
        "key": rec.key.as_str(),
        "state": rec.state_name(),
        "status": status_line(rec, now),
        "fingerprint": format!("v{}:{}", rec.fingerprint.version(), hex::encode(rec.fingerprint.digest())),
        "fencing_token": rec.token.0,
        "created_at": rec.created_at,
        "expires_at": rec.expires_at,
        "redrives": {
            "attempts": rec.redrives.attempts,
            "next_attempt_at": rec.redrives.next_attempt_at,
            "marked_at": rec.redrives.marked_at,
        },
    });
    if let RecordState::InFlight {
        lease_expires_at,
        recovery_point,
    } = &rec.state
    {
        v["lease_expires_at"] = json!(lease_expires_at);
        v["recovery_point"] = json!(recovery_point);
    }
    if let Some(q) = &rec.request {
        v["request"] = json!({
            "method": q.method,
            "uri": q.uri,
            "headers": q.headers.iter().map(|(n, val)| json!([n, bytes_text(val)])).collect::<Vec<_>>(),
            "body_bytes": q.body.len(),
        });
    }
    if let RecordState::Complete {
        response,
        completed_at,
    } = &rec.state
    {
        v["completed_at"] = json!(completed_at);
        if let Some(w) = window {
            v["replays_until"] =
                json!(completed_at.saturating_add(oncely_core::clock::duration_millis(w)));
        }
        let mut r = json!({
            "status": response.status,
            "headers": response.headers.iter().map(|(n, val)| json!([n, bytes_text(val)])).collect::<Vec<_>>(),
            "body_retained": response.body_retained,
            "body_bytes": response.body.len(),
        });
        if !response.trailers.is_empty() {
            r["trailers"] = json!(
                response
                    .trailers
                    .iter()
                    .map(|(n, val)| json!([n, bytes_text(val)]))
                    .collect::<Vec<_>>()
            );
        }
        if body {
            r["body"] = bytes_text(&response.body);
        }
        v["response"] = r;
    }
    v
}

/// The `show` text: one field a line.
pub fn text(v: &Value) -> String {
    let mut out = String::new();
    let mut line = |name: &str, value: String| out.push_str(&format!("{name:<16}{value}\n"));
    let s = |v: &Value| v.as_str().map_or_else(|| v.to_string(), str::to_owned);
    let t = |v: &Value| v.as_i64().map_or_else(|| "-".to_owned(), when);
    line("scope", s(&v["scope"]));
    line("key", s(&v["key"]));
    line("state", s(&v["status"]));
    line("fingerprint", s(&v["fingerprint"]));
    line("fencing token", v["fencing_token"].to_string());
    line("claimed at", t(&v["created_at"]));
    line("kept until", t(&v["expires_at"]));
    if !v["lease_expires_at"].is_null() {
        line("lease until", t(&v["lease_expires_at"]));
        line(
            "recovery point",
            v["recovery_point"]
                .as_str()
                .unwrap_or("- (none yet)")
                .to_owned(),
        );
    }
    let r = &v["redrives"];
    line(
        "re-drives",
        format!(
            "{} (next not before {})",
            r["attempts"],
            t(&r["next_attempt_at"])
        ),
    );
    line("marked at", t(&r["marked_at"]));
    if let Some(q) = v.get("request") {
        line(
            "request",
            format!(
                "{} {} ({} body bytes)",
                s(&q["method"]),
                s(&q["uri"]),
                q["body_bytes"]
            ),
        );
    }
    if let Some(resp) = v.get("response") {
        line("completed at", t(&v["completed_at"]));
        line("replays until", t(&v["replays_until"]));
        line("status", resp["status"].to_string());
        for h in resp["headers"].as_array().into_iter().flatten() {
            line("header", format!("{}: {}", s(&h[0]), s(&h[1])));
        }
        for h in resp["trailers"].as_array().into_iter().flatten() {
            line("trailer", format!("{}: {}", s(&h[0]), s(&h[1])));
        }
        let retained = if resp["body_retained"] == json!(true) {
            ""
        } else {
            ", not retained: a replay answers idempotency_response_not_retained"
        };
        match resp.get("body") {
            Some(b) => line("body", s(b)),
            None => line(
                "body",
                format!("{} bytes{retained} (--body prints it)", resp["body_bytes"]),
            ),
        }
    }
    out
}
