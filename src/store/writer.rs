//! Group commit: the one thread that writes to the store.
//!
//! Operations apply their changes under the state lock, as before, and
//! [`Writer::append`] them there, so that the writer sees them in commit
//! order. The thread takes everything appended since its last batch, writes
//! it as one transaction with one sync ([`Store::commit`]), and then marks
//! every operation of the batch durable at once: their answers are released
//! together. While one batch syncs the next one gathers, so the rate of
//! commits is the rate of syncs times the operations that arrive during one;
//! while callers keep the writer busy it also waits `GATHER_FOR` before it
//! takes a batch, so that a fast sync does not leave it committing batches
//! of a few operations, each paying a transaction and a sync.
//!
//! Every operation has a sequence number: the number of the batch of
//! changes it appended, or, when it changed nothing an answer can reveal,
//! the number of the last such batch appended before it read the state
//! (what it could have observed). Its answer waits until that number is
//! durable ([`Writer::durable`]). A crash therefore loses only changes that
//! no answer revealed. A change no answer reveals (a session's last
//! activity, which only times its eviction) is written in order with the
//! rest, but no answer waits for its sync, unless the batch in flight has
//! been committing for longer than [`UNSYNCED_FOR`] (a stalled store):
//! then every answer waits for everything appended, so that a crash can
//! take back only that much more of such changes.
//!
//! What is pending is bounded by what is in flight: each call appends the
//! changes of one operation, and the server bounds the calls in flight.
//! A store whose commit is a copy in this process ([`Store::commits_in_place`]:
//! the memory store) has no thread: each append is committed at once, under
//! the state lock, and is durable when `append` returns, so its answer never
//! waits. The thread's wake-up and switch would cost more than such a
//! commit, and batching would save nothing.
//!
//! A failed commit stops the writer for good: the state in memory is then
//! ahead of the store, so every later operation is refused
//! ([`Writer::failure`]) until the process is restarted and recovers from
//! the store. Unless the store can resume ([`Store::resume`]: PostgreSQL,
//! after a lost connection): then the writer is in an outage
//! ([`Writer::outage`]) while it asks the store again, with a growing pause,
//! for up to [`RESUME_FOR`]; once the store is back it either counts the
//! commit made (it took effect, only its answer was lost) or makes it
//! again (it did not), never both, and goes on. The batch's answers wait
//! meanwhile.
//!
//! # Turns (a shared store)
//!
//! On a store other replicas share ([`Store::shared`]) an operation may run
//! only inside a turn (see [`store`](super)). The writer runs the turns: a
//! caller that finds none open asks for one ([`Writer::want_turn`]) and
//! waits on the [`Gate`]; the writer begins a turn in the store, has the
//! [`TurnHost`] (the engine's state) take in what other replicas
//! committed and open the gate at the store's time, lets the callers that
//! asked run (for at most [`TURN_WINDOW`]), closes the gate and commits
//! what they appended as the turn's batch, as above. A commit that did not
//! take effect (or whose fate stays unknown) fails its batch's answers,
//! UNAVAILABLE, and the state is loaded again from the store at the next
//! turn; the replica goes on. Between turns the writer looks at what the
//! others committed every [`CATCH_UP_EVERY`], so that this replica's
//! watchers hear of it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use super::{Behind, Resume, Store, StoreError, Turn};
use crate::domain::clock::Timestamp;
use crate::domain::records::Change;

/// How long a store that can resume is asked to, after a failed commit,
/// before the failure is final.
pub const RESUME_FOR: Duration = Duration::from_secs(60);
/// The first pause between two attempts to resume; it doubles up to
/// [`RESUME_PAUSE_MAX`].
const RESUME_PAUSE: Duration = Duration::from_millis(50);
const RESUME_PAUSE_MAX: Duration = Duration::from_secs(2);

/// How long an idle replica waits between two looks at what the other
/// replicas committed (its watchers hear of their transitions this late).
pub const CATCH_UP_EVERY: Duration = Duration::from_millis(50);
/// How long a turn stays open for the callers that asked for it; one that
/// has not come by then (gone, or slow) takes the next.
pub const TURN_WINDOW: Duration = Duration::from_millis(5);

/// How long a batch may be in flight (committing, syncing) before a call
/// whose changes no answer reveals waits for it too: a store that stalls
/// holds every answer after this long, so that what a crash can take back
/// of sessions' last activity stays bounded (a second between their
/// writes, and this).
pub const UNSYNCED_FOR: Duration = Duration::from_millis(250);

/// How long the writer waits before it takes a batch while callers keep
/// it busy (its last batch held more than one operation), so that one
/// sync serves more of them: PostgreSQL's `commit_delay`. A lone caller
/// (batches of one) never waits.
const GATHER_FOR: Duration = Duration::from_micros(250);

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

/// Told that a batch is durable, or why it never will be.
type Waiter = tokio::sync::oneshot::Sender<Result<(), StoreError>>;

