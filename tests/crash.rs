//! Crash recovery (issue 15): a real `toolgate serve --data-dir DIR` is
//! killed with SIGKILL at random moments under concurrent load, at least
//! [`KILLS`] times, and started again on the same DIR each time. Only what
//! a client was *told* counts: every answer is released after the changes
//! it made or observed are on disk, so after each restart everything
//! acknowledged must be there, and nothing may be there twice or half.
//!
//! The load (tests/fixtures/policies/crash.toml): four workers, each with
//! its own actor, session, queue `q<N>` and value `k<N>`, Decide (ALLOW and
//! REQUIRE_APPROVAL), Dispatch appends and sets with and without approval,
//! ask a reviewer task to grant, leave some requests pending, read their
//! session counters, and send again a Dispatch the kill left unanswered
//! (or abandon it). What each client was told goes into one [`Record`].
//!
//! After every restart, against that record ([`check`]):
//! - every acknowledged approval is there: a request still pending (or
//!   expired, once its TTL passed), a grant granted, a grant an
//!   acknowledged Dispatch used consumed; asking again for a pending
//!   proposal returns the same request, and a consumed grant does not
//!   allow its proposal again;
//! - every acknowledged Dispatch, sent again (in its session or another of
//!   the same host and actor), answers `replayed` with the same receipt,
//!   version, resource, value and index: it never commits twice;
//! - each queue holds exactly one item per acknowledged append, at the
//!   index it was told, and otherwise only items of Dispatches left
//!   unanswered by a kill; no marker (the call id, carried in the item)
//!   twice; its version is its length (no half commit); every item has its
//!   receipt (sending its Dispatch again answers `replayed`): an effect
//!   without its receipt is a bug. Each value is the one its last commit
//!   set, with that commit's version;
//! - versions never go backwards; session counters (GetSession) are at
//!   least what was last seen, and every acknowledged decided call id is
//!   still bound to its proposal (another proposal under it is
//!   `call-id-conflict`).
//!
//! The last run ends with SIGTERM, and the last check runs on a restart
//! after that clean stop, over everything. Failures are collected by kind
//! (the first few of each shown) and asserted at the end, with the seed
//! (`CRASH_SEED=N` repeats a run's choices of operations and kill delays).
//!
//! `TOOLGATE_CRASH_STORE=memory` runs the same test on `--store memory`:
//! state is lost at every restart and the checks fail, which shows they can.
//!
//! A test crate of its own: it spawns and kills processes for a while, and
//! needs no other test's company.

// The shared support module; the integration binary uses all of it (and is
// where the dead-code lint checks it), this crate a part.
#[expect(
    dead_code,
    unused_imports,
    reason = "this crate uses a part of support"
)]
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};
use tonic::Code;
use tonic::transport::{Channel, Endpoint};

use support::pb::approvals_client::ApprovalsClient;
use support::pb::policy_decision_point_client::PolicyDecisionPointClient;
use support::pb::resources_client::ResourcesClient;
use support::policies::policy_text;
use support::spawn::{Serve, Spawned};
use support::tokens::{ALICE as REVIEWER, HOST};
use support::{authed, decide_request, dispatch_request, pb, proposal, session};

/// SIGKILLs per run (the restart after the last one is followed by a
/// SIGTERM and one more restart).
const KILLS: usize = 24;
/// How long the load runs before a kill, in milliseconds (uniform).
const LOAD_MS: std::ops::RangeInclusive<u64> = 50..=500;
/// Workers; crash.toml has an actor, a queue and a value for each.
const WORKERS: usize = 4;
/// Older items re-checked after each restart, per kind, besides the new ones.
const SAMPLE: usize = 40;
/// How long one call may take before the server counts as hung.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);
/// How many examples of each kind of failure are shown.
const EXAMPLES: usize = 4;

// ----- the record of what clients were told ------------------------------------

/// One call: the session it ran in and the proposal.
#[derive(Debug, Clone)]
struct Call {
    session: pb::Session,
    proposal: pb::Proposal,
}

impl Call {
    fn id(&self) -> &str {
        &self.proposal.call_id
    }
}

/// An acknowledged commit: what Dispatch answered when it committed.
#[derive(Debug, Clone)]
struct Receipt {
    call: Call,
    receipt_id: String,
    version: u64,
    resource: String,
    value_json: String,
    appended_index: Option<u64>,
    approval_id: String,
}

/// An approval request whose creation was acknowledged.
#[derive(Debug, Clone)]
struct Approval {
    call: Call,
    fingerprint: String,
    /// A grant of it was acknowledged.
    granted: bool,
    /// A grant was sent and never answered.
    grant_unanswered: bool,
    /// An acknowledged commit consumed it.
    consumed: bool,
}

/// Session counters as last seen (GetSession), and the commits
/// acknowledged in it.
#[derive(Debug, Clone, Default)]
struct Counters {
    actor: String,
    decisions: u64,
    tool_attempts: u64,
    executed_tools: u64,
    work_units: u64,
    commits: u64,
}

#[derive(Debug, Default)]
struct Record {
    /// Approval id → the request.
    approvals: BTreeMap<String, Approval>,
    approval_order: Vec<String>,
    /// Call id → its receipt.
    receipts: BTreeMap<String, Receipt>,
    receipt_order: Vec<String>,
    /// Dispatches sent and never answered (a kill came first), by call id,
    /// until a check or a retry finds out what became of them.
    unanswered: BTreeMap<String, Call>,
    /// Call ids a session was told a decision for (Decide answered, or a
    /// Dispatch answered past the charge).
    decided: Vec<Call>,
    decided_keys: BTreeSet<(String, String)>,
    /// Session id → counters.
    sessions: BTreeMap<String, Counters>,
    /// Resource → the highest version acknowledged or observed.
    versions: BTreeMap<String, u64>,
    /// Probes the checks made so far (each one's call or session id is new).
    probes: u64,
    /// How far each list was checked after the last restart.
    approvals_checked: usize,
    receipts_checked: usize,
    decided_checked: usize,
    stats: Stats,
}

#[derive(Debug, Default)]
struct Stats {
    allowed: u64,
    requested: u64,
    grants: u64,
    commits: u64,
    replays: u64,
    reads: u64,
    unanswered: u64,
    found_committed: u64,
    checks: u64,
}

impl Stats {
    fn acknowledged(&self) -> u64 {
        self.allowed + self.requested + self.grants + self.commits + self.replays + self.reads
    }
}

