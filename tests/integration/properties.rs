//! Property tests (proptest) of the approval ledger and Dispatch (SPEC §4–§6),
//! driven through `Engine` with a `ManualClock` (no gRPC: thousands of
//! operations a second), on `tests/fixtures/policies/properties.toml`.
//! Random interleavings of Decide (request), grant, deny, revoke, clock
//! advances (expire) and Dispatch (consume) run against the model of SPEC
//! §4–§6 (`support::model`, which `dispatch_model` shares); after every
//! operation:
//! - every answer is the model's (outcome, reason, approval id, status,
//!   version, value, replayed, receipt id) and so is every approval's status
//!   and every resource's value and version;
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

use crate::support::block_on;
use crate::support::model::{
    self, DispatchChange, Effect, Id, Model, Review, Rules, Standing, Tool, Value,
};
use crate::support::policies::{self, policy_text};
use crate::support::{
    ApprovalEvent, ApprovalStatus, DispatchStatus, EPOCH, Engine, Error, EventKind, ManualClock,
    Outcome, Proposal, SessionRef, Timestamp, Verdict, canonical, pb,
};
use toolgate::engine::Watched;

const PENDING_TTL_MS: u64 = 300_000;
const GRANT_TTL_MS: u64 = 600_000;
/// The default `approval_retention_seconds`: finished (not denied)
/// approvals are evicted this long after they finished.
const RETENTION_MS: u64 = 3_600_000;
/// `cost` of set_item and free_set in properties.toml.
const APPROVED_TOOL_COST: u64 = 3;
const FREE_TOOL_COST: u64 = 2;
/// The defaults properties.toml does not override.
const MAX_PENDING_PER_ACTOR: usize = 64;
const DECISION_COST: u64 = 1;
const RECEIPT_CAPACITY: usize = 100_000;
const RECEIPT_RETENTION_MS: u64 = 86_400_000;

const RESOURCES: [&str; 2] = ["r0", "r1"];
const WORKSPACES: [&str; 2] = ["desk", "lab"];
const ADVANCES_S: [u64; 10] = [1, 1, 10, 100, 299, 300, 301, 599, 600, 601];

/// properties.toml for the model.
fn rules() -> Rules {
    Rules {
        tools: vec![
            Tool {
                name: "set_item",
                approval: true,
                cost: APPROVED_TOOL_COST,
            },
            Tool {
                name: "free_set",
                approval: false,
                cost: FREE_TOOL_COST,
            },
        ],
        per_resource_versions: true,
        resources: RESOURCES
            .iter()
            .map(|name| (*name, Value::Json("0".to_string())))
            .collect(),
        pending_ttl_ms: PENDING_TTL_MS,
        grant_ttl_ms: GRANT_TTL_MS,
        approval_retention_ms: RETENTION_MS,
        max_pending_per_actor: MAX_PENDING_PER_ACTOR,
        max_decisions: None,
        max_tool_calls: None,
        receipt_capacity: RECEIPT_CAPACITY,
        receipt_retention_ms: RECEIPT_RETENTION_MS,
    }
}

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

/// The engine's answers in the contract's terms, as the model states them
/// (the edge's own conversions).
fn outcome(outcome: Outcome) -> pb::Outcome {
    pb::Outcome::from(outcome)
}

fn dispatch_status(status: DispatchStatus) -> pb::DispatchStatus {
    pb::DispatchStatus::from(status)
}

fn standing(status: ApprovalStatus) -> Standing {
    match status {
        ApprovalStatus::Pending => Standing::Pending,
        ApprovalStatus::Granted => Standing::Granted,
        ApprovalStatus::Denied => Standing::Denied,
        ApprovalStatus::Expired => Standing::Expired,
        ApprovalStatus::Consumed => Standing::Consumed,
        ApprovalStatus::Revoked => Standing::Revoked,
    }
}

/// An id the engine answered against the one the model expects.
fn check_id(
    got: Option<Uuid>,
    want: &Id,
    known: impl Fn(&str) -> bool,
    what: &str,
) -> Result<(), TestCaseError> {
    match want {
        Id::Empty => prop_assert_eq!(got, None, "{}", what),
        Id::Is(id) => prop_assert_eq!(got.map(|got| got.to_string()), Some(id.clone()), "{}", what),
        Id::New => {
            let Some(got) = got else {
                return Err(TestCaseError::fail(format!("no {what}")));
            };
            prop_assert!(!known(&got.to_string()), "reused {}", what);
        }
    }
    Ok(())
}

fn uuid(id: &str) -> Uuid {
    Uuid::parse_str(id).expect("a UUID")
}

