//! The state's tests: changes another replica committed, applied with
//! [`State::apply_changes`], leave this replica's state as the writer's and
//! as a restore of the store's records.

use uuid::Uuid;

use super::{Grants, Taken};
use crate::domain::clock::Timestamp;
use crate::domain::decision::{DispatchStatus, Dispatched, Outcome};
use crate::domain::error::Error;
use crate::domain::ledger::{ApprovalEvent, ApprovalStatus, EventKind, ListQuery, Verdict};
use crate::domain::manifest::Manifest;
use crate::domain::policy::Policy;
use crate::domain::proposal::{self, Proposal, SessionRef};
use crate::domain::reason::Reason;
use crate::domain::records::{Change, Kind, key, time_part};
use crate::domain::session;
use crate::store::Store;
use crate::store::memory::MemoryStore;

use super::*;

/// Small limits, so that a few hundred operations expire, evict and fill
/// everything; a queue (`outbox`) and a tool that can replace any resource
/// whole (a queue by a value, a value by a queue).
const POLICY: &str = r#"
[limits]
pending_ttl_seconds = 30
grant_ttl_seconds = 45
max_pending_per_actor = 4
max_pending_total = 6
max_approval_records = 10
approval_retention_seconds = 60
max_sessions = 5
session_idle_seconds = 40
receipt_capacity = 6
receipt_retention_seconds = 20
max_approval_argument_bytes = 1024
max_state_bytes = 9000

[profiles.agent]
roles = ["agent"]
max_decisions = 40
max_tool_calls = 30

[actors.learner]
profile = "agent"

[actors.other]
profile = "agent"

[tools.set_ticket]
mode = "execute"
roles = ["agent"]
approvers = ["ticket-reviewer"]
approval = "always"
cost = 1
effect = { kind = "set", resource_argument = "ticket", value_argument = "status", resources = ["lamp", "sensor"] }
input_schema = { type = "object", required = ["ticket", "status"], additionalProperties = false, properties = { ticket = { type = "string" }, status = { type = "string", enum = ["open", "done"] } } }

[tools.send_reply]
mode = "execute"
roles = ["agent"]
approvers = ["ticket-reviewer"]
approval = "always"
cost = 1
effect = { kind = "append", resource = "outbox" }
input_schema = { type = "object", required = ["recipient", "text"], additionalProperties = false, properties = { recipient = { type = "string" }, text = { type = "string" } } }

[tools.reset]
mode = "execute"
roles = ["agent"]
approval = "never"
cost = 2
effect = { kind = "set", resource_argument = "name", value_argument = "value", resources = ["*"] }
input_schema = { type = "object", required = ["name", "value"] }

[tools.lookup]
mode = "read"
roles = ["agent"]
input_schema = { type = "object", required = ["query"], properties = { query = { type = "string" } } }

[reviewers.reviewer]
roles = ["ticket-reviewer"]
workspaces = ["*"]

[[credentials]]
kind = "reviewer"
identity = "reviewer"
sha256 = "887c3f966dd49b2b597b6d6c93d3a2790d63a1e21b1af9d648f00cc1a805aeb8"

[state]
version_scope = "resource"

[state.resources]
lamp = "open"
sensor = "open"
outbox = []

[server]
open_host_api = true
"#;

const MANIFEST: &str = r#"{"server": "docs", "revision": "1", "tools": [
    {"tool": "search", "description": "Search.", "parameters": ["query"],
     "read_only": true, "scopes": ["docs:read"]}]}"#;

const REVIEWER: &str = "reviewer";

fn policy() -> Policy {
    Policy::parse(POLICY, "replicas.toml", None).unwrap()
}

/// A small deterministic generator (xorshift), so that a failure replays.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }

    fn pick<'a, T>(&mut self, items: &'a [T]) -> &'a T {
        &items[self.below(items.len() as u64) as usize]
    }
}

/// Everything the state holds, indexes included, in a stable order.
/// `ties_sorted`: see [`Ledger::dump`].
fn dump(state: &State, policy: &Policy, ties_sorted: bool) -> String {
    let mut assessed: Vec<_> = state.last_assessed.iter().collect();
    assessed.sort_by(|left, right| left.0.cmp(right.0));
    format!(
        "{}{}{}{}pins {:?}\nassessed {assessed:?}\nstats {:?}\nbytes {}\n",
        state.ledger.dump(ties_sorted),
        state.sessions.dump(),
        state.resources.dump(),
        state.receipts.dump(),
        state.list_pins(policy),
        state.stats(),
        state.state_bytes(),
    )
}

/// What a client can read of the state, through the operations' own reads.
fn observe(state: &State, policy: &Policy, sessions: &[SessionRef]) -> String {
    let mut out = format!("{:?}\n", state.stats());
    for status in [
        None,
        Some(ApprovalStatus::Pending),
        Some(ApprovalStatus::Granted),
    ] {
        let mut query = ListQuery {
            status,
            page_size: 3,
            ..ListQuery::default()
        };
        loop {
            let page = state.list_approvals(policy, &query);
            for approval in &page.approvals {
                let got = state.get_approval(approval.id).unwrap();
                assert_eq!(&got, approval);
                out.push_str(&format!("{approval:?}\n"));
            }
            match page.next {
                Some(next) => query.after = Some(next),
                None => break,
            }
        }
    }
    for session in sessions {
        let summary = state.session(&session.host, &session.session_id, 1);
        out.push_str(&format!("{summary:?}\n"));
    }
    let listed = state.list_resources(None, 100, 1 << 20);
    out.push_str(&format!("{listed:?}\n"));
    for name in ["lamp", "sensor", "outbox"] {
        let page = state.resource_page(name, None, 2, 1 << 20);
        out.push_str(&format!("{:?} {page:?}\n", state.resource(name)));
    }
    out.push_str(&format!(
        "{:?} {:?}\n",
        state.list_pins(policy),
        state.manifest_status(policy, "docs")
    ));
    out
}

/// A proposal made by a test: its session and the proposal.
#[derive(Clone)]
struct Call {
    session: SessionRef,
    proposal: Proposal,
}

impl Call {
    /// A call of `tool` in `session`, by its actor.
    fn of(session: &SessionRef, call_id: &str, tool: &str, version: u64, arguments: &str) -> Self {
        let proposal = Proposal::new(
            call_id.into(),
            session.actor.clone(),
            tool.into(),
            version,
            arguments,
        )
        .unwrap();
        Call {
            session: session.clone(),
            proposal,
        }
    }
}

/// Two replicas on one store: `a` runs the operations, `b` applies what
/// `a` committed.
struct Replicas {
    policy: Policy,
    store: MemoryStore,
    a: State,
    b: State,
    now: Timestamp,
    /// What `a`'s operations returned since the last sync.
    events: Vec<ApprovalEvent>,
    sessions: Vec<SessionRef>,
    calls: Vec<Call>,
    /// Calls that committed, with their receipt ids.
    committed: Vec<(Call, Uuid)>,
    next_call: u64,
    syncs: usize,
}

fn events_of(events: &[ApprovalEvent]) -> Vec<(EventKind, Uuid, ApprovalStatus)> {
    events
        .iter()
        .map(|event| (event.kind, event.approval.id, event.approval.status))
        .collect()
}

impl Replicas {
    fn new() -> Self {
        let policy = policy();
        let mut store = MemoryStore::new();
        let mut a = State::restore(&policy, store.load().unwrap()).unwrap();
        let mut b = State::restore(&policy, store.load().unwrap()).unwrap();
        let first = a.take_changes().unwrap();
        assert_eq!(b.take_changes().unwrap(), first);
        store.commit(&first).unwrap();
        let sessions = ["learner", "other"]
            .into_iter()
            .flat_map(|actor| {
                ["", "h2"].into_iter().flat_map(move |host| {
                    ["s1", "s2"].into_iter().map(move |id| {
                        SessionRef::new(actor.into(), format!("{actor}-{id}"), "ws".into())
                            .unwrap()
                            .for_host(host)
                    })
                })
            })
            .collect();
        Replicas {
            policy,
            store,
            a,
            b,
            now: Timestamp(1_000_000),
            events: Vec::new(),
            sessions,
            calls: Vec::new(),
            committed: Vec::new(),
            next_call: 0,
            syncs: 0,
        }
    }

    /// Takes `a`'s changes, commits them and applies them to `b`; then `b`
    /// must be `a` and what a restore of the store makes.
    fn sync(&mut self) {
        let changes = self.a.take_changes().unwrap();
        self.store.commit(&changes).unwrap();
        let events = self.b.apply_changes(&self.policy, &changes).unwrap();
        assert_eq!(
            events_of(&events),
            events_of(&self.events),
            "the events applied are not those the operations made"
        );
        assert_eq!(events, std::mem::take(&mut self.events));
        assert!(
            self.b.take_changes().unwrap().is_empty(),
            "applied changes were journaled again"
        );
        let policy = &self.policy;
        assert_eq!(dump(&self.b, policy, false), dump(&self.a, policy, false));
        let observed = observe(&self.a, policy, &self.sessions);
        assert_eq!(observe(&self.b, policy, &self.sessions), observed);
        let mut restored = State::restore(policy, self.store.load().unwrap()).unwrap();
        assert!(restored.take_changes().unwrap().is_empty());
        assert_eq!(dump(&restored, policy, true), dump(&self.b, policy, true));
        assert_eq!(observe(&restored, policy, &self.sessions), observed);
        self.syncs += 1;
    }

