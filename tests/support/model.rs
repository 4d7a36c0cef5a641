//! The one model of SPEC §4–§6 — Decide's steps and charging, the approval
//! ledger, Dispatch with its resources and receipts — in plain data: what
//! the server must answer to each call, and how its state must change.
//!
//! Two tests check the library against it: `dispatch_model` (thousands of
//! random calls to a real server over gRPC, on `examples/tickets.toml`) and
//! `properties` (proptest interleavings driven through `Engine`, on
//! `tests/fixtures/policies/properties.toml`). The model knows a policy only
//! through the [`Rules`] each test writes down from its file. Every tool of
//! the rules is an `execute` tool (so every new call id of it, and of an
//! unknown tool, is a tool attempt) whose approval is `always` or none.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};

use sha2::{Digest, Sha256};
use tonic::Code;

use super::pb;

/// What the model knows of a policy.
pub struct Rules {
    pub tools: Vec<Tool>,
    /// `[state] version_scope = "resource"`; one global version otherwise.
    pub per_resource_versions: bool,
    /// `[state.resources]`: each resource and its first value.
    pub resources: Vec<(&'static str, Value)>,
    pub pending_ttl_ms: u64,
    pub grant_ttl_ms: u64,
    pub approval_retention_ms: u64,
    pub max_pending_per_actor: usize,
    /// The actors' profile budgets.
    pub max_decisions: Option<u64>,
    pub max_tool_calls: Option<u64>,
    pub receipt_capacity: usize,
    pub receipt_retention_ms: u64,
}

/// An `execute` tool of the policy.
pub struct Tool {
    pub name: &'static str,
    /// `approval = "always"`; no approval otherwise.
    pub approval: bool,
    pub cost: u64,
}

/// A resource's value.
#[derive(Debug, Clone)]
pub enum Value {
    /// Canonical JSON.
    Json(String),
    /// A queue (the target of `append`): the canonical JSON of each item.
    Queue(Vec<String>),
}

impl Value {
    fn json(&self) -> String {
        match self {
            Value::Json(json) => json.clone(),
            Value::Queue(items) => format!("[{}]", items.join(",")),
        }
    }
}

/// A proposal as the model sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct Call {
    pub call_id: String,
    pub actor: String,
    pub tool: String,
    pub version: u64,
    /// The canonical JSON of the arguments.
    pub arguments: String,
    /// What committing it does; `None` when the tool's input schema
    /// refuses the arguments.
    pub effect: Option<Effect>,
}

/// A commit's effect on one resource.
#[derive(Debug, Clone, PartialEq)]
pub enum Effect {
    /// Sets `resource` to `value` (canonical JSON).
    Set { resource: String, value: String },
    /// Appends `item` (canonical JSON) to the queue `resource`.
    Append { resource: String, item: String },
}

impl Effect {
    fn resource(&self) -> &str {
        match self {
            Effect::Set { resource, .. } | Effect::Append { resource, .. } => resource,
        }
    }
}

