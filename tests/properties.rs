//! Property tests (proptest) of the approval ledger and Dispatch (SPEC §4–§6),
//! driven through `Engine` with a `ManualClock` (no gRPC: thousands of
//! operations a second). Random interleavings of Decide (request), grant,
//! deny, revoke, clock advances (expire) and Dispatch (consume) run against
//! a small model of the rules written here; after every operation:
//! - every answer is the model's (outcome, reason, approval id, status,
//!   version, value, replayed) and so is every approval's status and every
//!   resource's value and version;
//! - a grant is consumed at most once, and only by a commit that names it;
//! - a denied fingerprint never reaches ALLOW nor commits in its workspace;
//! - nothing expired is ever honoured (ALLOW `approved` or a consumption
//!   only before the grant's deadline);
//! - a Dispatch refusal changes nothing (except the pending request
//!   APPROVAL_REQUIRED opens), a replay returns the stored result again, and
//!   versions only grow;
//! - each session is charged as SPEC §4 "Charging" says: every Decide or
//!   Dispatch of a call id new to the session costs one decision and (both
//!   tools being `execute`) one tool attempt, whatever its answer; asking
//!   again costs nothing; work units are decisions × decision cost + Σ cost
//!   of the committed tools.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::TestRunner;
use tokio::sync::broadcast::error::TryRecvError;
use uuid::Uuid;

use toolgate::canonical::Value;
use toolgate::clock::{ManualClock, Timestamp};
use toolgate::domain::decision::DispatchStatus;
use toolgate::domain::decision::Outcome;
use toolgate::engine::Engine;
use toolgate::error::Error;
use toolgate::ledger::{ApprovalEvent, ApprovalStatus, EventKind, Verdict};
use toolgate::policy::Policy;
use toolgate::proposal::{Proposal, SessionRef};
use toolgate::resources::CommitResult;

const EPOCH: u64 = 1_795_910_400_000;
const PENDING_TTL_MS: u64 = 300_000;
const GRANT_TTL_MS: u64 = 600_000;
/// The default `approval_retention_seconds`: finished (not denied)
/// approvals are evicted this long after they finished.
const RETENTION_MS: u64 = 3_600_000;

/// Two tools setting one of two resources (per-resource versions): one
/// always needs approval, one never does.
const POLICY: &str = r#"
[limits]
pending_ttl_seconds = 300
grant_ttl_seconds = 600

[profiles.agent]
roles = ["agent"]

[actors.agent]
profile = "agent"

[tools.set_item]
mode = "execute"
roles = ["agent"]
approvers = ["lead"]
approval = "always"
cost = 3
effect = { kind = "set", resource_argument = "item", value_argument = "value" }
input_schema = { type = "object", required = ["item", "value"], additionalProperties = false, properties = { item = { type = "string" }, value = { type = "integer" } } }

[tools.free_set]
mode = "execute"
roles = ["agent"]
cost = 2
effect = { kind = "set", resource_argument = "item", value_argument = "value" }
input_schema = { type = "object", required = ["item", "value"], additionalProperties = false, properties = { item = { type = "string" }, value = { type = "integer" } } }

[reviewers.lead]
roles = ["lead"]
workspaces = ["*"]

[server]
open_host_api = true

[state]
version_scope = "resource"

[state.resources]
r0 = 0
r1 = 0
"#;

const RESOURCES: [&str; 2] = ["r0", "r1"];
const WORKSPACES: [&str; 2] = ["desk", "lab"];
const ADVANCES_S: [u64; 10] = [1, 1, 10, 100, 299, 300, 301, 599, 600, 601];

/// The proposal pool: (needs approval, resource, version, value); the call
/// id is the index, so one call id is always one fingerprint.
fn pool() -> Vec<(bool, usize, u64, i64)> {
    let mut pool = Vec::new();
    for needs_approval in [true, false] {
        for resource in 0..RESOURCES.len() {
            for version in 0..2 {
                pool.push((needs_approval, resource, version, version as i64 + 1));
            }
        }
    }
    pool
}

