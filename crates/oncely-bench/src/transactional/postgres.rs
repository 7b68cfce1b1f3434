//! PostgreSQL: the `bench_orders` table, the statements of the handlers (`handlers.rs`), and
//! [`Bench::postgres`] (directly, or through the latency proxy).

use super::endpoint::with_scope;
use super::handlers::{TextOrders, baseline, floor, layer};
use super::{Bench, Db, PATH, Pool};
use axum::Router;
use axum::routing::post;
use oncely_core::Policy;
use oncely_postgres::PostgresStore;
use std::time::Duration;

const PG_SCHEMA: &str = "CREATE TABLE IF NOT EXISTS bench_orders (
    id TEXT PRIMARY KEY, scope TEXT NOT NULL, idempotency_key TEXT NOT NULL,
    items TEXT NOT NULL, created_at BIGINT NOT NULL)";
pub(super) const PG_INDEX: &str =
    "CREATE INDEX IF NOT EXISTS bench_orders_by_key ON bench_orders (idempotency_key)";
const PG_INSERT_ORDER: &str = "INSERT INTO bench_orders (id, scope, idempotency_key, items, created_at) \
     VALUES ($1, $2, $3, $4, $5)";
const PG_FLOOR_CLAIM: &str = "INSERT INTO oncely_idempotency_keys \
     (scope, key, fingerprint_version, fingerprint, token, state, lease_expires_at, created_at, \
      expires_at) VALUES ($1, $2, 1, $3, 1, 'in_flight', $4, $5, $6) \
     ON CONFLICT (scope, key) DO NOTHING RETURNING token";
const PG_FLOOR_COMPLETE: &str = "UPDATE oncely_idempotency_keys SET state = 'complete', \
     lease_expires_at = NULL, completed_at = $4, response_status = 201, response_headers = $5, \
     response_body = $6, response_body_retained = TRUE, expires_at = $7 \
     WHERE scope = $1 AND key = $2 AND token = $3 AND state = 'in_flight'";

impl TextOrders for PostgresStore {
    const BEGIN: Option<&'static str> = None;
    const INSERT_ORDER: &'static str = PG_INSERT_ORDER;
    const FLOOR_CLAIM: &'static str = PG_FLOOR_CLAIM;
    const FLOOR_COMPLETE: &'static str = PG_FLOOR_COMPLETE;
}

impl Bench {
    /// PostgreSQL from `ONCELY_BENCH_POSTGRES_URL` (or `ONCELY_TEST_POSTGRES_URL`), migrated,
    /// with the `bench_orders` table; the reason it is skipped otherwise.
    ///
    /// # Errors
    ///
    /// A message naming the missing variable, or the database's error.
    pub async fn postgres() -> Result<Self, String> {
        Self::postgres_with_rtt(None).await
    }

    /// [`Bench::postgres`] through a [`LatencyProxy`](crate::proxy::LatencyProxy) that adds
    /// `rtt` to every round trip (half of it each way; zero: no delay, round trips still
    /// counted, see [`Bench::round_trips`]); `None`: direct, as [`Bench::postgres`]. Every
    /// connection of the pool, migrations included, goes through the proxy.
    ///
    /// # Errors
    ///
    /// As [`Bench::postgres`], and the proxy's if it cannot start.
    pub async fn postgres_with_rtt(rtt: Option<Duration>) -> Result<Self, String> {
        let direct = crate::env_url("ONCELY_BENCH_POSTGRES_URL", "ONCELY_TEST_POSTGRES_URL")
            .ok_or("ONCELY_BENCH_POSTGRES_URL is not set")?;
        let proxy = match rtt {
            Some(rtt) => Some(
                crate::proxy::LatencyProxy::start(&crate::proxy::upstream_of(&direct)?, rtt / 2)
                    .await
                    .map_err(|e| e.to_string())?,
            ),
            None => None,
        };
        let url = match &proxy {
            Some(p) => p.url(&direct)?,
            None => direct,
        };
        // `ONCELY_BENCH_PG_COMPLETION_WITH_COMMIT=1`: the layer sends its completion with the
        // commit in one message (`PostgresStore::with_completion_sent_with_commit`);
        // `ONCELY_BENCH_PG_CLAIM_WITH_BEGIN=1`: its claim with the begin
        // (`PostgresStore::with_claim_sent_with_begin`).
        let on = |name: &str| std::env::var(name).is_ok_and(|v| v == "1");
        let store = PostgresStore::connect(&url)
            .await
            .map_err(|e| e.to_string())?
            .with_completion_sent_with_commit(on("ONCELY_BENCH_PG_COMPLETION_WITH_COMMIT"))
            .with_claim_sent_with_begin(on("ONCELY_BENCH_PG_CLAIM_WITH_BEGIN"));
        store.migrate().await.map_err(|e| e.to_string())?;
        let pool = store.pool().clone();
        for ddl in [PG_SCHEMA, PG_INDEX] {
            sqlx::query(ddl)
                .execute(&pool)
                .await
                .map_err(|e| e.to_string())?;
        }
        Ok(Self {
            db: Db::Postgres,
            pool: Pool::Pg(pool.clone()),
            baseline: with_scope(
                Router::new()
                    .route(PATH, post(baseline::<PostgresStore>))
                    .with_state(pool.clone()),
            ),
            floor: with_scope(
                Router::new()
                    .route(PATH, post(floor::<PostgresStore>))
                    .with_state(pool),
            ),
            layer: with_scope(
                Router::new()
                    .route(PATH, post(layer::<PostgresStore>))
                    .layer(oncely_sqlx::layer(store, Policy::default())),
            ),
            proxy,
            _dir: None,
        })
    }
}