impl Call {
    /// SPEC §2: SHA-256 of the canonical JSON of exactly the five keys.
    pub fn fingerprint(&self) -> String {
        let canonical = format!(
            r#"{{"actor":"{}","arguments":{},"call_id":"{}","name":"{}","version":{}}}"#,
            self.actor, self.arguments, self.call_id, self.tool, self.version
        );
        hex::encode(Sha256::digest(canonical.as_bytes()))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    Pending,
    Granted,
    Denied,
    Consumed,
    Revoked,
    Expired,
}

impl Standing {
    pub fn pb(self) -> pb::ApprovalStatus {
        match self {
            Standing::Pending => pb::ApprovalStatus::Pending,
            Standing::Granted => pb::ApprovalStatus::Granted,
            Standing::Denied => pb::ApprovalStatus::Denied,
            Standing::Consumed => pb::ApprovalStatus::Consumed,
            Standing::Revoked => pb::ApprovalStatus::Revoked,
            Standing::Expired => pb::ApprovalStatus::Expired,
        }
    }
}

#[derive(Debug, Clone)]
pub struct ApprovalRecord {
    actor: String,
    /// Never `Expired`: expiry is derived from `expires_at` and the time.
    status: Standing,
    pub expires_at: u64,
    finished_at: Option<u64>,
    /// When the server processed the expiry, if the model was told
    /// ([`Model::swept`]).
    expired_at: Option<u64>,
}

impl ApprovalRecord {
    pub fn at(&self, now: u64) -> Standing {
        match self.status {
            Standing::Pending | Standing::Granted if self.expires_at <= now => Standing::Expired,
            status => status,
        }
    }
}

#[derive(Debug, Clone)]
struct Receipt {
    fingerprint: String,
    version: u64,
    resource: String,
    value_json: String,
    receipt_id: String,
    /// The grant the commit consumed.
    grant: Option<String>,
}

/// SPEC §4 "Charging": what a session has been charged.
#[derive(Debug, Default)]
pub struct SessionRecord {
    pub decisions: u64,
    pub tool_attempts: u64,
    pub executed_tools: u64,
    pub executed_cost: u64,
    /// Each charged call id: its fingerprint and the budget that refused it.
    decided: HashMap<String, (String, Option<&'static str>)>,
    pub stopped_reason: Option<&'static str>,
    pub last_seen: u64,
}

/// What a session knows of a call id.
#[derive(Debug, Clone, Copy, PartialEq)]
enum CallStanding {
    New,
    Decided(Option<&'static str>),
    Conflict,
}

/// What an answered Decide or Dispatch costs its session (an error costs
/// nothing and makes no session).
#[derive(Debug, Default, Clone, Copy)]
pub struct Charge {
    decision: bool,
    tool_attempt: bool,
    refused: Option<&'static str>,
}

impl Charge {
    /// A call id new to the session is charged a decision and, since every
    /// tool here (known or not) counts as a tool call, a tool attempt.
    fn of(standing: CallStanding, refused: Option<&'static str>) -> Self {
        let decision = standing == CallStanding::New && refused != Some("decision-budget");
        Charge {
            decision,
            tool_attempt: decision && refused != Some("tool-budget"),
            refused,
        }
    }
}

/// An id an answer must carry.
#[derive(Debug, Clone, PartialEq)]
pub enum Id {
    Empty,
    Is(String),
    /// A new UUID, never seen before.
    New,
}

#[derive(Debug, Clone, PartialEq)]
pub struct DispatchExpect {
    pub status: pb::DispatchStatus,
    pub reason: &'static str,
    pub replayed: bool,
    pub version: u64,
    pub resource: String,
    pub value_json: String,
    pub approval_id: Id,
    pub receipt_id: Id,
    /// For a coverage tally only: what led here.
    pub note: &'static str,
}

impl DispatchExpect {
    fn refused(status: pb::DispatchStatus, reason: &'static str) -> Self {
        DispatchExpect {
            status,
            reason,
            replayed: false,
            version: 0,
            resource: String::new(),
            value_json: String::new(),
            approval_id: Id::Empty,
            receipt_id: Id::Empty,
            note: "",
        }
    }

