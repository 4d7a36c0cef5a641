//! The durable store: SQLite in WAL mode (placeholder; being written).

use std::path::Path;

use super::{Store, StoreError, StoreResult};
use crate::domain::records::{Change, Record};

#[derive(Debug)]
pub struct SqliteStore {
    _private: (),
}

impl SqliteStore {
    /// Opens the store in `dir`, creating it when absent.
    pub fn open(dir: &Path) -> StoreResult<Self> {
        Err(StoreError(format!(
            "the SQLite store ({}) is not built yet",
            dir.display()
        )))
    }
}

impl Store for SqliteStore {
    fn name(&self) -> &'static str {
        "sqlite"
    }

    fn load(&mut self) -> StoreResult<Vec<Record>> {
        Ok(Vec::new())
    }

    fn commit(&mut self, _changes: &[Change]) -> StoreResult<()> {
        Err(StoreError("not built yet".into()))
    }

    fn size_bytes(&self) -> u64 {
        0
    }
}
