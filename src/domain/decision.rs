//! What Decide answers: the outcome, the stable reason and the message.

use uuid::Uuid;

use crate::domain::canonical::{self, Fingerprint};
use crate::domain::clock::Timestamp;
use crate::domain::manifest::ManifestStatus;
use crate::domain::policy::Mode;
use crate::domain::proposal::{Proposal, Refusal, SessionRef};
pub use crate::domain::reason::{DispatchStatus, Outcome, Reason};
use crate::domain::resources::CommitResult;

/// Why Decide or Dispatch answered as it did, with what the answer's message
/// names: every reason's message is written here, once.
#[derive(Debug, Clone, PartialEq)]
pub enum Cause {
    /// `allowed` (Decide step 7).
    Allowed,
    /// `approved`: a grant for this fingerprint (Decide step 8).
    Approved,
    /// `approved`: a grant for this fingerprint, consumed by this call (an
    /// external authorizer's Check).
    GrantConsumed,
    /// `forbidden`, `unknown-tool`, `forbidden-tool`, `not-authorized`,
    /// `manifest-unverified`: a policy refusal (Decide steps 2–4, Dispatch
    /// steps 2–3).
    Refused(Refusal),
    /// `call-id-conflict` (a call id decided for another fingerprint),
    /// `decision-budget`, `tool-budget`, `session-expired`: the session's
    /// budget refused the call (Decide step 6 and "Charging").
    Budget(Reason),
    /// `approval-denied`: a reviewer denied this proposal, with their note
    /// (empty when they gave none).
    ApprovalDenied { note: String },
    /// Decide step 8: a request pending, for the rule's reason
    /// (`approval-required`, `approval-threshold-exceeded`).
    AwaitingApproval(Reason),
    /// Dispatch step 6: the same, asked of a commit.
    AwaitingGrant(Reason),
    /// `not-dispatchable`: a tool of this mode (Dispatch step 3).
    NotDispatchable(Mode),
    /// `call-id-conflict`: a receipt for another fingerprint (Dispatch step 4).
    ReceiptConflict,
    /// `replayed`: the receipt for this fingerprint (Dispatch step 4).
    Replayed,
    /// `committed` (Dispatch step 9).
    Committed,
    /// `stale-version`: the state is at this version (Dispatch step 5).
    StaleVersion { current: u64 },
    /// `missing-resource`, with what the resource check found (Dispatch step 7).
    MissingResource(String),
    /// `log-full`: the receipt log holds this many receipts (Dispatch step 8).
    LogFull { capacity: usize },
}

impl Cause {
    pub fn reason(&self) -> Reason {
        match self {
            Cause::Allowed => Reason::Allowed,
            Cause::Approved | Cause::GrantConsumed => Reason::Approved,
            Cause::Refused(refusal) => refusal.reason(),
            Cause::Budget(reason)
            | Cause::AwaitingApproval(reason)
            | Cause::AwaitingGrant(reason) => *reason,
            Cause::ApprovalDenied { .. } => Reason::ApprovalDenied,
            Cause::NotDispatchable(_) => Reason::NotDispatchable,
            Cause::ReceiptConflict => Reason::CallIdConflict,
            Cause::Replayed => Reason::Replayed,
            Cause::Committed => Reason::Committed,
            Cause::StaleVersion { .. } => Reason::StaleVersion,
            Cause::MissingResource(_) => Reason::MissingResource,
            Cause::LogFull { .. } => Reason::LogFull,
        }
    }

    /// The budget that refused the call, which the session remembers (SPEC
    /// §4 "Charging"); `None` for every other cause.
    pub fn budget_refusal(&self) -> Option<Reason> {
        match self {
            Cause::Budget(reason) => Some(*reason),
            _ => None,
        }
    }

    /// The answer's message for this proposal in this session.
    pub fn message(&self, proposal: &Proposal, session: &SessionRef) -> String {
        let tool = &proposal.name;
        match self {
            Cause::Allowed => quoted_then(tool, " may run"),
            Cause::Approved => "approved by a reviewer; Dispatch consumes the grant".to_string(),
            Cause::GrantConsumed => {
                "approved by a reviewer; this call consumed the grant".to_string()
            }
            Cause::Refused(refusal) => refusal_message(*refusal, proposal, session),
            Cause::Budget(Reason::CallIdConflict) => format!(
                "call id {:?} was already decided in this session for a different proposal",
                proposal.call_id
            ),
            Cause::Budget(Reason::SessionExpired) => {
                "the session is older than its profile allows".to_string()
            }
            Cause::Budget(reason) => format!("the session's {reason} is spent"),
            // The reviewer's reason, when they gave one, reaches the host.
            Cause::ApprovalDenied { note } if note.is_empty() => {
                "a reviewer denied this exact proposal".to_string()
            }
            Cause::ApprovalDenied { note } => {
                format!("a reviewer denied this exact proposal: {note}")
            }
            Cause::AwaitingApproval(_) => "a reviewer must approve this exact proposal".to_string(),
            Cause::AwaitingGrant(_) => {
                "a reviewer must grant this exact proposal before it is committed".to_string()
            }
            Cause::NotDispatchable(mode) => format!(
                "{tool:?} is a {mode:?} tool; only execute tools are committed through Dispatch"
            ),
            Cause::ReceiptConflict => format!(
                "call id {:?} was committed for a different proposal",
                proposal.call_id
            ),
            Cause::Replayed => "the stored receipt of the earlier commit".to_string(),
            Cause::Committed => quoted_then(tool, " committed"),
            Cause::StaleVersion { current } => format!(
                "the proposal was made against version {}, the state is at {current}",
                proposal.version
            ),
            Cause::MissingResource(found) => found.clone(),
            Cause::LogFull { capacity } => {
                format!("the receipt log holds {capacity} receipts, none past retention")
            }
        }
    }
}

