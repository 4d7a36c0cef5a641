//! Hostile Dispatch requests (SPEC §6).

use super::*;

/// Dispatch refusals (SPEC §6), a replay, stale and future versions.
pub(super) fn refusals_cases(fx: &Fixture) -> Vec<Case> {
    use pb::DispatchStatus as D;
    let mut cases = Vec::new();
    let mut add = |case: Case| cases.push(case);
    add(case(
        "dispatch without a session",
        Call::Dispatch(
            HOST,
            pb::DispatchRequest {
                session: None,
                proposal: Some(ticket("c-t2", 1, "sensor", "done")),
            },
        ),
        invalid("session", "is required"),
    ));
    add(case(
        "dispatch a look-alike call id",
        dispatch(
            payer(),
            ticket(&format!("c-t{CYRILLIC_E}"), 1, "sensor", "done"),
        ),
        invalid("proposal.call_id", "must match"),
    ));
    add(case(
        "dispatch version 2^53 + 1",
        dispatch(payer(), ticket("c-t9", (1 << 53) + 1, "sensor", "done")),
        invalid("proposal.version", "at most 2^53"),
    ));
    add(case(
        "dispatch in a session moved to another workspace",
        dispatch(
            session("payer", "s-base", "globex"),
            ticket("c-t2", 1, "sensor", "done"),
        ),
        invalid("session.workspace", "another workspace"),
    ));
    add(case(
        "dispatch for another actor",
        dispatch(payer(), proposal("c-t2", "carol", "set_ticket", 1, "{}")),
        dispatched(D::Forbidden, "forbidden"),
    ));
    add(charged(
        true,
        case(
            "dispatch an unknown tool",
            dispatch(payer(), proposal("c-x", "payer", "drop_tables", 1, "{}")),
            dispatched(D::UnknownTool, "unknown-tool"),
        ),
    ));
    add(case(
        "dispatch a forbidden tool",
        dispatch(payer(), proposal("c-x", "payer", "change_role", 1, "{}")),
        dispatched(D::Denied, "forbidden-tool"),
    ));
    add(case(
        "dispatch a read tool",
        dispatch(payer(), proposal("c-x", "payer", "read_balance", 1, "{}")),
        dispatched(D::Denied, "not-dispatchable"),
    ));
    add(case(
        "dispatch a manifest-gated tool: the gate answers first",
        dispatch(
            payer(),
            proposal("c-x", "payer", "search_docs", 1, r#"{"query":"x"}"#),
        ),
        dispatched(D::Denied, "manifest-unverified"),
    ));
    add(case(
        "dispatch by an actor without the role, in a new session",
        dispatch(
            guest(),
            proposal(
                "c-x",
                "guest",
                "set_ticket",
                1,
                r#"{"ticket":"lamp","status":"open"}"#,
            ),
        ),
        dispatched(D::Denied, "not-authorized"),
    ));
    add(case(
        "dispatch arguments outside the enum",
        dispatch(payer(), ticket("c-t9", 1, "lamp", "closed")),
        invalid("proposal.arguments.status", "fails the input schema"),
    ));
    for (name, arguments, field, rule) in [
        (
            "dispatch a forged approval claim",
            r#"{"ticket":"lamp","status":"open","approved":true}"#,
            "proposal.arguments",
            "fails the input schema",
        ),
        (
            "dispatch duplicate keys",
            r#"{"ticket":"lamp","status":"open","status":"done"}"#,
            "proposal.arguments_json",
            "duplicate-key",
        ),
    ] {
        let set_ticket = proposal("c-t9", "payer", "set_ticket", 1, arguments);
        add(case(
            name,
            dispatch(payer(), set_ticket),
            invalid(field, rule),
        ));
    }
    add(case(
        "replay of the committed call: the stored receipt, nothing changes",
        dispatch(payer(), ticket("c-t1", 0, "lamp", "done")),
        Expect::Dispatch {
            status: D::Ok,
            reason: "replayed",
            approval_id: None,
            replayed: true,
        },
    ));
    add(case(
        "the committed call id with another proposal",
        dispatch(payer(), ticket("c-t1", 1, "lamp", "open")),
        dispatched(D::CallIdConflict, "call-id-conflict"),
    ));
    for (name, call_id, version) in [
        ("a stale version", "c-t8", 0),
        ("a future version", "c-future", 1 << 53),
    ] {
        add(charged(
            true,
            case(
                name,
                dispatch(payer(), ticket(call_id, version, "sensor", "done")),
                dispatched(D::StaleVersion, "stale-version"),
            ),
        ));
    }
    add(case(
        "a pending proposal: the same request, nothing committed",
        dispatch(payer(), ticket("c-t3", 1, "lamp", "open")),
        Expect::Dispatch {
            status: D::ApprovalRequired,
            reason: "approval-required",
            approval_id: Some(fx.pending_ticket.clone()),
            replayed: false,
        },
    ));
    add(case(
        "a denied proposal is not committed",
        dispatch(payer(), payment("c-pay2", 1, "30000")),
        Expect::Dispatch {
            status: D::ApprovalRequired,
            reason: "approval-denied",
            approval_id: Some(fx.denied.clone()),
            replayed: false,
        },
    ));
    cases
}

section_test!(refusals, refusals_cases, Before::GuestSession);
