//! # oncely-bench
//!
//! Helpers for the key-store benchmarks in `benches/stores.rs`: open each backend the way a
//! server would, and build claim requests with fresh keys. Run them with
//! `cargo bench -p oncely-bench`; PostgreSQL and Redis are measured only when
//! `ONCELY_BENCH_POSTGRES_URL` / `ONCELY_BENCH_REDIS_URL` (or the test variables
//! `ONCELY_TEST_POSTGRES_URL` / `ONCELY_TEST_REDIS_URL`) are set, else skipped with a note.
//! Use a throwaway database: the benchmarks leave their records behind (reap them, or drop the
//! database).
//!
//! `ONCELY_BENCH_RTT_MS` (e.g. `0,0.2,1`) runs PostgreSQL and Redis through [`proxy`]'s latency
//! proxy at each round trip above 0 ([`open_with_rtt`]), and prints the round trips per
//! operation it counted.
//!
//! [`transactional`] holds the transactional bench's endpoint in three variants (baseline, floor,
//! layer) for `benches/transactional.rs` (`cargo bench -p oncely-bench --bench transactional`;
//! docs/PERFORMANCE.md, "The transactional layer against its floor").

// The bench programs' shared code, not a published API: its handles (stores, routers, pools)
// have nothing a `Debug` print would tell.
#![allow(missing_debug_implementations)]

use oncely_core::{
    ClaimRequest, Fingerprint, IdempotencyKey, KeyStore, MemoryStore, RecordKey, Scope,
    StoredResponse,
};
use std::sync::Arc;
use std::time::Duration;

/// The backends the benchmarks know.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Backend {
    /// [`MemoryStore`].
    Memory,
    /// `oncely_sqlite::SqliteStore` on a temporary file (WAL, the crate's defaults).
    Sqlite,
    /// `oncely_postgres::PostgresStore`, from the environment.
    Postgres,
    /// `oncely_redis::RedisStore`, from the environment.
    Redis,
}

impl Backend {
    /// Every backend, in report order.
    pub const ALL: [Self; 4] = [Self::Memory, Self::Sqlite, Self::Postgres, Self::Redis];

    /// A short lower-case name (`memory`, `sqlite`, `postgres`, `redis`).
    pub const fn name(self) -> &'static str {
        match self {
            Self::Memory => "memory",
            Self::Sqlite => "sqlite",
            Self::Postgres => "postgres",
            Self::Redis => "redis",
        }
    }
}

/// An opened store and whatever must live as long as it (the SQLite temporary directory).
pub struct Opened {
    /// The store.
    pub store: Arc<dyn KeyStore>,
    proxy: Option<proxy::LatencyProxy>,
    _dir: Option<tempfile::TempDir>,
}

impl Opened {
    /// The round trips counted by the latency proxy between the store and its server
    /// ([`open_with_rtt`]); `None` without one.
    pub fn round_trips(&self) -> Option<Arc<proxy::RoundTrips>> {
        self.proxy.as_ref().map(proxy::LatencyProxy::round_trips)
    }
}

pub mod proxy;
pub mod transactional;

/// The URL in the environment variable `bench` (e.g. `ONCELY_BENCH_POSTGRES_URL`), else in
/// `test` (e.g. `ONCELY_TEST_POSTGRES_URL`); `None` when both are unset or empty.
pub fn env_url(bench: &str, test: &str) -> Option<String> {
    std::env::var(bench)
        .ok()
        .or_else(|| std::env::var(test).ok())
        .filter(|u| !u.is_empty())
}

/// Opens a backend (running its migrations), or returns why it is skipped.
///
/// # Errors
///
/// A message naming the missing environment variable, or the store's error.
pub async fn open(backend: Backend) -> Result<Opened, String> {
    open_with_rtt(backend, None).await
}

