//! The memory store: records kept in this process, gone at exit. For tests
//! and benchmarks (`serve --store memory`); a clone shares the records, so a
//! test can stop an engine and start another on what the first one kept.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::{Store, StoreError, StoreResult};
use crate::domain::records::{Change, Kind, Record};

type Tables = BTreeMap<(Kind, Vec<u8>), Vec<u8>>;

#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    records: Arc<Mutex<Tables>>,
}

impl MemoryStore {
    pub fn new() -> Self {
        Self::default()
    }

    fn records(&self) -> StoreResult<std::sync::MutexGuard<'_, Tables>> {
        self.records
            .lock()
            .map_err(|_| StoreError("the memory store failed in an earlier commit".into()))
    }
}

impl Store for MemoryStore {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn load(&mut self) -> StoreResult<Vec<Record>> {
        Ok(self
            .records()?
            .iter()
            .map(|((kind, key), value)| Record {
                kind: *kind,
                key: key.clone(),
                value: value.clone(),
            })
            .collect())
    }

    fn commit(&mut self, changes: &[Change]) -> StoreResult<()> {
        let mut records = self.records()?;
        for change in changes {
            let key = (change.kind, change.key.clone());
            match &change.value {
                Some(value) => records.insert(key, value.clone()),
                None => records.remove(&key),
            };
        }
        Ok(())
    }

    fn size_bytes(&self) -> u64 {
        self.records().map_or(0, |records| {
            records
                .iter()
                .map(|((_, key), value)| key.len() + value.len())
                .sum::<usize>() as u64
        })
    }
}
