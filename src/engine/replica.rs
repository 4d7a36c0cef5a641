//! The engine's side of a shared store's turns ([`TurnHost`]): what other
//! replicas committed is taken into this replica's state at the start of
//! each turn (and between turns), their ledger transitions are sent to this
//! replica's watchers, and the gate is opened and closed under the state
//! lock (see [`store::writer`](crate::store::writer)).

use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use super::Watched;
use super::publisher::Publisher;
use crate::domain::clock::{Clock, SystemClock, Timestamp};
use crate::domain::policy::Policy;
use crate::domain::records::Change;
use crate::domain::state::State;
use crate::store::writer::{Gate, TurnHost};
use crate::store::{Behind, StoreError, Turn};

/// The engine's state, policy and watchers, as the writer thread sees them.
pub(super) struct Host {
    pub state: Arc<Mutex<State>>,
    pub policy: Arc<RwLock<Arc<Policy>>>,
    /// Where this replica's transitions and those it takes in go out.
    pub publisher: Arc<Publisher>,
    /// The policy the state last adopted (its resources): a reload's new
    /// resources are adopted in the next turn, against the state every
    /// replica committed.
    pub adopted: Arc<Policy>,
    /// The engine's clock: a turn's time is the store's clock, moved by as
    /// much as this clock is from the system's (none in production; a
    /// test's clock moves time so).
    pub clock: Arc<dyn Clock>,
}

/// The time of a turn the store began at `store_now`: the store's clock,
/// moved by as much as `clock` is from the system's (nothing in production;
/// a test's clock moves time so).
pub(super) fn time_of(clock: &dyn Clock, store_now: Timestamp) -> Timestamp {
    let offset = i128::from(clock.now().0) - i128::from(SystemClock.now().0);
    let now = (i128::from(store_now.0) + offset).max(0);
    Timestamp(u64::try_from(now).unwrap_or(u64::MAX))
}

fn lock(state: &Mutex<State>) -> Result<MutexGuard<'_, State>, StoreError> {
    state
        .lock()
        .map_err(|_| StoreError("the state is unavailable after an internal failure".into()))
}

impl Host {
    fn policy(&self) -> Arc<Policy> {
        super::snapshot(&self.policy)
    }

    /// Takes `behind` into `state`; what the watchers are told goes to them
    /// once the lock is let go.
    fn take_in(
        &self,
        state: &mut State,
        policy: &Policy,
        behind: Behind,
    ) -> Result<Vec<Watched>, StoreError> {
        let failed = |error: crate::domain::error::Error| {
            StoreError(format!(
                "what other replicas committed could not be taken in: {error}"
            ))
        };
        match behind {
            Behind::Changes(changes) => {
                let events = state.apply_changes(policy, &changes).map_err(failed)?;
                Ok(events.into_iter().map(Watched::Transition).collect())
            }
            Behind::Everything(records) => {
                let later = State::restore(policy, records).map_err(failed)?;
                // The transitions in between are not there to send: the
                // watchers are told they missed some, and re-list.
                let missed = state.transitions_to(&later).max(1);
                *state = later;
                Ok(vec![Watched::Missed(missed as u64)])
            }
        }
    }

    /// Publishes this replica's durable transitions taken out of the
    /// queue (`own`), then sends the others'.
    fn send(&self, own: Vec<crate::domain::ledger::ApprovalEvent>, taken_in: Vec<Watched>) {
        self.publisher.publish(own);
        self.publisher.send(taken_in);
    }
}

impl TurnHost for Host {
    fn begin(
        &mut self,
        turn: Turn,
        gate: &Gate,
        queue: &mut dyn FnMut(Vec<Change>),
        settled: &dyn Fn(u64) -> Option<bool>,
    ) -> Result<(), StoreError> {
        let policy = self.policy();
        let shared = Arc::clone(&self.state);
        let mut state = lock(&shared)?;
        // The turn before has committed: this replica's transitions still
        // queued go out before the others' taken in now, which came after
        // them in the store.
        let own = self.publisher.take_settled(settled);
        let events = match turn.behind {
            Some(behind) => match self.take_in(&mut state, &policy, behind) {
                Ok(events) => events,
                Err(error) => {
                    // The writer stops; what this replica made durable is
                    // still audited.
                    drop(state);
                    self.publisher.publish(own);
                    return Err(error);
                }
            },
            None => Vec::new(),
        };
        if !Arc::ptr_eq(&policy, &self.adopted) {
            state.adopt_policy(&policy);
            self.adopted = policy;
        }
        let changes = state
            .take_changes()
            .map_err(|error| StoreError(format!("a change could not be encoded: {error}")))?;
        // Queued before the gate opens: a call in this turn (it needs the
        // gate, and the lock) comes after them.
        queue(changes);
        gate.open(time_of(self.clock.as_ref(), turn.now));
        drop(state);
        self.send(own, events);
        Ok(())
    }

    fn end(&mut self, gate: &Gate) {
        // Poisoned or not: the gate closes.
        let _state = self.state.lock();
        gate.close();
    }

    fn catch_up(
        &mut self,
        behind: Behind,
        settled: &dyn Fn(u64) -> Option<bool>,
    ) -> Result<(), StoreError> {
        let policy = self.policy();
        let mut state = lock(&self.state)?;
        // Between turns: everything queued is settled (see `begin`).
        let own = self.publisher.take_settled(settled);
        let taken = self.take_in(&mut state, &policy, behind);
        drop(state);
        match taken {
            Ok(events) => {
                self.send(own, events);
                Ok(())
            }
            // The writer stops; what this replica made durable is still
            // audited.
            Err(error) => {
                self.publisher.publish(own);
                Err(error)
            }
        }
    }
}
