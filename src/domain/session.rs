//! Agent sessions and their budgets (SPEC §4 "Charging", step 6): the
//! bounded agent loop.
//!
//! A session is made by the first Decide (or Dispatch) for its id whose
//! envelope and session are valid, whatever its answer. Every call id new to
//! the session costs one decision, whatever its answer, until the decisions
//! are spent; from then on a new call id is DENY `decision-budget`, which
//! costs nothing. A new call id for an unknown tool or an `execute` tool also
//! costs a tool attempt (unless the tool budget refused it). Asking again
//! about a decided call id with the same fingerprint costs nothing and gets
//! the budget verdict it got the first time (time does not revoke it); the
//! same call id with another fingerprint is `call-id-conflict`. An approval
//! never refills a budget. Session ids are namespaced by the host
//! credential's identity: two hosts using one id have two sessions. Idle
//! sessions are evicted after the policy's TTL and the table is capped.

use std::collections::HashMap;

use crate::domain::canonical::Fingerprint;
use crate::domain::clock::Timestamp;
use crate::domain::decision::Reason;
use crate::domain::error::{Error, Result};
use crate::domain::policy::{ActorProfile, Limits};
use crate::domain::proposal::SessionRef;
use crate::domain::records::{self, Change, Journal, Kind, Record};
use crate::domain::table::Table;

/// Call ids remembered per session when the profile sets no decision budget.
pub const MAX_CALLS_PER_SESSION: u64 = 100_000;

/// What remembering one decided call id counts under the byte budget
/// (`limits.max_state_bytes`): its table slot (its hash, the call id's
/// pointer, its time, fingerprint, refusal and owed attempt) and its text.
pub fn decided_call_bytes(call_id: &str) -> usize {
    std::mem::size_of::<(u64, DecidedCall)>() + call_id.len()
}

/// One call id decided in a session: the fingerprint it was decided for and
/// the budget refusal it got, if the budget refused it.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
struct DecidedCall {
    /// Stored in the record's key, not its value.
    #[serde(skip)]
    call_id: Box<str>,
    /// When it was decided: the first part of its record's key, so that the
    /// call ids of every session append to the end of the store's tree
    /// instead of landing each in its session's leaf ([`decided_key`]).
    #[serde(skip)]
    decided_at: Timestamp,
    fingerprint: Fingerprint,
    refused: Option<Reason>,
    /// Decided while its tool was no tool call (`read`, `propose`,
    /// `forbidden`), so charged no tool attempt: it owes one, settled by
    /// the first call of it once a reload has made its tool an `execute`
    /// one. A record written before this was kept reads as paid.
    #[serde(default, skip_serializing_if = "is_false")]
    owes_attempt: bool,
}

fn is_false(value: &bool) -> bool {
    !*value
}

/// The call ids a session has decided.
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

    fn find(&self, call_id: &str) -> Option<&DecidedCall> {
        self.calls
            .find(self.calls.hash(call_id), |call| &*call.call_id == call_id)
    }

    /// The fingerprint `call_id` was decided for, if it was.
    pub fn get(&self, call_id: &str) -> Option<Fingerprint> {
        self.find(call_id).map(|call| call.fingerprint)
    }

    /// Records a call id the first time it is charged (or replaces it, from
    /// a stored record); returns the bytes it added under the byte budget
    /// (none when it was already remembered).
    fn insert(&mut self, call: DecidedCall) -> usize {
        let call_id = &*call.call_id;
        let hash = self.calls.hash(call_id);
        match self.calls.find_mut(hash, |held| &*held.call_id == call_id) {
            Some(existing) => {
                *existing = call;
                0
            }
            None => {
                let added = decided_call_bytes(call_id);
                self.bytes = self.bytes.saturating_add(added);
                self.calls.insert_unique(hash, call);
                added
            }
        }
    }
}

impl DecidedCalls {
    /// Settles the tool attempt a call id owed: paid (`verdict` none) or
    /// refused `tool-budget`, its verdict from then on. A copy of it as it
    /// is now when `copy` (for the journal).
    fn settle(
        &mut self,
        call_id: &str,
        verdict: Option<Reason>,
        copy: bool,
    ) -> Option<DecidedCall> {
        let hash = self.calls.hash(call_id);
        let call = self
            .calls
            .find_mut(hash, |call| &*call.call_id == call_id)?;
        call.owes_attempt = false;
        call.refused = verdict;
        copy.then(|| call.clone())
    }

