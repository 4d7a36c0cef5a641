//! `State`: everything toolgate remembers between calls. Every RPC is one
//! method on this one type, called with the policy snapshot and the time, so
//! that a durable or replicated backend can implement the same operations.

mod apply;
mod approvals;
mod decide;
pub use decide::Grants;
mod dispatch;
mod gates;
mod manifests;
mod queries;
#[cfg(test)]
mod tests;

use std::collections::HashMap;

use crate::domain::clock::Timestamp;
use crate::domain::error::{Error, Result};
use crate::domain::ledger::{self, Ledger};
use crate::domain::manifest::LastAssessment;
use crate::domain::pins::ApiPin;
use crate::domain::policy::{Limits, Policy};
use crate::domain::receipts::ReceiptLog;
use crate::domain::records::{self, Change, Journal, Kind, Record};
use crate::domain::resources::{ResourcePage, Resources};
use crate::domain::session::Sessions;

#[derive(Debug)]
pub struct State {
    api_pins: HashMap<String, ApiPin>,
    /// The latest assessment per pinned server.
    last_assessed: HashMap<String, LastAssessment>,
    ledger: Ledger,
    sessions: Sessions,
    resources: Resources,
    receipts: ReceiptLog,
    /// Bytes the call being answered will add when it is charged (its call
    /// id, remembered by `Sessions::settle`): counted by [`State::state_bytes`]
    /// from the moment [`State::charged`] made room for them until the
    /// charge is settled, so that every room made on the way (an approval
    /// request, a receipt) leaves room for them too. Zero between calls.
    charging_bytes: usize,
    /// Pins and assessments written or dropped since the changes were last
    /// taken (the ledger, sessions, resources and receipts keep their own).
    journal: Journal,
}

/// One page of resources (ListResources). (A page of one queue is a
/// [`ResourcePage`](crate::domain::resources::ResourcePage).)
#[derive(Debug, Clone, Default)]
pub struct ResourceList {
    /// In name order.
    pub resources: Vec<ListedResource>,
    /// The name to continue after, when more follow.
    pub next: Option<String>,
}

/// One resource of a [`ResourceList`]: its first page, as GetResource
/// reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct ListedResource {
    pub name: String,
    pub page: ResourcePage,
}

/// The changes taken from the state for the store ([`State::take`]).
#[derive(Debug)]
pub struct Taken {
    pub changes: Vec<Change>,
    /// Whether an answer can reveal one of them (see [`State::take`]).
    pub observable: bool,
}

/// Sizes of the state, for metrics and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Stats {
    pub sessions: usize,
    pub approvals: usize,
    pub pending_approvals: usize,
    pub receipts: usize,
    pub api_pins: usize,
}

impl State {
    pub fn new(policy: &Policy) -> Self {
        State {
            api_pins: HashMap::new(),
            last_assessed: HashMap::new(),
            ledger: Ledger::default(),
            sessions: Sessions::default(),
            resources: Resources::new(&policy.state),
            receipts: ReceiptLog::default(),
            charging_bytes: 0,
            journal: Journal::default(),
        }
    }

    /// The latest time this state holds (an approval's step, a receipt,
    /// a session's activity): what a clock set back while the process was
    /// down must not run before ([`Clock::not_before`]).
    ///
    /// [`Clock::not_before`]: crate::domain::clock::Clock::not_before
    pub fn latest_time(&self) -> Timestamp {
        let latest = [
            self.ledger.latest_time(),
            self.receipts.latest_time(),
            self.sessions.latest_time(),
        ];
        latest.into_iter().max().unwrap_or_default()
    }

    /// The state the store's records describe (recovery), under the policy
    /// in force. Indexes are rebuilt; nothing expires here (the engine
    /// expires what is due against its clock before the first call).
    /// Resources the policy declares that the store does not hold yet are
    /// journaled, to be stored by the first commit.
    pub fn restore(policy: &Policy, stored: Vec<Record>) -> Result<State> {
        let mut by_kind: HashMap<Kind, Vec<Record>> = HashMap::new();
        for record in stored {
            by_kind.entry(record.kind).or_default().push(record);
        }
        let mut take = |kind: Kind| by_kind.remove(&kind).unwrap_or_default();
        let approvals = take(Kind::Approval)
            .iter()
            .map(records::decode)
            .collect::<Result<Vec<_>>>()?;
        let approval_changes = take(Kind::ApprovalChange)
            .iter()
            .map(|record| ledger::decode_change(&record.key, &record.value))
            .collect::<Result<Vec<_>>>()?;
        let mut resources =
            Resources::restore(&policy.state, &take(Kind::Resource), &take(Kind::QueueItem))?;
        let mut kept = None;
        for record in take(Kind::Meta) {
            if Resources::is_global_version(&record) {
                resources.restore_global_version(&record)?;
            } else if let Some(scope) = Resources::stored_scope(&record)? {
                kept = Some(scope);
            }
        }
        // A store that does not say (made before the scope was stored) is
        // taken as global: at worst, proposals made before the restart
        // against a resource are stale once.
        resources.take_scope(kept, policy.state.version_scope);
        let mut restored = State {
            api_pins: HashMap::new(),
            last_assessed: HashMap::new(),
            ledger: Ledger::restore(approvals, approval_changes)?,
            sessions: Sessions::restore(&take(Kind::Session), &take(Kind::DecidedCall))?,
            resources,
            receipts: ReceiptLog::restore(&take(Kind::Receipt))?,
            charging_bytes: 0,
            journal: Journal::default(),
        };
        for record in take(Kind::Pin) {
            let stored: manifests::StoredPin = records::decode(&record)?;
            restored.put_pin(stored.into_pin()?);
        }
        for record in take(Kind::Assessment) {
            let server_id = String::from_utf8(record.key.clone()).map_err(|_| {
                Error::Internal("the store holds an assessment whose key is not UTF-8".into())
            })?;
            restored
                .last_assessed
                .insert(server_id, records::decode(&record)?);
        }
        Ok(restored)
    }

