//! The vocabulary of answers: Decide's outcomes, the stable reasons of
//! Decide and Dispatch (SPEC §4, §6) and Dispatch's statuses, each with
//! its wire name and the list of all of them (metrics register from it).

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    Allow,
    Deny,
    RequireApproval,
}

impl Outcome {
    pub const ALL: [Outcome; 3] = [Outcome::Allow, Outcome::Deny, Outcome::RequireApproval];

    /// The outcome as the audit line and the metrics label name it.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Allow => "allow",
            Outcome::Deny => "deny",
            Outcome::RequireApproval => "require_approval",
        }
    }
}

/// Every stable reason Decide (SPEC §4) and Dispatch (SPEC §6) answer with.
/// The wire strings are part of the contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Reason {
    /// Decide step 7.
    Allowed,
    /// Decide step 8: a grant.
    Approved,
    /// Step 2: the claimed actor is not the session's.
    Forbidden,
    /// Step 3.
    UnknownTool,
    ForbiddenTool,
    NotAuthorized,
    /// Decide step 4 (Dispatch step 3).
    ManifestUnverified,
    /// Decide step 6 (a call id decided for another fingerprint) or Dispatch
    /// step 4 (committed for another fingerprint).
    CallIdConflict,
    /// Charging: the decisions are spent.
    DecisionBudget,
    /// Decide step 6.
    ToolBudget,
    SessionExpired,
    /// Decide step 8 / Dispatch step 6: a reviewer denied the proposal.
    ApprovalDenied,
    /// Decide step 8 / Dispatch step 6: approval pending (rule `always`).
    ApprovalRequired,
    /// Decide step 8 / Dispatch step 6: approval pending (rule `threshold`).
    ApprovalThresholdExceeded,
    /// Dispatch step 3: only `execute` tools are committed.
    NotDispatchable,
    /// Dispatch step 4: the stored result of an earlier commit.
    Replayed,
    /// Dispatch step 9.
    Committed,
    /// Dispatch step 5.
    StaleVersion,
    /// Dispatch step 7.
    MissingResource,
    /// Dispatch step 8.
    LogFull,
}

impl Reason {
    /// Decide's reasons first, in the order of its checks, then Dispatch's own.
    pub const ALL: [Reason; 20] = [
        Reason::Allowed,
        Reason::Approved,
        Reason::Forbidden,
        Reason::UnknownTool,
        Reason::ForbiddenTool,
        Reason::NotAuthorized,
        Reason::ManifestUnverified,
        Reason::CallIdConflict,
        Reason::DecisionBudget,
        Reason::ToolBudget,
        Reason::SessionExpired,
        Reason::ApprovalDenied,
        Reason::ApprovalRequired,
        Reason::ApprovalThresholdExceeded,
        Reason::NotDispatchable,
        Reason::Replayed,
        Reason::Committed,
        Reason::StaleVersion,
        Reason::MissingResource,
        Reason::LogFull,
    ];

    /// The stable kebab-case wire string.
    pub fn as_str(self) -> &'static str {
        match self {
            Reason::Allowed => "allowed",
            Reason::Approved => "approved",
            Reason::Forbidden => "forbidden",
            Reason::UnknownTool => "unknown-tool",
            Reason::ForbiddenTool => "forbidden-tool",
            Reason::NotAuthorized => "not-authorized",
            Reason::ManifestUnverified => "manifest-unverified",
            Reason::CallIdConflict => "call-id-conflict",
            Reason::DecisionBudget => "decision-budget",
            Reason::ToolBudget => "tool-budget",
            Reason::SessionExpired => "session-expired",
            Reason::ApprovalDenied => "approval-denied",
            Reason::ApprovalRequired => "approval-required",
            Reason::ApprovalThresholdExceeded => "approval-threshold-exceeded",
            Reason::NotDispatchable => "not-dispatchable",
            Reason::Replayed => "replayed",
            Reason::Committed => "committed",
            Reason::StaleVersion => "stale-version",
            Reason::MissingResource => "missing-resource",
            Reason::LogFull => "log-full",
        }
    }

    /// The Decide outcome this reason always comes with; `None` for the
    /// reasons only Dispatch answers.
    pub fn outcome(self) -> Option<Outcome> {
        match self {
            Reason::Allowed | Reason::Approved => Some(Outcome::Allow),
            Reason::Forbidden
            | Reason::UnknownTool
            | Reason::ForbiddenTool
            | Reason::NotAuthorized
            | Reason::ManifestUnverified
            | Reason::CallIdConflict
            | Reason::DecisionBudget
            | Reason::ToolBudget
            | Reason::SessionExpired
            | Reason::ApprovalDenied => Some(Outcome::Deny),
            Reason::ApprovalRequired | Reason::ApprovalThresholdExceeded => {
                Some(Outcome::RequireApproval)
            }
            Reason::NotDispatchable
            | Reason::Replayed
            | Reason::Committed
            | Reason::StaleVersion
            | Reason::MissingResource
            | Reason::LogFull => None,
        }
    }

    /// The Dispatch status this reason always comes with; `None` for the
    /// reasons only Decide answers.
    pub fn dispatch_status(self) -> Option<DispatchStatus> {
        match self {
            Reason::Allowed | Reason::Approved => None,
            Reason::Replayed | Reason::Committed => Some(DispatchStatus::Ok),
            Reason::Forbidden => Some(DispatchStatus::Forbidden),
            Reason::UnknownTool => Some(DispatchStatus::UnknownTool),
            Reason::ForbiddenTool
            | Reason::NotAuthorized
            | Reason::ManifestUnverified
            | Reason::NotDispatchable
            | Reason::DecisionBudget
            | Reason::ToolBudget
            | Reason::SessionExpired => Some(DispatchStatus::Denied),
            Reason::CallIdConflict => Some(DispatchStatus::CallIdConflict),
            Reason::StaleVersion => Some(DispatchStatus::StaleVersion),
            Reason::ApprovalDenied
            | Reason::ApprovalRequired
            | Reason::ApprovalThresholdExceeded => Some(DispatchStatus::ApprovalRequired),
            Reason::MissingResource => Some(DispatchStatus::MissingResource),
            Reason::LogFull => Some(DispatchStatus::LogFull),
        }
    }
}

impl std::fmt::Display for Reason {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
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
    pub const ALL: [DispatchStatus; 9] = [
        DispatchStatus::Ok,
        DispatchStatus::Forbidden,
        DispatchStatus::UnknownTool,
        DispatchStatus::Denied,
        DispatchStatus::CallIdConflict,
        DispatchStatus::StaleVersion,
        DispatchStatus::ApprovalRequired,
        DispatchStatus::MissingResource,
        DispatchStatus::LogFull,
    ];

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
