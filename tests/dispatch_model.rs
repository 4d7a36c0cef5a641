//! A seeded randomized sequence test of Dispatch (SPEC §6) on
//! `examples/tickets.toml`. Thousands of random proposals — approved and
//! fresh, stale, replayed, conflicting, unapproved, denied, revoked, expired,
//! from the wrong actor or workspace, for unknown tools or with bad
//! arguments — go to a real server and to a small model of SPEC §4–§6
//! written here. Every answer must match the model exactly (status, reason,
//! `replayed`, version, resource, value, approval id, receipt id,
//! fingerprint), and so must the resources, the receipt log, the pending
//! requests, the approvals and each session's charges (SPEC §4 "Charging":
//! every answered call id new to a session costs a decision and a tool
//! attempt, Dispatch included, refusals included) at checkpoints and at the
//! end. Failures name
//! the seed and the step.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::time::Duration;

use sha2::{Digest, Sha256};
use tonic::Code;

use common::{EPOCH, TestServer, authed, session};
use toolgate::pb;
use toolgate::policy::Policy;

const TICKETS: &str = "examples/tickets.toml";
const REVIEWER: &str = "example-reviewer-token";

/// `[limits]` of tickets.toml, and the defaults it does not override.
const PENDING_TTL_MS: u64 = 300_000;
const GRANT_TTL_MS: u64 = 600_000;
const APPROVAL_RETENTION_MS: u64 = 3_600_000;
const MAX_PENDING_PER_ACTOR: usize = 64;
const MAX_DECISIONS: u64 = 1000;
const MAX_TOOL_CALLS: u64 = 1000;
/// Every tool of tickets.toml costs one work unit, as does a decision.
const TOOL_COST: u64 = 1;
const DECISION_COST: u64 = 1;

/// The test moves to a fresh session id after this many decisions (the
/// profile allows 1000), or when a session has been idle this long (the
/// server evicts sessions idle for an hour, at a sweep whose time the test
/// does not control).
const SESSION_DECISIONS: u64 = 200;
const SESSION_IDLE_MS: u64 = 3_000_000;
/// The server's `session_idle_seconds` default, in milliseconds.
const SERVER_SESSION_IDLE_MS: u64 = 3_600_000;

const TOOLS: [&str; 2] = ["set_ticket", "send_reply"];
const UNKNOWN_TOOLS: [&str; 3] = ["delete_ticket", "set_tickets", "Send_reply"];
const WORKSPACES: [&str; 2] = ["desk", "lab"];

/// Reply texts: (as sent when respelled, as canonical JSON string content).
const TEXTS: [(&str, &str); 3] = [
    ("Your lamp is fixed.", "Your lamp is fixed."),
    ("caf\u{e9} \\\"ok\\\"", "caf\\u00e9 \\\"ok\\\""),
    ("two\\u000alines\\/", "two\\nlines/"),
];

/// Arguments that no tool's input schema accepts.
const INVALID_ARGUMENTS: [&str; 5] = [
    r#"{"status":"closed","ticket":"lamp"}"#,
    r#"{"status":"done","ticket":"Lamp"}"#,
    r#"{"approved":true,"status":"done","ticket":"sensor"}"#,
    r#"{"ticket":"lamp"}"#,
    r#"{"recipient":"bob","text":"hi"}"#,
];