    /// Forgets a call id; the bytes it counted (none when it was not
    /// remembered).
    fn remove(&mut self, call_id: &str) -> usize {
        let hash = self.calls.hash(call_id);
        match self.calls.remove(hash, |call| &*call.call_id == call_id) {
            Some(_) => {
                let freed = decided_call_bytes(call_id);
                self.bytes = self.bytes.saturating_sub(freed);
                freed
            }
            None => 0,
        }
    }
}

/// Stored without its call ids (each is a record of its own, so that a
/// decision writes one small record, not the whole session).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Session {
    /// The identity of the host credential that made the session: its
    /// namespace.
    pub host: String,
    pub session_id: String,
    pub actor: String,
    pub workspace: String,
    pub started_at: Timestamp,
    pub last_seen: Timestamp,
    /// Every call id charged in this session (at most the profile's
    /// decision budget, or [`MAX_CALLS_PER_SESSION`]).
    #[serde(skip)]
    pub decided: DecidedCalls,
    /// Call ids charged: as many as `decided` holds. The stored record may
    /// count fewer: a new call id writes its own record, not the session's
    /// ([`Written`]), so a restored session counts its call ids.
    pub decisions: u64,
    pub tool_attempts: u64,
    pub executed_tools: u64,
    /// Σ cost of the tools Dispatch committed.
    pub executed_cost: u64,
    /// The first budget that refused a call of this session.
    pub stopped_reason: Option<Reason>,
    /// What the store holds of this session (as written, loaded or applied
    /// from another replica's record); none until it is first written.
    #[serde(skip)]
    stored: Option<Written>,
}

/// Why a session is written ([`Session::due`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Due {
    /// New, or a counter changed: a write an answer can reveal.
    Counted,
    /// Its last activity alone: a write no answer reveals (it only times
    /// the session's eviction).
    Touched,
}

/// What a session record holds that can change: its counters and its last
/// activity. A session whose counters are as written is written again only
/// once its last activity is [`touch_every`] past the written one, so that
/// calls that change nothing else (a re-evaluated call id, a host polling a
/// pending approval) neither write nor wait for a sync.
///
/// `decisions` is not among them: each decision writes its call id's record,
/// and a restored session counts those ([`Sessions::put_call`]), so that a
/// new call id appends one record instead of also rewriting its session's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Written {
    last_seen: Timestamp,
    tool_attempts: u64,
    executed_tools: u64,
    executed_cost: u64,
    stopped_reason: Option<Reason>,
}

/// The most a crash can take back of a session's last activity (less when
/// the policy's idle time is short: [`touch_every`]).
const TOUCH_EVERY_MILLIS: u64 = 1_000;

/// How stale the stored last activity of a session may get under `limits`:
/// [`TOUCH_EVERY_MILLIS`], or a tenth of the idle time that evicts a
/// session when that is shorter.
fn touch_every(limits: &Limits) -> u64 {
    let idle_millis = u64::try_from(limits.session_idle_ttl.as_millis()).unwrap_or(u64::MAX);
    TOUCH_EVERY_MILLIS.min(idle_millis / 10)
}

impl Session {
    /// A session that has decided nothing yet.
    pub fn new(session: &SessionRef, now: Timestamp) -> Self {
        Session {
            host: session.host.clone(),
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
            stored: None,
        }
    }

    fn written(&self) -> Written {
        Written {
            last_seen: self.last_seen,
            tool_attempts: self.tool_attempts,
            executed_tools: self.executed_tools,
            executed_cost: self.executed_cost,
            stopped_reason: self.stopped_reason,
        }
    }

    /// Whether, and why, the store must be told of this session now: it
    /// was never written or a counter changed ([`Due::Counted`]), or its
    /// last activity alone is `touch_every` milliseconds past the stored
    /// one (0: whenever it changed; [`Due::Touched`]).
    fn due(&self, touch_every: u64) -> Option<Due> {
        let Some(stored) = self.stored else {
            return Some(Due::Counted);
        };
        let now = self.written();
        let counted = Written {
            last_seen: stored.last_seen,
            ..now
        } != stored;
        if counted {
            return Some(Due::Counted);
        }
        let touched = now.last_seen != stored.last_seen
            && now.last_seen.millis_since(stored.last_seen) >= touch_every;
        touched.then_some(Due::Touched)
    }

    /// Counts the call ids the session remembers as decisions, when its
    /// record counts fewer ([`Written`]).
    fn count_decisions(&mut self) {
        let remembered = u64::try_from(self.decided.len()).unwrap_or(u64::MAX);
        self.decisions = self.decisions.max(remembered);
    }

    pub fn work_units(&self, decision_cost: u64) -> u64 {
        self.decisions
            .saturating_mul(decision_cost)
            .saturating_add(self.executed_cost)
    }

