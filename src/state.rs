//! `State`: everything toolgate remembers between calls. Every RPC is one
//! method on this one type, called with the policy snapshot and the time, so
//! that a durable or replicated backend can implement the same operations.

pub(crate) mod table;

use std::collections::HashMap;
use std::sync::Arc;

use uuid::Uuid;

use crate::canonical::Fingerprint;
use crate::canonical::Value;
use crate::clock::Timestamp;
use crate::dispatch::{
    self, CommitResult, DispatchStatus, Dispatched, PageError, PagePosition, Receipt, ReceiptLog,
    ResourcePage, Resources, Target,
};
use crate::error::{Error, Result};
use crate::ledger::{
    Approval, ApprovalEvent, ApprovalRef, Ledger, ListQuery, NewApproval, Page, Standing, Verdict,
};
use crate::manifest::{self, Assessment, LastAssessment, Manifest, ManifestStatus, PinReference};
use crate::policy::{Limits, Mode, Policy, Tool};
use crate::proposal::{self, Proposal, Refusal, Screened, SessionRef};
use crate::session::{self, Budget, CallStanding, Charge, SessionSummary, Sessions};

/// Most pins that may be made through the API.
pub const MAX_API_PINS: usize = 1024;

/// A pin made by a reviewer through `PinManifest`; survives policy reloads.
#[derive(Debug, Clone)]
pub struct ApiPin {
    pub manifest: Arc<Manifest>,
    pub fingerprint: Fingerprint,
    pub pinned_by: String,
    pub pinned_at: Timestamp,
}

impl PinReference for ApiPin {
    fn pinned_fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    fn pinned_manifest(&self) -> Option<&Manifest> {
        Some(&self.manifest)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PinSource {
    Policy,
    Api,
}

/// A pin as reported to reviewers.
#[derive(Debug, Clone, PartialEq)]
pub struct PinRecord {
    pub server_id: String,
    pub fingerprint: Fingerprint,
    pub revision: Option<String>,
    pub source: PinSource,
    pub pinned_by: Option<String>,
    pub pinned_at: Option<Timestamp>,
    pub tool_count: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Allow,
    Deny,
    RequireApproval,
}

/// The answer to Decide (SPEC §4).
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    pub outcome: Outcome,
    /// Stable kebab-case reason.
    pub reason: &'static str,
    pub message: String,
    pub fingerprint: Fingerprint,
    /// The approval involved, with its expiry.
    pub approval: Option<(Uuid, Timestamp)>,
}

impl Decision {
    pub fn deny(proposal: &Proposal, reason: &'static str, message: String) -> Self {
        Decision {
            outcome: Outcome::Deny,
            reason,
            message,
            fingerprint: proposal.fingerprint,
            approval: None,
        }
    }

    fn refused(refusal: Refusal, proposal: &Proposal, session: &SessionRef) -> Self {
        Decision::deny(
            proposal,
            refusal.reason(),
            refusal.message(proposal, session),
        )
    }
}

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
}

/// One page of resources (ListResources). (A page of one queue is a
/// [`dispatch::ResourcePage`].)
#[derive(Debug, Clone, Default)]
pub struct ResourceList {
    /// In name order.
    pub resources: Vec<ListedResource>,
    /// The name to continue after, when more follow.
    pub next: Option<String>,
}

/// One resource of a [`ResourceList`], listed whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListedResource {
    pub name: String,
    /// The value as canonical JSON.
    pub value_json: String,
    pub version: u64,
    /// For a queue: how many items it holds (as GetResource says).
    pub item_count: Option<u64>,
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

/// What the ledger holds for a proposal that needs approval, after making
/// a request if there was none usable.
enum Gate {
    Granted(ApprovalRef),
    /// With the answer's message, which carries the reviewer's reason.
    Denied(ApprovalRef, String),
    /// With the request event when this call made the request.
    Pending(ApprovalRef, Option<Box<ApprovalEvent>>),
}