/// splitmix64: small, seedable and good enough to choose steps.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut mixed = self.0;
        mixed = (mixed ^ (mixed >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        mixed = (mixed ^ (mixed >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        mixed ^ (mixed >> 31)
    }

    fn below(&mut self, bound: u64) -> u64 {
        self.next() % bound
    }

    fn index(&mut self, len: usize) -> usize {
        (self.next() % len as u64) as usize
    }

    fn percent(&mut self, chance: u64) -> bool {
        self.below(100) < chance
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.index(items.len())]
    }
}

#[derive(Debug, Clone, PartialEq)]
enum Args {
    Ticket {
        ticket: &'static str,
        status: &'static str,
    },
    Reply {
        recipient: u64,
        text: usize,
    },
    /// Canonical JSON text that fails every schema.
    Invalid(&'static str),
}

impl Args {
    fn canonical(&self) -> String {
        match self {
            Args::Ticket { ticket, status } => {
                format!(r#"{{"status":"{status}","ticket":"{ticket}"}}"#)
            }
            Args::Reply { recipient, text } => format!(
                r#"{{"recipient":"customer-{recipient}","text":"{}"}}"#,
                TEXTS[*text].1
            ),
            Args::Invalid(text) => (*text).to_string(),
        }
    }

    /// The same value spelled otherwise: key order, whitespace, escapes.
    fn respelled(&self) -> String {
        match self {
            Args::Ticket { ticket, status } => {
                format!(r#"{{ "ticket" : "{ticket}", "status": "{status}" }}"#)
            }
            Args::Reply { recipient, text } => format!(
                "{{\n  \"text\": \"{}\",\n  \"recipient\": \"customer-{recipient}\"\n}}",
                TEXTS[*text].0
            ),
            Args::Invalid(text) => (*text).to_string(),
        }
    }

    /// True when `tool`'s input schema accepts these arguments.
    fn fit(&self, tool: &str) -> bool {
        matches!(
            (tool, self),
            ("set_ticket", Args::Ticket { .. }) | ("send_reply", Args::Reply { .. })
        )
    }
}

#[derive(Debug, Clone, PartialEq)]
struct Call {
    call_id: String,
    actor: &'static str,
    tool: &'static str,
    version: u64,
    args: Args,
}

impl Call {
    /// SPEC §2: SHA-256 of the canonical JSON of exactly the five keys.
    fn fingerprint(&self) -> String {
        let canonical = format!(
            r#"{{"actor":"{}","arguments":{},"call_id":"{}","name":"{}","version":{}}}"#,
            self.actor,
            self.args.canonical(),
            self.call_id,
            self.tool,
            self.version
        );
        hex::encode(Sha256::digest(canonical.as_bytes()))
    }

    fn proposal(&self, respell: bool) -> pb::Proposal {
        let arguments_json = if respell {
            self.args.respelled()
        } else {
            self.args.canonical()
        };
        common::proposal(
            &self.call_id,
            self.actor,
            self.tool,
            self.version,
            &arguments_json,
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Standing {
    Pending,
    Granted,
    Denied,
    Consumed,
    Revoked,
    Expired,
}

impl Standing {
    fn pb(self) -> pb::ApprovalStatus {
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
struct ApprovalRecord {
    actor: &'static str,
    /// Never `Expired`: expiry is derived from `expires_at` and the time.
    status: Standing,
    expires_at: u64,
    finished_at: Option<u64>,
}

impl ApprovalRecord {
    fn at(&self, now: u64) -> Standing {
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
}

/// SPEC §4 "Charging": what a session has been charged.
#[derive(Debug, Default)]
struct SessionRecord {
    decisions: u64,
    tool_attempts: u64,
    executed_tools: u64,
    executed_cost: u64,
    /// Each charged call id: its fingerprint and the budget that refused it.
    decided: HashMap<String, (String, Option<&'static str>)>,
    stopped_reason: Option<&'static str>,
    last_seen: u64,
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
struct Charge {
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

#[derive(Debug, Clone, PartialEq)]
enum Id {
    Empty,
    Is(String),
    /// A new UUID, never seen before.
    New,
}

#[derive(Debug, Clone, PartialEq)]
struct DispatchExpect {
    status: pb::DispatchStatus,
    reason: &'static str,
    replayed: bool,
    version: u64,
    resource: String,
    value_json: String,
    approval_id: Id,
    receipt_id: Id,
    /// For the coverage tally only: what led here.
    note: &'static str,
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
enum DispatchChange {
    Nothing,
    /// A pending request, with the id the server gives it.
    Request {
        workspace: String,
        fingerprint: String,
        actor: &'static str,
    },
    Commit {
        grant: String,
        call: Call,
        fingerprint: String,
        version: u64,
        resource: String,
        value_json: String,
        outbox_item: Option<String>,
    },
}

#[derive(Debug, Clone, PartialEq)]
struct DecideExpect {
    outcome: pb::Outcome,
    reason: &'static str,
    approval_id: Id,
    expires_at: Option<u64>,
}

impl DecideExpect {
    fn deny(reason: &'static str) -> Self {
        DecideExpect {
            outcome: pb::Outcome::Deny,
            reason,
            approval_id: Id::Empty,
            expires_at: None,
        }
    }
}

#[derive(Debug, Default)]
struct DecideChange {
    /// What the answer costs the session (which it opens).
    charge: Charge,
    /// A pending request made.
    request: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Verdict {
    Grant,
    Deny,
    Revoke,
}

/// SPEC §4–§6 on the two-ticket policy, in plain data.
struct Model {
    /// Absolute milliseconds, as the server's clock.
    now: u64,
    version: u64,
    tickets: BTreeMap<&'static str, &'static str>,
    /// Canonical JSON of each outbox item.
    outbox: Vec<String>,
    receipts: HashMap<(String, String), Receipt>,
    receipts_by_age: BTreeSet<(u64, String, String)>,
    receipt_ids: HashSet<String>,
    receipt_capacity: usize,
    receipt_retention_ms: u64,
    approvals: HashMap<String, ApprovalRecord>,
    /// The latest approval per (workspace, fingerprint).
    current: HashMap<(String, String), String>,
    sessions: HashMap<String, SessionRecord>,
}

impl Model {
    fn new(receipt_capacity: usize, receipt_retention_ms: u64) -> Self {
        Model {
            now: EPOCH.0,
            version: 0,
            tickets: BTreeMap::from([("lamp", "open"), ("sensor", "open")]),
            outbox: Vec::new(),
            receipts: HashMap::new(),
            receipts_by_age: BTreeSet::new(),
            receipt_ids: HashSet::new(),
            receipt_capacity,
            receipt_retention_ms,
            approvals: HashMap::new(),
            current: HashMap::new(),
            sessions: HashMap::new(),
        }
    }

    fn outbox_json(&self, extra: Option<&str>) -> String {
        let items: Vec<&str> = self
            .outbox
            .iter()
            .map(String::as_str)
            .chain(extra)
            .collect();
        format!("[{}]", items.join(","))
    }

    fn resource_json(&self, name: &str) -> String {
        match name {
            "outbox" => self.outbox_json(None),
            ticket => format!("\"{}\"", self.tickets[ticket]),
        }
    }

    fn standing(&self, workspace: &str, fingerprint: &str) -> Option<(String, Standing)> {
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

    fn pending_total(&self) -> usize {
        self.approvals
            .values()
            .filter(|record| record.at(self.now) == Standing::Pending)
            .count()
    }

    /// Whether the ledger still holds an approval record; `None` when that
    /// depends on when the server happened to process its expiry.
    fn kept(&self, id: &str) -> Option<bool> {
        let record = &self.approvals[id];
        let cutoff = self.now.saturating_sub(APPROVAL_RETENTION_MS);
        match record.at(self.now) {
            Standing::Pending | Standing::Granted | Standing::Denied => Some(true),
            Standing::Consumed | Standing::Revoked => {
                Some(record.finished_at.expect("finished") > cutoff)
            }
            Standing::Expired => (record.expires_at > cutoff).then_some(true),
        }
    }

    /// SPEC §6 step 8: room for one more receipt (evicting only past retention).
    fn receipt_room(&self) -> bool {
        self.receipts.len() < self.receipt_capacity
            || self
                .receipts_by_age
                .first()
                .is_some_and(|(created_at, _, _)| {
                    self.now - created_at >= self.receipt_retention_ms
                })
    }

    fn create_pending(
        &mut self,
        id: &str,
        workspace: &str,
        fingerprint: &str,
        actor: &'static str,
    ) {
        self.approvals.insert(
            id.to_string(),
            ApprovalRecord {
                actor,
                status: Standing::Pending,
                expires_at: self.now + PENDING_TTL_MS,
                finished_at: None,
            },
        );
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
            _ if self.pending_of(actor) >= MAX_PENDING_PER_ACTOR => Err(Code::ResourceExhausted),
            _ => Ok(None),
        }
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
            && self
                .sessions
                .get(session_id)
                .is_some_and(|session| session.decisions >= MAX_DECISIONS)
    }

    /// SPEC §4 step 6 for a call that passed steps 2–5 (tickets.toml sets
    /// no session age).
    fn budget_refusal(&self, session_id: &str, standing: CallStanding) -> Option<&'static str> {
        match standing {
            CallStanding::Conflict => Some("call-id-conflict"),
            CallStanding::Decided(refused) => refused,
            CallStanding::New => self
                .sessions
                .get(session_id)
                .is_some_and(|session| session.tool_attempts >= MAX_TOOL_CALLS)
                .then_some("tool-budget"),
        }
    }

    /// Opens the session and applies what an answer cost it.
    fn settle(&mut self, session_id: &str, call: &Call, charge: Charge) {
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
    fn predict_dispatch(
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
        if !TOOLS.contains(&call.tool) {
            let expect = DispatchExpect::refused(S::UnknownTool, "unknown-tool");
            return (Ok(expect), DispatchChange::Nothing, None);
        }
        if !call.args.fit(call.tool) {
            return (Err(Code::InvalidArgument), DispatchChange::Nothing, None);
        }
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
        let (expect, change) = self.predict_commit(workspace, call);
        (expect, change, None)
    }

    /// SPEC §6 steps 4–9.
    fn predict_commit(
        &self,
        workspace: &str,
        call: &Call,
    ) -> (Result<DispatchExpect, Code>, DispatchChange) {
        use pb::DispatchStatus as S;
        let nothing = DispatchChange::Nothing;
        let fingerprint = call.fingerprint();
        let key = (call.actor.to_string(), call.call_id.clone());
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
                approval_id: Id::Empty,
                receipt_id: Id::Is(receipt.receipt_id.clone()),
                note: "",
            };
            return (Ok(replay), nothing);
        }
        if call.version != self.version {
            let stale = DispatchExpect {
                version: self.version,
                ..DispatchExpect::refused(S::StaleVersion, "stale-version")
            };
            return (Ok(stale), nothing);
        }
        let grant = match self.gate(workspace, &fingerprint, call.actor) {
            Err(code) => return (Err(code), nothing),
            Ok(Some((id, Standing::Granted))) => id,
            Ok(Some((id, Standing::Denied))) => {
                let expect = DispatchExpect::awaiting("approval-denied", Id::Is(id), "denied");
                return (Ok(expect), nothing);
            }
            Ok(Some((id, _))) => {
                let expect = DispatchExpect::awaiting("approval-required", Id::Is(id), "pending");
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
                    actor: call.actor,
                };
                let expect = DispatchExpect::awaiting("approval-required", Id::New, note);
                return (Ok(expect), change);
            }
        };
        let (resource, value_json, outbox_item) = match &call.args {
            Args::Ticket { ticket, status } => {
                if !self.tickets.contains_key(ticket) {
                    return (
                        Ok(DispatchExpect::refused(
                            S::MissingResource,
                            "missing-resource",
                        )),
                        nothing,
                    );
                }
                ((*ticket).to_string(), format!("\"{status}\""), None)
            }
            Args::Reply { .. } => {
                // An append answers with the item it appended, not the queue.
                let item = call.args.canonical();
                ("outbox".to_string(), item.clone(), Some(item))
            }
            Args::Invalid(_) => unreachable!("schema checked above"),
        };
        if !self.receipt_room() {
            return (Ok(DispatchExpect::refused(S::LogFull, "log-full")), nothing);
        }
        let version = self.version + 1;
        let expect = DispatchExpect {
            status: S::Ok,
            reason: "committed",
            replayed: false,
            version,
            resource: resource.clone(),
            value_json: value_json.clone(),
            approval_id: Id::Is(grant.clone()),
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
            outbox_item,
        };
        (Ok(expect), change)
    }

    fn apply_dispatch(
        &mut self,
        change: DispatchChange,
        session_id: &str,
        response: &pb::DispatchResponse,
    ) {
        match change {
            DispatchChange::Nothing => {}
            DispatchChange::Request {
                workspace,
                fingerprint,
                actor,
            } => self.create_pending(&response.approval_id, &workspace, &fingerprint, actor),
            DispatchChange::Commit {
                grant,
                call,
                fingerprint,
                version,
                resource,
                value_json,
                outbox_item,
            } => {
                self.version = version;
                match (&call.args, outbox_item) {
                    (_, Some(item)) => self.outbox.push(item),
                    (Args::Ticket { ticket, status }, None) => {
                        self.tickets.insert(ticket, status);
                    }
                    (args, None) => unreachable!("{args:?} commits nothing"),
                }
                let record = self.approvals.get_mut(&grant).expect("grant");
                record.status = Standing::Consumed;
                record.finished_at = Some(self.now);
                while self.receipts.len() >= self.receipt_capacity {
                    let (_, actor, call_id) = self.receipts_by_age.pop_first().expect("oldest");
                    self.receipts.remove(&(actor, call_id));
                }
                let key = (call.actor.to_string(), call.call_id.clone());
                self.receipts_by_age
                    .insert((self.now, key.0.clone(), key.1.clone()));
                self.receipts.insert(
                    key,
                    Receipt {
                        fingerprint,
                        version,
                        resource,
                        value_json,
                        receipt_id: response.receipt_id.clone(),
                    },
                );
                self.receipt_ids.insert(response.receipt_id.clone());
                let session = self.sessions.entry(session_id.to_string()).or_default();
                session.executed_tools += 1;
                session.executed_cost += TOOL_COST;
            }
        }
    }

    /// SPEC §4, in its order (for proposals of execute tools that always
    /// need approval, as every tool of tickets.toml does).
    fn predict_decide(
        &self,
        session_id: &str,
        session_actor: &str,
        workspace: &str,
        call: &Call,
    ) -> (Result<DecideExpect, Code>, DecideChange) {
        let standing = self.call_standing(session_id, call);
        let mut change = DecideChange {
            charge: Charge::of(standing, None),
            request: false,
        };
        if self.decisions_spent(session_id, standing) {
            change.charge = Charge::of(standing, Some("decision-budget"));
            return (Ok(DecideExpect::deny("decision-budget")), change);
        }
        if call.actor != session_actor {
            return (Ok(DecideExpect::deny("forbidden")), change);
        }
        if !TOOLS.contains(&call.tool) {
            return (Ok(DecideExpect::deny("unknown-tool")), change);
        }
        if !call.args.fit(call.tool) {
            return (Err(Code::InvalidArgument), change);
        }
        let fingerprint = call.fingerprint();
        if let Some(reason) = self.budget_refusal(session_id, standing) {
            change.charge = Charge::of(standing, Some(reason));
            return (Ok(DecideExpect::deny(reason)), change);
        }
        let (outcome, reason, approval_id, expires_at) =
            match self.gate(workspace, &fingerprint, call.actor) {
                Err(code) => return (Err(code), change),
                Ok(None) => {
                    change.request = true;
                    (
                        pb::Outcome::RequireApproval,
                        "approval-required",
                        Id::New,
                        self.now + PENDING_TTL_MS,
                    )
                }
                Ok(Some((id, standing))) => {
                    let (outcome, reason) = match standing {
                        Standing::Granted => (pb::Outcome::Allow, "approved"),
                        Standing::Denied => (pb::Outcome::Deny, "approval-denied"),
                        _ => (pb::Outcome::RequireApproval, "approval-required"),
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

    fn apply_decide(
        &mut self,
        change: DecideChange,
        session_id: &str,
        workspace: &str,
        call: &Call,
        response: Option<&pb::DecideResponse>,
    ) {
        let Some(response) = response else {
            return;
        };
        self.settle(session_id, call, change.charge);
        if change.request {
            self.create_pending(
                &response.approval_id,
                workspace,
                &call.fingerprint(),
                call.actor,
            );
        }
    }

    /// SPEC §5: the status an approval moves to, or the error.
    fn predict_review(&self, id: &str, verdict: Verdict) -> Result<Standing, Code> {
        if self.kept(id) == Some(false) {
            return Err(Code::NotFound);
        }
        match (verdict, self.approvals[id].at(self.now)) {
            (Verdict::Grant, Standing::Pending) => Ok(Standing::Granted),
            (Verdict::Deny, Standing::Pending) => Ok(Standing::Denied),
            (Verdict::Revoke, Standing::Granted) => Ok(Standing::Revoked),
            _ => Err(Code::FailedPrecondition),
        }
    }

    fn apply_review(&mut self, id: &str, status: Standing) {
        let now = self.now;
        let record = self.approvals.get_mut(id).expect("approval");
        record.status = status;
        if status == Standing::Granted {
            record.expires_at = now + GRANT_TTL_MS;
        } else {
            record.finished_at = Some(now);
        }
    }
}

fn millis(timestamp: Option<prost_types::Timestamp>) -> Option<u64> {
    timestamp.map(|timestamp| {
        u64::try_from(timestamp.seconds).expect("after 1970") * 1000
            + u64::try_from(timestamp.nanos).expect("nanos") / 1_000_000
    })
}

/// A proposal kept for later: dispatched again, reviewed, decided again.
#[derive(Debug, Clone)]
struct Entry {
    call: Call,
    workspace: &'static str,
}

struct Run {
    seed: u64,
    step: usize,
    rng: Rng,
    server: TestServer,
    model: Model,
    pool: Vec<Entry>,
    committed: Vec<Call>,
    next_call: u64,
    epochs: HashMap<(&'static str, &'static str), u32>,
    recent_approvals: Vec<String>,
    coverage: BTreeMap<String, usize>,
}

impl Run {
    fn at(&self) -> String {
        format!("seed {:#x} step {}", self.seed, self.step)
    }

    fn tally(&mut self, key: String) {
        *self.coverage.entry(key).or_insert(0) += 1;
    }

    fn advance(&mut self, millis: u64) {
        self.server.clock.advance(Duration::from_millis(millis));
        self.model.now += millis;
    }

    /// The session id in use for (actor, workspace), moving to a fresh one
    /// when the current one is near its budget or long idle.
    fn session(&mut self, actor: &'static str, workspace: &'static str) -> pb::Session {
        let epoch = self.epochs.entry((actor, workspace)).or_insert(0);
        let worn = |epoch: u32| {
            self.model
                .sessions
                .get(&format!("{actor}-{workspace}-{epoch}"))
                .is_some_and(|record| {
                    record.decisions >= SESSION_DECISIONS
                        || self.model.now - record.last_seen >= SESSION_IDLE_MS
                })
        };
        if worn(*epoch) {
            *epoch += 1;
        }
        session(actor, &format!("{actor}-{workspace}-{epoch}"), workspace)
    }

    fn call_id(&mut self) -> String {
        self.next_call += 1;
        format!("c{}", self.next_call)
    }

    fn actor(&mut self) -> &'static str {
        if self.rng.percent(80) {
            "learner"
        } else {
            "other"
        }
    }

    fn workspace(&mut self) -> &'static str {
        if self.rng.percent(85) { "desk" } else { "lab" }
    }

    fn action(&mut self) -> (&'static str, Args) {
        let status = self.rng.pick(&["open", "done"]);
        match self.rng.below(100) {
            0..35 => (
                "set_ticket",
                Args::Ticket {
                    ticket: "lamp",
                    status,
                },
            ),
            35..70 => (
                "set_ticket",
                Args::Ticket {
                    ticket: "sensor",
                    status,
                },
            ),
            70..80 => (
                "set_ticket",
                Args::Ticket {
                    ticket: "ghost",
                    status,
                },
            ),
            _ => (
                "send_reply",
                Args::Reply {
                    recipient: 1 + self.rng.below(99),
                    text: self.rng.index(TEXTS.len()),
                },
            ),
        }
    }

    /// A new proposal at the current version; now and then it borrows a call
    /// id the other actor committed (call ids are per actor).
    fn fresh(&mut self, actor: &'static str) -> Call {
        let borrowed = match self.rng.percent(10) {
            true => {
                let candidates: Vec<String> = self
                    .committed
                    .iter()
                    .filter(|call| call.actor != actor)
                    .map(|call| call.call_id.clone())
                    .collect();
                (!candidates.is_empty())
                    .then(|| candidates[self.rng.index(candidates.len())].clone())
            }
            false => None,
        };
        let call_id = match borrowed {
            Some(call_id) => call_id,
            None => self.call_id(),
        };
        let (tool, args) = self.action();
        Call {
            call_id,
            actor,
            tool,
            version: self.model.version,
            args,
        }
    }

    fn keep(&mut self, call: &Call, workspace: &'static str) {
        if self.pool.len() >= 48 {
            let index = self.rng.index(self.pool.len());
            self.pool.swap_remove(index);
        }
        self.pool.push(Entry {
            call: call.clone(),
            workspace,
        });
    }

    async fn dispatch(
        &mut self,
        actor: &'static str,
        workspace: &'static str,
        call: &Call,
    ) -> Option<pb::DispatchResponse> {
        let session = self.session(actor, workspace);
        let respell = self.rng.percent(30);
        let (expected, change, charge) =
            self.model
                .predict_dispatch(&session.session_id, actor, workspace, call);
        let answer = self
            .server
            .pdp()
            .dispatch(pb::DispatchRequest {
                session: Some(session.clone()),
                proposal: Some(call.proposal(respell)),
            })
            .await
            .map(tonic::Response::into_inner);
        let context = format!(
            "{}: Dispatch {call:?} (respelled: {respell}) in session {session:?}",
            self.at()
        );
        match (expected, answer) {
            (Err(code), Err(status)) => {
                assert_eq!(status.code(), code, "{context}: {status:?}");
                self.tally(format!("dispatch error {code:?}"));
                None
            }
            (Ok(expect), Ok(response)) => {
                let got = (
                    response.status(),
                    response.reason.as_str(),
                    response.replayed,
                    response.version,
                    response.resource.as_str(),
                    response.value_json.as_str(),
                );
                let want = (
                    expect.status,
                    expect.reason,
                    expect.replayed,
                    expect.version,
                    expect.resource.as_str(),
                    expect.value_json.as_str(),
                );
                assert_eq!(got, want, "{context}: {response:?}");
                assert_eq!(response.fingerprint, call.fingerprint(), "{context}");
                let known_approvals = &self.model.approvals;
                check_id(
                    &response.approval_id,
                    &expect.approval_id,
                    |id| known_approvals.contains_key(id),
                    &format!("{context}: approval id"),
                );
                let known_receipts = &self.model.receipt_ids;
                check_id(
                    &response.receipt_id,
                    &expect.receipt_id,
                    |id| known_receipts.contains(id),
                    &format!("{context}: receipt id"),
                );
                self.tally(
                    format!(
                        "dispatch {:?} {} {}",
                        expect.status, expect.reason, expect.note
                    )
                    .trim_end()
                    .to_string(),
                );
                if let DispatchChange::Request { .. } = change {
                    self.recent_approvals.push(response.approval_id.clone());
                }
                let commit = matches!(change, DispatchChange::Commit { .. });
                let receipts = self.model.receipts.len();
                self.model.settle(&session.session_id, call, charge);
                self.model
                    .apply_dispatch(change, &session.session_id, &response);
                if commit {
                    self.committed.push(call.clone());
                    if self.model.receipts.len() == receipts {
                        self.tally("receipt evicted past retention".to_string());
                    }
                }
                Some(response)
            }
            (expected, answer) => panic!("{context}: expected {expected:?}, got {answer:?}"),
        }
    }

    async fn decide(
        &mut self,
        actor: &'static str,
        workspace: &'static str,
        call: &Call,
    ) -> Option<pb::DecideResponse> {
        let session = self.session(actor, workspace);
        let respell = self.rng.percent(30);
        let (expected, change) =
            self.model
                .predict_decide(&session.session_id, actor, workspace, call);
        let answer = self
            .server
            .pdp()
            .decide(pb::DecideRequest {
                session: Some(session.clone()),
                proposal: Some(call.proposal(respell)),
            })
            .await
            .map(tonic::Response::into_inner);
        let context = format!(
            "{}: Decide {call:?} (respelled: {respell}) in session {session:?}",
            self.at()
        );
        let response = match (expected, answer) {
            (Err(code), Err(status)) => {
                assert_eq!(status.code(), code, "{context}: {status:?}");
                self.tally(format!("decide error {code:?}"));
                None
            }
            (Ok(expect), Ok(response)) => {
                let got = (
                    response.outcome(),
                    response.reason.as_str(),
                    millis(response.approval_expires_at),
                );
                assert_eq!(
                    got,
                    (expect.outcome, expect.reason, expect.expires_at),
                    "{context}: {response:?}"
                );
                assert_eq!(response.fingerprint, call.fingerprint(), "{context}");
                let known = &self.model.approvals;
                check_id(
                    &response.approval_id,
                    &expect.approval_id,
                    |id| known.contains_key(id),
                    &format!("{context}: approval id"),
                );
                self.tally(format!("decide {:?} {}", expect.outcome, expect.reason));
                if change.request {
                    self.recent_approvals.push(response.approval_id.clone());
                }
                Some(response)
            }
            (expected, answer) => panic!("{context}: expected {expected:?}, got {answer:?}"),
        };
        self.model.apply_decide(
            change,
            &session.session_id,
            workspace,
            call,
            response.as_ref(),
        );
        response
    }

    /// Grant, deny or revoke; true when the reviewer's verdict took effect.
    async fn review(&mut self, approval_id: &str, verdict: Verdict) -> bool {
        let expected = self.model.predict_review(approval_id, verdict);
        let answer = match verdict {
            Verdict::Grant => {
                let request = pb::GrantApprovalRequest {
                    approval_id: approval_id.to_string(),
                    comment: "looks right".to_string(),
                };
                self.server
                    .approvals()
                    .grant_approval(authed(request, REVIEWER))
                    .await
                    .map(tonic::Response::into_inner)
            }
            Verdict::Deny => {
                let request = pb::DenyApprovalRequest {
                    approval_id: approval_id.to_string(),
                    reason: "not this one".to_string(),
                };
                self.server
                    .approvals()
                    .deny_approval(authed(request, REVIEWER))
                    .await
                    .map(tonic::Response::into_inner)
            }
            Verdict::Revoke => {
                let request = pb::RevokeApprovalRequest {
                    approval_id: approval_id.to_string(),
                    reason: "changed my mind".to_string(),
                };
                self.server
                    .approvals()
                    .revoke_approval(authed(request, REVIEWER))
                    .await
                    .map(tonic::Response::into_inner)
            }
        };
        let context = format!("{}: {verdict:?} approval {approval_id}", self.at());
        match (expected, answer) {
            (Err(code), Err(status)) => {
                assert_eq!(status.code(), code, "{context}: {status:?}");
                self.tally(format!("review {verdict:?} error {code:?}"));
                false
            }
            (Ok(status), Ok(approval)) => {
                let expires_at = match status {
                    Standing::Granted => self.model.now + GRANT_TTL_MS,
                    _ => self.model.approvals[approval_id].expires_at,
                };
                assert_eq!(
                    (
                        approval.approval_id.as_str(),
                        approval.status(),
                        millis(approval.expires_at)
                    ),
                    (approval_id, status.pb(), Some(expires_at)),
                    "{context}: {approval:?}"
                );
                self.tally(format!("review {verdict:?} ok"));
                self.model.apply_review(approval_id, status);
                true
            }
            (expected, answer) => panic!("{context}: expected {expected:?}, got {answer:?}"),
        }
    }

    async fn resource(&self, name: &str) -> pb::Resource {
        self.server.resource(REVIEWER, name).await
    }

    /// Resources, receipts, pending requests and approvals against the model.
    async fn checkpoint(&mut self) {
        let context = format!("{}: checkpoint", self.at());
        for name in ["lamp", "sensor", "outbox"] {
            let resource = self.resource(name).await;
            assert_eq!(
                (resource.value_json.as_str(), resource.version),
                (self.model.resource_json(name).as_str(), self.model.version),
                "{context}: resource {name}"
            );
        }
        // A sweep at the current time processes every expiry that is due.
        self.server.engine.sweep().expect("sweep");
        let stats = self.server.engine.stats().expect("stats");
        assert_eq!(
            (stats.receipts, stats.pending_approvals),
            (self.model.receipts.len(), self.model.pending_total()),
            "{context}: receipts and pending approvals"
        );
        // Each session in use reports what the model charged it.
        let mut session_ids: Vec<String> = self
            .epochs
            .iter()
            .map(|((actor, workspace), epoch)| format!("{actor}-{workspace}-{epoch}"))
            .collect();
        session_ids.sort();
        for session_id in session_ids {
            let Some(record) = self.model.sessions.get(&session_id) else {
                continue;
            };
            if self.model.now - record.last_seen >= SERVER_SESSION_IDLE_MS {
                continue;
            }
            let info = self
                .server
                .pdp()
                .get_session(pb::GetSessionRequest {
                    session_id: session_id.clone(),
                })
                .await
                .unwrap_or_else(|status| panic!("{context}: session {session_id}: {status:?}"))
                .into_inner();
            assert_eq!(
                (
                    info.decisions,
                    info.tool_attempts,
                    info.executed_tools,
                    info.work_units,
                    info.stopped_reason.as_str(),
                ),
                (
                    record.decisions,
                    record.tool_attempts,
                    record.executed_tools,
                    record.decisions * DECISION_COST + record.executed_cost,
                    record.stopped_reason.unwrap_or_default(),
                ),
                "{context}: session {session_id}"
            );
            self.tally("session counts checked".to_string());
        }
        let mut ids: Vec<String> = self
            .pool
            .iter()
            .filter_map(|entry| {
                self.model
                    .standing(entry.workspace, &entry.call.fingerprint())
                    .map(|(id, _)| id)
            })
            .collect();
        let recent = self.recent_approvals.len().saturating_sub(32);
        ids.extend(self.recent_approvals[recent..].iter().cloned());
        ids.sort();
        ids.dedup();
        for id in ids {
            let Some(kept) = self.model.kept(&id) else {
                continue;
            };
            let request = pb::GetApprovalRequest {
                approval_id: id.clone(),
            };
            let answer = self
                .server
                .approvals()
                .get_approval(authed(request, REVIEWER))
                .await
                .map(tonic::Response::into_inner);
            let record = &self.model.approvals[&id];
            match answer {
                Ok(approval) if kept => assert_eq!(
                    (approval.status(), millis(approval.expires_at)),
                    (record.at(self.model.now).pb(), Some(record.expires_at)),
                    "{context}: approval {id} {record:?}"
                ),
                Err(status) if !kept => {
                    assert_eq!(status.code(), Code::NotFound, "{context}: approval {id}")
                }
                other => panic!("{context}: approval {id} {record:?} kept: {kept}, got {other:?}"),
            }
        }
    }

    // ----- the steps -----

    /// Decide, grant (or now and then deny, or grant and revoke), maybe let
    /// the grant expire, then Dispatch (or keep it for later).
    async fn approved(&mut self) {
        let actor = self.actor();
        let workspace = self.workspace();
        let call = self.fresh(actor);
        if let Some(decision) = self.decide(actor, workspace, &call).await
            && !decision.approval_id.is_empty()
            && decision.outcome() == pb::Outcome::RequireApproval
        {
            let verdict = if self.rng.percent(88) {
                Verdict::Grant
            } else {
                Verdict::Deny
            };
            if self.review(&decision.approval_id, verdict).await
                && verdict == Verdict::Grant
                && self.rng.percent(5)
            {
                self.review(&decision.approval_id, Verdict::Revoke).await;
            }
        }
        if self.rng.percent(6) {
            // Exactly at the grant's expiry, a millisecond before, or later.
            let late = match self.rng.below(3) {
                0 => GRANT_TTL_MS - 1,
                1 => GRANT_TTL_MS,
                _ => GRANT_TTL_MS + self.rng.below(120_000),
            };
            self.advance(late);
        }
        if self.rng.percent(80) {
            self.dispatch(actor, workspace, &call).await;
        }
        self.keep(&call, workspace);
    }

    /// Dispatch something kept earlier, usually from its own workspace.
    async fn again(&mut self) {
        if self.pool.is_empty() {
            return self.approved().await;
        }
        let entry = self.pool[self.rng.index(self.pool.len())].clone();
        let workspace = if self.rng.percent(85) {
            entry.workspace
        } else {
            self.rng.pick(&WORKSPACES)
        };
        self.dispatch(entry.call.actor, workspace, &entry.call)
            .await;
    }

    /// A proposal made against another version, approved or not.
    async fn stale(&mut self) {
        let actor = self.actor();
        let workspace = self.workspace();
        let mut call = self.fresh(actor);
        call.version = if self.model.version > 0 && self.rng.percent(70) {
            self.rng.below(self.model.version)
        } else {
            self.model.version + 1 + self.rng.below(3)
        };
        if self.rng.percent(30)
            && let Some(decision) = self.decide(actor, workspace, &call).await
            && decision.outcome() == pb::Outcome::RequireApproval
        {
            self.review(&decision.approval_id, Verdict::Grant).await;
        }
        self.dispatch(actor, workspace, &call).await;
        self.keep(&call, workspace);
    }

    /// A committed call again, same fingerprint, from any workspace.
    async fn replay(&mut self) {
        if self.committed.is_empty() {
            return self.approved().await;
        }
        let call = self.committed[self.rng.index(self.committed.len())].clone();
        let workspace = self.rng.pick(&WORKSPACES);
        self.dispatch(call.actor, workspace, &call).await;
    }

    /// A committed call id with another fingerprint (sometimes approved).
    async fn conflict(&mut self) {
        if self.committed.is_empty() {
            return self.approved().await;
        }
        let mut call = self.committed[self.rng.index(self.committed.len())].clone();
        match self.rng.below(4) {
            0 => {
                call.args = match call.args {
                    Args::Ticket { ticket, status } => Args::Ticket {
                        ticket,
                        status: if status == "open" { "done" } else { "open" },
                    },
                    Args::Reply { recipient, text } => Args::Reply {
                        recipient: recipient % 99 + 1,
                        text,
                    },
                    Args::Invalid(text) => Args::Invalid(text),
                }
            }
            1 => call.version = self.model.version.max(call.version + 1),
            2 => loop {
                let (tool, args) = self.action();
                if tool != call.tool {
                    (call.tool, call.args) = (tool, args);
                    break;
                }
            },
            _ => call.args = Args::Invalid(self.rng.pick(&INVALID_ARGUMENTS)),
        }
        let workspace = self.workspace();
        if self.rng.percent(30)
            && let Some(decision) = self.decide(call.actor, workspace, &call).await
            && decision.outcome() == pb::Outcome::RequireApproval
        {
            self.review(&decision.approval_id, Verdict::Grant).await;
        }
        self.dispatch(call.actor, workspace, &call).await;
    }

    /// Dispatch with no Decide and no grant (once or twice).
    async fn unapproved(&mut self) {
        let actor = self.actor();
        let workspace = self.workspace();
        let call = self.fresh(actor);
        self.dispatch(actor, workspace, &call).await;
        if self.rng.percent(15) {
            // The request it made is reused until it expires (sometimes
            // exactly at its expiry, or a millisecond before).
            if self.rng.percent(40) {
                let wait = PENDING_TTL_MS - self.rng.below(2);
                self.advance(wait);
            }
            self.dispatch(actor, workspace, &call).await;
        }
        if self.rng.percent(50) {
            self.keep(&call, workspace);
        }
    }

    /// The session runs as one actor, the proposal claims the other.
    async fn wrong_actor(&mut self) {
        let (session_actor, claimed) = if self.rng.percent(70) {
            ("other", "learner")
        } else {
            ("learner", "other")
        };
        let mut call = match self.rng.below(4) {
            0 => self
                .committed
                .iter()
                .rev()
                .find(|call| call.actor == claimed)
                .cloned()
                .unwrap_or_else(|| self.fresh(claimed)),
            _ => self.fresh(claimed),
        };
        match self.rng.below(4) {
            0 => call.tool = self.rng.pick(&UNKNOWN_TOOLS),
            1 => call.args = Args::Invalid(self.rng.pick(&INVALID_ARGUMENTS)),
            _ => {}
        }
        let workspace = self.workspace();
        self.dispatch(session_actor, workspace, &call).await;
    }

    /// A tool the policy does not have, sometimes on a committed call id.
    async fn unknown_tool(&mut self) {
        let actor = self.actor();
        let mut call = match self.committed.iter().rev().find(|call| call.actor == actor) {
            Some(committed) if self.rng.percent(40) => committed.clone(),
            _ => self.fresh(actor),
        };
        call.tool = self.rng.pick(&UNKNOWN_TOOLS);
        if self.rng.percent(30) {
            call.args = Args::Invalid(self.rng.pick(&INVALID_ARGUMENTS));
        }
        let workspace = self.workspace();
        self.dispatch(actor, workspace, &call).await;
    }

    /// Arguments that fail the schema, sometimes on a committed call id.
    async fn invalid(&mut self) {
        let actor = self.actor();
        let mut call = match self.committed.iter().rev().find(|call| call.actor == actor) {
            Some(committed) if self.rng.percent(40) => committed.clone(),
            _ => self.fresh(actor),
        };
        if self.rng.percent(70) {
            call.args = Args::Invalid(self.rng.pick(&INVALID_ARGUMENTS));
        } else {
            call.tool = if call.tool == "set_ticket" {
                "send_reply"
            } else {
                "set_ticket"
            };
        }
        let workspace = self.workspace();
        self.dispatch(actor, workspace, &call).await;
    }

    /// The reviewer acts on something kept earlier.
    async fn reviewer(&mut self) {
        if self.pool.is_empty() {
            return self.approved().await;
        }
        let entry = self.pool[self.rng.index(self.pool.len())].clone();
        let Some((id, standing)) = self
            .model
            .standing(entry.workspace, &entry.call.fingerprint())
        else {
            return;
        };
        if self.model.kept(&id).is_none() {
            return;
        }
        let verdict = match standing {
            Standing::Pending if self.rng.percent(75) => Verdict::Grant,
            Standing::Pending => Verdict::Deny,
            Standing::Granted if self.rng.percent(40) => Verdict::Revoke,
            _ => self
                .rng
                .pick(&[Verdict::Grant, Verdict::Deny, Verdict::Revoke]),
        };
        if self.review(&id, verdict).await && self.rng.percent(50) {
            self.dispatch(entry.call.actor, entry.workspace, &entry.call)
                .await;
        }
    }

    /// Decide again on something kept earlier.
    async fn decide_again(&mut self) {
        if self.pool.is_empty() {
            return self.approved().await;
        }
        let entry = self.pool[self.rng.index(self.pool.len())].clone();
        self.decide(entry.call.actor, entry.workspace, &entry.call)
            .await;
    }

    async fn time_passes(&mut self) {
        let millis = match self.rng.below(100) {
            0..50 => 1_000 + self.rng.below(29_000),
            50..85 => PENDING_TTL_MS + 1_000 + self.rng.below(100_000),
            _ => GRANT_TTL_MS + 1_000 + self.rng.below(100_000),
        };
        self.advance(millis);
    }

    /// The clock exactly at the end of the oldest receipt's retention, or a
    /// millisecond before, and a new commit right there.
    async fn edge(&mut self) {
        let before = self.rng.below(2);
        let now = self.model.now;
        let Some(deadline) = self
            .model
            .receipts_by_age
            .first()
            .map(|(created_at, _, _)| created_at + self.model.receipt_retention_ms)
            .filter(|deadline| *deadline > now + before)
        else {
            return self.time_passes().await;
        };
        self.advance(deadline - before - now);
        self.approved().await;
    }

    /// Unapproved proposals by one actor until the pending cap refuses two.
    async fn flood(&mut self) {
        let actor = self.actor();
        let mut refused = 0;
        for _ in 0..=MAX_PENDING_PER_ACTOR {
            let call = self.fresh(actor);
            if self.dispatch(actor, "desk", &call).await.is_none() {
                refused += 1;
                if refused == 2 {
                    break;
                }
            } else if self.rng.percent(5) {
                self.keep(&call, "desk");
            }
        }
    }
}

fn check_id(got: &str, want: &Id, known: impl Fn(&str) -> bool, context: &str) {
    match want {
        Id::Empty => assert_eq!(got, "", "{context}"),
        Id::Is(id) => assert_eq!(got, id, "{context}"),
        Id::New => {
            assert!(uuid::Uuid::parse_str(got).is_ok(), "{context}: {got:?}");
            assert!(!known(got), "{context}: {got} was seen before");
        }
    }
}

/// Runs `steps` random steps from `seed`; returns how often each answer came.
async fn run(seed: u64, steps: usize, small_log: Option<(usize, u64)>) -> BTreeMap<String, usize> {
    let text = std::fs::read_to_string(common::repo_path(TICKETS)).expect("tickets");
    let (capacity, retention_seconds) = small_log.unwrap_or((1000, 86_400));
    let text = text
        .replace(
            "receipt_capacity = 1000",
            &format!("receipt_capacity = {capacity}"),
        )
        .replace(
            "receipt_retention_seconds = 86400",
            &format!("receipt_retention_seconds = {retention_seconds}"),
        );
    let policy = Policy::parse(&text, "tickets.toml", None).expect("policy");
    let mut run = Run {
        seed,
        step: 0,
        rng: Rng(seed),
        server: TestServer::start_with(policy).await,
        model: Model::new(capacity, retention_seconds * 1000),
        pool: Vec::new(),
        committed: Vec::new(),
        next_call: 0,
        epochs: HashMap::new(),
        recent_approvals: Vec::new(),
        coverage: BTreeMap::new(),
    };
    for step in 1..=steps {
        run.step = step;
        let tick = run.rng.below(1_500);
        run.advance(tick);
        match run.rng.below(100) {
            0..22 => run.approved().await,
            22..36 => run.again().await,
            36..43 => run.stale().await,
            43..53 => run.replay().await,
            53..61 => run.conflict().await,
            61..70 => run.unapproved().await,
            70..76 => run.wrong_actor().await,
            76..81 => run.unknown_tool().await,
            81..85 => run.invalid().await,
            85..92 => run.reviewer().await,
            92..95 => run.decide_again().await,
            95..97 => run.time_passes().await,
            97..99 => run.edge().await,
            _ => run.flood().await,
        }
        if step % 100 == 0 {
            run.checkpoint().await;
        }
    }
    run.checkpoint().await;
    let Run {
        server, coverage, ..
    } = run;
    server.stop().await;
    coverage
}

/// Every answer of SPEC §6 the run must have met at least once.
const COVERED: [&str; 18] = [
    "dispatch Ok committed",
    "dispatch Ok replayed",
    "dispatch Forbidden forbidden",
    "dispatch UnknownTool unknown-tool",
    "dispatch error InvalidArgument",
    "dispatch CallIdConflict call-id-conflict",
    "dispatch StaleVersion stale-version",
    "dispatch ApprovalRequired approval-required new request",
    "dispatch ApprovalRequired approval-required pending",
    "dispatch ApprovalRequired approval-required after expiry",
    "dispatch ApprovalRequired approval-required after revoke",
    "dispatch ApprovalRequired approval-denied denied",
    "dispatch MissingResource missing-resource",
    "dispatch error ResourceExhausted",
    "decide error ResourceExhausted",
    "dispatch CallIdConflict call-id-conflict in this session",
    "decide Deny call-id-conflict",
    "session counts checked",
];

async fn run_and_check_coverage(seed: u64, steps: usize, small_log: Option<(usize, u64)>) {
    let coverage = run(seed, steps, small_log).await;
    eprintln!("seed {seed:#x}: {coverage:#?}");
    let mut wanted: Vec<&str> = COVERED.to_vec();
    if small_log.is_some() {
        wanted.extend([
            "dispatch LogFull log-full",
            "receipt evicted past retention",
        ]);
    }
    for key in wanted {
        assert!(
            coverage.contains_key(key),
            "seed {seed:#x}: no step produced {key:?}: {coverage:#?}"
        );
    }
}

#[tokio::test]
async fn dispatch_matches_the_model_seed_a() {
    run_and_check_coverage(0x5eed_0001, 1500, None).await;
}

#[tokio::test]
async fn dispatch_matches_the_model_seed_b() {
    run_and_check_coverage(0x5eed_0002, 1500, None).await;
}

#[tokio::test]
async fn dispatch_matches_the_model_seed_c() {
    run_and_check_coverage(0x5eed_0003, 1500, None).await;
}

/// A receipt log of 25 with an hour's retention: LOG_FULL, eviction of old
/// receipts, and call ids whose receipt was evicted.
#[tokio::test]
async fn dispatch_matches_the_model_with_a_small_receipt_log() {
    run_and_check_coverage(0x5eed_0004, 1200, Some((25, 3600))).await;
}