/// Everything the appenders and the writer thread share, under one lock.
#[derive(Debug, Default)]
struct Pending {
    /// Appended since the writer last took a batch.
    changes: Vec<Change>,
    operations: usize,
    /// The number of the last batch appended.
    last: u64,
    /// The number of the last batch appended with a change an answer can
    /// reveal (see [`Writer::append`]): what a call that changed nothing
    /// waits for.
    observable: u64,
    /// Every batch up to this number is durable.
    durable: u64,
    /// The last number of the batch the writer is committing (no greater
    /// than `durable` when none is).
    in_flight: u64,
    /// Since when that batch is committing (`None` when none is).
    in_flight_since: Option<Instant>,
    /// Answers waiting for a number in the batch being committed, and for
    /// one still pending: each is told once, when its own batch is done, so
    /// a batch wakes only the answers it holds.
    in_flight_waiters: Vec<Waiter>,
    pending_waiters: Vec<Waiter>,
    closing: bool,
    /// The batch writer sleeps until something is appended: only then
    /// does an append wake it (a futex call). While it commits it looks at
    /// what is pending again before it sleeps, so an append then need not.
    writer_sleeping: bool,
    /// Turns: callers waiting for the next one, callers the open one was
    /// begun for, and callers that ran in it.
    wanting: usize,
    expected: usize,
    ran: usize,
    /// Turns begun: the last one's number.
    turns_begun: u64,
    /// The numbers (first, last) of turns' batches whose commit did not
    /// take effect (or whose outcome is unknown), with what their callers
    /// were told: their answers are refused so, never released (the latest
    /// [`ABANDONED_KEPT`]; an answer waits no longer than a few turns).
    abandoned: std::collections::VecDeque<(u64, u64, StoreError)>,
}

/// How many abandoned batches are remembered.
const ABANDONED_KEPT: usize = 1024;

impl Pending {
    /// What became of the batch `number` ([`Writer::settled`]).
    fn settled(&self, number: u64) -> Option<bool> {
        if self.abandoned(number).is_some() {
            return Some(false);
        }
        (self.durable >= number).then_some(true)
    }

    /// What the callers of the batch `number` were told, if it was
    /// abandoned.
    fn abandoned(&self, number: u64) -> Option<&StoreError> {
        (self.abandoned.iter())
            .find(|(first, last, _)| (*first..=*last).contains(&number))
            .map(|(_, _, error)| error)
    }

    /// What a call whose changes no answer reveals waits for: the last
    /// batch with a change one does, unless the batch in flight has been
    /// committing for longer than [`UNSYNCED_FOR`]: then everything
    /// appended.
    fn unobserved_wait(&self) -> u64 {
        if self.observable == self.last {
            // Nothing unobserved is pending: no clock to read.
            return self.last;
        }
        match self.in_flight_since {
            Some(since) if since.elapsed() > UNSYNCED_FOR => self.last,
            _ => self.observable,
        }
    }

    /// Ends every wait: nothing more will be durable, for `why`.
    fn fail_all(&mut self, why: &StoreError) {
        for waiter in self
            .in_flight_waiters
            .drain(..)
            .chain(self.pending_waiters.drain(..))
        {
            let _ = waiter.send(Err(why.clone()));
        }
    }
}

struct Shared {
    pending: Mutex<Pending>,
    wake: Condvar,
    /// Why nothing more will be durable: a commit failed, the writer
    /// panicked, or it was closed. Set once, before the waits are ended.
    stopped: OnceLock<StoreError>,
    /// Why the last commit failed, while the writer waits for the store to
    /// resume.
    outage: Mutex<Option<StoreError>>,
    on_batch: OnceLock<OnBatch>,
    /// The turns' gate, when the store is shared.
    gate: Option<Gate>,
}

impl Shared {
    fn pending(&self) -> MutexGuard<'_, Pending> {
        lock(&self.pending)
    }

    /// Stops the writer for good: records why and ends every wait.
    fn stop(&self, why: StoreError) {
        let mut pending = self.pending();
        let _ = self.stopped.set(why);
        if let Some(why) = self.stopped.get() {
            pending.fail_all(why);
        }
        drop(pending);
        if let Some(gate) = &self.gate {
            gate.wake_waiting();
        }
    }
}

impl std::fmt::Debug for Shared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Shared")
            .field("stopped", &self.stopped.get())
            .finish_non_exhaustive()
    }
}

/// The state a shared store's turns work on: the engine's, behind its lock.
pub trait TurnHost: Send + 'static {
    /// Under the state lock: takes in what `turn` says other replicas
    /// committed, hands the changes the state made while taking the turn
    /// in (resources a new policy declares, say), which the turn commits,
    /// to `queue`, then opens `gate` at the turn's time — in that order, so
    /// that they come before every change a call makes in the turn (a call
    /// that sets a resource the policy just declared must not be followed
    /// by the resource's initial value). An error (the state cannot take
    /// in what the store holds) stops the writer.
    /// `settled` says what became of a batch ([`Writer::settled`]).
    fn begin(
        &mut self,
        turn: Turn,
        gate: &Gate,
        queue: &mut dyn FnMut(Vec<Change>),
        settled: &dyn Fn(u64) -> Option<bool>,
    ) -> Result<(), StoreError>;
    /// Under the state lock: closes `gate`.
    fn end(&mut self, gate: &Gate);
    /// Takes in what other replicas committed between two turns.
    fn catch_up(
        &mut self,
        behind: Behind,
        settled: &dyn Fn(u64) -> Option<bool>,
    ) -> Result<(), StoreError>;
}

/// The gate of a shared store's turns: an operation runs only while a turn
/// is open. Opened and closed by the [`TurnHost`] under the engine's state
/// lock, so that a caller holding that lock reads a stable answer.
#[derive(Debug)]
pub struct Gate {
    /// The open turn's time plus one; zero while none is open.
    open: AtomicU64,
    /// Moves on when a turn opens, and when the store fails: the callers
    /// waiting for a turn look again.
    opened: tokio::sync::watch::Sender<u64>,
}

impl Gate {
    fn new() -> Gate {
        Gate {
            open: AtomicU64::new(0),
            opened: tokio::sync::watch::Sender::new(0),
        }
    }

    /// The open turn's time (read under the state lock), or `None`.
    pub fn open_at(&self) -> Option<Timestamp> {
        match self.open.load(Ordering::Acquire) {
            0 => None,
            plus_one => Some(Timestamp(plus_one - 1)),
        }
    }

    /// Opens the turn at `now` (under the state lock).
    pub fn open(&self, now: Timestamp) {
        self.open
            .store(now.0.saturating_add(1).max(1), Ordering::Release);
    }

