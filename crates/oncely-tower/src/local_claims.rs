//! Duplicates of a claim this process is running, held in the process instead of in the
//! store (see [`Claimer::local_wait`](crate::Claimer::local_wait)).
//!
//! A transactional claim's duplicate would otherwise wait inside the database, for the key's
//! row or for SQLite's write lock, and hold a pooled connection all that time: a burst of
//! retries of one slow request could take every connection, and other keys' requests would
//! then fail to get one. Here a duplicate waits for the first request's turn on the key to end
//! (a semaphore of one permit per key, removed when nobody uses it), with no connection, and
//! claims after it, when the store answers at once (a replay, or the key free again).

use oncely_core::RecordKey;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// The keys this process is claiming or running, each with its queue.
#[derive(Debug, Default)]
pub(crate) struct LocalClaims {
    keys: Mutex<HashMap<RecordKey, (Arc<Semaphore>, usize)>>,
}

impl LocalClaims {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RecordKey, (Arc<Semaphore>, usize)>> {
        self.keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Waits up to `bound` for the key's turn: `Some` holds it (dropping the [`Hold`] passes
    /// it on), `None` when another request of this process kept it for all of `bound`.
    pub(crate) async fn turn(self: &Arc<Self>, id: &RecordKey, bound: Duration) -> Option<Hold> {
        let semaphore = {
            let mut keys = self.lock();
            let entry = keys
                .entry(id.clone())
                .or_insert_with(|| (Arc::new(Semaphore::new(1)), 0));
            entry.1 += 1;
            Arc::clone(&entry.0)
        };
        let user = User {
            claims: Arc::clone(self),
            id: id.clone(),
        };
        // Uncontended (the usual case) this is ready at once and sets no timer.
        let permit = match Arc::clone(&semaphore).try_acquire_owned() {
            Ok(p) => p,
            Err(_) => tokio::time::timeout(bound, semaphore.acquire_owned())
                .await
                .ok()?
                .ok()?,
        };
        Some(Hold {
            _permit: permit,
            _user: user,
        })
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().len()
    }
}

/// One request's interest in a key: the key's entry goes when the last one ends.
struct User {
    claims: Arc<LocalClaims>,
    id: RecordKey,
}

impl Drop for User {
    fn drop(&mut self) {
        let mut keys = self.claims.lock();
        if let Some(entry) = keys.get_mut(&self.id) {
            entry.1 -= 1;
            if entry.1 == 0 {
                keys.remove(&self.id);
            }
        }
    }
}

/// A request's turn on its key (the permit first, then the interest, in drop order).
pub(crate) struct Hold {
    _permit: OwnedSemaphorePermit,
    _user: User,
}

#[cfg(test)]
mod tests {
    use super::*;
    use oncely_core::{IdempotencyKey, Scope};

    fn id(k: &str) -> RecordKey {
        RecordKey::new(Scope::new("s"), IdempotencyKey::new(k).unwrap())
    }

    // On tokio's paused clock: the waits below are virtual time, so the bound is checked
    // exactly (no real timing).
    #[tokio::test(start_paused = true)]
    async fn one_turn_per_key_others_wait_then_pass() {
        let claims = Arc::new(LocalClaims::default());
        let first = claims.turn(&id("a"), Duration::from_secs(1)).await.unwrap();
        // Another key is not held up.
        let other = claims.turn(&id("b"), Duration::from_millis(1)).await;
        assert!(other.is_some());
        drop(other);
        // The same key waits for the bound, then gives up.
        let started = tokio::time::Instant::now();
        assert!(
            claims
                .turn(&id("a"), Duration::from_millis(50))
                .await
                .is_none()
        );
        assert!(
            started.elapsed() >= Duration::from_millis(50),
            "it waited its bound"
        );
        // A waiter gets the turn as soon as the holder ends.
        let waiter = {
            let claims = Arc::clone(&claims);
            tokio::spawn(async move {
                claims
                    .turn(&id("a"), Duration::from_secs(5))
                    .await
                    .is_some()
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(first);
        assert!(waiter.await.unwrap());
        // Nobody left: no entry kept.
        assert_eq!(claims.len(), 0);
    }
}
