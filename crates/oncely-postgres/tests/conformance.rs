//! The shared backend conformance suite on PostgreSQL (skipped when
//! `ONCELY_TEST_POSTGRES_URL` is unset).

mod common;

use oncely_core::ManualClock;
use oncely_postgres::PostgresStore;

async fn make(clock: ManualClock) -> Option<PostgresStore> {
    common::store(clock).await
}

oncely_core::conformance_tests!(make);