    /// Closes the turn (under the state lock).
    pub fn close(&self) {
        self.open.store(0, Ordering::Release);
    }

    /// Changes when the next turn opens (or the store fails).
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.opened.subscribe()
    }

    fn wake_waiting(&self) {
        self.opened
            .send_modify(|generation| *generation = generation.wrapping_add(1));
    }
}

/// The group-commit writer: a thread that owns the store, or the store
/// itself when it commits in place.
pub struct Writer {
    shared: Arc<Shared>,
    thread: Mutex<Option<JoinHandle<()>>>,
    /// The store, when it commits in place ([`Store::commits_in_place`]):
    /// then there is no thread.
    in_place: Option<Mutex<Box<dyn Store>>>,
    store_name: &'static str,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer")
            .field("store", &self.store_name)
            .field("in_place", &self.in_place.is_some())
            .field("shared", &self.shared)
            .finish_non_exhaustive()
    }
}

impl Writer {
    /// Starts the writer thread on `store`; on a shared store, running
    /// turns on `host`'s state (required there).
    pub fn start(
        store: Box<dyn Store>,
        host: Option<Box<dyn TurnHost>>,
    ) -> std::io::Result<Writer> {
        let store_name = store.name();
        let host = match (store.shared(), host) {
            (true, Some(host)) => Some(host),
            (true, None) => {
                return Err(std::io::Error::other(format!(
                    "the {store_name} store is shared: its writer needs the state to run turns on"
                )));
            }
            (false, _) => None,
        };
        let shared = Arc::new(Shared {
            pending: Mutex::new(Pending::default()),
            wake: Condvar::new(),
            stopped: OnceLock::new(),
            outage: Mutex::new(None),
            on_batch: OnceLock::new(),
            gate: host.is_some().then(Gate::new),
        });
        if host.is_none() && store.commits_in_place() {
            return Ok(Writer {
                shared,
                thread: Mutex::new(None),
                in_place: Some(Mutex::new(store)),
                store_name,
            });
        }
        let thread = std::thread::Builder::new()
            .name("toolgate-store".into())
            .spawn({
                let shared = Arc::clone(&shared);
                move || run(&shared, store, host)
            })?;
        Ok(Writer {
            shared,
            thread: Mutex::new(Some(thread)),
            in_place: None,
            store_name,
        })
    }

    /// The store's name ([`Store::name`]).
    pub fn store_name(&self) -> &'static str {
        self.store_name
    }

    /// Sets what is told of every batch (once; later calls are ignored).
    pub fn on_batch(&self, on_batch: OnBatch) {
        let _ = self.shared.on_batch.set(on_batch);
    }

    /// Appends one operation's changes (call it under the state lock, so
    /// that appends are in commit order) and returns the number its answer
    /// waits for: its own batch's when one of the changes is `observable`
    /// (an answer can reveal it), otherwise the last observable batch
    /// appended before it, which holds everything the operation could have
    /// observed. A change no answer reveals (a session's last activity)
    /// is still written in order, but nobody waits for it. No changes are
    /// never `observable` ([`State::take`](crate::domain::state::State::take)
    /// says so): such a call waits as one whose changes no answer reveals.
    pub fn append(&self, mut changes: Vec<Change>, observable: bool) -> u64 {
        debug_assert!(!observable || !changes.is_empty(), "nothing to observe");
        let mut pending = self.shared.pending();
        if changes.is_empty() {
            return pending.unobserved_wait();
        }
        pending.last += 1;
        let number = pending.last;
        let answer_waits_for = if observable {
            pending.observable = number;
            number
        } else {
            pending.unobserved_wait()
        };
        if let Some(store) = &self.in_place {
            drop(pending);
            self.commit_in_place(store, number, &changes);
            return answer_waits_for;
        }
        if pending.changes.is_empty() {
            pending.changes = changes;
        } else {
            pending.changes.append(&mut changes);
        }
        pending.operations += 1;
        let sleeping = std::mem::take(&mut pending.writer_sleeping);
        drop(pending);
        if sleeping {
            self.shared.wake.notify_one();
        }
        answer_waits_for
    }

    /// Commits operation `number`'s `changes` to a store that commits in
    /// place (under the state lock, so in commit order): durable once this
    /// returns, unless the writer stopped (closed, or an earlier commit
    /// failed), when it is refused; a failed commit stops the writer.
    fn commit_in_place(&self, store: &Mutex<Box<dyn Store>>, number: u64, changes: &[Change]) {
        if self.shared.stopped.get().is_some() {
            return;
        }
        let mut store = lock(store);
        let started = Instant::now();
        if let Err(error) = store.commit(changes) {
            drop(store);
            tracing::error!(
                store = self.store_name,
                %error,
                "the store refused a commit; every call is refused from now on"
            );
            self.shared.stop(error);
            return;
        }
        report(
            &self.shared,
            store.as_ref(),
            1,
            changes.len(),
            started.elapsed(),
        );
        self.shared.pending().durable = number;
    }

    /// The turns' gate, when the store is shared: an operation runs only
    /// while it is open.
    pub fn gate(&self) -> Option<&Gate> {
        self.shared.gate.as_ref()
    }

    /// Asks for a turn (a caller that found the gate closed, under the
    /// state lock); it waits on [`Gate::subscribe`]. Returns its ticket:
    /// the number of the turn it is counted for.
    pub fn want_turn(&self) -> u64 {
        let mut pending = self.shared.pending();
        pending.wanting += 1;
        let ticket = pending.turns_begun + 1;
        drop(pending);
        self.shared.wake.notify_one();
        ticket
    }

    /// Tells the writer a caller runs in the open turn (under the state
    /// lock, before it appends), with the ticket of its last
    /// [`Writer::want_turn`], if it asked: the turn closes once every caller
    /// it was begun for ran. A caller counted for a turn not begun yet (it
    /// asked while this one was beginning) is counted out of that one.
    pub fn ran_in_turn(&self, ticket: Option<u64>) {
        let mut pending = self.shared.pending();
        if ticket.is_some_and(|ticket| ticket > pending.turns_begun) {
            pending.wanting = pending.wanting.saturating_sub(1);
        }
        pending.ran += 1;
        if pending.ran >= pending.expected {
            drop(pending);
            self.shared.wake.notify_one();
        }
    }

    /// Why the writer stopped, once it has.
    pub fn failure(&self) -> Option<StoreError> {
        self.shared.stopped.get().cloned()
    }

    /// Why the last commit failed, while the writer waits for the store to
    /// resume (see the module documentation).
    pub fn outage(&self) -> Option<StoreError> {
        lock(&self.shared.outage).clone()
    }

    /// What became of the batch `number`: durable (`Some(true)`), abandoned
    /// (`Some(false)`: it never took effect), or neither yet (`None`).
    pub fn settled(&self, number: u64) -> Option<bool> {
        self.shared.pending().settled(number)
    }

    /// Waits until every batch up to `number` is durable, or the writer
    /// stopped before it was.
    pub async fn durable(&self, number: u64) -> Result<(), StoreError> {
        let waiting = {
            let mut pending = self.shared.pending();
            if let Some(told) = pending.abandoned(number) {
                return Err(told.clone());
            }
            if pending.durable >= number {
                return Ok(());
            }
            if let Some(why) = self.shared.stopped.get() {
                return Err(why.clone());
            }
            let (waiter, waiting) = tokio::sync::oneshot::channel();
            if number <= pending.in_flight {
                pending.in_flight_waiters.push(waiter);
            } else {
                pending.pending_waiters.push(waiter);
            }
            waiting
        };
        waiting
            .await
            .unwrap_or_else(|_| Err(StoreError("the store writer stopped".into())))
    }

    /// Commits what is pending, stops the thread and waits for it. Later
    /// appends are refused (their [`Writer::durable`] fails).
    pub fn close(&self) {
        self.close_within(Duration::MAX);
    }

    /// [`Writer::close`], waiting at most `wait` for the thread (a batch
    /// stuck in a sync on a hung disk): whether it ended.
    pub fn close_within(&self, wait: Duration) -> bool {
        if self.in_place.is_some() {
            self.shared.stop(StoreError("the store is closed".into()));
        }
        self.shared.pending().closing = true;
        self.shared.wake.notify_one();
        let thread = lock(&self.thread).take();
        thread.is_none_or(|thread| crate::ops::process::join_within(thread, wait))
    }
}

