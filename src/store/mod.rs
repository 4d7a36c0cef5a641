//! Where the state is kept between runs: the [`Store`] seam and its
//! implementations, and the group-commit [`writer`] that makes an
//! operation's changes durable before its answer is released.
//!
//! The state itself is worked on in memory, under the engine's lock, as
//! before; every operation journals the records it changed
//! ([`records`](crate::domain::records)). A store keeps those records: it
//! applies a batch of changes atomically and durably, and hands every record
//! back at start. The store sees bytes only, so that every implementation
//! (memory, SQLite, and a server that is not in this process) keeps the
//! same records.
//!
//! - [`memory`]: records in this process only, gone at exit (tests); and
//!   none at all (`--store memory`): the state then journals no changes.
//! - [`sqlite`]: the durable default: SQLite in WAL mode, synced on every
//!   commit, in a data directory one process owns.
//! - [`postgres`]: a schema of a PostgreSQL database that several toolgate
//!   processes (replicas) share: a shared store ([`Store::shared`]).
//!
//! # Replicas: turns
//!
//! On a shared store every replica keeps the whole state in memory too, and
//! the store orders them: an operation runs only inside a *turn*
//! ([`Store::begin_turn`]), which holds the store's lock (the database's,
//! so it goes with a replica that dies), reads the store's clock (so every
//! replica agrees when a grant expires) and hands back what the other
//! replicas committed since this one last looked, which the state applies
//! before any operation reads it. The turn's changes commit with the turn
//! ([`Store::commit`]); the next replica's turn begins after that commit.
//! So a grant is consumed, a receipt made and a version checked against the
//! state as every replica committed it, in one order.

pub mod memory;
pub mod postgres;
pub mod sqlite;
pub mod writer;

use std::collections::HashMap;

use crate::domain::clock::Timestamp;
use crate::domain::records::{Change, Kind, Record};

/// Why a store could not do what it was asked. The message names the store,
/// the file and the failing step; it never holds a record's contents.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct StoreError(pub String);

pub type StoreResult<T> = std::result::Result<T, StoreError>;

/// A place the state's records are kept. One writer uses it at a time (the
/// group-commit thread); every method may block on I/O.
pub trait Store: Send + 'static {
    /// What this store is, for the start-up line and metrics ("memory",
    /// "sqlite", "postgres").
    fn name(&self) -> &'static str;

    /// Every record, for recovery at start, in any order.
    fn load(&mut self) -> StoreResult<Vec<Record>>;

    /// Applies `changes` in order, all or none, and returns only once they
    /// are durable (for a durable store: synced to disk). A change to a key
    /// replaces its record whole; a deletion of a missing key is no error.
    fn commit(&mut self, changes: &[Change]) -> StoreResult<()>;

    /// Bytes the store holds (on disk, for a durable store).
    fn size_bytes(&self) -> u64;

    /// Whether a commit is a copy in this process, durable as soon as
    /// [`Store::commit`] returns and too cheap to batch (the memory store):
    /// then the writer commits each operation's changes in place, under
    /// the state lock, instead of handing them to its thread, whose wake-up
    /// and thread switch would cost more than the commit itself.
    fn commits_in_place(&self) -> bool {
        false
    }

    /// Whether the store keeps what it is given. One that keeps nothing
    /// (`serve --store memory`: the state in the engine is all there is)
    /// is handed no changes: the state stops journaling them.
    fn keeps_records(&self) -> bool {
        true
    }

    /// After [`Store::commit`] failed: tries to bring the store back and
    /// says what became of that commit. A store that cannot tell (the
    /// default) makes every failed commit final.
    fn resume(&mut self) -> Resume {
        Resume::Final(None)
    }

    /// Whether other processes share this store (replicas): then every
    /// operation runs in a turn ([`Store::begin_turn`]).
    fn shared(&self) -> bool {
        false
    }

    /// Begins a turn (a shared store; see the module documentation): waits
    /// for the store's lock, reads its clock and what other replicas
    /// committed since this store last looked. The turn ends with the next
    /// [`Store::commit`] (of its changes, none included), which releases
    /// the lock.
    fn begin_turn(&mut self) -> StoreResult<Turn> {
        Err(StoreError(format!(
            "the {} store takes no turns",
            self.name()
        )))
    }

    /// What other replicas committed since this store last looked, read
    /// without a turn (an idle replica's watchers are told of them): only
    /// changes, never everything (that waits for a turn, under the lock);
    /// `None` when there are none. Only between turns.
    fn catch_up(&mut self) -> StoreResult<Option<Behind>> {
        Ok(None)
    }
}

/// A turn of a shared store ([`Store::begin_turn`]).
#[derive(Debug)]
pub struct Turn {
    /// The store's clock: the time of every operation in the turn.
    pub now: Timestamp,
    /// What the state must take in before the turn's operations run.
    pub behind: Option<Behind>,
}

/// What other replicas committed that this one has not seen.
#[derive(Debug)]
pub enum Behind {
    /// Their changes, in commit order.
    Changes(Vec<Change>),
    /// Everything the store holds: this replica is too far behind for the
    /// changes (or its state is not the store's, after a commit that did
    /// not take effect), so its state is rebuilt whole.
    Everything(Vec<Record>),
}

/// What a store found when asked to resume after a failed commit
/// ([`Store::resume`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resume {
    /// Back, and the failed commit took effect after all (its answer was
    /// lost with the connection).
    Committed,
    /// Back, and the failed commit did not take effect: it can be made again.
    NotCommitted,
    /// Not back yet: ask again later.
    Unreachable(StoreError),
    /// Never: the failure is final (why, when there is more to say than the
    /// commit's own error).
    Final(Option<StoreError>),
}

/// For each of `changes`, whether it is the last change of its record
/// among them: the one that counts, for a later change of a record replaces
/// an earlier one whole.
pub(crate) fn last_of_each_record(changes: &[Change]) -> Vec<bool> {
    let mut last: HashMap<(Kind, &[u8]), usize> = HashMap::with_capacity(changes.len());
    for (index, change) in changes.iter().enumerate() {
        last.insert((change.kind, change.key.as_slice()), index);
    }
    let mut keep = vec![false; changes.len()];
    for index in last.into_values() {
        keep[index] = true;
    }
    keep
}

#[cfg(test)]
mod tests;
