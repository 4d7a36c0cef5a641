//! Recovery (issue 15): everything the state holds, made through the API
//! before a restart, is there after it, on each store (PostgreSQL's:
//! `TOOLGATE_TEST_DATABASE_URL`), through a real
//! server and client: approvals in every status, a grant usable exactly
//! once, receipts that replay with their ids, resources and their versions,
//! sessions and their counters, API pins and the latest assessment. What
//! fell due while the server was down expires when it comes back.

use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use toolgate::store::Store;
use toolgate::store::memory::MemoryStore;
use toolgate::store::sqlite::SqliteStore;
use toolgate::store::writer::UNSYNCED_FOR;

use crate::support::PostgresStore;
use crate::support::postgres::TestSchema;

use crate::support::policies::repo_path;
use crate::support::raw::until;
use crate::support::tokens::EXAMPLE_REVIEWER;
use crate::support::{
    EPOCH, Manifest, ManualClock, Policy, TestServer, authed, pb, pin_request, proposal, session,
};
use tonic_health::pb::health_check_response::ServingStatus;

fn policy() -> Policy {
    Policy::load(&repo_path("tests/fixtures/policies/recovery.toml")).expect("recovery policy")
}

fn agent_session() -> pb::Session {
    session("agent", "s1", "w")
}

/// Sets `note`: `c-granted` is meant to commit after `c-done` (version 0),
/// so it carries version 1.
fn set_note(call_id: &str, value: &str) -> pb::Proposal {
    let arguments = serde_json::json!({ "item": "note", "value": value }).to_string();
    let version = u64::from(call_id == "c-granted");
    proposal(call_id, "agent", "set_item", version, &arguments)
}

fn post(call_id: &str, version: u64) -> pb::Proposal {
    let arguments = serde_json::json!({ "text": call_id }).to_string();
    proposal(call_id, "agent", "post", version, &arguments)
}

