//! Helpers shared by the Redis integration tests.
#![allow(dead_code, unreachable_pub)]

use oncely_conformance::{RETENTION, WINDOW, fp};
use oncely_core::{ClaimRequest, IdempotencyKey, RecordKey, Scope, StoredResponse};
use std::time::Duration;

/// `url` with the query parameter `param` (`name=value`) added.
pub fn with_param(url: &str, param: &str) -> String {
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}{param}")
}

/// The shared test server's URL with `accept_volatile=true` (the CI's Redis on 6379 persists
/// nothing, on purpose), or `None` after printing why the test is skipped.
pub fn redis_url() -> Option<String> {
    match std::env::var("ONCELY_TEST_REDIS_URL") {
        Ok(url) => Some(with_param(&url, "accept_volatile=true")),
        Err(_) => {
            eprintln!("skipping: ONCELY_TEST_REDIS_URL is not set");
            None
        }
    }
}

/// The test Redis Cluster's URL (`redis+cluster://…`, from `.ci/redis-cluster.sh`), or `None`
/// after printing why the test is skipped.
pub fn cluster_url() -> Option<String> {
    match std::env::var("ONCELY_TEST_REDIS_CLUSTER_URL") {
        Ok(url) => Some(url),
        Err(_) => {
            eprintln!(
                "skipping: ONCELY_TEST_REDIS_CLUSTER_URL is not set (start one with .ci/redis-cluster.sh)"
            );
            None
        }
    }
}

/// A `(scope, key)` in a scope nobody else uses.
pub fn fresh_id(test: &str) -> RecordKey {
    RecordKey::new(
        Scope::new(format!("redis-{test}-{}", uuid::Uuid::new_v4())),
        IdempotencyKey::new("key-1").unwrap(),
    )
}

/// A claim request for `body` with the given lease.
pub fn claim_req(id: &RecordKey, body: &str, lease: Duration) -> ClaimRequest {
    ClaimRequest::new(id.clone(), fp(body), lease, WINDOW, RETENTION)
}

/// A response whose body says who wrote it.
pub fn response(body: &str) -> StoredResponse {
    StoredResponse::new(
        201,
        vec![
            ("content-type".into(), b"application/json".to_vec()),
            ("x-multi".into(), b"1".to_vec()),
            ("x-multi".into(), b"2".to_vec()),
        ],
        body.as_bytes().to_vec(),
    )
}

/// A TCP port on 127.0.0.1 that nothing listens on (now).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `redis-server` child process of a test's own (so that commands can be counted, or the
/// server killed), killed with SIGKILL and reaped when dropped, on every path.
pub struct PrivateRedis {
    child: Option<std::process::Child>,
    /// The port it listens on, on 127.0.0.1.
    pub port: u16,
    _dir: Option<tempfile::TempDir>,
}

impl PrivateRedis {
    /// Whether the `redis-server` binary is installed (a test that needs one skips otherwise,
    /// after printing why).
    pub fn installed() -> bool {
        let ok = std::process::Command::new("redis-server")
            .arg("--version")
            .stdout(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("skipping: the redis-server binary is not installed");
        }
        ok
    }

    /// Starts one on a free port in a directory of its own (deleted when dropped), keeping
    /// nothing on disk unless `args` (later options win) say otherwise; waits until it listens.
    pub fn start(args: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut s = Self::start_at(free_port(), dir.path(), args);
        s._dir = Some(dir);
        s
    }

    /// Starts one on `port` with its files in `dir` (kept: a restart on the same directory
    /// finds them), keeping nothing on disk unless `args` say otherwise; waits until it listens.
    pub fn start_at(port: u16, dir: &std::path::Path, args: &[&str]) -> Self {
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
            .arg("--dir")
            .arg(dir)
            .args(args)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "redis-server did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Self {
            child: Some(child),
            port,
            _dir: None,
        }
    }

    /// Its URL, `redis://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// Kills it with SIGKILL (no shutdown, no final save) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A plain connection to a test server (one endpoint, or a cluster through its seeds), beside
/// the store's own, to look at and change keys directly.
pub enum Raw {
    Single(redis::aio::MultiplexedConnection),
    Cluster(redis::cluster_async::ClusterConnection),
}

impl Raw {
    /// Opens one to `url` (`redis://…`, or `redis+cluster://host:port,…`; Oncely's query
    /// parameters are dropped).
    pub async fn open(url: &str) -> Self {
        let base = url.split('?').next().unwrap_or(url);
        match base.strip_prefix("redis+cluster://") {
            Some(hosts) => {
                let seeds: Vec<String> = hosts
                    .trim_end_matches('/')
                    .split(',')
                    .map(|h| format!("redis://{h}"))
                    .collect();
                let client = redis::cluster::ClusterClient::new(seeds).unwrap();
                Self::Cluster(client.get_async_connection().await.unwrap())
            }
            None => {
                let client = redis::Client::open(base).unwrap();
                Self::Single(client.get_multiplexed_async_connection().await.unwrap())
            }
        }
    }

    /// Runs `cmd` (on a cluster, on the primary of its key's slot).
    pub async fn query<T: redis::FromRedisValue>(&mut self, cmd: &redis::Cmd) -> T {
        match self {
            Self::Single(c) => cmd.query_async(c).await.unwrap(),
            Self::Cluster(c) => cmd.query_async(c).await.unwrap(),
        }
    }
}

/// The score of `id`'s entry in its `kind` index (epoch milliseconds), if it has one.
pub async fn entry(
    raw: &mut Raw,
    store: &oncely_redis::RedisStore,
    kind: oncely_redis::IndexKind,
    id: &RecordKey,
) -> Option<i64> {
    let score: Option<f64> = raw
        .query(
            redis::cmd("ZSCORE")
                .arg(store.index_key_of(id, kind))
                .arg(store.key_of(id)),
        )
        .await;
    score.map(|s| s as i64)
}