    /// True when this is the session a request names.
    fn is(&self, session: &SessionRef) -> bool {
        self.host == session.host && self.session_id == session.session_id
    }

    /// Counts a commit of a tool of this cost.
    pub fn executed(&mut self, cost: u64) {
        self.executed_tools += 1;
        self.executed_cost = self.executed_cost.saturating_add(cost);
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
    pub stopped_reason: Option<Reason>,
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

/// What a session already knows of a call id (SPEC §4 step 6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallStanding {
    /// Never charged in this session (or no session yet).
    New,
    /// Decided before for this fingerprint, with the budget refusal it got
    /// and whether it owes a tool attempt ([`DecidedCall`]; in the standing
    /// a call is charged by, only when that call settles it).
    Decided {
        refused: Option<Reason>,
        owes_attempt: bool,
    },
    /// Decided before for another fingerprint.
    Conflict,
}

impl CallStanding {
    pub fn of(session: Option<&Session>, call_id: &str, fingerprint: Fingerprint) -> Self {
        match session.and_then(|session| session.decided.find(call_id)) {
            None => CallStanding::New,
            Some(call) if call.fingerprint == fingerprint => CallStanding::Decided {
                refused: call.refused,
                owes_attempt: call.owes_attempt,
            },
            Some(_) => CallStanding::Conflict,
        }
    }
}

/// The profile's session budgets; an actor without a profile gets only the
/// table's bound on call ids.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    pub max_decisions: u64,
    pub max_tool_calls: Option<u64>,
    pub max_session_seconds: Option<u64>,
}

impl Budget {
    pub fn of(profile: Option<&ActorProfile>) -> Self {
        Budget {
            max_decisions: profile
                .and_then(|profile| profile.max_decisions)
                .unwrap_or(MAX_CALLS_PER_SESSION),
            max_tool_calls: profile.and_then(|profile| profile.max_tool_calls),
            max_session_seconds: profile.and_then(|profile| profile.max_session_seconds),
        }
    }

    /// True when a new call id can no longer be charged.
    pub fn decisions_spent(&self, session: Option<&Session>) -> bool {
        session.map_or(0, |session| session.decisions) >= self.max_decisions
    }

    /// SPEC §4 step 6 for a call that passed steps 2–5: a conflict, the
    /// verdict a decided call id got (and, when every call runs, the
    /// budget again), or the budget check of a new one.
    pub fn check(
        &self,
        standing: CallStanding,
        session: Option<&Session>,
        is_tool_call: bool,
        now: Timestamp,
        repeats: Repeats,
    ) -> Option<Reason> {
        match (standing, repeats) {
            (CallStanding::Conflict, _) => Some(Reason::CallIdConflict),
            (CallStanding::Decided { refused, .. }, Repeats::Free) => refused,
            (CallStanding::Decided { refused, .. }, Repeats::Charged) => {
                refused.or_else(|| self.refusal(session, is_tool_call, now))
            }
            (CallStanding::New, _) => self.refusal(session, is_tool_call, now),
        }
    }

    /// `tool-budget` when the session has made every tool attempt its
    /// budget allows.
    pub fn tool_refusal(&self, session: Option<&Session>) -> Option<Reason> {
        let attempts = session.map_or(0, |session| session.tool_attempts);
        self.max_tool_calls
            .is_some_and(|max| attempts >= max)
            .then_some(Reason::ToolBudget)
    }

    /// SPEC §4 step 6 for a new call id that passed steps 2–5: tool calls
    /// spent, then the session's age. `None` when the budget admits it.
    pub fn refusal(
        &self,
        session: Option<&Session>,
        is_tool_call: bool,
        now: Timestamp,
    ) -> Option<Reason> {
        if is_tool_call && let Some(refused) = self.tool_refusal(session) {
            return Some(refused);
        }
        let session = session?;
        if let Some(max_seconds) = self.max_session_seconds
            && now.millis_since(session.started_at) >= max_seconds.saturating_mul(1000)
        {
            return Some(Reason::SessionExpired);
        }
        None
    }
}

/// What a call id decided again in its session costs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Repeats {
    /// Nothing (Decide, Dispatch): it is a retry of one action, which
    /// runs at most once, when Dispatch commits it; it keeps the budget
    /// verdict it got.
    Free,
    /// A tool attempt, after the session budget is checked again (an
    /// external authorizer's Check): the proxy forwards every call it
    /// allows, so each repeat of a call id runs. Not a decision: a call id
    /// counts one.
    Charged,
}

