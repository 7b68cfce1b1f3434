//! How requests and bodies are written as evidence lines: credentials named, never printed;
//! bodies cut to 200 characters.

use super::request::{Cred, Key, Probe};
use crate::audit::config::KeyPlacement;
use bytes::Bytes;
use http::HeaderValue;
use reqwest::Url;

/// Bodies are shown in evidence up to this many characters.
const EVIDENCE_BODY_CHARS: usize = 200;

/// A key value as evidence: quoted, non-printable bytes escaped, a key over 60 bytes cut to
/// its first 24 with its length.
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
