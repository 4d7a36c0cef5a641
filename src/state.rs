//! `State`: everything toolgate remembers between calls. Every RPC is one
//! method on this one type, called with the policy snapshot and the time, so
//! that a durable or replicated backend can implement the same operations.

use std::collections::HashMap;
use std::sync::Arc;

use uuid::Uuid;

use crate::canonical::Fingerprint;
use crate::clock::Timestamp;
use crate::error::{Error, Result};
use crate::ledger::{
    Approval, ApprovalEvent, Ledger, ListQuery, NewApproval, Page, Standing, Verdict,
};
use crate::manifest::{self, Assessment, Manifest, PinReference};
use crate::policy::{Mode, Policy};
use crate::proposal::{self, Admitted, Proposal, Refusal, SessionRef};
use crate::session::{self, BudgetCheck, Session, Sessions};

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

#[derive(Debug, Default)]
pub struct State {
    api_pins: HashMap<String, ApiPin>,
    /// Fingerprint of the latest assessment per pinned server.
    last_assessed: HashMap<String, Fingerprint>,
    ledger: Ledger,
    sessions: Sessions,
}

impl State {
    /// Decide (SPEC §4) from step 4 on; steps 1–3 and the schema check ran
    /// without the lock (`admitted`, `schema`), and their answers are used
    /// here in the contract's order. Returns the decision and the approval
    /// request it created, if any. The engine expires due approvals first.
    pub fn decide(
        &mut self,
        policy: &Policy,
        now: Timestamp,
        session_ref: &SessionRef,
        proposal: &Proposal,
        admitted: &Admitted<'_>,
        schema: Result<()>,
    ) -> Result<(Decision, Option<ApprovalEvent>)> {
        let tool = admitted.tool;
        // Step 4: the manifest gate.
        if let Some(server) = &tool.server
            && !self.manifest_verified(policy, server)
        {
            return Ok((
                Decision::refused(Refusal::ManifestUnverified, proposal, session_ref),
                None,
            ));
        }
        // Step 5: the input schema.
        schema?;
        // Step 6: the session budget.
        let is_tool_call = tool.mode == Mode::Execute;
        let session = self.sessions.open(session_ref, now, &policy.limits)?;
        let budget = session::check_budget(
            session,
            admitted.profile,
            &proposal.call_id,
            proposal.fingerprint,
            is_tool_call,
            now,
        );
        if let BudgetCheck::Refused(reason) = budget {
            if reason != "call-id-conflict" {
                session.stopped_reason.get_or_insert(reason);
            }
            let message = match reason {
                "call-id-conflict" => format!(
                    "call id {:?} was already decided in this session for a different proposal",
                    proposal.call_id
                ),
                "session-expired" => "the session is older than its profile allows".to_string(),
                _ => format!("the session's {reason} is spent"),
            };
            return Ok((Decision::deny(proposal, reason, message), None));
        }
        // Step 7: no approval needed.
        let approval_reason = match tool.mode {
            Mode::Execute => proposal::approval_reason(tool, admitted.profile, &proposal.arguments),
            _ => None,
        };
        let mut created = None;
        let decision = match approval_reason {
            None => Decision {
                outcome: Outcome::Allow,
                reason: "allowed",
                message: format!("{:?} may run", proposal.name),
                fingerprint: proposal.fingerprint,
                approval: None,
            },
            // Step 8: the ledger.
            Some(reason) => match self
                .ledger
                .standing(&session_ref.workspace, proposal.fingerprint)
            {
                Standing::Granted(approval) => Decision {
                    outcome: Outcome::Allow,
                    reason: "approved",
                    message: format!(
                        "approved by {}",
                        approval.decided_by.as_deref().unwrap_or("a reviewer")
                    ),
                    fingerprint: proposal.fingerprint,
                    approval: Some((approval.id, approval.expires_at)),
                },
                Standing::Denied(approval) => Decision {
                    outcome: Outcome::Deny,
                    reason: "approval-denied",
                    message: "a reviewer denied this exact proposal".to_string(),
                    fingerprint: proposal.fingerprint,
                    approval: Some((approval.id, approval.expires_at)),
                },
                Standing::Pending(approval) => Decision {
                    outcome: Outcome::RequireApproval,
                    reason: approval.reason,
                    message: "waiting for a reviewer".to_string(),
                    fingerprint: proposal.fingerprint,
                    approval: Some((approval.id, approval.expires_at)),
                },
                Standing::None => {
                    self.ledger
                        .check_capacity(&session_ref.actor, &policy.limits)?;
                    let event = self.ledger.create(
                        NewApproval {
                            fingerprint: proposal.fingerprint,
                            actor: session_ref.actor.clone(),
                            session_id: session_ref.session_id.clone(),
                            workspace: session_ref.workspace.clone(),
                            tool: tool.name.clone(),
                            call_id: proposal.call_id.clone(),
                            version: proposal.version,
                            arguments_view: proposal::redacted_arguments(tool, &proposal.arguments),
                            reason,
                        },
                        now,
                        &policy.limits,
                    );
                    let decision = Decision {
                        outcome: Outcome::RequireApproval,
                        reason,
                        message: "a reviewer must approve this exact proposal".to_string(),
                        fingerprint: proposal.fingerprint,
                        approval: Some((event.approval.id, event.approval.expires_at)),
                    };
                    created = Some(event);
                    decision
                }
            },
        };
        if budget == BudgetCheck::NewCall {
            let session = self.sessions.open(session_ref, now, &policy.limits)?;
            session::charge(
                session,
                &proposal.call_id,
                proposal.fingerprint,
                is_tool_call,
            );
        }
        Ok((decision, created))
    }

    pub fn session(&self, session_id: &str) -> Result<Session> {
        self.sessions
            .get(session_id)
            .cloned()
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

    pub fn list_approvals(&self, query: &ListQuery) -> Page {
        self.ledger.list(query)
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
            self.last_assessed
                .insert(manifest.server_id.clone(), assessment.fingerprint);
        }
        assessment
    }

    /// True when the server has a pin and its latest assessment matched the
    /// pin in force now (a later re-pin needs a new assessment).
    pub fn manifest_verified(&self, policy: &Policy, server_id: &str) -> bool {
        match (
            self.pin(policy, server_id),
            self.last_assessed.get(server_id),
        ) {
            (Some(pin), Some(assessed)) => pin.pinned_fingerprint() == *assessed,
            _ => false,
        }
    }

    pub fn pin_manifest(
        &mut self,
        now: Timestamp,
        reviewer: &str,
        manifest: Manifest,
        expected: Option<Fingerprint>,
    ) -> Result<PinRecord> {
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