/// What one answered Decide (or Dispatch) does to its session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Charge {
    /// A new call id: one decision, and remembered with its fingerprint.
    pub decision: bool,
    /// One tool attempt too (an unknown or `execute` tool).
    pub tool_attempt: bool,
    /// A decided call id settles the tool attempt it owed
    /// ([`DecidedCall`]): paid, or refused `tool-budget` (its `verdict`).
    pub settles: bool,
    /// The budget that refused the call, if one did.
    pub refused: Option<Reason>,
    /// The budget verdict a new call id is remembered with (`refused`, or
    /// what the budget says of it when another step answered first), or a
    /// call id that settles its owed attempt from then on.
    pub verdict: Option<Reason>,
}

impl Charge {
    /// The charge of an answer: `decision` when the call id is new; a
    /// tool attempt for it, for a repeat that is [`Repeats::Charged`] and
    /// for a decided call id that settles the one it owes (unless the tool
    /// budget is what refused it, or would have). `budget_verdict`: what
    /// the budget step says of a new call id, or of the attempt a decided
    /// one owes, kept when another step answered first.
    pub fn of(
        standing: CallStanding,
        is_tool_call: bool,
        refused: Option<Reason>,
        budget_verdict: Option<Reason>,
        repeats: Repeats,
    ) -> Self {
        let decision = standing == CallStanding::New && refused != Some(Reason::DecisionBudget);
        let (decided, settles) = match standing {
            CallStanding::Decided { owes_attempt, .. } => (true, owes_attempt),
            _ => (false, false),
        };
        let attempt = decision
            || (settles && budget_verdict.is_none())
            || (repeats == Repeats::Charged && decided);
        Charge {
            decision,
            tool_attempt: attempt && is_tool_call && refused != Some(Reason::ToolBudget),
            settles,
            refused,
            verdict: if settles {
                budget_verdict
            } else {
                refused.or(budget_verdict)
            },
        }
    }
}

/// A request's session with its hash in the sessions table
/// ([`Sessions::key`]): made once per call, so that the steps of a Decide,
/// which look its session up several times, hash it once (SipHash, since
/// clients choose session ids).
#[derive(Debug, Clone, Copy)]
pub struct SessionKey<'a> {
    session: &'a SessionRef,
    hash: u64,
}

impl std::ops::Deref for SessionKey<'_> {
    type Target = SessionRef;

    fn deref(&self) -> &SessionRef {
        self.session
    }
}

/// Sessions by (host identity, session id). Boxed, so that growing the
/// table moves pointers only.
#[derive(Debug, Default)]
pub struct Sessions {
    sessions: Table<Box<Session>>,
    /// Sessions per host identity (for the per-host cap).
    per_host: HashMap<String, usize>,
    /// Σ [`decided_call_bytes`] of the call ids the sessions remember.
    decided_bytes: usize,
    /// Call ids remembered and sessions dropped since the state last took
    /// the changes.
    journal: Journal,
    /// Sessions opened or changed since then (written whole when the
    /// changes are taken, so that a session changed twice is written once;
    /// one whose only change is its last activity, only when
    /// [`Session::due`] says).
    changed: Vec<(String, String)>,
    /// [`touch_every`] of the policy the last session was opened under.
    touch_every: u64,
}

fn session_key(host: &str, session_id: &str) -> Vec<u8> {
    records::key(&[host.as_bytes(), session_id.as_bytes()])
}

/// A decided call id's key: (decided at, host, session id, call id). By time
/// first, so that a batch of new call ids of many sessions writes the last
/// leaf or two of the store's tree, not a leaf per call id (a session's
/// call ids are found in memory, never by key).
fn decided_key(host: &str, session_id: &str, call: &DecidedCall) -> Vec<u8> {
    records::key(&[
        &records::time_part(call.decided_at),
        host.as_bytes(),
        session_id.as_bytes(),
        call.call_id.as_bytes(),
    ])
}

/// What a decided call id's key of the first schema, (host, session id,
/// call id), is prefixed with to become a [`decided_key`]: a decided-at of
/// 0, for the call ids decided before their keys had a time. The stores'
/// migrations use it, so that every store rewrites those keys alike.
pub fn undated_call_key_prefix() -> Vec<u8> {
    records::key(&[&records::time_part(Timestamp(0))])
}

/// A decided call id as it is stored: its record's key and value.
#[derive(Debug, Clone)]
pub struct StoredCall {
    host: String,
    session_id: String,
    call: DecidedCall,
}

