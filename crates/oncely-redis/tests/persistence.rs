//! "Redis must keep what it acknowledged": on connect the store reads each
//! node's persistence, refuses a Redis that keeps nothing unless `accept_volatile=true` says
//! the user accepts losing the replay window on restart, and reports (and warns about)
//! `appendfsync everysec`. The test starts its own `redis-server`s on 127.0.0.1:7120 and 7121
//! and reconfigures them with `CONFIG SET`; skips when `redis-server` is not installed. The
//! cluster check skips when `ONCELY_TEST_REDIS_CLUSTER_URL` is unset.

mod common;

use common::PrivateRedis;
use oncely_redis::{ConnectError, Persistence, RedisStore};

/// A fresh directory for the server on `port`.
fn dir(port: u16) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("oncely-persistence-{port}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn config_set(url: &str, name: &str, value: &str) {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query_async(&mut conn)
        .await
        .unwrap();
}

fn only(store: &RedisStore) -> Persistence {
    let p = store.persistence();
    assert_eq!(p.len(), 1, "{p:?}");
    assert_eq!(p[0].0, "", "a single endpoint has no node name");
    p[0].1.clone()
}

#[tokio::test]
async fn a_redis_that_keeps_nothing_is_refused_unless_accepted() {
    if !PrivateRedis::installed() {
        return;
    }
    let _server = PrivateRedis::start_at(7120, &dir(7120), &[]);
    let url = "redis://127.0.0.1:7120";

    // By default: refused, with an error that says why and what to do.
    let err = RedisStore::connect(url).await.unwrap_err();
    let ConnectError::Volatile(v) = &err else {
        panic!("expected a refusal, got {err:?}")
    };
    assert_eq!(v.nodes, vec![(String::new(), Persistence::Nothing)]);
    let msg = err.to_string();
    for says in [
        "persists nothing (appendonly no, save \"\")",
        "a retry across the restart executes the request again",
        "appendonly yes",
        "accept_volatile=true",
    ] {
        assert!(msg.contains(says), "{says:?} missing from: {msg}");
    }

    // Accepted explicitly (URL option): connects, and says what it accepted.
    let store = RedisStore::connect(&format!("{url}?accept_volatile=true"))
        .await
        .unwrap();
    assert_eq!(only(&store), Persistence::Nothing);
    store.ping().await.unwrap();
    // An explicit `false` is the default.
    assert!(matches!(
        RedisStore::connect(&format!("{url}?accept_volatile=false")).await,
        Err(ConnectError::Volatile(_))
    ));

    // Snapshots only: accepted, with a warning that a restart loses writes since the last one.
    config_set(url, "save", "3600 1").await;
    let p = only(&RedisStore::connect(url).await.unwrap());
    assert_eq!(p, Persistence::SnapshotsOnly("3600 1".into()));
    assert!(p.warning().unwrap().contains("since the last snapshot"));

    // The append-only file with fsync every second: accepted, warned (up to a second lost).
    config_set(url, "save", "").await;
    config_set(url, "appendonly", "yes").await;
    config_set(url, "appendfsync", "everysec").await;
    let p = only(&RedisStore::connect(url).await.unwrap());
    assert_eq!(p, Persistence::AppendOnlyEverySec);
    assert!(!p.keeps_nothing());
    assert!(
        p.warning().unwrap().contains("up to about 1 second"),
        "{p:?}"
    );

    // fsync on every write: accepted, nothing to warn about.
    config_set(url, "appendfsync", "always").await;
    let p = only(&RedisStore::connect(url).await.unwrap());
    assert_eq!(p, Persistence::AppendOnlyAlways);
    assert_eq!(p.warning(), None);
}

#[tokio::test]
async fn where_config_is_forbidden_info_decides_and_unknown_is_refused() {
    if !PrivateRedis::installed() {
        return;
    }
    // CONFIG renamed away, as some managed services do; the append-only file off.
    let _server = PrivateRedis::start_at(7121, &dir(7121), &["--rename-command", "CONFIG", ""]);
    let err = RedisStore::connect("redis://127.0.0.1:7121")
        .await
        .unwrap_err();
    let ConnectError::Volatile(v) = &err else {
        panic!("expected a refusal, got {err:?}")
    };
    assert!(
        matches!(&v.nodes[..], [(_, Persistence::Unconfirmed(_))]),
        "{v:?}"
    );
    assert!(err.to_string().contains("could not confirm"), "{err}");
    let store = RedisStore::connect("redis://127.0.0.1:7121?accept_volatile=1")
        .await
        .unwrap();
    assert!(only(&store).keeps_nothing());
}

#[tokio::test]
async fn every_cluster_node_is_checked() {
    let Some(url) = common::cluster_url() else {
        return;
    };
    let store = RedisStore::connect(&url).await.unwrap();
    let p = store.persistence();
    // 3 primaries and 3 replicas, each with its append-only file (`.ci/redis-cluster.sh`).
    assert_eq!(p.len(), 6, "{p:?}");
    for (node, persistence) in p {
        assert!(node.starts_with("127.0.0.1:"), "{node}");
        assert_eq!(*persistence, Persistence::AppendOnlyEverySec, "{node}");
    }
}