    fn tick(&mut self, rng: &mut Rng) {
        self.now = Timestamp(self.now.0 + 1 + rng.below(1500));
        let events = self.a.expire_due(&self.policy, self.now);
        self.events.extend(events);
    }

    fn new_call(&mut self, rng: &mut Rng) -> Call {
        let session = rng.pick(&self.sessions).clone();
        let (name, target, arguments) = match rng.below(6) {
            0 | 1 => {
                let ticket = *rng.pick(&["lamp", "sensor"]);
                let status = rng.pick(&["open", "done"]);
                let arguments = format!(r#"{{"ticket":"{ticket}","status":"{status}"}}"#);
                ("set_ticket", ticket, arguments)
            }
            2 | 3 => {
                let text = rng.below(1000);
                let arguments = format!(r#"{{"recipient":"customer-1","text":"t{text}"}}"#);
                ("send_reply", "outbox", arguments)
            }
            // A read: a decision, but no tool attempt.
            5 => {
                let query = rng.below(1000);
                ("lookup", "lamp", format!(r#"{{"query":"q{query}"}}"#))
            }
            _ => {
                let name = *rng.pick(&["outbox", "lamp"]);
                let value = *rng.pick(&[r#"[]"#, r#"["x","y","z"]"#, r#"["q"]"#, r#"{"a":1}"#]);
                let arguments = format!(r#"{{"name":"{name}","value":{value}}}"#);
                ("reset", name, arguments)
            }
        };
        let mut version = self.a.resource(target).map_or(0, |(_, version)| version);
        if rng.below(12) == 0 {
            version += 1;
        }
        self.next_call += 1;
        let proposal = Proposal::new(
            format!("call-{}", self.next_call),
            session.actor.clone(),
            name.into(),
            version,
            &arguments,
        )
        .unwrap();
        let call = Call { session, proposal };
        self.calls.push(call.clone());
        call
    }

    fn decide(&mut self, call: &Call, grants: Grants) -> Option<Outcome> {
        let policy = &self.policy;
        let screened = proposal::screen(policy, &call.session, &call.proposal);
        let decided = self.a.decide(
            policy,
            self.now,
            &call.session,
            &call.proposal,
            screened,
            grants,
        );
        match decided {
            Ok((decision, event)) => {
                self.events.extend(event);
                Some(decision.outcome)
            }
            Err(Error::Internal(message)) => panic!("decide failed: {message}"),
            Err(_) => None,
        }
    }

    fn dispatch(&mut self, call: &Call) -> Option<Dispatched> {
        let answer = dispatch_on(&mut self.a, &self.policy, self.now, call);
        let (answer, events) = answer?;
        self.events.extend(events);
        if answer.status == DispatchStatus::Ok
            && !answer.replayed
            && let Some(receipt) = answer.receipt_id
        {
            self.committed.push((call.clone(), receipt));
        }
        Some(answer)
    }

    fn review(&mut self, rng: &mut Rng) {
        let status = match rng.below(4) {
            0 => ApprovalStatus::Granted,
            _ => ApprovalStatus::Pending,
        };
        let query = ListQuery {
            status: Some(status),
            page_size: 100,
            ..ListQuery::default()
        };
        let page = self.a.list_approvals(&self.policy, &query);
        if page.approvals.is_empty() {
            return;
        }
        let approval = rng.pick(&page.approvals).clone();
        let verdict = match (status, rng.below(4)) {
            (ApprovalStatus::Granted, _) => Verdict::Revoke,
            (_, 0) => Verdict::Deny,
            _ => Verdict::Grant,
        };
        let reviewed = self.a.review(
            &self.policy,
            self.now,
            approval.id,
            verdict,
            REVIEWER,
            format!("note {}", rng.below(100)),
        );
        self.events.push(reviewed.unwrap());
    }

    /// One operation on `a`, chosen by `rng`.
    fn step(&mut self, rng: &mut Rng) {
        self.tick(rng);
        match rng.below(20) {
            0..=4 => {
                let call = self.new_call(rng);
                if rng.below(2) == 0 {
                    self.decide(&call, Grants::Keep);
                } else {
                    self.dispatch(&call);
                }
            }
            5..=8 if !self.calls.is_empty() => {
                // Again, after a grant perhaps: a commit, or a replay.
                let call = rng
                    .pick(&self.calls[self.calls.len().saturating_sub(8)..])
                    .clone();
                self.dispatch(&call);
            }
            9 if !self.calls.is_empty() => {
                let call = rng
                    .pick(&self.calls[self.calls.len().saturating_sub(8)..])
                    .clone();
                self.decide(&call, Grants::Consume);
            }
            10..=14 => self.review(rng),
            15 => {
                let manifest = Manifest::from_json(MANIFEST.as_bytes()).unwrap();
                match rng.below(3) {
                    0 => {
                        self.a
                            .pin_manifest(self.now, REVIEWER, manifest, None)
                            .unwrap();
                    }
                    1 => {
                        self.a.assess_manifest(&self.policy, &manifest);
                    }
                    _ => {
                        let _ = self.a.remove_pin(&self.policy, "docs");
                    }
                }
            }
            16 => {
                // Long enough for pending requests, grants, receipts and
                // idle sessions to expire.
                self.now = Timestamp(self.now.0 + 10_000 + rng.below(40_000));
                let events = self.a.sweep(&self.policy, self.now);
                self.events.extend(events);
            }
            _ => {
                let events = self.a.sweep(&self.policy, self.now);
                self.events.extend(events);
            }
        }
    }
}

/// A Dispatch of `call` on `state`; `None` for an error (never internal).
fn dispatch_on(
    state: &mut State,
    policy: &Policy,
    now: Timestamp,
    call: &Call,
) -> Option<(Dispatched, Vec<ApprovalEvent>)> {
    let screened = proposal::screen(policy, &call.session, &call.proposal);
    match state.dispatch(policy, now, &call.session, &call.proposal, screened) {
        Ok(answer) => Some(answer),
        Err(Error::Internal(message)) => panic!("dispatch failed: {message}"),
        Err(_) => None,
    }
}

/// A long mixed run on `a`, synced to `b` every few operations: `b` is `a`
/// and a restore of the store after every sync, and answers every replay
/// as `a` does.
#[test]
fn a_replica_applying_the_changes_is_the_writer_and_its_restore() {
    for seed in [0x9e37_79b9_7f4a_7c15_u64, 7, 12345] {
        let mut rng = Rng(seed);
        let mut replicas = Replicas::new();
        for _ in 0..600 {
            replicas.step(&mut rng);
            if rng.below(4) == 0 {
                replicas.sync();
            }
        }
        replicas.sync();
        let a = &replicas.a;
        // The run reached what it is meant to exercise.
        assert!(
            replicas.committed.len() > 10,
            "{}",
            replicas.committed.len()
        );
        assert!(a.stats().approvals > 0 && a.stats().receipts > 0);
        // Every commit is answered alike on both: a replay of its receipt
        // while it is kept (and its session can still be charged).
        let committed = std::mem::take(&mut replicas.committed);
        let now = replicas.now;
        let mut replays = 0;
        for (call, receipt) in &committed {
            let view = |answer: Option<(Dispatched, Vec<ApprovalEvent>)>| {
                answer.map(|(answer, events)| {
                    let receipt = answer.replayed.then_some(answer.receipt_id);
                    (answer.status, answer.replayed, receipt, events.len())
                })
            };
            let on_a = view(dispatch_on(&mut replicas.a, &replicas.policy, now, call));
            let on_b = view(dispatch_on(&mut replicas.b, &replicas.policy, now, call));
            assert_eq!(on_a, on_b, "{:?}", call.proposal.call_id);
            if let Some((_, true, Some(replayed), _)) = on_a {
                assert_eq!(replayed, Some(*receipt));
                replays += 1;
            }
        }
        assert!(replays > 0, "no commit replayed");
        replicas.a.take_changes().unwrap();
        replicas.b.take_changes().unwrap();
    }
}

/// A state that stopped journaling (its store keeps no records: `serve
/// --store memory`) runs the mixed run all the same, replays what it
/// committed, and hands out no change; the same run on a journaling state
/// hands out changes all along.
#[test]
fn a_state_that_stopped_journaling_runs_alike_and_hands_out_no_change() {
    for stopped in [false, true] {
        let mut rng = Rng(7);
        let mut replicas = Replicas::new();
        if stopped {
            replicas.a.stop_journaling();
        }
        let mut handed_out = 0;
        for _ in 0..600 {
            replicas.step(&mut rng);
            handed_out += replicas.a.take_changes().unwrap().len();
        }
        assert_eq!(handed_out == 0, stopped, "{handed_out} changes");
        assert!(replicas.committed.len() > 10);
        let stats = replicas.a.stats();
        assert!(stats.approvals > 0 && stats.receipts > 0 && stats.sessions > 0);
        let (now, policy) = (replicas.now, &replicas.policy);
        let replayed = replicas
            .committed
            .iter()
            .filter_map(|(call, receipt)| {
                let (answer, _) = dispatch_on(&mut replicas.a, policy, now, call)?;
                answer
                    .replayed
                    .then(|| assert_eq!(answer.receipt_id, Some(*receipt)))
            })
            .count();
        assert!(replayed > 0, "no commit replayed");
    }
}

/// The run's events cover every transition, evictions happen and queues
/// are replaced: what the comparison above is worth.
#[test]
fn the_mixed_run_exercises_every_transition() {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut replicas = Replicas::new();
    let mut kinds = Vec::new();
    let mut deletions = std::collections::BTreeSet::new();
    let (mut most_approvals, mut most_receipts, mut most_bytes) = (0, 0, 0);
    let mut checked_calls = 0;
    for _ in 0..600 {
        replicas.step(&mut rng);
        let stats = replicas.a.stats();
        most_approvals = most_approvals.max(stats.approvals);
        most_receipts = most_receipts.max(stats.receipts);
        most_bytes = most_bytes.max(replicas.a.state_bytes());
        kinds.extend(replicas.events.iter().map(|event| event.kind));
        let changes = replicas.a.take_changes().unwrap();
        for change in &changes {
            if change.value.is_none() {
                deletions.insert(change.kind);
            }
        }
        replicas.store.commit(&changes).unwrap();
        replicas
            .b
            .apply_changes(&replicas.policy, &changes)
            .unwrap();
        replicas.events.clear();
        let stored = stored_call_bytes(&mut replicas.store, &replicas.a);
        assert_eq!(stored, replicas.a.sessions.decided_bytes());
        checked_calls += stored;
    }
    // Full, so that a new request or receipt has to evict to fit.
    let limits = &replicas.policy.limits;
    assert_eq!(most_approvals, limits.max_approval_records);
    assert_eq!(most_receipts, limits.receipt_capacity);
    assert!(most_bytes > limits.max_state_bytes * 9 / 10, "{most_bytes}");
    for kind in [
        EventKind::Requested,
        EventKind::Granted,
        EventKind::Denied,
        EventKind::Revoked,
        EventKind::Expired,
        EventKind::Consumed,
    ] {
        assert!(kinds.contains(&kind), "no {kind:?} event in the run");
    }
    for kind in [
        Kind::Approval,
        Kind::Session,
        Kind::DecidedCall,
        Kind::QueueItem,
        Kind::Receipt,
        Kind::Pin,
        Kind::ApprovalChange,
    ] {
        assert!(deletions.contains(&kind), "no {kind:?} dropped in the run");
    }
    assert!(checked_calls > 0);
}

/// The bytes under the budget of the call ids `store` holds, each checked
/// to be one `state` remembers: a call id is dropped under the key it was
/// written with (its decided-at first), not one left behind under a key
/// nothing deletes.
fn stored_call_bytes(store: &mut MemoryStore, state: &State) -> usize {
    let mut bytes = 0;
    for record in store.load().unwrap() {
        if record.kind != Kind::DecidedCall {
            continue;
        }
        let [host, session_id, call_id] = session::decode_call_key(&record.key).unwrap();
        let held = state.sessions.get(&host, &session_id);
        assert!(
            held.is_some_and(|held| held.decided.get(&call_id).is_some()),
            "{call_id:?} of {session_id:?} is stored but not remembered"
        );
        bytes += session::decided_call_bytes(&call_id);
    }
    bytes
}

/// After applying, `b` takes over: a grant `a` made is consumed on `b`,
/// once; `a`, applying `b`'s changes, sees it consumed, replays `b`'s
/// receipt and cannot use the grant again.
#[test]
fn the_replica_that_applied_takes_over() {
    let mut replicas = Replicas::new();
    let mut rng = Rng(99);
    for _ in 0..150 {
        replicas.step(&mut rng);
    }
    replicas.sync();
    replicas.now = Timestamp(replicas.now.0 + 1);
    let session = replicas.sessions[0].clone();
    // Only set_ticket changes "sensor": it holds a value, not a queue.
    let version = replicas.a.resource("sensor").unwrap().1;
    let arguments = r#"{"ticket":"sensor","status":"done"}"#;
    let call = Call::of(&session, "takeover", "set_ticket", version, arguments);
    replicas.sweep_a();
    let asked = replicas.dispatch(&call).unwrap();
    assert_eq!(asked.status, DispatchStatus::ApprovalRequired, "{asked:?}");
    let id = asked.approval_id.unwrap();
    let granted = replicas
        .a
        .review(
            &replicas.policy,
            replicas.now,
            id,
            Verdict::Grant,
            REVIEWER,
            String::new(),
        )
        .unwrap();
    replicas.events.push(granted);
    replicas.sync();

    // b's turn.
    let now = Timestamp(replicas.now.0 + 1);
    let (committed, events) = dispatch_on(&mut replicas.b, &replicas.policy, now, &call).unwrap();
    assert_eq!(committed.status, DispatchStatus::Ok, "{committed:?}");
    assert_eq!(committed.approval_id, Some(id));
    assert_eq!(
        events_of(&events),
        [(EventKind::Consumed, id, ApprovalStatus::Consumed)]
    );
    let again = dispatch_on(&mut replicas.b, &replicas.policy, now, &call).unwrap();
    assert!(again.0.replayed && again.1.is_empty());
    assert_eq!(again.0.approval_id, Some(id), "the replay names the grant");
    let changes = replicas.b.take_changes().unwrap();
    replicas.store.commit(&changes).unwrap();

    // a's turn again.
    let applied = replicas
        .a
        .apply_changes(&replicas.policy, &changes)
        .unwrap();
    assert_eq!(events_of(&applied), events_of(&events));
    assert!(replicas.a.take_changes().unwrap().is_empty());
    let policy = &replicas.policy;
    assert_eq!(
        dump(&replicas.a, policy, false),
        dump(&replicas.b, policy, false)
    );
    assert_eq!(
        replicas.a.get_approval(id).unwrap().status,
        ApprovalStatus::Consumed
    );
    let now = Timestamp(now.0 + 1);
    let (replayed, events) = dispatch_on(&mut replicas.a, policy, now, &call).unwrap();
    assert!(replayed.replayed && events.is_empty(), "{replayed:?}");
    assert_eq!(replayed.receipt_id, committed.receipt_id);
    assert!(replicas.a.ledger.consume(id, now).is_err());
    let screened = proposal::screen(policy, &call.session, &call.proposal);
    let (decision, event) = replicas
        .a
        .decide(
            policy,
            now,
            &call.session,
            &call.proposal,
            screened,
            Grants::Consume,
        )
        .unwrap();
    assert_ne!(decision.outcome, Outcome::Allow, "the grant was used twice");
    assert_eq!(event.map(|event| event.kind), Some(EventKind::Requested));
}

impl Replicas {
    /// Dispatches a change that needs approval on `a`: the call and the
    /// approval it asked for.
    fn ask_approval(&mut self) -> (Call, Uuid) {
        self.ask_approval_in(0, "first", r#"{"ticket":"sensor","status":"done"}"#)
    }

    /// The same in session `session` with `call_id` and `arguments`.
    fn ask_approval_in(&mut self, session: usize, call_id: &str, arguments: &str) -> (Call, Uuid) {
        let session = self.sessions[session].clone();
        let call = Call::of(&session, call_id, "set_ticket", 0, arguments);
        let asked = self.dispatch(&call).unwrap();
        assert_eq!(asked.status, DispatchStatus::ApprovalRequired, "{asked:?}");
        (call, asked.approval_id.unwrap())
    }

    /// Decides `call` on `a` (it must be allowed) and commits what that
    /// changed; the changes.
    fn decide_and_commit(&mut self, call: &Call) -> Taken {
        assert_eq!(self.decide(call, Grants::Keep), Some(Outcome::Allow));
        let taken = self.a.take().unwrap();
        self.store.commit(&taken.changes).unwrap();
        taken
    }

    fn sweep_a(&mut self) {
        let events = self.a.sweep(&self.policy, self.now);
        self.events.extend(events);
    }
}

/// Queue items of one resource in any order within a batch: the queue is
/// the same.
#[test]
fn queue_items_may_come_in_any_order() {
    let mut replicas = Replicas::new();
    let session = replicas.sessions[0].clone();
    let mut calls = Vec::new();
    let reset = Proposal::new(
        "reset".into(),
        session.actor.clone(),
        "reset".into(),
        0,
        r#"{"name":"outbox","value":["a","b","c"]}"#,
    )
    .unwrap();
    calls.push(reset);
    for call in &calls {
        let call = Call {
            session: session.clone(),
            proposal: call.clone(),
        };
        let (answer, _) =
            dispatch_on(&mut replicas.a, &replicas.policy, replicas.now, &call).unwrap();
        assert_eq!(answer.status, DispatchStatus::Ok, "{answer:?}");
    }
    let mut changes = replicas.a.take_changes().unwrap();
    let mut items: Vec<Change> = changes
        .iter()
        .filter(|change| change.kind == Kind::QueueItem)
        .cloned()
        .collect();
    assert_eq!(items.len(), 3);
    items.reverse();
    changes.retain(|change| change.kind != Kind::QueueItem);
    // Items first, then the rest: before the resource record, in reverse.
    let reordered: Vec<Change> = items.into_iter().chain(changes.iter().cloned()).collect();
    replicas.store.commit(&reordered).unwrap();
    replicas
        .b
        .apply_changes(&replicas.policy, &reordered)
        .unwrap();
    let policy = &replicas.policy;
    assert_eq!(
        dump(&replicas.b, policy, false),
        dump(&replicas.a, policy, false)
    );
    assert_eq!(
        canonical_of(&replicas.b, "outbox"),
        r#"["a","b","c"]"#.to_string()
    );
}

fn canonical_of(state: &State, name: &str) -> String {
    crate::domain::canonical::to_canonical(&state.resource(name).unwrap().0)
}

/// An assessment is written when it is not the server's latest one: the
/// same manifest asked again changes nothing.
#[test]
fn only_a_new_assessment_is_written() {
    let policy = policy();
    let mut state = State::restore(&policy, Vec::new()).unwrap();
    let manifest = Manifest::from_json(MANIFEST.as_bytes()).unwrap();
    let assessments = |state: &mut State| {
        state
            .take_changes()
            .unwrap()
            .into_iter()
            .filter(|change| change.kind == Kind::Assessment)
            .count()
    };
    // Unpinned: nothing is remembered.
    state.assess_manifest(&policy, &manifest);
    assert_eq!(assessments(&mut state), 0);
    state
        .pin_manifest(Timestamp(1), REVIEWER, manifest.clone(), None)
        .unwrap();
    state.take_changes().unwrap();
    state.assess_manifest(&policy, &manifest);
    assert_eq!(assessments(&mut state), 1);
    state.assess_manifest(&policy, &manifest);
    state.assess_manifest(&policy, &manifest);
    assert_eq!(assessments(&mut state), 0);
    let changed = Manifest::from_json(MANIFEST.replace("\"1\"", "\"2\"").as_bytes()).unwrap();
    state.assess_manifest(&policy, &changed);
    assert_eq!(assessments(&mut state), 1);
    assert!(!state.manifest_verified(&policy, "docs"));
    state.assess_manifest(&policy, &manifest);
    assert_eq!(assessments(&mut state), 1);
    assert!(state.manifest_verified(&policy, "docs"));
}

/// A manifest assessed while its server had no pin is its latest: a pin
/// put back by a reload does not find the match remembered from before
/// (the new one is remembered in its place; a server never pinned is not).
#[test]
fn an_assessment_while_unpinned_is_the_latest_when_the_pin_comes_back() {
    let manifest = Manifest::from_json(MANIFEST.as_bytes()).unwrap();
    let unpinned = policy();
    let mut state = State::restore(&unpinned, Vec::new()).unwrap();
    let fingerprint = state.assess_manifest(&unpinned, &manifest).fingerprint;
    let pinned = Policy::parse(
        &format!("{POLICY}\n[[pins]]\nserver = \"docs\"\nfingerprint = \"{fingerprint}\"\n"),
        "pinned.toml",
        None,
    )
    .unwrap();
    state.assess_manifest(&pinned, &manifest);
    assert!(state.manifest_verified(&pinned, "docs"));
    state.take_changes().unwrap();
    // The pin taken away by a reload; the server's manifest changed.
    let changed = Manifest::from_json(MANIFEST.replace("\"1\"", "\"2\"").as_bytes()).unwrap();
    state.assess_manifest(&unpinned, &changed);
    let remembered: Vec<(Kind, bool)> = (state.take_changes().unwrap().into_iter())
        .map(|change| (change.kind, change.value.is_some()))
        .collect();
    assert_eq!(remembered, [(Kind::Assessment, true)]);
    // The same manifest again writes nothing; another server never pinned
    // is not remembered.
    state.assess_manifest(&unpinned, &changed);
    let other = Manifest::from_json(MANIFEST.replace("\"docs\"", "\"other\"").as_bytes()).unwrap();
    state.assess_manifest(&unpinned, &other);
    assert!(state.take_changes().unwrap().is_empty());
    // The pin back: the manifest is not verified until assessed again.
    assert!(!state.manifest_verified(&pinned, "docs"));
    state.assess_manifest(&pinned, &manifest);
    assert!(state.manifest_verified(&pinned, "docs"));
}

/// Deleting what is not held changes nothing and is no error.
#[test]
fn deleting_what_is_not_held_is_no_error() {
    let policy = policy();
    let mut state = State::restore(&policy, Vec::new()).unwrap();
    state.take_changes().unwrap();
    let before = dump(&state, &policy, false);
    let key = crate::domain::records::key;
    let time = crate::domain::records::time_part(Timestamp(5));
    let deletions = [
        (Kind::Approval, key(&[&time, Uuid::new_v4().as_bytes()])),
        (Kind::Session, key(&[b"host", b"session"])),
        (
            Kind::DecidedCall,
            key(&[&time, b"host", b"session", b"call"]),
        ),
        (Kind::QueueItem, key(&[b"outbox", &7u64.to_be_bytes()])),
        (Kind::QueueItem, key(&[b"nothing", &0u64.to_be_bytes()])),
        (Kind::Receipt, key(&[&time, b"host", b"actor", b"call"])),
        (Kind::Pin, b"docs".to_vec()),
        (Kind::Assessment, b"docs".to_vec()),
        (Kind::Meta, b"something else".to_vec()),
    ];
    let changes: Vec<Change> = deletions
        .into_iter()
        .map(|(kind, key)| Change {
            kind,
            key,
            value: None,
        })
        .collect();
    assert!(state.apply_changes(&policy, &changes).unwrap().is_empty());
    assert_eq!(dump(&state, &policy, false), before);
    assert!(state.take_changes().unwrap().is_empty());
}

/// A value or key that does not decode is an internal error naming its
/// kind, and nothing of the batch is applied.
#[test]
fn a_corrupt_change_is_an_error_naming_its_kind() {
    let policy = policy();
    let mut replicas = Replicas::new();
    let mut rng = Rng(3);
    for _ in 0..60 {
        replicas.step(&mut rng);
    }
    replicas.sync();
    // A batch of good changes, to be refused whole.
    let mut rng_b = Rng(4);
    for _ in 0..20 {
        replicas.step(&mut rng_b);
    }
    let good = replicas.a.take_changes().unwrap();
    assert!(!good.is_empty());
    let before = dump(&replicas.b, &policy, false);
    let key = crate::domain::records::key;
    let time = crate::domain::records::time_part(Timestamp(5));
    let valid_keys = [
        (Kind::Approval, key(&[&time, Uuid::new_v4().as_bytes()])),
        (Kind::Session, key(&[b"host", b"session"])),
        (
            Kind::DecidedCall,
            key(&[&time, b"host", b"session", b"call"]),
        ),
        (Kind::Resource, b"outbox".to_vec()),
        (Kind::QueueItem, key(&[b"outbox", &0u64.to_be_bytes()])),
        (Kind::Receipt, key(&[&time, b"host", b"actor", b"call"])),
        (Kind::Pin, b"docs".to_vec()),
        (Kind::Assessment, b"docs".to_vec()),
        (Kind::Meta, b"global_version".to_vec()),
    ];
    for (kind, valid_key) in valid_keys {
        let corrupt_value = Change {
            kind,
            key: valid_key,
            value: Some(b"{not json".to_vec()),
        };
        let mut corrupt_keys = vec![];
        if kind != Kind::Meta {
            for value in [None, Some(b"{}".to_vec())] {
                corrupt_keys.push(Change {
                    kind,
                    key: vec![0xff, 0xff],
                    value: value.clone(),
                });
                if kind == Kind::DecidedCall {
                    // The first schema's key, without the time it was decided.
                    corrupt_keys.push(Change {
                        kind,
                        key: key(&[b"host", b"session", b"call"]),
                        value,
                    });
                }
            }
        }
        for corrupt in std::iter::once(corrupt_value).chain(corrupt_keys) {
            let mut batch = good.clone();
            batch.insert(batch.len() / 2, corrupt.clone());
            match replicas.b.apply_changes(&policy, &batch) {
                Err(Error::Internal(message)) => assert!(
                    message.contains(kind.table()),
                    "{kind:?} {corrupt:?}: {message}"
                ),
                other => panic!("{kind:?} {corrupt:?}: {other:?}"),
            }
            assert_eq!(dump(&replicas.b, &policy, false), before, "{kind:?}");
        }
    }
    // A queue with a gap.
    let stray = Change {
        kind: Kind::QueueItem,
        key: key(&[b"outbox", &1000u64.to_be_bytes()]),
        value: Some(br#""\"x\"""#.to_vec()),
    };
    match replicas.b.apply_changes(&policy, &[stray]) {
        Err(Error::Internal(message)) => assert!(
            message.contains("queue_items") && message.contains("gap"),
            "{message}"
        ),
        other => panic!("{other:?}"),
    }
    // The good batch still applies.
    replicas.store.commit(&good).unwrap();
    replicas.b.apply_changes(&policy, &good).unwrap();
    assert_eq!(
        dump(&replicas.b, &policy, false),
        dump(&replicas.a, &policy, false)
    );
}

/// Changes read as the store's records (the last value of each key, in key
/// order) rather than in the order they were made: a record and its
/// grant's change are a `Requested` and a `Granted` event, the same records
/// again none (the request read again takes nothing back), and the state
/// is the restore's.
#[test]
fn events_are_the_status_changes_whatever_came_before() {
    let mut replicas = Replicas::new();
    let (_, id) = replicas.ask_approval();
    let policy = &replicas.policy;
    replicas
        .a
        .review(
            policy,
            replicas.now,
            id,
            Verdict::Grant,
            REVIEWER,
            String::new(),
        )
        .unwrap();
    let changes = replicas.a.take_changes().unwrap();
    replicas.store.commit(&changes).unwrap();
    let records: Vec<Change> = replicas
        .store
        .load()
        .unwrap()
        .into_iter()
        .map(|record| Change {
            kind: record.kind,
            key: record.key,
            value: Some(record.value),
        })
        .collect();
    let mut fresh = State::restore(policy, Vec::new()).unwrap();
    fresh.take_changes().unwrap();
    let events = fresh.apply_changes(policy, &records).unwrap();
    assert_eq!(
        events_of(&events),
        [
            (EventKind::Requested, id, ApprovalStatus::Pending),
            (EventKind::Granted, id, ApprovalStatus::Granted)
        ]
    );
    assert!(fresh.apply_changes(policy, &records).unwrap().is_empty());
    let mut restored = State::restore(policy, replicas.store.load().unwrap()).unwrap();
    restored.take_changes().unwrap();
    assert_eq!(dump(&fresh, policy, true), dump(&restored, policy, true));
    assert_eq!(
        dump(&fresh, policy, false),
        dump(&replicas.a, policy, false)
    );
}

/// Queue items that would leave a gap in their queue (or items of a value
/// that is not a queue) are refused before anything of the batch is
/// applied; items that leave none are applied in any order.
#[test]
fn a_gap_in_a_queue_is_refused_whole() {
    use crate::domain::canonical::parse_str;
    let policy = policy();
    let mut state = State::restore(&policy, Vec::new()).unwrap();
    state.take_changes().unwrap();
    let key = |index: u64| crate::domain::records::key(&[b"outbox", &index.to_be_bytes()]);
    let put = |index: u64, text: &str| Change {
        kind: Kind::QueueItem,
        key: key(index),
        value: Some(serde_json::to_vec(&parse_str(text).unwrap()).unwrap()),
    };
    let drop = |index: u64| Change {
        kind: Kind::QueueItem,
        key: key(index),
        value: None,
    };
    let not_a_queue = Change {
        kind: Kind::Resource,
        key: b"outbox".to_vec(),
        value: Some(br#"{"version":3,"replaced":1,"value":"\"v\""}"#.to_vec()),
    };
    let version = Change {
        kind: Kind::Meta,
        key: b"global_version".to_vec(),
        value: Some(b"9".to_vec()),
    };
    let batches: [(Vec<Change>, Option<&str>); 7] = [
        (
            vec![put(2, r#""c""#), put(0, r#""a""#), put(1, r#""b""#)],
            Some(r#"["a","b","c"]"#),
        ),
        (vec![version.clone(), drop(1)], None),
        (vec![version.clone(), put(4, r#""e""#)], None),
        (
            vec![version.clone(), not_a_queue.clone(), put(0, r#""z""#)],
            None,
        ),
        (vec![drop(1), drop(2)], Some(r#"["a"]"#)),
        (
            vec![put(2, r#""y""#), put(1, r#""x""#), drop(5)],
            Some(r#"["a","x","y"]"#),
        ),
        (vec![drop(0), drop(1), drop(2), not_a_queue], Some(r#""v""#)),
    ];
    for (batch, after) in batches {
        let before = dump(&state, &policy, false);
        let applied = state.apply_changes(&policy, &batch);
        match after {
            Some(after) => {
                applied.unwrap();
                assert_eq!(canonical_of(&state, "outbox"), after);
            }
            None => {
                match applied {
                    Err(Error::Internal(message)) => {
                        assert!(message.contains("queue_items") && message.contains("gap"));
                    }
                    other => panic!("{batch:?}: {other:?}"),
                }
                assert_eq!(dump(&state, &policy, false), before, "{batch:?}");
            }
        }
    }
}

/// A call that changes nothing of its session but its last activity (a
/// re-evaluated call id, a poll of a pending approval) writes the session
/// only once that is a second past the stored one, so that it waits for no
/// sync; a call that counts writes it at once; and a clean shutdown
/// ([`State::note_every_touch`]) writes what is left.
#[test]
fn a_session_is_rewritten_for_its_last_activity_once_a_second() {
    let mut replicas = Replicas::new();
    let session = replicas.sessions[0].clone();
    let decide_at = |replicas: &mut Replicas, millis: u64, call_id: &str| {
        replicas.now = Timestamp(1_000_000 + millis);
        let call = Call::of(
            &session,
            call_id,
            "reset",
            0,
            r#"{"name":"lamp","value":"on"}"#,
        );
        let taken = replicas.decide_and_commit(&call);
        let sessions = taken
            .changes
            .iter()
            .filter(|change| change.kind == Kind::Session)
            .count();
        (sessions, taken.observable)
    };
    // New: written; the same call id again, under a second later: not.
    assert_eq!(decide_at(&mut replicas, 0, "c1"), (1, true));
    assert_eq!(decide_at(&mut replicas, 400, "c1"), (0, false));
    assert_eq!(decide_at(&mut replicas, 999, "c1"), (0, false));
    // A second past the stored activity: written, and counted from there;
    // the last activity alone is nothing an answer reveals.
    assert_eq!(decide_at(&mut replicas, 1_000, "c1"), (1, false));
    assert_eq!(decide_at(&mut replicas, 1_500, "c1"), (0, false));
    // A new call id counts a decision: written at once, and revealed.
    assert_eq!(decide_at(&mut replicas, 1_600, "c2"), (1, true));
    assert_eq!(decide_at(&mut replicas, 1_700, "c2"), (0, false));
    let stored = |replicas: &mut Replicas| {
        let restored = State::restore(&replicas.policy, replicas.store.load().unwrap()).unwrap();
        let held = restored.sessions.get(&session.host, &session.session_id);
        held.map(|held| held.last_seen)
    };
    // The last activity the store holds is 1,600, not 1,700, until a clean
    // shutdown notes it.
    let all = |replicas: &mut Replicas| {
        let changes = replicas.a.take_changes().unwrap();
        replicas.store.commit(&changes).unwrap();
        changes.len()
    };
    assert_eq!(all(&mut replicas), 0);
    assert_eq!(stored(&mut replicas), Some(Timestamp(1_001_600)));
    replicas.a.note_every_touch();
    assert_eq!(all(&mut replicas), 1);
    assert_eq!(stored(&mut replicas), Some(Timestamp(1_001_700)));
    replicas.a.note_every_touch();
    assert_eq!(all(&mut replicas), 0);
}

/// Call ids stored under the first schema's keys, as the stores' migration
/// rewrites them (the undated prefix before (host, session id, call id)):
/// restored and remembered, and dropped under those very keys when their
/// session is evicted.
#[test]
fn call_ids_of_the_first_schema_restore_and_are_dropped_under_their_keys() {
    let mut replicas = Replicas::new();
    let session = replicas.sessions[0].clone();
    let call = Call::of(
        &session,
        "c1",
        "reset",
        0,
        r#"{"name":"lamp","value":"on"}"#,
    );
    assert_eq!(replicas.decide(&call, Grants::Keep), Some(Outcome::Allow));
    // The key as this schema writes it: (decided at, host, session, call).
    let dated = key(&[
        &time_part(replicas.now),
        session.host.as_bytes(),
        session.session_id.as_bytes(),
        b"c1",
    ]);
    let migrated = [
        session::undated_call_key_prefix(),
        key(&[
            session.host.as_bytes(),
            session.session_id.as_bytes(),
            b"c1",
        ]),
    ]
    .concat();
    let mut changes = replicas.a.take_changes().unwrap();
    let mut calls = 0;
    for change in &mut changes {
        if change.kind == Kind::DecidedCall {
            assert_eq!(change.key, dated);
            change.key = migrated.clone();
            calls += 1;
        }
    }
    assert_eq!(calls, 1);
    replicas.store.commit(&changes).unwrap();
    let policy = policy();
    let mut restored = State::restore(&policy, replicas.store.load().unwrap()).unwrap();
    let held = restored.sessions.get(&session.host, &session.session_id);
    assert_eq!(
        held.and_then(|held| held.decided.get("c1")),
        Some(call.proposal.fingerprint)
    );
    // Idle past the policy's 40 s: the session and its call id go, the
    // call id under its migrated key.
    let later = Timestamp(replicas.now.0 + 41_000);
    restored.sweep(&policy, later);
    let dropped = restored.take_changes().unwrap();
    assert!(
        dropped.iter().any(|change| change.kind == Kind::DecidedCall
            && change.key == migrated
            && change.value.is_none()),
        "{dropped:?}"
    );
    replicas.store.commit(&dropped).unwrap();
    assert_eq!(stored_call_bytes(&mut replicas.store, &restored), 0);
}

/// A decided call id whose session's record the store lost stops the
/// start (and a replica's apply): dropped, its session's budget and call ids would start again
/// from nothing (a call id already committed decided as new).
#[test]
fn a_call_id_without_its_session_stops_the_restore() {
    let mut replicas = Replicas::new();
    let session = replicas.sessions[0].clone();
    let call = Call::of(&session, "c1", "lookup", 0, r#"{"query":"q"}"#);
    let changes = replicas.decide_and_commit(&call).changes;
    // A replica taking the batch in without the session's record refuses
    // it as a restart would.
    let calls_only: Vec<_> = (changes.iter())
        .filter(|change| change.kind != Kind::Session)
        .cloned()
        .collect();
    let mut fresh = State::restore(&policy(), Vec::new()).unwrap();
    let error = fresh.apply_changes(&policy(), &calls_only).unwrap_err();
    assert!(
        error.to_string().contains("not that session's record"),
        "{error}"
    );
    let records = replicas.store.load().unwrap();
    assert!(State::restore(&policy(), records.clone()).is_ok());
    let lost: Vec<_> = records
        .into_iter()
        .filter(|record| record.kind != Kind::Session)
        .collect();
    let error = State::restore(&policy(), lost).expect_err("refused");
    let message = error.to_string();
    assert!(
        message.contains("decided call id \"c1\"") && message.contains("not that session's record"),
        "{message}"
    );
}

/// A new call id that costs no tool attempt (a read) writes its own record
/// only, not its session's: the session's count of decisions is the count
/// of its call ids at restore.
#[test]
fn a_new_call_id_of_a_read_writes_its_call_id_not_its_session() {
    let mut replicas = Replicas::new();
    let session = replicas.sessions[0].clone();
    let decide = |replicas: &mut Replicas, call_id: &str| {
        let call = Call::of(&session, call_id, "lookup", 0, r#"{"query":"q"}"#);
        let changes = replicas.decide_and_commit(&call).changes;
        let count = |kind| changes.iter().filter(|change| change.kind == kind).count();
        (count(Kind::Session), count(Kind::DecidedCall))
    };
    // The first call opens the session: both written.
    assert_eq!(decide(&mut replicas, "r1"), (1, 1));
    // Later ones, within the second: the call id only.
    assert_eq!(decide(&mut replicas, "r2"), (0, 1));
    assert_eq!(decide(&mut replicas, "r3"), (0, 1));
    let held = |state: &State| {
        let held = state.sessions.get(&session.host, &session.session_id);
        held.map(|held| (held.decisions, held.tool_attempts))
    };
    assert_eq!(held(&replicas.a), Some((3, 0)));
    let restored = State::restore(&replicas.policy, replicas.store.load().unwrap()).unwrap();
    assert_eq!(held(&restored), Some((3, 0)));
}

/// An approval's record is written once, at its request; its grant and its
/// end are each a small record of their own. A revoke drops the grant's
/// record at once, an eviction drops the rest with the approval, and a
/// restore of the store is the live ledger at every step.
#[test]
fn an_approval_is_written_once_and_each_step_apart() {
    let mut replicas = Replicas::new();
    let written = |changes: &[Change]| -> Vec<(Kind, bool)> {
        changes
            .iter()
            .filter(|change| matches!(change.kind, Kind::Approval | Kind::ApprovalChange))
            .map(|change| (change.kind, change.value.is_some()))
            .collect()
    };
    let commit_and_restore = |replicas: &mut Replicas| {
        let changes = replicas.a.take_changes().unwrap();
        replicas.store.commit(&changes).unwrap();
        let restored = State::restore(&replicas.policy, replicas.store.load().unwrap()).unwrap();
        assert_eq!(
            dump(&restored, &replicas.policy, false),
            dump(&replicas.a, &replicas.policy, false)
        );
        changes
    };
    let (call, id) = replicas.ask_approval();
    let asked = commit_and_restore(&mut replicas);
    assert_eq!(written(&asked), [(Kind::Approval, true)]);
    let review = |replicas: &mut Replicas, id, verdict| {
        let now = replicas.now;
        replicas
            .a
            .review(&replicas.policy, now, id, verdict, REVIEWER, "ok".into())
            .unwrap();
        commit_and_restore(replicas)
    };
    let granted = review(&mut replicas, id, Verdict::Grant);
    assert_eq!(written(&granted), [(Kind::ApprovalChange, true)]);
    let done = replicas.dispatch(&call).unwrap();
    assert_eq!(done.status, DispatchStatus::Ok, "{done:?}");
    let consumed = commit_and_restore(&mut replicas);
    assert_eq!(written(&consumed), [(Kind::ApprovalChange, true)]);
    let end = consumed
        .iter()
        .find(|change| change.kind == Kind::ApprovalChange)
        .and_then(|change| change.value.as_ref())
        .unwrap();
    assert!(end.len() < 200, "{}", String::from_utf8_lossy(end));

    // Granted, then revoked: the grant's record goes with the revoke.
    replicas.now = Timestamp(replicas.now.0 + 1);
    let (_, second) = replicas.ask_approval_in(1, "second", r#"{"ticket":"lamp","status":"done"}"#);
    commit_and_restore(&mut replicas);
    review(&mut replicas, second, Verdict::Grant);
    let revoked = review(&mut replicas, second, Verdict::Revoke);
    assert_eq!(
        written(&revoked),
        [(Kind::ApprovalChange, false), (Kind::ApprovalChange, true)]
    );

    // Granted, then expired.
    let (_, third) = replicas.ask_approval_in(1, "third", r#"{"ticket":"lamp","status":"open"}"#);
    commit_and_restore(&mut replicas);
    review(&mut replicas, third, Verdict::Grant);
    // A day later: the third expired, the first two evicted past
    // retention, each with every record it had (a request and its two
    // steps; a revoked one's grant went already); a day after that the
    // third too.
    let counted = |changes: &[Change]| {
        let written = written(changes);
        let puts = written.iter().filter(|(_, put)| *put).count();
        (puts, written.len() - puts)
    };
    let day = 86_400_000;
    replicas.now = Timestamp(replicas.now.0 + day);
    replicas.sweep_a();
    let swept = commit_and_restore(&mut replicas);
    assert_eq!(counted(&swept), (1, 3 + 2), "{swept:?}");
    assert_eq!(
        replicas.a.ledger.get(third).unwrap().status,
        ApprovalStatus::Expired
    );
    replicas.now = Timestamp(replicas.now.0 + day);
    replicas.sweep_a();
    let swept = commit_and_restore(&mut replicas);
    assert_eq!(counted(&swept), (0, 3), "{swept:?}");
    for id in [id, second, third] {
        assert!(replicas.a.ledger.get(id).is_err());
    }
    let stored = replicas.store.load().unwrap();
    let held = |id: Uuid| {
        stored.iter().any(|record| match record.kind {
            Kind::Approval => ledger::parse_record_key(&record.key).map(|(_, of)| of) == Some(id),
            Kind::ApprovalChange => {
                ledger::parse_change_key(&record.key).map(|(_, of)| of) == Some(id)
            }
            _ => false,
        })
    };
    assert!(!held(id) && !held(second) && !held(third));
}

/// A store an older toolgate wrote holds an approval's record as its last
/// step left it, and no changes apart: it restores as such, and the steps
/// to come are written apart.
#[test]
fn an_approval_stored_whole_by_an_older_toolgate_goes_on() {
    let mut replicas = Replicas::new();
    let (call, id) = replicas.ask_approval();
    let now = replicas.now;
    replicas
        .a
        .review(
            &replicas.policy,
            now,
            id,
            Verdict::Grant,
            REVIEWER,
            "ok".into(),
        )
        .unwrap();
    replicas
        .store
        .commit(&replicas.a.take_changes().unwrap())
        .unwrap();
    let granted = replicas.a.ledger.get(id).unwrap().clone();
    let mut older = MemoryStore::new();
    let whole: Vec<Change> = replicas
        .store
        .load()
        .unwrap()
        .into_iter()
        .filter(|record| record.kind != Kind::ApprovalChange)
        .map(|record| Change {
            kind: record.kind,
            value: Some(match record.kind {
                Kind::Approval => serde_json::to_vec(&granted).unwrap(),
                _ => record.value,
            }),
            key: record.key,
        })
        .collect();
    older.commit(&whole).unwrap();
    let policy = &replicas.policy;
    let mut state = State::restore(policy, older.load().unwrap()).unwrap();
    older.commit(&state.take_changes().unwrap()).unwrap();
    assert_eq!(state.ledger.get(id).unwrap(), &granted);
    let (done, _) = dispatch_on(&mut state, policy, now, &call).unwrap();
    assert_eq!(done.status, DispatchStatus::Ok, "{done:?}");
    let consumed = state.take_changes().unwrap();
    assert!(
        consumed
            .iter()
            .any(|change| change.kind == Kind::ApprovalChange)
            && !consumed.iter().any(|change| change.kind == Kind::Approval),
        "{consumed:?}"
    );
    older.commit(&consumed).unwrap();
    let restored = State::restore(policy, older.load().unwrap()).unwrap();
    assert_eq!(
        restored.ledger.get(id).unwrap().status,
        ApprovalStatus::Consumed
    );
    assert_eq!(dump(&restored, policy, false), dump(&state, policy, false));
}

/// A tool `reset` that sets a resource to a string; receipts kept 20 s, two
/// at a time, so that a committed call id's receipt is soon gone; `limits`
/// more of `[limits]`, `state` the `[state]` sections.
fn reset_policy(limits: &str, state: &str) -> Policy {
    let text = format!(
        r#"
[limits]
receipt_capacity = 2
receipt_retention_seconds = 20
{limits}

[profiles.agent]
roles = ["agent"]

[actors.learner]
profile = "agent"

[tools.reset]
mode = "execute"
roles = ["agent"]
approval = "never"
effect = {{ kind = "set", resource_argument = "name", value_argument = "value", resources = ["*"] }}
input_schema = {{ type = "object", properties = {{ value = {{ type = "string" }} }} }}

{state}

[server]
open_host_api = true
"#
    );
    Policy::parse(&text, "reset.toml", None).unwrap()
}

/// A call of `reset` by `learner` in `session`.
fn reset_call(session: &SessionRef, call_id: &str, version: u64, arguments: &str) -> Call {
    Call {
        session: session.clone(),
        proposal: Proposal::new(
            call_id.into(),
            "learner".into(),
            "reset".into(),
            version,
            arguments,
        )
        .unwrap(),
    }
}

/// Two resources under `reset` (only a committed call id's version keeps
/// it from committing again once its receipt is gone).
fn scope_policy(scope: &str) -> Policy {
    reset_policy(
        "",
        &format!("[state]\nversion_scope = \"{scope}\"\n\n[state.resources]\na = \"x\"\nb = \"x\""),
    )
}

/// From `global` to `resource` versions, by a reload or across a restart,
/// no resource's version goes back: a call id committed under the global
/// version, its receipt gone, stays stale instead of committing again
/// (each resource's own count of commits was below the global version the
/// proposals carried).
#[test]
fn a_scope_changed_to_per_resource_never_takes_a_version_back() {
    for restart in [false, true] {
        let global = scope_policy("global");
        let mut store = MemoryStore::new();
        let mut state = State::restore(&global, store.load().unwrap()).unwrap();
        let session = SessionRef::new("learner".into(), "s1".into(), "ws".into()).unwrap();
        let call = |call_id: &str, version: u64, arguments: &str| {
            reset_call(&session, call_id, version, arguments)
        };
        let paid = call("c1", 1, r#"{"name":"a","value":"paid"}"#);
        let status = |state: &mut State, policy: &Policy, now: u64, call: &Call| {
            let (answer, _) = dispatch_on(state, policy, Timestamp(now), call).expect("answered");
            (answer.status, answer.replayed)
        };
        let ok = (DispatchStatus::Ok, false);
        let b = |id: &str, version: u64| call(id, version, r#"{"name":"b","value":"y"}"#);
        assert_eq!(status(&mut state, &global, 1_000, &b("c0", 0)), ok);
        assert_eq!(status(&mut state, &global, 1_000, &paid), ok);
        // Past retention, two more commits push c0's and c1's receipts out.
        assert_eq!(status(&mut state, &global, 22_000, &b("c2", 2)), ok);
        assert_eq!(status(&mut state, &global, 22_000, &b("c3", 3)), ok);
        let stale = (DispatchStatus::StaleVersion, false);
        assert_eq!(status(&mut state, &global, 22_000, &paid), stale);
        let per_resource = scope_policy("resource");
        if restart {
            store.commit(&state.take_changes().unwrap()).unwrap();
            state = State::restore(&per_resource, store.load().unwrap()).unwrap();
        } else {
            state.adopt_policy(&per_resource);
        }
        assert_eq!(status(&mut state, &per_resource, 44_000, &paid), stale);
        // Proposals at the version in force commit, against either.
        let version = state.resource("a").unwrap().1;
        assert_eq!(version, 4, "restart {restart}");
        assert_eq!(
            status(
                &mut state,
                &per_resource,
                44_000,
                &call("c4", 4, r#"{"name":"a","value":"z"}"#)
            ),
            ok
        );
        // What was raised is stored, and the scope with it: a restart on
        // the same policy changes nothing more.
        store.commit(&state.take_changes().unwrap()).unwrap();
        let mut again = State::restore(&per_resource, store.load().unwrap()).unwrap();
        assert!(
            again.take_changes().unwrap().is_empty(),
            "restart {restart}"
        );
        assert_eq!(again.resource("a").unwrap().1, 5);
        assert_eq!(again.resource("b").unwrap().1, 4);
    }
}

/// One resource under `reset`, and `max_state_bytes` as given.
fn tight_policy(max_state_bytes: usize) -> Policy {
    reset_policy(
        &format!("max_state_bytes = {max_state_bytes}\nmax_approval_argument_bytes = 64"),
        "[state.resources]\na = \"x\"",
    )
}

/// A commit refused for the byte budget evicts nothing, not even the
/// receipt past retention the count cap would have let go: a refusal
/// changes no state, and a replay of that receipt still finds it.
#[test]
fn a_commit_refused_for_bytes_evicts_no_receipt() {
    let policy = tight_policy(2048);
    let mut state = State::restore(&policy, MemoryStore::new().load().unwrap()).unwrap();
    let session = SessionRef::new("learner".into(), "s1".into(), "ws".into()).unwrap();
    let call = |call_id: &str, version: u64, value: &str| {
        let arguments = format!(r#"{{"name":"a","value":"{value}"}}"#);
        reset_call(&session, call_id, version, &arguments)
    };
    let mut dispatch = |now: u64, call: &Call| {
        let screened = proposal::screen(&policy, &call.session, &call.proposal);
        state
            .dispatch(
                &policy,
                Timestamp(now),
                &call.session,
                &call.proposal,
                screened,
            )
            .map(|(answer, _)| (answer.status, answer.replayed))
    };
    let (ok, replayed) = ((DispatchStatus::Ok, false), (DispatchStatus::Ok, true));
    assert_eq!(dispatch(1_000, &call("c0", 0, "y")).unwrap(), ok);
    assert_eq!(dispatch(1_000, &call("c1", 1, "z")).unwrap(), ok);
    // Past retention: c0's receipt may go for the count, but the receipt of
    // this value alone is over the whole budget.
    let big = "v".repeat(2_000);
    let refused = dispatch(22_000, &call("c2", 2, &big)).unwrap_err();
    assert!(
        matches!(refused, Error::ResourceExhausted(_)),
        "{refused:?}"
    );
    assert_eq!(dispatch(22_000, &call("c0", 0, "y")).unwrap(), replayed);
    // A commit that fits lets c0's receipt go for the count, and only it.
    assert_eq!(dispatch(22_000, &call("c3", 2, "w")).unwrap(), ok);
    assert_eq!(dispatch(22_000, &call("c1", 1, "z")).unwrap(), replayed);
    assert_eq!(
        dispatch(22_000, &call("c0", 0, "y")).unwrap(),
        (DispatchStatus::StaleVersion, false)
    );
}

/// A policy whose actor may call `deploy` (of `mode`) once a session, with
/// or without the role the tool needs; `budget` is more of the profile.
fn budget_policy(role: &str, mode: &str, budget: &str) -> Policy {
    let text = format!(
        r#"
[profiles.agent]
roles = ["{role}"]
max_tool_calls = 1
{budget}

[actors.learner]
profile = "agent"

[tools.deploy]
mode = "{mode}"
roles = ["deployer"]
approval = "never"

[tools.other]
mode = "execute"
roles = ["agent", "deployer"]
approval = "never"

[server]
open_host_api = true
"#
    );
    Policy::parse(&text, "budget.toml", None).unwrap()
}

/// A call of `budget_policy`'s actor in `session`: of `other` for a call id
/// starting with `o`, of `deploy` otherwise.
fn budget_call(session: &str, call_id: &str) -> Call {
    let session = SessionRef::new("learner".into(), session.into(), "ws".into()).unwrap();
    let tool = if call_id.starts_with('o') {
        "other"
    } else {
        "deploy"
    };
    let proposal = Proposal::new(call_id.into(), "learner".into(), tool.into(), 0, "{}").unwrap();
    Call { session, proposal }
}

/// A new call id answered before the budget step keeps the verdict the
/// budget gave it then: once a reload lets its tool through, one decided
/// after the one tool call was spent is refused `tool-budget`, and one
/// decided within the budget is allowed — whether the tool was refused for
/// the actor's roles or as forbidden.
#[test]
fn a_call_id_refused_before_the_budget_keeps_the_budgets_verdict() {
    let after = budget_policy("deployer", "execute", "");
    for (before, refusal) in [
        (budget_policy("agent", "execute", ""), Reason::NotAuthorized),
        (
            budget_policy("deployer", "forbidden", ""),
            Reason::ForbiddenTool,
        ),
    ] {
        let mut state = State::restore(&before, MemoryStore::new().load().unwrap()).unwrap();
        let reason = |state: &mut State, policy: &Policy, session: &str, call_id: &str| {
            let Call { session, proposal } = budget_call(session, call_id);
            let screened = proposal::screen(policy, &session, &proposal);
            let (decision, _) = state
                .decide(
                    policy,
                    Timestamp(1_000),
                    &session,
                    &proposal,
                    screened,
                    Grants::Keep,
                )
                .unwrap();
            decision.reason
        };
        // s1 spends its one tool call, then asks for `deploy`; s2 asks
        // for `deploy` first.
        assert_eq!(reason(&mut state, &before, "s1", "o0"), Reason::Allowed);
        assert_eq!(reason(&mut state, &before, "s1", "c1"), refusal);
        assert_eq!(reason(&mut state, &before, "s2", "c0"), refusal);
        state.adopt_policy(&after);
        assert_eq!(reason(&mut state, &after, "s1", "c1"), Reason::ToolBudget);
        assert_eq!(reason(&mut state, &after, "s2", "c0"), Reason::Allowed);
    }
}

/// A call id decided while its tool was not a tool call (`read`, or
/// `forbidden`) owes the tool attempt it was not charged. Once a reload
/// makes its tool an `execute` one, the first Decide, Dispatch or Check of
/// it settles that, whichever step answers: paid if the tool budget admits
/// it, else refused `tool-budget` from then on; a restart keeps what was
/// settled. A tool gone for a while settles nothing.
#[test]
fn a_call_id_decided_before_its_tool_was_a_tool_call_settles_its_attempt() {
    let after = budget_policy("deployer", "execute", "");
    // `deploy` is an `execute` tool the actor may not call: refused before
    // the budget step.
    let unauthorized = budget_policy("agent", "execute", "");
    // `deploy` gone.
    let removed = Policy::parse(
        "[profiles.agent]\nroles = [\"deployer\"]\nmax_tool_calls = 1\n\
         [actors.learner]\nprofile = \"agent\"\n\
         [tools.other]\nmode = \"execute\"\nroles = [\"deployer\"]\napproval = \"never\"\n\
         [server]\nopen_host_api = true\n",
        "removed.toml",
        None,
    )
    .unwrap();
    for mode in ["read", "forbidden"] {
        let before = budget_policy("deployer", mode, "");
        let mut store = MemoryStore::new();
        let mut state = State::restore(&before, store.load().unwrap()).unwrap();
        let attempts = |state: &State, call: &Call| {
            let held = state.sessions.get("", &call.session.session_id);
            held.map(|held| held.tool_attempts)
        };
        let ask = |state: &mut State, policy: &Policy, grants, session: &str, call_id: &str| {
            let call = budget_call(session, call_id);
            let screened = proposal::screen(policy, &call.session, &call.proposal);
            let (decision, _) = state
                .decide(
                    policy,
                    Timestamp(1_000),
                    &call.session,
                    &call.proposal,
                    screened,
                    grants,
                )
                .unwrap();
            (decision.reason, attempts(state, &call))
        };
        let decide = |state: &mut State, policy: &Policy, session: &str, call_id: &str| {
            ask(state, policy, Grants::Keep, session, call_id)
        };
        let first = if mode == "read" {
            Reason::Allowed
        } else {
            Reason::ForbiddenTool
        };
        // Every session decides `deploy` while it is no tool call; s2, s4
        // and s7 then spend their one tool call.
        for session in ["s1", "s2", "s3", "s4", "s5", "s6", "s7"] {
            let asked = decide(&mut state, &before, session, &format!("c{session}"));
            assert_eq!(asked, (first, Some(0)));
        }
        for session in ["s2", "s4", "s7"] {
            let asked = decide(&mut state, &before, session, &format!("o{session}"));
            assert_eq!(asked, (Reason::Allowed, Some(1)));
        }

        // While `deploy` is gone, nothing is settled: back as it was, s7's
        // call id is answered as before.
        state.adopt_policy(&removed);
        let unknown = (Reason::UnknownTool, Some(1));
        assert_eq!(decide(&mut state, &removed, "s7", "cs7"), unknown);
        state.adopt_policy(&before);
        assert_eq!(decide(&mut state, &before, "s7", "cs7"), (first, Some(1)));

        // Each answered with the session's one tool attempt made.
        let expect = |state: &mut State, policy: &Policy, asked: &[(&str, &str, Reason)]| {
            for &(session, call_id, reason) in asked {
                let answer = decide(state, policy, session, call_id);
                assert_eq!(answer, (reason, Some(1)), "{session} {call_id}");
            }
        };
        // Refused before the budget step: s3 pays its attempt, s4 cannot.
        state.adopt_policy(&unauthorized);
        let refused = Reason::NotAuthorized;
        expect(
            &mut state,
            &unauthorized,
            &[("s3", "cs3", refused), ("s4", "cs4", refused)],
        );

        // s1 pays its attempt now, and only once; s3 paid it already; s2
        // and s4 had spent their budget: refused.
        state.adopt_policy(&after);
        let asked = [
            ("s1", "cs1", Reason::Allowed),
            ("s1", "cs1", Reason::Allowed),
            ("s1", "o1", Reason::ToolBudget),
            ("s3", "cs3", Reason::Allowed),
            ("s2", "cs2", Reason::ToolBudget),
            ("s4", "cs4", Reason::ToolBudget),
        ];
        expect(&mut state, &after, &asked);
        // A Dispatch pays it as a Decide does, and commits once.
        let dispatched = budget_call("s5", "cs5");
        for replayed in [false, true] {
            let (answer, _) =
                dispatch_on(&mut state, &after, Timestamp(1_000), &dispatched).unwrap();
            assert_eq!(
                (answer.status, answer.replayed),
                (DispatchStatus::Ok, replayed)
            );
            assert_eq!(attempts(&state, &dispatched), Some(1));
        }
        // A Check charges every repeat; the one it owed is the first.
        let checked = ask(&mut state, &after, Grants::Consume, "s6", "cs6");
        assert_eq!(checked, (Reason::Allowed, Some(1)));
        let checked = ask(&mut state, &after, Grants::Consume, "s6", "cs6");
        assert_eq!(checked, (Reason::ToolBudget, Some(1)));

        // What was settled survives a restart.
        store.commit(&state.take_changes().unwrap()).unwrap();
        let mut restored = State::restore(&after, store.load().unwrap()).unwrap();
        assert_eq!(dump(&restored, &after, false), dump(&state, &after, false));
        let asked = [
            ("s1", "cs1", Reason::Allowed),
            ("s3", "cs3", Reason::Allowed),
            ("s4", "cs4", Reason::ToolBudget),
        ];
        expect(&mut restored, &after, &asked);
    }
}

/// A call id the budget admitted stays admitted: the first call of a new
/// session, committed by Dispatch, is replayed, even under a session age
/// limit of zero that its own commit's session then meets.
#[test]
fn a_commit_admitted_by_the_budget_is_replayed() {
    let policy = budget_policy("agent", "execute", "max_session_seconds = 0");
    let mut state = State::restore(&policy, MemoryStore::new().load().unwrap()).unwrap();
    let session = SessionRef::new("learner".into(), "s1".into(), "ws".into()).unwrap();
    let call = Call {
        session: session.clone(),
        proposal: Proposal::new("c1".into(), "learner".into(), "other".into(), 0, "{}").unwrap(),
    };
    let first = dispatch_on(&mut state, &policy, Timestamp(1_000), &call).unwrap();
    assert_eq!(
        (first.0.status, first.0.replayed),
        (DispatchStatus::Ok, false)
    );
    let again = dispatch_on(&mut state, &policy, Timestamp(1_000), &call).unwrap();
    assert_eq!(
        (again.0.status, again.0.replayed),
        (DispatchStatus::Ok, true)
    );
    assert_eq!(again.0.receipt_id, first.0.receipt_id);
}

/// A call that ends in an error evicts nothing to remember its call id:
/// with the state full and a receipt past retention, a new call id whose
/// arguments fail the schema leaves that receipt, which a replay finds.
#[test]
fn a_call_refused_with_an_error_evicts_nothing() {
    let roomy = tight_policy(1 << 20);
    let mut state = State::restore(&roomy, MemoryStore::new().load().unwrap()).unwrap();
    let session = SessionRef::new("learner".into(), "s1".into(), "ws".into()).unwrap();
    let call = |call_id: &str, version: u64, value: &str| {
        let arguments = format!(r#"{{"name":"a","value":{value}}}"#);
        reset_call(&session, call_id, version, &arguments)
    };
    let dispatch = |state: &mut State, policy: &Policy, now: u64, call: &Call| {
        let screened = proposal::screen(policy, &call.session, &call.proposal);
        state
            .dispatch(
                policy,
                Timestamp(now),
                &call.session,
                &call.proposal,
                screened,
            )
            .map(|(answer, _)| (answer.status, answer.replayed))
    };
    let c0 = call("c0", 0, r#""y""#);
    assert_eq!(
        dispatch(&mut state, &roomy, 1_000, &c0).unwrap(),
        (DispatchStatus::Ok, false)
    );
    // Full: a new call id fits only by evicting c0's receipt (past
    // retention at 22 s).
    let full = tight_policy(state.state_bytes());
    let refused = dispatch(&mut state, &full, 22_000, &call("c1", 1, "5")).unwrap_err();
    assert!(
        matches!(refused, Error::InvalidArgument { .. }),
        "{refused:?}"
    );
    assert_eq!(
        dispatch(&mut state, &full, 22_000, &c0).unwrap(),
        (DispatchStatus::Ok, true)
    );
    // An answer makes the room: the next new call id evicts it.
    assert_eq!(
        dispatch(&mut state, &full, 22_000, &call("c2", 0, r#""z""#)).unwrap(),
        (DispatchStatus::StaleVersion, false)
    );
    assert_eq!(
        dispatch(&mut state, &full, 22_000, &c0).unwrap(),
        (DispatchStatus::StaleVersion, false)
    );
}