#[derive(Debug, Clone)]
enum Op {
    Decide { proposal: usize, workspace: usize },
    Dispatch { proposal: usize, workspace: usize },
    Review { approval: usize, verdict: Verdict },
    Advance { seconds: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    let size = pool().len();
    prop_oneof![
        4 => (0..size, 0..2usize).prop_map(|(proposal, workspace)| Op::Decide { proposal, workspace }),
        6 => (0..size, 0..2usize).prop_map(|(proposal, workspace)| Op::Dispatch { proposal, workspace }),
        3 => (0..8usize).prop_map(|approval| Op::Review { approval, verdict: Verdict::Grant }),
        1 => (0..8usize).prop_map(|approval| Op::Review { approval, verdict: Verdict::Deny }),
        1 => (0..8usize).prop_map(|approval| Op::Review { approval, verdict: Verdict::Revoke }),
        1 => prop::sample::select(ADVANCES_S.to_vec()).prop_map(|seconds| Op::Advance { seconds }),
    ]
}

/// `cost` of set_item and free_set in POLICY.
const APPROVED_TOOL_COST: u64 = 3;
const FREE_TOOL_COST: u64 = 2;

/// What one session has been charged (SPEC §4 "Charging").
#[derive(Debug, Default)]
struct ModelSession {
    /// The session exists: something was answered in it.
    opened: bool,
    /// Call ids charged (a call id is always the same proposal here).
    decided: HashSet<usize>,
    decisions: u64,
    tool_attempts: u64,
    executed_tools: u64,
    executed_cost: u64,
}

impl ModelSession {
    /// An answered Decide or Dispatch of proposal `index`.
    fn charge(&mut self, index: usize) {
        self.opened = true;
        if self.decided.insert(index) {
            self.decisions += 1;
            self.tool_attempts += 1;
        }
    }
}

#[derive(Debug, Clone)]
struct ModelApproval {
    key: (usize, usize),
    status: ApprovalStatus,
    expires_at: u64,
    finished_at: Option<u64>,
}

/// The ledger and Dispatch rules of SPEC §4–§6, for this policy.
#[derive(Default)]
struct Model {
    now: u64,
    approvals: HashMap<Uuid, ModelApproval>,
    /// Request order, for picking approvals to review.
    order: Vec<Uuid>,
    /// Latest approval per (workspace, proposal).
    current: HashMap<(usize, usize), Uuid>,
    /// Receipts by proposal (= call id).
    receipts: HashMap<usize, (CommitResult, Uuid)>,
    values: [i64; 2],
    versions: [u64; 2],
    denied: HashSet<(usize, usize)>,
    consumed: HashSet<Uuid>,
    /// The sessions by workspace.
    sessions: [ModelSession; 2],
}

enum Standing {
    Granted(Uuid),
    Denied(Uuid),
    Pending(Uuid),
    None,
}

impl Model {
    /// Expires what is due, then evicts finished approvals past retention
    /// (denied ones stay: denials stick).
    fn expire(&mut self) {
        for approval in self.approvals.values_mut() {
            let live = matches!(
                approval.status,
                ApprovalStatus::Pending | ApprovalStatus::Granted
            );
            if live && approval.expires_at <= self.now {
                approval.status = ApprovalStatus::Expired;
                approval.finished_at = Some(self.now);
                count(&COVERAGE.expired);
            }
        }
        let now = self.now;
        let evicted: Vec<Uuid> = self
            .approvals
            .iter()
            .filter(|(_, approval)| {
                approval.status != ApprovalStatus::Denied
                    && approval
                        .finished_at
                        .is_some_and(|finished_at| finished_at + RETENTION_MS <= now)
            })
            .map(|(id, _)| *id)
            .collect();
        for id in evicted {
            if let Some(approval) = self.approvals.remove(&id)
                && self.current.get(&approval.key) == Some(&id)
            {
                self.current.remove(&approval.key);
            }
            self.order.retain(|kept| *kept != id);
        }
    }

