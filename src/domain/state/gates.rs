//! What Decide and Dispatch share: the call their steps read, how a step
//! ends the call, the checks both make (decisions left, the manifest gate,
//! the session budget, whether approval is needed, the approval gate
//! against the ledger) and the session charge.

use crate::domain::canonical::Object;
use crate::domain::clock::Timestamp;
use crate::domain::decision::{Cause, Reason};
use crate::domain::error::{Error, Result};
use crate::domain::ledger::{ApprovalEvent, ApprovalRef, NewApproval, Standing};
use crate::domain::manifest::ManifestStatus;
use crate::domain::policy::{Mode, Policy, Tool};
use crate::domain::proposal::{self, Admitted, Proposal, Refusal, SessionRef};
use crate::domain::session::{Budget, CallStanding, Charge, Repeats, SessionKey};

use super::*;

/// What a Decide or Dispatch asks, before it is charged
/// ([`State::charged`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Asked<'a> {
    pub(super) policy: &'a Policy,
    pub(super) now: Timestamp,
    pub(super) session: &'a SessionRef,
    pub(super) proposal: &'a Proposal,
    /// What a call id decided again costs.
    pub(super) repeats: Repeats,
    /// The sessions its actor may hold, when the caller bounds that.
    pub(super) actor_share: Option<usize>,
}

/// One Decide or Dispatch being answered: what its steps read (what it
/// asked, through `Deref`, its session's key, and what the session knows
/// of its call id).
#[derive(Debug, Clone, Copy)]
pub(super) struct Call<'a> {
    asked: Asked<'a>,
    pub(super) session_key: SessionKey<'a>,
    /// What the session already knows of the call id.
    pub(super) standing: CallStanding,
}

impl<'a> std::ops::Deref for Call<'a> {
    type Target = Asked<'a>;

    fn deref(&self) -> &Asked<'a> {
        &self.asked
    }
}

impl Call<'_> {
    /// The session budgets of the session's actor.
    fn budget(&self) -> Budget {
        Budget::of(self.policy.actors.get(&self.session.actor))
    }
}

/// How a step ends a call before the last step: a step returns
/// `Step<T, A>`, the `T` the next steps need or the end of the call, so that
/// an operation reads as its check table, one `?` per row.
pub(super) enum Halt<A> {
    /// Answered for this cause; the operation words the answer
    /// ([`answered`]).
    Cause(Cause),
    /// Answered with more than a cause (a replay, the current version, an
    /// approval id); boxed, so that a step's result stays small.
    Answer(Box<A>),
    /// Not an answer: nothing is charged and nothing changes.
    Error(Error),
}

pub(super) type Step<T, A> = std::result::Result<T, Halt<A>>;

impl<A> From<Error> for Halt<A> {
    fn from(error: Error) -> Self {
        Halt::Error(error)
    }
}

impl<A> From<Refusal> for Halt<A> {
    fn from(refusal: Refusal) -> Self {
        Halt::Cause(Cause::Refused(refusal))
    }
}

/// The answer of an operation's steps, a cause worded by `word`, with the
/// budget that refused the call, if one did (what [`State::charged`]
/// settles).
fn answered<A>(steps: Step<A, A>, word: impl FnOnce(&Cause) -> A) -> Result<(A, Option<Reason>)> {
    match steps {
        Ok(answer) => Ok((answer, None)),
        Err(Halt::Answer(answer)) => Ok((*answer, None)),
        Err(Halt::Cause(cause)) => Ok((word(&cause), cause.budget_refusal())),
        Err(Halt::Error(error)) => Err(error),
    }
}

impl State {
    /// SPEC §4 "Charging": once the decisions are spent, a new call id is
    /// refused `decision-budget` before anything else, and costs nothing.
    pub(super) fn check_decisions_left<A>(&self, call: &Call<'_>) -> Step<(), A> {
        let session = self.sessions.find(call.session_key);
        if call.standing == CallStanding::New && call.budget().decisions_spent(session) {
            return Err(Halt::Cause(Cause::Budget(Reason::DecisionBudget)));
        }
        Ok(())
    }

    /// SPEC §4 step 4 (§6 step 3): a tool of a manifest server needs a
    /// matching assessment, or it is `manifest-unverified`.
    pub(super) fn manifest_gate(&self, policy: &Policy, tool: &Tool) -> Result<(), Refusal> {
        match &tool.server {
            Some(server) => match self.manifest_status(policy, server) {
                ManifestStatus::Verified => Ok(()),
                status => Err(Refusal::ManifestUnverified(status)),
            },
            None => Ok(()),
        }
    }

    /// SPEC §4 step 6 (and Dispatch of a call id, as Decide would answer
    /// it): `call-id-conflict`, the verdict a decided call id got, or the
    /// budget of a new one (`tool-budget`, `session-expired`).
    pub(super) fn check_budget<A>(&self, call: &Call<'_>, is_tool_call: bool) -> Step<(), A> {
        let session = self.sessions.find(call.session_key);
        match call
            .budget()
            .check(call.standing, session, is_tool_call, call.now, call.repeats)
        {
            Some(reason) => Err(Halt::Cause(Cause::Budget(reason))),
            None => Ok(()),
        }
    }

    /// The approval standing of a proposal that needs approval; a new pending
    /// request is made when there is none usable (SPEC §4 step 8, §6 step 6).
    pub(super) fn approval_gate(
        &mut self,
        call: &Call<'_>,
        tool: &Tool,
        reason: Reason,
    ) -> Result<Gate> {
        let (session_ref, proposal) = (call.session, call.proposal);
        let standing = self
            .ledger
            .standing(&session_ref.workspace, proposal.fingerprint);
        Ok(match standing {
            Standing::Granted(approval) => Gate::Granted(approval),
            Standing::Denied(approval) => {
                let note = self
                    .ledger
                    .get(approval.id)
                    .map(|record| record.decision_note.clone())
                    .unwrap_or_default();
                Gate::Denied(approval, note)
            }
            Standing::Pending(approval) => Gate::Pending(approval, None),
            Standing::None => {
                let event = self.request_approval(call, tool, reason)?;
                Gate::Pending(ApprovalRef::from(&event.approval), Some(Box::new(event)))
            }
        })
    }

