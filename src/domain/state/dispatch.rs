//! Dispatch (SPEC §6): the check order and the commit, in one critical
//! section, one step per row of the README's Dispatch checks.

use uuid::Uuid;

use crate::domain::canonical::{self, Value};
use crate::domain::clock::Timestamp;
use crate::domain::decision::{self, Cause, Dispatched};
use crate::domain::error::{Error, Result};
use crate::domain::ledger::ApprovalEvent;
use crate::domain::policy::{Mode, Policy, Tool};
use crate::domain::proposal::{Admitted, Proposal, Screened, SessionRef};
use crate::domain::receipts::{self, Receipt};
use crate::domain::resources::{self, CommitResult, Resources, Target};
use crate::domain::session::Repeats;

use super::gates::{Asked, Call, Gate, Halt, Step, approval_needed};
use super::*;

/// What Dispatch answers: the answer and the ledger transitions (a request
/// made, a grant consumed).
type Answer = (Dispatched, Vec<ApprovalEvent>);

/// What a target resource check found: the target, or why there is none.
type Found<'a> = std::result::Result<Target<'a>, String>;

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
    ) -> Result<Answer> {
        // 1. The session id's binding (the envelope was checked at the
        // edge), room for the session if it is new, and the charge.
        let asked = Asked {
            policy,
            now,
            session: session_ref,
            proposal,
            repeats: Repeats::Free,
            actor_share: None,
        };
        self.charged(
            asked,
            |state, call| state.dispatch_steps(call, screened),
            |cause| (Dispatched::answer(cause, proposal, session_ref), Vec::new()),
        )
    }

    /// SPEC §6 steps 2–3 and the session budget of SPEC §4 step 6, then the
    /// commit steps; a step that answers ends the call.
    fn dispatch_steps(&mut self, call: &Call<'_>, screened: Screened<'_>) -> Step<Answer, Answer> {
        // Charging: a new call id once the decisions are spent.
        self.check_decisions_left(call)?;
        // 2–3. Actor, tool, policy refusals (screened before the lock).
        let (admitted, schema) = screened?;
        // 3. The manifest gate; only `execute` tools; the schema.
        self.manifest_gate(call.policy, admitted.tool)?;
        check_dispatchable(admitted.tool)?;
        schema?;
        // The session budget, as Decide's step 6 would answer.
        self.check_budget(call, true)?;
        self.commit_steps(call, &admitted)
    }

    /// SPEC §6 steps 4–9 for a proposal that passed steps 1–3.
    fn commit_steps(&mut self, call: &Call<'_>, admitted: &Admitted<'_>) -> Step<Answer, Answer> {
        let tool = admitted.tool;
        // 4. A receipt for this call id.
        self.check_receipt(call)?;
        // Before anything can need approval: an answer that could not be
        // sent is never committed (the host could never read its receipt).
        let target = resources::target(&tool.effect, &call.proposal.arguments);
        let carried =
            (target.as_ref().ok()).and_then(|target| Resources::carried_value(target, tool));
        check_answer_size(carried.as_ref(), call.policy.server.max_message_bytes)?;
        // 5. The version the proposal was made against.
        self.check_version(call, &target)?;
        // 6. The approval.
        let grant = self.check_grant(call, admitted)?;
        // 7. The target resource.
        let target = self.check_target(target)?;
        // 8. Room in the receipt log and in the byte budget.
        self.make_receipt_room(call, &target, carried.as_ref())?;
        // 9. Commit.
        Ok(self.commit(call, tool, &target, carried, grant)?)
    }

    /// SPEC §6 step 4: a receipt for this (host, actor, call id) with another
    /// fingerprint → CALL_ID_CONFLICT; with this one → its stored result,
    /// `replayed` (nothing changes).
    fn check_receipt(&self, call: &Call<'_>) -> Step<(), Answer> {
        let (session, proposal) = (call.session, call.proposal);
        let Some(receipt) = self
            .receipts
            .get(&session.host, &proposal.actor, &proposal.call_id)
        else {
            return Ok(());
        };
        if receipt.fingerprint != proposal.fingerprint {
            return Err(Halt::Cause(Cause::ReceiptConflict));
        }
        let mut replayed = Dispatched::answer(&Cause::Replayed, proposal, session);
        replayed.result = Some(receipt.result.clone());
        replayed.receipt_id = Some(receipt.id);
        replayed.approval_id = receipt.approval_id;
        replayed.replayed = true;
        Err(Halt::Answer(Box::new((replayed, Vec::new()))))
    }

    /// SPEC §6 step 5: `proposal.version` is not the target's current
    /// version (the global commit counter without a target) →
    /// STALE_VERSION with the current version.
    fn check_version(&self, call: &Call<'_>, target: &Found<'_>) -> Step<(), Answer> {
        let current = match target {
            Ok(target) => self.resources.version_for(target),
            Err(_) => self.resources.version_for(&Target::Nothing),
        };
        if call.proposal.version == current {
            return Ok(());
        }
        let cause = Cause::StaleVersion { current };
        let mut stale = Dispatched::answer(&cause, call.proposal, call.session);
        stale.result = Some(CommitResult {
            version: current,
            resource: None,
            value: None,
            appended_index: None,
        });
        Err(Halt::Answer(Box::new((stale, Vec::new()))))
    }

    /// SPEC §6 step 6: approval needed and no grant → APPROVAL_REQUIRED
    /// with the pending request's id (made when there is none usable), or
    /// `approval-denied` with a denied one's. The grant to consume, if one
    /// is needed.
    fn check_grant(
        &mut self,
        call: &Call<'_>,
        admitted: &Admitted<'_>,
    ) -> Step<Option<Uuid>, Answer> {
        let Some(reason) = approval_needed(admitted, &call.proposal.arguments) else {
            return Ok(None);
        };
        let (cause, approval, created) = match self.approval_gate(call, admitted.tool, reason)? {
            Gate::Granted(approval) => return Ok(Some(approval.id)),
            Gate::Denied(approval, note) => (Cause::ApprovalDenied { note }, approval, None),
            Gate::Pending(approval, created) => {
                (Cause::AwaitingGrant(approval.reason), approval, created)
            }
        };
        let mut refused = Dispatched::answer(&cause, call.proposal, call.session);
        refused.approval_id = Some(approval.id);
        let events = created.map(|event| *event).into_iter().collect();
        Err(Halt::Answer(Box::new((refused, events))))
    }

    /// SPEC §6 step 7: the target resource does not exist (or the effect
    /// names none) → MISSING_RESOURCE.
    fn check_target<'t>(&self, target: Found<'t>) -> Step<Target<'t>, Answer> {
        target
            .and_then(|target| self.resources.check(&target).map(|()| target))
            .map_err(|found| Halt::Cause(Cause::MissingResource(found)))
    }

    /// SPEC §6 step 8: the receipt log is full, too few past retention →
    /// LOG_FULL; then room for the receipt in the byte budget, or
    /// RESOURCE_EXHAUSTED. Both are checked before anything is evicted: a
    /// refusal evicts nothing.
    fn make_receipt_room(
        &mut self,
        call: &Call<'_>,
        target: &Target<'_>,
        carried: Option<&Value>,
    ) -> Step<(), Answer> {
        let limits = &call.policy.limits;
        let over = self.receipts.over_capacity(limits);
        if self.receipts.evictable(call.now, limits, over, 0).0 < over {
            let capacity = limits.receipt_capacity;
            return Err(Halt::Cause(Cause::LogFull { capacity }));
        }
        let receipt_bytes = receipts::receipt_bytes(
            &call.session.host,
            &call.proposal.actor,
            &call.proposal.call_id,
            target.resource(),
            carried,
        );
        // A list's items are never evicted: an append (or a set of a
        // longer list) needs room of its own.
        let items = self.resources.items_growth(target, carried);
        self.make_room(over, receipt_bytes.saturating_add(items), call.now, limits)?;
        Ok(())
    }

    /// SPEC §6 step 9: count the tool, consume the grant, apply the effect
    /// and store the receipt — all of it, under this one lock, with nothing
    /// left that can fail.
    fn commit(
        &mut self,
        call: &Call<'_>,
        tool: &Tool,
        target: &Target<'_>,
        carried: Option<Value>,
        grant: Option<Uuid>,
    ) -> Result<Answer> {
        let (session, proposal) = (call.session, call.proposal);
        self.sessions
            .open(call.session_key, call.now, &call.policy.limits)?
            .executed(tool.cost);
        let mut events = Vec::new();
        if let Some(grant) = grant {
            events.push(self.ledger.consume(grant, call.now)?);
        }
        let result = self.resources.apply(target, carried);
        let receipt = Receipt {
            id: Uuid::new_v4(),
            fingerprint: proposal.fingerprint,
            result: result.clone(),
            created_at: call.now,
            approval_id: grant,
        };
        let receipt_id = receipt.id;
        let (host, actor, call_id) = (&session.host, &proposal.actor, &proposal.call_id);
        self.receipts.insert(host, actor, call_id, receipt);
        let mut committed = Dispatched::answer(&Cause::Committed, proposal, session);
        committed.result = Some(result);
        committed.receipt_id = Some(receipt_id);
        committed.approval_id = grant;
        Ok((committed, events))
    }
}

/// SPEC §6 step 3: only `execute` tools are committed through Dispatch →
/// DENIED `not-dispatchable`.
fn check_dispatchable(tool: &Tool) -> Step<(), Answer> {
    if tool.mode == Mode::Execute {
        Ok(())
    } else {
        Err(Halt::Cause(Cause::NotDispatchable(tool.mode)))
    }
}

/// Refuses a commit whose answer would exceed the message limit (see
/// [`decision::ANSWER_OVERHEAD_BYTES`]).
pub(super) fn check_answer_size(carried: Option<&Value>, limit: usize) -> Result<()> {
    let room = limit.saturating_sub(decision::ANSWER_OVERHEAD_BYTES);
    // No canonical text is empty, so a limit under the overhead refuses all.
    if let Some(value_json) = carried.and_then(|value| canonical::canonical_len_over(value, room)) {
        let answer = value_json.saturating_add(decision::ANSWER_OVERHEAD_BYTES);
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
