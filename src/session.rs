//! Agent sessions and their budgets (SPEC §4 step 6): the bounded agent loop.
//!
//! A session is created by the first Decide for its id. A new call id costs
//! one decision (and one tool call for an `execute` tool); asking again about
//! the same call id with the same fingerprint costs nothing; the same call id
//! with another fingerprint is `call-id-conflict`. An approval never refills
//! a budget. Idle sessions are evicted after the policy's TTL and the table
//! is capped.

use crate::canonical::Fingerprint;
use crate::clock::Timestamp;
use crate::error::{Error, Result};
use crate::policy::{ActorProfile, Limits};
use crate::proposal::SessionRef;
use crate::state::table::Table;

/// Call ids remembered per session when the profile sets no decision budget.
pub const MAX_CALLS_PER_SESSION: u64 = 100_000;

/// What remembering one decided call id counts under the byte budget
/// (`limits.max_state_bytes`): its text, fingerprint and table slot.
pub fn decided_call_bytes(call_id: &str) -> usize {
    64 + call_id.len()
}

/// One call id decided in a session and the fingerprint it was decided for.
#[derive(Debug, Clone)]
struct DecidedCall {
    call_id: Box<str>,
    fingerprint: Fingerprint,
}

/// The call ids a session has decided, each with its fingerprint.
#[derive(Debug, Clone, Default)]
pub struct DecidedCalls {
    calls: Table<DecidedCall>,
    /// Σ [`decided_call_bytes`] of the calls.
    bytes: usize,
}

impl DecidedCalls {
    pub fn len(&self) -> usize {
        self.calls.len()
    }

    pub fn is_empty(&self) -> bool {
        self.calls.is_empty()
    }

    /// What these call ids count under the byte budget.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The fingerprint `call_id` was decided for, if it was.
    pub fn get(&self, call_id: &str) -> Option<Fingerprint> {
        self.calls
            .find(self.calls.hash(call_id), |call| &*call.call_id == call_id)
            .map(|call| call.fingerprint)
    }

    /// Records the fingerprint a call id was decided for.
    pub fn insert(&mut self, call_id: &str, fingerprint: Fingerprint) {
        let hash = self.calls.hash(call_id);
        match self.calls.find_mut(hash, |call| &*call.call_id == call_id) {
            Some(call) => call.fingerprint = fingerprint,
            None => {
                self.bytes = self.bytes.saturating_add(decided_call_bytes(call_id));
                self.calls.insert_unique(
                    hash,
                    DecidedCall {
                        call_id: call_id.into(),
                        fingerprint,
                    },
                );
            }
        }
    }
}

#[derive(Debug, Clone)]
pub struct Session {
    pub session_id: String,
    pub actor: String,
    pub workspace: String,
    pub started_at: Timestamp,
    pub last_seen: Timestamp,
    /// Fingerprint of every call id decided in this session (up to
    /// [`MAX_CALLS_PER_SESSION`] or the profile's decision budget, so a
    /// table that grows a shard at a time).
    pub decided: DecidedCalls,
    pub decisions: u64,
    pub tool_attempts: u64,
    pub executed_tools: u64,
    /// Σ cost of the tools Dispatch committed.
    pub executed_cost: u64,
    pub stopped_reason: Option<&'static str>,
}

impl Session {
    /// A session that has decided nothing yet.
    pub fn new(session: &SessionRef, now: Timestamp) -> Self {
        Session {
            session_id: session.session_id.clone(),
            actor: session.actor.clone(),
            workspace: session.workspace.clone(),
            started_at: now,
            last_seen: now,
            decided: DecidedCalls::default(),
            decisions: 0,
            tool_attempts: 0,
            executed_tools: 0,
            executed_cost: 0,
            stopped_reason: None,
        }
    }

    pub fn work_units(&self, decision_cost: u64) -> u64 {
        self.decisions
            .saturating_mul(decision_cost)
            .saturating_add(self.executed_cost)
    }
}

/// What `GetSession` reports of a session: its counters, not the call ids
/// it decided (which can be many, and are copied nowhere).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionSummary {
    pub session_id: String,
    pub actor: String,
    pub workspace: String,
    pub started_at: Timestamp,
    pub decisions: u64,
    pub tool_attempts: u64,
    pub executed_tools: u64,
    pub work_units: u64,
    pub stopped_reason: Option<&'static str>,
}

impl Session {
    pub fn summary(&self, decision_cost: u64) -> SessionSummary {
        SessionSummary {
            session_id: self.session_id.clone(),
            actor: self.actor.clone(),
            workspace: self.workspace.clone(),
            started_at: self.started_at,
            decisions: self.decisions,
            tool_attempts: self.tool_attempts,
            executed_tools: self.executed_tools,
            work_units: self.work_units(decision_cost),
            stopped_reason: self.stopped_reason,
        }
    }
}

/// What the budget check decided for one call (SPEC §4 step 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetCheck {
    /// A call id not seen before in this session: charge it on success.
    NewCall,
    /// The same call id and fingerprint again: costs nothing.
    Repeat,
    /// Refused with this reason.
    Refused(&'static str),
}

