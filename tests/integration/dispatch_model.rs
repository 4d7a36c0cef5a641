//! A seeded randomized sequence test of Dispatch (SPEC §6) on
//! `examples/tickets.toml`. Thousands of random proposals — approved and
//! fresh, stale, replayed, conflicting, unapproved, denied, revoked, expired,
//! from the wrong actor or workspace, for unknown tools or with bad
//! arguments — go to a real server and to the model of SPEC §4–§6
//! (`support::model`, which the property test shares). Every answer must
//! match the model exactly (status, reason, `replayed`, version, resource,
//! value, approval id, receipt id, fingerprint), and so must the resources,
//! the receipt log, the pending requests, the approvals and each session's
//! charges (SPEC §4 "Charging": every answered call id new to a session
//! costs a decision and a tool attempt, Dispatch included, refusals
//! included) at checkpoints and at the end. Failures name the seed and the
//! step.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use tonic::Code;

use crate::support::model::{
    self, DispatchChange, Effect, Id, Model, Review, Rules, Standing, Tool, Value,
};
use crate::support::policies::{self, TICKETS};
use crate::support::tokens::EXAMPLE_REVIEWER as REVIEWER;
use crate::support::{EPOCH, TestServer, authed, pb, session};
use crate::support::{
    decide_request, deny_request, dispatch_request, grant_request, revoke_request,
};

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

