//! Byte bounds over real gRPC (issue 13 item 12): a per-approval argument
//! limit, one byte budget (`limits.max_state_bytes`) for approval records,
//! receipts and remembered call ids, refused with RESOURCE_EXHAUSTED and no
//! state change, never by evicting what exactly-once needs; finished
//! (expired) approvals make room promptly.

use std::time::Duration;

use tonic::Code;

use crate::support::policies::{integer, policy_with};
use crate::support::tokens::ALICE;
use crate::support::{TestServer, assert_invalid, pb, proposal, session};

const PENDING_TTL_SECONDS: u64 = 60;
const RECEIPT_RETENTION_SECONDS: u64 = 120;
const MAX_APPROVAL_ARGUMENT_BYTES: usize = 4096;

fn policy(max_state_bytes: usize) -> String {
    policy_with(
        "byte_budget",
        &[
            ("limits.max_state_bytes", integer(max_state_bytes)),
            (
                "limits.max_approval_argument_bytes",
                integer(MAX_APPROVAL_ARGUMENT_BYTES),
            ),
            ("limits.pending_ttl_seconds", integer(PENDING_TTL_SECONDS)),
            (
                "limits.receipt_retention_seconds",
                integer(RECEIPT_RETENTION_SECONDS),
            ),
        ],
    )
}

fn ask(call_id: &str, pad: usize) -> pb::Proposal {
    let arguments = serde_json::json!({ "pad": "p".repeat(pad) }).to_string();
    proposal(call_id, "agent", "ask", 0, &arguments)
}

async fn decide(
    server: &TestServer,
    session_id: &str,
    proposal: &pb::Proposal,
) -> Result<pb::DecideResponse, tonic::Status> {
    server
        .decide("", &session("agent", session_id, "w"), proposal)
        .await
}

async fn decisions(server: &TestServer, session_id: &str) -> Option<u64> {
    server
        .get_session("", session_id)
        .await
        .ok()
        .map(|info| info.decisions)
}

fn assert_budget_refusal(status: &tonic::Status) {
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("(limits.max_state_bytes)")
            && status.message().contains("more do not fit"),
        "{status:?}"
    );
}

#[tokio::test]
async fn approval_arguments_over_their_limit_are_refused_and_store_nothing() {
    let server = TestServer::start(&policy(1024 * 1024)).await;
    // `{"pad":"…"}`: 10 bytes besides the pad.
    let status = decide(&server, "s1", &ask("c1", MAX_APPROVAL_ARGUMENT_BYTES - 9))
        .await
        .unwrap_err();
    assert_invalid(
        &status,
        "proposal.arguments_json",
        "a request for approval holds at most 4096 bytes of arguments \
             (limits.max_approval_argument_bytes); these are 4097",
    );
    let stats = server.engine.stats().expect("stats");
    assert_eq!((stats.approvals, stats.sessions), (0, 0));

    // At the limit: a pending request.
    let decision = decide(&server, "s1", &ask("c2", MAX_APPROVAL_ARGUMENT_BYTES - 10))
        .await
        .expect("Decide answers");
    assert_eq!(decision.outcome(), pb::Outcome::RequireApproval);
    assert_eq!(server.engine.stats().expect("stats").approvals, 1);
    server.stop().await;
}

