//! `Table`: the hash table the state keeps its records in, built so that
//! growing never stops the world.
//!
//! A `std` `HashMap` doubles in one step: with half a million approvals that
//! moves hundreds of megabytes while every caller waits on the state lock.
//! A `Table` holds each entry next to its hash (growing never rehashes and
//! never touches what the entry points to) and, past [`SPLIT_AT`] entries,
//! spreads them over [`SHARDS`] independent tables, so one growth step moves
//! at most 1/[`SHARDS`] of the entries. Big records are stored boxed by
//! their owners, so a step moves a pointer and a hash per entry.
//!
//! Keys are whatever the caller hashes with [`Table::hash`] and compares in
//! its `eq` closure; a composite key is hashed from borrowed parts, so a
//! lookup allocates nothing. The hasher is `std`'s randomly keyed SipHash
//! by default: keys are chosen by clients, and a predictable hash would let
//! them flood one bucket chain (HashDoS). A table whose keys only this
//! process makes (approval ids, random UUIDs) takes [`OwnKeys`] instead
//! ([`IdTable`]).

use std::fmt;
use std::hash::{BuildHasher, Hash, RandomState};

use hashbrown::HashTable;

/// Shards of a table that has split.
pub(crate) const SHARDS: usize = 256;
/// Entries a single-shard table holds before it splits into [`SHARDS`].
pub(crate) const SPLIT_AT: usize = 1024;
/// Which bits of the hash choose the shard: clear of the low bits that
/// hashbrown uses for the bucket and of the top seven it keeps as a tag.
const SHARD_SHIFT: u32 = 40;

#[derive(Clone)]
struct Slot<T> {
    hash: u64,
    value: T,
}

#[derive(Clone)]
enum Shards<T> {
    One(HashTable<Slot<T>>),
    Many(Box<[HashTable<Slot<T>>]>),
}

/// A hash table that grows a shard at a time; see the module docs.
#[derive(Clone)]
pub(crate) struct Table<T, S = RandomState> {
    hasher: S,
    shards: Shards<T>,
    len: usize,
}

/// The hasher of every map and table whose keys no client chooses: the
/// program's own labels, the operator's names in the policy, ids this
/// process draws. A client can at most look such keys up, which cannot
/// lengthen a probe sequence, so these need no defence against chosen
/// colliding keys (HashDoS) and take foldhash, seeded per map, which hashes
/// a short key in a fraction of SipHash's instructions (BENCHMARKS.md,
/// "Fewer hashes per call"). Maps keyed by what clients send keep `std`'s
/// SipHash.
pub(crate) type OwnKeys = foldhash::fast::RandomState;

/// A [`Table`] of keys no client chooses: approval ids.
pub(crate) type IdTable<T> = Table<T, OwnKeys>;

impl<T, S: Default> Default for Table<T, S> {
    fn default() -> Self {
        Table {
            hasher: S::default(),
            shards: Shards::One(HashTable::new()),
            len: 0,
        }
    }
}

impl<T: fmt::Debug, S: BuildHasher> fmt::Debug for Table<T, S> {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.debug_list().entries(self.iter()).finish()
    }
}

fn slot_hash<T>(slot: &Slot<T>) -> u64 {
    slot.hash
}

impl<T, S: BuildHasher> Table<T, S> {
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The hash a key is found under in this table.
    pub(crate) fn hash<K: Hash + ?Sized>(&self, key: &K) -> u64 {
        self.hasher.hash_one(key)
    }

    fn shard(&self, hash: u64) -> &HashTable<Slot<T>> {
        match &self.shards {
            Shards::One(table) => table,
            Shards::Many(tables) => &tables[shard_index(hash)],
        }
    }

    fn shard_mut(&mut self, hash: u64) -> &mut HashTable<Slot<T>> {
        match &mut self.shards {
            Shards::One(table) => table,
            Shards::Many(tables) => &mut tables[shard_index(hash)],
        }
    }

    pub(crate) fn find(&self, hash: u64, mut eq: impl FnMut(&T) -> bool) -> Option<&T> {
        self.shard(hash)
            .find(hash, |slot| slot.hash == hash && eq(&slot.value))
            .map(|slot| &slot.value)
    }

