//! Hostile reviews and listings (SPEC §5).

use super::*;

/// Reviewer authority ("forged reviewer": the token is the reviewer), verdicts on finished approvals, malformed ids, comments and reasons.
pub(super) fn reviewer_authority_cases(fx: &Fixture) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut add = |case: Case| cases.push(case);
    add(case(
        "a reviewer without the approver role",
        grant(BOB, &fx.pending, "decided_by: alice"),
        error(Code::PermissionDenied, "needs an approver role"),
    ));
    add(case(
        "a reviewer outside the request's workspace",
        grant(DAVE, &fx.pending, "ok"),
        error(Code::PermissionDenied, "workspace"),
    ));
    add(case(
        "a reviewer granting its own actor's request",
        grant(CAROL, &fx.carols, "ok"),
        error(Code::PermissionDenied, "own actor"),
    ));
    add(case(
        "a reviewer denying its own actor's request",
        Call::Deny(CAROL, deny_request(fx.carols.clone(), "no")),
        error(Code::PermissionDenied, "own actor"),
    ));
    add(case(
        "revoke by a reviewer without the role",
        Call::Revoke(BOB, revoke_request(fx.granted.clone(), "x")),
        error(Code::PermissionDenied, "needs an approver role"),
    ));
    add(case(
        "grant what is granted",
        grant(ALICE, &fx.granted, "again"),
        error(Code::FailedPrecondition, "not pending"),
    ));
    add(case(
        "grant what is denied",
        grant(ALICE, &fx.denied, "changed my mind"),
        error(Code::FailedPrecondition, "not pending"),
    ));
    add(case(
        "grant what is consumed",
        grant(ALICE, &fx.consumed, "again"),
        error(Code::FailedPrecondition, "not pending"),
    ));
    add(case(
        "revoke what is pending",
        Call::Revoke(ALICE, revoke_request(fx.pending.clone(), "x")),
        error(Code::FailedPrecondition, "only a granted approval"),
    ));
    add(case(
        "grant an unknown id",
        grant(ALICE, "6f1e2a9c-57f5-4c8e-9a55-0d3a1c2b4e5f", "ok"),
        error(Code::NotFound, "no approval"),
    ));
    add(case(
        "grant an id that is not a UUID",
        grant(ALICE, "not-a-uuid", "ok"),
        invalid("approval_id", "must be a UUID"),
    ));
    add(case(
        "grant an id with a cyrillic look-alike",
        grant(ALICE, &format!("{CYRILLIC_A}{}", &fx.pending[1..]), "ok"),
        invalid("approval_id", "must be a UUID"),
    ));
    add(case(
        "grant an empty id",
        grant(ALICE, "", "ok"),
        invalid("approval_id", "is required"),
    ));
    add(case(
        "grant a 512 KiB id",
        grant(ALICE, &"a".repeat(512 * 1024), "ok"),
        invalid("approval_id", "must be a UUID"),
    ));
    add(case(
        "grant with a 2,049-character comment",
        grant(ALICE, &fx.pending, &"x".repeat(2049)),
        invalid("comment", "at most 2048"),
    ));
    add(case(
        "grant with a 1 MiB comment: over the message limit",
        grant(ALICE, &fx.pending, &"x".repeat(MIB)),
        error(Code::ResourceExhausted, "too large"),
    ));
    add(case(
        "deny with a 2,049-character reason",
        Call::Deny(ALICE, deny_request(fx.pending.clone(), "é".repeat(2049))),
        invalid("reason", "at most 2048"),
    ));
    cases
}

section_test!(
    reviewer_authority,
    reviewer_authority_cases,
    Before::Fixture
);

/// ListApprovals with bad enums, page sizes and page tokens.
pub(super) fn list_approvals_cases(fx: &Fixture) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut add = |case: Case| cases.push(case);
    let list = |request: pb::ListApprovalsRequest| Call::List(CAROL, request);
    add(case(
        "unknown status enum value 99",
        list(pb::ListApprovalsRequest {
            status: 99,
            ..Default::default()
        }),
        invalid("status", "unknown status 99"),
    ));
    add(case(
        "negative status enum value",
        list(pb::ListApprovalsRequest {
            status: -1,
            ..Default::default()
        }),
        invalid("status", "unknown status -1"),
    ));
    add(case(
        "page size 501",
        list(pb::ListApprovalsRequest {
            page_size: 501,
            ..Default::default()
        }),
        invalid("page_size", "at most 500"),
    ));
    add(case(
        "page size u32::MAX",
        list(pb::ListApprovalsRequest {
            page_size: u32::MAX,
            ..Default::default()
        }),
        invalid("page_size", "at most 500"),
    ));
    for (name, token) in [
        ("garbage page token", "garbage".to_string()),
        (
            "page token with an overflowing timestamp",
            format!("18446744073709551616.{}", fx.pending),
        ),
        (
            "page token with arabic-indic digits",
            format!("١٢٣.{}", fx.pending),
        ),
        ("page token of 512 KiB", "1".repeat(512 * 1024)),
    ] {
        add(case(
            name,
            list(pb::ListApprovalsRequest {
                page_token: token,
                ..Default::default()
            }),
            invalid("page_token", "not a token from a previous"),
        ));
    }
    add(case(
        "filter by a look-alike actor is refused, naming the field",
        list(pb::ListApprovalsRequest {
            actor: format!("p{CYRILLIC_A}yer"),
            ..Default::default()
        }),
        invalid("actor", "must match"),
    ));
    add(case(
        "filter by the actor in other capitals finds nothing",
        list(pb::ListApprovalsRequest {
            actor: "PAYER".into(),
            ..Default::default()
        }),
        Expect::Listed(0),
    ));
    cases
}

section_test!(list_approvals, list_approvals_cases, Before::Fixture);
