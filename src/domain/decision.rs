//! What Decide answers: the outcome, the stable reason and the message.

use uuid::Uuid;

use crate::domain::canonical::Fingerprint;
use crate::domain::clock::Timestamp;
use crate::domain::proposal::{Proposal, Refusal, SessionRef};
use crate::domain::resources::CommitResult;

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

    pub(crate) fn refused(refusal: Refusal, proposal: &Proposal, session: &SessionRef) -> Self {
        Decision::deny(
            proposal,
            refusal.reason(),
            refusal.message(proposal, session),
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DispatchStatus {
    Ok,
    Forbidden,
    UnknownTool,
    Denied,
    CallIdConflict,
    StaleVersion,
    ApprovalRequired,
    MissingResource,
    LogFull,
}

impl DispatchStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            DispatchStatus::Ok => "ok",
            DispatchStatus::Forbidden => "forbidden",
            DispatchStatus::UnknownTool => "unknown-tool",
            DispatchStatus::Denied => "denied",
            DispatchStatus::CallIdConflict => "call-id-conflict",
            DispatchStatus::StaleVersion => "stale-version",
            DispatchStatus::ApprovalRequired => "approval-required",
            DispatchStatus::MissingResource => "missing-resource",
            DispatchStatus::LogFull => "log-full",
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
    pub status: DispatchStatus,
    /// Stable kebab-case reason (for DENIED: the Decide reason).
    pub reason: &'static str,
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
    pub fn refused(
        status: DispatchStatus,
        reason: &'static str,
        message: String,
        fingerprint: Fingerprint,
    ) -> Self {
        Dispatched {
            status,
            reason,
            message,
            fingerprint,
            result: None,
            receipt_id: None,
            replayed: false,
            approval_id: None,
        }
    }
}
