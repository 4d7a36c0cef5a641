//! Authentication and authority for every RPC, and WatchApprovals.

use tokio_stream::StreamExt;
use tonic::Code;

use crate::support::policies::{
    self, DECIDE as POLICY, DECIDE_ALICE_CREDENTIAL, TICKETS, integer, policy_text, policy_with,
    portable,
};
use crate::support::raw::until;
use crate::support::tokens::{
    ALICE, BOB, CAROL, DAVE, ERIN, EXAMPLE_REVIEWER, HOST, OTHER_HOST, digest,
};
use crate::support::{Policy, TestServer, authed, pb, proposal, session, violation_field};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reach {
    Host,
    Reviewer,
    Either,
}

const RPCS: [(&str, Reach); 15] = [
    ("Decide", Reach::Host),
    ("Dispatch", Reach::Host),
    ("AssessManifest", Reach::Host),
    ("GetSession", Reach::Host),
    ("GetApproval", Reach::Reviewer),
    ("ListApprovals", Reach::Reviewer),
    ("GrantApproval", Reach::Reviewer),
    ("DenyApproval", Reach::Reviewer),
    ("RevokeApproval", Reach::Reviewer),
    ("WatchApprovals", Reach::Reviewer),
    ("PinManifest", Reach::Reviewer),
    ("ListPins", Reach::Reviewer),
    ("RemovePin", Reach::Reviewer),
    ("GetResource", Reach::Either),
    ("ListResources", Reach::Either),
];

/// Calls one RPC with an empty request and returns the status code (OK when
/// the call succeeded).
async fn call(server: &TestServer, rpc: &str, token: &str) -> Code {
    let mut pdp = server.pdp();
    let mut approvals = server.approvals();
    let mut pins = server.pins();
    let mut resources = server.resources();
    let result: Result<(), tonic::Status> = match rpc {
        "Decide" => pdp
            .decide(authed(pb::DecideRequest::default(), token))
            .await
            .map(drop),
        "Dispatch" => pdp
            .dispatch(authed(pb::DispatchRequest::default(), token))
            .await
            .map(drop),
        "AssessManifest" => pdp
            .assess_manifest(authed(pb::AssessManifestRequest::default(), token))
            .await
            .map(drop),
        "GetSession" => pdp
            .get_session(authed(pb::GetSessionRequest::default(), token))
            .await
            .map(drop),
        "GetApproval" => approvals
            .get_approval(authed(pb::GetApprovalRequest::default(), token))
            .await
            .map(drop),
        "ListApprovals" => approvals
            .list_approvals(authed(pb::ListApprovalsRequest::default(), token))
            .await
            .map(drop),
        "GrantApproval" => approvals
            .grant_approval(authed(pb::GrantApprovalRequest::default(), token))
            .await
            .map(drop),
        "DenyApproval" => approvals
            .deny_approval(authed(pb::DenyApprovalRequest::default(), token))
            .await
            .map(drop),
        "RevokeApproval" => approvals
            .revoke_approval(authed(pb::RevokeApprovalRequest::default(), token))
            .await
            .map(drop),
        "WatchApprovals" => approvals
            .watch_approvals(authed(pb::WatchApprovalsRequest::default(), token))
            .await
            .map(drop),
        "PinManifest" => pins
            .pin_manifest(authed(pb::PinManifestRequest::default(), token))
            .await
            .map(drop),
        "ListPins" => pins
            .list_pins(authed(pb::ListPinsRequest::default(), token))
            .await
            .map(drop),
        "RemovePin" => pins
            .remove_pin(authed(pb::RemovePinRequest::default(), token))
            .await
            .map(drop),
        "GetResource" => resources
            .get_resource(authed(pb::GetResourceRequest::default(), token))
            .await
            .map(drop),
        "ListResources" => resources
            .list_resources(authed(pb::ListResourcesRequest::default(), token))
            .await
            .map(drop),
        other => panic!("no such rpc {other}"),
    };
    match result {
        Ok(()) => Code::Ok,
        Err(status) => status.code(),
    }
}

