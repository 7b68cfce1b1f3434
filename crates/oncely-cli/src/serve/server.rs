//! The HTTP server loop of `oncely serve`: limits that keep slow clients from exhausting it,
//! and a graceful shutdown on SIGTERM that does not leave keys locked.
//!
//! # Limits (each a `serve` flag)
//!
//! | limit | default | what it bounds | by |
//! |---|---|---|---|
//! | `--header-read-timeout-secs` | 10 s | receiving a whole request head, counted from when the server starts waiting for one (the connection was accepted, or the previous response was sent on a kept-alive connection) | hyper's `http1::Builder::header_read_timeout` |
//! | `--body-read-timeout-secs` | 30 s | the wait for each next piece of a request body | tower-http `RequestBodyTimeoutLayer` |
//! | `--idle-timeout-secs` | 60 s | a connection with no request running; closed gracefully (hyper's `graceful_shutdown`) | this loop |
//! | `--max-connections` | 1024, and at most the open-file limit minus 64 | open connections; further clients wait in the listen backlog until one closes | a semaphore around `accept` |
//! | `--shutdown-grace-secs` | 20 s | how long running requests may finish after SIGTERM (then a request inside an outside call gets up to the processor timeout plus 2 s more) | [`Drain`] |
//!
//! hyper's header-read timer also runs while a kept-alive connection waits for its next
//! request, so an idle connection is closed after the shorter of the two timeouts. A half-sent
//! request head (slowloris) is closed after the header-read timeout, and a client that stops
//! sending its body gets no handler run after the body-read timeout. An `accept` error (the
//! process ran out of file descriptors, `EMFILE`) is logged once per episode and retried with a
//! backoff from 10 milliseconds up to 1 second, not in a tight loop.
//!
//! # Shutdown
//!
//! On SIGTERM (or Ctrl-C): stop accepting (the listener is closed, so new connections are
//! refused at once and a load balancer moves on), ask every connection to close after its
//! current response, and let the running requests finish for up to the shutdown grace. Keyed
//! requests that arrive meanwhile are answered `503 server_shutting_down` before any claim;
//! a request claimed but whose handler had not started releases its key. When the grace is
//! over, the requests still running are suspended at their recovery points (their leases cut
//! short), so their retries resume at once rather than wait for the lease. A request inside an
//! outside call (a charge, an e-mail) is not: it keeps its lease while the call runs, and the
//! drain waits for it ([`app::outside_call_wait`](super::app::outside_call_wait): the
//! processor timeout, `--processor-timeout-ms`, plus 2 seconds) until it records the call's result and stops at its next recovery
//! point; past that wait the process exits with the lease held, so the key is taken over only
//! once the lease lapses, never while the call may still land. Then the process exits 0.

use anyhow::Result;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::service::TowerToHyperService;
use oncely_tower::Drain;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;
use tower::ServiceExt as _;

/// The server's limits; see the [module docs](self) for what each bounds.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Time to receive a whole request head (default 10 seconds).
    pub header_read_timeout: Duration,
    /// The longest wait for the next piece of a request body (default 30 seconds).
    pub body_read_timeout: Duration,
    /// How long a connection with no request running stays open (default 60 seconds).
    pub idle_timeout: Duration,
    /// The most open connections (default 1024, capped by the open-file limit minus 64).
    pub max_connections: usize,
    /// How long running requests may finish after SIGTERM (default 20 seconds).
    pub shutdown_grace: Duration,
}

/// File descriptors kept free for everything but client connections (the store's pool, the
/// SQLite files, outside calls).
const RESERVED_FDS: u64 = 64;

impl Limits {
    /// The connection limit, capped so that connections alone cannot exhaust the process's
    /// open-file limit (where the accept loop would otherwise fail with `EMFILE`).
    fn effective_max_connections(&self) -> usize {
        let want = self.max_connections.max(1);
        #[cfg(unix)]
        if let Ok((soft, _)) =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        {
            let room = soft.saturating_sub(RESERVED_FDS).max(1);
            if (want as u64) > room {
                tracing::warn!(
                    max_connections = want,
                    open_file_limit = soft,
                    "--max-connections lowered to {room}: the open-file limit leaves no room for more (raise it with ulimit -n)"
                );
                return room as usize;
            }
        }
        want
    }
}

/// Requests running on one connection and when the last one ended, for the idle timeout.
#[derive(Debug)]
struct Activity {
    running: AtomicUsize,
    last: std::sync::Mutex<Instant>,
}

impl Activity {
    fn touch(&self) {
        *self.last.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
    }
    /// When the connection becomes idle-expired if nothing happens (`None`: a request runs).
    fn idle_deadline(&self, idle: Duration) -> Option<Instant> {
        (self.running.load(Ordering::SeqCst) == 0)
            .then(|| *self.last.lock().unwrap_or_else(|e| e.into_inner()) + idle)
    }
}

/// Ends a request's activity when dropped (also when the client went away mid-request).
struct Running(Arc<Activity>);

