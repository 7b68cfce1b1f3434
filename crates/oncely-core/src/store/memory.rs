//! The in-memory store: one process, tests and demos. Records vanish with the process.

use super::operator::{
    self, Change, Operator, OperatorError, RecordFilter, RecordPage, RecordVersion,
};
use super::{
    ClaimOutcome, ClaimRequest, Decision, KeyStore, Maintenance, ReapReport, RedriveNote,
    StoreError, decide, next_redrives, redrive_allowed,
};
use crate::clock::{Clock, SystemClock, duration_millis};
use crate::key::RecordKey;
use crate::record::{FencingToken, Record, RecordState, Redrives, StoredResponse, UnixMillis};
use crate::store::{Claim, lease_millis};
use async_trait::async_trait;
use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

/// A [`KeyStore`] in a mutex over a map.
///
/// Why a plain `std::sync::Mutex`: every operation is a short, non-async critical section (no
/// `.await` while the lock is held), so a blocking mutex is both correct and cheaper than an
/// async one; holding it across the whole decision is what makes each claim atomic.
#[derive(Clone)]
pub struct MemoryStore {
    records: Arc<Mutex<HashMap<RecordKey, Record>>>,
    clock: Arc<dyn Clock>,
}

impl std::fmt::Debug for MemoryStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MemoryStore")
            .field("records", &self.lock().len())
            .finish()
    }
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store on the system clock.
    pub fn new() -> Self {
        Self::with_clock(Arc::new(SystemClock))
    }

    /// An empty store on the given clock.
    pub fn with_clock(clock: Arc<dyn Clock>) -> Self {
        Self {
            records: Arc::default(),
            clock,
        }
    }

    fn lock(&self) -> MutexGuard<'_, HashMap<RecordKey, Record>> {
        // A panic while holding the lock cannot leave a record half-written (every update is a
        // single assignment), so a poisoned lock is safe to keep using.
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn with_owned<T>(
        &self,
        id: &RecordKey,
        token: FencingToken,
        f: impl FnOnce(&mut Record, UnixMillis) -> T,
    ) -> Result<T, StoreError> {
        let now = self.clock.now_millis();
        let mut map = self.lock();
        match map.get_mut(id) {
            Some(rec)
                if rec.token == token && matches!(rec.state, RecordState::InFlight { .. }) =>
            {
                Ok(f(rec, now))
            }
            _ => Err(StoreError::Fenced),
        }
    }
}

#[async_trait]
impl KeyStore for MemoryStore {
    async fn claim(&self, req: ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        let now = self.clock.now_millis();
        let mut map = self.lock();
        match decide(map.get(&req.id), &req, now) {
            Decision::Answer(a) => Ok(a),
            Decision::Claim {
                token,
                kind,
                recovery_point,
            } => {
                let lease_expires_at = now.saturating_add(lease_millis(req.lease));
                let previous = map.get(&req.id);
                let (created_at, request, redrives) = match (kind, previous) {
                    // A takeover resumes the same request: keep its original claim time and
                    // the completer's attempts on it.
                    (super::ClaimKind::Takeover, Some(prev)) => (
                        prev.created_at,
                        prev.request.clone().or(req.request.clone()),
                        prev.redrives,
                    ),
                    _ => (now, req.request.clone(), Redrives::default()),
                };
                map.insert(
                    req.id.clone(),
                    Record {
                        scope: req.id.scope.clone(),
                        key: req.id.key.clone(),
                        fingerprint: req.fingerprint,
                        token,
                        state: RecordState::InFlight {
                            lease_expires_at,
                            recovery_point: recovery_point.clone(),
                        },
                        created_at,
                        expires_at: now.saturating_add(duration_millis(req.retention)),
                        request,
                        redrives,
                    },
                );
                Ok(ClaimOutcome::Claimed(Claim {
                    token,
                    lease_expires_at,
                    recovery_point,
                    kind,
                }))
            }
        }
    }

    async fn renew(
        &self,
        id: &RecordKey,
        token: FencingToken,
        lease: Duration,
    ) -> Result<UnixMillis, StoreError> {
        self.with_owned(id, token, |rec, now| {
            let until = now.saturating_add(lease_millis(lease));
            if let RecordState::InFlight {
                lease_expires_at, ..
            } = &mut rec.state
            {
                *lease_expires_at = until;
            }
            until
        })
    }

    async fn checkpoint(
        &self,
        id: &RecordKey,
        token: FencingToken,
        recovery_point: &str,
        lease: Duration,
    ) -> Result<(), StoreError> {
        self.with_owned(id, token, |rec, now| {
            rec.state = RecordState::InFlight {
                lease_expires_at: now.saturating_add(lease_millis(lease)),
                recovery_point: Some(recovery_point.to_owned()),
            };
        })
    }

    async fn complete(
        &self,
        id: &RecordKey,
        token: FencingToken,
        response: StoredResponse,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.with_owned(id, token, |rec, now| {
            rec.state = RecordState::Complete {
                response,
                completed_at: now,
            };
            rec.expires_at = now.saturating_add(duration_millis(retention));
            // Only the completer reads the request, and only from in-flight records.
            rec.request = None;
        })
    }

    async fn release(&self, id: &RecordKey, token: FencingToken) -> Result<(), StoreError> {
        self.with_owned(id, token, |rec, _| {
            rec.state = RecordState::Released;
            rec.request = None;
        })
    }

