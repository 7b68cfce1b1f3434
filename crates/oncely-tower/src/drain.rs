//! [`Drain`]: graceful shutdown of the layer's claims, so a deploy does not leave keys locked
//! until their leases lapse.
//!
//! A server that stops (SIGTERM during a rolling deploy) calls, in order:
//!
//! 1. [`Drain::start`]: from now on a keyed request is answered `503 server_shutting_down`
//!    (retryable, `Retry-After`, `Connection: close`) **before** any claim, so it goes to another
//!    instance; a request that was claimed but whose handler had not started yet releases its
//!    key and gets the same answer (nothing ran, so the key behaves as absent at once);
//! 2. [`Drain::idle`] under the server's own bound: the handlers already running finish and
//!    store their responses (a retry after the restart replays them);
//! 3. [`Drain::abandon`] for the handlers still running when the bound is reached. None of
//!    them may start an outside call any more. Each that is not inside an outside call is
//!    suspended at its last recovery point: its heartbeat stops and its lease is cut to 1
//!    millisecond, as [`HandlerOutcome::Suspended`](crate::HandlerOutcome::Suspended) does, so
//!    the client's retry on another instance, or after the restart, takes the key over at once
//!    and resumes, instead of waiting for the lease (30 seconds by default).
//!
//!    A request inside an outside call (`oncely_sqlx::Between::call`,
//!    [`IdempotencyContext::call`](crate::IdempotencyContext::call)) is never suspended while
//!    the call runs: handing its key over then would let the retry make the call again while
//!    the first may still land. Its heartbeat keeps renewing its lease, and the drain waits for
//!    the request to reach its next recovery point (the call returns, the handler records its
//!    result, its next outside call is refused, and the layer suspends it there) or to finish,
//!    for at most [`Drain::with_outside_call_wait`] (default
//!    [`Drain::DEFAULT_OUTSIDE_CALL_WAIT`], 30 seconds). Past that bound it is left as it is:
//!    the process exits with the lease still held, and the key is taken over only once the
//!    lease lapses (`docs/DESIGN.md`, "Operating the server").
//!
//! ```
//! use oncely_core::MemoryStore;
//! use oncely_tower::IdempotencyLayer;
//! use std::{sync::Arc, time::Duration};
//!
//! # async fn shutdown() {
//! let layer = IdempotencyLayer::new(Arc::new(MemoryStore::new()));
//! let drain = layer.drain();
//! // ... serve with `layer` until SIGTERM, then:
//! drain.start();
//! if tokio::time::timeout(Duration::from_secs(20), drain.idle()).await.is_err() {
//!     let suspended = drain.abandon().await;
//!     eprintln!("{suspended} request(s) suspended for their retries to resume");
//! }
//! # }
//! ```

use crate::dialect::Dialect;
use crate::lease::LeaseBook;
use http::Response;
use http::header::{CONNECTION, HeaderValue};
use oncely_core::response::Body;
use oncely_core::{KeyStore, StoreError};
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// The shared drain state of one layer (and every service it made).
#[derive(Debug)]
pub(crate) struct DrainState {
    draining: AtomicBool,
    next: AtomicU64,
    running: Mutex<HashMap<u64, Arc<LeaseBook>>>,
    /// Woken whenever a running claim ends.
    ended: Notify,
}

impl Default for DrainState {
    fn default() -> Self {
        Self {
            draining: AtomicBool::new(false),
            next: AtomicU64::new(0),
            running: Mutex::new(HashMap::new()),
            ended: Notify::new(),
        }
    }
}

impl DrainState {
    pub(crate) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Registers a claimed request until the guard drops.
    pub(crate) fn register(self: &Arc<Self>, claim: Arc<LeaseBook>) -> Running {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(n, claim);
        Running {
            state: Arc::clone(self),
            n,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<LeaseBook>>> {
        // The map holds plain data: a panic elsewhere cannot leave it half-updated.
        self.running.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// One claimed request, registered while its handler runs.
pub(crate) struct Running {
    state: Arc<DrainState>,
    n: u64,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.state.lock().remove(&self.n);
        self.state.ended.notify_waiters();
    }
}

/// The graceful-shutdown handle of an [`IdempotencyLayer`](crate::IdempotencyLayer), from
/// [`IdempotencyLayer::drain`](crate::IdempotencyLayer::drain). Cheap to clone; every clone
/// and every service of the layer share one state. See the [module docs](self) for the order
/// of the calls.
#[derive(Clone)]
pub struct Drain {
    state: Arc<DrainState>,
    store: Arc<dyn KeyStore>,
    store_timeout: Duration,
    outside_call_wait: Duration,
}

impl fmt::Debug for Drain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Drain")
            .field("draining", &self.is_draining())
            .field("running", &self.running())
            .finish_non_exhaustive()
    }
}

impl Drain {
    /// The handle of one layer's drain `state`, whose store calls go to `store`, each bounded
    /// by `store_timeout`.
    pub(crate) fn new(
        state: Arc<DrainState>,
        store: Arc<dyn KeyStore>,
        store_timeout: Duration,
    ) -> Self {
        Self {
            state,
            store,
            store_timeout,
            outside_call_wait: Self::DEFAULT_OUTSIDE_CALL_WAIT,
        }
    }

    /// How long [`Drain::abandon`] waits, by default, for requests inside an outside call: 30
    /// seconds.
    pub const DEFAULT_OUTSIDE_CALL_WAIT: Duration = Duration::from_secs(30);