    fn awaiting(reason: &'static str, approval_id: Id, note: &'static str) -> Self {
        DispatchExpect {
            approval_id,
            note,
            ..DispatchExpect::refused(pb::DispatchStatus::ApprovalRequired, reason)
        }
    }
}

/// What a Dispatch the model predicted changes once the server has answered.
#[derive(Debug)]
pub enum DispatchChange {
    Nothing,
    /// A pending request, with the id the server gives it.
    Request {
        workspace: String,
        fingerprint: String,
        actor: String,
    },
    Commit {
        /// The grant it consumes (none for a tool without approval).
        grant: Option<String>,
        call: Call,
        fingerprint: String,
        version: u64,
        resource: String,
        value_json: String,
        cost: u64,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct DecideExpect {
    pub outcome: pb::Outcome,
    pub reason: &'static str,
    pub approval_id: Id,
    pub expires_at: Option<u64>,
}

impl DecideExpect {
    fn answer(outcome: pb::Outcome, reason: &'static str) -> Self {
        DecideExpect {
            outcome,
            reason,
            approval_id: Id::Empty,
            expires_at: None,
        }
    }
}

#[derive(Debug, Default)]
pub struct DecideChange {
    /// What the answer costs the session (which it opens).
    charge: Charge,
    /// A pending request made.
    pub request: bool,
}

/// A reviewer's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Review {
    Grant,
    Deny,
    Revoke,
}

/// SPEC §4–§6 for one policy, in plain data.
pub struct Model {
    rules: Rules,
    /// Absolute milliseconds, as the server's clock.
    pub now: u64,
    /// The one version of a global scope.
    version: u64,
    /// Each resource's version, in a per-resource scope.
    versions: HashMap<String, u64>,
    values: BTreeMap<String, Value>,
    receipts: HashMap<(String, String), Receipt>,
    receipts_by_age: BTreeSet<(u64, String, String)>,
    receipt_ids: HashSet<String>,
    approvals: HashMap<String, ApprovalRecord>,
    /// Approval ids in the order they were requested.
    requests: Vec<String>,
    /// The latest approval per (workspace, fingerprint).
    current: HashMap<(String, String), String>,
    sessions: HashMap<String, SessionRecord>,
}

impl Model {
    /// The model of a server that starts at `now` with its policy's state.
    pub fn new(rules: Rules, now: u64) -> Self {
        let values = rules
            .resources
            .iter()
            .map(|(name, value)| (name.to_string(), value.clone()))
            .collect();
        let versions = rules
            .resources
            .iter()
            .map(|(name, _)| (name.to_string(), 0))
            .collect();
        Model {
            rules,
            now,
            version: 0,
            versions,
            values,
            receipts: HashMap::new(),
            receipts_by_age: BTreeSet::new(),
            receipt_ids: HashSet::new(),
            approvals: HashMap::new(),
            requests: Vec::new(),
            current: HashMap::new(),
            sessions: HashMap::new(),
        }
    }

    /// The version a proposal to change `resource` is made against (in a
    /// global scope, the one version every resource shares).
    pub fn version(&self, resource: &str) -> u64 {
        match self.rules.per_resource_versions {
            false => self.version,
            true => *self
                .versions
                .get(resource)
                .unwrap_or_else(|| panic!("the model has no resource {resource:?}")),
        }
    }

    /// A resource's value as canonical JSON.
    pub fn resource_json(&self, name: &str) -> String {
        self.values[name].json()
    }

    pub fn session(&self, session_id: &str) -> Option<&SessionRecord> {
        self.sessions.get(session_id)
    }

    pub fn receipt_count(&self) -> usize {
        self.receipts.len()
    }

    /// When the oldest receipt's retention ends, if there is a receipt.
    pub fn oldest_receipt_retention_end(&self) -> Option<u64> {
        self.receipts_by_age
            .first()
            .map(|(created_at, _, _)| created_at + self.rules.receipt_retention_ms)
    }

    pub fn knows_receipt(&self, receipt_id: &str) -> bool {
        self.receipt_ids.contains(receipt_id)
    }

    pub fn knows_approval(&self, approval_id: &str) -> bool {
        self.approvals.contains_key(approval_id)
    }

    pub fn approval(&self, approval_id: &str) -> &ApprovalRecord {
        &self.approvals[approval_id]
    }

    /// Every approval id, in the order requested.
    pub fn requests(&self) -> &[String] {
        &self.requests
    }

    /// The latest approval of a proposal in a workspace, and its standing.
    pub fn standing(&self, workspace: &str, fingerprint: &str) -> Option<(String, Standing)> {
        let id = self
            .current
            .get(&(workspace.to_string(), fingerprint.to_string()))?;
        Some((id.clone(), self.approvals[id].at(self.now)))
    }

    fn pending_of(&self, actor: &str) -> usize {
        self.approvals
            .values()
            .filter(|record| record.actor == actor && record.at(self.now) == Standing::Pending)
            .count()
    }

    pub fn pending_total(&self) -> usize {
        self.approvals
            .values()
            .filter(|record| record.at(self.now) == Standing::Pending)
            .count()
    }

