//! Authentication and authority for every RPC, and WatchApprovals.

mod common;

use common::{TestServer, authed, proposal, session};
use tokio_stream::StreamExt;
use tonic::Code;
use toolgate::pb;

const POLICY: &str = "tests/fixtures/decide.toml";
const HOST: &str = "host-secret";
const OTHER_HOST: &str = "other-host-secret";
const ALICE: &str = "alice-secret";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reach {
    Host,
    Reviewer,
    Either,
}

const RPCS: [(&str, Reach); 14] = [
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
];

/// Calls one RPC with an empty request and returns the status code (OK when
/// the call succeeded).
async fn call(server: &TestServer, rpc: &str, token: &str) -> Code {
    let mut pdp = server.pdp();
    let mut approvals = server.approvals();
    let mut pins = server.pins();
    let mut resources = pb::resources_client::ResourcesClient::new(server.channel.clone());
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
    let policy = r#"
[profiles.p]
roles = ["r"]
[actors.a]
profile = "p"
[tools.t]
mode = "read"
roles = ["r"]
[server]
open_host_api = true
"#;
    // Without the explicit setting the same policy is refused: an open host
    // API is never the result of an absence.
    let closed = policy.replace("open_host_api = true", "");
    let error = toolgate::policy::Policy::parse(&closed, "closed.toml", None)
        .expect_err("no host access declared");
    assert_eq!(error.key, "credentials");
    assert_eq!(
        error.message,
        "no host credential: declare one ([[credentials]] with kind = \"host\"), \
         or set [server] open_host_api = true to let any local client call the host API"
    );
    let server = TestServer::start(policy).await;
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
    let policy = r#"
[limits]
max_pending_per_actor = 5000
max_pending_total = 5000
max_approval_records = 5000
[profiles.p]
roles = ["r"]
max_decisions = 10000
[actors.a]
profile = "p"
[tools.t]
mode = "execute"
roles = ["r"]
approval = "always"
approvers = ["x"]
[server]
open_host_api = true
[reviewers.alice]
roles = ["x"]
workspaces = ["*"]
[[credentials]]
kind = "reviewer"
identity = "alice"
sha256 = "0c848abb03307b06cf70cd4e29c157dc81af5e94ab3eb1d0c59a120269572376"
"#;
    let server = TestServer::start(policy).await;
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
