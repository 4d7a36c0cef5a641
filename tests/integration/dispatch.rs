//! Dispatch over real gRPC (SPEC §6) on `examples/tickets.toml`: the
//! two-ticket exercise, approvals bound to what the reviewer saw, exactly
//! once under contention.

use std::collections::HashSet;
use std::time::Duration;

use crate::support::policies::{TICKETS, repo_path};
use crate::support::tokens::EXAMPLE_REVIEWER as REVIEWER;
use crate::support::{Policy, Stats, TestServer, dispatch_request, pb, proposal, session};

/// Everything a refusal must leave alone.
#[derive(Debug, PartialEq)]
struct Snapshot {
    resources: Vec<(String, String, u64)>,
    approvals: Vec<(String, i32)>,
    stats: Stats,
}

async fn snapshot(server: &TestServer) -> Snapshot {
    let mut resources = Vec::new();
    for name in ["lamp", "sensor", "outbox"] {
        let resource = resource(server, name).await;
        resources.push((resource.name, resource.value_json, resource.version));
    }
    let mut approvals: Vec<(String, i32)> = server
        .all_approvals(REVIEWER)
        .await
        .into_iter()
        .map(|approval| (approval.approval_id, approval.status))
        .collect();
    approvals.sort();
    let mut stats = server.engine.stats().expect("stats");
    stats.sessions = 0; // a refused call may open its session; sessions are not state Dispatch guards
    Snapshot {
        resources,
        approvals,
        stats,
    }
}

async fn resource(server: &TestServer, name: &str) -> pb::Resource {
    server.resource(REVIEWER, name).await
}

async fn dispatch(
    server: &TestServer,
    session: &pb::Session,
    proposal: &pb::Proposal,
) -> pb::DispatchResponse {
    server
        .dispatch("", session, proposal)
        .await
        .expect("Dispatch answers")
}