impl Drop for Writer {
    fn drop(&mut self) {
        self.close();
    }
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Marks the writer stopped when its thread ends, however it ends (a
/// panic included), so that no answer waits for it forever.
struct StopOnExit<'a>(&'a Shared);

impl Drop for StopOnExit<'_> {
    fn drop(&mut self) {
        let why = match std::thread::panicking() {
            true => "the store writer failed (a panic); restart to recover",
            false => "the store is closed",
        };
        self.0.stop(StoreError(why.into()));
    }
}

/// The writer thread: commits batches, or runs turns on a shared store;
/// returns once closed and drained, or on a failure.
fn run(shared: &Shared, mut store: Box<dyn Store>, host: Option<Box<dyn TurnHost>>) {
    let _stop_on_exit = StopOnExit(shared);
    match host {
        None => run_batches(shared, store.as_mut()),
        Some(mut host) => run_turns(shared, store.as_mut(), host.as_mut()),
    }
}

/// One batch taken from what is pending.
struct Batch {
    changes: Vec<Change>,
    operations: usize,
    /// The numbers of its first and last operations.
    first: u64,
    last: u64,
}

/// Takes everything pending as the batch to commit; its answers wait in
/// flight from now on. `compact`: only the last change of each record (a
/// turn's batch goes whole: the shared store keeps every version of an
/// approval for other replicas' watchers, and compacts the rest itself).
fn take_batch(pending: &mut Pending, spare: &mut Vec<Change>, compact: bool) -> Batch {
    let changes = std::mem::replace(&mut pending.changes, std::mem::take(spare));
    let operations = std::mem::take(&mut pending.operations);
    let first = pending.in_flight + 1;
    pending.in_flight = pending.last;
    pending.in_flight_since = (first <= pending.last).then(Instant::now);
    let waiting = std::mem::take(&mut pending.pending_waiters);
    pending.in_flight_waiters = waiting;
    Batch {
        changes: if compact {
            latest_only(changes)
        } else {
            changes
        },
        operations,
        first,
        last: pending.last,
    }
}

/// Tells [`Writer::on_batch`] of a batch committed: its `operations`, the
/// `changes` written, in `sync`.
fn report(shared: &Shared, store: &dyn Store, operations: usize, changes: usize, sync: Duration) {
    if let Some(on_batch) = shared.on_batch.get() {
        on_batch(&BatchReport {
            operations,
            changes,
            sync,
            store_bytes: store.size_bytes(),
        });
    }
}

/// Marks `batch` durable and releases its answers (metrics first, so that
/// an answer released finds its batch counted).
fn release(shared: &Shared, store: &dyn Store, batch: &Batch, sync: Duration) {
    report(shared, store, batch.operations, batch.changes.len(), sync);
    let released = {
        let mut pending = shared.pending();
        pending.durable = batch.last;
        pending.in_flight_since = None;
        std::mem::take(&mut pending.in_flight_waiters)
    };
    for waiter in released {
        let _ = waiter.send(Ok(()));
    }
}