fn search(call_id: &str) -> pb::Proposal {
    proposal(call_id, "agent", "search_docs", 0, r#"{"query":"lamp"}"#)
}

fn docs_search() -> pb::Manifest {
    let bytes =
        std::fs::read(repo_path("examples/manifests/docs-search.json")).expect("example manifest");
    pb::Manifest::from(&Manifest::from_json(&bytes).expect("example manifest is valid"))
}

/// An approval id a Decide asked for.
async fn requested(server: &TestServer, call: &pb::Proposal) -> String {
    let answer = server.decide_ok("", &agent_session(), call).await;
    assert_eq!(answer.reason, "approval-required", "{answer:?}");
    answer.approval_id
}

async fn dispatched(server: &TestServer, call: &pb::Proposal) -> pb::DispatchResponse {
    server
        .dispatch("", &agent_session(), call)
        .await
        .expect("Dispatch answers")
}

async fn status_of(server: &TestServer, approval_id: &str) -> String {
    let approval = server
        .get_approval(EXAMPLE_REVIEWER, approval_id)
        .await
        .expect("the approval is kept");
    approval.status().as_str_name().to_string()
}

/// What the first run made, to check after the restart.
struct Made {
    pending: String,
    granted: String,
    consumed: String,
    note_receipt: pb::DispatchResponse,
    post_receipts: Vec<pb::DispatchResponse>,
    session: pb::SessionInfo,
}

async fn make_everything(server: &TestServer) -> Made {
    let pending = requested(server, &set_note("c-pending", "a")).await;
    let granted = requested(server, &set_note("c-granted", "b")).await;
    server
        .grant(EXAMPLE_REVIEWER, &granted)
        .await
        .expect("grant");
    let consumed = requested(server, &set_note("c-done", "c")).await;
    server
        .grant(EXAMPLE_REVIEWER, &consumed)
        .await
        .expect("grant");
    let note_receipt = dispatched(server, &set_note("c-done", "c")).await;
    assert_eq!(note_receipt.status(), pb::DispatchStatus::Ok);
    let mut post_receipts = Vec::new();
    for (index, call_id) in ["c-post1", "c-post2"].into_iter().enumerate() {
        let answer = dispatched(server, &post(call_id, index as u64)).await;
        assert_eq!(answer.status(), pb::DispatchStatus::Ok, "{answer:?}");
        post_receipts.push(answer);
    }
    server
        .pins()
        .pin_manifest(authed(
            pin_request(Some(docs_search()), ""),
            EXAMPLE_REVIEWER,
        ))
        .await
        .expect("pin");
    let assessed = server
        .pdp()
        .assess_manifest(pb::AssessManifestRequest {
            manifest: Some(docs_search()),
        })
        .await
        .expect("assess")
        .into_inner();
    assert!(assessed.accepted);
    let read = server
        .decide_ok("", &agent_session(), &search("c-read1"))
        .await;
    assert_eq!(read.reason, "allowed");
    let session = server.get_session("", "s1").await.expect("session");
    Made {
        pending,
        granted,
        consumed,
        note_receipt,
        post_receipts,
        session,
    }
}

async fn check_everything(server: &TestServer, made: &Made) {
    // The pending request fell due while the server was down.
    assert_eq!(
        status_of(server, &made.pending).await,
        "APPROVAL_STATUS_EXPIRED"
    );
    assert_eq!(
        status_of(server, &made.granted).await,
        "APPROVAL_STATUS_GRANTED"
    );
    assert_eq!(
        status_of(server, &made.consumed).await,
        "APPROVAL_STATUS_CONSUMED"
    );
    // The session's counters and decided call ids are kept: a decided call
    // id answers as before and costs nothing.
    let session = server.get_session("", "s1").await.expect("session kept");
    assert_eq!(session.decisions, made.session.decisions);
    assert_eq!(session.tool_attempts, made.session.tool_attempts);
    assert_eq!(session.executed_tools, made.session.executed_tools);
    // Every acknowledged commit replays with its receipt, and commits
    // nothing again.
    let replay = dispatched(server, &set_note("c-done", "c")).await;
    assert!(replay.replayed, "{replay:?}");
    assert_eq!(replay.receipt_id, made.note_receipt.receipt_id);
    for (index, first) in made.post_receipts.iter().enumerate() {
        let replay = dispatched(server, &post(&format!("c-post{}", index + 1), index as u64)).await;
        assert!(replay.replayed, "{replay:?}");
        assert_eq!(
            (replay.receipt_id.as_str(), replay.version),
            (first.receipt_id.as_str(), first.version)
        );
    }
    let queue = server.resource(EXAMPLE_REVIEWER, "queue").await;
    assert_eq!(
        (queue.value_json.as_str(), queue.version),
        (r#"[{"text":"c-post1"},{"text":"c-post2"}]"#, 2)
    );
    let note = server.resource(EXAMPLE_REVIEWER, "note").await;
    assert_eq!((note.value_json.as_str(), note.version), (r#""c""#, 1));
    // The grant made before the restart commits once after it.
    let granted = dispatched(server, &set_note("c-granted", "b")).await;
    assert_eq!(
        (granted.status(), granted.replayed),
        (pb::DispatchStatus::Ok, false)
    );
    assert_eq!(
        status_of(server, &made.granted).await,
        "APPROVAL_STATUS_CONSUMED"
    );
    // A pending proposal that expired may be asked for again.
    let again = requested(server, &set_note("c-pending", "a")).await;
    assert_ne!(again, made.pending);
    // The API pin and its assessment hold: the gated tool stays open.
    let read = server
        .decide_ok("", &agent_session(), &search("c-read2"))
        .await;
    assert_eq!(read.reason, "allowed", "{read:?}");
}

/// Makes everything on a server of `store()`, restarts on `store()` again
/// past the pending TTL (not the grant's), and checks everything.
async fn survives_a_restart(store: impl Fn() -> Box<dyn Store>) {
    let clock = ManualClock::starting_at(EPOCH);
    let first = TestServer::start_on(policy(), store(), clock.clone()).await;
    let made = make_everything(&first).await;
    first.engine.close_store();
    first.stop().await;
    clock.advance(Duration::from_secs(301));
    let second = TestServer::start_on(policy(), store(), clock.clone()).await;
    check_everything(&second, &made).await;
    second.engine.close_store();
    second.stop().await;
    // And once more, with nothing between: the state is stable.
    let third = TestServer::start_on(policy(), store(), clock).await;
    let replay = dispatched(&third, &set_note("c-granted", "b")).await;
    assert!(replay.replayed);
    assert_eq!(
        third.resource(EXAMPLE_REVIEWER, "note").await.value_json,
        r#""b""#
    );
    third.stop().await;
}

#[tokio::test]
async fn everything_survives_a_restart_on_the_memory_store() {
    let store = MemoryStore::new();
    survives_a_restart(|| Box::new(store.clone())).await;
}

#[tokio::test]
async fn everything_survives_a_restart_on_the_sqlite_store() {
    let directory = tempfile::tempdir().expect("temp dir");
    let data = directory.path().join("data");
    survives_a_restart(|| Box::new(SqliteStore::open(&data).expect("open the store"))).await;
}

#[tokio::test]
async fn everything_survives_a_restart_on_the_postgres_store() {
    let schema = TestSchema::new();
    survives_a_restart(|| Box::new(PostgresStore::open(&schema.target).expect("open the store")))
        .await;
}

/// A real store whose every commit first goes through `before`: a fault a
/// test injects (a refusal, a stall). It commits on the writer's thread,
/// whatever the store behind it does.
struct Hooked {
    store: Box<dyn Store>,
    before: Box<dyn FnMut() -> toolgate::store::StoreResult<()> + Send>,
}

impl Store for Hooked {
    fn name(&self) -> &'static str {
        "hooked"
    }

    fn load(&mut self) -> toolgate::store::StoreResult<Vec<toolgate::domain::records::Record>> {
        self.store.load()
    }

    fn commit(
        &mut self,
        changes: &[toolgate::domain::records::Change],
    ) -> toolgate::store::StoreResult<()> {
        (self.before)()?;
        self.store.commit(changes)
    }

    fn size_bytes(&self) -> u64 {
        self.store.size_bytes()
    }
}

#[tokio::test]
async fn a_failed_commit_withholds_its_answer_and_refuses_everything_after() {
    let store = MemoryStore::new();
    let clock = ManualClock::starting_at(EPOCH);
    // One commit at start (recovery), one for the first Post; then every
    // commit is refused, as a full or failing disk does.
    let mut commits = 2;
    let failing = Hooked {
        store: Box::new(store.clone()),
        before: Box::new(move || {
            if commits == 0 {
                return Err(toolgate::store::StoreError("disk full".into()));
            }
            commits -= 1;
            Ok(())
        }),
    };
    let server = TestServer::start_on(policy(), Box::new(failing), clock.clone()).await;
    assert_eq!(server.health().await, ServingStatus::Serving);
    let first = dispatched(&server, &post("c-post1", 0)).await;
    assert_eq!(first.status(), pb::DispatchStatus::Ok);
    // The next commit fails: its answer is never released as a success.
    let refused = server
        .dispatch("", &agent_session(), &post("c-post2", 1))
        .await
        .expect_err("the store refused the commit");
    assert_eq!(refused.code(), tonic::Code::Unavailable, "{refused:?}");
    assert!(refused.message().contains("disk full"), "{refused:?}");
    // Every later call is refused too, reads included: the state in memory
    // is ahead of the store.
    let read = server
        .decide("", &agent_session(), &search("c-read"))
        .await
        .expect_err("refused");
    assert_eq!(read.code(), tonic::Code::Unavailable);
    // Health says so, for an orchestrator to restart the process (checked
    // once a second, with the sweep).
    until(
        "health turns NOT_SERVING after the store failed",
        || async { server.health().await == ServingStatus::NotServing },
    )
    .await;
    server.stop().await;
    // A restart recovers what was acknowledged, and only that.
    let restarted = TestServer::start_on(policy(), Box::new(store), clock).await;
    let queue = restarted.resource(EXAMPLE_REVIEWER, "queue").await;
    assert_eq!(
        (queue.value_json.as_str(), queue.version),
        (r#"[{"text":"c-post1"}]"#, 1)
    );
    let retry = dispatched(&restarted, &post("c-post2", 1)).await;
    assert_eq!(
        (retry.status(), retry.replayed),
        (pb::DispatchStatus::Ok, false)
    );
    assert_eq!(restarted.health().await, ServingStatus::Serving);
    restarted.stop().await;
}

/// One session at most, evicted after ten idle seconds.
const IDLE_POLICY: &str = r#"
[limits]
max_sessions = 1
session_idle_seconds = 10

[profiles.agent]
roles = ["agent"]

[actors.agent]
profile = "agent"

[tools.look]
mode = "read"
roles = ["agent"]

[server]
open_host_api = true
"#;

/// A call that changes nothing of its session but its last activity (here
/// a re-evaluated call id) does not write the session until a second has
/// passed; a clean shutdown writes it, so that the idle time that evicts
/// the session still counts from its last call after a restart.
#[tokio::test]
async fn a_clean_shutdown_keeps_every_sessions_last_activity() {
    let directory = tempfile::tempdir().expect("temp dir");
    let data = directory.path().join("data");
    let policy = || Policy::parse(IDLE_POLICY, "idle.toml", None).expect("idle policy");
    let store = || Box::new(SqliteStore::open(&data).expect("open the store"));
    let look = proposal("c1", "agent", "look", 0, "{}");
    let clock = ManualClock::starting_at(EPOCH);
    let first = TestServer::start_on(policy(), store(), clock.clone()).await;
    let s1 = session("agent", "s1", "w");
    assert_eq!(first.decide_ok("", &s1, &look).await.reason, "allowed");
    clock.advance(Duration::from_millis(900));
    assert_eq!(first.decide_ok("", &s1, &look).await.reason, "allowed");
    first.engine.close_store();
    first.stop().await;
    // Ten idle seconds since the first call, not since the last one.
    clock.advance(Duration::from_millis(9_500));
    let second = TestServer::start_on(policy(), store(), clock.clone()).await;
    let s2 = session("agent", "s2", "w");
    let full = second
        .decide("", &s2, &look)
        .await
        .expect_err("s1 is not idle");
    assert_eq!(full.code(), tonic::Code::ResourceExhausted, "{full:?}");
    clock.advance(Duration::from_millis(600));
    assert_eq!(second.decide_ok("", &s2, &look).await.reason, "allowed");
    second.stop().await;
}

/// Whether `answer` is still unanswered 200 ms on (it can only be if it
/// waits for a stalled store).
async fn unanswered<F: std::future::Future>(answer: std::pin::Pin<&mut F>) -> bool {
    tokio::time::timeout(Duration::from_millis(200), answer)
        .await
        .is_err()
}

/// Whether the commits of a store stall (see [`StallGuard::wait`]); releases
/// them when dropped.
struct StallGuard(Arc<(Mutex<bool>, Condvar)>);

impl StallGuard {
    /// Waits while the stall is on: a sync that takes its time, as this
    /// machine's do now and then.
    fn wait(stall: &(Mutex<bool>, Condvar)) {
        let (stalled, released) = stall;
        let mut stalled = stalled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        while *stalled {
            stalled = released
                .wait(stalled)
                .unwrap_or_else(std::sync::PoisonError::into_inner);
        }
    }

    fn set(&self, on: bool) {
        let (stalled, released) = &*self.0;
        *stalled
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = on;
        released.notify_all();
    }
}

impl Drop for StallGuard {
    fn drop(&mut self) {
        self.set(false);
    }
}

/// An answer waits only for what an answer can reveal. A call whose one
/// change is its session's last activity (written once a second, and only
/// timing the session's eviction) is answered while that write's sync is
/// under way, for up to `UNSYNCED_FOR`; a call that decides a new call id
/// waits for its own.
#[tokio::test]
async fn no_answer_waits_for_the_write_of_a_sessions_last_activity() {
    let directory = tempfile::tempdir().expect("temp dir");
    let stalled = Arc::new((Mutex::new(false), Condvar::new()));
    let store = Hooked {
        store: Box::new(SqliteStore::open(&directory.path().join("data")).expect("open the store")),
        before: Box::new({
            let stalled = Arc::clone(&stalled);
            move || {
                StallGuard::wait(&stalled);
                Ok(())
            }
        }),
    };
    let policy = Policy::parse(IDLE_POLICY, "idle.toml", None).expect("idle policy");
    let clock = ManualClock::starting_at(EPOCH);
    let server = TestServer::start_on(policy, Box::new(store), clock.clone()).await;
    let s1 = session("agent", "s1", "w");
    let look = proposal("c1", "agent", "look", 0, "{}");
    assert_eq!(server.decide_ok("", &s1, &look).await.reason, "allowed");
    // Declared after the server, so dropped before it: a failed assertion
    // releases the store, and the server can stop.
    let stall = StallGuard(Arc::clone(&stalled));
    stall.set(true);
    // A second later the same call id again: its session's last activity
    // is written, and the answer does not wait for that sync (before, it
    // waited for as long as the sync took: here, for ever).
    clock.advance(Duration::from_millis(1_100));
    let again = tokio::time::timeout(Duration::from_secs(30), server.decide_ok("", &s1, &look))
        .await
        .expect("answered while the session's write is stalled");
    assert_eq!(again.reason, "allowed");
    // Once the stalled write has been under way for UNSYNCED_FOR, a call
    // that changes nothing waits for it too: a stall does not leave last
    // activities unsynced without bound (found in review: every one of a
    // long stall's could be lost).
    tokio::time::sleep(UNSYNCED_FOR + Duration::from_millis(100)).await;
    {
        let held = server.decide_ok("", &s1, &look);
        tokio::pin!(held);
        assert!(
            unanswered(held.as_mut()).await,
            "a stalled store holds every answer after UNSYNCED_FOR"
        );
        // A new call id is a change its answer reveals: that answer waits
        // until its batch is on disk, so not while the store is stalled.
        let new = proposal("c2", "agent", "look", 0, "{}");
        let decided = server.decide_ok("", &s1, &new);
        tokio::pin!(decided);
        assert!(
            unanswered(decided.as_mut()).await,
            "a new call id is answered only once it is durable"
        );
        stall.set(false);
        assert_eq!(held.await.reason, "allowed");
        assert_eq!(decided.await.reason, "allowed");
    }
    server.stop().await;
}
