//! `TryFrom<pb::X>` for domain types and `From<domain> for pb::X`. Field
//! paths in errors are the request's own (`manifest.tools[1].name`).

use crate::domain::canonical::{self, Fingerprint, Value};
use crate::domain::clock::Timestamp;
use crate::domain::decision::{Decision, Outcome, Reason};
use crate::domain::decision::{DispatchStatus, Dispatched};
use crate::domain::error::{Error, Result};
use crate::domain::ledger::{Approval, ApprovalEvent, ApprovalStatus, EventKind, ListQuery};
use crate::domain::limits::queue_page_token;
use crate::domain::manifest::{
    AssessReason, Assessment, MAX_INPUT_SCHEMA_LEN, Manifest, ManifestTool, ToolChange, ToolDiff,
};
use crate::domain::pins::{PinRecord, PinSource};
use crate::domain::proposal::{Proposal, SessionRef};
use crate::domain::resources::{CommitResult, ResourcePage};
use crate::domain::session::SessionSummary;
use crate::domain::state::ResourceList;
use crate::edge::status::note_session;
use crate::pb;

pub(crate) fn timestamp(time: Timestamp) -> prost_types::Timestamp {
    let millis = i64::try_from(time.0).unwrap_or(i64::MAX);
    prost_types::Timestamp {
        seconds: millis.div_euclid(1000),
        nanos: i32::try_from(millis.rem_euclid(1000) * 1_000_000).unwrap_or(0),
    }
}

/// A required message field: `None` is an invalid argument naming it.
pub(crate) fn required<T>(value: Option<T>, field: &str) -> Result<T> {
    value.ok_or_else(|| Error::invalid(field, "is required"))
}

/// An optional fingerprint in hex; empty means absent.
pub(crate) fn optional_fingerprint(hex: &str, field: &str) -> Result<Option<Fingerprint>> {
    if hex.is_empty() {
        return Ok(None);
    }
    Fingerprint::from_hex(hex)
        .map(Some)
        .ok_or_else(|| Error::invalid(field, "must be 64 hexadecimal characters (SHA-256)"))
}

impl TryFrom<pb::Manifest> for Manifest {
    type Error = Error;

    /// Paths in errors are relative to the manifest (`tools[1].name`); the
    /// caller puts the request field in front with `Error::under`.
    fn try_from(message: pb::Manifest) -> Result<Self> {
        // Before any tool's JSON is parsed into a tree: a message of many
        // small tools would otherwise be parsed whole to be refused.
        crate::domain::manifest::check_tool_count(message.tools.len())?;
        let tools = message
            .tools
            .into_iter()
            .enumerate()
            .map(|(index, tool)| {
                manifest_tool(tool).map_err(|error| error.under(&format!("tools[{index}]")))
            })
            .collect::<Result<Vec<_>>>()?;
        Manifest::new(message.server_id, message.revision, tools).map_err(proto_field_names)
    }
}

/// The domain names the reference's keys (`server`, `tools[1].tool`,
/// `tools[1].inputSchema`); a gRPC caller is told its own field names.
fn proto_field_names(error: Error) -> Error {
    let Error::InvalidArgument { field, rule } = error else {
        return error;
    };
    let renamed = [
        ("server", "server_id"),
        ("tool", "name"),
        ("inputSchema", "input_schema_json"),
        ("outputSchema", "output_schema_json"),
        ("annotations", "annotations_json"),
    ];
    let (head, last) = match field.rsplit_once('.') {
        Some((head, last)) => (Some(head), last),
        None => (None, field.as_str()),
    };
    let Some((_, proto)) = renamed.iter().find(|(domain, _)| *domain == last) else {
        return Error::InvalidArgument { field, rule };
    };
    let field = match head {
        Some(head) => format!("{head}.{proto}"),
        None => proto.to_string(),
    };
    Error::InvalidArgument { field, rule }
}

fn manifest_tool(tool: pb::ManifestTool) -> Result<ManifestTool> {
    Ok(ManifestTool {
        input_schema: json_object_field(&tool.input_schema_json, "input_schema_json")?,
        output_schema: json_object_field(&tool.output_schema_json, "output_schema_json")?,
        annotations: json_object_field(&tool.annotations_json, "annotations_json")?,
        name: tool.name,
        description: tool.description,
        parameters: tool.parameters,
        read_only: tool.read_only,
        scopes: tool.scopes,
        title: tool.title,
    })
}

