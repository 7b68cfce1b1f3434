//! Shared helpers for the PostgreSQL tests. Every test works in scopes of its own (fresh UUIDs),
//! so the tests can share one database with each other and with other crates' tests.
#![allow(dead_code, unreachable_pub)]

use oncely_core::{Clock, ManualClock};
use oncely_postgres::PostgresStore;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::sync::Arc;
use std::time::Duration;

/// The test database URL, or `None` (after printing why) to skip.
pub fn url() -> Option<String> {
    match std::env::var("ONCELY_TEST_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            eprintln!("skipping: ONCELY_TEST_POSTGRES_URL is unset (a PostgreSQL URL is needed)");
            None
        }
    }
}

/// A migrated store from `PostgresStore::connect` on `clock`.
pub async fn store(clock: impl Clock) -> Option<PostgresStore> {
    let url = url()?;
    let store = PostgresStore::connect(&url)
        .await
        .expect("connect")
        .with_clock(Arc::new(clock));
    store.migrate().await.expect("migrate");
    Some(store)
}

/// A store on its own pool of `max` connections, with the given `lock_timeout` and extra
/// connection settings (e.g. `default_transaction_isolation`): a separate "server instance".
pub async fn instance(
    clock: &ManualClock,
    max: u32,
    lock_timeout: Duration,
    settings: &[(&str, &str)],
) -> Option<PostgresStore> {
    let url = url()?;
    let mut options: PgConnectOptions = url.parse().expect("url");
    let lock_timeout = format!("{}ms", lock_timeout.as_millis());
    options = options.options([("lock_timeout", lock_timeout.as_str())]);
    options = options.options(settings.iter().copied());
    let pool = PgPoolOptions::new()
        .max_connections(max)
        .acquire_timeout(Duration::from_secs(30))
        .connect_with(options)
        .await
        .expect("connect");
    let store = PostgresStore::from_pool(pool, Arc::new(clock.clone()));
    store.migrate().await.expect("migrate");
    Some(store)
}

/// A scope nobody else uses.
pub fn fresh_scope(tag: &str) -> oncely_core::Scope {
    oncely_core::Scope::new(format!("pg-{tag}-{}", uuid::Uuid::new_v4()))
}