impl Record {
    fn saw_version(&mut self, resource: &str, version: u64) {
        let seen = self.versions.entry(resource.to_string()).or_insert(0);
        *seen = (*seen).max(version);
    }

    fn decided(&mut self, call: &Call) {
        let key = (call.session.session_id.clone(), call.id().to_string());
        if self.decided_keys.insert(key) {
            self.decided.push(call.clone());
        }
        self.sessions
            .entry(call.session.session_id.clone())
            .or_insert_with(|| Counters {
                actor: call.session.actor.clone(),
                ..Counters::default()
            });
    }

    /// An acknowledged OK Dispatch of `call`: a fresh commit is recorded, a
    /// replay must match the commit recorded.
    fn dispatched(&mut self, call: &Call, answer: &pb::DispatchResponse, failures: &Failures) {
        let id = call.id().to_string();
        self.unanswered.remove(&id);
        self.saw_version(&answer.resource, answer.version);
        let receipt = Receipt {
            call: call.clone(),
            receipt_id: answer.receipt_id.clone(),
            version: answer.version,
            resource: answer.resource.clone(),
            value_json: answer.value_json.clone(),
            appended_index: answer.appended_index,
            approval_id: answer.approval_id.clone(),
        };
        match self.receipts.get(&id) {
            Some(known) => {
                if !answer.replayed {
                    failures.add(
                        "committed-twice",
                        format!("{id}: a second fresh commit {answer:?} after {known:?}"),
                    );
                } else if !same_result(known, answer) {
                    failures.add(
                        "replay-differs",
                        format!("{id}: replay {answer:?}, commit {known:?}"),
                    );
                }
            }
            None => {
                self.receipts.insert(id.clone(), receipt);
                self.receipt_order.push(id.clone());
            }
        }
        if answer.replayed {
            self.stats.replays += 1;
        } else {
            self.stats.commits += 1;
            if let Some(counters) = self.sessions.get_mut(&call.session.session_id) {
                counters.commits += 1;
            }
        }
        let gated = call.proposal.name.starts_with('g');
        if gated {
            // The commit (and every replay of it) names the grant it consumed.
            match self.approvals.get_mut(&answer.approval_id) {
                Some(approval) if approval.fingerprint == answer.fingerprint => {
                    approval.consumed = true;
                }
                Some(approval) => failures.add(
                    "consumed-other",
                    format!("{id}: {answer:?} names an approval of {approval:?}"),
                ),
                None if answer.approval_id.is_empty() => failures.add(
                    "commit-without-grant",
                    format!("{id}: {answer:?} names no approval"),
                ),
                // An approval whose request's answer was lost.
                None => {}
            }
        }
    }
}

/// Whether a replay answers with the recorded commit's result.
fn same_result(known: &Receipt, answer: &pb::DispatchResponse) -> bool {
    answer.status() == pb::DispatchStatus::Ok
        && known.receipt_id == answer.receipt_id
        && known.version == answer.version
        && known.resource == answer.resource
        && known.value_json == answer.value_json
        && known.appended_index == answer.appended_index
        && known.approval_id == answer.approval_id
}

// ----- failures ---------------------------------------------------------------

/// Failures of one kind: how many, and the first few.
type Examples = (usize, Vec<String>);

/// Failures by kind: a count and the first few examples.
#[derive(Default, Clone)]
struct Failures(Arc<Mutex<BTreeMap<&'static str, Examples>>>);

impl Failures {
    fn add(&self, kind: &'static str, detail: String) {
        let mut failures = self.0.lock().expect("failures");
        let (count, examples) = failures.entry(kind).or_default();
        *count += 1;
        if examples.len() < EXAMPLES {
            examples.push(detail);
        }
    }

    fn total(&self) -> usize {
        self.0
            .lock()
            .expect("failures")
            .values()
            .map(|(n, _)| n)
            .sum()
    }

    fn report(&self) -> String {
        let failures = self.0.lock().expect("failures");
        let mut text = String::new();
        for (kind, (count, examples)) in failures.iter() {
            text.push_str(&format!("\n  {kind}: {count}"));
            for example in examples {
                text.push_str(&format!("\n    {example}"));
            }
        }
        text
    }
}

// ----- clients ----------------------------------------------------------------

/// The three services on one connection, each call with its token.
#[derive(Clone)]
struct Clients {
    pdp: PolicyDecisionPointClient<Channel>,
    approvals: ApprovalsClient<Channel>,
    resources: ResourcesClient<Channel>,
}

type Answer<T> = Result<T, tonic::Status>;

impl Clients {
    async fn connect(addr: std::net::SocketAddr) -> Answer<Clients> {
        let channel = Endpoint::from_shared(format!("http://{addr}"))
            .expect("endpoint")
            .connect_timeout(CALL_TIMEOUT)
            .timeout(CALL_TIMEOUT)
            .connect()
            .await
            .map_err(|error| tonic::Status::unavailable(format!("connect: {error}")))?;
        Ok(Clients {
            pdp: PolicyDecisionPointClient::new(channel.clone()),
            approvals: ApprovalsClient::new(channel.clone()),
            resources: ResourcesClient::new(channel),
        })
    }

    async fn decide(&mut self, call: &Call) -> Answer<pb::DecideResponse> {
        let request = decide_request(call.session.clone(), call.proposal.clone());
        let answer = self.pdp.decide(authed(request, HOST)).await?;
        Ok(answer.into_inner())
    }

    async fn dispatch(&mut self, call: &Call) -> Answer<pb::DispatchResponse> {
        let request = dispatch_request(call.session.clone(), call.proposal.clone());
        let answer = self.pdp.dispatch(authed(request, HOST)).await?;
        Ok(answer.into_inner())
    }

    async fn session(&mut self, session_id: &str) -> Answer<pb::SessionInfo> {
        let request = pb::GetSessionRequest {
            session_id: session_id.to_string(),
        };
        let answer = self.pdp.get_session(authed(request, HOST)).await?;
        Ok(answer.into_inner())
    }

    async fn grant(&mut self, approval_id: &str) -> Answer<pb::Approval> {
        let request = pb::GrantApprovalRequest {
            approval_id: approval_id.to_string(),
            comment: "crash test".to_string(),
        };
        let answer = self
            .approvals
            .grant_approval(authed(request, REVIEWER))
            .await?;
        Ok(answer.into_inner())
    }

    async fn approval(&mut self, approval_id: &str) -> Answer<pb::Approval> {
        let request = pb::GetApprovalRequest {
            approval_id: approval_id.to_string(),
        };
        let answer = self
            .approvals
            .get_approval(authed(request, REVIEWER))
            .await?;
        Ok(answer.into_inner())
    }

    /// Every approval, all pages.
    async fn all_approvals(&mut self) -> Answer<Vec<pb::Approval>> {
        let mut approvals = Vec::new();
        let mut page_token = String::new();
        loop {
            let request = pb::ListApprovalsRequest {
                page_size: 500,
                page_token: page_token.clone(),
                ..Default::default()
            };
            let page = self
                .approvals
                .list_approvals(authed(request, REVIEWER))
                .await?
                .into_inner();
            approvals.extend(page.approvals);
            if page.next_page_token.is_empty() {
                return Ok(approvals);
            }
            page_token = page.next_page_token;
        }
    }

    /// A resource's first (for a value, only) page.
    async fn resource(&mut self, name: &str) -> Answer<pb::Resource> {
        self.page(name, String::new()).await
    }

    async fn page(&mut self, name: &str, page_token: String) -> Answer<pb::Resource> {
        let request = pb::GetResourceRequest {
            name: name.to_string(),
            page_token,
            page_size: 10_000,
        };
        let answer = self.resources.get_resource(authed(request, HOST)).await?;
        Ok(answer.into_inner())
    }

    /// A queue whole: its items, the version of its first page and the
    /// item count it states.
    async fn queue(&mut self, name: &str) -> Answer<(Vec<Value>, u64, u64)> {
        let first = self.resource(name).await?;
        let (version, count) = (first.version, first.item_count.unwrap_or(u64::MAX));
        let mut items = Vec::new();
        let mut page = first;
        loop {
            match serde_json::from_str::<Value>(&page.value_json) {
                Ok(Value::Array(page_items)) => items.extend(page_items),
                _ => {
                    return Err(tonic::Status::internal(format!(
                        "{name}: not a JSON array: {}",
                        page.value_json
                    )));
                }
            }
            if page.next_page_token.is_empty() {
                return Ok((items, version, count));
            }
            page = self.page(name, page.next_page_token.clone()).await?;
        }
    }
}

// ----- a worker -----------------------------------------------------------------

/// What one round's tasks share.
#[derive(Clone)]
struct Round {
    record: Arc<Mutex<Record>>,
    failures: Failures,
    /// Set just before the SIGKILL: from then on, a failed call is one the
    /// kill cut off.
    killed: Arc<AtomicBool>,
}

/// A call that the kill cut off (or that failed for another reason, which
/// was recorded as a failure).
struct Lost;

impl Round {
    /// An error: cut off by the kill, or else a failure.
    fn lost(&self, what: &str, status: &tonic::Status) -> Lost {
        let cut_off = matches!(
            status.code(),
            Code::Unavailable | Code::Unknown | Code::Cancelled | Code::Internal
        );
        if !(cut_off && self.killed.load(Ordering::SeqCst)) {
            self.failures
                .add("unexpected-error", format!("{what}: {status:?}"));
        }
        Lost
    }

    fn record(&self) -> std::sync::MutexGuard<'_, Record> {
        self.record.lock().expect("record")
    }
}