    /// Whether the ledger still holds an approval record; `None` when that
    /// depends on when the server happened to process its expiry.
    pub fn kept(&self, id: &str) -> Option<bool> {
        let record = &self.approvals[id];
        let cutoff = self.now.saturating_sub(self.rules.approval_retention_ms);
        match record.at(self.now) {
            Standing::Pending | Standing::Granted | Standing::Denied => Some(true),
            Standing::Consumed | Standing::Revoked => {
                Some(record.finished_at.expect("finished") > cutoff)
            }
            Standing::Expired => match record.expired_at {
                Some(expired_at) => Some(expired_at > cutoff),
                None => (record.expires_at > cutoff).then_some(true),
            },
        }
    }

    /// The server processed every expiry due by now, and (the caller
    /// knows) none since it was last told: expiries get their exact time,
    /// which is when retention starts for them. Returns how many expired.
    pub fn swept(&mut self) -> usize {
        let now = self.now;
        let mut expired = 0;
        for record in self.approvals.values_mut() {
            if record.at(now) == Standing::Expired && record.expired_at.is_none() {
                record.expired_at = Some(now);
                expired += 1;
            }
        }
        expired
    }

    /// SPEC §6 step 8: room for one more receipt (evicting only past retention).
    fn receipt_room(&self) -> bool {
        self.receipts.len() < self.rules.receipt_capacity
            || self
                .receipts_by_age
                .first()
                .is_some_and(|(created_at, _, _)| {
                    self.now - created_at >= self.rules.receipt_retention_ms
                })
    }

    fn create_pending(&mut self, id: &str, workspace: &str, fingerprint: &str, actor: &str) {
        self.approvals.insert(
            id.to_string(),
            ApprovalRecord {
                actor: actor.to_string(),
                status: Standing::Pending,
                expires_at: self.now + self.rules.pending_ttl_ms,
                finished_at: None,
                expired_at: None,
            },
        );
        self.requests.push(id.to_string());
        self.current.insert(
            (workspace.to_string(), fingerprint.to_string()),
            id.to_string(),
        );
    }

    /// The approval gate shared by Decide and Dispatch: the standing, or
    /// `Err` when a new request would pass the per-actor cap.
    fn gate(
        &self,
        workspace: &str,
        fingerprint: &str,
        actor: &str,
    ) -> Result<Option<(String, Standing)>, Code> {
        match self.standing(workspace, fingerprint) {
            Some((id, standing @ (Standing::Pending | Standing::Granted | Standing::Denied))) => {
                Ok(Some((id, standing)))
            }
            _ if self.pending_of(actor) >= self.rules.max_pending_per_actor => {
                Err(Code::ResourceExhausted)
            }
            _ => Ok(None),
        }
    }

    fn tool(&self, name: &str) -> Option<&Tool> {
        self.rules.tools.iter().find(|tool| tool.name == name)
    }

    /// What session `session_id` knows of this call.
    fn call_standing(&self, session_id: &str, call: &Call) -> CallStanding {
        let decided = self
            .sessions
            .get(session_id)
            .and_then(|session| session.decided.get(&call.call_id));
        match decided {
            None => CallStanding::New,
            Some((fingerprint, refused)) if *fingerprint == call.fingerprint() => {
                CallStanding::Decided(*refused)
            }
            Some(_) => CallStanding::Conflict,
        }
    }

    /// SPEC §4 "Charging": a new call id once the decisions are spent.
    fn decisions_spent(&self, session_id: &str, standing: CallStanding) -> bool {
        standing == CallStanding::New
            && self.rules.max_decisions.is_some_and(|max| {
                self.sessions
                    .get(session_id)
                    .is_some_and(|session| session.decisions >= max)
            })
    }

    /// SPEC §4 step 6 for a call that passed steps 2–5 (no session age is
    /// modelled).
    fn budget_refusal(&self, session_id: &str, standing: CallStanding) -> Option<&'static str> {
        match standing {
            CallStanding::Conflict => Some("call-id-conflict"),
            CallStanding::Decided(refused) => refused,
            CallStanding::New => self
                .rules
                .max_tool_calls
                .is_some_and(|max| {
                    self.sessions
                        .get(session_id)
                        .is_some_and(|session| session.tool_attempts >= max)
                })
                .then_some("tool-budget"),
        }
    }

