//! Group commit: the one thread that writes to the store.
//!
//! Operations apply their changes under the state lock, as before, and
//! [`Writer::append`] them there, so that the writer sees them in commit
//! order. The thread takes everything appended since its last batch, writes
//! it as one transaction with one sync ([`Store::commit`]), and then marks
//! every operation of the batch durable at once: their answers are released
//! together. While one batch syncs the next one gathers, so the rate of
//! commits is the rate of syncs times the operations that arrive during one.
//!
//! Every operation has a sequence number: the number of the batch of
//! changes it appended, or, when it changed nothing, the number of the last
//! one appended before it read the state (what it could have observed). Its
//! answer waits until that number is durable ([`Writer::durable`]). A crash
//! therefore loses only changes that no answer revealed.
//!
//! What is pending is bounded by what is in flight: each call appends the
//! changes of one operation, and the server bounds the calls in flight.
//! A failed commit stops the writer for good: the state in memory is then
//! ahead of the store, so every later operation is refused
//! ([`Writer::failure`]) until the process is restarted and recovers from
//! the store.

use std::collections::HashMap;
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{Store, StoreError};
use crate::domain::records::{Change, Kind};

/// What one batch did, for metrics.
#[derive(Debug, Clone, Copy)]
pub struct BatchReport {
    /// Operations (appends) in the batch.
    pub operations: usize,
    /// Changes written, after dropping those a later change of the same
    /// record replaced within the batch.
    pub changes: usize,
    /// How long the transaction and its sync took.
    pub sync: Duration,
    /// What the store holds after it.
    pub store_bytes: u64,
}

/// Told of every batch the writer commits.
pub type OnBatch = Box<dyn Fn(&BatchReport) + Send + Sync>;

/// How far the store has got.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Progress {
    /// Every batch up to this number is durable.
    durable: u64,
    /// Why nothing more will be: a commit failed, the writer panicked, or
    /// it was closed.
    stopped: Option<StoreError>,
}

#[derive(Debug, Default)]
struct Pending {
    changes: Vec<Change>,
    operations: usize,
    /// The number of the last batch appended.
    last: u64,
    closing: bool,
}

struct Shared {
    pending: Mutex<Pending>,
    wake: Condvar,
    progress: tokio::sync::watch::Sender<Progress>,
    on_batch: OnceLock<OnBatch>,
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("progress", &*self.progress.borrow())
            .finish_non_exhaustive()
    }
}

/// The handle of the writer thread; dropping it commits what is pending
/// and stops the thread.
#[derive(Debug)]
pub struct Writer {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    store_name: &'static str,
}

impl Writer {
    /// Starts the writer thread on `store` (already loaded).
    pub fn start(store: Box<dyn Store>) -> std::io::Result<Writer> {
        let store_name = store.name();
        let shared = Arc::new(Shared {
            pending: Mutex::new(Pending::default()),
            wake: Condvar::new(),
            progress: tokio::sync::watch::Sender::new(Progress::default()),
            on_batch: OnceLock::new(),
        });
        let thread = std::thread::Builder::new()
            .name("toolgate-store".into())
            .spawn({
                let shared = Arc::clone(&shared);
                move || run(&shared, store)
            })?;
        Ok(Writer {
            shared,
            thread: Mutex::new(Some(thread)),
            store_name,
        })
    }

    /// The store's name ("memory", "sqlite").
    pub fn store_name(&self) -> &'static str {
        self.store_name
    }

    /// Sets what is told of every batch (once; later calls are ignored).
    pub fn on_batch(&self, on_batch: OnBatch) {
        let _ = self.shared.on_batch.set(on_batch);
    }

    fn pending(&self) -> MutexGuard<'_, Pending> {
        lock(&self.shared.pending)
    }

    /// Appends the changes of one operation (called under the state lock,
    /// in commit order); the number its answer must wait for. No changes
    /// append nothing and return the last number appended: what the
    /// operation could have observed.
    pub fn append(&self, mut changes: Vec<Change>) -> u64 {
        let mut pending = self.pending();
        if changes.is_empty() {
            return pending.last;
        }
        if pending.changes.is_empty() {
            pending.changes = changes;
        } else {
            pending.changes.append(&mut changes);
        }
        pending.operations += 1;
        pending.last += 1;
        let number = pending.last;
        drop(pending);
        self.shared.wake.notify_one();
        number
    }

    /// Why the store stopped, if a commit failed.
    pub fn failure(&self) -> Option<StoreError> {
        self.shared.progress.borrow().stopped.clone()
    }

    /// Resolves once batch `number` (and every one before it) is durable;
    /// an error when the store failed first.
    pub async fn durable(&self, number: u64) -> Result<(), StoreError> {
        let mut progress = self.shared.progress.subscribe();
        let reached = progress
            .wait_for(|progress| progress.durable >= number || progress.stopped.is_some())
            .await;
        match reached.as_deref() {
            Ok(progress) if progress.durable >= number => Ok(()),
            Ok(Progress {
                stopped: Some(error),
                ..
            }) => Err(error.clone()),
            _ => Err(StoreError("the store writer stopped".into())),
        }
    }

    /// Commits what is pending and stops the thread (also on drop).
    pub fn close(&self) {
        self.pending().closing = true;
        self.shared.wake.notify_one();
        let thread = lock(&self.thread).take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.close();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding it cannot leave `Pending` half-changed in a
    // way that matters more than stopping would: keep going.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Marks the writer stopped when its thread ends, however it ends, so that
/// no answer waits for a batch that will never be written.
struct StopOnExit<'a>(&'a Shared);