/// [`open`], with PostgreSQL or Redis reached through a [`proxy::LatencyProxy`] that adds
/// `rtt` to every round trip (half of it each way; zero: no delay, round trips still counted,
/// see [`Opened::round_trips`]). `None`, and the in-process backends (memory, SQLite), go
/// direct.
///
/// # Errors
///
/// As [`open`], and the proxy's if it cannot start.
pub async fn open_with_rtt(backend: Backend, rtt: Option<Duration>) -> Result<Opened, String> {
    let mut proxy = None;
    let (store, dir): (Arc<dyn KeyStore>, _) = match backend {
        Backend::Memory => (Arc::new(MemoryStore::new()), None),
        Backend::Sqlite => {
            let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
            let path = dir.path().join("bench.sqlite3");
            let url = format!("sqlite://{}?mode=rwc", path.display());
            let store = oncely_sqlite::SqliteStore::connect(&url)
                .await
                .map_err(|e| e.to_string())?;
            (Arc::new(store), Some(dir))
        }
        Backend::Postgres => {
            let url = env_url("ONCELY_BENCH_POSTGRES_URL", "ONCELY_TEST_POSTGRES_URL")
                .ok_or("ONCELY_BENCH_POSTGRES_URL is not set")?;
            let url = proxied(&url, rtt, &mut proxy).await?;
            let store = oncely_postgres::PostgresStore::connect(&url)
                .await
                .map_err(|e| e.to_string())?;
            store.migrate().await.map_err(|e| e.to_string())?;
            (Arc::new(store), None)
        }
        Backend::Redis => {
            let url = env_url("ONCELY_BENCH_REDIS_URL", "ONCELY_TEST_REDIS_URL")
                .ok_or("ONCELY_BENCH_REDIS_URL is not set")?;
            let url = proxied(&url, rtt, &mut proxy).await?;
            // Benchmark records are throwaway: a Redis that persists nothing (as the private
            // benchmark instance does, so its counters see only our traffic) is accepted.
            let config = oncely_redis::RedisConfig::new().with_accept_volatile(true);
            let store = oncely_redis::RedisStore::connect_with(&url, config)
                .await
                .map_err(|e| e.to_string())?;
            (Arc::new(store), None)
        }
    };
    Ok(Opened {
        store,
        proxy,
        _dir: dir,
    })
}

/// `url` itself without `rtt`; else the URL of a new proxy to it, kept in `proxy`.
async fn proxied(
    url: &str,
    rtt: Option<Duration>,
    proxy: &mut Option<proxy::LatencyProxy>,
) -> Result<String, String> {
    let Some(rtt) = rtt else {
        return Ok(url.to_owned());
    };
    let p = proxy::LatencyProxy::start(&proxy::upstream_of(url)?, rtt / 2)
        .await
        .map_err(|e| e.to_string())?;
    let through = p.url(url)?;
    *proxy = Some(p);
    Ok(through)
}

/// A claim request for `(acct_bench, key)` with the server's default policy: 30 s lease, 24 h
/// replay window, 72 h retention, no stored request.
///
/// # Panics
///
/// When `key` is not a valid `Idempotency-Key` (1-255 visible ASCII characters).
pub fn claim_request(key: &str) -> ClaimRequest {
    ClaimRequest::new(
        RecordKey::new(
            Scope::new("acct_bench"),
            IdempotencyKey::new(key).expect("a valid key"),
        ),
        Fingerprint::from_parts(1, [7; 32]),
        Duration::from_secs(30),
        Duration::from_secs(86_400),
        Duration::from_secs(259_200),
    )
}

/// A typical stored response: `201 Created`, a content type and location header, and a body of
/// `body_len` bytes.
pub fn response(body_len: usize) -> StoredResponse {
    StoredResponse::new(
        201,
        vec![
            ("content-type".to_owned(), b"application/json".to_vec()),
            (
                "location".to_owned(),
                b"/v1/orders/ord_0190f3c27b1e".to_vec(),
            ),
        ],
        vec![b'x'; body_len],
    )
}

/// A key prefix unique to this process, so runs never collide with an earlier run's records.
pub fn run_prefix() -> String {
    format!("bench-{}", uuid::Uuid::new_v4().simple())
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncely_core::ClaimOutcome;

    /// The helpers drive a real first execution and a replay on the stores that need no server.
    #[tokio::test]
    async fn helpers_claim_complete_and_replay_on_memory_and_sqlite() {
        for backend in [Backend::Memory, Backend::Sqlite] {
            let opened = open(backend).await.expect("opens without a server");
            let req = claim_request(&format!("{}-1", run_prefix()));
            let ClaimOutcome::Claimed(claim) = opened.store.claim(req.clone()).await.unwrap()
            else {
                panic!("{}: a fresh key is claimed", backend.name());
            };
            opened
                .store
                .complete(&req.id, claim.token, response(256), req.retention)
                .await
                .unwrap();
            match opened.store.claim(req).await.unwrap() {
                ClaimOutcome::Replay { response: r, .. } => {
                    assert_eq!(r.status, 201, "{}", backend.name());
                    assert_eq!(r.body, vec![b'x'; 256], "{}", backend.name());
                    assert_eq!(r.headers.len(), 2, "{}", backend.name());
                }
                other => panic!("{}: expected a replay, got {other:?}", backend.name()),
            }
        }
    }

    #[test]
    fn run_prefixes_differ_and_make_valid_keys() {
        let (a, b) = (run_prefix(), run_prefix());
        assert_ne!(a, b);
        assert_eq!(a.len(), "bench-".len() + 32);
        assert!(IdempotencyKey::new(&format!("{a}-123456789")).is_ok());
    }
}
