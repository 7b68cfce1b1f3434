//! The shared backend conformance suite on the in-memory store.

use oncely_core::{ManualClock, MemoryStore};
use std::sync::Arc;

async fn make(clock: ManualClock) -> Option<MemoryStore> {
    Some(MemoryStore::with_clock(Arc::new(clock)))
}

oncely_conformance::conformance_tests!(make);
oncely_conformance::operator_conformance_tests!(make);