/// An optional JSON-object field sent as text; empty means absent.
fn json_object_field(text: &str, field: &str) -> Result<Option<Value>> {
    if text.is_empty() {
        return Ok(None);
    }
    // The text's own bound is looser: the one that counts is the canonical
    // text's (`Manifest::new`), as for a manifest read from a file.
    if text.len() > 4 * MAX_INPUT_SCHEMA_LEN {
        return Err(Error::invalid(
            field,
            format!(
                "must be at most {MAX_INPUT_SCHEMA_LEN} bytes of canonical JSON (and \
                 {} as sent)",
                4 * MAX_INPUT_SCHEMA_LEN
            ),
        ));
    }
    let value =
        canonical::parse_str(text).map_err(|error| Error::invalid(field, error.to_string()))?;
    if !matches!(value, Value::Object(_)) {
        return Err(Error::invalid(field, "must be a JSON object"));
    }
    Ok(Some(value))
}

impl From<Assessment> for pb::AssessManifestResponse {
    fn from(assessment: Assessment) -> Self {
        let reason = match assessment.reason {
            AssessReason::Matched => pb::AssessReason::Matched,
            AssessReason::Changed => pb::AssessReason::Changed,
            AssessReason::Unpinned => pb::AssessReason::Unpinned,
        };
        pb::AssessManifestResponse {
            accepted: assessment.accepted,
            reason: reason.into(),
            fingerprint: assessment.fingerprint.to_hex(),
            pinned_fingerprint: assessment
                .pinned_fingerprint
                .map(|fingerprint| fingerprint.to_hex())
                .unwrap_or_default(),
            diffs: assessment
                .diffs
                .into_iter()
                .map(pb::ToolDiff::from)
                .collect(),
            diff_available: assessment.diff_available,
            pinned_revision: assessment.pinned_revision.unwrap_or_default(),
        }
    }
}

impl From<ToolDiff> for pb::ToolDiff {
    fn from(diff: ToolDiff) -> Self {
        let change = match diff.change {
            ToolChange::Added => pb::ToolChange::Added,
            ToolChange::Removed => pb::ToolChange::Removed,
            ToolChange::Modified => pb::ToolChange::Modified,
            ToolChange::Unsafe => pb::ToolChange::Unsafe,
        };
        let (problem, problem_message) = match &diff.problem {
            Some(problem) => (problem.kind.as_str().to_string(), problem.to_string()),
            None => (String::new(), String::new()),
        };
        pb::ToolDiff {
            tool: diff.tool,
            change: change.into(),
            description_changed: diff.description_changed,
            parameters_changed: diff.parameters_changed,
            scopes_changed: diff.scopes_changed,
            read_only_changed: diff.read_only_changed,
            input_schema_changed: diff.input_schema_changed,
            parameters_added: diff.parameters_added,
            parameters_removed: diff.parameters_removed,
            scopes_added: diff.scopes_added,
            scopes_removed: diff.scopes_removed,
            widened: diff.widened,
            title_changed: diff.title_changed,
            output_schema_changed: diff.output_schema_changed,
            annotations_changed: diff.annotations_changed,
            problem,
            problem_message,
        }
    }
}

impl From<PinRecord> for pb::Pin {
    fn from(record: PinRecord) -> Self {
        let source = match record.source {
            PinSource::Policy => pb::PinSource::Policy,
            PinSource::Api => pb::PinSource::Api,
        };
        pb::Pin {
            server_id: record.server_id,
            fingerprint: record.fingerprint.to_hex(),
            revision: record.revision.unwrap_or_default(),
            source: source.into(),
            pinned_by: record.pinned_by.unwrap_or_default(),
            pinned_at: record.pinned_at.map(timestamp),
            tool_count: u32::try_from(record.tool_count).unwrap_or(u32::MAX),
        }
    }
}

impl From<&Manifest> for pb::Manifest {
    fn from(manifest: &Manifest) -> Self {
        pb::Manifest {
            server_id: manifest.server_id.clone(),
            revision: manifest.revision.clone(),
            tools: manifest
                .tools
                .iter()
                .map(|tool| pb::ManifestTool {
                    name: tool.name.clone(),
                    description: tool.description.clone(),
                    parameters: tool.parameters.clone(),
                    read_only: tool.read_only,
                    scopes: tool.scopes.clone(),
                    input_schema_json: json_text(tool.input_schema.as_ref()),
                    title: tool.title.clone(),
                    output_schema_json: json_text(tool.output_schema.as_ref()),
                    annotations_json: json_text(tool.annotations.as_ref()),
                })
                .collect(),
        }
    }
}