    /// Opens the session and applies what an answer cost it.
    pub fn settle(&mut self, session_id: &str, call: &Call, charge: Charge) {
        let now = self.now;
        let session = self.sessions.entry(session_id.to_string()).or_default();
        session.last_seen = now;
        if charge.decision {
            session.decisions += 1;
            session
                .decided
                .insert(call.call_id.clone(), (call.fingerprint(), charge.refused));
        }
        if charge.tool_attempt {
            session.tool_attempts += 1;
        }
        if let Some(reason) = charge.refused
            && reason != "call-id-conflict"
        {
            session.stopped_reason.get_or_insert(reason);
        }
    }

    /// SPEC §6 in its order, after the charge of a Decide of the call when
    /// the session never decided it (SPEC §4 "Charging").
    pub fn predict_dispatch(
        &self,
        session_id: &str,
        session_actor: &str,
        workspace: &str,
        call: &Call,
    ) -> (Result<DispatchExpect, Code>, DispatchChange, Charge) {
        let standing = self.call_standing(session_id, call);
        if self.decisions_spent(session_id, standing) {
            let refused = DispatchExpect::refused(pb::DispatchStatus::Denied, "decision-budget");
            let charge = Charge::of(standing, Some("decision-budget"));
            return (Ok(refused), DispatchChange::Nothing, charge);
        }
        let (expect, change, refused) =
            self.predict_dispatch_steps(session_id, session_actor, workspace, call, standing);
        (expect, change, Charge::of(standing, refused))
    }

    fn predict_dispatch_steps(
        &self,
        session_id: &str,
        session_actor: &str,
        workspace: &str,
        call: &Call,
        standing: CallStanding,
    ) -> (
        Result<DispatchExpect, Code>,
        DispatchChange,
        Option<&'static str>,
    ) {
        use pb::DispatchStatus as S;
        if call.actor != session_actor {
            let expect = DispatchExpect::refused(S::Forbidden, "forbidden");
            return (Ok(expect), DispatchChange::Nothing, None);
        }
        let Some(tool) = self.tool(&call.tool) else {
            let expect = DispatchExpect::refused(S::UnknownTool, "unknown-tool");
            return (Ok(expect), DispatchChange::Nothing, None);
        };
        let Some(effect) = &call.effect else {
            return (Err(Code::InvalidArgument), DispatchChange::Nothing, None);
        };
        if let Some(reason) = self.budget_refusal(session_id, standing) {
            let status = match reason {
                "call-id-conflict" => S::CallIdConflict,
                _ => S::Denied,
            };
            let expect = DispatchExpect {
                note: "in this session",
                ..DispatchExpect::refused(status, reason)
            };
            return (Ok(expect), DispatchChange::Nothing, Some(reason));
        }
        let (expect, change) = self.predict_commit(workspace, call, tool, effect);
        (expect, change, None)
    }