#[tokio::test]
async fn live_approvals_fill_the_budget_and_expired_ones_make_room() {
    // Each request counts 512 + its strings (~2 KB of arguments): 2.6 KB.
    let server = TestServer::start(&policy(64 * 1024)).await;
    let mut made = Vec::new();
    let refusal = loop {
        let call_id = format!("c{}", made.len());
        match decide(&server, "s1", &ask(&call_id, 2000)).await {
            Ok(decision) => {
                assert_eq!(decision.outcome(), pb::Outcome::RequireApproval);
                made.push(decision.approval_id);
            }
            Err(status) => break status,
        }
        assert!(made.len() < 100, "the budget never refused");
    };
    assert_budget_refusal(&refusal);
    assert!(made.len() >= 20, "only {} requests fit", made.len());
    // The refused call stored nothing: no record, no charge.
    let before = server.engine.stats().expect("stats");
    assert_eq!(before.approvals, made.len());
    assert_eq!(decisions(&server, "s1").await, Some(made.len() as u64));
    let again = decide(&server, "s1", &ask("c-again", 2000))
        .await
        .unwrap_err();
    assert_budget_refusal(&again);
    assert_eq!(server.engine.stats().expect("stats"), before);
    assert_eq!(decisions(&server, "s1").await, Some(made.len() as u64));

    // Past the pending TTL every request is expired: new ones evict the
    // oldest expired records, and the ledger never holds more than fits.
    server
        .clock
        .advance(Duration::from_secs(PENDING_TTL_SECONDS + 1));
    // (One fewer: the new session's call ids need room too.)
    let fresh = made.len() - 1;
    for index in 0..fresh {
        let decision = decide(&server, "s2", &ask(&format!("n{index}"), 2000))
            .await
            .expect("room was made");
        assert_eq!(decision.outcome(), pb::Outcome::RequireApproval);
    }
    let after = server.engine.stats().expect("stats");
    assert!(after.approvals <= made.len(), "{after:?}");
    assert_eq!(after.pending_approvals, fresh);
    let mut evicted = 0;
    for id in &made {
        match server.get_approval(ALICE, id).await {
            Ok(approval) => assert_eq!(approval.status(), pb::ApprovalStatus::Expired),
            Err(status) => {
                assert_eq!(status.code(), Code::NotFound, "{status:?}");
                evicted += 1;
            }
        }
    }
    assert!(
        evicted >= fresh - 1,
        "only {evicted} expired records evicted"
    );
    server.stop().await;
}

fn commit(call_id: &str, version: u64, value: &str) -> pb::Proposal {
    let arguments = serde_json::json!({ "target": "r", "value": value }).to_string();
    proposal(call_id, "agent", "commit", version, &arguments)
}

#[tokio::test]
async fn receipts_within_retention_are_never_evicted_for_bytes() {
    let server = TestServer::start(&policy(64 * 1024)).await;
    let value = "v".repeat(4000);
    let mut version = 0;
    let refusal = loop {
        match server
            .dispatch_agent(&commit(&format!("c{version}"), version, &value))
            .await
        {
            Ok(answer) => {
                assert_eq!(answer.status(), pb::DispatchStatus::Ok, "{answer:?}");
                version = answer.version;
            }
            Err(status) => break status,
        }
        assert!(version < 100, "the budget never refused");
    };
    assert_budget_refusal(&refusal);
    assert!(version >= 10, "only {version} receipts fit");
    let before = server.engine.stats().expect("stats");
    let resource = server.resource(ALICE, "r").await;
    assert_eq!(resource.version, version);

    // Every receipt still replays: exactly-once kept all of them.
    let first = server
        .dispatch_agent(&commit("c0", 0, &value))
        .await
        .expect("Dispatch answers");
    assert!(first.replayed, "{first:?}");
    assert_eq!(first.version, 1);
    assert_eq!(server.engine.stats().expect("stats"), before);
    assert_eq!(server.resource(ALICE, "r").await, resource);

    // Past retention, old receipts make room for new commits.
    server
        .clock
        .advance(Duration::from_secs(RECEIPT_RETENTION_SECONDS + 1));
    let answer = server
        .dispatch_agent(&commit("c-late", version, &value))
        .await
        .expect("room was made");
    assert_eq!(answer.status(), pb::DispatchStatus::Ok, "{answer:?}");
    assert_eq!(answer.version, version + 1);
    assert!(server.engine.stats().expect("stats").receipts <= before.receipts);
    server.stop().await;
}