fn json_text(value: Option<&Value>) -> String {
    value.map(canonical::to_canonical).unwrap_or_default()
}

/// The trusted session and the proposal of a Decide or Dispatch request,
/// validated in the order of the message (session first). A proposal
/// refused after its session parsed has the session noted for its audit
/// line ([`note_session`]).
pub(crate) fn session_and_proposal(
    session: Option<pb::Session>,
    proposal: Option<pb::Proposal>,
) -> Result<(SessionRef, Proposal)> {
    let session = required(session, "session")?;
    let session = SessionRef::new(session.actor, session.session_id, session.workspace)
        .map_err(|error| error.under("session"))?;
    let proposal = required(proposal, "proposal")
        .and_then(|proposal| {
            Proposal::new(
                proposal.call_id,
                proposal.actor,
                proposal.name,
                proposal.version,
                &proposal.arguments_json,
            )
            .map_err(|error| error.under("proposal"))
        })
        .inspect_err(|_| note_session(&session))?;
    Ok((session, proposal))
}

impl From<Outcome> for pb::Outcome {
    fn from(outcome: Outcome) -> pb::Outcome {
        match outcome {
            Outcome::Allow => pb::Outcome::Allow,
            Outcome::Deny => pb::Outcome::Deny,
            Outcome::RequireApproval => pb::Outcome::RequireApproval,
        }
    }
}

impl From<DispatchStatus> for pb::DispatchStatus {
    fn from(status: DispatchStatus) -> pb::DispatchStatus {
        match status {
            DispatchStatus::Ok => pb::DispatchStatus::Ok,
            DispatchStatus::Forbidden => pb::DispatchStatus::Forbidden,
            DispatchStatus::UnknownTool => pb::DispatchStatus::UnknownTool,
            DispatchStatus::Denied => pb::DispatchStatus::Denied,
            DispatchStatus::CallIdConflict => pb::DispatchStatus::CallIdConflict,
            DispatchStatus::StaleVersion => pb::DispatchStatus::StaleVersion,
            DispatchStatus::ApprovalRequired => pb::DispatchStatus::ApprovalRequired,
            DispatchStatus::MissingResource => pb::DispatchStatus::MissingResource,
            DispatchStatus::LogFull => pb::DispatchStatus::LogFull,
        }
    }
}

pub(crate) fn decide_response(decision: Decision, policy_revision: String) -> pb::DecideResponse {
    let outcome = pb::Outcome::from(decision.outcome);
    pb::DecideResponse {
        outcome: outcome.into(),
        reason: decision.reason.as_str().to_string(),
        message: decision.message,
        fingerprint: decision.fingerprint.to_hex(),
        policy_revision,
        approval_id: decision
            .approval
            .map(|(id, _)| id.to_string())
            .unwrap_or_default(),
        approval_expires_at: decision
            .approval
            .map(|(_, expires_at)| timestamp(expires_at)),
    }
}

pub(crate) fn session_info(session: SessionSummary) -> pb::SessionInfo {
    pb::SessionInfo {
        work_units: session.work_units,
        session_id: session.session_id,
        actor: session.actor,
        workspace: session.workspace,
        decisions: session.decisions,
        tool_attempts: session.tool_attempts,
        executed_tools: session.executed_tools,
        stopped_reason: session
            .stopped_reason
            .map_or("", Reason::as_str)
            .to_string(),
        started_at: Some(timestamp(session.started_at)),
    }
}

/// Every approval status and its protobuf value: the one table both
/// conversions read (the names are `ApprovalStatus::as_str`).
const APPROVAL_STATUSES: [(ApprovalStatus, pb::ApprovalStatus); 6] = [
    (ApprovalStatus::Pending, pb::ApprovalStatus::Pending),
    (ApprovalStatus::Granted, pb::ApprovalStatus::Granted),
    (ApprovalStatus::Denied, pb::ApprovalStatus::Denied),
    (ApprovalStatus::Expired, pb::ApprovalStatus::Expired),
    (ApprovalStatus::Consumed, pb::ApprovalStatus::Consumed),
    (ApprovalStatus::Revoked, pb::ApprovalStatus::Revoked),
];

impl From<ApprovalStatus> for pb::ApprovalStatus {
    fn from(status: ApprovalStatus) -> Self {
        APPROVAL_STATUSES
            .iter()
            .find(|(domain, _)| *domain == status)
            .map_or(pb::ApprovalStatus::Unspecified, |(_, wire)| *wire)
    }
}

