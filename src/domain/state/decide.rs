//! Decide (SPEC §4): the check order, in one critical section.

use crate::domain::clock::Timestamp;
use crate::domain::decision::{Decision, Reason};
use crate::domain::error::Result;
use crate::domain::ledger::ApprovalEvent;
use crate::domain::policy::{Mode, Policy};
use crate::domain::proposal::{self, Proposal, Screened, SessionRef};
use crate::domain::session::{self, Budget, CallStanding};

use super::gates::Gate;
use super::*;

impl State {
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

    /// SPEC §4 steps 2–8 for a call of this standing; also returns the
    /// budget that refused it, if one did.
    pub(super) fn decide_steps(
        &mut self,
        policy: &Policy,
        now: Timestamp,
        session_ref: &SessionRef,
        proposal: &Proposal,
        screened: Screened<'_>,
        standing: CallStanding,
    ) -> Result<(Decision, Option<ApprovalEvent>, Option<Reason>)> {
        // Charging: once the decisions are spent, a new call id is refused
        // before anything else, and costs nothing.
        let budget = Budget::of(policy.actors.get(&session_ref.actor));
        if standing == CallStanding::New && budget.decisions_spent(self.sessions.find(session_ref))
        {
            let reason = Reason::DecisionBudget;
            let message = session::refusal_message(reason, &proposal.call_id);
            return Ok((
                Decision::new(reason, message, proposal.fingerprint, None),
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
                Decision::new(reason, message, proposal.fingerprint, None),
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
                Decision::new(
                    Reason::Allowed,
                    format!("{:?} may run", proposal.name),
                    proposal.fingerprint,
                    None,
                ),
                None,
            ),
            Some(reason) => {
                match self.approval_gate(policy, now, session_ref, proposal, tool, reason)? {
                    Gate::Granted(approval) => (
                        Decision::new(
                            Reason::Approved,
                            "approved by a reviewer; Dispatch consumes the grant".to_string(),
                            proposal.fingerprint,
                            Some((approval.id, approval.expires_at)),
                        ),
                        None,
                    ),
                    Gate::Denied(approval, message) => (
                        Decision::new(
                            Reason::ApprovalDenied,
                            message,
                            proposal.fingerprint,
                            Some((approval.id, approval.expires_at)),
                        ),
                        None,
                    ),
                    Gate::Pending(approval, created) => (
                        Decision::new(
                            approval.reason,
                            "a reviewer must approve this exact proposal".to_string(),
                            proposal.fingerprint,
                            Some((approval.id, approval.expires_at)),
                        ),
                        created,
                    ),
                }
            }
        };
        Ok((decision, created.map(|event| *event), None))
    }
}