/// A request for the reviewer task: grant this, answer when done.
type GrantRequest = (String, oneshot::Sender<Granted>);

enum Granted {
    Yes,
    /// The approval is not there, or not grantable (recorded as a failure).
    Gone,
    Lost,
}

/// A proposal that needs approval, on its way: decided (the approval id
/// known), granted, then dispatched.
#[derive(Debug, Clone)]
struct Flow {
    call: Call,
    approval: Option<String>,
    granted: bool,
}

struct Worker {
    index: usize,
    rng: StdRng,
    calls: u64,
    session: pb::Session,
    /// A free Dispatch the kill left unanswered, to send again.
    retry: Option<Call>,
    flow: Option<Flow>,
    /// The Dispatch in flight, if any.
    in_flight: Option<Call>,
    queue_version: u64,
    value_version: u64,
}

impl Worker {
    fn new(index: usize, seed: u64) -> Worker {
        Worker {
            index,
            rng: StdRng::seed_from_u64(seed ^ (index as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            calls: 0,
            session: session(&format!("a{index}"), &format!("w{index}s0"), "crash"),
            retry: None,
            flow: None,
            in_flight: None,
            queue_version: 0,
            value_version: 0,
        }
    }

    fn actor(&self) -> String {
        format!("a{}", self.index)
    }

    fn queue(&self) -> String {
        format!("q{}", self.index)
    }

    fn value(&self) -> String {
        format!("k{}", self.index)
    }

    /// A new call of `tool`; the call id is also the marker its effect carries.
    fn call(&mut self, tool: &str) -> Call {
        self.calls += 1;
        let id = format!("w{}c{}", self.index, self.calls);
        let (version, arguments) = match tool {
            "fset" | "gset" => (
                self.value_version,
                serde_json::json!({ "item": self.value(), "value": id }),
            ),
            "look" => (0, serde_json::json!({})),
            _ => (self.queue_version, serde_json::json!({ "mark": id })),
        };
        Call {
            session: self.session.clone(),
            proposal: proposal(&id, &self.actor(), tool, version, &arguments.to_string()),
        }
    }

    /// After a kill: the Dispatch it cut off is sent again, or abandoned
    /// (left to the checks); a flow goes on, or is abandoned.
    fn after_kill(&mut self) {
        if let Some(call) = self.in_flight.take()
            && self.flow.is_none()
            && self.rng.random_bool(0.5)
        {
            self.retry = Some(call);
        }
        if self.flow.is_some() && self.rng.random_bool(0.25) {
            self.flow = None;
        }
    }

    /// One round of load, until the kill cuts a call off.
    async fn run(
        mut self,
        round: Round,
        round_index: usize,
        addr: std::net::SocketAddr,
        reviewer: mpsc::Sender<GrantRequest>,
    ) -> Worker {
        let _ = self.work(&round, round_index, addr, &reviewer).await;
        self
    }

    async fn work(
        &mut self,
        round: &Round,
        round_index: usize,
        addr: std::net::SocketAddr,
        reviewer: &mpsc::Sender<GrantRequest>,
    ) -> Result<(), Lost> {
        let mut clients = Clients::connect(addr)
            .await
            .map_err(|status| round.lost("connect", &status))?;
        // The versions as the restarted server has them.
        let (queue, value) = (self.queue(), self.value());
        let queue_now = clients
            .resource(&queue)
            .await
            .map_err(|status| round.lost("GetResource", &status))?;
        let value_now = clients
            .resource(&value)
            .await
            .map_err(|status| round.lost("GetResource", &status))?;
        self.queue_version = queue_now.version;
        self.value_version = value_now.version;
        if self.retry.is_none() && self.flow.is_none() && self.rng.random_bool(0.3) {
            let id = format!("w{}s{round_index}", self.index);
            self.session = session(&self.actor(), &id, "crash");
        }
        if let Some(call) = self.retry.take() {
            self.dispatch(round, &mut clients, &call).await?;
        }
        loop {
            if round.killed.load(Ordering::SeqCst) {
                return Ok(());
            }
            if self.flow.is_some() {
                self.step_flow(round, &mut clients, reviewer).await?;
                continue;
            }
            let roll = self.rng.random_range(0..100);
            match roll {
                0..30 => {
                    let name = format!("post{}", self.index);
                    self.free(round, &mut clients, &name).await?;
                }
                30..45 => self.free(round, &mut clients, "fset").await?,
                45..60 => {
                    let call = self.call(&format!("gpost{}", self.index));
                    self.flow = Some(Flow {
                        call,
                        approval: None,
                        granted: false,
                    });
                }
                60..70 => {
                    let call = self.call("gset");
                    self.flow = Some(Flow {
                        call,
                        approval: None,
                        granted: false,
                    });
                }
                70..80 => {
                    // Asked for, never granted: it must stay pending.
                    let tool = match self.rng.random_bool(0.5) {
                        true => "gset".to_string(),
                        false => format!("gpost{}", self.index),
                    };
                    let call = self.call(&tool);
                    self.request(round, &mut clients, &call).await?;
                }
                80..90 => {
                    let call = self.call("look");
                    self.allow(round, &mut clients, &call).await?;
                }
                _ => self.read_session(round, &mut clients).await?,
            }
        }
    }

    /// An approval-free effect: Decide first (ALLOW) half the time, then
    /// Dispatch.
    async fn free(&mut self, round: &Round, clients: &mut Clients, tool: &str) -> Result<(), Lost> {
        let call = self.call(tool);
        if self.rng.random_bool(0.5) {
            self.allow(round, clients, &call).await?;
        }
        self.dispatch(round, clients, &call).await
    }

    /// Decide, which must ALLOW.
    async fn allow(
        &mut self,
        round: &Round,
        clients: &mut Clients,
        call: &Call,
    ) -> Result<(), Lost> {
        let answer = clients
            .decide(call)
            .await
            .map_err(|status| round.lost("Decide", &status))?;
        let mut record = round.record();
        record.decided(call);
        record.stats.allowed += 1;
        if answer.outcome() != pb::Outcome::Allow {
            round
                .failures
                .add("not-allowed", format!("{}: {answer:?}", call.id()));
        }
        Ok(())
    }

    /// Decide, which must REQUIRE_APPROVAL; the request is recorded. Its
    /// approval id.
    async fn request(
        &mut self,
        round: &Round,
        clients: &mut Clients,
        call: &Call,
    ) -> Result<Option<String>, Lost> {
        let answer = clients
            .decide(call)
            .await
            .map_err(|status| round.lost("Decide", &status))?;
        let mut record = round.record();
        record.decided(call);
        if answer.outcome() != pb::Outcome::RequireApproval || answer.approval_id.is_empty() {
            round
                .failures
                .add("not-require-approval", format!("{}: {answer:?}", call.id()));
            return Ok(None);
        }
        record.stats.requested += 1;
        let id = answer.approval_id.clone();
        if !record.approvals.contains_key(&id) {
            record.approvals.insert(
                id.clone(),
                Approval {
                    call: call.clone(),
                    fingerprint: answer.fingerprint.clone(),
                    granted: false,
                    grant_unanswered: false,
                    consumed: false,
                },
            );
            record.approval_order.push(id.clone());
        }
        Ok(Some(id))
    }

    /// The next step of the flow: decide, have it granted, dispatch.
    async fn step_flow(
        &mut self,
        round: &Round,
        clients: &mut Clients,
        reviewer: &mpsc::Sender<GrantRequest>,
    ) -> Result<(), Lost> {
        let mut flow = self.flow.clone().expect("a flow");
        match (&flow.approval, flow.granted) {
            (None, _) => match self.request(round, clients, &flow.call).await? {
                Some(id) => flow.approval = Some(id),
                None => {
                    self.flow = None;
                    return Ok(());
                }
            },
            (Some(id), false) => {
                let (answer, granted) = oneshot::channel();
                if reviewer.send((id.clone(), answer)).await.is_err() {
                    return Err(Lost);
                }
                match granted.await {
                    Ok(Granted::Yes) => flow.granted = true,
                    Ok(Granted::Gone) => {
                        self.flow = None;
                        return Ok(());
                    }
                    Ok(Granted::Lost) | Err(_) => return Err(Lost),
                }
            }
            (Some(_), true) => {
                // Done once answered (a refusal was recorded as a failure);
                // a kill leaves it to be sent again.
                self.dispatch(round, clients, &flow.call).await?;
                self.flow = None;
                return Ok(());
            }
        }
        self.flow = Some(flow);
        Ok(())
    }

    /// Dispatch, which must commit (or replay a commit).
    async fn dispatch(
        &mut self,
        round: &Round,
        clients: &mut Clients,
        call: &Call,
    ) -> Result<(), Lost> {
        self.in_flight = Some(call.clone());
        let answer = match clients.dispatch(call).await {
            Ok(answer) => answer,
            Err(status) => {
                let mut record = round.record();
                record.stats.unanswered += 1;
                record
                    .unanswered
                    .insert(call.id().to_string(), call.clone());
                return Err(round.lost("Dispatch", &status));
            }
        };
        self.in_flight = None;
        let mut record = round.record();
        record.decided(call);
        if answer.status() != pb::DispatchStatus::Ok {
            round.failures.add(
                "dispatch-not-ok",
                format!(
                    "{}: {:?} {} {}",
                    call.id(),
                    answer.status(),
                    answer.reason,
                    answer.message
                ),
            );
            return Ok(());
        }
        record.dispatched(call, &answer, &round.failures);
        if answer.resource == self.queue() {
            self.queue_version = answer.version;
        } else if answer.resource == self.value() {
            self.value_version = answer.version;
        }
        Ok(())
    }

    /// GetSession: the counters as seen now (never less than before).
    async fn read_session(&mut self, round: &Round, clients: &mut Clients) -> Result<(), Lost> {
        let id = self.session.session_id.clone();
        let info = match clients.session(&id).await {
            Ok(info) => info,
            // A session that has not decided anything yet.
            Err(status) if status.code() == Code::NotFound => {
                if round.record().sessions.contains_key(&id) {
                    round
                        .failures
                        .add("session-lost", format!("{id} during load"));
                }
                return Ok(());
            }
            Err(status) => return Err(round.lost("GetSession", &status)),
        };
        let mut record = round.record();
        record.stats.reads += 1;
        let counters = record.sessions.entry(id).or_default();
        counters.actor = info.actor.clone();
        saw_counters(counters, &info, &round.failures);
        Ok(())
    }
}

/// Counters seen now: each at least what was seen before, then kept.
fn saw_counters(counters: &mut Counters, info: &pb::SessionInfo, failures: &Failures) {
    let pairs = [
        ("decisions", counters.decisions, info.decisions),
        ("tool_attempts", counters.tool_attempts, info.tool_attempts),
        (
            "executed_tools",
            counters.executed_tools,
            info.executed_tools,
        ),
        ("work_units", counters.work_units, info.work_units),
        (
            "executed_tools (commits acknowledged)",
            counters.commits,
            info.executed_tools,
        ),
    ];
    for (name, before, now) in pairs {
        if now < before {
            failures.add(
                "session-counter-went-back",
                format!("{}: {name} {now} < {before}", info.session_id),
            );
        }
    }
    counters.decisions = counters.decisions.max(info.decisions);
    counters.tool_attempts = counters.tool_attempts.max(info.tool_attempts);
    counters.executed_tools = counters.executed_tools.max(info.executed_tools);
    counters.work_units = counters.work_units.max(info.work_units);
}

/// The reviewer: grants what the workers ask it to, until they are gone.
async fn reviewer(
    round: Round,
    addr: std::net::SocketAddr,
    mut requests: mpsc::Receiver<GrantRequest>,
) {
    let mut clients = match Clients::connect(addr).await {
        Ok(clients) => clients,
        Err(status) => {
            round.lost("connect", &status);
            return;
        }
    };
    while let Some((id, answer)) = requests.recv().await {
        let granted = grant(&round, &mut clients, &id).await;
        let _ = answer.send(granted);
    }
}

async fn grant(round: &Round, clients: &mut Clients, id: &str) -> Granted {
    let status = match clients.grant(id).await {
        Ok(approval) => {
            let mut record = round.record();
            record.stats.grants += 1;
            if approval.status() != pb::ApprovalStatus::Granted {
                round
                    .failures
                    .add("grant-not-granted", format!("{id}: {approval:?}"));
                return Granted::Gone;
            }
            if let Some(approval) = record.approvals.get_mut(id) {
                approval.granted = true;
                approval.grant_unanswered = false;
            }
            return Granted::Yes;
        }
        Err(status) => status,
    };
    match status.code() {
        // Granted by a call the kill cut off, then recovered: as if granted now.
        Code::FailedPrecondition => match clients.approval(id).await {
            Ok(approval) if approval.status() == pb::ApprovalStatus::Granted => {
                let mut record = round.record();
                record.stats.grants += 1;
                if let Some(approval) = record.approvals.get_mut(id) {
                    approval.granted = true;
                    approval.grant_unanswered = false;
                }
                Granted::Yes
            }
            Ok(approval) => {
                round.failures.add(
                    "grant-refused",
                    format!("{id}: {status:?}, now {approval:?}"),
                );
                Granted::Gone
            }
            Err(status) => {
                round.lost("GetApproval", &status);
                Granted::Lost
            }
        },
        Code::NotFound => {
            round
                .failures
                .add("approval-lost", format!("{id}: grant answers {status:?}"));
            Granted::Gone
        }
        _ => {
            if let Some(approval) = round.record().approvals.get_mut(id) {
                approval.grant_unanswered = true;
            }
            round.lost("GrantApproval", &status);
            Granted::Lost
        }
    }
}

// ----- the checks after a restart ---------------------------------------------------

/// Everything the record says must have survived, checked on the
/// restarted server at `addr`. `all`: every item, not the new ones and a
/// sample of the older.
async fn check(
    addr: std::net::SocketAddr,
    record: &Arc<Mutex<Record>>,
    failures: &Failures,
    rng: &mut StdRng,
    all: bool,
) {
    let mut clients = match Clients::connect(addr).await {
        Ok(clients) => clients,
        Err(status) => {
            failures.add("check-error", format!("connect: {status:?}"));
            return;
        }
    };
    let mut checker = Checker {
        clients: &mut clients,
        record: record.clone(),
        failures: failures.clone(),
        checks: 0,
    };
    checker.approvals().await;
    for worker in 0..WORKERS {
        checker.queue(&format!("q{worker}")).await;
        checker.value(&format!("k{worker}")).await;
    }
    checker.replays(rng, all).await;
    checker.requests(rng, all).await;
    checker.sessions().await;
    checker.decided(rng, all).await;
    let checks = checker.checks;
    let mut record = record.lock().expect("record");
    record.stats.checks += checks;
    record.approvals_checked = record.approval_order.len();
    record.receipts_checked = record.receipt_order.len();
    record.decided_checked = record.decided.len();
}

/// Indexes to check of a list of `len` items of which `checked` were
/// checked before: the new ones and a sample of the others (all of them
/// when `all`).
fn pick(rng: &mut StdRng, len: usize, checked: usize, all: bool) -> Vec<usize> {
    let checked = checked.min(len);
    if all || checked <= SAMPLE {
        return (0..len).collect();
    }
    let mut picked: Vec<usize> = rand::seq::index::sample(rng, checked, SAMPLE).into_vec();
    picked.extend(checked..len);
    picked
}

struct Checker<'c> {
    clients: &'c mut Clients,
    record: Arc<Mutex<Record>>,
    failures: Failures,
    checks: u64,
}

impl Checker<'_> {
    fn fail(&self, kind: &'static str, detail: String) {
        self.failures.add(kind, detail);
    }

