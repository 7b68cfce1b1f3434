//! Test helpers: a store on a fresh temporary database file that lives as long as the store.

use async_trait::async_trait;
use oncely_core::{
    ClaimOutcome, ClaimRequest, FencingToken, KeyStore, ManualClock, ReapReport, Record, RecordKey,
    RedriveNote, Redrives, StoreError, StoredResponse, UnixMillis,
};
use oncely_sqlite::SqliteStore;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

/// A [`SqliteStore`] on its own database file in a temporary directory, deleted on drop.
#[derive(Debug)]
pub(crate) struct TempStore {
    pub(crate) store: SqliteStore,
    path: PathBuf,
    _dir: tempfile::TempDir,
}

impl TempStore {
    /// Opens a fresh file database (through the plain-path form of `connect`) on `clock`.
    pub(crate) async fn open(clock: ManualClock) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("oncely.db");
        let store = SqliteStore::connect(path.to_str().expect("utf-8 path"))
            .await
            .expect("connect")
            .with_clock(Arc::new(clock));
        Self {
            store,
            path,
            _dir: dir,
        }
    }

    /// The database file.
    #[allow(dead_code)]
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl std::ops::Deref for TempStore {
    type Target = SqliteStore;
    fn deref(&self) -> &SqliteStore {
        &self.store
    }
}

#[async_trait]
impl KeyStore for TempStore {
    async fn claim(&self, req: ClaimRequest) -> Result<ClaimOutcome, StoreError> {
        self.store.claim(req).await
    }
    async fn renew(
        &self,
        id: &RecordKey,
        token: FencingToken,
        lease: Duration,
    ) -> Result<UnixMillis, StoreError> {
        self.store.renew(id, token, lease).await
    }
    async fn checkpoint(
        &self,
        id: &RecordKey,
        token: FencingToken,
        recovery_point: &str,
        lease: Duration,
    ) -> Result<(), StoreError> {
        self.store
            .checkpoint(id, token, recovery_point, lease)
            .await
    }
    async fn complete(
        &self,
        id: &RecordKey,
        token: FencingToken,
        response: StoredResponse,
        retention: Duration,
    ) -> Result<(), StoreError> {
        self.store.complete(id, token, response, retention).await
    }
    async fn release(&self, id: &RecordKey, token: FencingToken) -> Result<(), StoreError> {
        self.store.release(id, token).await
    }
    async fn get(&self, id: &RecordKey) -> Result<Option<Record>, StoreError> {
        self.store.get(id).await
    }
    async fn reap(&self, batch: usize) -> Result<ReapReport, StoreError> {
        self.store.reap(batch).await
    }
    async fn list_abandoned(
        &self,
        grace: Duration,
        limit: usize,
    ) -> Result<Vec<Record>, StoreError> {
        self.store.list_abandoned(grace, limit).await
    }
    async fn note_redrive(
        &self,
        id: &RecordKey,
        token: FencingToken,
        attempts_seen: u32,
        note: RedriveNote,
    ) -> Result<Redrives, StoreError> {
        self.store
            .note_redrive(id, token, attempts_seen, note)
            .await
    }
    async fn list_marked(&self, limit: usize) -> Result<Vec<Record>, StoreError> {
        self.store.list_marked(limit).await
    }
}