/// Takes what is pending, commits it as one batch, tells its waiters,
/// repeats. A failed commit stops the writer.
fn run_batches(shared: &Shared, store: &mut dyn Store) {
    let mut spare = Vec::new();
    // Operations in the last batch: more than one, and the next batch is
    // gathered for GATHER_FOR first.
    let mut last_operations = 0;
    loop {
        let batch = {
            let mut pending = shared.pending();
            while pending.changes.is_empty() && !pending.closing {
                pending.writer_sleeping = true;
                pending = shared
                    .wake
                    .wait(pending)
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
            }
            pending.writer_sleeping = false;
            if pending.changes.is_empty() {
                return;
            }
            if last_operations > 1 && !pending.closing {
                drop(pending);
                std::thread::sleep(GATHER_FOR);
                pending = shared.pending();
            }
            take_batch(&mut pending, &mut spare, true)
        };
        last_operations = batch.operations;
        let started = Instant::now();
        if let Err(error) = commit_or_resume(shared, store, &batch.changes, false) {
            tracing::error!(
                store = store.name(),
                %error,
                "the store refused a commit; every call is refused from now on \
                 (restart to recover from what the store holds)"
            );
            shared.stop(error);
            return;
        }
        release(shared, store, &batch, started.elapsed());
        spare = batch.changes;
        spare.clear();
    }
}

/// Runs turns on a shared store (see the module documentation) while
/// callers ask for them, and catches up between them; returns once closed.
fn run_turns(shared: &Shared, store: &mut dyn Store, host: &mut dyn TurnHost) {
    let Some(gate) = shared.gate.as_ref() else {
        return;
    };
    let mut spare = Vec::new();
    loop {
        let wanted = {
            let pending = shared.pending();
            let (mut pending, _) = shared
                .wake
                .wait_timeout_while(pending, CATCH_UP_EVERY, |pending| {
                    pending.wanting == 0 && !pending.closing
                })
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if pending.wanting == 0 && pending.closing {
                return;
            }
            // Asked for before the turn begins: these callers run in it.
            pending.expected = std::mem::take(&mut pending.wanting);
            pending.ran = 0;
            if pending.expected > 0 {
                pending.turns_begun += 1;
            }
            pending.expected > 0
        };
        if !wanted {
            match store.catch_up() {
                Ok(None) => {}
                Ok(Some(behind)) => {
                    let settled = |number| shared.pending().settled(number);
                    if let Err(error) = host.catch_up(behind, &settled) {
                        shared.stop(error);
                        return;
                    }
                }
                Err(error) => reconnect(shared, store, gate, error),
            }
            continue;
        }
        let turn = match store.begin_turn() {
            Ok(turn) => turn,
            Err(error) => {
                reconnect(shared, store, gate, error);
                continue;
            }
        };
        let mut queue = |changes: Vec<Change>| {
            if changes.is_empty() {
                return;
            }
            // What the turn takes in (resources a reloaded policy
            // declares, say) is what its calls observe.
            let mut pending = shared.pending();
            pending.changes.extend(changes);
            pending.operations += 1;
            pending.last += 1;
            pending.observable = pending.last;
        };
        let settled = |number| shared.pending().settled(number);
        match host.begin(turn, gate, &mut queue, &settled) {
            Ok(()) => {}
            Err(error) => {
                let _ = store.commit(&[]);
                shared.stop(error);
                return;
            }
        }
        gate.wake_waiting();
        let batch = {
            let pending = shared.pending();
            let (pending, _) = shared
                .wake
                .wait_timeout_while(pending, TURN_WINDOW, |pending| {
                    pending.ran < pending.expected && !pending.closing
                })
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            drop(pending);
            host.end(gate);
            take_batch(&mut shared.pending(), &mut spare, false)
        };
        let started = Instant::now();
        match commit_or_resume(shared, store, &batch.changes, true) {
            Ok(()) => release(shared, store, &batch, started.elapsed()),
            Err(error) => {
                tracing::error!(
                    store = store.name(),
                    %error,
                    "a turn's commit did not take effect (or its fate is unknown): its calls \
                     are answered UNAVAILABLE, and the state is loaded again from the store"
                );
                let mut pending = shared.pending();
                for waiter in std::mem::take(&mut pending.in_flight_waiters) {
                    let _ = waiter.send(Err(error.clone()));
                }
                // Nothing of the batch is durable; the numbers move on,
                // and a late wait for one of them is refused too.
                if batch.first <= batch.last {
                    if pending.abandoned.len() == ABANDONED_KEPT {
                        pending.abandoned.pop_front();
                    }
                    (pending.abandoned).push_back((batch.first, batch.last, error.clone()));
                }
                // A call that changes nothing waits for the last number:
                // one past the abandoned ones, for an empty batch, durable
                // at once. No call runs before the next turn, which loads
                // the state again from the store, so none can observe what
                // was abandoned under it.
                pending.last += 1;
                pending.in_flight = pending.last;
                pending.in_flight_since = None;
                pending.durable = pending.last;
                pending.observable = pending.last;
            }
        }
        spare = batch.changes;
        spare.clear();
    }
}

/// After `error` (the store unreachable between turns): refuses new calls
/// (an outage) and sends the waiting ones back to be refused, then asks the
/// store to resume, with a growing pause, until it is back or the writer
/// closes.
fn reconnect(shared: &Shared, store: &mut dyn Store, gate: &Gate, error: StoreError) {
    tracing::error!(
        store = store.name(),
        %error,
        "the store is unreachable; every new call is refused (UNAVAILABLE) until it is back"
    );
    *lock(&shared.outage) = Some(error);
    shared.pending().wanting = 0;
    gate.wake_waiting();
    let mut pause = RESUME_PAUSE;
    loop {
        match store.resume() {
            Resume::Unreachable(error) => *lock(&shared.outage) = Some(error),
            Resume::Final(Some(error)) => *lock(&shared.outage) = Some(error),
            Resume::Committed | Resume::NotCommitted | Resume::Final(None) => {
                tracing::warn!(store = store.name(), "the store is back");
                *lock(&shared.outage) = None;
                return;
            }
        }
        if wait_unless_closing(shared, pause) {
            return;
        }
        pause = (pause * 2).min(RESUME_PAUSE_MAX);
    }
}

