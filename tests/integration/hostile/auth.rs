//! Tokens of the wrong kind, on every RPC (SPEC §3).

use super::*;

/// Missing, unknown and wrong-kind tokens on every RPC.
pub(super) fn tokens_of_the_wrong_kind_cases(fx: &Fixture) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut add = |case: Case| cases.push(case);
    add(case(
        "decide without a token",
        Call::Decide("", decide_request(payer(), read("{}"))),
        error(Code::Unauthenticated, "missing"),
    ));
    add(case(
        "decide with an unknown token",
        Call::Decide("HOST-SECRET", decide_request(payer(), read("{}"))),
        error(Code::Unauthenticated, "unknown token"),
    ));
    add(case(
        "decide with a reviewer token",
        Call::Decide(ALICE, decide_request(payer(), read("{}"))),
        error(Code::PermissionDenied, "reviewer credential"),
    ));
    add(case(
        "decide as a host that may not assert this actor",
        Call::Decide(OTHER_HOST, decide_request(payer(), read("{}"))),
        error(Code::PermissionDenied, "may not act for actor"),
    ));
    add(case(
        "dispatch with a reviewer token",
        Call::Dispatch(
            ALICE,
            pb::DispatchRequest {
                session: Some(payer()),
                proposal: Some(ticket("c-t2", 1, "sensor", "done")),
            },
        ),
        error(Code::PermissionDenied, "reviewer credential"),
    ));
    add(case(
        "dispatch a granted proposal as a host that may not assert the actor",
        Call::Dispatch(
            OTHER_HOST,
            pb::DispatchRequest {
                session: Some(payer()),
                proposal: Some(ticket("c-t2", 1, "sensor", "done")),
            },
        ),
        error(Code::PermissionDenied, "may not act for actor"),
    ));
    add(case(
        "a host token cannot grant",
        grant(HOST, &fx.pending, "ok"),
        error(Code::PermissionDenied, "host credential"),
    ));
    add(case(
        "grant without a token",
        grant("", &fx.pending, "ok"),
        error(Code::Unauthenticated, "missing"),
    ));
    add(case(
        "get approval with a host token",
        Call::GetApproval(
            HOST,
            pb::GetApprovalRequest {
                approval_id: fx.pending.clone(),
            },
        ),
        error(Code::PermissionDenied, "host credential"),
    ));
    add(case(
        "list approvals with a host token",
        Call::List(HOST, pb::ListApprovalsRequest::default()),
        error(Code::PermissionDenied, "host credential"),
    ));
    add(case(
        "pin with a host token",
        Call::Pin(
            HOST,
            pb::PinManifestRequest {
                manifest: Some(manifest("evil", vec![tool("x")])),
                expected_fingerprint: String::new(),
            },
        ),
        error(Code::PermissionDenied, "host credential"),
    ));
    add(case(
        "remove a pin with a host token",
        Call::RemovePin(
            HOST,
            pb::RemovePinRequest {
                server_id: "billing-api".into(),
            },
        ),
        error(Code::PermissionDenied, "host credential"),
    ));
    add(case(
        "assess with a reviewer token",
        Call::Assess(
            ALICE,
            pb::AssessManifestRequest {
                manifest: Some(docs_search()),
            },
        ),
        error(Code::PermissionDenied, "reviewer credential"),
    ));
    add(case(
        "get session with a reviewer token",
        Call::GetSession(
            ALICE,
            pb::GetSessionRequest {
                session_id: "s-base".into(),
            },
        ),
        error(Code::PermissionDenied, "reviewer credential"),
    ));
    add(case(
        "another host's session",
        Call::GetSession(
            OTHER_HOST,
            pb::GetSessionRequest {
                session_id: "s-carol".into(),
            },
        ),
        // Indistinguishable from a missing session: no existence oracle.
        error(Code::NotFound, "no session \"s-carol\" for this host"),
    ));
    add(case(
        "get resource without a token",
        Call::GetResource(
            "",
            pb::GetResourceRequest {
                name: "lamp".into(),
                ..Default::default()
            },
        ),
        error(Code::Unauthenticated, "missing"),
    ));
    cases
}

section_test!(
    tokens_of_the_wrong_kind,
    tokens_of_the_wrong_kind_cases,
    Before::Fixture
);
