//! What a transactional handler's response tells the layer ([`ResponseCommitted`],
//! [`PhaseFailed`]), and the answers the layer gives for a transactional phase that did not end
//! as planned.

use oncely_core::{ErrorCode, Problem};

/// Marks the response a transactional handler's transaction committed as the record's (in
/// its extensions): the layer checks that the handler returned it. A handler that returns
/// another response instead has it replaced by the committed one, which every retry replays.
#[derive(Debug, Clone, Copy, Default)]
#[non_exhaustive]
pub struct ResponseCommitted;

/// Left in the extensions of a transactional phase's error response whose answer says nothing
/// of the step committed: what failed (a short phrase, e.g. "the database failed
/// transiently"). When an earlier phase of the request committed a recovery point, "nothing
/// committed" would be false: the layer keeps the record in flight at that recovery point, and
/// answers [`PhaseFailed::stopped_answer`] instead.
#[derive(Debug, Clone, Copy)]
pub struct PhaseFailed(pub &'static str);

impl PhaseFailed {
    /// The answer to a phase that failed after the request committed `recovery_point`:
    /// `503 request_suspended`, retryable, `Retry-After: 1`, whose detail names what failed and
    /// the last committed step (the step's name: a JSON string step, the tag of an externally
    /// tagged enum, or the `step` member of an internally tagged one).
    pub fn stopped_answer(&self, recovery_point: &str) -> Problem {
        let at = step_name(recovery_point).map_or_else(
            || "at its last committed step".to_owned(),
            |s| format!("after its step `{s}`"),
        );
        let detail = format!(
            "{} in a step of this request, and that step rolled back; the steps before it are \
             committed and kept, and the request stopped {at}: retry the same request with the \
             same Idempotency-Key to resume there",
            self.0
        );
        Problem::from_code(ErrorCode::RequestSuspended, &detail).with_retry_after(1)
    }
}

/// A short name for a typed step, if it has one: a JSON string, the one key of an object (an
/// externally tagged serde enum), or an object's `step` string (an internally tagged one); at
/// most 64 visible ASCII characters.
fn step_name(recovery_point: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(recovery_point).ok()?;
    let name = match &v {
        serde_json::Value::String(s) => s.clone(),
        serde_json::Value::Object(m) => match m.get("step") {
            Some(serde_json::Value::String(s)) => s.clone(),
            _ if m.len() == 1 => m.keys().next()?.clone(),
            _ => return None,
        },
        _ => return None,
    };
    let fits = !name.is_empty() && name.len() <= 64 && name.bytes().all(|b| b.is_ascii_graphic());
    fits.then_some(name)
}

/// The answer to a phase whose transaction the handler ended itself (a `COMMIT` or
/// `ROLLBACK` through it): `500 idempotency_handler_misuse`, not retryable.
pub fn ended_problem() -> Problem {
    Problem::from_code(
        ErrorCode::HandlerMisuse,
        "the handler ended its idempotent transaction itself (a COMMIT or ROLLBACK through it), so this step could not be recorded with its writes: nothing was stored, and the key was not released, because writes may have committed outside the step; a server bug",
    )
}
