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
//! 3. [`Drain::abandon`] for the handlers still running when the bound is reached: their
//!    heartbeats stop and each claim is suspended at its last recovery point (its lease is cut
//!    to 1 millisecond, as [`HandlerOutcome::Suspended`](crate::HandlerOutcome::Suspended)
//!    does), so the client's retry on another instance, or after the restart, takes the key
//!    over at once and resumes, instead of waiting for the lease (30 seconds by default).
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

use crate::Body;
use crate::settings::Config;
use http::Response;
use http::header::{CONNECTION, HeaderValue};
use oncely_core::{FencingToken, KeyStore, RecordKey, StoreError};
use std::collections::HashMap;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{Notify, watch};

/// The shared drain state of one layer (and every service it made).
#[derive(Debug)]
pub(crate) struct DrainState {
    draining: AtomicBool,
    next: AtomicU64,
    running: Mutex<HashMap<u64, (RecordKey, FencingToken)>>,
    /// Woken whenever a running claim ends.
    ended: Notify,
    /// `true` once [`Drain::abandon`] began: heartbeats stop renewing.
    abandoned: watch::Sender<bool>,
}

impl Default for DrainState {
    fn default() -> Self {
        Self {
            draining: AtomicBool::new(false),
            next: AtomicU64::new(0),
            running: Mutex::new(HashMap::new()),
            ended: Notify::new(),
            abandoned: watch::Sender::new(false),
        }
    }
}

impl DrainState {
    pub(crate) fn is_draining(&self) -> bool {
        self.draining.load(Ordering::SeqCst)
    }

    /// Registers a claimed request until the guard drops.
    pub(crate) fn register(self: &Arc<Self>, id: RecordKey, token: FencingToken) -> Running {
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        self.lock().insert(n, (id, token));
        Running {
            state: Arc::clone(self),
            n,
        }
    }

    /// A receiver that turns `true` when the claims are abandoned (heartbeats stop).
    pub(crate) fn abandoned(&self) -> watch::Receiver<bool> {
        self.abandoned.subscribe()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, (RecordKey, FencingToken)>> {
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
    pub(crate) fn new(config: &Config) -> Self {
        Self {
            state: Arc::clone(&config.drain),
            store: Arc::clone(&config.store),
            store_timeout: config.store_timeout,
        }
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

    /// Gives up on the requests still running: stops their heartbeats and suspends each claim
    /// at its last recovery point (its lease is cut to 1 millisecond), so that its retry takes
    /// the key over at once and resumes. Returns how many claims were suspended; the others
    /// had just ended, or the store could not be reached (each call is bounded by the store
    /// timeout; their keys then stay in flight until the lease lapses). Call it right before
    /// the process exits: a handler that keeps running after it may be taken over.
    pub async fn abandon(&self) -> usize {
        self.state.abandoned.send_replace(true);
        let running: Vec<_> = self.state.lock().values().cloned().collect();
        let mut suspended = 0;
        for (id, token) in running {
            let cut = tokio::time::timeout(
                self.store_timeout,
                self.store.renew(&id, token, Duration::ZERO),
            )
            .await;
            match cut {
                Ok(Ok(_)) => {
                    suspended += 1;
                    tracing::info!(scope = %id.scope, key = %id.key, token = token.0, "shutting down: suspended a running request at its recovery point; its retry resumes it at once");
                }
                Ok(Err(StoreError::Fenced)) => {}
                Ok(Err(e)) => {
                    tracing::warn!(scope = %id.scope, key = %id.key, error = %e, "shutting down: could not suspend a running request; its key stays in flight until its lease lapses");
                }
                Err(_) => {
                    tracing::warn!(scope = %id.scope, key = %id.key, "shutting down: the key store did not answer in time; the key stays in flight until its lease lapses");
                }
            }
        }
        suspended
    }

    /// The answer to a keyed request that arrives while draining.
    pub(crate) fn shutting_down(
        dialect: &dyn crate::Dialect,
        retry_after_secs: u64,
    ) -> Response<Body> {
        let p = oncely_core::Problem::from_code(
            oncely_core::ErrorCode::ServerShuttingDown,
            "this server instance is shutting down and did not run the request; retry the same request with the same key",
        );
        let mut res = dialect.render(&p, Some(retry_after_secs.max(1)));
        res.headers_mut()
            .insert(CONNECTION, HeaderValue::from_static("close"));
        res
    }
}