    /// Sets how long [`Drain::abandon`] waits for requests that are inside an outside call
    /// when it is called (default [`Drain::DEFAULT_OUTSIDE_CALL_WAIT`], 30 seconds): set it to
    /// the timeout of your outside systems' clients (plus the time to record a result), and
    /// keep the process's own kill deadline (Kubernetes' `terminationGracePeriodSeconds`)
    /// above the shutdown grace plus this wait. Past it, such a request keeps its claim, and
    /// its key is taken over only once its lease lapses after the process exited.
    #[must_use]
    pub fn with_outside_call_wait(mut self, max: Duration) -> Self {
        self.outside_call_wait = max;
        self
    }

    /// Stops claiming: keyed requests are answered `503 server_shutting_down` before any claim,
    /// and claimed requests whose handler has not started release their key. Idempotent.
    pub fn start(&self) {
        self.state.draining.store(true, Ordering::SeqCst);
    }

    /// Whether [`Drain::start`] was called.
    pub fn is_draining(&self) -> bool {
        self.state.is_draining()
    }

    /// How many claimed requests are running now.
    pub fn running(&self) -> usize {
        self.state.lock().len()
    }

    /// Waits until no claimed request is running. Bound it with the server's shutdown grace
    /// (`tokio::time::timeout`).
    pub async fn idle(&self) {
        loop {
            let ended = self.state.ended.notified();
            if self.running() == 0 {
                return;
            }
            ended.await;
        }
    }

    /// Gives up on the requests still running (see the [module docs](self), step 3): none of
    /// them may start an outside call any more; each that is not inside one is suspended at
    /// once (its heartbeat stops and its lease is cut to 1 millisecond, so that its retry
    /// takes the key over at once and resumes); each inside one keeps its lease while the
    /// call runs, and is waited for until it reaches its next recovery point (where the layer
    /// suspends it) or finishes, for at most the outside-call wait
    /// ([`Drain::with_outside_call_wait`], 30 seconds by default), all at once.
    ///
    /// Returns how many of them no longer hold their key: suspended by the drain, or ended
    /// while it waited. The others had ended already, or the store could not be reached (each
    /// call is bounded by the store timeout), or their outside call outlasted the wait: their
    /// keys stay in flight until the lease lapses, and a retry never runs while a call of
    /// theirs may still land. Call it right before the process exits.
    pub async fn abandon(&self) -> usize {
        let running: Vec<_> = self
            .state
            .lock()
            .iter()
            .map(|(n, c)| (*n, Arc::clone(c)))
            .collect();
        let deadline = Instant::now() + self.outside_call_wait;
        let mut each = tokio::task::JoinSet::new();
        for (n, claim) in running {
            let drain = self.clone();
            each.spawn(async move { drain.abandon_one(n, claim, deadline).await });
        }
        let mut ended = 0;
        while let Some(done) = each.join_next().await {
            ended += usize::from(done.unwrap_or(false));
        }
        ended
    }

    /// Suspends one running request, or waits for its outside call; whether it no longer holds
    /// its key.
    async fn abandon_one(&self, n: u64, claim: Arc<LeaseBook>, deadline: Instant) -> bool {
        let id = &claim.id;
        if claim.close() {
            return self.suspend(&claim).await;
        }
        tracing::info!(scope = %id.scope, key = %id.key, wait_secs = self.outside_call_wait.as_secs_f64(), "shutting down: a running request is inside an outside call; it keeps its lease until the call returns, then stops at its next recovery point");
        loop {
            let ended = self.state.ended.notified();
            if !self.state.lock().contains_key(&n) {
                return true;
            }
            if tokio::time::timeout_at(deadline, ended).await.is_err() {
                break;
            }
        }
        if claim.calls_in_flight() > 0 {
            tracing::warn!(scope = %id.scope, key = %id.key, token = claim.token.0, "shutting down with an outside call still in flight: the request is not suspended; its key is taken over only once its lease lapses, so no retry runs while the call may still land");
        } else {
            tracing::warn!(scope = %id.scope, key = %id.key, token = claim.token.0, "shutting down: the request's outside call returned, but the request did not reach its next recovery point in time; its key is taken over once its lease lapses");
        }
        false
    }

    /// Cuts the lease of a request that is not inside an outside call (and can start none).
    async fn suspend(&self, claim: &LeaseBook) -> bool {
        claim.suspend();
        let (id, token) = (&claim.id, claim.token);
        let cut = tokio::time::timeout(
            self.store_timeout,
            self.store.renew(id, token, Duration::ZERO),
        )
        .await;
        match cut {
            Ok(Ok(_)) => {
                tracing::info!(scope = %id.scope, key = %id.key, token = token.0, "shutting down: suspended a running request at its recovery point; its retry resumes it at once");
                true
            }
            Ok(Err(StoreError::Fenced)) => false,
            Ok(Err(e)) => {
                tracing::warn!(scope = %id.scope, key = %id.key, error = %e, "shutting down: could not suspend a running request; its key stays in flight until its lease lapses");
                false
            }
            Err(_) => {
                tracing::warn!(scope = %id.scope, key = %id.key, "shutting down: the key store did not answer in time; the key stays in flight until its lease lapses");
                false
            }
        }
    }

    /// The answer to a keyed request that arrives while draining.
    pub(crate) fn shutting_down(dialect: &dyn Dialect, retry_after_secs: u64) -> Response<Body> {
        let p = oncely_core::Problem::from_code(
            oncely_core::ErrorCode::ServerShuttingDown,
            "this server instance is shutting down and did not run the request; retry the same request with the same key",
        );
        let mut res = dialect.render(&p.with_retry_after(retry_after_secs.max(1)));
        res.headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
        res
    }
}