    /// SPEC §6 steps 4–9.
    fn predict_commit(
        &self,
        workspace: &str,
        call: &Call,
        tool: &Tool,
        effect: &Effect,
    ) -> (Result<DispatchExpect, Code>, DispatchChange) {
        use pb::DispatchStatus as S;
        let nothing = DispatchChange::Nothing;
        let fingerprint = call.fingerprint();
        let key = (call.actor.clone(), call.call_id.clone());
        if let Some(receipt) = self.receipts.get(&key) {
            if receipt.fingerprint != fingerprint {
                return (
                    Ok(DispatchExpect::refused(
                        S::CallIdConflict,
                        "call-id-conflict",
                    )),
                    nothing,
                );
            }
            let replay = DispatchExpect {
                status: S::Ok,
                reason: "replayed",
                replayed: true,
                version: receipt.version,
                resource: receipt.resource.clone(),
                value_json: receipt.value_json.clone(),
                approval_id: receipt.grant.clone().map_or(Id::Empty, Id::Is),
                receipt_id: Id::Is(receipt.receipt_id.clone()),
                note: "",
            };
            return (Ok(replay), nothing);
        }
        let current = self.version(effect.resource());
        if call.version != current {
            let stale = DispatchExpect {
                version: current,
                ..DispatchExpect::refused(S::StaleVersion, "stale-version")
            };
            return (Ok(stale), nothing);
        }
        let grant = match tool.approval {
            false => None,
            true => match self.gate(workspace, &fingerprint, &call.actor) {
                Err(code) => return (Err(code), nothing),
                Ok(Some((id, Standing::Granted))) => Some(id),
                Ok(Some((id, Standing::Denied))) => {
                    let expect = DispatchExpect::awaiting("approval-denied", Id::Is(id), "denied");
                    return (Ok(expect), nothing);
                }
                Ok(Some((id, _))) => {
                    let expect =
                        DispatchExpect::awaiting("approval-required", Id::Is(id), "pending");
                    return (Ok(expect), nothing);
                }
                Ok(None) => {
                    let note = match self.standing(workspace, &fingerprint) {
                        Some((_, Standing::Expired)) => "after expiry",
                        Some((_, Standing::Revoked)) => "after revoke",
                        Some(_) => "after consumption",
                        None => "new request",
                    };
                    let change = DispatchChange::Request {
                        workspace: workspace.to_string(),
                        fingerprint,
                        actor: call.actor.clone(),
                    };
                    let expect = DispatchExpect::awaiting("approval-required", Id::New, note);
                    return (Ok(expect), change);
                }
            },
        };
        let (resource, value_json) = match effect {
            Effect::Set { resource, value } => {
                if !self.values.contains_key(resource) {
                    return (
                        Ok(DispatchExpect::refused(
                            S::MissingResource,
                            "missing-resource",
                        )),
                        nothing,
                    );
                }
                (resource.clone(), value.clone())
            }
            // An append answers with the item it appended, not the queue.
            Effect::Append { resource, item } => (resource.clone(), item.clone()),
        };
        if !self.receipt_room() {
            return (Ok(DispatchExpect::refused(S::LogFull, "log-full")), nothing);
        }
        let version = current + 1;
        let expect = DispatchExpect {
            status: S::Ok,
            reason: "committed",
            replayed: false,
            version,
            resource: resource.clone(),
            value_json: value_json.clone(),
            approval_id: grant.clone().map_or(Id::Empty, Id::Is),
            receipt_id: Id::New,
            note: "",
        };
        let change = DispatchChange::Commit {
            grant,
            call: call.clone(),
            fingerprint,
            version,
            resource,
            value_json,
            cost: tool.cost,
        };
        (Ok(expect), change)
    }

    /// Applies what a Dispatch changed, once the server answered
    /// `approval_id` (of a new request) and `receipt_id` (of a commit).
    pub fn apply_dispatch(
        &mut self,
        change: DispatchChange,
        session_id: &str,
        approval_id: &str,
        receipt_id: &str,
    ) {
        match change {
            DispatchChange::Nothing => {}
            DispatchChange::Request {
                workspace,
                fingerprint,
                actor,
            } => self.create_pending(approval_id, &workspace, &fingerprint, &actor),
            DispatchChange::Commit {
                grant,
                call,
                fingerprint,
                version,
                resource,
                value_json,
                cost,
            } => {
                match self.rules.per_resource_versions {
                    false => self.version = version,
                    true => {
                        self.versions.insert(resource.clone(), version);
                    }
                }
                match (call.effect.as_ref(), self.values.get_mut(&resource)) {
                    (Some(Effect::Append { item, .. }), Some(Value::Queue(items))) => {
                        items.push(item.clone());
                    }
                    (Some(Effect::Set { value, .. }), Some(stored)) => {
                        *stored = Value::Json(value.clone());
                    }
                    (effect, stored) => unreachable!("{effect:?} on {stored:?} commits nothing"),
                }
                if let Some(grant) = &grant {
                    let record = self.approvals.get_mut(grant).expect("grant");
                    record.status = Standing::Consumed;
                    record.finished_at = Some(self.now);
                }
                while self.receipts.len() >= self.rules.receipt_capacity {
                    let (_, actor, call_id) = self.receipts_by_age.pop_first().expect("oldest");
                    self.receipts.remove(&(actor, call_id));
                }
                let key = (call.actor.clone(), call.call_id.clone());
                self.receipts_by_age
                    .insert((self.now, key.0.clone(), key.1.clone()));
                self.receipts.insert(
                    key,
                    Receipt {
                        fingerprint,
                        version,
                        resource,
                        value_json,
                        receipt_id: receipt_id.to_string(),
                        grant,
                    },
                );
                self.receipt_ids.insert(receipt_id.to_string());
                let session = self.sessions.entry(session_id.to_string()).or_default();
                session.executed_tools += 1;
                session.executed_cost += cost;
            }
        }
    }