    fn finish(&mut self, id: Uuid, status: ApprovalStatus) {
        if let Some(approval) = self.approvals.get_mut(&id) {
            approval.status = status;
            approval.finished_at = Some(self.now);
        }
    }

    fn standing(&self, key: (usize, usize)) -> Standing {
        let Some(id) = self.current.get(&key) else {
            return Standing::None;
        };
        match self.approvals[id].status {
            ApprovalStatus::Granted => Standing::Granted(*id),
            ApprovalStatus::Denied => Standing::Denied(*id),
            ApprovalStatus::Pending => Standing::Pending(*id),
            _ => Standing::None,
        }
    }

    fn record_request(&mut self, key: (usize, usize), id: Uuid) {
        self.approvals.insert(
            id,
            ModelApproval {
                key,
                status: ApprovalStatus::Pending,
                expires_at: self.now + PENDING_TTL_MS,
                finished_at: None,
            },
        );
        self.order.push(id);
        self.current.insert(key, id);
    }
}

struct Harness {
    clock: ManualClock,
    engine: Engine,
    events: tokio::sync::broadcast::Receiver<ApprovalEvent>,
    pool: Vec<(bool, usize, u64, i64)>,
    model: Model,
    consumptions: HashMap<Uuid, usize>,
}

impl Harness {
    fn new() -> Harness {
        let policy = Policy::parse(POLICY, "properties.toml", None).expect("policy");
        let clock = ManualClock::starting_at(Timestamp(EPOCH));
        let engine = Engine::new(policy, Arc::new(clock.clone()));
        let events = engine.subscribe();
        Harness {
            clock,
            engine,
            events,
            pool: pool(),
            model: Model::default(),
            consumptions: HashMap::new(),
        }
    }

    fn session(&self, workspace: usize) -> SessionRef {
        let workspace = WORKSPACES[workspace];
        SessionRef::new("agent".into(), format!("s-{workspace}"), workspace.into())
            .expect("session")
    }

    fn proposal(&self, index: usize) -> Proposal {
        let (needs_approval, resource, version, value) = self.pool[index];
        let tool = if needs_approval {
            "set_item"
        } else {
            "free_set"
        };
        Proposal::new(
            format!("c{index}"),
            "agent".into(),
            tool.into(),
            version,
            &format!(r#"{{"item":"{}","value":{value}}}"#, RESOURCES[resource]),
        )
        .expect("proposal")
    }

    /// Everything a Dispatch refusal must leave alone.
    fn snapshot(&self) -> (Vec<(Value, u64)>, usize, Vec<ApprovalStatus>) {
        let resources = RESOURCES
            .iter()
            .map(|name| self.engine.resource(name).expect("resource"))
            .collect();
        let receipts = self.engine.stats().expect("stats").receipts;
        let statuses = self
            .model
            .order
            .iter()
            .map(|id| self.engine.get_approval(*id).expect("approval").status)
            .collect();
        (resources, receipts, statuses)
    }

    fn drain_events(&mut self) -> Vec<ApprovalEvent> {
        let mut events = Vec::new();
        loop {
            match self.events.try_recv() {
                Ok(event) => events.push(event),
                Err(TryRecvError::Empty) => return events,
                Err(other) => panic!("event stream: {other:?}"),
            }
        }
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::Advance { seconds } => {
                self.clock.advance(Duration::from_secs(seconds));
                self.model.now += seconds * 1000;
                self.engine.sweep().expect("sweep");
                self.model.expire();
            }
            Op::Decide {
                proposal,
                workspace,
            } => self.decide(proposal, workspace)?,
            Op::Dispatch {
                proposal,
                workspace,
            } => self.dispatch(proposal, workspace)?,
            Op::Review { approval, verdict } => self.review(approval, verdict)?,
        }
        let events = self.drain_events();
        for event in &events {
            if event.kind == EventKind::Consumed {
                let count = self.consumptions.entry(event.approval.id).or_default();
                *count += 1;
                prop_assert_eq!(*count, 1, "grant consumed twice: {:?}", event.approval.id);
            }
        }
        self.check_state()
    }