#[tokio::test]
async fn every_rpc_checks_token_and_kind() {
    let server = TestServer::start_file(POLICY).await;
    for (rpc, reach) in RPCS {
        assert_eq!(
            call(&server, rpc, "").await,
            Code::Unauthenticated,
            "{rpc} without a token"
        );
        assert_eq!(
            call(&server, rpc, "wrong-token").await,
            Code::Unauthenticated,
            "{rpc} with an unknown token"
        );
        let (right, wrong) = match reach {
            Reach::Host => (HOST, Some(ALICE)),
            Reach::Reviewer => (ALICE, Some(HOST)),
            Reach::Either => (HOST, None),
        };
        if let Some(wrong) = wrong {
            assert_eq!(
                call(&server, rpc, wrong).await,
                Code::PermissionDenied,
                "{rpc} with the wrong kind"
            );
        }
        let code = call(&server, rpc, right).await;
        assert!(
            !matches!(code, Code::Unauthenticated | Code::PermissionDenied),
            "{rpc} with the right kind of token answered {code:?}"
        );
    }
    server.stop().await;
}

#[tokio::test]
async fn a_host_speaks_only_for_its_actors() {
    let server = TestServer::start_file(POLICY).await;
    let payer = session("payer", "s1", "acme");
    let read = proposal("c1", "payer", "read_balance", 0, "{}");
    let status = server
        .decide(OTHER_HOST, &payer, &read)
        .await
        .expect_err("not its actor");
    assert_eq!(status.code(), Code::PermissionDenied);
    assert_eq!(
        server.decide_ok(HOST, &payer, &read).await.reason,
        "allowed"
    );
    let status = server
        .pdp()
        .get_session(authed(
            pb::GetSessionRequest {
                session_id: "s1".into(),
            },
            OTHER_HOST,
        ))
        .await
        .expect_err("not its actor's session");
    assert_eq!(
        status.code(),
        Code::NotFound,
        "indistinguishable from a missing session"
    );
    server.stop().await;
}

#[tokio::test]
async fn open_host_api_opens_the_host_api_and_the_reviewer_api_stays_closed() {
    let policy = policy_text("one_tool");
    // Without the explicit setting the same policy is refused: an open host
    // API is never the result of an absence.
    let closed = policy.replace("open_host_api = true", "");
    let error = Policy::parse(&closed, "closed.toml", None).expect_err("no host access declared");
    assert_eq!(error.key, "credentials");
    assert_eq!(
        error.message,
        "no host credential: declare one ([[credentials]] with kind = \"host\"), \
         or set [server] open_host_api = true to let any local client call the host API"
    );
    let server = TestServer::start(&policy).await;
    let answer = server
        .decide_ok(
            "",
            &session("a", "s1", "w"),
            &proposal("c1", "a", "t", 0, "{}"),
        )
        .await;
    assert_eq!(answer.reason, "allowed");
    for (rpc, reach) in RPCS {
        if reach == Reach::Reviewer {
            assert_eq!(call(&server, rpc, "").await, Code::Unauthenticated, "{rpc}");
        }
    }
    server.stop().await;
}

