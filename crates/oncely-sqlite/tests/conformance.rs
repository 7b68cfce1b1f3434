//! The shared backend conformance suite, on a fresh temporary SQLite file per scenario.

mod common;

async fn make(clock: oncely_core::ManualClock) -> Option<common::TempStore> {
    Some(common::TempStore::open(clock).await)
}

oncely_conformance::conformance_tests!(make);
oncely_conformance::operator_conformance_tests!(make);