/// `format!("{text:?}{rest}")`, without `fmt` when `text` is printable
/// ASCII without `"` or `\` (as a tool name of the policy always is), which
/// Debug writes as it is: every ALLOW's message names its tool.
fn quoted_then(text: &str, rest: &str) -> String {
    if canonical::plain_prefix_len(text.as_bytes()) < text.len() {
        return format!("{text:?}{rest}");
    }
    let mut message = String::with_capacity(text.len() + rest.len() + 2);
    message.push('"');
    message.push_str(text);
    message.push('"');
    message.push_str(rest);
    message
}

/// The message of a policy refusal.
fn refusal_message(refusal: Refusal, proposal: &Proposal, session: &SessionRef) -> String {
    let tool = &proposal.name;
    match refusal {
        Refusal::Forbidden => format!(
            "the proposal claims actor {:?} but the session runs as {:?}",
            proposal.actor, session.actor
        ),
        Refusal::UnknownTool => format!("no tool {tool:?} in the policy"),
        Refusal::ForbiddenTool => format!("tool {tool:?} is forbidden by policy"),
        Refusal::NotAuthorized => format!(
            "actor {:?} holds no role that may call {tool:?}",
            session.actor
        ),
        Refusal::UnknownActor => {
            format!("actor {:?} is not defined in the policy", session.actor)
        }
        Refusal::ManifestUnverified(status) => match status {
            ManifestStatus::Unpinned => format!(
                "the manifest server of {tool:?} has no pin: a reviewer pins its reviewed manifest, then the host assesses it"
            ),
            ManifestStatus::NeverAssessed => format!(
                "the manifest server of {tool:?} was never assessed: send its manifest with AssessManifest (`toolgate manifest assess FILE`) first"
            ),
            ManifestStatus::Differed => format!(
                "the last assessment of the manifest server of {tool:?} differed from its pin: its tools changed since review; re-review first"
            ),
            ManifestStatus::Unsafe => format!(
                "the last assessed manifest of the server of {tool:?} was unsafe (duplicate or empty tool names); re-review first"
            ),
            ManifestStatus::Verified => format!("the manifest server of {tool:?} is verified"),
        },
    }
}

/// The answer to Decide (SPEC §4).
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// Always `reason.outcome()`.
    pub outcome: Outcome,
    pub reason: Reason,
    pub message: String,
    pub fingerprint: Fingerprint,
    /// The approval involved, with its expiry.
    pub approval: Option<(Uuid, Timestamp)>,
}

impl Decision {
    /// The answer for this cause; its outcome is the reason's (DENY,
    /// failing closed, for a reason Decide never answers).
    pub fn answer(
        cause: &Cause,
        proposal: &Proposal,
        session: &SessionRef,
        approval: Option<(Uuid, Timestamp)>,
    ) -> Self {
        let why = cause.reason();
        Decision {
            outcome: why.outcome().unwrap_or(Outcome::Deny),
            reason: why,
            message: cause.message(proposal, session),
            fingerprint: proposal.fingerprint,
            approval,
        }
    }
}

/// Upper bound of what a Dispatch answer carries besides the value's JSON
/// text: status, reason, message (names are at most 64 bytes), fingerprint,
/// version, resource name, receipt id, approval id, policy revision, append
/// index and protobuf framing. A commit is refused when this plus the
/// value's canonical JSON would exceed the message limit, so that every
/// committed answer (and every replay of it) can be sent.
pub const ANSWER_OVERHEAD_BYTES: usize = 1024;

/// The answer to Dispatch.
#[derive(Debug, Clone, PartialEq)]
pub struct Dispatched {
    /// Always `reason.dispatch_status()`.
    pub status: DispatchStatus,
    /// For DENIED: the Decide reason.
    pub reason: Reason,
    pub message: String,
    pub fingerprint: Fingerprint,
    /// For OK and replays: the commit's result; for STALE_VERSION: only the
    /// current version.
    pub result: Option<CommitResult>,
    pub receipt_id: Option<Uuid>,
    pub replayed: bool,
    pub approval_id: Option<Uuid>,
}

impl Dispatched {
    /// The answer for this cause, with no result, receipt or approval; its
    /// status is the reason's (DENIED, failing closed, for a reason
    /// Dispatch never answers).
    pub fn answer(cause: &Cause, proposal: &Proposal, session: &SessionRef) -> Self {
        let why = cause.reason();
        Dispatched {
            status: why.dispatch_status().unwrap_or(DispatchStatus::Denied),
            reason: why,
            message: cause.message(proposal, session),
            fingerprint: proposal.fingerprint,
            result: None,
            receipt_id: None,
            replayed: false,
            approval_id: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_quoted_name_reads_as_debug_writes_it() {
        for text in [
            "read_file",
            "",
            "a b~!'#$%&()*+,-./:;<=>?@[]^_`{|}",
            "say \"hi\"",
            "back\\slash",
            "tab\there",
            "new\nline",
            "nul\u{0}",
            "del\u{7f}",
            "caf\u{e9}",
            "zero\u{200b}width",
            "\u{1f600}",
        ] {
            assert_eq!(quoted_then(text, " may run"), format!("{text:?} may run"));
        }
    }
}