struct Harness {
    clock: ManualClock,
    engine: Engine,
    events: tokio::sync::broadcast::Receiver<Watched>,
    pool: Vec<(bool, usize, u64, i64)>,
    model: Model,
    /// The (workspace, proposal) each approval was requested for.
    keys: HashMap<Uuid, (usize, usize)>,
    /// Every (workspace, proposal) a reviewer denied.
    denied: HashSet<(usize, usize)>,
    consumed: HashSet<Uuid>,
    consumptions: HashMap<Uuid, usize>,
    coverage: Arc<Coverage>,
}

impl Harness {
    fn new(coverage: Arc<Coverage>) -> Harness {
        let policy = policies::parse(&policy_text("properties"));
        let clock = ManualClock::starting_at(EPOCH);
        let engine = Engine::new(policy, Arc::new(clock.clone())).expect("engine");
        let events = engine.subscribe();
        Harness {
            clock,
            engine,
            events,
            pool: pool(),
            model: Model::new(rules(), EPOCH.0),
            keys: HashMap::new(),
            denied: HashSet::new(),
            consumed: HashSet::new(),
            consumptions: HashMap::new(),
            coverage,
        }
    }

    fn session(&self, workspace: usize) -> SessionRef {
        let workspace = WORKSPACES[workspace];
        SessionRef::new("agent".into(), format!("s-{workspace}"), workspace.into())
            .expect("session")
    }

