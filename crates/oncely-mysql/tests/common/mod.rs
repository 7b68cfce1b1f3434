//! Shared helpers for the MySQL / MariaDB tests. Every test works in scopes of its own (fresh
//! UUIDs), so the tests can share one database with each other and with other crates' tests.
#![allow(dead_code, unreachable_pub)]

use oncely_core::{Clock, ManualClock};
use oncely_mysql::MySqlStore;
use sqlx::mysql::{MySqlConnectOptions, MySqlPoolOptions};
use std::sync::Arc;
use std::time::Duration;

/// The test database URL, or `None` (after printing why) to skip.
pub fn url() -> Option<String> {
    match std::env::var("ONCELY_TEST_MYSQL_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            eprintln!(
                "skipping: ONCELY_TEST_MYSQL_URL is unset (a MySQL or MariaDB URL is needed)"
            );
            None
        }
    }
}

/// A migrated store from `MySqlStore::connect` on `clock`.
pub async fn store(clock: impl Clock) -> Option<MySqlStore> {
    let url = url()?;
    let store = MySqlStore::connect(&url)
        .await
        .expect("connect")
        .with_clock(Arc::new(clock));
    store.migrate().await.expect("migrate");
    Some(store)
}

/// A store on a plain pool of `max` connections (none of `connect`'s session settings: the
/// server's defaults, a 50-second lock wait among them): a separate "server instance" whose
/// application configured its own pool.
pub async fn instance(clock: &ManualClock, max: u32) -> Option<MySqlStore> {
    let url = url()?;
    let options: MySqlConnectOptions = url.parse().expect("url");
    let pool = MySqlPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(options)
        .await
        .expect("connect");
    let store = MySqlStore::from_pool(pool, Arc::new(clock.clone()));
    store.migrate().await.expect("migrate");
    Some(store)
}

/// A scope nobody else uses.
pub fn fresh_scope(tag: &str) -> oncely_core::Scope {
    oncely_core::Scope::new(format!("my-{tag}-{}", uuid::Uuid::new_v4()))
}
