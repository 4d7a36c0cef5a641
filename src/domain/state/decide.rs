//! Decide (SPEC §4): the check order, in one critical section, one step per
//! row of the README's Decide table.

use crate::domain::clock::Timestamp;
use crate::domain::decision::{Cause, Decision, Reason};
use crate::domain::error::Result;
use crate::domain::ledger::ApprovalEvent;
use crate::domain::policy::{Mode, Policy, Tool};
use crate::domain::proposal::{Proposal, Screened, SessionRef};
use crate::domain::session::Repeats;

use super::gates::{Asked, Call, Gate, Halt, Step, approval_needed};
use super::*;

/// What Decide answers: the decision and the approval request it made, if any.
type Decided = (Decision, Option<ApprovalEvent>);

impl State {
    /// Decide (SPEC §4). The policy-only steps (2, 3 and the schema check of
    /// 5) were screened without the lock; their answers are reported here in
    /// the contract's order. Every answer is charged to the session as SPEC
    /// §4 "Charging" says; an error changes nothing. `grants` says what step
    /// 8 does with a grant: Decide keeps it for Dispatch; an external
    /// authorizer's Check (issue 17) consumes it here, in the same critical
    /// section — there is no Dispatch after it (the proxy forwards the call
    /// once) — so that under any concurrency exactly one call passes on one
    /// grant, and the consumption counts the tool's cost as a commit does.
    /// Returns the decision and the ledger transition (a request made or a
    /// grant consumed), if any. The engine expires due approvals first.
    pub fn decide(
        &mut self,
        policy: &Policy,
        now: Timestamp,
        session_ref: &SessionRef,
        proposal: &Proposal,
        screened: Screened<'_>,
        grants: Grants,
    ) -> Result<Decided> {
        let asked = Asked {
            policy,
            now,
            session: session_ref,
            proposal,
            repeats: grants.repeats(),
            actor_share: grants.actor_share(policy),
        };
        self.charged(
            asked,
            |state, call| state.decide_steps(call, screened, grants),
            |cause| (Decision::answer(cause, proposal, session_ref, None), None),
        )
    }

    /// SPEC §4 steps 2–8 (step 1 was checked at the edge and by
    /// [`State::charged`]), in the contract's order; a step that answers
    /// ends the call.
    fn decide_steps(
        &mut self,
        call: &Call<'_>,
        screened: Screened<'_>,
        grants: Grants,
    ) -> Step<Decided, Decided> {
        // Charging: a new call id once the decisions are spent.
        self.check_decisions_left(call)?;
        // 2–3. Actor, tool, mode, roles (screened before the lock).
        let (admitted, schema) = screened?;
        // 4. The manifest gate.
        self.manifest_gate(call.policy, admitted.tool)?;
        // 5. The input schema (checked when screening, reported here).
        schema?;
        // 6. The session budget.
        self.check_budget(call, admitted.tool.mode == Mode::Execute)?;
        // 7. No approval needed.
        let Some(reason) = approval_needed(&admitted, &call.proposal.arguments) else {
            if grants == Grants::Consume && admitted.tool.mode == Mode::Execute {
                self.forwarded(call, admitted.tool)?;
            }
            return Err(Halt::Cause(Cause::Allowed));
        };
        // 8. The ledger.
        self.ask_ledger(call, admitted.tool, reason, grants)
    }

    /// An `execute` tool's call that a Check lets through: the proxy
    /// forwards it once, so it counts the tool's cost as a commit does.
    fn forwarded(&mut self, call: &Call<'_>, tool: &Tool) -> Result<()> {
        self.sessions
            .open(call.session_key, call.now, &call.policy.limits)?
            .executed(tool.cost);
        Ok(())
    }

    /// SPEC §4 step 8: a grant → ALLOW `approved` (consumed, when `grants`
    /// says so); a denial → DENY
    /// `approval-denied` with the reviewer's note; pending, or none usable
    /// (then a request is made) → REQUIRE_APPROVAL with the request's reason.
    fn ask_ledger(
        &mut self,
        call: &Call<'_>,
        tool: &Tool,
        reason: Reason,
        grants: Grants,
    ) -> Step<Decided, Decided> {
        let (cause, approval, created) = match self.approval_gate(call, tool, reason)? {
            Gate::Granted(approval) if grants == Grants::Consume => {
                self.forwarded(call, tool)?;
                let consumed = self.ledger.consume(approval.id, call.now)?;
                (Cause::GrantConsumed, approval, Some(consumed))
            }
            Gate::Granted(approval) => (Cause::Approved, approval, None),
            Gate::Denied(approval, note) => (Cause::ApprovalDenied { note }, approval, None),
            Gate::Pending(approval, created) => (
                Cause::AwaitingApproval(approval.reason),
                approval,
                created.map(|event| *event),
            ),
        };
        let approval = Some((approval.id, approval.expires_at));
        let decision = Decision::answer(&cause, call.proposal, call.session, approval);
        Ok((decision, created))
    }
}

/// What step 8 does with a grant: Decide keeps it for Dispatch; an
/// external authorizer's Check consumes it, since the proxy runs every call
/// it lets through (so a Check also pays for a call id decided again:
/// [`Repeats::Charged`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Grants {
    Keep,
    Consume,
}

impl Grants {
    fn repeats(self) -> Repeats {
        match self {
            Grants::Keep => Repeats::Free,
            Grants::Consume => Repeats::Charged,
        }
    }

    /// The sessions one actor may hold: bounded for a Check, whose MCP
    /// client picks the session id; a host's Decide is bounded by the
    /// host's share only.
    fn actor_share(self, policy: &Policy) -> Option<usize> {
        match self {
            Grants::Keep => None,
            Grants::Consume => Some(policy.ext_authz.max_sessions_per_actor),
        }
    }
}