impl Drop for Running {
    fn drop(&mut self) {
        self.0.touch();
        self.0.running.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Serves `router` on `listener` until `shutdown` resolves, then shuts down gracefully (see
/// the [module docs](self)).
///
/// # Errors
///
/// None in practice: accept errors are retried with a backoff, connection errors end that
/// connection only.
pub async fn serve(
    listener: TcpListener,
    router: axum::Router,
    limits: Limits,
    drain: Option<Drain>,
    shutdown: impl Future<Output = ()>,
) -> Result<()> {
    let max = limits.effective_max_connections();
    let permits = Arc::new(Semaphore::new(max));
    let (closing_tx, closing) = watch::channel(false);
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    builder.http2().timer(TokioTimer::new());
    let builder = Arc::new(builder);
    let service = tower::ServiceBuilder::new()
        .layer(tower_http::timeout::RequestBodyTimeoutLayer::new(
            limits.body_read_timeout,
        ))
        .service(router);

    let mut shutdown = std::pin::pin!(shutdown);
    let mut backoff = Duration::ZERO;
    let mut suppressed = 0u64;
    let mut at_limit_logged = false;
    loop {
        // A free connection slot first: at the limit, new clients wait in the backlog.
        if permits.available_permits() == 0 && !at_limit_logged {
            tracing::warn!(
                max_connections = max,
                "connection limit reached; new connections wait in the listen backlog"
            );
            at_limit_logged = true;
        }
        let permit = tokio::select! {
            p = Arc::clone(&permits).acquire_owned() => p?,
            () = &mut shutdown => break,
        };
        if permits.available_permits() > 0 {
            at_limit_logged = false;
        }
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = &mut shutdown => break,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => {
                if suppressed > 0 {
                    tracing::info!(
                        repeated = suppressed,
                        "accepting connections again after accept errors"
                    );
                }
                backoff = Duration::ZERO;
                suppressed = 0;
                stream
            }
            Err(e) => {
                // EMFILE and friends: back off instead of spinning, log once per episode.
                if suppressed == 0 {
                    tracing::error!(error = %e, "accept error; backing off (from 10 ms up to 1 s) until it clears");
                }
                suppressed += 1;
                backoff = (backoff * 2).clamp(Duration::from_millis(10), Duration::from_secs(1));
                drop(permit);
                tokio::select! {
                    () = tokio::time::sleep(backoff) => continue,
                    () = &mut shutdown => break,
                }
            }
        };
        let _ = stream.set_nodelay(true);
        let activity = Arc::new(Activity {
            running: AtomicUsize::new(0),
            last: std::sync::Mutex::new(Instant::now()),
        });
        let svc = {
            let (service, activity) = (service.clone(), Arc::clone(&activity));
            tower::service_fn(move |req: http::Request<hyper::body::Incoming>| {
                activity.running.fetch_add(1, Ordering::SeqCst);
                let guard = Running(Arc::clone(&activity));
                let service = service.clone();
                async move {
                    let res = service.oneshot(req).await;
                    drop(guard);
                    res
                }
            })
        };
        let builder = Arc::clone(&builder);
        let mut closing = closing.clone();
        let idle = limits.idle_timeout;
        tokio::spawn(async move {
            let _permit = permit;
            let conn = builder.serve_connection_with_upgrades(
                TokioIo::new(stream),
                TowerToHyperService::new(svc),
            );
            let mut conn = std::pin::pin!(conn);
            let mut asked_to_close = false;
            loop {
                let idle_at = activity
                    .idle_deadline(idle)
                    .unwrap_or_else(|| Instant::now() + idle);
                tokio::select! {
                    res = conn.as_mut() => {
                        if let Err(e) = res {
                            tracing::debug!(error = %e, "connection ended with an error");
                        }
                        break;
                    }
                    _ = closing.wait_for(|c| *c), if !asked_to_close => {
                        asked_to_close = true;
                        conn.as_mut().graceful_shutdown();
                    }
                    () = tokio::time::sleep_until(idle_at), if !asked_to_close => {
                        if activity.idle_deadline(idle).is_some_and(|d| d <= Instant::now()) {
                            asked_to_close = true;
                            conn.as_mut().graceful_shutdown();
                        }
                    }
                }
            }
        });
    }

    // Shutting down: stop accepting, stop claiming, let running requests finish.
    drop(listener);
    tracing::info!(
        grace_secs = limits.shutdown_grace.as_secs_f64(),
        "shutting down: no longer accepting; running requests may finish"
    );
    if let Some(d) = &drain {
        d.start();
    }
    closing_tx.send_replace(true);
    let finished = async {
        // Every connection returns its permit when it closes.
        let _ = permits.acquire_many(max as u32).await;
        if let Some(d) = &drain {
            // A handler whose client went away still runs on its own task.
            d.idle().await;
        }
    };
    if tokio::time::timeout(limits.shutdown_grace, finished)
        .await
        .is_err()
    {
        let suspended = match &drain {
            Some(d) => d.abandon().await,
            None => 0,
        };
        tracing::warn!(
            suspended,
            "shutdown grace over with requests still running; suspended them at their recovery points for their retries to resume"
        );
    } else {
        tracing::info!("every running request finished; exiting");
    }
    Ok(())
}

/// Resolves on SIGTERM or Ctrl-C (SIGINT).
pub async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM; only Ctrl-C stops gracefully");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    let _ = tokio::signal::ctrl_c().await;
}