fn set_ticket(
    call_id: &str,
    actor: &str,
    version: u64,
    ticket: &str,
    status: &str,
) -> pb::Proposal {
    proposal(
        call_id,
        actor,
        "set_ticket",
        version,
        &format!(r#"{{"ticket":"{ticket}","status":"{status}"}}"#),
    )
}

fn reply(call_id: &str, version: u64, recipient: &str) -> pb::Proposal {
    proposal(
        call_id,
        "learner",
        "send_reply",
        version,
        &format!(r#"{{"recipient":"{recipient}","text":"Your lamp is fixed."}}"#),
    )
}

/// Decide, then grant as the reviewer; returns the approval id.
async fn approve(server: &TestServer, session: &pb::Session, proposal: &pb::Proposal) -> String {
    let decision = server.decide_ok("", session, proposal).await;
    assert_eq!(
        decision.outcome(),
        pb::Outcome::RequireApproval,
        "{decision:?}"
    );
    server
        .grant(REVIEWER, &decision.approval_id)
        .await
        .expect("grant");
    decision.approval_id
}

#[tokio::test]
async fn the_two_ticket_exercise() {
    let server = TestServer::start_file(TICKETS).await;
    let learner = session("learner", "s1", "desk");
    let c1 = set_ticket("c1", "learner", 0, "lamp", "done");

    let approval_id = approve(&server, &learner, &c1).await;
    let committed = dispatch(&server, &learner, &c1).await;
    assert_eq!(committed.status(), pb::DispatchStatus::Ok, "{committed:?}");
    assert!(!committed.replayed);
    assert_eq!(committed.version, 1);
    assert_eq!(committed.resource, "lamp");
    assert_eq!(committed.value_json, r#""done""#);
    assert_eq!(committed.approval_id, approval_id);
    assert!(!committed.receipt_id.is_empty());
    assert_eq!(resource(&server, "lamp").await.value_json, r#""done""#);
    assert_eq!(resource(&server, "sensor").await.value_json, r#""open""#);
    assert_eq!(
        resource(&server, "sensor").await.version,
        1,
        "global scope: one version for all"
    );
    let consumed = server
        .get_approval(REVIEWER, &approval_id)
        .await
        .expect("approval");
    assert_eq!(consumed.status(), pb::ApprovalStatus::Consumed);

    // Replay: the same result, replayed, nothing changes, no approval needed.
    let before = snapshot(&server).await;
    let mut replayed = dispatch(&server, &learner, &c1).await;
    assert_eq!(replayed.status(), pb::DispatchStatus::Ok);
    assert!(replayed.replayed);
    assert_eq!(
        (
            replayed.version,
            replayed.receipt_id.as_str(),
            replayed.value_json.as_str()
        ),
        (1, committed.receipt_id.as_str(), r#""done""#)
    );
    assert_eq!(snapshot(&server).await, before);
    // The returned copy is the caller's: changing it changes nothing stored.
    replayed.value_json = r#""tampered""#.into();
    replayed.version = 99;
    let again = dispatch(&server, &learner, &c1).await;
    assert_eq!((again.version, again.value_json.as_str()), (1, r#""done""#));
    assert_eq!(resource(&server, "lamp").await.value_json, r#""done""#);

    // Each refusal changes nothing.
    let other = session("other", "s2", "desk");
    let refusals = [
        (
            learner.clone(),
            c1.clone(),
            other.clone(),
            pb::DispatchStatus::Forbidden,
        ),
        (
            learner.clone(),
            set_ticket("c1", "learner", 0, "lamp", "open"),
            learner.clone(),
            pb::DispatchStatus::CallIdConflict,
        ),
        (
            learner.clone(),
            set_ticket("c2", "learner", 0, "sensor", "done"),
            learner.clone(),
            pb::DispatchStatus::StaleVersion,
        ),
        (
            learner.clone(),
            proposal("c3", "learner", "delete_ticket", 1, r#"{"ticket":"lamp"}"#),
            learner.clone(),
            pb::DispatchStatus::UnknownTool,
        ),
        (
            learner.clone(),
            set_ticket("c4", "learner", 1, "sensor", "done"),
            learner.clone(),
            pb::DispatchStatus::ApprovalRequired,
        ),
    ];
    for (_, proposal, session, expected) in refusals {
        let before = snapshot(&server).await;
        let answer = dispatch(&server, &session, &proposal).await;
        assert_eq!(answer.status(), expected, "{answer:?}");
        assert!(!answer.replayed);
        assert!(answer.receipt_id.is_empty());
        let after = snapshot(&server).await;
        if expected == pb::DispatchStatus::ApprovalRequired {
            // The one thing it may do: open a pending request for the reviewer.
            assert_eq!(after.resources, before.resources);
            assert_eq!(after.stats.receipts, before.stats.receipts);
            assert_eq!(after.approvals.len(), before.approvals.len() + 1);
            assert!(!answer.approval_id.is_empty());
        } else {
            assert_eq!(after, before, "{expected:?} changed state");
        }
        if expected == pb::DispatchStatus::StaleVersion {
            assert_eq!(
                answer.version, 1,
                "STALE_VERSION reports the current version"
            );
        }
    }

    // A ticket that fits the pattern but does not exist.
    let ghost = set_ticket("c5", "learner", 1, "ghost", "done");
    approve(&server, &learner, &ghost).await;
    let before = snapshot(&server).await;
    let answer = dispatch(&server, &learner, &ghost).await;
    assert_eq!(answer.status(), pb::DispatchStatus::MissingResource);
    assert_eq!(
        snapshot(&server).await,
        before,
        "MISSING_RESOURCE consumed nothing"
    );
    server.stop().await;
}

#[tokio::test]
async fn a_full_receipt_log_refuses_rather_than_forgets() {
    let text = std::fs::read_to_string(repo_path(TICKETS))
        .expect("tickets")
        .replace("receipt_capacity = 1000", "receipt_capacity = 1")
        .replace(
            "receipt_retention_seconds = 86400",
            "receipt_retention_seconds = 60",
        );
    let server =
        TestServer::start_with(Policy::parse(&text, "tickets-small.toml", None).expect("policy"))
            .await;
    let learner = session("learner", "s1", "desk");
    let first = set_ticket("c1", "learner", 0, "lamp", "done");
    approve(&server, &learner, &first).await;
    assert_eq!(
        dispatch(&server, &learner, &first).await.status(),
        pb::DispatchStatus::Ok
    );

    let second = set_ticket("c2", "learner", 1, "sensor", "done");
    approve(&server, &learner, &second).await;
    let before = snapshot(&server).await;
    let full = dispatch(&server, &learner, &second).await;
    assert_eq!(full.status(), pb::DispatchStatus::LogFull);
    assert_eq!(snapshot(&server).await, before, "LOG_FULL consumed nothing");
    // The receipt inside the window still replays.
    assert!(dispatch(&server, &learner, &first).await.replayed);

    // Past retention the oldest receipt may go, and the grant is still there to use.
    server.clock.advance(Duration::from_secs(60));
    let committed = dispatch(&server, &learner, &second).await;
    assert_eq!(committed.status(), pb::DispatchStatus::Ok, "{committed:?}");
    assert_eq!(committed.version, 2);
    server.stop().await;
}

#[tokio::test]
async fn approval_is_bound_to_what_the_reviewer_saw() {
    let server = TestServer::start_file(TICKETS).await;
    let learner = session("learner", "s1", "desk");
    let outbox_len = |resource: pb::Resource| {
        serde_json::from_str::<serde_json::Value>(&resource.value_json)
            .expect("json")
            .as_array()
            .expect("list")
            .len()
    };

    // (A) The model claims approval: data, not permission.
    let claimed = proposal(
        "a1",
        "learner",
        "send_reply",
        0,
        r#"{"recipient":"customer-42","text":"hi","approved":true}"#,
    );
    let status = server
        .dispatch("", &learner, &claimed)
        .await
        .expect_err("schema refuses the claim");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    let unapproved = reply("a2", 0, "customer-42");
    assert_eq!(
        dispatch(&server, &learner, &unapproved).await.status(),
        pb::DispatchStatus::ApprovalRequired
    );
    assert_eq!(outbox_len(resource(&server, "outbox").await), 0);

    // (B) Granted for customer-42, sent to customer-99: refused.
    let granted = reply("b1", 0, "customer-42");
    approve(&server, &learner, &granted).await;
    // Under the decided call id it is a conflict in the session (SPEC §4
    // step 6, checked before Dispatch's own steps); under a new one it
    // needs its own approval.
    let swapped = reply("b1", 0, "customer-99");
    let answer = dispatch(&server, &learner, &swapped).await;
    assert_eq!(
        (answer.status(), answer.reason.as_str()),
        (pb::DispatchStatus::CallIdConflict, "call-id-conflict")
    );
    let swapped = reply("b2", 0, "customer-99");
    let answer = dispatch(&server, &learner, &swapped).await;
    assert_eq!(answer.status(), pb::DispatchStatus::ApprovalRequired);
    assert_eq!(outbox_len(resource(&server, "outbox").await), 0);

    // (C) The grant expired before Dispatch: refused.
    let late = reply("c1", 0, "customer-43");
    approve(&server, &learner, &late).await;
    server.clock.advance(Duration::from_secs(601));
    assert_eq!(
        dispatch(&server, &learner, &late).await.status(),
        pb::DispatchStatus::ApprovalRequired
    );
    assert_eq!(outbox_len(resource(&server, "outbox").await), 0);

    // (D) The granted proposal dispatched twice: one entry, the second call replays.
    let fresh = reply("d1", 0, "customer-42");
    approve(&server, &learner, &fresh).await;
    let first = dispatch(&server, &learner, &fresh).await;
    assert_eq!(first.status(), pb::DispatchStatus::Ok);
    let second = dispatch(&server, &learner, &fresh).await;
    assert!(second.replayed);
    assert_eq!(second.receipt_id, first.receipt_id);
    assert_eq!(outbox_len(resource(&server, "outbox").await), 1);

    // (C') The state moved on: an approved proposal made against version 0 is stale.
    let behind = reply("e1", 0, "customer-44");
    approve(&server, &learner, &behind).await;
    let stale = dispatch(&server, &learner, &behind).await;
    assert_eq!(stale.status(), pb::DispatchStatus::StaleVersion);
    assert_eq!(outbox_len(resource(&server, "outbox").await), 1);
    server.stop().await;
}

#[tokio::test]
async fn exactly_once_under_contention() {
    let server = TestServer::start_file(TICKETS).await;
    let learner = session("learner", "s1", "desk");
    let c1 = set_ticket("c1", "learner", 0, "lamp", "done");
    approve(&server, &learner, &c1).await;

    let mut tasks = Vec::new();
    for _ in 0..64 {
        let (channel, learner, c1) = (server.channel.clone(), learner.clone(), c1.clone());
        tasks.push(tokio::spawn(async move {
            pb::policy_decision_point_client::PolicyDecisionPointClient::new(channel)
                .dispatch(dispatch_request(learner, c1))
                .await
                .expect("dispatch")
                .into_inner()
        }));
    }
    let mut fresh = 0;
    let mut replays = 0;
    let mut receipts = HashSet::new();
    for task in tasks {
        let answer = task.await.expect("task");
        assert_eq!(answer.status(), pb::DispatchStatus::Ok);
        if answer.replayed {
            replays += 1;
        } else {
            fresh += 1;
        }
        receipts.insert(answer.receipt_id);
    }
    assert_eq!((fresh, replays, receipts.len()), (1, 63, 1));
    assert_eq!(resource(&server, "lamp").await.version, 1, "one effect");
    let consumed: Vec<_> = server
        .all_approvals(REVIEWER)
        .await
        .into_iter()
        .filter(|approval| approval.status() == pb::ApprovalStatus::Consumed)
        .collect();
    assert_eq!(consumed.len(), 1, "one consumption");

    // 64 different call ids against one global version: one wins, the rest are stale.
    let mut proposals = Vec::new();
    for index in 0..64 {
        let proposal = reply(&format!("r{index}"), 1, "customer-7");
        approve(&server, &learner, &proposal).await;
        proposals.push(proposal);
    }
    let mut tasks = Vec::new();
    for proposal in proposals {
        let (channel, learner) = (server.channel.clone(), learner.clone());
        tasks.push(tokio::spawn(async move {
            pb::policy_decision_point_client::PolicyDecisionPointClient::new(channel)
                .dispatch(dispatch_request(learner, proposal))
                .await
                .expect("dispatch")
                .into_inner()
                .status()
        }));
    }
    let mut statuses = Vec::new();
    for task in tasks {
        statuses.push(task.await.expect("task"));
    }
    let ok = statuses
        .iter()
        .filter(|status| **status == pb::DispatchStatus::Ok)
        .count();
    let stale = statuses
        .iter()
        .filter(|status| **status == pb::DispatchStatus::StaleVersion)
        .count();
    assert_eq!((ok, stale), (1, 63));
    let outbox = resource(&server, "outbox").await;
    assert_eq!(outbox.version, 2);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&outbox.value_json)
            .expect("json")
            .as_array()
            .map(Vec::len),
        Some(1)
    );
    server.stop().await;
}

#[tokio::test]
async fn work_units_count_executed_tools() {
    let server = TestServer::start_file(TICKETS).await;
    let learner = session("learner", "s1", "desk");
    let c1 = set_ticket("c1", "learner", 0, "lamp", "done");
    approve(&server, &learner, &c1).await;
    dispatch(&server, &learner, &c1).await;
    dispatch(&server, &learner, &c1).await; // a replay executes nothing
    let info = server.get_session("", "s1").await.expect("session");
    assert_eq!(
        (info.decisions, info.executed_tools, info.work_units),
        (1, 1, 2)
    );
    server.stop().await;
}