impl StoredCall {
    /// The error of a stored call id whose session has no record: a store
    /// that lost one (they are written and deleted in one batch).
    pub fn without_session(&self) -> Error {
        let [host, session_id, call_id] = self.key();
        Error::Internal(format!(
            "the store holds decided call id {call_id:?} of session {session_id:?} (host \
             {host:?}) but not that session's record: it lost a record; restore it from a \
             backup (toolgate store backup)"
        ))
    }

    /// The (host, session id, call id) of its key.
    pub fn key(&self) -> [&str; 3] {
        [&self.host, &self.session_id, &self.call.call_id]
    }
}

/// A stored decided call id of this key and value.
pub fn decode_call(key: &[u8], value: &[u8]) -> Result<StoredCall> {
    let mut call: DecidedCall = records::decode_value(Kind::DecidedCall, value)?;
    let (decided_at, [host, session_id, call_id]) = split_call_key(key)?;
    call.call_id = call_id.into();
    call.decided_at = decided_at;
    Ok(StoredCall {
        host,
        session_id,
        call,
    })
}

/// The (host, session id, call id) of a decided call id's key.
pub fn decode_call_key(key: &[u8]) -> Result<[String; 3]> {
    split_call_key(key).map(|(_, names)| names)
}

/// The parts of a decided call id's key ([`decided_key`]).
fn split_call_key(key: &[u8]) -> Result<(Timestamp, [String; 3])> {
    let split = || {
        let parts = records::split_key(key)?;
        let (at, names) = parts.split_first()?;
        let at = Timestamp(u64::from_be_bytes(<[u8; 8]>::try_from(*at).ok()?));
        Some((at, texts(names)?))
    };
    split().ok_or_else(|| records::corrupt_key(Kind::DecidedCall))
}

/// The (host, session id) of a session's key.
pub fn decode_session_key(key: &[u8]) -> Result<[String; 2]> {
    key_parts::<2>(key).ok_or_else(|| records::corrupt_key(Kind::Session))
}

/// The parts of a key made by [`records::key`], as text, when it has `N`.
fn key_parts<const N: usize>(key: &[u8]) -> Option<[String; N]> {
    texts(&records::split_key(key)?)
}

/// `N` parts of a key as text, when there are `N` and each is UTF-8.
fn texts<const N: usize>(parts: &[&[u8]]) -> Option<[String; N]> {
    let texts: Option<Vec<String>> = parts
        .iter()
        .map(|part| String::from_utf8(part.to_vec()).ok())
        .collect();
    texts?.try_into().ok()
}

impl Sessions {
    pub fn len(&self) -> usize {
        self.sessions.len()
    }

    /// The latest activity of any session (as stored: up to
    /// [`TOUCH_EVERY_MILLIS`] behind).
    pub fn latest_time(&self) -> Timestamp {
        self.sessions
            .iter()
            .map(|session| session.last_seen)
            .max()
            .unwrap_or_default()
    }

    pub fn is_empty(&self) -> bool {
        self.sessions.is_empty()
    }

    /// What the remembered call ids count under the byte budget.
    pub fn decided_bytes(&self) -> usize {
        self.decided_bytes
    }

    /// Counts call id bytes remembered by [`Sessions::settle`], the one
    /// place a call id is remembered.
    fn count_decided_bytes(&mut self, bytes: usize) {
        self.decided_bytes = self.decided_bytes.saturating_add(bytes);
    }

    /// What charging a call of this standing would add under the byte
    /// budget: a call id new to the session is remembered unless the
    /// decisions are spent (then it is refused `decision-budget` and costs
    /// nothing). The caller makes room for it before anything changes.
    pub fn bytes_to_remember(
        &self,
        session: SessionKey<'_>,
        call_id: &str,
        standing: CallStanding,
        budget: &Budget,
    ) -> usize {
        if standing == CallStanding::New && !budget.decisions_spent(self.find(session)) {
            decided_call_bytes(call_id)
        } else {
            0
        }
    }

    fn hash(&self, host: &str, session_id: &str) -> u64 {
        self.sessions.hash(&(host, session_id))
    }