    fn decide(&mut self, index: usize, workspace: usize) -> Result<(), TestCaseError> {
        let (needs_approval, ..) = self.pool[index];
        let key = (workspace, index);
        let (decision, _) = self
            .engine
            .decide(&self.session(workspace), &self.proposal(index))
            .expect("decide answers");
        self.model.sessions[workspace].charge(index);
        if self.model.denied.contains(&key) {
            prop_assert_ne!(
                decision.outcome,
                Outcome::Allow,
                "a denied fingerprint reached ALLOW"
            );
        }
        if !needs_approval {
            prop_assert_eq!(
                (decision.outcome, decision.reason),
                (Outcome::Allow, "allowed")
            );
            return Ok(());
        }
        let got = decision.approval.map(|(id, _)| id);
        match self.model.standing(key) {
            Standing::Granted(id) => {
                prop_assert_eq!(
                    (decision.outcome, decision.reason),
                    (Outcome::Allow, "approved")
                );
                prop_assert_eq!(got, Some(id));
                prop_assert!(
                    self.model.approvals[&id].expires_at > self.model.now,
                    "an expired grant was honoured"
                );
            }
            Standing::Denied(id) => {
                count(&COVERAGE.denied_answers);
                prop_assert_eq!(
                    (decision.outcome, decision.reason),
                    (Outcome::Deny, "approval-denied")
                );
                prop_assert_eq!(got, Some(id));
            }
            Standing::Pending(id) => {
                prop_assert_eq!(decision.outcome, Outcome::RequireApproval);
                prop_assert_eq!(got, Some(id));
            }
            Standing::None => {
                prop_assert_eq!(
                    (decision.outcome, decision.reason),
                    (Outcome::RequireApproval, "approval-required")
                );
                let Some(id) = got else {
                    return Err(TestCaseError::fail("no approval id"));
                };
                prop_assert!(!self.model.approvals.contains_key(&id), "reused id");
                self.model.record_request(key, id);
            }
        }
        Ok(())
    }