    fn record(&self) -> std::sync::MutexGuard<'_, Record> {
        self.record.lock().expect("record")
    }

    /// A number no probe had before.
    fn probe(&self) -> u64 {
        let mut record = self.record();
        record.probes += 1;
        record.probes
    }

    /// Sends again a Dispatch whose effect was found but whose answer was
    /// never seen: it must answer with its receipt (`replayed`), which is
    /// then recorded like any acknowledged commit. Whether it did.
    async fn resolve(&mut self, call: &Call, what: &str) -> Option<pb::DispatchResponse> {
        self.checks += 1;
        match self.clients.dispatch(call).await {
            Ok(answer) if answer.status() == pb::DispatchStatus::Ok && answer.replayed => {
                let mut record = self.record();
                record.stats.found_committed += 1;
                record.dispatched(call, &answer, &self.failures);
                Some(answer)
            }
            Ok(answer) => {
                self.fail(
                    "effect-without-receipt",
                    format!(
                        "{}: {what}, but sending it again answers {answer:?}",
                        call.id()
                    ),
                );
                None
            }
            Err(status) => {
                self.fail("check-error", format!("Dispatch {}: {status:?}", call.id()));
                None
            }
        }
    }

    /// Every acknowledged approval is there, in the state it was left in.
    async fn approvals(&mut self) {
        let listed = match self.clients.all_approvals().await {
            Ok(listed) => listed,
            Err(status) => {
                self.fail("check-error", format!("ListApprovals: {status:?}"));
                return;
            }
        };
        let listed: BTreeMap<String, pb::Approval> = listed
            .into_iter()
            .map(|approval| (approval.approval_id.clone(), approval))
            .collect();
        let now = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .expect("clock")
            .as_secs();
        let known: Vec<(String, Approval)> = self
            .record()
            .approvals
            .iter()
            .map(|(id, approval)| (id.clone(), approval.clone()))
            .collect();
        for (id, approval) in known {
            self.checks += 1;
            let Some(found) = listed.get(&id) else {
                self.fail(
                    "approval-lost",
                    format!(
                        "{id} ({}, granted {})",
                        approval.call.id(),
                        approval.granted
                    ),
                );
                continue;
            };
            if found.fingerprint != approval.fingerprint {
                self.fail(
                    "approval-rebound",
                    format!("{id}: {found:?} for {approval:?}"),
                );
            }
            let status = found.status();
            let expired = found
                .expires_at
                .as_ref()
                .is_some_and(|at| (at.seconds as u64) <= now);
            let unanswered = self.record().unanswered.get(approval.call.id()).cloned();
            use pb::ApprovalStatus::{Consumed, Expired, Granted, Pending};
            match (approval.consumed, approval.granted, status) {
                (true, _, Consumed) => {}
                (false, true, Granted) => {}
                // Consumed by a Dispatch the kill cut off: it committed, so
                // it has its receipt.
                (false, true, Consumed) if unanswered.is_some() => {
                    let call = unanswered.expect("unanswered");
                    self.resolve(&call, "its grant is consumed").await;
                }
                (false, false, Pending) => {}
                // Granted by a call the kill cut off.
                (false, false, Granted) if approval.grant_unanswered => {
                    if let Some(known) = self.record().approvals.get_mut(&id) {
                        known.granted = true;
                    }
                }
                (_, _, Expired) if expired => {}
                _ => self.fail(
                    "approval-state",
                    format!(
                        "{id} ({}): {status:?}, but acknowledged granted {} consumed {}",
                        approval.call.id(),
                        approval.granted,
                        approval.consumed
                    ),
                ),
            }
        }
    }

    /// A queue: one item per acknowledged append, at its index; other
    /// items only of unanswered Dispatches, each with its receipt; no
    /// marker twice; the version is the length.
    async fn queue(&mut self, name: &str) {
        let (items, version, count) = match self.clients.queue(name).await {
            Ok(queue) => queue,
            Err(status) => {
                self.fail("check-error", format!("GetResource {name}: {status:?}"));
                return;
            }
        };
        self.checks += 3;
        let length = items.len() as u64;
        if count != length {
            self.fail(
                "queue-count",
                format!("{name}: item_count {count}, {length} items"),
            );
        }
        if version != length {
            self.fail(
                "half-applied",
                format!("{name}: version {version} but {length} items (each append bumps it once)"),
            );
        }
        let seen = self.record().versions.get(name).copied().unwrap_or(0);
        if version < seen {
            self.fail("version-went-back", format!("{name}: {version} < {seen}"));
        }
        let mut markers = BTreeSet::new();
        for (index, item) in items.iter().enumerate() {
            self.checks += 1;
            let Some(marker) = item.get("mark").and_then(Value::as_str) else {
                self.fail("item-without-marker", format!("{name}[{index}]: {item}"));
                continue;
            };
            if !markers.insert(marker.to_string()) {
                self.fail("effect-twice", format!("{name}: {marker} again at {index}"));
                continue;
            }
            let (known, unanswered) = {
                let record = self.record();
                (
                    record.receipts.get(marker).cloned(),
                    record.unanswered.get(marker).cloned(),
                )
            };
            match (known, unanswered) {
                (Some(receipt), _) => {
                    if receipt.appended_index != Some(index as u64) || receipt.resource != name {
                        self.fail(
                            "item-moved",
                            format!("{name}[{index}] is {marker}, acknowledged at {receipt:?}"),
                        );
                    }
                }
                (None, Some(call)) => {
                    if let Some(answer) = self.resolve(&call, &format!("it is {name}[{index}]")).await
                        && answer.appended_index != Some(index as u64)
                    {
                        self.fail("item-moved", format!("{name}[{index}] is {marker}: {answer:?}"));
                    }
                }
                (None, None) => self.fail(
                    "effect-of-no-call",
                    format!("{name}[{index}] is {marker}, never dispatched or already answered otherwise"),
                ),
            }
        }
        let acknowledged: Vec<Receipt> = self
            .record()
            .receipts
            .values()
            .filter(|receipt| receipt.resource == name)
            .cloned()
            .collect();
        for receipt in acknowledged {
            self.checks += 1;
            let index = receipt.appended_index.unwrap_or(u64::MAX) as usize;
            let there = items
                .get(index)
                .and_then(|item| item.get("mark"))
                .and_then(Value::as_str);
            if there != Some(receipt.call.id()) {
                self.fail(
                    "acknowledged-effect-lost",
                    format!(
                        "{name}[{index}] should be {}, is {there:?}",
                        receipt.call.id()
                    ),
                );
            }
        }
        self.record().saw_version(name, version);
    }

    /// A value: the one its last commit set, at that commit's version.
    async fn value(&mut self, name: &str) {
        let resource = match self.clients.resource(name).await {
            Ok(resource) => resource,
            Err(status) => {
                self.fail("check-error", format!("GetResource {name}: {status:?}"));
                return;
            }
        };
        self.checks += 2;
        let version = resource.version;
        let seen = self.record().versions.get(name).copied().unwrap_or(0);
        if version < seen {
            self.fail("version-went-back", format!("{name}: {version} < {seen}"));
        }
        let value: String = serde_json::from_str(&resource.value_json).unwrap_or_default();
        let (known, unanswered, latest) = {
            let record = self.record();
            let latest = record
                .receipts
                .values()
                .filter(|receipt| receipt.resource == name)
                .map(|receipt| receipt.version)
                .max()
                .unwrap_or(0);
            (
                record.receipts.get(&value).cloned(),
                record.unanswered.get(&value).cloned(),
                latest,
            )
        };
        if version < latest {
            self.fail(
                "acknowledged-effect-lost",
                format!("{name}: version {version}, an acknowledged commit made {latest}"),
            );
        }
        match (known, unanswered) {
            (Some(receipt), _) => {
                if receipt.version != version {
                    self.fail(
                        "half-applied",
                        format!(
                            "{name} = {value:?} at version {version}, committed at {}",
                            receipt.version
                        ),
                    );
                }
            }
            (None, Some(call)) => {
                if let Some(answer) = self
                    .resolve(&call, &format!("{name} holds its value"))
                    .await
                    && answer.version != version
                {
                    self.fail(
                        "half-applied",
                        format!("{name} = {value:?} at {version}: {answer:?}"),
                    );
                }
            }
            (None, None) if value == "initial" && version == 0 => {}
            (None, None) => self.fail(
                "effect-of-no-call",
                format!("{name} = {value:?} at version {version}"),
            ),
        }
        self.record().saw_version(name, version);
    }

    /// Acknowledged commits sent again: a replay of the same receipt, in
    /// their session or (a quarter of them) a new one of the same actor.
    async fn replays(&mut self, rng: &mut StdRng, all: bool) {
        let picked: Vec<Receipt> = {
            let record = self.record();
            pick(
                rng,
                record.receipt_order.len(),
                record.receipts_checked,
                all,
            )
            .into_iter()
            .map(|index| record.receipts[&record.receipt_order[index]].clone())
            .collect()
        };
        for receipt in picked {
            self.checks += 1;
            let mut call = receipt.call.clone();
            if rng.random_bool(0.25) {
                let id = format!("x{}", self.probe());
                call.session = session(&call.session.actor, &id, "crash");
            }
            match self.clients.dispatch(&call).await {
                Ok(answer) if answer.replayed && same_result(&receipt, &answer) => {}
                Ok(answer) if answer.status() == pb::DispatchStatus::Ok && !answer.replayed => self
                    .fail(
                        "committed-twice",
                        format!(
                            "{} (session {}): {answer:?}, acknowledged {receipt:?}",
                            call.id(),
                            call.session.session_id
                        ),
                    ),
                Ok(answer) => self.fail(
                    "replay-differs",
                    format!(
                        "{} (session {}): {answer:?}, acknowledged {receipt:?}",
                        call.id(),
                        call.session.session_id
                    ),
                ),
                Err(status) => {
                    self.fail("check-error", format!("Dispatch {}: {status:?}", call.id()))
                }
            }
        }
    }

    /// Approval requests asked for again: a pending one answers with
    /// itself; a consumed grant allows nothing more.
    async fn requests(&mut self, rng: &mut StdRng, all: bool) {
        let picked: Vec<(String, Approval)> = {
            let record = self.record();
            pick(
                rng,
                record.approval_order.len(),
                record.approvals_checked,
                all,
            )
            .into_iter()
            .map(|index| {
                let id = record.approval_order[index].clone();
                (id.clone(), record.approvals[&id].clone())
            })
            .collect()
        };
        for (id, approval) in picked {
            if approval.granted && !approval.consumed {
                continue;
            }
            self.checks += 1;
            let answer = match self.clients.decide(&approval.call).await {
                Ok(answer) => answer,
                Err(status) => {
                    self.fail(
                        "check-error",
                        format!("Decide {}: {status:?}", approval.call.id()),
                    );
                    continue;
                }
            };
            if approval.consumed {
                if answer.outcome() == pb::Outcome::Allow {
                    self.fail(
                        "grant-usable-twice",
                        format!(
                            "{id} was consumed, yet {} is allowed again: {answer:?}",
                            approval.call.id()
                        ),
                    );
                }
                self.other_call_id(&id, &approval).await;
            } else if answer.outcome() != pb::Outcome::RequireApproval || answer.approval_id != id {
                self.fail(
                    "pending-request-lost",
                    format!(
                        "{id}: asking again for {} answers {answer:?}",
                        approval.call.id()
                    ),
                );
            }
        }
    }

    /// A consumed grant lends nothing to another call id: the same tool
    /// and arguments under a new call id, at the resource's current
    /// version, wait for an approval of their own.
    async fn other_call_id(&mut self, id: &str, approval: &Approval) {
        let Some(receipt) = self.record().receipts.get(approval.call.id()).cloned() else {
            return;
        };
        self.checks += 1;
        let mut other = approval.call.clone();
        other.proposal.call_id = format!("{}o{}", approval.call.id(), self.probe());
        other.proposal.version = self
            .record()
            .versions
            .get(&receipt.resource)
            .copied()
            .unwrap_or(0);
        match self.clients.dispatch(&other).await {
            Ok(answer) if answer.status() == pb::DispatchStatus::ApprovalRequired => {}
            Ok(answer) if answer.status() != pb::DispatchStatus::Ok => self.fail(
                "other-call-id-refused-otherwise",
                format!(
                    "{} (version {}): {answer:?}",
                    other.id(),
                    other.proposal.version
                ),
            ),
            Ok(answer) => self.fail(
                "grant-usable-twice",
                format!(
                    "{id} was consumed by {}; {} answers {answer:?}",
                    approval.call.id(),
                    other.id()
                ),
            ),
            Err(status) => self.fail(
                "check-error",
                format!("Dispatch {}: {status:?}", other.id()),
            ),
        }
    }

    /// Session counters: at least what was seen.
    async fn sessions(&mut self) {
        let sessions: Vec<(String, Counters)> = self
            .record()
            .sessions
            .iter()
            .map(|(id, counters)| (id.clone(), counters.clone()))
            .collect();
        for (id, mut counters) in sessions {
            self.checks += 1;
            match self.clients.session(&id).await {
                Ok(info) => {
                    if info.actor != counters.actor {
                        self.fail(
                            "session-rebound",
                            format!("{id}: {info:?}, actor {}", counters.actor),
                        );
                    }
                    saw_counters(&mut counters, &info, &self.failures);
                    let mut record = self.record();
                    let kept = record.sessions.entry(id).or_default();
                    kept.decisions = kept.decisions.max(counters.decisions);
                    kept.tool_attempts = kept.tool_attempts.max(counters.tool_attempts);
                    kept.executed_tools = kept.executed_tools.max(counters.executed_tools);
                    kept.work_units = kept.work_units.max(counters.work_units);
                }
                Err(status) if status.code() == Code::NotFound => {
                    self.fail("session-lost", format!("{id}: {status:?}"));
                }
                Err(status) => self.fail("check-error", format!("GetSession {id}: {status:?}")),
            }
        }
    }

    /// Decided call ids stay bound to their proposal: another proposal
    /// under one is `call-id-conflict`.
    async fn decided(&mut self, rng: &mut StdRng, all: bool) {
        let picked: Vec<Call> = {
            let record = self.record();
            pick(rng, record.decided.len(), record.decided_checked, all)
                .into_iter()
                .map(|index| record.decided[index].clone())
                .collect()
        };
        let mut done = BTreeSet::new();
        for call in picked {
            let key = (call.session.session_id.clone(), call.id().to_string());
            if !done.insert(key) {
                continue;
            }
            self.checks += 1;
            let mut other = call.clone();
            let mut arguments: Value =
                serde_json::from_str(&other.proposal.arguments_json).expect("arguments");
            arguments["other"] = Value::Bool(true);
            other.proposal.arguments_json = arguments.to_string();
            match self.clients.decide(&other).await {
                Ok(answer) if answer.reason == "call-id-conflict" => {}
                Ok(answer) => self.fail(
                    "decided-call-id-lost",
                    format!(
                        "{} in {}: another proposal answers {:?} {}",
                        call.id(),
                        call.session.session_id,
                        answer.outcome(),
                        answer.reason
                    ),
                ),
                Err(status) => {
                    self.fail("check-error", format!("Decide {}: {status:?}", call.id()))
                }
            }
        }
    }
}

