//! Decide, sessions and budgets, the approval ledger and the reviewer API
//! over real gRPC (SPEC §4, §5), on `tests/fixtures/decide.toml`.

use std::collections::HashSet;
use std::time::Duration;

use tonic::Code;

use crate::support::policies::{DECIDE as POLICY, integer, policy_text, policy_with, repo_path};
use crate::support::tokens::{ALICE, BOB, BUDGET_REVIEWER, CAROL, DAVE, HOST, HOST_A, HOST_B};
use crate::support::{
    Manifest, Policy, TestServer, authed, pb, proposal, session, violation_field,
};
use crate::support::{deny_request, revoke_request};

fn payment(call_id: &str, actor: &str, amount: u64) -> pb::Proposal {
    proposal(
        call_id,
        actor,
        "payment_execute",
        0,
        &format!(r#"{{"amount": {amount}, "account_number": "12345678"}}"#),
    )
}

/// `token` grants `id`, and the server refuses it with `code`.
async fn grant_refused(
    server: &TestServer,
    token: &str,
    id: &str,
    code: Code,
    why: &str,
) -> tonic::Status {
    let status = server.grant(token, id).await.expect_err(why);
    assert_eq!(status.code(), code, "{why}: {status:?}");
    status
}

/// `token` grants `id`.
async fn grant_ok(server: &TestServer, token: &str, id: &str, why: &str) {
    server.grant(token, id).await.expect(why);
}

/// The status of approval `id`, as alice reads it.
async fn approval_status(server: &TestServer, id: &str) -> pb::ApprovalStatus {
    server.get_approval(ALICE, id).await.expect("get").status()
}

#[tokio::test]
async fn threshold_flow_from_request_to_grant() {
    let server = TestServer::start_file(POLICY).await;
    let payer = session("payer", "s1", "acme");

    let small = server
        .decide_ok(HOST, &payer, &payment("c1", "payer", 5000))
        .await;
    assert_eq!(
        (small.outcome(), small.reason.as_str()),
        (pb::Outcome::Allow, "allowed")
    );
    assert!(small.approval_id.is_empty());
    assert_eq!(small.fingerprint.len(), 64);
    assert_eq!(small.policy_revision.len(), 12);

    let large = payment("c2", "payer", 15000);
    let first = server.decide_ok(HOST, &payer, &large).await;
    assert_eq!(first.outcome(), pb::Outcome::RequireApproval);
    assert_eq!(first.reason, "approval-threshold-exceeded");
    assert!(!first.approval_id.is_empty());
    assert!(first.approval_expires_at.is_some());

    // The same proposal again: the same approval, no new request.
    let again = server.decide_ok(HOST, &payer, &large).await;
    assert_eq!(again.outcome(), pb::Outcome::RequireApproval);
    assert_eq!(again.approval_id, first.approval_id);
    assert_eq!(server.all_approvals(ALICE).await.len(), 1);

    // The reviewer sees the request bound to the fingerprint, sensitive fields redacted.
    let pending = server
        .get_approval(ALICE, &first.approval_id)
        .await
        .expect("get");
    assert_eq!(pending.status(), pb::ApprovalStatus::Pending);
    assert_eq!(pending.fingerprint, first.fingerprint);
    assert_eq!(
        pending.arguments_json,
        r#"{"account_number":"[redacted]","amount":15000}"#
    );
    assert_eq!(
        (pending.actor.as_str(), pending.tool.as_str()),
        ("payer", "payment_execute")
    );

    // A reviewer without the approver role cannot grant.
    grant_refused(
        &server,
        BOB,
        &first.approval_id,
        Code::PermissionDenied,
        "bob lacks the role",
    )
    .await;
    // A reviewer outside the workspace cannot grant.
    grant_refused(
        &server,
        DAVE,
        &first.approval_id,
        Code::PermissionDenied,
        "dave is in globex",
    )
    .await;
    // An unknown id is NOT_FOUND, a malformed one INVALID_ARGUMENT.
    grant_refused(
        &server,
        ALICE,
        "6f1e2a9c-57f5-4c8e-9a55-0d3a1c2b4e5f",
        Code::NotFound,
        "unknown",
    )
    .await;
    let status = grant_refused(
        &server,
        ALICE,
        "not-a-uuid",
        Code::InvalidArgument,
        "malformed",
    )
    .await;
    assert_eq!(violation_field(&status), "approval_id");

    let granted = server
        .grant(ALICE, &first.approval_id)
        .await
        .expect("alice grants");
    assert_eq!(granted.status(), pb::ApprovalStatus::Granted);
    assert_eq!(granted.decided_by, "alice");
    grant_refused(
        &server,
        ALICE,
        &first.approval_id,
        Code::FailedPrecondition,
        "not pending any more",
    )
    .await;

    let approved = server.decide_ok(HOST, &payer, &large).await;
    assert_eq!(
        (approved.outcome(), approved.reason.as_str()),
        (pb::Outcome::Allow, "approved")
    );
    assert_eq!(approved.approval_id, first.approval_id);
    // Decide never consumes: asking again is still approved.
    let still = server.decide_ok(HOST, &payer, &large).await;
    assert_eq!(still.reason, "approved");

    // A changed amount is another proposal: a new fingerprint, a new request.
    let changed = server
        .decide_ok(HOST, &payer, &payment("c3", "payer", 15001))
        .await;
    assert_eq!(changed.outcome(), pb::Outcome::RequireApproval);
    assert_ne!(changed.fingerprint, first.fingerprint);
    assert_ne!(changed.approval_id, first.approval_id);

    // A denial sticks for that fingerprint.
    let denied = server
        .approvals()
        .deny_approval(authed(
            deny_request(changed.approval_id.clone(), "amount looks wrong"),
            ALICE,
        ))
        .await
        .expect("deny")
        .into_inner();
    assert_eq!(denied.status(), pb::ApprovalStatus::Denied);
    assert_eq!(denied.decision_note, "amount looks wrong");
    for _ in 0..2 {
        let answer = server
            .decide_ok(HOST, &payer, &payment("c3", "payer", 15001))
            .await;
        assert_eq!(
            (answer.outcome(), answer.reason.as_str()),
            (pb::Outcome::Deny, "approval-denied")
        );
        assert_eq!(answer.approval_id, changed.approval_id);
    }
    server.stop().await;
}

#[tokio::test]
async fn a_reviewer_never_approves_its_own_actors_request() {
    let text = crate::support::policies::portable(POLICY);
    // Nor one of its name in other capitals.
    let capitals = text
        .replace("[actors.carol]", "[actors.Carol]")
        .replace("\"carol\", \"guest\"]", "\"Carol\", \"guest\"]");
    for (text, actor) in [(text, "carol"), (capitals, "Carol")] {
        let server = TestServer::start(&text).await;
        let answer = server
            .decide_ok(
                HOST,
                &session(actor, "s-carol", "acme"),
                &payment("c1", actor, 20000),
            )
            .await;
        assert_eq!(answer.outcome(), pb::Outcome::RequireApproval);
        let status = grant_refused(
            &server,
            CAROL,
            &answer.approval_id,
            Code::PermissionDenied,
            "self approval",
        )
        .await;
        assert!(
            status.message().contains("own actor"),
            "{actor}: {status:?}"
        );
        grant_ok(&server, ALICE, &answer.approval_id, "another reviewer may").await;
        server.stop().await;
    }
}

#[tokio::test]
async fn pending_and_granted_approvals_expire_on_the_injected_clock() {
    let server = TestServer::start_file(POLICY).await;
    let payer = session("payer", "s1", "acme");
    let large = payment("c1", "payer", 50000);
    let first = server.decide_ok(HOST, &payer, &large).await;

    server.clock.advance(Duration::from_secs(299));
    assert_eq!(
        approval_status(&server, &first.approval_id).await,
        pb::ApprovalStatus::Pending
    );
    server.clock.advance(Duration::from_secs(1));
    assert_eq!(
        approval_status(&server, &first.approval_id).await,
        pb::ApprovalStatus::Expired
    );
    grant_refused(
        &server,
        ALICE,
        &first.approval_id,
        Code::FailedPrecondition,
        "expired",
    )
    .await;

    // The same proposal after expiry: a new request.
    let second = server.decide_ok(HOST, &payer, &large).await;
    assert_eq!(second.outcome(), pb::Outcome::RequireApproval);
    assert_ne!(second.approval_id, first.approval_id);

    // A grant is honoured until the grant TTL, not after.
    grant_ok(&server, ALICE, &second.approval_id, "grant").await;
    server.clock.advance(Duration::from_secs(599));
    assert_eq!(
        server.decide_ok(HOST, &payer, &large).await.reason,
        "approved"
    );
    server.clock.advance(Duration::from_secs(1));
    let after = server.decide_ok(HOST, &payer, &large).await;
    assert_eq!(after.outcome(), pb::Outcome::RequireApproval);
    assert_ne!(after.approval_id, second.approval_id);
    assert_eq!(
        approval_status(&server, &second.approval_id).await,
        pb::ApprovalStatus::Expired
    );
    server.stop().await;
}

#[tokio::test]
async fn a_revoked_grant_is_not_honoured() {
    let server = TestServer::start_file(POLICY).await;
    let payer = session("payer", "s1", "acme");
    let wire = proposal("w1", "payer", "wire_transfer", 0, r#"{"to": "acct-9"}"#);
    let first = server.decide_ok(HOST, &payer, &wire).await;
    assert_eq!(first.reason, "approval-required");
    let revoke = |token: &'static str, id: String| {
        let mut approvals = server.approvals();
        async move {
            approvals
                .revoke_approval(authed(revoke_request(id, "changed my mind"), token))
                .await
        }
    };
    let status = revoke(ALICE, first.approval_id.clone())
        .await
        .expect_err("pending cannot be revoked");
    assert_eq!(status.code(), Code::FailedPrecondition);
    grant_ok(&server, ALICE, &first.approval_id, "grant").await;
    let status = revoke(BOB, first.approval_id.clone())
        .await
        .expect_err("bob lacks the role");
    assert_eq!(status.code(), Code::PermissionDenied);
    let revoked = revoke(ALICE, first.approval_id.clone())
        .await
        .expect("revoke")
        .into_inner();
    assert_eq!(revoked.status(), pb::ApprovalStatus::Revoked);
    let after = server.decide_ok(HOST, &payer, &wire).await;
    assert_eq!(after.outcome(), pb::Outcome::RequireApproval);
    assert_ne!(after.approval_id, first.approval_id);
    server.stop().await;
}

#[tokio::test]
async fn a_grant_is_honoured_only_in_its_workspace() {
    let server = TestServer::start_file(POLICY).await;
    let wire = proposal("w1", "payer", "wire_transfer", 0, r#"{"to": "acct-9"}"#);
    let in_acme = server
        .decide_ok(HOST, &session("payer", "s1", "acme"), &wire)
        .await;
    grant_ok(&server, ALICE, &in_acme.approval_id, "grant").await;
    let in_globex = server
        .decide_ok(HOST, &session("payer", "s2", "globex"), &wire)
        .await;
    assert_eq!(in_globex.outcome(), pb::Outcome::RequireApproval);
    assert_ne!(in_globex.approval_id, in_acme.approval_id);
    assert_eq!(in_globex.fingerprint, in_acme.fingerprint);
    grant_refused(
        &server,
        ALICE,
        &in_globex.approval_id,
        Code::PermissionDenied,
        "alice is acme only",
    )
    .await;
    grant_ok(&server, DAVE, &in_globex.approval_id, "dave covers globex").await;
    server.stop().await;
}

#[tokio::test]
async fn budgets_bound_the_agent_loop() {
    let server = TestServer::start_file(POLICY).await;
    let tight = session("tight", "s-tight", "acme");
    // max_tool_calls = 1: the second new call id of an execute tool is refused.
    let first = server
        .decide_ok(HOST, &tight, &payment("c1", "tight", 10))
        .await;
    assert_eq!(first.reason, "allowed");
    // Re-asking about the same call id with the same proposal costs nothing.
    for _ in 0..3 {
        assert_eq!(
            server
                .decide_ok(HOST, &tight, &payment("c1", "tight", 10))
                .await
                .reason,
            "allowed"
        );
    }
    let second = server
        .decide_ok(HOST, &tight, &payment("c2", "tight", 10))
        .await;
    assert_eq!(
        (second.outcome(), second.reason.as_str()),
        (pb::Outcome::Deny, "tool-budget")
    );
    // The refusal cost a decision; asking again about it costs nothing and
    // is refused again.
    let again = server
        .decide_ok(HOST, &tight, &payment("c2", "tight", 10))
        .await;
    assert_eq!(again.reason, "tool-budget");
    // The same call id with other arguments is a conflict (costs nothing).
    let conflict = server
        .decide_ok(HOST, &tight, &payment("c1", "tight", 11))
        .await;
    assert_eq!(conflict.reason, "call-id-conflict");
    // Read tools still run until max_decisions = 3 is spent: one is left.
    let read = proposal("r1", "tight", "read_balance", 0, "{}");
    assert_eq!(
        server.decide_ok(HOST, &tight, &read).await.reason,
        "allowed"
    );
    let read2 = proposal("r2", "tight", "read_balance", 0, "{}");
    assert_eq!(
        server.decide_ok(HOST, &tight, &read2).await.reason,
        "decision-budget"
    );

    let info = server.get_session(HOST, "s-tight").await.expect("session");
    assert_eq!(info.decisions, 3);
    assert_eq!(info.tool_attempts, 1);
    assert_eq!(info.executed_tools, 0);
    assert_eq!(info.work_units, 3); // 3 decisions × decision_cost 1, nothing executed yet
    assert_eq!(info.stopped_reason, "tool-budget");
    assert_eq!(info.actor, "tight");

    // max_session_seconds = 60.
    let fresh = session("tight", "s-tight-2", "acme");
    assert_eq!(
        server.decide_ok(HOST, &fresh, &read).await.reason,
        "allowed"
    );
    server.clock.advance(Duration::from_secs(60));
    assert_eq!(
        server.decide_ok(HOST, &fresh, &read2).await.reason,
        "session-expired"
    );

    // A session id is bound to its actor.
    let status = server
        .decide(
            HOST,
            &session("payer", "s-tight", "acme"),
            &payment("c9", "payer", 1),
        )
        .await
        .expect_err("session of another actor");
    assert_eq!(status.code(), Code::InvalidArgument);
    assert_eq!(violation_field(&status), "session.actor");
    server.stop().await;
}

#[tokio::test]
async fn modes_roles_and_claims() {
    let server = TestServer::start_file(POLICY).await;
    let payer = session("payer", "s1", "acme");
    let cases = [
        (
            proposal("a1", "payer", "read_balance", 0, "{}"),
            pb::Outcome::Allow,
            "allowed",
        ),
        (
            proposal("a2", "payer", "draft_invoice", 0, r#"{"customer":"x"}"#),
            pb::Outcome::Allow,
            "allowed",
        ),
        (
            proposal("a3", "payer", "change_role", 0, r#"{"role":"admin"}"#),
            pb::Outcome::Deny,
            "forbidden-tool",
        ),
        (
            proposal("a4", "payer", "launch_missiles", 0, "{}"),
            pb::Outcome::Deny,
            "unknown-tool",
        ),
        (
            proposal("a5", "mallory", "read_balance", 0, "{}"),
            pb::Outcome::Deny,
            "forbidden",
        ),
        (
            proposal("a6", "payer", "search_docs", 0, "{}"),
            pb::Outcome::Deny,
            "manifest-unverified",
        ),
    ];
    for (proposal, outcome, reason) in cases {
        let answer = server.decide_ok(HOST, &payer, &proposal).await;
        assert_eq!(
            (answer.outcome(), answer.reason.as_str()),
            (outcome, reason),
            "{}",
            proposal.name
        );
        assert!(!answer.message.is_empty());
    }
    // An actor without the tool's role.
    let guest = session("guest", "s-guest", "acme");
    let answer = server
        .decide_ok(HOST, &guest, &payment("g1", "guest", 5))
        .await;
    assert_eq!(answer.reason, "not-authorized");

    // The model's claims are data: `approved: true` fails the schema; an
    // INVALID_ARGUMENT creates nothing and charges nothing.
    let claims = [
        (
            r#"{"amount": 50000, "account_number": "12345678", "approved": true}"#,
            "proposal.arguments",
        ),
        (
            r#"{"amount": "lots", "account_number": "12345678"}"#,
            "proposal.arguments.amount",
        ),
        (
            r#"{"amount": 5, "account_number": "12"}"#,
            "proposal.arguments.account_number",
        ),
        (r#"{"amount": 5}"#, "proposal.arguments"),
        (
            r#"{"amount": 5, "amount": 6, "account_number": "12345678"}"#,
            "proposal.arguments_json",
        ),
        (r#"[1, 2]"#, "proposal.arguments_json"),
    ];
    for (arguments, field) in claims {
        let status = server
            .decide(
                HOST,
                &payer,
                &proposal("x1", "payer", "payment_execute", 0, arguments),
            )
            .await
            .expect_err("invalid arguments");
        assert_eq!(status.code(), Code::InvalidArgument, "{arguments}");
        assert_eq!(
            violation_field(&status),
            field,
            "{arguments}: {}",
            status.message()
        );
    }
    assert!(server.all_approvals(ALICE).await.is_empty());
    let info = server.get_session(HOST, "s1").await.expect("session");
    // Every answered call id was charged, refusals included; only the
    // unknown tool is a tool attempt (none of the others is `execute`).
    assert_eq!(info.decisions, 6, "every answer costs a decision");
    assert_eq!(info.tool_attempts, 1);
    server.stop().await;
}

#[tokio::test]
async fn envelope_errors_name_the_field() {
    let server = TestServer::start_file(POLICY).await;
    let payer = session("payer", "s1", "acme");
    let mut too_new = payment("c1", "payer", 5);
    too_new.version = (1 << 53) + 1;
    let cases = [
        (
            Some(session("", "s1", "acme")),
            Some(payment("c1", "payer", 5)),
            "session.actor",
        ),
        (
            Some(session("payer", "s 1", "acme")),
            Some(payment("c1", "payer", 5)),
            "session.session_id",
        ),
        (
            Some(session("payer", "s1", "ac.me")),
            Some(payment("c1", "payer", 5)),
            "session.workspace",
        ),
        (None, Some(payment("c1", "payer", 5)), "session"),
        (Some(payer.clone()), None, "proposal"),
        (
            Some(payer.clone()),
            Some(payment("1c", "payer", 5)),
            "proposal.call_id",
        ),
        (
            Some(payer.clone()),
            Some(payment("c1", "pаyer", 5)),
            "proposal.actor",
        ),
        (Some(payer.clone()), Some(too_new), "proposal.version"),
        (
            Some(payer.clone()),
            Some(proposal("c1", "payer", "x", 0, "{\"a\":NaN}")),
            "proposal.arguments_json",
        ),
    ];
    for (session, proposal, field) in cases {
        let status = server
            .pdp()
            .decide(authed(pb::DecideRequest { session, proposal }, HOST))
            .await
            .expect_err("invalid");
        assert_eq!(status.code(), Code::InvalidArgument, "{field}");
        assert_eq!(violation_field(&status), field, "{}", status.message());
        assert!(status.message().starts_with(field), "{}", status.message());
    }
    server.stop().await;
}

#[tokio::test]
async fn the_manifest_gate_opens_only_after_a_matching_assessment() {
    let server = TestServer::start_file(POLICY).await;
    let payer = session("payer", "s1", "acme");
    let search = proposal("d1", "payer", "search_docs", 0, r#"{"query":"refunds"}"#);
    assert_eq!(
        server.decide_ok(HOST, &payer, &search).await.reason,
        "manifest-unverified"
    );
    let bytes = std::fs::read(repo_path("examples/manifests/docs-search.json")).expect("manifest");
    let manifest = Manifest::from_json(&bytes).expect("valid");
    let assess = |manifest: pb::Manifest| {
        let mut pdp = server.pdp();
        async move {
            pdp.assess_manifest(authed(
                pb::AssessManifestRequest {
                    manifest: Some(manifest),
                },
                HOST,
            ))
            .await
            .expect("assess")
            .into_inner()
        }
    };
    assert!(assess(pb::Manifest::from(&manifest)).await.accepted);
    assert_eq!(
        server.decide_ok(HOST, &payer, &search).await.reason,
        "allowed"
    );
    let mut changed = pb::Manifest::from(&manifest);
    changed.tools[0].description.push_str(" Also sends email.");
    assert!(!assess(changed).await.accepted);
    let again = proposal("d2", "payer", "search_docs", 0, r#"{"query":"refunds"}"#);
    assert_eq!(
        server.decide_ok(HOST, &payer, &again).await.reason,
        "manifest-unverified"
    );
    server.stop().await;
}

#[tokio::test]
async fn concurrent_decides_of_one_new_proposal_create_one_approval() {
    let server = TestServer::start_file(POLICY).await;
    let payer = session("payer", "s1", "acme");
    let large = payment("c1", "payer", 99999);
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let channel = server.channel.clone();
        let (payer, large) = (payer.clone(), large.clone());
        tasks.push(tokio::spawn(async move {
            let mut pdp = pb::policy_decision_point_client::PolicyDecisionPointClient::new(channel);
            let request = pb::DecideRequest {
                session: Some(payer),
                proposal: Some(large),
            };
            pdp.decide(authed(request, HOST))
                .await
                .expect("decide")
                .into_inner()
        }));
    }
    let mut ids = HashSet::new();
    for task in tasks {
        let answer = task.await.expect("task");
        assert_eq!(answer.outcome(), pb::Outcome::RequireApproval);
        ids.insert(answer.approval_id);
    }
    assert_eq!(ids.len(), 1, "{ids:?}");
    let all = server.all_approvals(ALICE).await;
    assert_eq!(all.len(), 1);
    assert_eq!(all[0].status(), pb::ApprovalStatus::Pending);
    server.stop().await;
}

#[tokio::test]
async fn pending_requests_are_capped_per_actor() {
    let server = TestServer::start_file(POLICY).await;
    let payer = session("payer", "s1", "acme");
    for index in 0..6 {
        let answer = server
            .decide_ok(HOST, &payer, &payment(&format!("c{index}"), "payer", 20000))
            .await;
        assert_eq!(answer.outcome(), pb::Outcome::RequireApproval);
    }
    let status = server
        .decide(HOST, &payer, &payment("c6", "payer", 20000))
        .await
        .expect_err("cap");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(server.all_approvals(ALICE).await.len(), 6);
    let info = server.get_session(HOST, "s1").await.expect("session");
    assert_eq!(info.decisions, 6, "the refused call was not charged");
    // Deciding one frees a slot.
    let first = &server.all_approvals(ALICE).await[0];
    grant_ok(&server, ALICE, &first.approval_id, "grant").await;
    let answer = server
        .decide_ok(HOST, &payer, &payment("c6", "payer", 20000))
        .await;
    assert_eq!(answer.outcome(), pb::Outcome::RequireApproval);
    server.stop().await;
}

#[tokio::test]
async fn list_approvals_filters_and_pages() {
    let server = TestServer::start_file(POLICY).await;
    let payer = session("payer", "s1", "acme");
    let mut ids = Vec::new();
    for index in 0..5 {
        server.clock.advance(Duration::from_millis(5));
        let answer = server
            .decide_ok(HOST, &payer, &payment(&format!("c{index}"), "payer", 20000))
            .await;
        ids.push(answer.approval_id);
    }
    grant_ok(&server, ALICE, &ids[1], "grant").await;
    let list = |request: pb::ListApprovalsRequest| {
        let mut approvals = server.approvals();
        async move { approvals.list_approvals(authed(request, ALICE)).await }
    };
    let listed = |request: pb::ListApprovalsRequest| {
        let call = list(request);
        async move {
            let page = call.await.expect("list").into_inner();
            let ids: Vec<String> = page
                .approvals
                .iter()
                .map(|a| a.approval_id.clone())
                .collect();
            (ids, page.next_page_token)
        }
    };
    let (first_ids, first_token) = listed(pb::ListApprovalsRequest {
        page_size: 2,
        ..Default::default()
    })
    .await;
    assert_eq!(first_ids, ids[0..2]);
    let (second_ids, _) = listed(pb::ListApprovalsRequest {
        page_size: 2,
        page_token: first_token,
        ..Default::default()
    })
    .await;
    assert_eq!(second_ids, ids[2..4]);
    let (granted_ids, granted_token) = listed(pb::ListApprovalsRequest {
        status: pb::ApprovalStatus::Granted.into(),
        ..Default::default()
    })
    .await;
    assert_eq!(granted_ids.len(), 1);
    assert_eq!(granted_ids[0], ids[1]);
    assert!(granted_token.is_empty());
    let (none_ids, _) = listed(pb::ListApprovalsRequest {
        actor: "tight".into(),
        ..Default::default()
    })
    .await;
    assert!(none_ids.is_empty());
    for (request, field) in [
        (
            pb::ListApprovalsRequest {
                page_token: "garbage".into(),
                ..Default::default()
            },
            "page_token",
        ),
        (
            pb::ListApprovalsRequest {
                page_size: 501,
                ..Default::default()
            },
            "page_size",
        ),
        (
            pb::ListApprovalsRequest {
                status: 42,
                ..Default::default()
            },
            "status",
        ),
        // Filters name an actor or a tool as the policy does.
        (
            pb::ListApprovalsRequest {
                actor: "no such actor".into(),
                ..Default::default()
            },
            "actor",
        ),
        (
            pb::ListApprovalsRequest {
                tool: "t".repeat(10_000),
                ..Default::default()
            },
            "tool",
        ),
    ] {
        let status = list(request).await.expect_err("invalid");
        assert_eq!(status.code(), Code::InvalidArgument);
        assert_eq!(violation_field(&status), field);
    }
    server.stop().await;
}

#[tokio::test]
async fn approvals_survive_a_policy_reload() {
    let server = TestServer::start_file(POLICY).await;
    let payer = session("payer", "s1", "acme");
    let answer = server
        .decide_ok(HOST, &payer, &payment("c1", "payer", 20000))
        .await;
    let reloaded = Policy::load(&repo_path(POLICY)).expect("policy");
    server.engine.replace_policy(reloaded);
    grant_ok(&server, ALICE, &answer.approval_id, "grant after reload").await;
    assert_eq!(
        server
            .decide_ok(HOST, &payer, &payment("c1", "payer", 20000))
            .await
            .reason,
        "approved"
    );
    server.stop().await;
}

/// A reload that marks an argument sensitive hides it in the requests made
/// before: reviewers are shown every approval under the policy in force.
#[tokio::test]
async fn an_argument_marked_sensitive_by_a_reload_is_hidden_in_earlier_requests() {
    let text = crate::support::policies::portable(POLICY);
    let marked = "sensitive = [\"account_number\"]\n";
    assert!(text.contains(marked));
    let server = TestServer::start(&text.replace(marked, "")).await;
    let payer = session("payer", "s1", "acme");
    let answer = server
        .decide_ok(HOST, &payer, &payment("c1", "payer", 20000))
        .await;
    let clear = r#"{"account_number":"12345678","amount":20000}"#;
    let pending = server
        .get_approval(ALICE, &answer.approval_id)
        .await
        .expect("get");
    assert_eq!(pending.arguments_json, clear);
    server
        .engine
        .replace_policy(crate::support::policies::parse(&text));
    let hidden = r#"{"account_number":"[redacted]","amount":20000}"#;
    let pending = server
        .get_approval(ALICE, &answer.approval_id)
        .await
        .expect("get");
    assert_eq!(pending.arguments_json, hidden);
    let listed = server.all_approvals(ALICE).await;
    assert_eq!(listed.len(), 1);
    assert_eq!(listed[0].arguments_json, hidden);
    // A watcher's event and the grant's answer too.
    let mut watch = server
        .approvals()
        .watch_approvals(authed(pb::WatchApprovalsRequest {}, ALICE))
        .await
        .expect("watch")
        .into_inner();
    let granted = server
        .grant(ALICE, &answer.approval_id)
        .await
        .expect("grant");
    assert_eq!(granted.arguments_json, hidden);
    let event = watch.message().await.expect("event").expect("an event");
    let watched = event.approval.expect("the approval");
    assert_eq!(
        (watched.status(), watched.arguments_json.as_str()),
        (pb::ApprovalStatus::Granted, hidden)
    );
    server.stop().await;
}

/// One case of `tests/fixtures/budget_cases.toml` (its header says how
/// cases are written).
#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct BudgetCase {
    name: String,
    max_decisions: Option<u64>,
    max_tool_calls: Option<u64>,
    max_session_seconds: Option<u64>,
    decision_cost: u64,
    tool_cost: u64,
    steps: Vec<BudgetStep>,
    session: Option<ExpectedSession>,
    #[serde(default)]
    absent: bool,
}

#[derive(Debug, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct BudgetStep {
    decide: Option<String>,
    dispatch: Option<String>,
    grant: Option<String>,
    advance_seconds: Option<u64>,
    tool: Option<String>,
    claim: Option<String>,
    expect: Option<String>,
    status: Option<String>,
    args: Option<String>,
    /// The gRPC error code expected instead of an answer (`InvalidArgument`).
    error: Option<String>,
}

#[derive(Debug, PartialEq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ExpectedSession {
    decisions: u64,
    tool_attempts: u64,
    executed_tools: u64,
    work_units: u64,
    stopped_reason: String,
}

#[derive(Debug, serde::Deserialize)]
struct BudgetCases {
    case: Vec<BudgetCase>,
}

/// `budget.toml` with the case's costs and budgets.
fn budget_policy(case: &BudgetCase) -> String {
    let mut values = vec![
        ("limits.decision_cost", integer(case.decision_cost)),
        ("tools.work.cost", integer(case.tool_cost)),
        ("tools.gated.cost", integer(case.tool_cost)),
    ];
    for (key, value) in [
        ("profiles.agent.max_decisions", case.max_decisions),
        ("profiles.agent.max_tool_calls", case.max_tool_calls),
        (
            "profiles.agent.max_session_seconds",
            case.max_session_seconds,
        ),
    ] {
        if let Some(value) = value {
            values.push((key, integer(value)));
        }
    }
    policy_with("budget", &values)
}

/// The dispatch status as the fixture spells it (`call-id-conflict`).
fn status_name(status: pb::DispatchStatus) -> String {
    status
        .as_str_name()
        .trim_start_matches("DISPATCH_STATUS_")
        .to_lowercase()
        .replace('_', "-")
}

async fn run_budget_case(case: &BudgetCase) {
    let server = TestServer::start(&budget_policy(case)).await;
    let agent = session("agent", "s1", "w");
    let name = &case.name;
    // The version each call id was first proposed at, and the approval
    // each gated call id is waiting for.
    let mut versions: std::collections::HashMap<String, u64> = Default::default();
    let mut approvals: std::collections::HashMap<String, String> = Default::default();
    let mut current_version = 0;
    for (index, step) in case.steps.iter().enumerate() {
        let at = format!("{name}: step {index} {step:?}");
        if let Some(seconds) = step.advance_seconds {
            server.clock.advance(Duration::from_secs(seconds));
            continue;
        }
        if let Some(call_id) = &step.grant {
            let approval_id = approvals.get(call_id).expect("a pending approval");
            let granted = server
                .grant(BUDGET_REVIEWER, approval_id)
                .await
                .unwrap_or_else(|status| panic!("{at}: {status:?}"));
            assert_eq!(granted.status(), pb::ApprovalStatus::Granted, "{at}");
            continue;
        }
        let call_id = step
            .decide
            .as_ref()
            .or(step.dispatch.as_ref())
            .expect("a step decides, dispatches, grants or advances");
        let version = *versions.entry(call_id.clone()).or_insert(current_version);
        let tool = step.tool.as_deref().expect("a tool");
        let claim = step.claim.as_deref().unwrap_or("agent");
        let call = proposal(
            call_id,
            claim,
            tool,
            version,
            step.args.as_deref().unwrap_or("{}"),
        );
        if let Some(code) = &step.error {
            let status = match step.decide.is_some() {
                true => server.decide("", &agent, &call).await.map(drop),
                false => server.dispatch("", &agent, &call).await.map(drop),
            }
            .expect_err(&at);
            assert_eq!(format!("{:?}", status.code()), *code, "{at}: {status:?}");
            continue;
        }
        let expect = step.expect.as_deref().expect("an expected reason");
        if step.decide.is_some() {
            let answer = server
                .decide("", &agent, &call)
                .await
                .unwrap_or_else(|status| panic!("{at}: {status:?}"));
            assert_eq!(answer.reason, expect, "{at}: {answer:?}");
            assert!(!answer.message.is_empty(), "{at}");
            if !answer.approval_id.is_empty() {
                approvals.insert(call_id.clone(), answer.approval_id);
            }
        } else {
            let answer = server
                .dispatch("", &agent, &call)
                .await
                .unwrap_or_else(|status| panic!("{at}: {status:?}"));
            assert_eq!(
                (status_name(answer.status()), answer.reason.as_str()),
                (step.status.clone().expect("a status"), expect),
                "{at}: {answer:?}"
            );
            if answer.status() == pb::DispatchStatus::Ok && !answer.replayed {
                current_version = answer.version;
            }
        }
    }
    let info = server.get_session("", "s1").await;
    match (&case.session, info) {
        (Some(expected), Ok(info)) => {
            let got = ExpectedSession {
                decisions: info.decisions,
                tool_attempts: info.tool_attempts,
                executed_tools: info.executed_tools,
                work_units: info.work_units,
                stopped_reason: info.stopped_reason,
            };
            assert_eq!(&got, expected, "{name}");
        }
        (None, Err(status)) if case.absent => {
            assert_eq!(status.code(), Code::NotFound, "{name}: {status:?}");
        }
        (expected, got) => panic!("{name}: expected {expected:?}, got {got:?}"),
    }
    server.stop().await;
}

#[tokio::test]
async fn budget_cases_replay_the_reference_loop() {
    let path = repo_path("tests/fixtures/budget_cases.toml");
    let text = std::fs::read_to_string(path).expect("budget cases");
    let cases: BudgetCases = toml::from_str(&text).expect("budget cases parse");
    assert!(cases.case.len() >= 10, "{} cases", cases.case.len());
    for case in &cases.case {
        run_budget_case(case).await;
    }
}

async fn dispatch_as(
    server: &TestServer,
    token: &str,
    session: &pb::Session,
    proposal: &pb::Proposal,
) -> pb::DispatchResponse {
    server
        .dispatch(token, session, proposal)
        .await
        .expect("dispatch answers")
}

#[tokio::test]
async fn session_ids_are_namespaced_by_host() {
    let server = TestServer::start(&policy_text("two_hosts")).await;
    // Host B uses `sid` first, as another actor and workspace.
    let taken = server
        .decide_ok(
            HOST_B,
            &session("other", "sid", "elsewhere"),
            &proposal("b1", "other", "work", 0, "{}"),
        )
        .await;
    assert_eq!(taken.reason, "not-authorized");
    // Host A's Decide in `sid` is unaffected and learns nothing of B's.
    let mine = session("agent", "sid", "w");
    let answer = server
        .decide(HOST_A, &mine, &proposal("a1", "agent", "work", 0, "{}"))
        .await
        .expect("host A's own session");
    assert_eq!(answer.reason, "allowed");
    let info_a = server.get_session(HOST_A, "sid").await.expect("A's sid");
    assert_eq!(
        (
            info_a.actor.as_str(),
            info_a.workspace.as_str(),
            info_a.decisions
        ),
        ("agent", "w", 1)
    );
    let info_b = server.get_session(HOST_B, "sid").await.expect("B's sid");
    assert_eq!(
        (
            info_b.actor.as_str(),
            info_b.workspace.as_str(),
            info_b.decisions
        ),
        ("other", "elsewhere", 1)
    );
    // A session only host A made is NOT_FOUND for host B, exactly like none.
    let only_a = session("agent", "only-a", "w");
    server
        .decide_ok(HOST_A, &only_a, &proposal("a2", "agent", "work", 0, "{}"))
        .await;
    let hidden = server
        .get_session(HOST_B, "only-a")
        .await
        .expect_err("another host's session");
    let missing = server
        .get_session(HOST_B, "never-made")
        .await
        .expect_err("no session");
    assert_eq!(hidden.code(), Code::NotFound);
    assert_eq!(missing.code(), Code::NotFound);
    assert_eq!(
        hidden.message().replace("only-a", "X"),
        missing.message().replace("never-made", "X")
    );
    // Budgets are per host's session: B's Decide charged only B's `sid`.
    assert_eq!(
        server
            .get_session(HOST_A, "sid")
            .await
            .expect("sid")
            .decisions,
        1
    );
    server.stop().await;
}

#[tokio::test]
async fn receipts_are_keyed_by_host_actor_and_call_id() {
    let server = TestServer::start(&policy_text("two_hosts")).await;
    let in_a = session("agent", "s1", "w");
    let in_b = session("agent", "s1", "w");
    let work = proposal("c1", "agent", "work", 0, "{}");
    let committed = dispatch_as(&server, HOST_A, &in_a, &work).await;
    assert_eq!(
        (committed.status(), committed.reason.as_str()),
        (pb::DispatchStatus::Ok, "committed")
    );
    // Host B never replays host A's receipt: A's exact proposal is, for
    // host B, a new commit against a version that has moved on.
    let again = dispatch_as(&server, HOST_B, &in_b, &work).await;
    assert_eq!(
        (again.status(), again.reason.as_str(), again.replayed),
        (pb::DispatchStatus::StaleVersion, "stale-version", false)
    );
    assert_eq!(again.receipt_id, "");
    // Host B's c1 (another proposal) is no conflict with host A's.
    let other = proposal("c1", "agent", "work", 1, "{}");
    let answer = dispatch_as(&server, HOST_B, &session("agent", "s2", "w"), &other).await;
    assert_eq!(
        (answer.status(), answer.reason.as_str(), answer.replayed),
        (pb::DispatchStatus::Ok, "committed", false)
    );
    assert_ne!(answer.receipt_id, committed.receipt_id);
    // Host A still replays its own.
    let replay = dispatch_as(&server, HOST_A, &in_a, &work).await;
    assert_eq!(
        (replay.status(), replay.replayed, replay.receipt_id.as_str()),
        (pb::DispatchStatus::Ok, true, committed.receipt_id.as_str())
    );
    server.stop().await;
}

#[tokio::test]
async fn one_host_cannot_fill_the_session_table_or_the_ledger_for_another() {
    let server = TestServer::start(&policy_text("two_hosts")).await;
    // max_sessions = 4 with two host credentials: two each by default.
    for index in 0..2 {
        let answer = server
            .decide_ok(
                HOST_A,
                &session("agent", &format!("a{index}"), "w"),
                &proposal("c1", "agent", "work", 0, "{}"),
            )
            .await;
        assert_eq!(answer.reason, "allowed");
    }
    let refused = server
        .decide(
            HOST_A,
            &session("agent", "a2", "w"),
            &proposal("c1", "agent", "work", 0, "{}"),
        )
        .await
        .expect_err("host A's share is full");
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(
        refused.message().contains("max_sessions_per_host"),
        "{}",
        refused.message()
    );
    assert!(matches!(
        server.get_session(HOST_A, "a2").await,
        Err(status) if status.code() == Code::NotFound
    ));
    let answer = server
        .decide_ok(
            HOST_B,
            &session("agent", "b0", "w"),
            &proposal("c1", "agent", "work", 0, "{}"),
        )
        .await;
    assert_eq!(answer.reason, "allowed");

    // max_pending_total = 4: two pending requests each by default.
    let in_a = session("agent", "a0", "w");
    for call_id in ["g1", "g2"] {
        let answer = server
            .decide_ok(HOST_A, &in_a, &proposal(call_id, "agent", "gated", 0, "{}"))
            .await;
        assert_eq!(answer.reason, "approval-required");
    }
    let in_a_again = session("agent", "a1", "w");
    let refused = server
        .decide(
            HOST_A,
            &in_a_again,
            &proposal("g3", "agent", "gated", 0, "{}"),
        )
        .await
        .expect_err("host A's pending share is full");
    assert_eq!(refused.code(), Code::ResourceExhausted);
    assert!(
        refused.message().contains("max_pending_per_host"),
        "{}",
        refused.message()
    );
    let in_b = session("agent", "b0", "w");
    let answer = server
        .decide_ok(HOST_B, &in_b, &proposal("g1", "agent", "gated", 0, "{}"))
        .await;
    assert_eq!(answer.reason, "approval-required");
    server.stop().await;
}

#[test]
fn per_host_shares_are_validated_and_default_to_half_with_two_hosts() {
    let base = policy_text("two_hosts");
    let parse = |extra: &str| {
        let text = base.replace("[limits]\n", &format!("[limits]\n{extra}\n"));
        Policy::parse(&text, "two-hosts.toml", None)
    };
    let defaults = parse("").expect("valid").limits;
    assert_eq!(
        (
            defaults.max_sessions_per_host,
            defaults.max_pending_per_host
        ),
        (2, 2)
    );
    let set = parse("max_sessions_per_host = 3\nmax_pending_per_host = 4")
        .expect("valid")
        .limits;
    assert_eq!(
        (set.max_sessions_per_host, set.max_pending_per_host),
        (3, 4)
    );
    for (extra, key, rule) in [
        (
            "max_sessions_per_host = 0",
            "limits.max_sessions_per_host",
            "greater than 0",
        ),
        (
            "max_sessions_per_host = 5",
            "limits.max_sessions_per_host",
            "at most the global cap (4)",
        ),
        (
            "max_pending_per_host = 9",
            "limits.max_pending_per_host",
            "at most the global cap (4)",
        ),
    ] {
        let error = parse(extra).expect_err(extra).to_string();
        assert!(
            error.contains(key) && error.contains(rule),
            "{extra}: {error}"
        );
    }
    // One host credential (or the open host API) keeps the whole table.
    let one_host = Policy::parse(&policy_text("one_host"), "one-host.toml", None)
        .expect("valid")
        .limits;
    assert_eq!(
        (
            one_host.max_sessions_per_host,
            one_host.max_pending_per_host
        ),
        (one_host.max_sessions, one_host.max_pending_total)
    );
    // A second token of one host (a rotation) is the same host: the
    // shares stay whole.
    let rotated = base
        .replace("identity = \"host-b\"", "identity = \"host-a\"")
        .replace("actors = [\"agent\", \"other\"]", "actors = [\"agent\"]");
    let rotated = Policy::parse(&rotated, "rotated.toml", None)
        .expect("valid")
        .limits;
    assert_eq!(
        (rotated.max_sessions_per_host, rotated.max_pending_per_host),
        (rotated.max_sessions, rotated.max_pending_total)
    );
}
