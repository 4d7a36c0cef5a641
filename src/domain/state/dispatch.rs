//! Dispatch (SPEC §6): the check order and the commit, in one critical section.

use uuid::Uuid;

use crate::domain::clock::Timestamp;
use crate::domain::decision::{self, Dispatched, Reason};
use crate::domain::error::{Error, Result};
use crate::domain::ledger::ApprovalEvent;
use crate::domain::policy::{Mode, Policy};
use crate::domain::proposal::{self, Proposal, Screened, SessionRef};
use crate::domain::receipts::{self, Receipt};
use crate::domain::resources::{self, CommitResult, Resources, Target};
use crate::domain::session::{self, Budget, CallStanding};

use super::gates::Gate;
use super::*;

impl State {
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
    pub(super) fn dispatch_steps(
        &mut self,
        policy: &Policy,
        now: Timestamp,
        session_ref: &SessionRef,
        proposal: &Proposal,
        screened: Screened<'_>,
        standing: CallStanding,
    ) -> Result<(Dispatched, Vec<ApprovalEvent>, Option<Reason>)> {
        let fingerprint = proposal.fingerprint;
        let refuse = |reason: Reason, message: String| {
            Ok((
                Dispatched::new(reason, message, fingerprint),
                Vec::new(),
                None,
            ))
        };
        let budget = Budget::of(policy.actors.get(&session_ref.actor));
        if standing == CallStanding::New && budget.decisions_spent(self.sessions.find(session_ref))
        {
            let reason = Reason::DecisionBudget;
            let message = session::refusal_message(reason, &proposal.call_id);
            let refused = Dispatched::new(reason, message, fingerprint);
            return Ok((refused, Vec::new(), Some(reason)));
        }
        // 2–3. Actor, tool, policy refusals, schema.
        let (admitted, schema) = match screened {
            Ok(screened) => screened,
            Err(refusal) => {
                return refuse(refusal.reason(), refusal.message(proposal, session_ref));
            }
        };
        let tool = admitted.tool;
        if let Err(refusal) = self.manifest_gate(policy, tool) {
            return refuse(refusal.reason(), refusal.message(proposal, session_ref));
        }
        if tool.mode != Mode::Execute {
            return refuse(
                Reason::NotDispatchable,
                format!(
                    "{:?} is a {:?} tool; only execute tools are committed through Dispatch",
                    tool.name, tool.mode
                ),
            );
        }
        schema?;
        // The session budget, as Decide's step 6 would answer.
        if let Some(reason) = budget.check(standing, self.sessions.find(session_ref), true, now) {
            let message = session::refusal_message(reason, &proposal.call_id);
            let refused = Dispatched::new(reason, message, fingerprint);
            return Ok((refused, Vec::new(), Some(reason)));
        }
        let (dispatched, events) =
            self.commit_steps(policy, now, session_ref, proposal, admitted)?;
        Ok((dispatched, events, None))
    }

    /// SPEC §6 steps 4–9 for a proposal that passed steps 1–3.
    pub(super) fn commit_steps(
        &mut self,
        policy: &Policy,
        now: Timestamp,
        session_ref: &SessionRef,
        proposal: &Proposal,
        admitted: proposal::Admitted<'_>,
    ) -> Result<(Dispatched, Vec<ApprovalEvent>)> {
        let fingerprint = proposal.fingerprint;
        let refuse = |reason: Reason, message: String| {
            Ok((Dispatched::new(reason, message, fingerprint), Vec::new()))
        };
        let tool = admitted.tool;
        // 4. A receipt for this call id.
        if let Some(receipt) =
            self.receipts
                .get(&session_ref.host, &proposal.actor, &proposal.call_id)
        {
            if receipt.fingerprint != fingerprint {
                return refuse(
                    Reason::CallIdConflict,
                    format!(
                        "call id {:?} was committed for a different proposal",
                        proposal.call_id
                    ),
                );
            }
            let mut replayed = Dispatched::new(
                Reason::Replayed,
                "the stored receipt of the earlier commit".to_string(),
                fingerprint,
            );
            replayed.result = Some(receipt.result.clone());
            replayed.receipt_id = Some(receipt.id);
            replayed.replayed = true;
            return Ok((replayed, Vec::new()));
        }
        // 5. The version the proposal was made against.
        let target = resources::target(&tool.effect, &proposal.arguments);
        // Before anything can need approval: an answer that could not be
        // sent is never committed (the host could never read its receipt).
        let carried = target.as_ref().ok().and_then(Resources::carried_value);
        check_answer_size(carried.as_ref(), policy.server.max_message_bytes)?;
        let current = match &target {
            Ok(target) => self.resources.version_for(target),
            Err(_) => self.resources.version_for(&Target::Nothing),
        };
        if proposal.version != current {
            let mut stale = Dispatched::new(
                Reason::StaleVersion,
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
                        let mut refused =
                            Dispatched::new(Reason::ApprovalDenied, message, fingerprint);
                        refused.approval_id = Some(approval.id);
                        return Ok((refused, events));
                    }
                    Gate::Pending(approval, created) => {
                        let mut refused = Dispatched::new(
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
                return refuse(Reason::MissingResource, message);
            }
        };
        // 8. Room in the receipt log.
        if !self.receipts.make_room(now, &policy.limits) {
            return refuse(
                Reason::LogFull,
                format!(
                    "the receipt log holds {} receipts, none past retention",
                    policy.limits.receipt_capacity
                ),
            );
        }
        // 8b. Room for the receipt in the byte budget.
        let receipt_bytes = receipts::receipt_bytes(
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
        let mut committed = Dispatched::new(
            Reason::Committed,
            format!("{:?} committed", tool.name),
            fingerprint,
        );
        committed.result = Some(result);
        committed.receipt_id = Some(receipt_id);
        committed.approval_id = grant;
        Ok((committed, events))
    }
}

/// Refuses a commit whose answer would exceed the message limit (see
/// [`decision::ANSWER_OVERHEAD_BYTES`]).
pub(super) fn check_answer_size(
    carried: Option<&crate::domain::canonical::Value>,
    limit: usize,
) -> Result<()> {
    let Some(value) = carried else {
        return Ok(());
    };
    let value_json = crate::domain::canonical::to_canonical(value).len();
    let answer = value_json.saturating_add(decision::ANSWER_OVERHEAD_BYTES);
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