    pub(crate) fn find_mut(&mut self, hash: u64, mut eq: impl FnMut(&T) -> bool) -> Option<&mut T> {
        self.shard_mut(hash)
            .find_mut(hash, |slot| slot.hash == hash && eq(&slot.value))
            .map(|slot| &mut slot.value)
    }

    /// Inserts an entry the caller knows is not in the table yet.
    pub(crate) fn insert_unique(&mut self, hash: u64, value: T) -> &mut T {
        if self.len >= SPLIT_AT
            && let Shards::One(table) = &mut self.shards
        {
            let mut tables: Vec<HashTable<Slot<T>>> = (0..SHARDS)
                .map(|_| HashTable::with_capacity(SPLIT_AT * 2 / SHARDS))
                .collect();
            for slot in table.drain() {
                tables[shard_index(slot.hash)].insert_unique(slot.hash, slot, slot_hash);
            }
            self.shards = Shards::Many(tables.into_boxed_slice());
        }
        self.len += 1;
        &mut self
            .shard_mut(hash)
            .insert_unique(hash, Slot { hash, value }, slot_hash)
            .into_mut()
            .value
    }

    pub(crate) fn remove(&mut self, hash: u64, mut eq: impl FnMut(&T) -> bool) -> Option<T> {
        let entry = self
            .shard_mut(hash)
            .find_entry(hash, |slot| slot.hash == hash && eq(&slot.value))
            .ok()?;
        let (slot, _) = entry.remove();
        self.len -= 1;
        Some(slot.value)
    }

    /// Keeps the entries for which `keep` is true.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(&mut T) -> bool) {
        let tables = match &mut self.shards {
            Shards::One(table) => std::slice::from_mut(table),
            Shards::Many(tables) => &mut tables[..],
        };
        let mut len = 0;
        for table in tables {
            table.retain(|slot| keep(&mut slot.value));
            len += table.len();
        }
        self.len = len;
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &T> {
        let tables = match &self.shards {
            Shards::One(table) => std::slice::from_ref(table),
            Shards::Many(tables) => &tables[..],
        };
        tables
            .iter()
            .flat_map(|table| table.iter().map(|slot| &slot.value))
    }
}

fn shard_index(hash: u64) -> usize {
    // The mask keeps the index below SHARDS, so the cast cannot truncate.
    (hash >> SHARD_SHIFT) as usize & (SHARDS - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn find(table: &Table<(String, u32)>, key: &str) -> Option<u32> {
        table
            .find(table.hash(key), |(name, _)| name == key)
            .map(|(_, value)| *value)
    }

    #[test]
    fn splits_into_shards_and_keeps_every_entry() {
        let mut table = Table::default();
        let count = SPLIT_AT as u32 * 5;
        for index in 0..count {
            let key = format!("key-{index}");
            let hash = table.hash(key.as_str());
            table.insert_unique(hash, (key, index));
        }
        assert!(matches!(table.shards, Shards::Many(_)));
        assert_eq!(table.len(), count as usize);
        assert_eq!(table.iter().count(), count as usize);
        for index in 0..count {
            assert_eq!(find(&table, &format!("key-{index}")), Some(index));
        }
        assert_eq!(find(&table, "absent"), None);

        let hash = table.hash("key-7");
        assert_eq!(
            table.remove(hash, |(name, _)| name == "key-7"),
            Some(("key-7".into(), 7))
        );
        assert_eq!(table.remove(hash, |(name, _)| name == "key-7"), None);
        assert_eq!(find(&table, "key-7"), None);
        if let Some(entry) = table.find_mut(table.hash("key-8"), |(name, _)| name == "key-8") {
            entry.1 = 80;
        }
        assert_eq!(find(&table, "key-8"), Some(80));

        table.retain(|(_, value)| *value % 2 == 0);
        assert_eq!(table.len(), table.iter().count());
        assert_eq!(find(&table, "key-9"), None);
        assert_eq!(find(&table, "key-10"), Some(10));
    }
}