#[tokio::test]
async fn a_session_without_max_decisions_remembers_call_ids_only_within_the_budget() {
    let server = TestServer::start(&policy(64 * 1024)).await;
    let call_id = |index: usize| format!("call-{index:0>35}");
    let mut decided = 0usize;
    let refusal = loop {
        let look = proposal(&call_id(decided), "agent", "look", 0, "{}");
        match decide(&server, "s1", &look).await {
            Ok(decision) => {
                assert_eq!(decision.outcome(), pb::Outcome::Allow, "{decision:?}");
                decided += 1;
            }
            Err(status) => break status,
        }
        assert!(decided < 10_000, "the budget never refused");
    };
    assert_budget_refusal(&refusal);
    // 64 KiB at 64 + 40 bytes a call id: 630.
    assert!((550..=630).contains(&decided), "{decided} call ids fit");
    assert_eq!(decisions(&server, "s1").await, Some(decided as u64));
    // A call id already remembered costs nothing and still answers.
    let repeat = decide(
        &server,
        "s1",
        &proposal(&call_id(0), "agent", "look", 0, "{}"),
    )
    .await
    .expect("a repeat needs no room");
    assert_eq!(repeat.outcome(), pb::Outcome::Allow);
    assert_eq!(decisions(&server, "s1").await, Some(decided as u64));
    server.stop().await;
}

/// Refused Decides charge (issue 11.2): the call id each one remembers
/// counts under the byte budget exactly like an allowed one's, and once the
/// budget is full a new one is RESOURCE_EXHAUSTED, not a DENY that would be
/// remembered past the budget. So is a Dispatch of a call id never decided,
/// which is charged as a Decide of it first.
#[tokio::test]
async fn refused_decides_and_undecided_dispatches_count_their_call_ids() {
    let server = TestServer::start(&policy(64 * 1024)).await;
    let call_id = |index: usize| format!("call-{index:0>35}");
    let mut refused = 0usize;
    let refusal = loop {
        let unknown = proposal(&call_id(refused), "agent", "no-such-tool", 0, "{}");
        match decide(&server, "s1", &unknown).await {
            Ok(decision) => {
                assert_eq!(decision.outcome(), pb::Outcome::Deny, "{decision:?}");
                refused += 1;
            }
            Err(status) => break status,
        }
        assert!(refused < 10_000, "the budget never refused");
    };
    assert_budget_refusal(&refusal);
    // 64 KiB at 64 + 40 bytes a call id: 630.
    assert!((550..=630).contains(&refused), "{refused} call ids fit");
    assert_eq!(decisions(&server, "s1").await, Some(refused as u64));
    // A refused call id already remembered answers as before, for nothing.
    let repeat = decide(
        &server,
        "s1",
        &proposal(&call_id(0), "agent", "no-such-tool", 0, "{}"),
    )
    .await
    .expect("a repeat needs no room");
    assert_eq!(repeat.outcome(), pb::Outcome::Deny);
    // A Dispatch of a call id no Decide charged needs room too: none left.
    let status = server
        .dispatch_agent(&commit("never-decided", 0, "v"))
        .await
        .unwrap_err();
    assert_budget_refusal(&status);
    assert_eq!(decisions(&server, "s1").await, Some(refused as u64));
    let resource = server.resource(ALICE, "r").await;
    assert_eq!(resource.version, 0, "nothing was committed");
    server.stop().await;
}

/// A Dispatch of a never-decided call id remembers it (charged as a Decide)
/// and stores a receipt: both count, so far fewer commits fit than call ids.
#[tokio::test]
async fn undecided_dispatches_count_the_call_id_and_the_receipt() {
    let server = TestServer::start(&policy(64 * 1024)).await;
    let mut version = 0;
    let refusal = loop {
        match server
            .dispatch_agent(&commit(&format!("d{version}"), version, "v"))
            .await
        {
            Ok(answer) => {
                assert_eq!(answer.status(), pb::DispatchStatus::Ok, "{answer:?}");
                version = answer.version;
            }
            Err(status) => break status,
        }
        assert!(version < 10_000, "the budget never refused");
    };
    assert_budget_refusal(&refusal);
    // Each commit: a receipt (256 bytes and its text) and a call id (64 and
    // its text): at most 64 KiB / 330 of them.
    assert!((150..=200).contains(&version), "{version} commits fit");
    assert_eq!(decisions(&server, "s1").await, Some(version));
    server.stop().await;
}
