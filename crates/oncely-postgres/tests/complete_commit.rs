//! `PostgresStore::complete_and_commit_in`, the completion sent with the commit in one
//! simple-query message (docs/DESIGN.md, "The completion goes out with the commit"): its values
//! are literals, so a scope and key holding every character that could end a literal (`'`, `\`,
//! `"`, `$`) and non-ASCII text must be stored and found exactly, and the record must then
//! replay the stored answer. The same for the claim sent with its `BEGIN`
//! (`PostgresStore::with_claim_sent_with_begin`, docs/DESIGN.md, "The claim goes out with the
//! begin"), whose insert's values are literals too: there a wrong literal of the fingerprint
//! would answer the replay as a mismatch.
//!
//! Skipped, with a message, when `ONCELY_TEST_POSTGRES_URL` is unset (`.ci/run` sets it).

mod common;

use oncely_conformance::claim_req;
use oncely_core::{
    ClaimOutcome, IdempotencyKey, KeyStore, ManualClock, RecordKey, RecordState, Scope,
    StoredResponse,
};
use std::time::Duration;

#[tokio::test]
async fn quotes_and_backslashes_in_the_scope_and_key_are_stored_exactly() {
    let clock = ManualClock::new(1_700_000_000_000);
    let Some(store) = common::store(clock.clone()).await else {
        return;
    };
    for with_begin in [false, true] {
        stored_exactly(&store.clone().with_claim_sent_with_begin(with_begin)).await;
    }
}

async fn stored_exactly(store: &oncely_postgres::PostgresStore) {
    let scope = Scope::new(format!(r#"pg-o'k\\ключ$o$-{}"#, uuid::Uuid::new_v4()));
    for key in [r"a'b\c", r#"''\\'"--"#, "$o$x$o$"] {
        let id = RecordKey::new(scope.clone(), IdempotencyKey::new(key).unwrap());
        let (outcome, tx) = store.claim_tx(&claim_req(&id, "{}")).await.expect("claim");
        let ClaimOutcome::Claimed(claim) = outcome else {
            panic!("{key}: {outcome:?}");
        };
        let mut tx = tx.expect("a claim comes with its transaction");
        let response = StoredResponse::new(201, vec![], format!(r#"{{"key":"{key}"}}"#).into());
        store
            .complete_and_commit_in(
                &mut tx,
                &id,
                claim.token,
                &response,
                Duration::from_secs(3600),
                false,
            )
            .await
            .unwrap_or_else(|e| panic!("{key}: {e:?}"));
        drop(tx);
        let record = store.get(&id).await.expect("get").expect("the record");
        assert!(
            matches!(record.state, RecordState::Complete { .. }),
            "{key}: {:?}",
            record.state
        );
        assert_eq!((&record.scope, &record.key), (&id.scope, &id.key), "{key}");
        // A second request with the key replays what the first committed.
        let (again, _) = store.claim_tx(&claim_req(&id, "{}")).await.expect("claim");
        match again {
            ClaimOutcome::Replay { response: r, .. } => assert_eq!(r.body, response.body, "{key}"),
            other => panic!("{key}: {other:?}"),
        }
        // Another request body with the key is refused, not replayed.
        let (other, tx) = store
            .claim_tx(&claim_req(&id, r#"{"amount":2}"#))
            .await
            .expect("claim");
        assert!(matches!(other, ClaimOutcome::Mismatch), "{key}: {other:?}");
        assert!(tx.is_none(), "{key}: a mismatch holds no transaction");
    }
}
