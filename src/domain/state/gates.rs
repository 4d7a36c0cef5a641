//! The checks Decide and Dispatch share: the manifest gate, the approval
//! gate against the ledger, and the session charge.

use crate::domain::clock::Timestamp;
use crate::domain::decision::Reason;
use crate::domain::error::{Error, Result};
use crate::domain::ledger::{ApprovalEvent, ApprovalRef, NewApproval, Standing};
use crate::domain::manifest::ManifestStatus;
use crate::domain::policy::{Mode, Policy, Tool};
use crate::domain::proposal::{self, Proposal, Refusal, SessionRef};
use crate::domain::session::{Budget, CallStanding, Charge};

use super::*;

impl State {
    /// The approval standing of a proposal that needs approval; a new pending
    /// request is made when there is none usable (SPEC §4 step 8, §6 step 6).
    pub(super) fn approval_gate(
        &mut self,
        policy: &Policy,
        now: Timestamp,
        session_ref: &SessionRef,
        proposal: &Proposal,
        tool: &Tool,
        reason: Reason,
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

    /// SPEC §4 step 4: a tool of a manifest server needs a matching assessment.
    pub(super) fn manifest_gate(&self, policy: &Policy, tool: &Tool) -> Result<(), Refusal> {
        match &tool.server {
            Some(server) => match self.manifest_status(policy, server) {
                ManifestStatus::Verified => Ok(()),
                status => Err(Refusal::ManifestUnverified(status)),
            },
            None => Ok(()),
        }
    }

    /// Charging (SPEC §4 "Charging"), shared by Decide and Dispatch: the
    /// session id's binding, room for the session if it is new and room in
    /// the byte budget for the call id if it will be remembered — all before
    /// anything changes — then the call's steps, then the charge of their
    /// answer, settled on the session. `steps` also returns the budget that
    /// refused the call, if one did.
    pub(super) fn charged<T>(
        &mut self,
        policy: &Policy,
        now: Timestamp,
        session_ref: &SessionRef,
        proposal: &Proposal,
        steps: impl FnOnce(&mut Self, CallStanding) -> Result<(T, Option<Reason>)>,
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
}

/// What the ledger holds for a proposal that needs approval, after making
/// a request if there was none usable.
pub(super) enum Gate {
    Granted(ApprovalRef),
    /// With the answer's message, which carries the reviewer's reason.
    Denied(ApprovalRef, String),
    /// With the request event when this call made the request.
    Pending(ApprovalRef, Option<Box<ApprovalEvent>>),
}

/// The message of a Decide or Dispatch refused because a reviewer denied
/// the proposal: the reviewer's reason, when they gave one, reaches the host.
pub(super) fn denial_message(reason: &str) -> String {
    if reason.is_empty() {
        "a reviewer denied this exact proposal".to_string()
    } else {
        format!("a reviewer denied this exact proposal: {reason}")
    }
}

/// Whether a call of this proposal's tool costs a tool attempt: an unknown
/// tool or an `execute` one (SPEC §4 "Charging").
pub(super) fn is_tool_call(policy: &Policy, proposal: &Proposal) -> bool {
    policy
        .tools
        .get(&proposal.name)
        .is_none_or(|tool| tool.mode == Mode::Execute)
}