    /// The key of the session a request names, for the lookups of one call.
    pub fn key<'a>(&self, session: &'a SessionRef) -> SessionKey<'a> {
        SessionKey {
            session,
            hash: self.hash(&session.host, &session.session_id),
        }
    }

    /// The session `session_id` of host `host`.
    pub fn get(&self, host: &str, session_id: &str) -> Option<&Session> {
        self.sessions
            .find(self.hash(host, session_id), |session| {
                session.host == host && session.session_id == session_id
            })
            .map(|session| &**session)
    }

    /// The session to change (written when the changes are taken).
    pub fn get_mut(&mut self, host: &str, session_id: &str) -> Option<&mut Session> {
        self.note_changed(host, session_id);
        let hash = self.hash(host, session_id);
        self.sessions
            .find_mut(hash, |session| {
                session.host == host && session.session_id == session_id
            })
            .map(|session| &mut **session)
    }

    /// The session a request names, if it exists.
    pub fn find(&self, session: SessionKey<'_>) -> Option<&Session> {
        self.sessions
            .find(session.hash, |existing| existing.is(&session))
            .map(|existing| &**existing)
    }

    /// A session id is bound to the actor and workspace it started with
    /// (part of SPEC §4 step 1: the session must be valid).
    pub fn check_binding(&self, session: SessionKey<'_>) -> Result<()> {
        let Some(existing) = self.find(session) else {
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

    /// Room for the session a request names, if it is new: checked before
    /// anything else changes, so that an answer never fails to charge.
    /// `actor_share`: the sessions its actor may hold under its host, when
    /// the caller bounds that (a Check, whose client picks the session id).
    pub fn reserve(
        &mut self,
        session: SessionKey<'_>,
        now: Timestamp,
        limits: &Limits,
        actor_share: Option<usize>,
    ) -> Result<()> {
        if self.find(session).is_some() {
            return Ok(());
        }
        self.check_room(&session.host, now, limits)?;
        match actor_share {
            Some(share) => self.check_actor_room(session, share, now, limits),
            None => Ok(()),
        }
    }

    /// Room for one more session of the actor under its host: its idle
    /// sessions are evicted when it holds its share; still full is
    /// RESOURCE_EXHAUSTED. Counted by a walk of the table, which only the
    /// first call of a new session pays.
    fn check_actor_room(
        &mut self,
        session: SessionKey<'_>,
        share: usize,
        now: Timestamp,
        limits: &Limits,
    ) -> Result<()> {
        let held = |sessions: &Self| {
            sessions
                .sessions
                .iter()
                .filter(|held| held.host == session.host && held.actor == session.actor)
                .count()
        };
        if held(self) < share {
            return Ok(());
        }
        self.evict_idle(now, limits);
        if held(self) < share {
            return Ok(());
        }
        Err(Error::ResourceExhausted(format!(
            "actor {:?} holds its maximum of {share} sessions (ext_authz.max_sessions_per_actor)",
            session.actor
        )))
    }

    /// The session for `session`, created if new.
    pub fn open(
        &mut self,
        session: SessionKey<'_>,
        now: Timestamp,
        limits: &Limits,
    ) -> Result<&mut Session> {
        self.check_binding(session)?;
        let hash = session.hash;
        if self.find(session).is_none() {
            self.check_room(&session.host, now, limits)?;
            self.sessions
                .insert_unique(hash, Box::new(Session::new(&session, now)));
            *self.per_host.entry(session.host.clone()).or_insert(0) += 1;
        }
        self.note_changed(&session.host, &session.session_id);
        self.touch_every = touch_every(limits);
        let entry = self
            .sessions
            .find_mut(hash, |existing| existing.is(&session))
            .ok_or_else(|| Error::Internal("session vanished while opening it".into()))?;
        entry.last_seen = now;
        Ok(entry)
    }

    /// Opens the session (it exists from its first answered call) and
    /// applies what the answer costs.
    pub fn settle(
        &mut self,
        session: SessionKey<'_>,
        call_id: &str,
        fingerprint: Fingerprint,
        charge: Charge,
        now: Timestamp,
        limits: &Limits,
    ) -> Result<()> {
        let journaling = self.journal.is_on();
        let entry = self.open(session, now, limits)?;
        // The call id's record as it is now, when it changed and there is a
        // journal (not under `--store memory`): one copy, no other
        // allocation.
        let mut journaled = None;
        let mut remembered = 0;
        if charge.decision {
            let call = DecidedCall {
                call_id: call_id.into(),
                decided_at: now,
                fingerprint,
                refused: charge.verdict,
                owes_attempt: !charge.tool_attempt && charge.verdict.is_none(),
            };
            journaled = journaling.then(|| call.clone());
            remembered = entry.decided.insert(call);
            entry.decisions += 1;
        } else if charge.settles {
            journaled = entry.decided.settle(call_id, charge.verdict, journaling);
        }
        if charge.tool_attempt {
            entry.tool_attempts += 1;
        }
        if let Some(reason) = charge.refused
            && reason != Reason::CallIdConflict
        {
            entry.stopped_reason.get_or_insert(reason);
        }
        self.count_decided_bytes(remembered);
        if let Some(call) = journaled {
            let key = decided_key(&session.host, &session.session_id, &call);
            self.journal.put(Kind::DecidedCall, key, &call);
        }
        Ok(())
    }

    /// Sessions `host` holds.
    pub fn count_of(&self, host: &str) -> usize {
        self.per_host.get(host).copied().unwrap_or(0)
    }

    /// Room for one more session of `host`: idle sessions are evicted when
    /// the table or the host's share of it is full; still full is
    /// RESOURCE_EXHAUSTED. The per-host share keeps one host from filling
    /// the table for every other.
    pub fn check_room(&mut self, host: &str, now: Timestamp, limits: &Limits) -> Result<()> {
        let per_host = limits.max_sessions_per_host;
        if self.sessions.len() >= limits.max_sessions || self.count_of(host) >= per_host {
            self.evict_idle(now, limits);
        }
        if self.sessions.len() >= limits.max_sessions {
            return Err(Error::ResourceExhausted(format!(
                "the session table holds its maximum of {} sessions",
                limits.max_sessions
            )));
        }
        if self.count_of(host) >= per_host {
            return Err(Error::ResourceExhausted(format!(
                "this host holds its maximum of {per_host} sessions (limits.max_sessions_per_host)"
            )));
        }
        Ok(())
    }

    /// Drops sessions idle for longer than the policy's TTL.
    pub fn evict_idle(&mut self, now: Timestamp, limits: &Limits) {
        let idle_millis = u64::try_from(limits.session_idle_ttl.as_millis()).unwrap_or(u64::MAX);
        let (per_host, journal) = (&mut self.per_host, &mut self.journal);
        let mut freed = 0usize;
        self.sessions.retain(|session| {
            let keep = now.millis_since(session.last_seen) < idle_millis;
            if !keep {
                journal.delete(
                    Kind::Session,
                    session_key(&session.host, &session.session_id),
                );
                for call in session.decided.calls.iter() {
                    let key = decided_key(&session.host, &session.session_id, call);
                    journal.delete(Kind::DecidedCall, key);
                }
                freed = freed.saturating_add(session.decided.bytes());
                if let Some(count) = per_host.get_mut(&session.host) {
                    *count = count.saturating_sub(1);
                    if *count == 0 {
                        per_host.remove(&session.host);
                    }
                }
            }
            keep
        });
        self.decided_bytes = self.decided_bytes.saturating_sub(freed);
    }

    /// The sessions of stored records (recovery): each session with the
    /// call ids it decided. A session's record and its call ids' are
    /// written and deleted in one batch, so a call id without its session
    /// is a store that lost a record: refused, not dropped (its session's
    /// budgets and call ids would start again from nothing).
    pub fn restore(sessions: &[Record], calls: &[Record]) -> Result<Sessions> {
        let mut restored = Sessions::default();
        for record in sessions {
            restored.put_session(records::decode(record)?);
        }
        for record in calls {
            let call = decode_call(&record.key, &record.value)?;
            if let Some(orphan) = restored.put_call(call) {
                return Err(orphan.without_session());
            }
        }
        Ok(restored)
    }

    /// A session record as another replica wrote it (or stored it): added,
    /// or replacing the counters of the session of its (host, session id)
    /// whole, keeping the call ids it decided (records of their own).
    /// Nothing is journaled.
    pub fn put_session(&mut self, mut session: Session) {
        session.stored = Some(session.written());
        let hash = self.hash(&session.host, &session.session_id);
        let found = self.sessions.find_mut(hash, |held| {
            held.host == session.host && held.session_id == session.session_id
        });
        match found {
            Some(held) => {
                session.decided = std::mem::take(&mut held.decided);
                session.count_decisions();
                **held = session;
            }
            None => {
                session.decided = DecidedCalls::default();
                *self.per_host.entry(session.host.clone()).or_insert(0) += 1;
                self.sessions.insert_unique(hash, Box::new(session));
            }
        }
    }

    /// Drops a session and the call ids it decided, as another replica did;
    /// nothing is journaled. A session not held is no error.
    pub fn delete_session(&mut self, host: &str, session_id: &str) {
        let hash = self.hash(host, session_id);
        let Some(session) = self.sessions.remove(hash, |session| {
            session.host == host && session.session_id == session_id
        }) else {
            return;
        };
        self.decided_bytes = self.decided_bytes.saturating_sub(session.decided.bytes());
        if let Some(count) = self.per_host.get_mut(host) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.per_host.remove(host);
            }
        }
    }

    /// Remembers a decided call id of a stored record in its session (added
    /// or replaced); nothing is journaled. Handed back when its session is
    /// not held (restore and a replica's apply refuse such a call id).
    pub fn put_call(&mut self, call: StoredCall) -> Option<StoredCall> {
        let hash = self.hash(&call.host, &call.session_id);
        let Some(session) = self.sessions.find_mut(hash, |session| {
            session.host == call.host && session.session_id == call.session_id
        }) else {
            return Some(call);
        };
        let added = session.decided.insert(call.call);
        session.count_decisions();
        self.decided_bytes = self.decided_bytes.saturating_add(added);
        None
    }

    /// Forgets a decided call id, as another replica did; nothing is
    /// journaled. One not remembered is no error.
    pub fn delete_call(&mut self, host: &str, session_id: &str, call_id: &str) {
        let hash = self.hash(host, session_id);
        if let Some(session) = self.sessions.find_mut(hash, |session| {
            session.host == host && session.session_id == session_id
        }) {
            let freed = session.decided.remove(call_id);
            self.decided_bytes = self.decided_bytes.saturating_sub(freed);
        }
    }

    /// Notes a session to be written whole when the changes are taken
    /// (nothing, once journaling stopped).
    fn note_changed(&mut self, host: &str, session_id: &str) {
        if self.journal.is_on() {
            self.changed
                .push((host.to_string(), session_id.to_string()));
        }
    }

    /// Journals nothing from now on ([`Journal::stop`]), and stops noting
    /// which sessions changed.
    pub fn stop_journaling(&mut self) {
        self.journal.stop();
        self.changed = Vec::new();
    }

    /// The records written or dropped since the last call, in order: call
    /// ids and dropped sessions as they happened, then every session
    /// changed since, whole. Returns how many of them are sessions written
    /// for their last activity alone (which no answer reveals).
    pub fn take_changes(&mut self, out: &mut Vec<Change>) -> Result<usize> {
        self.journal.take_into(out)?;
        let mut touches = 0;
        let mut changed = std::mem::take(&mut self.changed);
        changed.sort_unstable();
        changed.dedup();
        let touch_every = self.touch_every;
        for (host, session_id) in changed {
            let hash = self.hash(&host, &session_id);
            let found = self.sessions.find_mut(hash, |session| {
                session.host == host && session.session_id == session_id
            });
            let Some(session) = found else { continue };
            if let Some(due) = session.due(touch_every) {
                touches += usize::from(due == Due::Touched);
                session.stored = Some(session.written());
                let key = session_key(&host, &session_id);
                self.journal.put(Kind::Session, key, &**session);
            }
        }
        self.journal.take_into(out)?;
        Ok(touches)
    }

    /// Notes every session whose last activity is not stored yet, so that
    /// the next [`Sessions::take_changes`] writes it (a clean shutdown loses
    /// none of it).
    pub fn note_every_touch(&mut self) {
        if !self.journal.is_on() {
            return;
        }
        self.touch_every = 0;
        for session in self.sessions.iter() {
            if session.due(0).is_some() {
                self.changed
                    .push((session.host.clone(), session.session_id.clone()));
            }
        }
    }
}

