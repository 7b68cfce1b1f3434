//! Expiry: after the replay window, a reused key is a new request.

use super::{Baseline, EXPIRY, Rec, delta, executed_again, ident};
use crate::audit::anti_patterns::{EXPIRED_KEY_ERROR, NEVER_EXPIRES, PHANTOM_EXECUTION};
use crate::audit::probe::{Key, Prober};
use crate::audit::report::CheckResult;
use std::time::Duration;

/// The wait beyond the window: 10% of it, at least 1 second (clock skew, coarse reapers).
pub(crate) fn margin(window: Duration) -> Duration {
    (window / 10).max(Duration::from_secs(1))
}

/// Waits the window plus [`margin`], then sends the baseline request again with its key.
pub(crate) async fn expiry(
    p: &Prober,
    base: Option<&Baseline>,
    window: Option<Duration>,
) -> CheckResult {
    let mut r = Rec::new(
        EXPIRY,
        "after the replay window, the same key executes as a new request",
    );
    let Some(window) = window else {
        return r.not_applicable("no replay window was given, so expiry was not waited for");
    };
    let Some(base) = base else {
        return r.inconclusive("the baseline request did not succeed (see replay-fidelity)");
    };
    let wait = window + margin(window);
    r.note(format!(
        "waited {} ms (the window plus a margin)",
        wait.as_millis()
    ));
    tokio::time::sleep(wait).await;
    let before = r.count(p).await;
    let res = r.send(p, &p.probe(Key::One(base.key.clone()))).await;
    let after = r.count(p).await;
    let ex = match res {
        Ok(ex) => ex,
        Err(e) => return r.inconclusive(format!("no response: {e}")),
    };
    let o = &base.original;
    if !ex.status.is_success() {
        return r.fail(
            EXPIRED_KEY_ERROR,
            format!(
                "after the window the key got {}: a key reused after its window is a brand-new \
                 request, never an error.",
                ex.status
            ),
        );
    }
    let d = delta(before, after);
    // A new id is not enough when the count URL says nothing was created: the ids and the count
    // contradict each other, and the count is what the caller can later read back.
    if d == Some(0)
        && !ex.marked_replay()
        && matches!((o.id(), ex.id()), (Some(a), Some(b)) if a != b)
    {
        return r.fail(
            PHANTOM_EXECUTION,
            format!(
                "after the window the key got {} naming a new resource ({}; the original had \
                 {}), but the count URL did not grow: the new resource was not stored (is the \
                 business row keyed by the idempotency key alone, so the new execution's insert \
                 silently did nothing?).",
                ex.status,
                ident(&ex),
                ident(o)
            ),
        );
    }
    match executed_again(o, &ex, d) {
        Some(true) => r.pass(format!(
            "executed as a new request ({}; the original had {}).",
            ident(&ex),
            ident(o)
        )),
        Some(false) => r.fail(
            NEVER_EXPIRES,
            format!(
                "{} ms after the window the key still replayed the original ({}): the window is \
                 not enforced, or is longer than the {} ms given.",
                margin(window).as_millis(),
                ident(&ex),
                window.as_millis()
            ),
        ),
        None => r.inconclusive(
            "a replay cannot be told from a new execution here: the responses have no id, no \
             Idempotent-Replayed marker, and no count URL was given.",
        ),
    }
}