/// Commits `changes`; when that fails and the store can resume, asks it to
/// until it is back (then counts the commit if it took effect, or makes it
/// again; in a turn, `turn`, a commit that did not take effect is not made
/// again: other replicas may have gone on since) or [`RESUME_FOR`] has
/// passed, or the writer is closing.
fn commit_or_resume(
    shared: &Shared,
    store: &mut dyn Store,
    changes: &[Change],
    turn: bool,
) -> Result<(), StoreError> {
    let mut failed = match store.commit(changes) {
        Ok(()) => return Ok(()),
        Err(error) => error,
    };
    let since = Instant::now();
    let mut pause = RESUME_PAUSE;
    loop {
        let resumed = store.resume();
        if let Resume::Final(why) = resumed {
            *lock(&shared.outage) = None;
            return Err(why.unwrap_or(failed));
        }
        if matches!(resumed, Resume::Committed) {
            tracing::warn!(
                store = store.name(),
                "the store is back; the commit it lost the answer to had taken effect"
            );
            *lock(&shared.outage) = None;
            return Ok(());
        }
        if matches!(resumed, Resume::NotCommitted) && turn {
            *lock(&shared.outage) = None;
            return Err(StoreError(format!(
                "the commit did not take effect ({failed}); try again"
            )));
        }
        if matches!(resumed, Resume::NotCommitted) {
            match store.commit(changes) {
                Ok(()) => {
                    tracing::warn!(
                        store = store.name(),
                        "the store is back; the failed commit is made"
                    );
                    *lock(&shared.outage) = None;
                    return Ok(());
                }
                Err(error) => failed = error,
            }
        }
        let mut outage = lock(&shared.outage);
        if outage.is_none() {
            tracing::error!(
                store = store.name(),
                error = %failed,
                "a commit failed; every new call is refused (UNAVAILABLE) while the store is asked to resume"
            );
        }
        *outage = Some(failed.clone());
        drop(outage);
        if since.elapsed() >= RESUME_FOR || wait_unless_closing(shared, pause) {
            *lock(&shared.outage) = None;
            if turn {
                // The replica goes on (it loads the state again in its next
                // turn); what it cannot say is whether this commit was made.
                return Err(StoreError(format!(
                    "the outcome of this call's commit is unknown ({failed}): it may have \
                     taken effect; try again (a Dispatch that took effect is replayed)"
                )));
            }
            return Err(failed);
        }
        pause = (pause * 2).min(RESUME_PAUSE_MAX);
    }
}

/// Waits `pause`, unless the writer is closing (then at once: true).
fn wait_unless_closing(shared: &Shared, pause: Duration) -> bool {
    let pending = shared.pending();
    if pending.closing {
        return true;
    }
    let (pending, _) = shared
        .wake
        .wait_timeout_while(pending, pause, |pending| !pending.closing)
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    pending.closing
}