/// Sessions by id. Boxed, so that growing the table moves pointers only.
#[derive(Debug, Default)]
pub struct Sessions {
    sessions: Table<Box<Session>>,
    /// Σ [`decided_call_bytes`] of the call ids the sessions remember.
    decided_bytes: usize,
}

impl Sessions {
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// What the remembered call ids count under the byte budget.
    pub fn decided_bytes(&self) -> usize {
        self.decided_bytes
    }

    /// Counts a call id that [`charge`] remembered.
    pub fn count_decided_bytes(&mut self, bytes: usize) {
        self.decided_bytes = self.decided_bytes.saturating_add(bytes);
    }

    fn hash(&self, session_id: &str) -> u64 {
        self.sessions.hash(session_id)
    }

    pub fn get(&self, session_id: &str) -> Option<&Session> {
        self.sessions
            .find(self.hash(session_id), |session| {
                session.session_id == session_id
            })
            .map(|session| &**session)
    }

    pub fn get_mut(&mut self, session_id: &str) -> Option<&mut Session> {
        let hash = self.hash(session_id);
        self.sessions
            .find_mut(hash, |session| session.session_id == session_id)
            .map(|session| &mut **session)
    }

    /// A session id is bound to the actor and workspace it started with
    /// (part of SPEC §4 step 1: the session must be valid).
    pub fn check_binding(&self, session: &SessionRef) -> Result<()> {
        let Some(existing) = self.get(&session.session_id) else {
            return Ok(());
        };
        if existing.actor != session.actor {
            return Err(Error::invalid(
                "session.actor",
                format!("session {:?} runs as another actor", session.session_id),
            ));
        }
        if existing.workspace != session.workspace {
            return Err(Error::invalid(
                "session.workspace",
                format!("session {:?} runs in another workspace", session.session_id),
            ));
        }
        Ok(())
    }

    /// The session for `session`, created if new.
    pub fn open(
        &mut self,
        session: &SessionRef,
        now: Timestamp,
        limits: &Limits,
    ) -> Result<&mut Session> {
        self.check_binding(session)?;
        let hash = self.hash(&session.session_id);
        let session_id = session.session_id.as_str();
        if self
            .sessions
            .find(hash, |existing| existing.session_id == session_id)
            .is_none()
        {
            self.check_room(now, limits)?;
            self.sessions
                .insert_unique(hash, Box::new(Session::new(session, now)));
        }
        let entry = self
            .sessions
            .find_mut(hash, |existing| existing.session_id == session_id)
            .ok_or_else(|| Error::Internal("session vanished while opening it".into()))?;
        entry.last_seen = now;
        Ok(entry)
    }

    /// Room for one more session: idle sessions are evicted when the table
    /// is full; still full is RESOURCE_EXHAUSTED.
    pub fn check_room(&mut self, now: Timestamp, limits: &Limits) -> Result<()> {
        if self.sessions.len() >= limits.max_sessions {
            self.evict_idle(now, limits);
        }
        if self.sessions.len() >= limits.max_sessions {
            return Err(Error::ResourceExhausted(format!(
                "the session table holds its maximum of {} sessions",
                limits.max_sessions
            )));
        }
        Ok(())
    }

    /// Drops sessions idle for longer than the policy's TTL.
    pub fn evict_idle(&mut self, now: Timestamp, limits: &Limits) {
        let idle_millis = u64::try_from(limits.session_idle_ttl.as_millis()).unwrap_or(u64::MAX);
        let mut freed = 0usize;
        self.sessions.retain(|session| {
            let keep = now.millis_since(session.last_seen) < idle_millis;
            if !keep {
                freed = freed.saturating_add(session.decided.bytes());
            }
            keep
        });
        self.decided_bytes = self.decided_bytes.saturating_sub(freed);
    }
}

/// SPEC §4 step 6, in order: call-id conflict, decision budget, tool budget,
/// session age. Changes nothing; the caller charges a `NewCall` once the
/// whole decision succeeds.
pub fn check_budget(
    session: &Session,
    profile: &ActorProfile,
    call_id: &str,
    fingerprint: Fingerprint,
    is_tool_call: bool,
    now: Timestamp,
) -> BudgetCheck {
    let check = match session.decided.get(call_id) {
        Some(decided) if decided != fingerprint => {
            return BudgetCheck::Refused("call-id-conflict");
        }
        Some(_) => BudgetCheck::Repeat,
        None => {
            let max_decisions = profile.max_decisions.unwrap_or(MAX_CALLS_PER_SESSION);
            if session.decisions >= max_decisions {
                return BudgetCheck::Refused("decision-budget");
            }
            if is_tool_call
                && profile
                    .max_tool_calls
                    .is_some_and(|max| session.tool_attempts >= max)
            {
                return BudgetCheck::Refused("tool-budget");
            }
            BudgetCheck::NewCall
        }
    };
    if let Some(max_seconds) = profile.max_session_seconds
        && now.millis_since(session.started_at) >= max_seconds.saturating_mul(1000)
    {
        return BudgetCheck::Refused("session-expired");
    }
    check
}

/// Charges a new call id to the session.
pub fn charge(session: &mut Session, call_id: &str, fingerprint: Fingerprint, is_tool_call: bool) {
    session.decided.insert(call_id, fingerprint);
    session.decisions += 1;
    if is_tool_call {
        session.tool_attempts += 1;
    }
}
