//! Replay fidelity: the same request after completion gets the same response.

use super::{Baseline, REPLAY_FIDELITY, Rec, delta, executed_again, ident};
use crate::audit::anti_patterns::{KEY_IGNORED, REPLAY_DIFFERS, REPLAY_DROPS_HEADERS};
use crate::audit::probe::{Key, Prober, fresh_value, is_significant};
use crate::audit::report::{CheckResult, Status};
use http::HeaderMap;

const TITLE: &str = "a completed request sent again replays the same status, body and headers";

/// Sends the configured request with a fresh key (the baseline), then again with the same key.
pub(crate) async fn replay_fidelity(p: &Prober) -> (CheckResult, Option<Baseline>) {
    let (mut result, mut baseline) = replay_inner(p).await;
    if let Some(b) = baseline.as_mut() {
        b.replays =
            result.status != Status::Inconclusive && result.anti_pattern != Some(KEY_IGNORED);
        let cookies = b.original.set_cookie_names();
        if result.anti_pattern == Some(KEY_IGNORED) && !cookies.is_empty() && !p.cookies_on() {
            result.detail.push_str(&format!(
                " The responses set cookies ({}) and the audit did not send them back: if the \
                 API keeps its idempotency records in the caller's session, audit it again with \
                 cookies on (--cookies).",
                cookies.join(", ")
            ));
        }
    }
    (result, baseline)
}

async fn replay_inner(p: &Prober) -> (CheckResult, Option<Baseline>) {
    let mut r = Rec::new(REPLAY_FIDELITY, TITLE);
    let key = fresh_value();
    let probe = p.probe(Key::One(key.clone()));
    let original = match r.send(p, &probe).await {
        Ok(ex) => ex,
        Err(e) => {
            return (
                r.inconclusive(format!("the first request got no response: {e}")),
                None,
            );
        }
    };
    if !original.status.is_success() {
        let detail = format!(
            "the endpoint answered {} to the configured request, so there is nothing to replay; \
             the audit needs a request that succeeds (check the body, the credential and the \
             path). The checks that build on this request are inconclusive too.",
            original.status
        );
        return (r.inconclusive(detail), None);
    }
    let before = r.count(p).await;
    let replay = r.send(p, &probe).await;
    let after = r.count(p).await;
    let mut baseline = Baseline {
        key,
        original,
        replay: None,
        replays: false,
    };
    let replay = match replay {
        Ok(ex) => {
            baseline.replay = Some(ex.clone());
            ex
        }
        Err(e) => {
            return (
                r.inconclusive(format!("the replay got no response: {e}")),
                Some(baseline),
            );
        }
    };
    let original = &baseline.original;
    let d = delta(before, after);

    if replay.status != original.status || replay.body != original.body {
        let what = if replay.status != original.status {
            format!("status {} became {}", original.status, replay.status)
        } else {
            format!(
                "the body changed ({} became {})",
                ident(original),
                ident(&replay)
            )
        };
        let result = if executed_again(original, &replay, d) == Some(true) {
            r.fail(
                KEY_IGNORED,
                format!("the same request with the same key, sent after the first completed, ran again: {what}."),
            )
        } else {
            r.fail(
                REPLAY_DIFFERS,
                format!("the replay is not the original response: {what}."),
            )
        };
        return (result, Some(baseline));
    }
    if d.is_some_and(|d| d > 0) {
        let detail = format!(
            "the response was identical, but the count URL grew by {} : the request ran again.",
            d.unwrap_or_default()
        );
        return (r.fail(KEY_IGNORED, detail), Some(baseline));
    }
    let differences = header_differences(&original.headers, &replay.headers);
    if !differences.is_empty() {
        let detail = format!(
            "same status and body, but the replay's headers differ: {}. A client that reads \
             them (a redirect to the created resource, the media type) sees another response.",
            differences.join("; ")
        );
        return (r.fail(REPLAY_DROPS_HEADERS, detail), Some(baseline));
    }
    let detail = if let Some(marker) = replay.replay_marker() {
        format!(
            "same status ({}), byte-identical body, same significant headers, marked \
             {}: true.",
            replay.status,
            header_case(marker)
        )
    } else {
        format!(
            "same status ({}), byte-identical body, same significant headers. Note: the replay \
             is not marked Idempotent-Replayed: true (recommended, not required by the IETF \
             draft), so clients cannot tell it from a first execution.",
            replay.status
        )
    };
    (r.pass(detail), Some(baseline))
}

/// `x-idempotent-replayed` as `X-Idempotent-Replayed`.
fn header_case(name: &str) -> String {
    name.split('-')
        .map(|w| {
            let mut c = w.chars();
            match c.next() {
                Some(f) => f.to_ascii_uppercase().to_string() + c.as_str(),
                None => String::new(),
            }
        })
        .collect::<Vec<_>>()
        .join("-")
}

/// The significant headers of `original` that `replay` lacks or carries with other values, as
/// human-readable phrases.
pub(crate) fn header_differences(original: &HeaderMap, replay: &HeaderMap) -> Vec<String> {
    let mut out = Vec::new();
    for name in original.keys() {
        if !is_significant(name) {
            continue;
        }
        let o: Vec<&[u8]> = original
            .get_all(name)
            .iter()
            .map(|v| v.as_bytes())
            .collect();
        let r: Vec<&[u8]> = replay.get_all(name).iter().map(|v| v.as_bytes()).collect();
        let show = |vs: &[&[u8]]| {
            vs.iter()
                .map(|v| String::from_utf8_lossy(v).into_owned())
                .collect::<Vec<_>>()
                .join(", ")
        };
        if r.is_empty() {
            out.push(format!("{name} dropped (was {:?})", show(&o)));
        } else if o != r {
            out.push(format!("{name} {:?} became {:?}", show(&o), show(&r)));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn finds_dropped_and_changed_headers_only() {
        let mut o = HeaderMap::new();
        o.insert("location", HeaderValue::from_static("/p/1"));
        o.insert("x-status", HeaderValue::from_static("captured"));
        o.append("link", HeaderValue::from_static("<a>"));
        o.append("link", HeaderValue::from_static("<b>"));
        o.insert("date", HeaderValue::from_static("d1"));
        o.insert("x-request-id", HeaderValue::from_static("r1"));
        let mut r = HeaderMap::new();
        r.insert("x-status", HeaderValue::from_static("pending"));
        r.append("link", HeaderValue::from_static("<b>"));
        r.append("link", HeaderValue::from_static("<a>"));
        r.insert("date", HeaderValue::from_static("d2"));
        r.insert("x-request-id", HeaderValue::from_static("r2"));
        let d = header_differences(&o, &r);
        assert_eq!(
            d,
            vec![
                r#"location dropped (was "/p/1")"#.to_owned(),
                r#"x-status "captured" became "pending""#.to_owned(),
                r#"link "<a>, <b>" became "<b>, <a>""#.to_owned(),
            ]
        );
        assert!(header_differences(&o, &o).is_empty());
    }
}
