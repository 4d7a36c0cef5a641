//! Request builders and what the tests read back from a refusal.

use super::pb;

/// A request carrying `authorization: Bearer <token>` (none when empty).
pub fn authed<T>(message: T, token: &str) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if !token.is_empty() {
        let value = format!("Bearer {token}").parse().expect("ascii token");
        request.metadata_mut().insert("authorization", value);
    }
    request
}

pub fn session(actor: &str, session_id: &str, workspace: &str) -> pb::Session {
    pb::Session {
        actor: actor.to_string(),
        session_id: session_id.to_string(),
        workspace: workspace.to_string(),
    }
}

pub fn proposal(
    call_id: &str,
    actor: &str,
    name: &str,
    version: u64,
    arguments_json: &str,
) -> pb::Proposal {
    pb::Proposal {
        call_id: call_id.to_string(),
        actor: actor.to_string(),
        name: name.to_string(),
        version,
        arguments_json: arguments_json.to_string(),
    }
}

pub fn decide_request(session: pb::Session, proposal: pb::Proposal) -> pb::DecideRequest {
    pb::DecideRequest {
        session: Some(session),
        proposal: Some(proposal),
    }
}

/// The simplest call `decide.toml` allows: payer reads a balance in
/// session `s1` of workspace acme.
pub fn read_balance(call_id: &str) -> pb::DecideRequest {
    decide_request(
        session("payer", "s1", "acme"),
        proposal(call_id, "payer", "read_balance", 0, "{}"),
    )
}

pub fn dispatch_request(session: pb::Session, proposal: pb::Proposal) -> pb::DispatchRequest {
    pb::DispatchRequest {
        session: Some(session),
        proposal: Some(proposal),
    }
}

/// The field path of an INVALID_ARGUMENT's first bad-request violation.
pub fn violation_field(status: &tonic::Status) -> String {
    first_violation(status)
        .map(|violation| violation.field)
        .unwrap_or_default()
}

/// The rule (description) of an INVALID_ARGUMENT's first bad-request
/// violation.
pub fn violation_rule(status: &tonic::Status) -> String {
    first_violation(status)
        .map(|violation| violation.description)
        .unwrap_or_default()
}

/// An INVALID_ARGUMENT naming `field`, whose message contains `text`.
pub fn assert_invalid(status: &tonic::Status, field: &str, text: &str) {
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert_eq!(violation_field(status), field, "{status:?}");
    assert!(status.message().contains(text), "{status:?}");
}

fn first_violation(status: &tonic::Status) -> Option<tonic_types::FieldViolation> {
    use tonic_types::StatusExt;
    status
        .get_details_bad_request()
        .and_then(|bad_request| bad_request.field_violations.first().cloned())
}

pub fn grant_request(
    approval_id: impl Into<String>,
    comment: impl Into<String>,
) -> pb::GrantApprovalRequest {
    pb::GrantApprovalRequest {
        approval_id: approval_id.into(),
        comment: comment.into(),
    }
}

pub fn deny_request(
    approval_id: impl Into<String>,
    reason: impl Into<String>,
) -> pb::DenyApprovalRequest {
    pb::DenyApprovalRequest {
        approval_id: approval_id.into(),
        reason: reason.into(),
    }
}

pub fn revoke_request(
    approval_id: impl Into<String>,
    reason: impl Into<String>,
) -> pb::RevokeApprovalRequest {
    pb::RevokeApprovalRequest {
        approval_id: approval_id.into(),
        reason: reason.into(),
    }
}

pub fn remove_pin_request(server_id: impl Into<String>) -> pb::RemovePinRequest {
    pb::RemovePinRequest {
        server_id: server_id.into(),
    }
}

pub fn pin_request(
    manifest: Option<pb::Manifest>,
    expected_fingerprint: impl Into<String>,
) -> pb::PinManifestRequest {
    pb::PinManifestRequest {
        manifest,
        expected_fingerprint: expected_fingerprint.into(),
    }
}