/// The message of a Decide or Dispatch refused because a reviewer denied
/// the proposal: the reviewer's reason, when they gave one, reaches the host.
fn denial_message(reason: &str) -> String {
    if reason.is_empty() {
        "a reviewer denied this exact proposal".to_string()
    } else {
        format!("a reviewer denied this exact proposal: {reason}")
    }
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
        }
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

    /// The approval standing of a proposal that needs approval; a new pending
    /// request is made when there is none usable (SPEC §4 step 8, §6 step 6).
    fn approval_gate(
        &mut self,
        policy: &Policy,
        now: Timestamp,
        session_ref: &SessionRef,
        proposal: &Proposal,
        tool: &Tool,
        reason: &'static str,
    ) -> Result<Gate> {
        let standing = self
            .ledger
            .standing(&session_ref.workspace, proposal.fingerprint);
        Ok(match standing {
            Standing::Granted(approval) => Gate::Granted(approval),
            Standing::Denied(approval) => {
                let reason = self
                    .ledger
                    .get(approval.id)
                    .map(|record| record.decision_note.as_str())
                    .unwrap_or("");
                Gate::Denied(approval, denial_message(reason))
            }
            Standing::Pending(approval) => Gate::Pending(approval, None),
            Standing::None => {
                let new = NewApproval {
                    fingerprint: proposal.fingerprint,
                    host: session_ref.host.clone(),
                    actor: session_ref.actor.clone(),
                    session_id: session_ref.session_id.clone(),
                    workspace: session_ref.workspace.clone(),
                    tool: tool.name.clone(),
                    call_id: proposal.call_id.clone(),
                    version: proposal.version,
                    arguments_view: proposal::redacted_arguments(tool, &proposal.arguments),
                    reason,
                };
                let limit = policy.limits.max_approval_argument_bytes;
                if new.arguments_view.len() > limit {
                    return Err(Error::invalid(
                        "proposal.arguments_json",
                        format!(
                            "a request for approval holds at most {limit} bytes of arguments \
                             (limits.max_approval_argument_bytes); these are {} (canonical, \
                             sensitive fields redacted)",
                            new.arguments_view.len()
                        ),
                    ));
                }
                self.ledger.check_capacity(
                    &session_ref.host,
                    &session_ref.actor,
                    &policy.limits,
                )?;
                self.make_byte_room(new.bytes(), now, &policy.limits)?;
                let event = self.ledger.create(new, now, &policy.limits);
                Gate::Pending(ApprovalRef::from(&event.approval), Some(Box::new(event)))
            }
        })
    }

    /// What the ledger, the receipt log and the sessions' remembered call
    /// ids count together under `limits.max_state_bytes`.
    pub fn state_bytes(&self) -> usize {
        self.ledger
            .bytes()
            .saturating_add(self.receipts.bytes())
            .saturating_add(self.sessions.decided_bytes())
            .saturating_add(self.charging_bytes)
    }

    /// Room for `needed` more bytes under `limits.max_state_bytes`. Only
    /// what exactly-once does not need is evicted to make it: receipts past
    /// retention first, then finished approval records, oldest first — and
    /// only when that makes enough room. Otherwise RESOURCE_EXHAUSTED, and
    /// nothing changes.
    fn make_byte_room(&mut self, needed: usize, now: Timestamp, limits: &Limits) -> Result<()> {
        let used = self.state_bytes();
        let budget = limits.max_state_bytes;
        let excess = used.saturating_add(needed).saturating_sub(budget);
        if excess == 0 {
            return Ok(());
        }
        let from_receipts = self.receipts.evictable_bytes(now, limits, excess);
        if from_receipts.saturating_add(self.ledger.evictable_bytes()) < excess {
            return Err(Error::ResourceExhausted(format!(
                "the state holds {used} of its {budget} bytes (limits.max_state_bytes) in \
                 live approvals, receipts within retention and remembered call ids; \
                 {needed} more do not fit"
            )));
        }
        let freed = self.receipts.evict_bytes(now, limits, excess);
        self.ledger.evict_bytes(excess.saturating_sub(freed));
        Ok(())
    }

    /// SPEC §4 step 4: a tool of a manifest server needs a matching assessment.
    fn manifest_gate(&self, policy: &Policy, tool: &Tool) -> Result<(), Refusal> {
        match &tool.server {
            Some(server) => match self.manifest_status(policy, server) {
                ManifestStatus::Verified => Ok(()),
                status => Err(Refusal::ManifestUnverified(status)),
            },
            None => Ok(()),
        }
    }

    /// Decide (SPEC §4). The policy-only steps (2, 3 and the schema check of
    /// 5) were screened without the lock; their answers are reported here in
    /// the contract's order. Every answer is charged to the session as SPEC
    /// §4 "Charging" says; an error changes nothing. Returns the decision and
    /// the approval request it created, if any. The engine expires due
    /// approvals first.
    pub fn decide(
        &mut self,
        policy: &Policy,
        now: Timestamp,
        session_ref: &SessionRef,
        proposal: &Proposal,
        screened: Screened<'_>,
    ) -> Result<(Decision, Option<ApprovalEvent>)> {
        self.charged(policy, now, session_ref, proposal, |state, standing| {
            let (decision, created, refused) =
                state.decide_steps(policy, now, session_ref, proposal, screened, standing)?;
            Ok(((decision, created), refused))
        })
    }

    /// Charging (SPEC §4 "Charging"), shared by Decide and Dispatch: the
    /// session id's binding, room for the session if it is new and room in
    /// the byte budget for the call id if it will be remembered — all before
    /// anything changes — then the call's steps, then the charge of their
    /// answer, settled on the session. `steps` also returns the budget that
    /// refused the call, if one did.
    fn charged<T>(
        &mut self,
        policy: &Policy,
        now: Timestamp,
        session_ref: &SessionRef,
        proposal: &Proposal,
        steps: impl FnOnce(&mut Self, CallStanding) -> Result<(T, Option<&'static str>)>,
    ) -> Result<T> {
        self.sessions.check_binding(session_ref)?;
        self.sessions.reserve(session_ref, now, &policy.limits)?;
        let standing = CallStanding::of(
            self.sessions.find(session_ref),
            &proposal.call_id,
            proposal.fingerprint,
        );
        // Every call id remembered counts under the byte budget, whatever
        // the answer: room for it now, or RESOURCE_EXHAUSTED and no change.
        let budget = Budget::of(policy.actors.get(&session_ref.actor));
        let call_bytes =
            self.sessions
                .bytes_to_remember(session_ref, &proposal.call_id, standing, &budget);
        if call_bytes > 0 {
            self.make_byte_room(call_bytes, now, &policy.limits)?;
        }
        self.charging_bytes = call_bytes;
        let answered = steps(self, standing);
        self.charging_bytes = 0;
        let (answer, refused) = answered?;
        let charge = Charge::of(standing, is_tool_call(policy, proposal), refused);
        // Counts the bytes of a call id it remembers.
        self.sessions.settle(
            session_ref,
            &proposal.call_id,
            proposal.fingerprint,
            charge,
            now,
            &policy.limits,
        )?;
        Ok(answer)
    }

    /// SPEC §4 steps 2–8 for a call of this standing; also returns the
    /// budget that refused it, if one did.
    fn decide_steps(
        &mut self,
        policy: &Policy,
        now: Timestamp,
        session_ref: &SessionRef,
        proposal: &Proposal,
        screened: Screened<'_>,
        standing: CallStanding,
    ) -> Result<(Decision, Option<ApprovalEvent>, Option<&'static str>)> {
        // Charging: once the decisions are spent, a new call id is refused
        // before anything else, and costs nothing.
        let budget = Budget::of(policy.actors.get(&session_ref.actor));
        if standing == CallStanding::New && budget.decisions_spent(self.sessions.find(session_ref))
        {
            let reason = "decision-budget";
            let message = session::refusal_message(reason, &proposal.call_id);
            return Ok((
                Decision::deny(proposal, reason, message),
                None,
                Some(reason),
            ));
        }
        // Steps 2–3.
        let (admitted, schema) = match screened {
            Ok(screened) => screened,
            Err(refusal) => {
                return Ok((
                    Decision::refused(refusal, proposal, session_ref),
                    None,
                    None,
                ));
            }
        };
        let tool = admitted.tool;
        // Step 4: the manifest gate.
        if let Err(refusal) = self.manifest_gate(policy, tool) {
            return Ok((
                Decision::refused(refusal, proposal, session_ref),
                None,
                None,
            ));
        }
        // Step 5: the input schema.
        schema?;
        // Step 6: the session budget.
        let is_tool_call = tool.mode == Mode::Execute;
        if let Some(reason) =
            budget.check(standing, self.sessions.find(session_ref), is_tool_call, now)
        {
            let message = session::refusal_message(reason, &proposal.call_id);
            return Ok((
                Decision::deny(proposal, reason, message),
                None,
                Some(reason),
            ));
        }
        // Step 7: no approval needed; step 8: the ledger.
        let approval_reason = match tool.mode {
            Mode::Execute => proposal::approval_reason(tool, admitted.profile, &proposal.arguments),
            _ => None,
        };
        let (decision, created) = match approval_reason {
            None => (
                Decision {
                    outcome: Outcome::Allow,
                    reason: "allowed",
                    message: format!("{:?} may run", proposal.name),
                    fingerprint: proposal.fingerprint,
                    approval: None,
                },
                None,
            ),
            Some(reason) => {
                match self.approval_gate(policy, now, session_ref, proposal, tool, reason)? {
                    Gate::Granted(approval) => (
                        Decision {
                            outcome: Outcome::Allow,
                            reason: "approved",
                            message: "approved by a reviewer; Dispatch consumes the grant"
                                .to_string(),
                            fingerprint: proposal.fingerprint,
                            approval: Some((approval.id, approval.expires_at)),
                        },
                        None,
                    ),
                    Gate::Denied(approval, message) => (
                        Decision {
                            outcome: Outcome::Deny,
                            reason: "approval-denied",
                            message,
                            fingerprint: proposal.fingerprint,
                            approval: Some((approval.id, approval.expires_at)),
                        },
                        None,
                    ),
                    Gate::Pending(approval, created) => (
                        Decision {
                            outcome: Outcome::RequireApproval,
                            reason: approval.reason,
                            message: "a reviewer must approve this exact proposal".to_string(),
                            fingerprint: proposal.fingerprint,
                            approval: Some((approval.id, approval.expires_at)),
                        },
                        created,
                    ),
                }
            }
        };
        Ok((decision, created.map(|event| *event), None))
    }

    /// Dispatch (SPEC §6), in the contract's order, in one critical section:
    /// a refusal changes no resource, version, grant or receipt; a commit
    /// applies the effect, bumps the version, consumes the grant and stores
    /// the receipt together. A call id the session never decided is charged
    /// and checked as a Decide of it first (SPEC §4 "Charging"); a decided
    /// one costs nothing more and keeps the budget verdict it got. Returns
    /// the answer and the ledger transitions (a request made, a grant
    /// consumed).
    pub fn dispatch(
        &mut self,
        policy: &Policy,
        now: Timestamp,
        session_ref: &SessionRef,
        proposal: &Proposal,
        screened: Screened<'_>,
    ) -> Result<(Dispatched, Vec<ApprovalEvent>)> {
        // 1. The session id's binding (the envelope was checked at the
        // edge), room for the session if it is new, and the charge.
        self.charged(policy, now, session_ref, proposal, |state, standing| {
            let (dispatched, events, refused) =
                state.dispatch_steps(policy, now, session_ref, proposal, screened, standing)?;
            Ok(((dispatched, events), refused))
        })
    }

    /// SPEC §6 steps 2–3 and the session budget of SPEC §4 step 6, then the
    /// commit steps; also returns the budget that refused it, if one did.
    fn dispatch_steps(
        &mut self,
        policy: &Policy,
        now: Timestamp,
        session_ref: &SessionRef,
        proposal: &Proposal,
        screened: Screened<'_>,
        standing: CallStanding,
    ) -> Result<(Dispatched, Vec<ApprovalEvent>, Option<&'static str>)> {
        let fingerprint = proposal.fingerprint;
        let refuse = |status: DispatchStatus, reason: &'static str, message: String| {
            Ok((
                Dispatched::refused(status, reason, message, fingerprint),
                Vec::new(),
                None,
            ))
        };
        let budget = Budget::of(policy.actors.get(&session_ref.actor));
        if standing == CallStanding::New && budget.decisions_spent(self.sessions.find(session_ref))
        {
            let reason = "decision-budget";
            let message = session::refusal_message(reason, &proposal.call_id);
            let refused = Dispatched::refused(DispatchStatus::Denied, reason, message, fingerprint);
            return Ok((refused, Vec::new(), Some(reason)));
        }
        // 2–3. Actor, tool, policy refusals, schema.
        let (admitted, schema) = match screened {
            Ok(screened) => screened,
            Err(refusal) => {
                let status = match refusal {
                    Refusal::Forbidden => DispatchStatus::Forbidden,
                    Refusal::UnknownTool => DispatchStatus::UnknownTool,
                    _ => DispatchStatus::Denied,
                };
                return refuse(
                    status,
                    refusal.reason(),
                    refusal.message(proposal, session_ref),
                );
            }
        };
        let tool = admitted.tool;
        if let Err(refusal) = self.manifest_gate(policy, tool) {
            return refuse(
                DispatchStatus::Denied,
                refusal.reason(),
                refusal.message(proposal, session_ref),
            );
        }
        if tool.mode != Mode::Execute {
            return refuse(
                DispatchStatus::Denied,
                "not-dispatchable",
                format!(
                    "{:?} is a {:?} tool; only execute tools are committed through Dispatch",
                    tool.name, tool.mode
                ),
            );
        }
        schema?;
        // The session budget, as Decide's step 6 would answer.
        if let Some(reason) = budget.check(standing, self.sessions.find(session_ref), true, now) {
            let status = match reason {
                "call-id-conflict" => DispatchStatus::CallIdConflict,
                _ => DispatchStatus::Denied,
            };
            let message = session::refusal_message(reason, &proposal.call_id);
            let refused = Dispatched::refused(status, reason, message, fingerprint);
            return Ok((refused, Vec::new(), Some(reason)));
        }
        let (dispatched, events) =
            self.commit_steps(policy, now, session_ref, proposal, admitted)?;
        Ok((dispatched, events, None))
    }

    /// SPEC §6 steps 4–9 for a proposal that passed steps 1–3.
    fn commit_steps(
        &mut self,
        policy: &Policy,
        now: Timestamp,
        session_ref: &SessionRef,
        proposal: &Proposal,
        admitted: proposal::Admitted<'_>,
    ) -> Result<(Dispatched, Vec<ApprovalEvent>)> {
        let fingerprint = proposal.fingerprint;
        let refuse = |status: DispatchStatus, reason: &'static str, message: String| {
            Ok((
                Dispatched::refused(status, reason, message, fingerprint),
                Vec::new(),
            ))
        };
        let tool = admitted.tool;
        // 4. A receipt for this call id.
        if let Some(receipt) =
            self.receipts
                .get(&session_ref.host, &proposal.actor, &proposal.call_id)
        {
            if receipt.fingerprint != fingerprint {
                return refuse(
                    DispatchStatus::CallIdConflict,
                    "call-id-conflict",
                    format!(
                        "call id {:?} was committed for a different proposal",
                        proposal.call_id
                    ),
                );
            }
            return Ok((
                Dispatched {
                    status: DispatchStatus::Ok,
                    reason: "replayed",
                    message: "the stored receipt of the earlier commit".to_string(),
                    fingerprint,
                    result: Some(receipt.result.clone()),
                    receipt_id: Some(receipt.id),
                    replayed: true,
                    approval_id: None,
                },
                Vec::new(),
            ));
        }
        // 5. The version the proposal was made against.
        let target = dispatch::target(&tool.effect, &proposal.arguments);
        // Before anything can need approval: an answer that could not be
        // sent is never committed (the host could never read its receipt).
        let carried = target.as_ref().ok().and_then(Resources::carried_value);
        check_answer_size(carried.as_ref(), policy.server.max_message_bytes)?;
        let current = match &target {
            Ok(target) => self.resources.version_for(target),
            Err(_) => self.resources.version_for(&Target::Nothing),
        };
        if proposal.version != current {
            let mut stale = Dispatched::refused(
                DispatchStatus::StaleVersion,
                "stale-version",
                format!(
                    "the proposal was made against version {}, the state is at {current}",
                    proposal.version
                ),
                fingerprint,
            );
            stale.result = Some(CommitResult {
                version: current,
                resource: None,
                value: None,
                appended_index: None,
            });
            return Ok((stale, Vec::new()));
        }
        // 6. The approval.
        let mut events = Vec::new();
        let grant = match proposal::approval_reason(tool, admitted.profile, &proposal.arguments) {
            None => None,
            Some(reason) => {
                match self.approval_gate(policy, now, session_ref, proposal, tool, reason)? {
                    Gate::Granted(approval) => Some(approval.id),
                    Gate::Denied(approval, message) => {
                        let mut refused = Dispatched::refused(
                            DispatchStatus::ApprovalRequired,
                            "approval-denied",
                            message,
                            fingerprint,
                        );
                        refused.approval_id = Some(approval.id);
                        return Ok((refused, events));
                    }
                    Gate::Pending(approval, created) => {
                        let mut refused = Dispatched::refused(
                            DispatchStatus::ApprovalRequired,
                            approval.reason,
                            "a reviewer must grant this exact proposal before it is committed"
                                .to_string(),
                            fingerprint,
                        );
                        refused.approval_id = Some(approval.id);
                        events.extend(created.map(|event| *event));
                        return Ok((refused, events));
                    }
                }
            }
        };
        // 7. The target resource.
        let target = match target.and_then(|target| self.resources.check(&target).map(|()| target))
        {
            Ok(target) => target,
            Err(message) => {
                return refuse(DispatchStatus::MissingResource, "missing-resource", message);
            }
        };
        // 8. Room in the receipt log.
        if !self.receipts.make_room(now, &policy.limits) {
            return refuse(
                DispatchStatus::LogFull,
                "log-full",
                format!(
                    "the receipt log holds {} receipts, none past retention",
                    policy.limits.receipt_capacity
                ),
            );
        }
        // 8b. Room for the receipt in the byte budget.
        let receipt_bytes = dispatch::receipt_bytes(
            &session_ref.host,
            &proposal.actor,
            &proposal.call_id,
            target.resource(),
            carried.as_ref(),
        );
        self.make_byte_room(receipt_bytes, now, &policy.limits)?;
        // 9. Commit: all of it, under this one lock, with nothing left that can fail.
        self.sessions
            .open(session_ref, now, &policy.limits)?
            .executed(tool.cost);
        if let Some(grant) = grant {
            events.push(self.ledger.consume(grant, now)?);
        }
        let result = self.resources.apply(&target, carried);
        let receipt = Receipt {
            id: Uuid::new_v4(),
            fingerprint,
            result: result.clone(),
            created_at: now,
        };
        let receipt_id = receipt.id;
        self.receipts.insert(
            &session_ref.host,
            &proposal.actor,
            &proposal.call_id,
            receipt,
        );
        Ok((
            Dispatched {
                status: DispatchStatus::Ok,
                reason: "committed",
                message: format!("{:?} committed", tool.name),
                fingerprint,
                result: Some(result),
                receipt_id: Some(receipt_id),
                replayed: false,
                approval_id: grant,
            },
            events,
        ))
    }

    /// A resource's value and version (GetResource).
    pub fn resource(&self, name: &str) -> Result<(Value, u64)> {
        self.resources
            .get(name)
            .map(|(value, version)| (value.clone(), version))
            .ok_or_else(|| Error::NotFound(format!("no resource {name:?}")))
    }

    /// One page of a resource (GetResource): a queue a page at a time.
    pub fn resource_page(
        &self,
        name: &str,
        start: Option<PagePosition>,
        max_items: usize,
        max_bytes: usize,
    ) -> Result<ResourcePage> {
        self.resources
            .page(name, start, max_items, max_bytes)
            .map_err(|error| match error {
                PageError::NotFound => Error::NotFound(format!("no resource {name:?}")),
                PageError::NotAQueue => Error::invalid(
                    "page_token",
                    format!("resource {name:?} is not a queue; it is read whole, without a token"),
                ),
                PageError::BadIndex => Error::invalid(
                    "page_token",
                    "is not a page token this server issued for this resource",
                ),
                PageError::Replaced => Error::FailedPrecondition(format!(
                    "resource {name:?} was replaced since the page token was issued; read it \
                     again from the first page"
                )),
            })
    }

    /// A session of host `host` (GetSession).
    pub fn session(
        &self,
        host: &str,
        session_id: &str,
        decision_cost: u64,
    ) -> Result<SessionSummary> {
        self.sessions
            .get(host, session_id)
            .map(|session| session.summary(decision_cost))
            .ok_or_else(|| Error::NotFound(format!("no session {session_id:?}")))
    }

    /// Expires due approvals (exactly at their deadline, before any
    /// operation reads the ledger) and evicts finished records past retention.
    pub fn expire_due(&mut self, policy: &Policy, now: Timestamp) -> Vec<ApprovalEvent> {
        self.ledger.expire_due(now, &policy.limits)
    }

    /// Periodic sweep: also evicts idle sessions.
    pub fn sweep(&mut self, policy: &Policy, now: Timestamp) -> Vec<ApprovalEvent> {
        self.sessions.evict_idle(now, &policy.limits);
        self.ledger.expire_due(now, &policy.limits)
    }

    pub fn get_approval(&self, id: Uuid) -> Result<Approval> {
        self.ledger.get(id).cloned()
    }

    pub fn list_approvals(&self, policy: &Policy, query: &ListQuery) -> Page {
        self.ledger.list(query, policy)
    }

    /// Resources in name order after `after` as (name, canonical JSON,
    /// version): at most `page_size` of them and about `max_bytes` (at
    /// least one). The name to continue after, when more follow.
    pub fn list_resources(
        &self,
        after: Option<&str>,
        page_size: usize,
        max_bytes: usize,
    ) -> ResourceList {
        let mut page: Vec<ListedResource> = Vec::new();
        let mut bytes = 0usize;
        for name in self.resources.names() {
            if after.is_some_and(|after| name <= after) {
                continue;
            }
            let Some((value, version)) = self.resources.get(name) else {
                continue;
            };
            if page.len() == page_size {
                let next = page.last().map(|listed| listed.name.clone());
                return ResourceList {
                    resources: page,
                    next,
                };
            }
            let value_json = crate::canonical::to_canonical(value);
            let size = name.len() + value_json.len();
            if !page.is_empty() && bytes.saturating_add(size) > max_bytes {
                let next = page.last().map(|listed| listed.name.clone());
                return ResourceList {
                    resources: page,
                    next,
                };
            }
            bytes = bytes.saturating_add(size);
            let item_count = match value {
                Value::Array(items) => Some(items.len() as u64),
                _ => None,
            };
            page.push(ListedResource {
                name: name.to_string(),
                value_json,
                version,
                item_count,
            });
        }
        ResourceList {
            resources: page,
            next: None,
        }
    }

    /// Grant, deny or revoke (SPEC §5) by the authenticated reviewer.
    pub fn review(
        &mut self,
        policy: &Policy,
        now: Timestamp,
        id: Uuid,
        verdict: Verdict,
        reviewer: &str,
        note: String,
    ) -> Result<ApprovalEvent> {
        self.ledger.decide(id, verdict, reviewer, note, policy, now)
    }
    /// The pin in force: an API pin overrides the policy file's.
    fn pin<'a>(&'a self, policy: &'a Policy, server_id: &str) -> Option<&'a dyn PinReference> {
        match self.api_pins.get(server_id) {
            Some(api_pin) => Some(api_pin),
            None => policy
                .pins
                .get(server_id)
                .map(|pin| pin as &dyn PinReference),
        }
    }

    /// AssessManifest: compares with the pin in force and remembers the
    /// result for pinned servers (unpinned ones are not remembered, so a
    /// flood of made-up server ids cannot grow the state).
    pub fn assess_manifest(&mut self, policy: &Policy, manifest: &Manifest) -> Assessment {
        let pin = self.pin(policy, &manifest.server_id);
        let assessment = manifest::assess(manifest, pin);
        if pin.is_some() {
            self.last_assessed.insert(
                manifest.server_id.clone(),
                LastAssessment::from(&assessment),
            );
        }
        assessment
    }

    /// True when the server has a pin and its latest assessment matched the
    /// pin in force now (a later re-pin needs a new assessment).
    pub fn manifest_verified(&self, policy: &Policy, server_id: &str) -> bool {
        self.manifest_status(policy, server_id) == ManifestStatus::Verified
    }

    /// Why a manifest server's tools may or may not be decided on.
    pub fn manifest_status(&self, policy: &Policy, server_id: &str) -> ManifestStatus {
        ManifestStatus::of(
            self.pin(policy, server_id),
            self.last_assessed.get(server_id),
        )
    }

    pub fn pin_manifest(
        &mut self,
        now: Timestamp,
        reviewer: &str,
        manifest: Manifest,
        expected: Option<Fingerprint>,
    ) -> Result<PinRecord> {
        if let Err(error) = crate::ids::check_server_id("server", &manifest.server_id) {
            return Err(Error::FailedPrecondition(format!(
                "server id {:?} cannot be pinned ({error}); nothing was pinned",
                manifest.server_id
            )));
        }
        if let Some(problem) = manifest.problems().first() {
            return Err(Error::FailedPrecondition(format!(
                "an unsafe manifest cannot be pinned: {problem}; nothing was pinned"
            )));
        }
        let fingerprint = manifest.fingerprint();
        if let Some(expected) = expected
            && expected != fingerprint
        {
            return Err(Error::FailedPrecondition(format!(
                "manifest fingerprint is {fingerprint}, not the expected {expected}; nothing was pinned"
            )));
        }
        if !self.api_pins.contains_key(&manifest.server_id) && self.api_pins.len() >= MAX_API_PINS {
            return Err(Error::ResourceExhausted(format!(
                "at most {MAX_API_PINS} pins may be made through the API"
            )));
        }
        let api_pin = ApiPin {
            manifest: Arc::new(manifest),
            fingerprint,
            pinned_by: reviewer.to_string(),
            pinned_at: now,
        };
        let record = api_pin_record(&api_pin);
        self.api_pins.insert(record.server_id.clone(), api_pin);
        Ok(record)
    }

    /// Pins in force, sorted by server id.
    pub fn list_pins(&self, policy: &Policy) -> Vec<PinRecord> {
        let mut records: Vec<PinRecord> = self.api_pins.values().map(api_pin_record).collect();
        records.extend(
            policy
                .pins
                .values()
                .filter(|pin| !self.api_pins.contains_key(&pin.server_id))
                .map(|pin| PinRecord {
                    server_id: pin.server_id.clone(),
                    fingerprint: pin.fingerprint,
                    revision: pin
                        .manifest
                        .as_ref()
                        .map(|manifest| manifest.revision.clone()),
                    source: PinSource::Policy,
                    pinned_by: None,
                    pinned_at: None,
                    tool_count: pin
                        .manifest
                        .as_ref()
                        .map_or(0, |manifest| manifest.tools.len()),
                }),
        );
        records.sort_by(|left, right| left.server_id.cmp(&right.server_id));
        records
    }

    /// Removes an API pin. A policy pin is changed by editing the policy.
    pub fn remove_pin(&mut self, policy: &Policy, server_id: &str) -> Result<PinRecord> {
        if let Some(api_pin) = self.api_pins.remove(server_id) {
            if !policy.pins.contains_key(server_id) {
                self.last_assessed.remove(server_id);
            }
            return Ok(api_pin_record(&api_pin));
        }
        if policy.pins.contains_key(server_id) {
            return Err(Error::FailedPrecondition(format!(
                "the pin for {server_id:?} is declared in the policy file; edit the policy to change it"
            )));
        }
        Err(Error::NotFound(format!("no pin for server {server_id:?}")))
    }
}