    /// A new pending request for this proposal, within the argument, pending
    /// and byte limits.
    fn request_approval(
        &mut self,
        call: &Call<'_>,
        tool: &Tool,
        reason: Reason,
    ) -> Result<ApprovalEvent> {
        let (policy, session_ref, proposal) = (call.policy, call.session, call.proposal);
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
        self.ledger
            .check_capacity(&session_ref.host, &session_ref.actor, &policy.limits)?;
        self.make_byte_room(new.bytes(), call.now, &policy.limits)?;
        Ok(self.ledger.create(new, call.now, &policy.limits))
    }

    /// Charging (SPEC §4 "Charging"), shared by Decide and Dispatch: the
    /// session id's binding, room for the session if it is new and room in
    /// the byte budget for the call id if it will be remembered — all before
    /// anything changes — then the call's steps, then the charge of their
    /// answer, settled on the session. A step that halts with a cause is
    /// answered as `word` says.
    pub(super) fn charged<T>(
        &mut self,
        asked: Asked<'_>,
        steps: impl FnOnce(&mut Self, &Call<'_>) -> Step<T, T>,
        word: impl FnOnce(&Cause) -> T,
    ) -> Result<T> {
        let Asked {
            policy,
            now,
            session: session_ref,
            proposal,
            repeats,
            actor_share,
        } = asked;
        let session_key = self.sessions.key(session_ref);
        self.sessions.check_binding(session_key)?;
        self.sessions
            .reserve(session_key, now, &policy.limits, actor_share)?;
        let session = self.sessions.find(session_key);
        let standing = CallStanding::of(session, &proposal.call_id, proposal.fingerprint);
        // What the budget step (SPEC §4 step 6) says of a new call id, as
        // every step before it finds the session: the verdict it is
        // remembered with, whichever step answers it, so that one answered
        // before the budget (an unknown or unauthorized tool, an unverified
        // manifest) is not let past a budget it had spent once a reload or
        // an assessment lets it through. A call id decided while its tool was
        // no tool call owes the attempt it was not charged: the first call of
        // it once a reload made its tool an `execute` one settles that (the
        // tool budget says whether it pays it or is refused `tool-budget`
        // from then on); until then it owes it still.
        let budget = Budget::of(policy.actors.get(&session_ref.actor));
        let tool_call = is_tool_call(policy, proposal);
        let (standing, verdict) = match standing {
            CallStanding::New => (standing, budget.refusal(session, tool_call, now)),
            CallStanding::Decided {
                refused,
                owes_attempt: true,
            } => {
                let settles = policy
                    .tools
                    .get(&proposal.name)
                    .is_some_and(|tool| tool.mode == Mode::Execute);
                let verdict = settles.then(|| budget.tool_refusal(session)).flatten();
                let standing = CallStanding::Decided {
                    refused: refused.or(verdict),
                    owes_attempt: settles,
                };
                (standing, verdict)
            }
            _ => (standing, None),
        };
        // Every call id remembered counts under the byte budget, whatever
        // the answer: room for it checked now (RESOURCE_EXHAUSTED and no
        // change), counted by the steps' own room, and made once the steps
        // answered, so that an error evicts nothing.
        let call_bytes =
            self.sessions
                .bytes_to_remember(session_key, &proposal.call_id, standing, &budget);
        if call_bytes > 0 {
            self.excess(0, call_bytes, now, &policy.limits)?;
        }
        self.charging_bytes = call_bytes;
        let call = Call {
            asked,
            session_key,
            standing,
        };
        let answered = answered(steps(self, &call), word);
        self.charging_bytes = 0;
        let (answer, refused) = answered?;
        if call_bytes > 0 {
            // Cannot fail: the room was there before the steps, and what
            // they added made room for it too (`charging_bytes`).
            self.make_byte_room(call_bytes, now, &policy.limits)?;
        }
        let charge = Charge::of(standing, tool_call, refused, verdict, repeats);
        // Counts the bytes of a call id it remembers.
        self.sessions.settle(
            session_key,
            &proposal.call_id,
            proposal.fingerprint,
            charge,
            now,
            &policy.limits,
        )?;
        Ok(answer)
    }
}

/// SPEC §4 step 7 (§6 step 6): the reason a proposal needs approval, if it
/// does — only an `execute` tool can, by its approval rule.
pub(super) fn approval_needed(admitted: &Admitted<'_>, arguments: &Object) -> Option<Reason> {
    match admitted.tool.mode {
        Mode::Execute => proposal::approval_reason(admitted.tool, admitted.profile, arguments),
        _ => None,
    }
}

/// What the ledger holds for a proposal that needs approval, after making
/// a request if there was none usable.
pub(super) enum Gate {
    Granted(ApprovalRef),
    /// With the reviewer's note (empty when they gave none).
    Denied(ApprovalRef, String),
    /// With the request event when this call made the request.
    Pending(ApprovalRef, Option<Box<ApprovalEvent>>),
}

/// Whether a call of this proposal's tool costs a tool attempt: an unknown
/// tool or an `execute` one (SPEC §4 "Charging").
pub(super) fn is_tool_call(policy: &Policy, proposal: &Proposal) -> bool {
    policy
        .tools
        .get(&proposal.name)
        .is_none_or(|tool| tool.mode == Mode::Execute)
}