/// `UNSPECIFIED` is no status.
impl TryFrom<pb::ApprovalStatus> for ApprovalStatus {
    type Error = pb::ApprovalStatus;

    fn try_from(status: pb::ApprovalStatus) -> std::result::Result<Self, pb::ApprovalStatus> {
        APPROVAL_STATUSES
            .iter()
            .find(|(_, wire)| *wire == status)
            .map(|(domain, _)| *domain)
            .ok_or(status)
    }
}

impl From<Approval> for pb::Approval {
    fn from(approval: Approval) -> Self {
        pb::Approval {
            approval_id: approval.id.to_string(),
            fingerprint: approval.request.fingerprint.to_hex(),
            actor: approval.request.actor,
            session_id: approval.request.session_id,
            workspace: approval.request.workspace,
            tool: approval.request.tool,
            call_id: approval.request.call_id,
            arguments_json: approval.request.arguments_view,
            reason: approval.request.reason.to_string(),
            status: pb::ApprovalStatus::from(approval.status).into(),
            requested_at: Some(timestamp(approval.requested_at)),
            expires_at: Some(timestamp(approval.expires_at)),
            decided_by: approval.decided_by.unwrap_or_default(),
            decided_at: approval.decided_at.map(timestamp),
            decision_note: approval.decision_note,
            version: approval.request.version,
        }
    }
}

impl From<ApprovalEvent> for pb::ApprovalEvent {
    fn from(event: ApprovalEvent) -> Self {
        let kind = match event.kind {
            EventKind::Requested => pb::ApprovalEventKind::Requested,
            EventKind::Granted => pb::ApprovalEventKind::Granted,
            EventKind::Denied => pb::ApprovalEventKind::Denied,
            EventKind::Revoked => pb::ApprovalEventKind::Revoked,
            EventKind::Expired => pb::ApprovalEventKind::Expired,
            EventKind::Consumed => pb::ApprovalEventKind::Consumed,
        };
        pb::ApprovalEvent {
            kind: kind.into(),
            approval: Some(event.approval.into()),
            lagged: 0,
        }
    }
}

/// Filters and paging of a `ListApprovals` request (the viewer is the
/// caller's to set).
pub(crate) fn list_query(request: pb::ListApprovalsRequest) -> Result<ListQuery> {
    let status = pb::ApprovalStatus::try_from(request.status)
        .map_err(|_| Error::invalid("status", format!("unknown status {}", request.status)))?;
    ListQuery::new(
        ApprovalStatus::try_from(status).ok(),
        request.actor,
        request.tool,
        &request.approval_id_prefix,
        request.page_size,
        &request.page_token,
    )
}

/// A page of a resource, as `GetResource` answers it.
pub(crate) fn resource_page(name: String, page: ResourcePage) -> pb::Resource {
    pb::Resource {
        name,
        value_json: page.value_json,
        version: page.version,
        next_page_token: page.next.map(queue_page_token).unwrap_or_default(),
        item_count: page.item_count,
        first_index: page.first_index,
    }
}

impl From<ResourceList> for pb::ListResourcesResponse {
    fn from(page: ResourceList) -> Self {
        let resources = page
            .resources
            .into_iter()
            .map(|listed| resource_page(listed.name, listed.page));
        pb::ListResourcesResponse {
            resources: resources.collect(),
            next_page_token: page.next.unwrap_or_default(),
        }
    }
}

pub(crate) fn dispatch_response(
    dispatched: Dispatched,
    policy_revision: String,
) -> pb::DispatchResponse {
    let status = pb::DispatchStatus::from(dispatched.status);
    let result = dispatched.result.unwrap_or(CommitResult {
        version: 0,
        resource: None,
        value: None,
        appended_index: None,
    });
    pb::DispatchResponse {
        status: status.into(),
        reason: dispatched.reason.as_str().to_string(),
        message: dispatched.message,
        fingerprint: dispatched.fingerprint.to_hex(),
        version: result.version,
        resource: result.resource.unwrap_or_default(),
        value_json: result
            .value
            .as_ref()
            .map(canonical::to_canonical)
            .unwrap_or_default(),
        receipt_id: dispatched
            .receipt_id
            .map(|id| id.to_string())
            .unwrap_or_default(),
        replayed: dispatched.replayed,
        approval_id: dispatched
            .approval_id
            .map(|id| id.to_string())
            .unwrap_or_default(),
        policy_revision,
        appended_index: result.appended_index,
    }
}