// ----- the server -------------------------------------------------------------------

/// How the server keeps its state: the data directory, or (to see the
/// checks fail) memory.
fn store_args(data: &Path) -> Vec<String> {
    match std::env::var("TOOLGATE_CRASH_STORE").as_deref() {
        Ok("memory") => vec!["--store".into(), "memory".into()],
        _ => vec!["--data-dir".into(), data.display().to_string()],
    }
}

/// `toolgate serve` on the crash policy and the data directory, its logs
/// (warnings and errors) in `logs`. A start that fails shows the log.
async fn start(policy: &str, data: &Path, logs: &Path) -> Spawned {
    let mut args = store_args(data);
    args.extend(["--log-file".to_string(), logs.display().to_string()]);
    let serve = Serve::new(policy).args(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let started = tokio::task::spawn_blocking(move || {
        serve.start_wrapped(|mut command| {
            command.env("RUST_LOG", "warn");
            command
        })
    })
    .await;
    match started {
        Ok(spawned) => spawned,
        Err(error) => panic!(
            "toolgate did not start on {}: {error}\nits log:\n{}",
            data.display(),
            std::fs::read_to_string(logs).unwrap_or_default()
        ),
    }
}

// ----- the test ---------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_state_survives_sigkill_at_random_moments() {
    let started = Instant::now();
    let seed: u64 = std::env::var("CRASH_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(rand::random);
    let mut rng = StdRng::seed_from_u64(seed);
    let policy = policy_text("crash");
    let directory = tempfile::tempdir().expect("temp dir");
    // Made by the first start, owner-only (toolgate refuses a directory
    // others can read).
    let data = directory.path().join("data");
    let logs = directory.path().join("toolgate.log");
    let record = Arc::new(Mutex::new(Record::default()));
    let failures = Failures::default();
    let mut workers: Vec<Worker> = (0..WORKERS).map(|index| Worker::new(index, seed)).collect();

    let mut server = start(&policy, &data, &logs).await;
    for round_index in 0..KILLS {
        if round_index > 0 {
            check(server.addr, &record, &failures, &mut rng, false).await;
        }
        let round = Round {
            record: record.clone(),
            failures: failures.clone(),
            killed: Arc::new(AtomicBool::new(false)),
        };
        let (grants, requests) = mpsc::channel(WORKERS);
        let reviewing = tokio::spawn(reviewer(round.clone(), server.addr, requests));
        let running: Vec<_> = workers
            .drain(..)
            .map(|worker| {
                tokio::spawn(worker.run(round.clone(), round_index, server.addr, grants.clone()))
            })
            .collect();
        drop(grants);
        tokio::time::sleep(Duration::from_millis(rng.random_range(LOAD_MS))).await;
        round.killed.store(true, Ordering::SeqCst);
        server.kill();
        for handle in running {
            let mut worker = tokio::time::timeout(Duration::from_secs(30), handle)
                .await
                .expect("a worker stops once the server is gone")
                .expect("worker task");
            worker.after_kill();
            workers.push(worker);
        }
        tokio::time::timeout(Duration::from_secs(30), reviewing)
            .await
            .expect("the reviewer stops once the workers are gone")
            .expect("reviewer task");
        server = start(&policy, &data, &logs).await;
    }
    // A clean stop, and every item checked after it.
    check(server.addr, &record, &failures, &mut rng, false).await;
    let code = server.stop();
    assert_eq!(code, Some(0), "SIGTERM stops toolgate cleanly");
    let server = start(&policy, &data, &logs).await;
    check(server.addr, &record, &failures, &mut rng, true).await;
    drop(server);

    let record = record.lock().expect("record");
    let stats = &record.stats;
    println!(
        "crash: {KILLS} kills, {} acknowledged answers ({} allowed, {} approvals requested, {} grants, \
         {} commits, {} replays, {} session reads), {} dispatches unanswered at a kill ({} found \
         committed after the restart), {} checks, {} failures, seed {seed}, {:.1} s",
        stats.acknowledged(),
        stats.allowed,
        stats.requested,
        stats.grants,
        stats.commits,
        stats.replays,
        stats.reads,
        stats.unanswered,
        stats.found_committed,
        stats.checks,
        failures.total(),
        started.elapsed().as_secs_f64(),
    );
    assert!(
        stats.commits > 100 && stats.grants > 20,
        "too little load: {stats:?}"
    );
    assert_eq!(
        failures.total(),
        0,
        "acknowledged state did not survive (seed {seed}):{}",
        failures.report()
    );
}