#[cfg(test)]
impl Sessions {
    /// Every session with its call ids, and the counts, in a stable order,
    /// for tests that compare two tables.
    pub(crate) fn dump(&self) -> String {
        let mut sessions: Vec<String> = self
            .sessions
            .iter()
            .map(|session| {
                let mut calls: Vec<String> = session
                    .decided
                    .calls
                    .iter()
                    .map(|call| {
                        let (id, fingerprint) = (&call.call_id, call.fingerprint);
                        format!(
                            "{id} {fingerprint} {:?} {}",
                            call.refused, call.owes_attempt
                        )
                    })
                    .collect();
                calls.sort();
                format!(
                    "{:?} {:?} {} {} {:?} {:?} {} {} {} {} {:?} calls {} bytes {calls:?}",
                    session.host,
                    session.session_id,
                    session.actor,
                    session.workspace,
                    session.started_at,
                    // What the store holds: the last activity it was told.
                    session
                        .stored
                        .map_or(session.last_seen, |stored| stored.last_seen),
                    session.decisions,
                    session.tool_attempts,
                    session.executed_tools,
                    session.executed_cost,
                    session.stopped_reason,
                    session.decided.bytes,
                )
            })
            .collect();
        sessions.sort();
        let mut per_host: Vec<(&String, &usize)> = self.per_host.iter().collect();
        per_host.sort();
        format!(
            "sessions {sessions:#?}\nper host {per_host:?}\ndecided bytes {}\n",
            self.decided_bytes
        )
    }
}