    async fn get(&self, id: &RecordKey) -> Result<Option<Record>, StoreError> {
        Ok(self.lock().get(id).cloned())
    }
}

#[async_trait]
impl Maintenance for MemoryStore {
    async fn reap(&self, batch: usize) -> Result<ReapReport, StoreError> {
        let now = self.clock.now_millis();
        let mut map = self.lock();
        let mut due: Vec<(UnixMillis, RecordKey)> = map
            .iter()
            .filter(|(_, r)| r.expires_at <= now)
            .map(|(k, r)| (r.expires_at, k.clone()))
            .collect();
        due.sort_by_key(|(at, _)| *at);
        let mut report = ReapReport::default();
        for (_, k) in due.into_iter().take(batch) {
            if let Some(r) = map.remove(&k) {
                report.deleted += 1;
                if matches!(r.state, RecordState::InFlight { .. }) {
                    report.orphaned += 1;
                }
            }
        }
        Ok(report)
    }

    async fn list_abandoned(
        &self,
        grace: Duration,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        let now = self.clock.now_millis();
        let cutoff = now.saturating_sub(duration_millis(grace));
        let map = self.lock();
        let mut out: Vec<Record> = map
            .values()
            .filter(|r| {
                matches!(r.state, RecordState::InFlight { lease_expires_at, .. } if lease_expires_at <= cutoff)
                    && r.redrives.marked_at.is_none()
                    && r.redrives.next_attempt_at.is_none_or(|at| at <= now)
            })
            .cloned()
            .collect();
        // Oldest lease first; ties in (scope, key) order, so the listing is deterministic.
        out.sort_by(|x, y| {
            let lease = |r: &Record| match r.state {
                RecordState::InFlight {
                    lease_expires_at, ..
                } => lease_expires_at,
                _ => 0,
            };
            lease(x)
                .cmp(&lease(y))
                .then_with(|| (&x.scope, &x.key).cmp(&(&y.scope, &y.key)))
        });
        out.truncate(limit);
        Ok(out)
    }

    async fn note_redrive(
        &self,
        id: &RecordKey,
        token: FencingToken,
        attempts_seen: u32,
        note: RedriveNote,
    ) -> Result<Redrives, StoreError> {
        let now = self.clock.now_millis();
        let mut map = self.lock();
        match map.get_mut(id) {
            Some(rec) if redrive_allowed(rec, token, attempts_seen, now) => {
                rec.redrives = next_redrives(rec.redrives, note, now);
                Ok(rec.redrives)
            }
            _ => Err(StoreError::Fenced),
        }
    }

    async fn list_marked(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        let map = self.lock();
        let mut out: Vec<Record> = map.values().filter(|r| r.is_marked()).cloned().collect();
        out.sort_by(|x, y| {
            (x.redrives.marked_at, &x.scope, &x.key).cmp(&(y.redrives.marked_at, &y.scope, &y.key))
        });
        out.truncate(limit);
        Ok(out)
    }
}

impl MemoryStore {
    /// Checks `change` on the record of `id` and writes what `next` makes of it, under one lock.
    fn change(
        &self,
        id: &RecordKey,
        seen: RecordVersion,
        change: Change,
        next: impl FnOnce(&Record, UnixMillis) -> Record,
    ) -> Result<Record, OperatorError> {
        let now = self.clock.now_millis();
        let mut map = self.lock();
        operator::check_change(map.get(id), seen, change, now)?;
        let rec = map.get_mut(id).ok_or(OperatorError::NotFound)?;
        *rec = next(rec, now);
        Ok(rec.clone())
    }
}

#[async_trait]
impl Operator for MemoryStore {
    async fn list_records(
        &self,
        filter: &RecordFilter,
        limit: usize,
        cursor: Option<&str>,
    ) -> Result<RecordPage, OperatorError> {
        let limit = operator::page_size(limit);
        let (scope, key) = operator::cursor_start(cursor)?;
        let now = self.clock.now_millis();
        let map = self.lock();
        // Every record after the cursor that passes the filter, in (scope, key) order.
        let mut read: Vec<&Record> = map
            .values()
            .filter(|r| (r.scope.as_str(), r.key.as_str()) > (scope.as_str(), key.as_str()))
            .filter(|r| filter.matches(r, now))
            .collect();
        read.sort_by(|x, y| (&x.scope, &x.key).cmp(&(&y.scope, &y.key)));
        read.truncate(limit);
        let read = read.into_iter().cloned().collect();
        Ok(operator::page_of(read, limit, filter, now))
    }

    async fn release_record(
        &self,
        id: &RecordKey,
        seen: RecordVersion,
        force: bool,
    ) -> Result<Record, OperatorError> {
        self.change(id, seen, Change::Release { force }, |rec, _| {
            operator::released(rec, seen)
        })
    }

    async fn resolve_record(
        &self,
        id: &RecordKey,
        seen: RecordVersion,
        response: StoredResponse,
        retention: Duration,
        force: bool,
    ) -> Result<Record, OperatorError> {
        self.change(id, seen, Change::Resolve { force }, |rec, now| {
            operator::resolved(rec, seen, response, retention, now)
        })
    }

    async fn retry_record(
        &self,
        id: &RecordKey,
        seen: RecordVersion,
        attempts: u32,
    ) -> Result<Record, OperatorError> {
        self.change(id, seen, Change::Retry, |rec, _| {
            operator::retried(rec, seen, attempts)
        })
    }
}