    fn dispatch(&mut self, index: usize, workspace: usize) -> Result<(), TestCaseError> {
        let (needs_approval, resource, version, value) = self.pool[index];
        let key = (workspace, index);
        let before = self.snapshot();
        let (answer, _) = self
            .engine
            .dispatch(&self.session(workspace), &self.proposal(index))
            .expect("dispatch answers");
        self.model.sessions[workspace].charge(index);
        if answer.status == DispatchStatus::Ok && !answer.replayed {
            prop_assert!(
                !self.model.denied.contains(&key),
                "a denied fingerprint was committed"
            );
        }
        // 4. A receipt: the stored result again, nothing changes.
        if let Some((result, receipt_id)) = self.model.receipts.get(&index) {
            count(&COVERAGE.replays);
            prop_assert_eq!(answer.status, DispatchStatus::Ok);
            prop_assert!(answer.replayed);
            prop_assert_eq!(answer.result.as_ref(), Some(result));
            prop_assert_eq!(answer.receipt_id, Some(*receipt_id));
            prop_assert_eq!(self.snapshot(), before, "a replay changed state");
            return Ok(());
        }
        // 5. The version.
        if version != self.model.versions[resource] {
            count(&COVERAGE.stale);
            prop_assert_eq!(answer.status, DispatchStatus::StaleVersion);
            prop_assert_eq!(
                answer.result.map(|result| result.version),
                Some(self.model.versions[resource])
            );
            prop_assert_eq!(self.snapshot(), before, "STALE_VERSION changed state");
            return Ok(());
        }
        // 6. The approval.
        let grant = if needs_approval {
            match self.model.standing(key) {
                Standing::Granted(id) => Some(id),
                Standing::Denied(id) => {
                    count(&COVERAGE.denied_answers);
                    prop_assert_eq!(
                        (answer.status, answer.reason),
                        (DispatchStatus::ApprovalRequired, "approval-denied")
                    );
                    prop_assert_eq!(answer.approval_id, Some(id));
                    prop_assert_eq!(self.snapshot(), before, "a denied dispatch changed state");
                    return Ok(());
                }
                Standing::Pending(id) => {
                    prop_assert_eq!(answer.status, DispatchStatus::ApprovalRequired);
                    prop_assert_eq!(answer.approval_id, Some(id));
                    prop_assert_eq!(self.snapshot(), before, "APPROVAL_REQUIRED changed state");
                    return Ok(());
                }
                Standing::None => {
                    prop_assert_eq!(answer.status, DispatchStatus::ApprovalRequired);
                    let Some(id) = answer.approval_id else {
                        return Err(TestCaseError::fail("no approval id"));
                    };
                    self.model.record_request(key, id);
                    // Only a new pending request appeared.
                    let after = self.snapshot();
                    prop_assert_eq!(&after.0, &before.0);
                    prop_assert_eq!(after.1, before.1);
                    prop_assert_eq!(&after.2[..before.2.len()], &before.2[..]);
                    return Ok(());
                }
            }
        } else {
            None
        };
        // 9. Commit.
        prop_assert_eq!(answer.status, DispatchStatus::Ok, "{:?}", answer);
        prop_assert!(!answer.replayed);
        prop_assert_eq!(answer.approval_id, grant);
        if let Some(id) = grant {
            prop_assert!(
                self.model.approvals[&id].expires_at > self.model.now,
                "expired grant consumed"
            );
            self.model.finish(id, ApprovalStatus::Consumed);
            count(&COVERAGE.commits_with_grant);
            prop_assert!(self.model.consumed.insert(id), "consumed twice");
        }
        self.model.values[resource] = value;
        self.model.versions[resource] += 1;
        let session = &mut self.model.sessions[workspace];
        session.executed_tools += 1;
        session.executed_cost += match needs_approval {
            true => APPROVED_TOOL_COST,
            false => FREE_TOOL_COST,
        };
        let expected = CommitResult {
            version: self.model.versions[resource],
            resource: Some(RESOURCES[resource].to_string()),
            value: Some(Value::from(value)),
            appended_index: None,
        };
        prop_assert_eq!(answer.result.as_ref(), Some(&expected));
        let Some(receipt_id) = answer.receipt_id else {
            return Err(TestCaseError::fail("a commit without a receipt"));
        };
        self.model.receipts.insert(index, (expected, receipt_id));
        Ok(())
    }

    fn review(&mut self, pick: usize, verdict: Verdict) -> Result<(), TestCaseError> {
        if self.model.order.is_empty() {
            return Ok(());
        }
        // Newest first: `pick` counts back from the latest request.
        let id = self.model.order[self.model.order.len() - 1 - pick % self.model.order.len()];
        let answer = self.engine.review(id, verdict, "lead", String::new());
        let approval = self.model.approvals.get_mut(&id).expect("known");
        let next = match (verdict, approval.status) {
            (Verdict::Grant, ApprovalStatus::Pending) => ApprovalStatus::Granted,
            (Verdict::Deny, ApprovalStatus::Pending) => ApprovalStatus::Denied,
            (Verdict::Revoke, ApprovalStatus::Granted) => ApprovalStatus::Revoked,
            _ => {
                prop_assert!(
                    matches!(answer, Err(Error::FailedPrecondition(_))),
                    "{:?} of a {:?} approval: {:?}",
                    verdict,
                    approval.status,
                    answer
                );
                return Ok(());
            }
        };
        let answer = answer.map_err(|error| TestCaseError::fail(format!("{error:?}")))?;
        prop_assert_eq!(answer.status, next);
        let key = approval.key;
        if next == ApprovalStatus::Granted {
            approval.status = next;
            approval.expires_at = self.model.now + GRANT_TTL_MS;
        } else {
            self.model.finish(id, next);
        }
        if next == ApprovalStatus::Denied {
            self.model.denied.insert(key);
        }
        if next == ApprovalStatus::Revoked {
            count(&COVERAGE.revoked);
        }
        Ok(())
    }