    fn tool(&self, index: usize) -> &'static str {
        match self.pool[index].0 {
            true => "set_item",
            false => "free_set",
        }
    }

    fn arguments(&self, index: usize) -> String {
        let (_, resource, _, value) = self.pool[index];
        format!(r#"{{"item":"{}","value":{value}}}"#, RESOURCES[resource])
    }

    fn proposal(&self, index: usize) -> Proposal {
        let (_, _, version, _) = self.pool[index];
        Proposal::new(
            format!("c{index}"),
            "agent".into(),
            self.tool(index).into(),
            version,
            &self.arguments(index),
        )
        .expect("proposal")
    }

    /// The proposal as the model sees it (its arguments are canonical).
    fn call(&self, index: usize) -> model::Call {
        let (_, resource, version, value) = self.pool[index];
        model::Call {
            call_id: format!("c{index}"),
            actor: "agent".into(),
            tool: self.tool(index).into(),
            version,
            arguments: self.arguments(index),
            effect: Some(Effect::Set {
                resource: RESOURCES[resource].to_string(),
                value: value.to_string(),
            }),
        }
    }

    /// The approvals the ledger holds, in request order.
    fn kept_requests(&self) -> Vec<String> {
        self.model
            .requests()
            .iter()
            .filter(|id| self.model.kept(id) == Some(true))
            .cloned()
            .collect()
    }

    /// Everything a Dispatch refusal must leave alone.
    fn snapshot(&self) -> (Vec<(canonical::Value, u64)>, usize, Vec<ApprovalStatus>) {
        let resources = RESOURCES
            .iter()
            .map(|name| self.engine.resource(name).expect("resource"))
            .collect();
        let receipts = self.engine.stats().expect("stats").receipts;
        let statuses = self
            .kept_requests()
            .iter()
            .map(|id| self.engine.get_approval(uuid(id)).expect("approval").status)
            .collect();
        (resources, receipts, statuses)
    }

    fn drain_events(&mut self) -> Vec<ApprovalEvent> {
        let mut events = Vec::new();
        loop {
            match self.events.try_recv() {
                Ok(Watched::Transition(event)) => events.push(event),
                Err(TryRecvError::Empty) => return events,
                Ok(missed @ Watched::Missed(_)) => panic!("one engine, no replicas: {missed:?}"),
                Err(other) => panic!("event stream: {other:?}"),
            }
        }
    }

    fn step(&mut self, op: &Op) -> Result<(), TestCaseError> {
        match *op {
            Op::Advance { seconds } => {
                self.clock.advance(Duration::from_secs(seconds));
                self.model.now += seconds * 1000;
                block_on(self.engine.sweep()).expect("sweep");
                // Nothing else moves the clock: the sweep is when every
                // expiry that came due was processed.
                let expired = self.model.swept();
                self.coverage.expired.fetch_add(expired, Ordering::Relaxed);
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
        let key = (workspace, index);
        let call = self.call(index);
        let session_id = self.session(workspace).session_id;
        let (expected, change) =
            self.model
                .predict_decide(&session_id, "agent", WORKSPACES[workspace], &call);
        let (decision, _) = block_on(
            self.engine
                .decide(&self.session(workspace), &self.proposal(index)),
        )
        .expect("decide answers");
        let expect =
            expected.map_err(|code| TestCaseError::fail(format!("the model expected {code:?}")))?;
        if self.denied.contains(&key) {
            prop_assert_ne!(
                decision.outcome,
                Outcome::Allow,
                "a denied fingerprint reached ALLOW"
            );
        }
        prop_assert_eq!(
            (outcome(decision.outcome), decision.reason.as_str()),
            (expect.outcome, expect.reason)
        );
        let got = decision.approval.map(|(id, _)| id);
        let model = &self.model;
        check_id(
            got,
            &expect.approval_id,
            |id| model.knows_approval(id),
            "approval id",
        )?;
        match (expect.reason, got) {
            ("approved", Some(id)) => prop_assert!(
                self.model.approval(&id.to_string()).expires_at > self.model.now,
                "an expired grant was honoured"
            ),
            ("approval-denied", _) => {
                self.coverage.denied_answers.fetch_add(1, Ordering::Relaxed);
            }
            _ => {}
        }
        if change.request
            && let Some(id) = got
        {
            self.keys.insert(id, key);
        }
        let approval_id = got.map(|id| id.to_string()).unwrap_or_default();
        self.model.apply_decide(
            change,
            &session_id,
            WORKSPACES[workspace],
            &call,
            Some(&approval_id),
        );
        Ok(())
    }

    fn dispatch(&mut self, index: usize, workspace: usize) -> Result<(), TestCaseError> {
        let key = (workspace, index);
        let call = self.call(index);
        let session_id = self.session(workspace).session_id;
        let before = self.snapshot();
        let (expected, change, charge) =
            self.model
                .predict_dispatch(&session_id, "agent", WORKSPACES[workspace], &call);
        let (answer, _) = block_on(
            self.engine
                .dispatch(&self.session(workspace), &self.proposal(index)),
        )
        .expect("dispatch answers");
        if answer.status == DispatchStatus::Ok && !answer.replayed {
            prop_assert!(
                !self.denied.contains(&key),
                "a denied fingerprint was committed"
            );
        }
        let expect =
            expected.map_err(|code| TestCaseError::fail(format!("the model expected {code:?}")))?;
        let result = answer.result.as_ref();
        prop_assert_eq!(
            (
                dispatch_status(answer.status),
                answer.reason.as_str(),
                answer.replayed,
                result.map_or(0, |result| result.version),
                result
                    .and_then(|result| result.resource.clone())
                    .unwrap_or_default(),
                result
                    .and_then(|result| result.value.as_ref())
                    .map(canonical::to_canonical)
                    .unwrap_or_default(),
            ),
            (
                expect.status,
                expect.reason,
                expect.replayed,
                expect.version,
                expect.resource.clone(),
                expect.value_json.clone(),
            ),
            "{:?}",
            answer
        );
        // A `set` appends nothing.
        prop_assert_eq!(result.and_then(|result| result.appended_index), None);
        let model = &self.model;
        check_id(
            answer.approval_id,
            &expect.approval_id,
            |id| model.knows_approval(id),
            "approval id",
        )?;
        check_id(
            answer.receipt_id,
            &expect.receipt_id,
            |id| model.knows_receipt(id),
            "receipt id",
        )?;
        let approval_id = answer
            .approval_id
            .map(|id| id.to_string())
            .unwrap_or_default();
        let receipt_id = answer
            .receipt_id
            .map(|id| id.to_string())
            .unwrap_or_default();
        match &change {
            // 4. A receipt: the stored result again, nothing changes.
            DispatchChange::Nothing if expect.replayed => {
                self.coverage.replays.fetch_add(1, Ordering::Relaxed);
                prop_assert_eq!(&self.snapshot(), &before, "a replay changed state");
            }
            // 5. The version.
            DispatchChange::Nothing if expect.status == pb::DispatchStatus::StaleVersion => {
                self.coverage.stale.fetch_add(1, Ordering::Relaxed);
                prop_assert_eq!(&self.snapshot(), &before, "STALE_VERSION changed state");
            }
            // 6. The approval.
            DispatchChange::Nothing if expect.reason == "approval-denied" => {
                self.coverage.denied_answers.fetch_add(1, Ordering::Relaxed);
                prop_assert_eq!(&self.snapshot(), &before, "a denied dispatch changed state");
            }
            DispatchChange::Nothing => {
                prop_assert_eq!(&self.snapshot(), &before, "APPROVAL_REQUIRED changed state");
            }
            DispatchChange::Request { .. } => {
                if let Some(id) = answer.approval_id {
                    self.keys.insert(id, key);
                }
            }
            // 9. Commit.
            DispatchChange::Commit { grant, .. } => {
                if let Some(grant) = grant {
                    prop_assert!(
                        self.model.approval(grant).expires_at > self.model.now,
                        "expired grant consumed"
                    );
                    self.coverage
                        .commits_with_grant
                        .fetch_add(1, Ordering::Relaxed);
                    prop_assert!(self.consumed.insert(uuid(grant)), "consumed twice");
                }
            }
        }
        let request = matches!(change, DispatchChange::Request { .. });
        self.model.settle(&session_id, &call, charge);
        self.model
            .apply_dispatch(change, &session_id, &approval_id, &receipt_id);
        if request {
            // Only a new pending request appeared.
            let after = self.snapshot();
            prop_assert_eq!(&after.0, &before.0);
            prop_assert_eq!(after.1, before.1);
            prop_assert_eq!(&after.2[..before.2.len()], &before.2[..]);
        }
        Ok(())
    }

    fn review(&mut self, pick: usize, verdict: Verdict) -> Result<(), TestCaseError> {
        let order = self.kept_requests();
        if order.is_empty() {
            return Ok(());
        }
        // Newest first: `pick` counts back from the latest request.
        let id = order[order.len() - 1 - pick % order.len()].clone();
        let review = match verdict {
            Verdict::Grant => Review::Grant,
            Verdict::Deny => Review::Deny,
            Verdict::Revoke => Review::Revoke,
        };
        let expected = self.model.predict_review(&id, review);
        let answer = block_on(
            self.engine
                .review(uuid(&id), verdict, "lead", String::new()),
        );
        let next = match expected {
            Ok(next) => next,
            Err(_) => {
                prop_assert!(
                    matches!(answer, Err(Error::FailedPrecondition(_))),
                    "{:?} of a {:?} approval: {:?}",
                    verdict,
                    self.model.approval(&id).at(self.model.now),
                    answer
                );
                return Ok(());
            }
        };
        let answer = answer.map_err(|error| TestCaseError::fail(format!("{error:?}")))?;
        prop_assert_eq!(standing(answer.status), next);
        self.model.apply_review(&id, next);
        if next == Standing::Denied {
            self.denied.insert(self.keys[&uuid(&id)]);
        }
        if next == Standing::Revoked {
            self.coverage.revoked.fetch_add(1, Ordering::Relaxed);
        }
        Ok(())
    }

    /// The engine's approvals and resources are the model's; versions grow.
    fn check_state(&self) -> Result<(), TestCaseError> {
        for id in self.kept_requests() {
            let approval = self.engine.get_approval(uuid(&id)).expect("approval kept");
            let expected = self.model.approval(&id);
            let status = expected.at(self.model.now);
            prop_assert_eq!(standing(approval.status), status, "approval {}", id);
            if matches!(status, Standing::Pending | Standing::Granted) {
                prop_assert_eq!(approval.expires_at, Timestamp(expected.expires_at));
            }
            prop_assert_eq!(
                self.consumptions.get(&uuid(&id)).copied().unwrap_or(0),
                usize::from(status == Standing::Consumed),
                "consumption events of {}",
                id
            );
        }
        for name in RESOURCES {
            let (value, version) = self.engine.resource(name).expect("resource");
            prop_assert_eq!(
                canonical::to_canonical(&value),
                self.model.resource_json(name)
            );
            prop_assert_eq!(version, self.model.version(name));
        }
        prop_assert_eq!(
            self.engine.stats().expect("stats").receipts,
            self.model.receipt_count()
        );
        for workspace in 0..WORKSPACES.len() {
            let session_id = self.session(workspace).session_id;
            let expected = self.model.session(&session_id);
            match block_on(self.engine.session("", &session_id)) {
                Ok(summary) => {
                    let Some(expected) = expected else {
                        return Err(TestCaseError::fail(format!("session {session_id} exists")));
                    };
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
                            expected.decisions * DECISION_COST + expected.executed_cost,
                        ),
                        "session {}",
                        session_id
                    );
                }
                Err(Error::NotFound(_)) => {
                    prop_assert!(expected.is_none(), "session {} is missing", session_id)
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
#[derive(Debug, Default)]
struct Coverage {
    commits_with_grant: AtomicUsize,
    replays: AtomicUsize,
    stale: AtomicUsize,
    denied_answers: AtomicUsize,
    expired: AtomicUsize,
    revoked: AtomicUsize,
}

#[test]
fn ledger_and_dispatch_follow_the_model() {
    let config = ProptestConfig {
        cases: cases(),
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    let coverage = Arc::new(Coverage::default());
    let mut runner = TestRunner::new(config);
    let result = runner.run(&prop::collection::vec(op(), 1..100), |ops| {
        let mut harness = Harness::new(coverage.clone());
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