impl Drop for StopOnExit<'_> {
    fn drop(&mut self) {
        let why = match std::thread::panicking() {
            true => "the store writer failed (a panic); restart to recover",
            false => "the store is closed",
        };
        self.0.progress.send_modify(|progress| {
            progress
                .stopped
                .get_or_insert_with(|| StoreError(why.into()));
        });
    }
}

/// The writer thread: a batch of everything pending, one commit, then the
/// next, until closed and drained or a commit fails.
fn run(shared: &Shared, mut store: Box<dyn Store>) {
    let _stop_on_exit = StopOnExit(shared);
    let mut spare = Vec::new();
    loop {
        let (changes, operations, last) = {
            let mut pending = lock(&shared.pending);
            while pending.changes.is_empty() && !pending.closing {
                pending = shared
                    .wake
                    .wait(pending)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            if pending.changes.is_empty() {
                return;
            }
            let changes = std::mem::replace(&mut pending.changes, std::mem::take(&mut spare));
            let operations = std::mem::take(&mut pending.operations);
            (changes, operations, pending.last)
        };
        let changes = latest_only(changes);
        let started = Instant::now();
        let committed = store.commit(&changes);
        let sync = started.elapsed();
        match committed {
            Ok(()) => {
                // Counted before the answers go, so that a caller who reads
                // the metrics after its answer finds its batch there.
                if let Some(on_batch) = shared.on_batch.get() {
                    on_batch(&BatchReport {
                        operations,
                        changes: changes.len(),
                        sync,
                        store_bytes: store.size_bytes(),
                    });
                }
                shared
                    .progress
                    .send_modify(|progress| progress.durable = last);
            }
            Err(error) => {
                tracing::error!(
                    store = store.name(),
                    %error,
                    "the store refused a commit; every call is refused from now on \
                     (restart to recover from what the store holds)"
                );
                shared
                    .progress
                    .send_modify(|progress| progress.stopped = Some(error));
                return;
            }
        }
        spare = changes;
        spare.clear();
    }
}

/// The batch with every change that a later change of the same record
/// replaces dropped (each change writes its record whole, so only the last
/// one counts), in the order of the changes kept.
fn latest_only(changes: Vec<Change>) -> Vec<Change> {
    let mut last: HashMap<(Kind, &[u8]), usize> = HashMap::with_capacity(changes.len());
    for (index, change) in changes.iter().enumerate() {
        last.insert((change.kind, change.key.as_slice()), index);
    }
    if last.len() == changes.len() {
        return changes;
    }
    let keep: Vec<bool> = {
        let mut keep = vec![false; changes.len()];
        for index in last.values() {
            keep[*index] = true;
        }
        keep
    };
    changes
        .into_iter()
        .zip(keep)
        .filter_map(|(change, keep)| keep.then_some(change))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;

    fn put(key: &[u8], value: &[u8]) -> Change {
        Change {
            kind: Kind::Meta,
            key: key.to_vec(),
            value: Some(value.to_vec()),
        }
    }

    #[test]
    fn only_the_last_change_of_a_record_is_written() {
        let changes = vec![put(b"a", b"1"), put(b"b", b"1"), put(b"a", b"2")];
        assert_eq!(latest_only(changes), vec![put(b"b", b"1"), put(b"a", b"2")]);
    }

    #[tokio::test]
    async fn answers_wait_for_their_batch_and_see_it_stored() {
        let store = MemoryStore::new();
        let writer = Writer::start(Box::new(store.clone())).unwrap();
        assert_eq!(writer.append(Vec::new()), 0);
        let first = writer.append(vec![put(b"a", b"1")]);
        let second = writer.append(vec![put(b"b", b"2")]);
        assert_eq!((first, second), (1, 2));
        assert_eq!(writer.append(Vec::new()), 2);
        writer.durable(second).await.unwrap();
        let mut loaded = store.clone();
        assert_eq!(Store::load(&mut loaded).unwrap().len(), 2);
        writer.close();
        // What is appended after the close is refused, never waited for.
        let late = writer.append(vec![put(b"c", b"3")]);
        assert!(writer.durable(late).await.is_err());
        assert!(writer.durable(second).await.is_ok());
    }
}
