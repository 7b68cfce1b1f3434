//! Test helpers: a store on a fresh temporary database file that lives as long as the store.

use oncely_core::{ManualClock, StoreError};
use oncely_sqlite::SqliteStore;
use std::path::{Path, PathBuf};
use std::sync::Arc;

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

impl oncely_core::StoreWrapper for TempStore {
    type Inner = SqliteStore;
    fn inner(&self) -> Result<&SqliteStore, StoreError> {
        Ok(&self.store)
    }
}
