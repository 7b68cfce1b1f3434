//! The [`SendGuard`], the innermost layer under [`OncelyRetry`](crate::OncelyRetry), and the
//! [`ActiveCall`] the outer layer shares with it (and with any inner instance of itself)
//! through the request extensions.

use std::sync::Arc;
use std::sync::atomic::{AtomicU16, AtomicU32, Ordering};

use http::{Extensions, StatusCode};
use reqwest::{Request, Response};
use reqwest_middleware::{Middleware, Next};

use crate::deadline::Deadline;
use crate::timer::Timer;

/// Why the [`SendGuard`] refused to send.
#[derive(Debug, thiserror::Error)]
pub(super) enum Refused {
    #[error("not sent: the call's {0} requests are spent (another retry layer re-sent it)")]
    AttemptCap(u32),
    #[error("not sent: the call's deadline has passed")]
    Deadline,
}

/// What the outer instance of [`OncelyRetry`](crate::OncelyRetry) shares with everything below it for one logical
/// call, through the request extensions: its presence tells an inner instance to pass through,
/// and the [`SendGuard`] counts the requests that really go out in it.
#[derive(Clone, Debug)]
pub(super) struct ActiveCall(pub(super) Arc<ActiveInner>);

#[derive(Debug)]
pub(super) struct ActiveInner {
    pub(super) sends: AtomicU32,
    pub(super) max_sends: u32,
    /// Attempts answered `409 idempotency_request_in_flight`: each one allows one more send,
    /// since the schedule does not count them against the attempt limit.
    pub(super) in_flight: AtomicU32,
    pub(super) deadline: Deadline,
    pub(super) timer: Arc<dyn Timer>,
    /// The status of the last response that came back through the guard (0: none).
    pub(super) last_status: AtomicU16,
}

impl ActiveCall {
    pub(super) fn sends(&self) -> u32 {
        self.0.sends.load(Ordering::Acquire)
    }

    pub(super) fn last_status(&self) -> Option<StatusCode> {
        StatusCode::from_u16(self.0.last_status.load(Ordering::Acquire)).ok()
    }
}

/// The innermost layer of a stack with [`OncelyRetry`](crate::OncelyRetry) on top: counts the requests of each
/// logical call that really go out, and refuses (without sending) any beyond the call's attempt
/// limit or past its deadline.
///
/// It is what lets the outer layer notice a retry layer it cannot see (see the
/// [module docs](super)). [`OncelyRetry::wrap`](crate::OncelyRetry::wrap) and [`OncelyRetry::client`](crate::OncelyRetry::client) install it; put it
/// last yourself in a chain built by hand. Outside a call of [`OncelyRetry`](crate::OncelyRetry) it does nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct SendGuard;

#[async_trait::async_trait]
impl Middleware for SendGuard {
    async fn handle(
        &self,
        req: Request,
        extensions: &mut Extensions,
        next: Next<'_>,
    ) -> reqwest_middleware::Result<Response> {
        let Some(active) = extensions.get::<ActiveCall>().cloned() else {
            return next.run(req, extensions).await;
        };
        let inner = &active.0;
        if inner.deadline.is_exhausted(inner.timer.now()) {
            return Err(reqwest_middleware::Error::middleware(Refused::Deadline));
        }
        let counted = inner
            .sends
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                let cap = inner
                    .max_sends
                    .saturating_add(inner.in_flight.load(Ordering::Acquire));
                (n < cap).then_some(n + 1)
            });
        if counted.is_err() {
            return Err(reqwest_middleware::Error::middleware(Refused::AttemptCap(
                inner.max_sends,
            )));
        }
        let result = next.run(req, extensions).await;
        if let Ok(response) = &result {
            inner
                .last_status
                .store(response.status().as_u16(), Ordering::Release);
        }
        result
    }
}