#[tokio::test]
async fn a_watcher_sees_request_then_grant_in_order() {
    let server = TestServer::start_file(POLICY).await;
    let mut events = server
        .approvals()
        .watch_approvals(authed(pb::WatchApprovalsRequest {}, ALICE))
        .await
        .expect("watch")
        .into_inner();
    let payer = session("payer", "s1", "acme");
    let answer = server
        .decide_ok(
            HOST,
            &payer,
            &proposal("w1", "payer", "wire_transfer", 0, r#"{"to":"x"}"#),
        )
        .await;
    server
        .grant(ALICE, &answer.approval_id)
        .await
        .expect("grant");
    let requested = events.next().await.expect("event").expect("ok");
    assert_eq!(requested.kind(), pb::ApprovalEventKind::Requested);
    let approval = requested.approval.expect("approval");
    assert_eq!(approval.approval_id, answer.approval_id);
    assert_eq!(approval.status(), pb::ApprovalStatus::Pending);
    let granted = events.next().await.expect("event").expect("ok");
    assert_eq!(granted.kind(), pb::ApprovalEventKind::Granted);
    assert_eq!(granted.approval.expect("approval").decided_by, "alice");

    // Shutdown ends the stream with a final status instead of hanging.
    server.stop().await;
    let last = events.next().await;
    match last {
        Some(Err(status)) => assert_eq!(status.code(), Code::Unavailable),
        None => {}
        Some(Ok(event)) => panic!("unexpected event after shutdown: {event:?}"),
    }
}

#[tokio::test]
async fn a_stalled_watcher_does_not_hold_up_decide() {
    let policy = policy_text("stalled_watcher");
    let server = TestServer::start(&policy).await;
    // A watcher that subscribes and then never reads.
    let mut stalled = server.stalled_watcher(ALICE).await;
    let requests = 3000;
    let a = session("a", "s1", "w");
    for index in 0..requests {
        let answer = server
            .decide_ok(
                "",
                &a,
                &proposal(&format!("c{index}"), "a", "t", 0, r#"{"n":1}"#),
            )
            .await;
        assert_eq!(answer.outcome(), pb::Outcome::RequireApproval);
    }
    // Every decision completed although the watcher read nothing; when it
    // reads, it learns that it fell behind.
    let mut seen = 0u64;
    let mut lagged = 0u64;
    while seen + lagged < requests {
        let event = stalled.next().await.expect("stream open").expect("event");
        if event.kind() == pb::ApprovalEventKind::Lagged {
            lagged += event.lagged;
        } else {
            seen += 1;
        }
    }
    assert!(
        lagged > 0,
        "a watcher 3000 events behind must be told it lagged"
    );
    assert_eq!(seen + lagged, requests);
    server.stop().await;
}

/// The fixture with `edit` applied, as a policy.
fn fixture_policy(edit: impl FnOnce(String) -> String) -> Policy {
    policies::parse(&edit(portable(POLICY)))
}

async fn watch(server: &TestServer, token: &str) -> tonic::Streaming<pb::ApprovalEvent> {
    server
        .approvals()
        .watch_approvals(authed(pb::WatchApprovalsRequest {}, token))
        .await
        .expect("watch")
        .into_inner()
}

/// A pending payment over the threshold in `workspace`; its approval id.
async fn pending_payment(server: &TestServer, call_id: &str, workspace: &str) -> String {
    let answer = server
        .decide_ok(
            HOST,
            &session("payer", &format!("s-{workspace}"), workspace),
            &proposal(
                call_id,
                "payer",
                "payment_execute",
                0,
                r#"{"amount": 15000, "account_number": "12345678"}"#,
            ),
        )
        .await;
    assert_eq!(answer.outcome(), pb::Outcome::RequireApproval, "{answer:?}");
    answer.approval_id
}

async fn next_id(events: &mut tonic::Streaming<pb::ApprovalEvent>) -> String {
    let event = events.next().await.expect("stream open").expect("event");
    event.approval.expect("approval").approval_id
}

#[tokio::test]
async fn a_reload_that_revokes_a_watchers_credential_ends_its_stream() {
    let server = TestServer::start_file(POLICY).await;
    let mut alice = watch(&server, ALICE).await;
    let mut carol = watch(&server, CAROL).await;
    let before = pending_payment(&server, "c1", "acme").await;
    assert_eq!(next_id(&mut alice).await, before);
    assert_eq!(next_id(&mut carol).await, before);

    server.engine.replace_policy(fixture_policy(|text| {
        text.replace(DECIDE_ALICE_CREDENTIAL, "")
    }));

    let ended = alice
        .next()
        .await
        .expect("a final status")
        .expect_err("the stream ends with an error");
    assert_eq!(ended.code(), Code::Unauthenticated);
    assert_eq!(
        ended.message(),
        "the credential of this watch was revoked by a policy reload"
    );
    assert!(
        alice.next().await.is_none(),
        "nothing after the final status"
    );

    // A watcher whose credential survived the reload keeps its stream.
    let after = pending_payment(&server, "c2", "acme").await;
    assert_eq!(next_id(&mut carol).await, after);
    // And the revoked token cannot open a new one.
    let refused = server
        .approvals()
        .watch_approvals(authed(pb::WatchApprovalsRequest {}, ALICE))
        .await
        .expect_err("revoked token");
    assert_eq!(refused.code(), Code::Unauthenticated);
    server.stop().await;
}

#[tokio::test]
async fn a_reload_that_keeps_the_credential_keeps_the_stream() {
    let server = TestServer::start_file(POLICY).await;
    let mut alice = watch(&server, ALICE).await;
    server.engine.replace_policy(fixture_policy(|text| text));
    let id = pending_payment(&server, "c1", "acme").await;
    assert_eq!(next_id(&mut alice).await, id);
    server.stop().await;
}

async fn listed_ids(server: &TestServer, token: &str) -> Vec<String> {
    let mut ids: Vec<String> = server
        .all_approvals(token)
        .await
        .into_iter()
        .map(|approval| approval.approval_id)
        .collect();
    ids.sort();
    ids
}

#[tokio::test]
async fn reviewers_list_get_and_watch_only_what_they_could_review() {
    let server = TestServer::start_file(POLICY).await;
    // alice: finance-approver in acme; dave: finance-approver in globex;
    // carol: finance-approver everywhere; bob: support-lead, approves nothing.
    let mut alice = watch(&server, ALICE).await;
    let mut dave = watch(&server, DAVE).await;
    let acme = pending_payment(&server, "c1", "acme").await;
    let globex = pending_payment(&server, "c2", "globex").await;
    let acme_again = pending_payment(&server, "c3", "acme").await;

    let mut acme_ids = vec![acme.clone(), acme_again.clone()];
    acme_ids.sort();
    let mut all_ids = vec![acme.clone(), globex.clone(), acme_again.clone()];
    all_ids.sort();
    assert_eq!(listed_ids(&server, ALICE).await, acme_ids);
    assert_eq!(listed_ids(&server, DAVE).await, vec![globex.clone()]);
    assert_eq!(listed_ids(&server, CAROL).await, all_ids);
    assert_eq!(listed_ids(&server, BOB).await, Vec::<String>::new());

    // Another workspace's approval reads exactly like one that does not exist.
    let hidden = server
        .get_approval(ALICE, &globex)
        .await
        .expect_err("not alice's workspace");
    assert_eq!(hidden.code(), Code::NotFound);
    assert_eq!(hidden.message(), format!("no approval {globex}"));
    let no_role = server
        .get_approval(BOB, &acme)
        .await
        .expect_err("bob approves nothing");
    assert_eq!(no_role.code(), Code::NotFound);
    assert_eq!(
        server
            .get_approval(DAVE, &globex)
            .await
            .expect("dave's")
            .workspace,
        "globex"
    );

    // Watchers skip what they may not see: alice's second event is the
    // second acme request, dave's first is the globex one.
    assert_eq!(next_id(&mut alice).await, acme);
    assert_eq!(next_id(&mut alice).await, acme_again);
    assert_eq!(next_id(&mut dave).await, globex);
    server.stop().await;
}

#[tokio::test]
async fn a_see_all_reviewer_sees_every_approval() {
    let erin_digest = digest(ERIN);
    let erin = format!(
        "\n[reviewers.erin]\nroles = []\nworkspaces = [\"acme\"]\nsee_all = true\n\n\
         [[credentials]]\nkind = \"reviewer\"\nidentity = \"erin\"\nsha256 = \"{erin_digest}\"\n"
    );
    let policy = fixture_policy(|text| text + &erin);
    assert!(policy.reviewers["erin"].see_all);
    assert!(!policy.reviewers["alice"].see_all, "off unless set");
    let server = TestServer::start_with(policy).await;
    let mut watcher = watch(&server, ERIN).await;
    let acme = pending_payment(&server, "c1", "acme").await;
    let globex = pending_payment(&server, "c2", "globex").await;
    let mut all_ids = vec![acme.clone(), globex.clone()];
    all_ids.sort();
    assert_eq!(listed_ids(&server, ERIN).await, all_ids);
    assert_eq!(next_id(&mut watcher).await, acme);
    assert_eq!(next_id(&mut watcher).await, globex);
    assert_eq!(
        server
            .get_approval(ERIN, &globex)
            .await
            .expect("visible")
            .approval_id,
        globex
    );
    // Seeing is not deciding: erin holds no approver role.
    let refused = server
        .grant(ERIN, &globex)
        .await
        .expect_err("no approver role");
    assert_eq!(refused.code(), Code::PermissionDenied);
    server.stop().await;

    // The setting is a boolean, checked at load.
    let error = Policy::parse(
        &(portable(POLICY)
            + "\n[reviewers.erin]\nroles = []\nworkspaces = [\"*\"]\nsee_all = \"yes\"\n"),
        "bad.toml",
        None,
    )
    .expect_err("see_all must be a boolean");
    assert!(
        error
            .to_string()
            .contains("reviewers.erin.see_all: expected true or false"),
        "{error}"
    );
}

#[tokio::test]
async fn list_filters_by_id_prefix_and_refuses_a_bad_one() {
    let server = TestServer::start_file(POLICY).await;
    let first = pending_payment(&server, "c1", "acme").await;
    let second = pending_payment(&server, "c2", "acme").await;
    let list = |prefix: String| {
        let mut approvals = server.approvals();
        async move {
            approvals
                .list_approvals(authed(
                    pb::ListApprovalsRequest {
                        approval_id_prefix: prefix,
                        ..Default::default()
                    },
                    ALICE,
                ))
                .await
                .map(|response| response.into_inner().approvals)
        }
    };
    // The whole id, upper case: only that approval.
    let found = list(first.to_uppercase()).await.expect("list");
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].approval_id, first);
    let found = list(second[..8].to_string()).await.expect("list");
    assert!(
        found
            .iter()
            .all(|approval| approval.approval_id.starts_with(&second[..8]))
    );
    assert!(found.iter().any(|approval| approval.approval_id == second));

    for bad in ["xyz", &"a".repeat(37)] {
        let refused = list(bad.to_string()).await.expect_err("not a UUID prefix");
        assert_eq!(refused.code(), Code::InvalidArgument, "{bad}");
        assert_eq!(violation_field(&refused), "approval_id_prefix");
    }
    server.stop().await;
}