/// tickets.toml for the model, with a receipt log of `receipt_capacity`
/// kept for `receipt_retention_ms`.
fn rules(receipt_capacity: usize, receipt_retention_ms: u64) -> Rules {
    let tool = |name| Tool {
        name,
        approval: true,
        cost: TOOL_COST,
    };
    Rules {
        tools: vec![tool("set_ticket"), tool("send_reply")],
        per_resource_versions: false,
        resources: vec![
            ("lamp", Value::Json(r#""open""#.to_string())),
            ("sensor", Value::Json(r#""open""#.to_string())),
            ("outbox", Value::Queue(Vec::new())),
        ],
        pending_ttl_ms: PENDING_TTL_MS,
        grant_ttl_ms: GRANT_TTL_MS,
        approval_retention_ms: APPROVAL_RETENTION_MS,
        max_pending_per_actor: MAX_PENDING_PER_ACTOR,
        max_decisions: Some(MAX_DECISIONS),
        max_tool_calls: Some(MAX_TOOL_CALLS),
        receipt_capacity,
        receipt_retention_ms,
    }
}

/// The test moves to a fresh session id after this many decisions (the
/// profile allows 1000), or when a session has been idle this long (the
/// server evicts sessions idle for an hour, at a sweep whose time the test
/// does not control).
const SESSION_DECISIONS: u64 = 200;
const SESSION_IDLE_MS: u64 = 3_000_000;
/// The server's `session_idle_seconds` default, in milliseconds.
const SERVER_SESSION_IDLE_MS: u64 = 3_600_000;

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
    /// The call as the model sees it.
    fn model(&self) -> model::Call {
        let effect = match &self.args {
            _ if !self.args.fit(self.tool) => None,
            Args::Ticket { ticket, status } => Some(Effect::Set {
                resource: ticket.to_string(),
                value: format!("\"{status}\""),
            }),
            Args::Reply { .. } => Some(Effect::Append {
                resource: "outbox".to_string(),
                item: self.args.canonical(),
            }),
            Args::Invalid(_) => None,
        };
        model::Call {
            call_id: self.call_id.clone(),
            actor: self.actor.to_string(),
            tool: self.tool.to_string(),
            version: self.version,
            arguments: self.args.canonical(),
            effect,
        }
    }

    fn fingerprint(&self) -> String {
        self.model().fingerprint()
    }

    fn proposal(&self, respell: bool) -> pb::Proposal {
        let arguments_json = if respell {
            self.args.respelled()
        } else {
            self.args.canonical()
        };
        crate::support::proposal(
            &self.call_id,
            self.actor,
            self.tool,
            self.version,
            &arguments_json,
        )
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

    /// The state's one version (tickets.toml's version scope is global).
    fn state_version(&self) -> u64 {
        self.model.version("lamp")
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
                .session(&format!("{actor}-{workspace}-{epoch}"))
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
            version: self.state_version(),
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
        let modelled = call.model();
        let (expected, change, charge) =
            self.model
                .predict_dispatch(&session.session_id, actor, workspace, &modelled);
        let answer = self
            .server
            .pdp()
            .dispatch(dispatch_request(session.clone(), call.proposal(respell)))
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
                assert_eq!(response.fingerprint, modelled.fingerprint(), "{context}");
                let known = &self.model;
                check_id(
                    &response.approval_id,
                    &expect.approval_id,
                    |id| known.knows_approval(id),
                    &format!("{context}: approval id"),
                );
                check_id(
                    &response.receipt_id,
                    &expect.receipt_id,
                    |id| known.knows_receipt(id),
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
                let receipts = self.model.receipt_count();
                self.model.settle(&session.session_id, &modelled, charge);
                self.model.apply_dispatch(
                    change,
                    &session.session_id,
                    &response.approval_id,
                    &response.receipt_id,
                );
                if commit {
                    self.committed.push(call.clone());
                    if self.model.receipt_count() == receipts {
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
        let modelled = call.model();
        let (expected, change) =
            self.model
                .predict_decide(&session.session_id, actor, workspace, &modelled);
        let answer = self
            .server
            .pdp()
            .decide(decide_request(session.clone(), call.proposal(respell)))
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
                assert_eq!(response.fingerprint, modelled.fingerprint(), "{context}");
                let known = &self.model;
                check_id(
                    &response.approval_id,
                    &expect.approval_id,
                    |id| known.knows_approval(id),
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
            &modelled,
            response
                .as_ref()
                .map(|response| response.approval_id.as_str()),
        );
        response
    }

    /// Grant, deny or revoke; true when the reviewer's verdict took effect.
    async fn review(&mut self, approval_id: &str, verdict: Review) -> bool {
        let expected = self.model.predict_review(approval_id, verdict);
        let mut approvals = self.server.approvals();
        let answer = match verdict {
            Review::Grant => {
                let request = grant_request(approval_id, "looks right");
                approvals.grant_approval(authed(request, REVIEWER)).await
            }
            Review::Deny => {
                let request = deny_request(approval_id, "not this one");
                approvals.deny_approval(authed(request, REVIEWER)).await
            }
            Review::Revoke => {
                let request = revoke_request(approval_id, "changed my mind");
                approvals.revoke_approval(authed(request, REVIEWER)).await
            }
        }
        .map(tonic::Response::into_inner);
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
                    _ => self.model.approval(approval_id).expires_at,
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
                (
                    self.model.resource_json(name).as_str(),
                    self.state_version()
                ),
                "{context}: resource {name}"
            );
        }
        // A sweep at the current time processes every expiry that is due.
        self.server.engine.sweep().await.expect("sweep");
        let stats = self.server.engine.stats().expect("stats");
        assert_eq!(
            (stats.receipts, stats.pending_approvals),
            (self.model.receipt_count(), self.model.pending_total()),
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
            let Some(record) = self.model.session(&session_id) else {
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
            let record = self.model.approval(&id);
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
                Review::Grant
            } else {
                Review::Deny
            };
            if self.review(&decision.approval_id, verdict).await
                && verdict == Review::Grant
                && self.rng.percent(5)
            {
                self.review(&decision.approval_id, Review::Revoke).await;
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
        call.version = if self.state_version() > 0 && self.rng.percent(70) {
            self.rng.below(self.state_version())
        } else {
            self.state_version() + 1 + self.rng.below(3)
        };
        if self.rng.percent(30)
            && let Some(decision) = self.decide(actor, workspace, &call).await
            && decision.outcome() == pb::Outcome::RequireApproval
        {
            self.review(&decision.approval_id, Review::Grant).await;
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
            1 => call.version = self.state_version().max(call.version + 1),
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
            self.review(&decision.approval_id, Review::Grant).await;
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
            Standing::Pending if self.rng.percent(75) => Review::Grant,
            Standing::Pending => Review::Deny,
            Standing::Granted if self.rng.percent(40) => Review::Revoke,
            _ => self
                .rng
                .pick(&[Review::Grant, Review::Deny, Review::Revoke]),
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
            .oldest_receipt_retention_end()
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
    let text = std::fs::read_to_string(policies::repo_path(TICKETS)).expect("tickets");
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
    let policy = policies::parse(&text);
    let mut run = Run {
        seed,
        step: 0,
        rng: Rng(seed),
        server: TestServer::start_with(policy).await,
        model: Model::new(rules(capacity, retention_seconds * 1000), EPOCH.0),
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