/// Keeps the last change of each record, in order: what a batch writes.
fn latest_only(changes: Vec<Change>) -> Vec<Change> {
    let keep = super::last_of_each_record(&changes);
    if keep.iter().all(|keep| *keep) {
        return changes;
    }
    changes
        .into_iter()
        .zip(keep)
        .filter_map(|(change, keep)| keep.then_some(change))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::records::{Kind, Record};
    use crate::store::StoreResult;
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

    /// The memory store as a store that does not commit in place, so that
    /// the writer's thread is tested on it; shared (taking turns) when `.1`.
    #[derive(Debug, Clone)]
    struct Threaded(MemoryStore, bool);

    impl Store for Threaded {
        fn name(&self) -> &'static str {
            "threaded memory"
        }
        fn load(&mut self) -> StoreResult<Vec<Record>> {
            self.0.load()
        }
        fn commit(&mut self, changes: &[Change]) -> StoreResult<()> {
            self.0.commit(changes)
        }
        fn size_bytes(&self) -> u64 {
            self.0.size_bytes()
        }
        fn shared(&self) -> bool {
            self.1
        }
        fn begin_turn(&mut self) -> StoreResult<Turn> {
            Ok(Turn {
                now: Timestamp(1),
                behind: None,
            })
        }
    }

    /// A store that commits in place and refuses every commit.
    struct Refusing;

    impl Store for Refusing {
        fn name(&self) -> &'static str {
            "refusing"
        }
        fn load(&mut self) -> StoreResult<Vec<Record>> {
            Ok(Vec::new())
        }
        fn commit(&mut self, _changes: &[Change]) -> StoreResult<()> {
            Err(StoreError("the disk is gone".into()))
        }
        fn size_bytes(&self) -> u64 {
            0
        }
        fn commits_in_place(&self) -> bool {
            true
        }
    }

    /// Appends, waits, loads what `store` kept, closes: the same on either
    /// writer.
    async fn answers_wait_for_their_batch_and_see_it_stored(
        writer: Writer,
        mut stored: impl FnMut() -> usize,
    ) {
        assert_eq!(writer.append(Vec::new(), false), 0);
        let first = writer.append(vec![put(b"a", b"1")], true);
        let second = writer.append(vec![put(b"b", b"2")], true);
        assert_eq!((first, second), (1, 2));
        // A change no answer reveals is written after them, but its answer
        // (and a later one that changed nothing) waits only for theirs.
        assert_eq!(writer.append(vec![put(b"t", b"1")], false), 2);
        assert_eq!(writer.append(Vec::new(), false), 2);
        writer.durable(second).await.unwrap();
        assert!(stored() >= 2);
        writer.close();
        assert_eq!(stored(), 3, "the close wrote what was pending");
        // What is appended after the close is refused, never waited for.
        let late = writer.append(vec![put(b"c", b"3")], true);
        assert!(writer.durable(late).await.is_err());
        assert!(writer.durable(second).await.is_ok());
        assert_eq!(stored(), 3, "nothing is stored after the close");
    }

    #[tokio::test]
    async fn the_thread_releases_answers_once_their_batch_is_stored() {
        let store = MemoryStore::new();
        let writer = Writer::start(Box::new(Threaded(store.clone(), false)), None).unwrap();
        assert!(lock(&writer.thread).is_some(), "a thread commits");
        answers_wait_for_their_batch_and_see_it_stored(writer, || {
            Store::load(&mut store.clone()).unwrap().len()
        })
        .await;
    }

    #[tokio::test]
    async fn a_store_that_commits_in_place_has_it_stored_before_append_returns() {
        let store = MemoryStore::new();
        let writer = Writer::start(Box::new(store.clone()), None).unwrap();
        assert!(lock(&writer.thread).is_none(), "no thread");
        let reports = Arc::new(Mutex::new(Vec::new()));
        writer.on_batch(Box::new({
            let reports = Arc::clone(&reports);
            move |report| lock(&reports).push((report.operations, report.changes))
        }));
        let number = writer.append(vec![put(b"x", b"1"), put(b"y", b"1")], true);
        assert_eq!(Store::load(&mut store.clone()).unwrap().len(), 2);
        assert_eq!(lock(&writer.shared.pending).durable, number);
        assert_eq!(*lock(&reports), vec![(1, 2)], "each append is a batch");

        let store = MemoryStore::new();
        let writer = Writer::start(Box::new(store.clone()), None).unwrap();
        answers_wait_for_their_batch_and_see_it_stored(writer, || {
            Store::load(&mut store.clone()).unwrap().len()
        })
        .await;
    }

    /// A shared store whose commits fail: the first one, known not to
    /// have taken effect (`lost: false`), or every one, its answer lost and
    /// the store unreachable to ask what became of it (`lost: true`).
    struct Failing {
        lost: bool,
        failed: bool,
    }

    impl Failing {
        fn once() -> Box<Failing> {
            Box::new(Failing {
                lost: false,
                failed: false,
            })
        }
        fn lost() -> Box<Failing> {
            Box::new(Failing {
                lost: true,
                failed: false,
            })
        }
    }

    impl Store for Failing {
        fn name(&self) -> &'static str {
            "failing"
        }
        fn load(&mut self) -> StoreResult<Vec<Record>> {
            Ok(Vec::new())
        }
        fn commit(&mut self, changes: &[Change]) -> StoreResult<()> {
            if self.lost {
                return Err(StoreError("the connection was lost".into()));
            }
            if !changes.is_empty() && !std::mem::replace(&mut self.failed, true) {
                return Err(StoreError("the commit did not take effect".into()));
            }
            Ok(())
        }
        fn size_bytes(&self) -> u64 {
            0
        }
        fn resume(&mut self) -> Resume {
            match self.lost {
                true => Resume::Unreachable(StoreError("no answer".into())),
                false => Resume::NotCommitted,
            }
        }
        fn shared(&self) -> bool {
            true
        }
        fn begin_turn(&mut self) -> StoreResult<Turn> {
            Ok(Turn {
                now: Timestamp(1),
                behind: None,
            })
        }
    }

    /// Opens and closes the gate under `state`, the state lock a test's
    /// operations hold too (as the engine's do); takes nothing in, but
    /// queues `begins_with` (the resources a reloaded policy declares, say)
    /// at the start of its first turn. With `race` (opened, ran), it then
    /// says the gate is open and returns only once a call has run in the
    /// turn: the window in which a replica's turn sends its audit lines and
    /// watcher events, and a call that arrives then runs at once.
    struct Host {
        state: Arc<Mutex<()>>,
        begins_with: Option<Vec<Change>>,
        race: Option<(std::sync::mpsc::Sender<()>, std::sync::mpsc::Receiver<()>)>,
    }

    impl Host {
        fn new(state: &Arc<Mutex<()>>, begins_with: Option<Vec<Change>>) -> Host {
            Host {
                state: Arc::clone(state),
                begins_with,
                race: None,
            }
        }
    }

    impl TurnHost for Host {
        fn begin(
            &mut self,
            turn: Turn,
            gate: &Gate,
            queue: &mut dyn FnMut(Vec<Change>),
            _settled: &dyn Fn(u64) -> Option<bool>,
        ) -> Result<(), StoreError> {
            let first = self.begins_with.take();
            {
                let _state = lock(&self.state);
                queue(first.clone().unwrap_or_default());
                gate.open(turn.now);
            }
            if let (Some(_), Some((opened, ran))) = (&first, &self.race) {
                let _ = opened.send(());
                let _ = ran.recv_timeout(Duration::from_secs(10));
            }
            Ok(())
        }
        fn end(&mut self, gate: &Gate) {
            let _state = lock(&self.state);
            gate.close();
        }
        fn catch_up(
            &mut self,
            _behind: Behind,
            _settled: &dyn Fn(u64) -> Option<bool>,
        ) -> Result<(), StoreError> {
            Ok(())
        }
    }

    /// Runs `changes` as one operation in a turn, as the engine does
    /// (`Engine::in_turn`): under the state lock while the gate is open,
    /// else asking for a turn again; returns its number.
    async fn in_a_turn(writer: &Writer, state: &Mutex<()>, changes: Vec<Change>) -> u64 {
        let gate = writer.gate().expect("a shared store's gate");
        let mut opened = gate.subscribe();
        let mut ticket = None;
        loop {
            opened.borrow_and_update();
            {
                let _state = lock(state);
                if gate.open_at().is_some() {
                    writer.ran_in_turn(ticket);
                    let observable = !changes.is_empty();
                    return writer.append(changes, observable);
                }
                ticket = Some(writer.want_turn());
            }
            opened.changed().await.unwrap();
        }
    }

    /// A read in a turn observes what the turn began with: its answer
    /// waits for the turn's commit (here refused: it did not take effect).
    /// Found in review: it was answered at once.
    #[tokio::test]
    async fn a_read_in_a_turn_waits_for_what_the_turn_began_with() {
        let state = Arc::new(Mutex::new(()));
        let adopted = Some(vec![put(b"resource", b"new")]);
        let host = Box::new(Host::new(&state, adopted));
        let writer = Writer::start(Failing::once(), Some(host)).unwrap();
        let read = in_a_turn(&writer, &state, Vec::new()).await;
        let answered = writer.durable(read).await;
        writer.close();
        assert!(
            answered.is_err(),
            "read #{read} answered although the change it saw was abandoned"
        );
    }

    /// What a turn begins with (a resource a reloaded policy declares, at
    /// its initial value) is committed before what a call in the turn sets
    /// it to, even when the call runs before the turn's beginning is done.
    /// Found in review: the turn's changes were queued after the gate
    /// opened, and a call's commit could be overwritten by the initial
    /// value (the store keeps the last change of a record).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_turns_own_changes_come_before_its_calls() {
        let state = Arc::new(Mutex::new(()));
        let (opened, opened_receiver) = std::sync::mpsc::channel();
        let (ran, ran_receiver) = std::sync::mpsc::channel();
        let host = Box::new(Host {
            race: Some((opened, ran_receiver)),
            ..Host::new(&state, Some(vec![put(b"resource", b"initial")]))
        });
        let store = MemoryStore::new();
        let writer =
            Arc::new(Writer::start(Box::new(Threaded(store.clone(), true)), Some(host)).unwrap());
        // A read asks for the turn; a call that arrives once the gate is
        // open runs before the turn's beginning is done.
        let asker = tokio::spawn({
            let (writer, state) = (Arc::clone(&writer), Arc::clone(&state));
            async move { in_a_turn(&writer, &state, Vec::new()).await }
        });
        tokio::task::spawn_blocking(move || opened_receiver.recv_timeout(Duration::from_secs(10)))
            .await
            .unwrap()
            .expect("the turn opened");
        let call = in_a_turn(&writer, &state, vec![put(b"resource", b"committed")]).await;
        ran.send(()).unwrap();
        asker.await.unwrap();
        writer.durable(call).await.unwrap();
        writer.close();
        let records = Store::load(&mut store.clone()).unwrap();
        let stored: Vec<&[u8]> = records.iter().map(|record| &record.value[..]).collect();
        assert_eq!(stored, vec![&b"committed"[..]]);
    }

    #[tokio::test]
    async fn after_a_turn_that_did_not_take_effect_a_call_that_changes_nothing_is_answered() {
        let state = Arc::new(Mutex::new(()));
        let host = Box::new(Host::new(&state, None));
        let writer = Writer::start(Failing::once(), Some(host)).unwrap();
        let lost = in_a_turn(&writer, &state, vec![put(b"a", b"1")]).await;
        let error = writer.durable(lost).await.unwrap_err();
        assert!(error.0.contains("did not take effect"), "{error}");
        // Late, it is still refused; a read in the next turn is answered.
        assert!(writer.durable(lost).await.is_err());
        let read = in_a_turn(&writer, &state, Vec::new()).await;
        assert!(read > lost);
        writer.durable(read).await.unwrap();
        let write = in_a_turn(&writer, &state, vec![put(b"b", b"1")]).await;
        writer.durable(write).await.unwrap();
        writer.close();
    }

    /// A turn's commit given up with its outcome unknown is answered so:
    /// not as one that failed (the replica goes on), nor as one that did not
    /// take effect.
    #[tokio::test]
    async fn a_turns_commit_given_up_unknown_is_answered_unknown() {
        let state = Arc::new(Mutex::new(()));
        let host = Box::new(Host::new(&state, None));
        let writer = Writer::start(Failing::lost(), Some(host)).unwrap();
        let lost = in_a_turn(&writer, &state, vec![put(b"a", b"1")]).await;
        let give_up = async {
            while writer.outage().is_none() {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            writer.close();
        };
        let (answer, ()) = tokio::join!(writer.durable(lost), give_up);
        let error = answer.unwrap_err();
        assert!(
            error.0.starts_with(
                "the outcome of this call's commit is unknown (the connection was lost): \
                 it may have taken effect"
            ),
            "{error}"
        );
        // A late wait is told the same.
        assert_eq!(writer.durable(lost).await, Err(error));
    }

    #[tokio::test]
    async fn a_refused_commit_in_place_refuses_its_answer_and_every_later_one() {
        let writer = Writer::start(Box::new(Refusing), None).unwrap();
        let refused = writer.append(vec![put(b"a", b"1")], true);
        let error = writer.durable(refused).await.unwrap_err();
        assert_eq!(error.0, "the disk is gone");
        assert_eq!(writer.failure(), Some(error.clone()));
        // A call that changed nothing could have observed the refused change.
        let observed = writer.append(Vec::new(), false);
        assert_eq!(writer.durable(observed).await, Err(error.clone()));
        let later = writer.append(vec![put(b"b", b"1")], true);
        assert_eq!(writer.durable(later).await, Err(error));
    }
}
