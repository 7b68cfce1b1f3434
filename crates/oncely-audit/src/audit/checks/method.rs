//! The method check: does a `PUT`, `PATCH` or `DELETE` endpoint keep the promise of its method?
//!
//! `PUT` and `DELETE` are idempotent by definition (RFC 9110 section 9.2.2): sending one twice
//! must leave the server as sending it once did, so clients, proxies and SDKs retry them freely,
//! without a key. A `PUT` that appends to a log, or a `DELETE` that decrements a counter, breaks
//! that promise, and every one of those retries is a duplicate side effect. `PATCH` promises
//! nothing (RFC 5789 section 2), which is why the key contract requires a key on it.
//!
//! The check sends the same request twice without a key and compares the state after each:
//! the count URL, and a `GET` of the endpoint's own URL (the resource a `PUT` or `DELETE`
//! names). The second request must change nothing the first did not.

use super::{METHOD_IDEMPOTENCY, Rec};
use crate::audit::anti_patterns::{KEY_OPTIONAL, METHOD_NOT_IDEMPOTENT};
use crate::audit::probe::{Cred, Dest, Exchange, Key, Probe, Prober, truncate_body};
use crate::audit::report::CheckResult;
use http::{Method, StatusCode};

/// The state as the check observes it: the count URL's reading and the resource's `GET`.
#[derive(Debug, Clone, PartialEq, Eq)]
struct State {
    count: Option<u64>,
    /// The `GET`'s status and body, when it answered at all.
    resource: Option<(StatusCode, bytes::Bytes)>,
}

/// Sends the request twice without a key; FAIL when the second changed the state again.
pub(crate) async fn method_idempotency(p: &Prober) -> CheckResult {
    let mut r = Rec::new(
        METHOD_IDEMPOTENCY,
        "a PUT, PATCH or DELETE sent twice without a key changes the state once",
    );
    if !matches!(p.method, Method::PUT | Method::PATCH | Method::DELETE) {
        return r.not_applicable(format!(
            "{} promises no idempotency of its own; the key checks cover it",
            p.method
        ));
    }
    let before = observe(&mut r, p).await;
    let probe = p.probe(Key::Absent);
    let first = match r.send(p, &probe).await {
        Ok(ex) => ex,
        Err(e) => return r.inconclusive(format!("no response to the first request: {e}")),
    };
    if !first.status.is_success() {
        return refused(r, p, &first);
    }
    let once = observe(&mut r, p).await;
    let second = match r.send(p, &probe).await {
        Ok(ex) => ex,
        Err(e) => return r.inconclusive(format!("no response to the repeat: {e}")),
    };
    let twice = observe(&mut r, p).await;
    if once.count.is_none() && once.resource.is_none() {
        return r.not_applicable(
            "nothing shows the state: set a count URL, or make the resource readable with a GET of the endpoint's URL",
        );
    }
    let mut changes = Vec::new();
    if let (Some(a), Some(b)) = (once.count, twice.count)
        && a != b
    {
        changes.push(format!(
            "the count URL went from {} to {a} after the first request and to {b} after the repeat",
            before
                .count
                .map_or_else(|| "?".to_owned(), |n| n.to_string())
        ));
    }
    if let (Some((sa, ba)), Some((sb, bb))) = (&once.resource, &twice.resource)
        && (sa != sb || ba != bb)
    {
        changes.push(format!(
            "GET of the resource answered {sa} {} after the first request and {sb} {} after the repeat",
            truncate_body(ba),
            truncate_body(bb)
        ));
    }
    if changes.is_empty() {
        return r.pass(format!(
            "the repeat ({}) left the state as the first request ({}) did",
            second.status, first.status
        ));
    }
    let evidence = changes.join("; ");
    if p.method == Method::PATCH {
        return r.fail(
            KEY_OPTIONAL,
            format!(
                "PATCH is not idempotent by definition (RFC 5789 section 2), and this endpoint accepts it without a key: a keyless retry applied it again ({evidence}). Require an Idempotency-Key on it."
            ),
        );
    }
    r.fail(
        METHOD_NOT_IDEMPOTENT,
        format!(
            "the method promises idempotency; this endpoint is not: {evidence}. {} is idempotent by RFC 9110 section 9.2.2, so clients and proxies retry it without a key; make the second request a no-op (set, do not append or decrement), or require an Idempotency-Key on it.",
            p.method
        ),
    )
}

/// A first request that did not succeed: a required key (`400`) is a PASS (no keyless repeat
/// can happen); anything else leaves nothing to compare.
fn refused(r: Rec, p: &Prober, first: &Exchange) -> CheckResult {
    if first.status == StatusCode::BAD_REQUEST {
        return r.pass(format!(
            "the endpoint refuses a {} without a key ({}{}), so a keyless repeat cannot change anything",
            p.method,
            first.status,
            first
                .error_code()
                .map(|c| format!(", code {c}"))
                .unwrap_or_default()
        ));
    }
    r.inconclusive(format!(
        "the keyless request did not succeed ({}), so there is no effect to repeat",
        first.status
    ))
}

/// Reads the count URL and `GET`s the endpoint's own URL (first credential, no key, no body).
async fn observe(r: &mut Rec, p: &Prober) -> State {
    let count = r.count(p).await;
    let probe = Probe {
        method: Method::GET,
        dest: Dest::Url(p.targets.endpoints[0].clone()),
        key: Key::Absent,
        body: None,
        cred: Cred::First,
        cookies_of: Cred::First,
        extra: Vec::new(),
    };
    // A GET that is not answered, or answered with 405 (no such route), shows nothing.
    let resource = match r.send(p, &probe).await {
        Ok(ex) if ex.status != StatusCode::METHOD_NOT_ALLOWED => Some((ex.status, ex.body)),
        _ => None,
    };
    State { count, resource }
}