#[tokio::test]
async fn list_resources_pages_in_name_order() {
    let server = TestServer::start_file(TICKETS).await;
    let token = EXAMPLE_REVIEWER;
    let mut client = server.resources();
    let mut names = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = client
            .list_resources(authed(
                pb::ListResourcesRequest {
                    page_size: 1,
                    page_token: page_token.clone(),
                },
                token,
            ))
            .await
            .expect("page")
            .into_inner();
        assert_eq!(page.resources.len(), 1);
        let resource = page.resources[0].clone();
        assert_eq!(resource, server.resource(token, &resource.name).await);
        names.push(resource.name);
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    assert_eq!(names, ["lamp", "outbox", "sensor"]);
    let refused = client
        .list_resources(authed(
            pb::ListResourcesRequest {
                page_size: 1001,
                ..Default::default()
            },
            token,
        ))
        .await
        .expect_err("too large");
    assert_eq!(refused.code(), Code::InvalidArgument);
    assert_eq!(violation_field(&refused), "page_size");
    server.stop().await;
}

/// A page of a filter that matches few approvals ends after 10,000 records
/// looked at, short or even empty, with the token to go on from: no
/// ListApprovals walks the whole ledger while every Decide waits on the
/// state lock. Following the tokens still finds everything.
#[tokio::test]
async fn a_list_looks_at_a_bounded_number_of_records_a_page() {
    let many = 10_050;
    let server = TestServer::start(&policy_with(
        "roomy",
        &[
            ("limits.max_pending_per_actor", integer(many)),
            ("limits.max_pending_total", integer(many)),
            ("limits.max_approval_records", integer(many)),
            ("profiles.p.max_decisions", integer(many)),
        ],
    ))
    .await;
    let session = crate::support::SessionRef::new("a".into(), "s1".into(), "w".into())
        .expect("session")
        .for_host("h");
    for index in 0..many {
        let proposal =
            crate::support::Proposal::new(format!("c{index}"), "a".into(), "t".into(), 0, "{}")
                .expect("proposal");
        let (decision, _) = server
            .engine
            .decide(&session, &proposal)
            .await
            .expect("decided");
        assert!(decision.approval.is_some(), "{decision:?}");
    }
    // The last in list order: 10,049 others are looked at before it.
    let all = server.all_approvals(ALICE).await;
    assert_eq!(all.len(), many);
    let last = all.last().expect("approvals").approval_id.clone();
    let mut pages = Vec::new();
    let mut page_token = String::new();
    loop {
        let page = server
            .approvals()
            .list_approvals(authed(
                pb::ListApprovalsRequest {
                    approval_id_prefix: last.clone(),
                    page_token: page_token.clone(),
                    ..Default::default()
                },
                ALICE,
            ))
            .await
            .expect("ListApprovals")
            .into_inner();
        let ids: Vec<String> = page.approvals.into_iter().map(|a| a.approval_id).collect();
        pages.push(ids);
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    assert_eq!(pages, [vec![], vec![last]]);
    server.stop().await;
}

/// Watchers and the audit log hear a grant before its consumption even
/// when the call that granted is the last to run: transitions are queued
/// in commit order and published by whichever call finds their batch
/// durable first (here the Dispatch; the grant's call is polled once, then
/// never again).
#[tokio::test]
async fn transitions_are_published_in_commit_order_whoever_runs_first() {
    use futures_util::FutureExt;
    use toolgate::domain::clock::SystemClock;
    use toolgate::engine::Watched;

    let text = std::fs::read_to_string(policies::repo_path(TICKETS)).expect(TICKETS);
    let policy = policies::parse(&text);
    let directory = tempfile::tempdir().expect("temp dir");
    let store = crate::support::SqliteStore::open(&directory.path().join("data")).expect("store");
    let engine =
        crate::support::Engine::open(policy, std::sync::Arc::new(SystemClock), Box::new(store))
            .expect("engine");
    let mut watched = engine.subscribe();
    let mut left_waiting = 0;
    for round in 0..20 {
        let session =
            crate::support::SessionRef::new("learner".into(), format!("s{round}"), "desk".into())
                .expect("session");
        let version = engine.resource("lamp").expect("lamp").1;
        let status = ["done", "open"][round % 2];
        let proposal = crate::support::Proposal::new(
            format!("c{round}"),
            "learner".into(),
            "set_ticket".into(),
            version,
            &format!(r#"{{"ticket":"lamp","status":"{status}"}}"#),
        )
        .expect("proposal");
        let (decision, _) = engine.decide(&session, &proposal).await.expect("Decide");
        let (id, _) = decision.approval.expect("a request");
        let grant = engine.review(
            id,
            crate::support::Verdict::Grant,
            "reviewer",
            String::new(),
        );
        if grant.now_or_never().is_none() {
            left_waiting += 1;
        }
        let (answer, _) = engine
            .dispatch(&session, &proposal)
            .await
            .expect("Dispatch");
        assert_eq!(
            answer.status,
            crate::support::DispatchStatus::Ok,
            "{answer:?}"
        );
        let mut order = Vec::new();
        while let Ok(event) = watched.try_recv() {
            if let Watched::Transition(event) = event
                && event.approval.id == id
            {
                order.push(event.kind);
            }
        }
        use crate::support::EventKind::{Consumed, Granted, Requested};
        assert_eq!(order, [Requested, Granted, Consumed], "round {round}");
    }
    // The grant's call was left waiting for its batch in some rounds: what
    // this test is about happened.
    assert!(left_waiting > 0);
    engine.close_store();
}

/// A reviewer holds at most 16 watches open: the 17th is
/// RESOURCE_EXHAUSTED, naming the bound; another reviewer's are its own,
/// and closing one makes room again.
#[tokio::test]
async fn a_reviewer_holds_a_bounded_number_of_watches() {
    let server = TestServer::start_file(POLICY).await;
    let mut open = Vec::new();
    for _ in 0..16 {
        open.push(watch(&server, ALICE).await);
    }
    let refused = server
        .approvals()
        .watch_approvals(authed(pb::WatchApprovalsRequest {}, ALICE))
        .await
        .expect_err("a 17th watch");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(
        refused
            .message()
            .contains("at most 16 WatchApprovals streams per reviewer"),
        "{}",
        refused.message()
    );
    let _other = watch(&server, BOB).await;
    drop(open.pop());
    // The slot is given back once the server sees the stream end.
    until("a closed watch makes room", || async {
        server
            .approvals()
            .watch_approvals(authed(pb::WatchApprovalsRequest {}, ALICE))
            .await
            .is_ok()
    })
    .await;
    server.stop().await;
}