    /// SPEC §4, in its order.
    pub fn predict_decide(
        &self,
        session_id: &str,
        session_actor: &str,
        workspace: &str,
        call: &Call,
    ) -> (Result<DecideExpect, Code>, DecideChange) {
        use pb::Outcome::{Allow, Deny, RequireApproval};
        let standing = self.call_standing(session_id, call);
        let mut change = DecideChange {
            charge: Charge::of(standing, None),
            request: false,
        };
        if self.decisions_spent(session_id, standing) {
            change.charge = Charge::of(standing, Some("decision-budget"));
            return (Ok(DecideExpect::answer(Deny, "decision-budget")), change);
        }
        if call.actor != session_actor {
            return (Ok(DecideExpect::answer(Deny, "forbidden")), change);
        }
        let Some(tool) = self.tool(&call.tool) else {
            return (Ok(DecideExpect::answer(Deny, "unknown-tool")), change);
        };
        if call.effect.is_none() {
            return (Err(Code::InvalidArgument), change);
        }
        let fingerprint = call.fingerprint();
        if let Some(reason) = self.budget_refusal(session_id, standing) {
            change.charge = Charge::of(standing, Some(reason));
            return (Ok(DecideExpect::answer(Deny, reason)), change);
        }
        if !tool.approval {
            return (Ok(DecideExpect::answer(Allow, "allowed")), change);
        }
        let (outcome, reason, approval_id, expires_at) =
            match self.gate(workspace, &fingerprint, &call.actor) {
                Err(code) => return (Err(code), change),
                Ok(None) => {
                    change.request = true;
                    (
                        RequireApproval,
                        "approval-required",
                        Id::New,
                        self.now + self.rules.pending_ttl_ms,
                    )
                }
                Ok(Some((id, standing))) => {
                    let (outcome, reason) = match standing {
                        Standing::Granted => (Allow, "approved"),
                        Standing::Denied => (Deny, "approval-denied"),
                        _ => (RequireApproval, "approval-required"),
                    };
                    let expires_at = self.approvals[&id].expires_at;
                    (outcome, reason, Id::Is(id), expires_at)
                }
            };
        let expect = DecideExpect {
            outcome,
            reason,
            approval_id,
            expires_at: Some(expires_at),
        };
        (Ok(expect), change)
    }

    /// Applies what a Decide changed, once the server answered (`None`:
    /// the call was an error, which changes nothing).
    pub fn apply_decide(
        &mut self,
        change: DecideChange,
        session_id: &str,
        workspace: &str,
        call: &Call,
        approval_id: Option<&str>,
    ) {
        let Some(approval_id) = approval_id else {
            return;
        };
        self.settle(session_id, call, change.charge);
        if change.request {
            self.create_pending(approval_id, workspace, &call.fingerprint(), &call.actor);
        }
    }

    /// SPEC §5: the status an approval moves to, or the error.
    pub fn predict_review(&self, id: &str, review: Review) -> Result<Standing, Code> {
        if self.kept(id) == Some(false) {
            return Err(Code::NotFound);
        }
        match (review, self.approvals[id].at(self.now)) {
            (Review::Grant, Standing::Pending) => Ok(Standing::Granted),
            (Review::Deny, Standing::Pending) => Ok(Standing::Denied),
            (Review::Revoke, Standing::Granted) => Ok(Standing::Revoked),
            _ => Err(Code::FailedPrecondition),
        }
    }

    pub fn apply_review(&mut self, id: &str, status: Standing) {
        let now = self.now;
        let grant_ttl_ms = self.rules.grant_ttl_ms;
        let record = self.approvals.get_mut(id).expect("approval");
        record.status = status;
        if status == Standing::Granted {
            record.expires_at = now + grant_ttl_ms;
        } else {
            record.finished_at = Some(now);
        }
    }
}
