//! The memory stores. [`MemoryStore`]: records kept in this process, gone
//! at exit, for tests; a clone shares the records, so a test can stop an
//! engine and start another on what the first one kept. [`Volatile`]: no
//! records at all (`serve --store memory`): the engine's state is all there
//! is, so nothing is encoded or copied on the way.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::{Store, StoreError, StoreResult};
use crate::domain::records::{Change, Kind, Record};

/// The records, and the bytes of their keys and values, kept up to date by
/// every commit: the writer asks for the size after each batch, and
/// counting it by walking every record made each batch cost O(records).
#[derive(Debug, Default)]
struct Tables {
    records: BTreeMap<(Kind, Vec<u8>), Vec<u8>>,
    bytes: usize,
}

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
            .records
            .iter()
            .map(|((kind, key), value)| Record {
                kind: *kind,
                key: key.clone(),
                value: value.clone(),
            })
            .collect())
    }

    fn commit(&mut self, changes: &[Change]) -> StoreResult<()> {
        let mut tables = self.records()?;
        let Tables { records, bytes } = &mut *tables;
        for change in changes {
            let key_bytes = change.key.len();
            let key = (change.kind, change.key.clone());
            let replaced = match &change.value {
                Some(value) => {
                    *bytes += key_bytes + value.len();
                    records.insert(key, value.clone())
                }
                None => records.remove(&key),
            };
            if let Some(old) = replaced {
                *bytes -= key_bytes + old.len();
            }
        }
        Ok(())
    }

    fn size_bytes(&self) -> u64 {
        self.records().map_or(0, |tables| tables.bytes as u64)
    }

    fn commits_in_place(&self) -> bool {
        true
    }
}

/// The store of `serve --store memory`: it keeps nothing, and says so
/// ([`Store::keeps_records`]), so the state journals no changes for it.
/// What a process knew is gone when it exits.
#[derive(Debug, Clone, Copy, Default)]
pub struct Volatile;

impl Store for Volatile {
    fn name(&self) -> &'static str {
        "memory"
    }

    fn load(&mut self) -> StoreResult<Vec<Record>> {
        Ok(Vec::new())
    }

    fn commit(&mut self, _changes: &[Change]) -> StoreResult<()> {
        Ok(())
    }

    fn size_bytes(&self) -> u64 {
        0
    }

    fn commits_in_place(&self) -> bool {
        true
    }

    fn keeps_records(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn change(key: &[u8], value: Option<&[u8]>) -> Change {
        Change {
            kind: Kind::Meta,
            key: key.to_vec(),
            value: value.map(<[u8]>::to_vec),
        }
    }

    #[test]
    fn size_counts_the_records_kept_through_replacements_and_deletions() {
        let mut store = MemoryStore::new();
        store
            .commit(&[change(b"a", Some(b"123")), change(b"bb", Some(b"4"))])
            .unwrap();
        assert_eq!(store.size_bytes(), 1 + 3 + 2 + 1);
        store
            .commit(&[
                change(b"a", Some(b"12345")),
                change(b"bb", None),
                change(b"c", None),
            ])
            .unwrap();
        assert_eq!(store.size_bytes(), 1 + 5);
        let walked: usize = store
            .load()
            .unwrap()
            .iter()
            .map(|record| record.key.len() + record.value.len())
            .sum();
        assert_eq!(store.size_bytes(), walked as u64);
    }
}
