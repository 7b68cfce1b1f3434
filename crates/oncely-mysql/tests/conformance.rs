//! The shared backend conformance suite on MySQL / MariaDB (skipped when
//! `ONCELY_TEST_MYSQL_URL` is unset).

mod common;

use oncely_core::ManualClock;
use oncely_mysql::MySqlStore;

async fn make(clock: ManualClock) -> Option<MySqlStore> {
    common::store(clock).await
}

oncely_conformance::conformance_tests!(make);

/// A record written before responses kept trailers (its headers column in the oldest form)
/// still replays; a gRPC response keeps its trailers.
#[tokio::test]
async fn legacy_headers_column_still_replays() {
    let Some(store) = common::store(ManualClock::starting_now()).await else {
        return;
    };
    let pool = store.pool().clone();
    oncely_conformance::legacy_record_still_replays(
        &store,
        async |id: &oncely_core::RecordKey, column: Vec<u8>| {
            let done = sqlx::query(
                "UPDATE oncely_idempotency_keys SET response_headers = ? WHERE scope = ? AND `key` = ?",
            )
            .bind(column)
            .bind(id.scope.as_str().as_bytes())
            .bind(id.key.as_str().as_bytes())
            .execute(&pool)
            .await
            .unwrap();
            assert_eq!(done.rows_affected(), 1);
        },
    )
    .await;
}
oncely_conformance::operator_conformance_tests!(make);