/// Refuses a commit whose answer would exceed the message limit (see
/// [`dispatch::ANSWER_OVERHEAD_BYTES`]).
fn check_answer_size(carried: Option<&crate::canonical::Value>, limit: usize) -> Result<()> {
    let Some(value) = carried else {
        return Ok(());
    };
    let value_json = crate::canonical::to_canonical(value).len();
    let answer = value_json.saturating_add(dispatch::ANSWER_OVERHEAD_BYTES);
    if answer > limit {
        return Err(Error::invalid(
            "proposal.arguments_json",
            format!(
                "committing it would answer with {value_json} bytes of value_json (up to \
                 {answer} bytes in all), over the {limit}-byte message limit \
                 (server.max_message_bytes); nothing was committed"
            ),
        ));
    }
    Ok(())
}

/// Whether a call of this proposal's tool costs a tool attempt: an unknown
/// tool or an `execute` one (SPEC §4 "Charging").
fn is_tool_call(policy: &Policy, proposal: &Proposal) -> bool {
    policy
        .tools
        .get(&proposal.name)
        .is_none_or(|tool| tool.mode == Mode::Execute)
}

fn api_pin_record(api_pin: &ApiPin) -> PinRecord {
    PinRecord {
        server_id: api_pin.manifest.server_id.clone(),
        fingerprint: api_pin.fingerprint,
        revision: Some(api_pin.manifest.revision.clone()),
        source: PinSource::Api,
        pinned_by: Some(api_pin.pinned_by.clone()),
        pinned_at: Some(api_pin.pinned_at),
        tool_count: api_pin.manifest.tools.len(),
    }
}