    /// The engine's approvals and resources are the model's; versions grow.
    fn check_state(&self) -> Result<(), TestCaseError> {
        for (id, expected) in &self.model.approvals {
            let approval = self.engine.get_approval(*id).expect("approval kept");
            prop_assert_eq!(approval.status, expected.status, "approval {}", id);
            if matches!(
                expected.status,
                ApprovalStatus::Pending | ApprovalStatus::Granted
            ) {
                prop_assert_eq!(approval.expires_at, Timestamp(EPOCH + expected.expires_at));
            }
            prop_assert_eq!(
                self.consumptions.get(id).copied().unwrap_or(0),
                usize::from(expected.status == ApprovalStatus::Consumed),
                "consumption events of {}",
                id
            );
        }
        for (index, name) in RESOURCES.iter().enumerate() {
            let (value, version) = self.engine.resource(name).expect("resource");
            prop_assert_eq!(value, Value::from(self.model.values[index]));
            prop_assert_eq!(version, self.model.versions[index]);
        }
        prop_assert_eq!(
            self.engine.stats().expect("stats").receipts,
            self.model.receipts.len()
        );
        for (workspace, expected) in self.model.sessions.iter().enumerate() {
            let session_id = self.session(workspace).session_id;
            match self.engine.session("", &session_id) {
                Ok(summary) => {
                    prop_assert!(expected.opened, "session {} exists", session_id);
                    prop_assert_eq!(
                        (
                            summary.decisions,
                            summary.tool_attempts,
                            summary.executed_tools,
                            summary.work_units,
                        ),
                        (
                            expected.decisions,
                            expected.tool_attempts,
                            expected.executed_tools,
                            expected.decisions + expected.executed_cost,
                        ),
                        "session {}",
                        session_id
                    );
                }
                Err(Error::NotFound(_)) => {
                    prop_assert!(!expected.opened, "session {} is missing", session_id)
                }
                Err(other) => return Err(TestCaseError::fail(format!("{other:?}"))),
            }
        }
        Ok(())
    }
}

fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(1024)
}

/// How often each interesting path was taken over all cases, so that a
/// change to the generators cannot quietly stop exercising one.
#[derive(Debug)]
struct Coverage {
    commits_with_grant: AtomicUsize,
    replays: AtomicUsize,
    stale: AtomicUsize,
    denied_answers: AtomicUsize,
    expired: AtomicUsize,
    revoked: AtomicUsize,
}

static COVERAGE: Coverage = Coverage {
    commits_with_grant: AtomicUsize::new(0),
    replays: AtomicUsize::new(0),
    stale: AtomicUsize::new(0),
    denied_answers: AtomicUsize::new(0),
    expired: AtomicUsize::new(0),
    revoked: AtomicUsize::new(0),
};

fn count(counter: &AtomicUsize) {
    counter.fetch_add(1, Ordering::Relaxed);
}

#[test]
fn ledger_and_dispatch_follow_the_model() {
    let config = ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let mut runner = TestRunner::new(config);
    let result = runner.run(&prop::collection::vec(op(), 1..100), |ops| {
        let mut harness = Harness::new();
        let mut versions = [0u64; 2];
        for op in &ops {
            harness.step(op)?;
            for (index, name) in RESOURCES.iter().enumerate() {
                let (_, version) = harness.engine.resource(name).expect("resource");
                prop_assert!(version >= versions[index], "a version went down");
                versions[index] = version;
            }
        }
        Ok(())
    });
    if let Err(error) = result {
        panic!("{error}");
    }
    let seen = |counter: &AtomicUsize| counter.load(Ordering::Relaxed);
    let coverage = &COVERAGE;
    assert!(
        [
            &coverage.commits_with_grant,
            &coverage.replays,
            &coverage.stale,
            &coverage.denied_answers,
            &coverage.expired,
            &coverage.revoked,
        ]
        .into_iter()
        .all(|counter| seen(counter) > 0),
        "a path was never taken: {coverage:?}"
    );
    println!("{coverage:?}");
}