    /// At least how many ledger transitions lead from this state to
    /// `later` (approvals new there, or changed).
    pub fn transitions_to(&self, later: &State) -> usize {
        self.ledger.changed_in(&later.ledger)
    }

    /// Journals nothing from now on, and drops what was journaled and not
    /// taken: for a store that keeps no records
    /// ([`Store::keeps_records`](crate::store::Store::keeps_records)),
    /// where encoding every change would be work for nothing.
    pub fn stop_journaling(&mut self) {
        self.ledger.stop_journaling();
        self.sessions.stop_journaling();
        self.resources.stop_journaling();
        self.receipts.stop_journaling();
        self.journal.stop();
    }

    /// Notes the last activity of every session that the store does not
    /// hold yet (see [`Sessions::take_changes`]), for the next
    /// [`State::take_changes`]: the last batch of a clean shutdown.
    pub fn note_every_touch(&mut self) {
        self.sessions.note_every_touch();
    }

    /// Every record written or dropped since the last call, in the order
    /// the operations made them: what the store must keep.
    pub fn take_changes(&mut self) -> Result<Vec<Change>> {
        Ok(self.take()?.changes)
    }

    /// As [`State::take_changes`], and whether an answer can reveal any of
    /// them: all but a session written for its last activity alone, which
    /// only times the session's eviction.
    pub fn take(&mut self) -> Result<Taken> {
        let mut changes = Vec::new();
        self.ledger.take_changes(&mut changes)?;
        let touches = self.sessions.take_changes(&mut changes)?;
        self.resources.take_changes(&mut changes)?;
        self.receipts.take_changes(&mut changes)?;
        self.journal.take_into(&mut changes)?;
        let observable = changes.len() > touches;
        Ok(Taken {
            changes,
            observable,
        })
    }

    pub fn stats(&self) -> Stats {
        Stats {
            sessions: self.sessions.len(),
            approvals: self.ledger.len(),
            pending_approvals: self.ledger.pending_total(),
            receipts: self.receipts.len(),
            api_pins: self.api_pins.len(),
        }
    }

    /// After a policy reload: keeps everything made at run time and adds
    /// the resources the new policy declares.
    pub fn adopt_policy(&mut self, policy: &Policy) {
        self.resources.adopt(&policy.state);
    }

    /// What the ledger, the receipt log and the sessions' remembered call
    /// ids count together under `limits.max_state_bytes`.
    pub fn state_bytes(&self) -> usize {
        self.ledger
            .bytes()
            .saturating_add(self.receipts.bytes())
            .saturating_add(self.sessions.decided_bytes())
            .saturating_add(self.resources.items_bytes())
            .saturating_add(self.charging_bytes)
    }

    /// Room for `needed` more bytes under `limits.max_state_bytes`.
    fn make_byte_room(&mut self, needed: usize, now: Timestamp, limits: &Limits) -> Result<()> {
        self.make_room(0, needed, now, limits)
    }

    /// Room for `needed` more bytes under `limits.max_state_bytes` with at
    /// least `receipts` receipts evicted (the count cap of the receipt log;
    /// the caller has checked that so many are past retention). Only what
    /// exactly-once does not need is evicted to make it: receipts past
    /// retention first, then finished approval records, oldest first — and
    /// only when that makes enough room. Otherwise RESOURCE_EXHAUSTED, and
    /// nothing changes.
    fn make_room(
        &mut self,
        receipts: usize,
        needed: usize,
        now: Timestamp,
        limits: &Limits,
    ) -> Result<()> {
        let excess = self.excess(receipts, needed, now, limits)?;
        if excess > 0 || receipts > 0 {
            let freed = self.receipts.evict(now, limits, receipts, excess);
            self.ledger.evict_bytes(excess.saturating_sub(freed));
        }
        Ok(())
    }

    /// The bytes [`State::make_room`] would free, or RESOURCE_EXHAUSTED when
    /// it cannot (changes nothing).
    fn excess(
        &self,
        receipts: usize,
        needed: usize,
        now: Timestamp,
        limits: &Limits,
    ) -> Result<usize> {
        let used = self.state_bytes();
        let budget = limits.max_state_bytes;
        let excess = used.saturating_add(needed).saturating_sub(budget);
        if excess == 0 {
            return Ok(0);
        }
        let (_, from_receipts) = self.receipts.evictable(now, limits, receipts, excess);
        if from_receipts.saturating_add(self.ledger.evictable_bytes()) < excess {
            return Err(Error::ResourceExhausted(format!(
                "the state holds {used} of its {budget} bytes (limits.max_state_bytes) in \
                 live approvals, receipts within retention, remembered call ids and the \
                 items of lists; {needed} more do not fit"
            )));
        }
        Ok(excess)
    }
}
