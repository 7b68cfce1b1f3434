//! # oncely-jobs
//!
//! The background jobs of Oncely, over any store with [`Maintenance`]: the reaper and the
//! completer (`docs/DESIGN.md`, "Replay window, retention, reaper and completer").
//!
//! - The **reaper** deletes records whose retention ended, in bounded batches with a pause
//!   between them, so that it never holds a store's locks (or its mutex) for long and claims
//!   keep flowing while it runs. It logs in-flight records it deleted (orphans: requests that
//!   were abandoned and never finished, whose effects may be half-done).
//! - The **completer** finds abandoned in-flight requests (lease lapsed at least a grace period
//!   ago) and re-drives each stored request through the service with the same key, through a
//!   [`Redrive`] implementation (the CLI's is an HTTP call to the server with the same
//!   `Idempotency-Key` and the scope's credentials). The service then takes the key over,
//!   resumes from the recovery point and stores the final response, exactly as a client retry
//!   would. It never loops for ever: each record gets a bounded number of attempts with
//!   backoff ([`RedrivePolicy`]: 5, pausing 30 s, 1 min, 2 min, 4 min), counted in the store
//!   so that a restart does not reset them; then it is marked for a person
//!   ([`Redrives::marked_at`](oncely_core::Redrives::marked_at)): never re-driven again, every
//!   retry with its key answered `409 idempotency_request_needs_attention`, and one `error` log
//!   line per marked record on every reaper pass.
//!
//! Both run once ([`reap_all`], [`complete_abandoned`]) or as in-process tokio tasks
//! ([`Reaper`], [`Completer`]).
//!
//! # How the tasks stop
//!
//! [`Reaper::spawn`] and [`Completer::spawn`] take a `shutdown` future, like axum's graceful
//! shutdown: any `Future<Output = ()>` works, e.g. `token.cancelled_owned()` of a
//! `tokio_util::sync::CancellationToken`, `async { rx.await.ok(); }` for a
//! `tokio::sync::oneshot::Receiver`, or a `tokio::sync::watch` change. The task checks it only
//! *between* store operations (while sleeping between batches and between passes), never in
//! the middle of one, so a stop never abandons a database statement halfway; it then returns
//! the totals of everything it did through its [`JoinHandle`](tokio::task::JoinHandle).
//! Aborting the handle instead also stops it, at the cost of possibly dropping an operation in
//! flight (every store operation is atomic, so nothing is left half-written either way).
//!
//! ```
//! use oncely_jobs::Reaper;
//! use oncely_core::{Maintenance, MemoryStore};
//! use std::sync::Arc;
//! use std::time::Duration;
//!
//! # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
//! let store: Arc<dyn Maintenance> = Arc::new(MemoryStore::new());
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! let reaper = Reaper::new(store, Duration::from_secs(60), 1_000)
//!     .spawn(async { stopped.await.ok(); });
//! // ... serve requests ...
//! stop.send(()).ok();
//! let totals = reaper.await.unwrap();
//! assert_eq!(totals.deleted, 0);
//! # });
//! ```

//!
//! # Modules
//!
//! - [`reaper`]: [`reap_all`] and the [`Reaper`] task.
//! - [`completer`]: [`complete_abandoned`] and the [`Completer`] task, with their report.
//! - [`redrive`]: how the completer re-drives a request ([`Redrive`]) and how hard it tries
//!   ([`RedrivePolicy`]).

pub mod completer;
pub mod reaper;
pub mod redrive;

pub use completer::{Completer, CompleterCounters, CompleterReport, complete_abandoned};
#[doc(no_inline)]
pub use oncely_core::{Maintenance, ReapReport};
pub use reaper::{DEFAULT_REAP_PAUSE, MARKED_LOG_LIMIT, Reaper, ReaperCounters, reap_all};
pub use redrive::{Redrive, RedriveError, RedrivePolicy};
