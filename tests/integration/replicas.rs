//! Replicas: several `toolgate serve` processes on one PostgreSQL schema
//! (the real server of `TOOLGATE_TEST_DATABASE_URL`, a fresh schema per
//! test) share one ledger, one receipt log and one set of resources: a
//! grant made on one is consumed on another, once, however many race for
//! it; a receipt replays on any of them; a watcher on one sees the others'
//! transitions in commit order; a replica killed under load loses nothing
//! that was acknowledged.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use tokio_stream::StreamExt;

use crate::support::policies::portable;
use crate::support::postgres::{PrivateCluster, TestSchema};
use crate::support::recovery::{RECOVERY, decide, dispatch, post, set_note};
use crate::support::spawn::{Serve, Spawned};
use crate::support::tokens::EXAMPLE_REVIEWER;
use crate::support::{authed, grant_request, pb, session};

fn replica(schema: &TestSchema) -> Spawned {
    Serve::new(&portable(RECOVERY))
        .args(&["--store", &schema.url, "--migrate"])
        .start()
}

/// A replica told where the store is by its policy's `[server] store`.
fn replica_by_policy(schema: &TestSchema) -> Spawned {
    let policy = portable(RECOVERY).replace(
        "open_host_api = true",
        &format!("open_host_api = true\nstore = {:?}", schema.url),
    );
    Serve::new(&policy)
        .store_from_policy()
        .args(&["--migrate"])
        .start()
}

async fn approvals(
    server: &Spawned,
) -> pb::approvals_client::ApprovalsClient<tonic::transport::Channel> {
    pb::approvals_client::ApprovalsClient::new(server.channel().await)
}

async fn grant(server: &Spawned, approval_id: &str) -> pb::Approval {
    approvals(server)
        .await
        .grant_approval(authed(
            grant_request(approval_id.to_string(), "checked"),
            EXAMPLE_REVIEWER,
        ))
        .await
        .expect("grant")
        .into_inner()
}

async fn approval(server: &Spawned, approval_id: &str) -> pb::Approval {
    approvals(server)
        .await
        .get_approval(authed(
            pb::GetApprovalRequest {
                approval_id: approval_id.to_string(),
            },
            EXAMPLE_REVIEWER,
        ))
        .await
        .expect("GetApproval")
        .into_inner()
}

async fn resource(server: &Spawned, name: &str) -> pb::Resource {
    resource_page(server, name, String::new()).await
}

/// The page of resource `name` that `page_token` names (the first: empty).
async fn resource_page(server: &Spawned, name: &str, page_token: String) -> pb::Resource {
    pb::resources_client::ResourcesClient::new(server.channel().await)
        .get_resource(authed(
            pb::GetResourceRequest {
                name: name.to_string(),
                page_token,
                page_size: 0,
            },
            EXAMPLE_REVIEWER,
        ))
        .await
        .expect("GetResource")
        .into_inner()
}

/// The reviewer's watch of the ledger on `server`.
async fn watch(server: &Spawned) -> tonic::Streaming<pb::ApprovalEvent> {
    approvals(server)
        .await
        .watch_approvals(authed(pb::WatchApprovalsRequest {}, EXAMPLE_REVIEWER))
        .await
        .expect("watch")
        .into_inner()
}

/// The next event on `events` within 10 s, if one comes.
async fn next_event(events: &mut tonic::Streaming<pb::ApprovalEvent>) -> Option<pb::ApprovalEvent> {
    let next = tokio::time::timeout(Duration::from_secs(10), events.next()).await;
    Some(
        next.ok()?
            .expect("the stream goes on")
            .expect("an event, not an error"),
    )
}

#[tokio::test]
async fn a_grant_on_one_replica_is_consumed_on_another_and_replays_on_a_third() {
    let schema = TestSchema::new();
    let (a, b, c) = (
        replica(&schema),
        replica(&schema),
        replica_by_policy(&schema),
    );
    let mut events = watch(&c).await;
    // Decide on A asks for approval; B and C know the request at once.
    let call = set_note("c-note", "shared");
    let decided = decide(&a, &call).await;
    assert_eq!(decided.reason, "approval-required", "{decided:?}");
    assert_eq!(
        approval(&c, &decided.approval_id).await.status(),
        pb::ApprovalStatus::Pending
    );
    // The same proposal decided again on B finds A's request pending.
    let again = decide(&b, &call).await;
    assert_eq!(again.approval_id, decided.approval_id, "{again:?}");
    // A reviewer grants on A; the host dispatches on B; C replays.
    assert_eq!(
        grant(&a, &decided.approval_id).await.status(),
        pb::ApprovalStatus::Granted
    );
    let committed = dispatch(&b, &call).await.expect("Dispatch on B");
    assert_eq!(
        (committed.status(), committed.replayed),
        (pb::DispatchStatus::Ok, false),
        "{committed:?}"
    );
    let replayed = dispatch(&c, &call).await.expect("Dispatch on C");
    assert!(replayed.replayed, "{replayed:?}");
    assert_eq!(replayed.receipt_id, committed.receipt_id);
    assert_eq!(
        approval(&a, &decided.approval_id).await.status(),
        pb::ApprovalStatus::Consumed
    );
    // The watcher on C saw A's request and grant and B's consumption, in
    // that order.
    let mut seen = Vec::new();
    while seen.len() < 3 {
        let Some(event) = next_event(&mut events).await else {
            break;
        };
        if event.approval.as_ref().map(|a| a.approval_id.as_str())
            == Some(decided.approval_id.as_str())
        {
            seen.push(event.kind());
        }
    }
    assert_eq!(
        seen,
        [
            pb::ApprovalEventKind::Requested,
            pb::ApprovalEventKind::Granted,
            pb::ApprovalEventKind::Consumed
        ]
    );
    for server in [a, b, c] {
        assert_eq!(server.stop(), Some(0));
    }
}

#[tokio::test]
async fn three_hundred_dispatches_of_one_grant_over_three_replicas_commit_once() {
    let schema = TestSchema::new();
    let replicas = [replica(&schema), replica(&schema), replica(&schema)];
    let call = set_note("c-race", "raced");
    let decided = decide(&replicas[0], &call).await;
    grant(&replicas[1], &decided.approval_id).await;
    let mut clients = Vec::new();
    for server in &replicas {
        clients.push(server.pdp().await);
    }
    let mut racing = tokio::task::JoinSet::new();
    for index in 0..300 {
        let mut client = clients[index % 3].clone();
        let request = crate::support::dispatch_request(session("agent", "s1", "w"), call.clone());
        racing.spawn(async move { client.dispatch(request).await.map(|r| r.into_inner()) });
    }
    let (mut first, mut receipts) = (0, HashSet::new());
    while let Some(answer) = racing.join_next().await {
        let answer = answer.expect("the task").expect("Dispatch answers");
        assert_eq!(answer.status(), pb::DispatchStatus::Ok, "{answer:?}");
        first += usize::from(!answer.replayed);
        receipts.insert(answer.receipt_id);
    }
    assert_eq!(first, 1, "one commit, the rest replays");
    assert_eq!(receipts.len(), 1, "{receipts:?}");
    // Once: the note moved to version 1, as every replica reads it.
    for server in &replicas {
        let note = resource(server, "note").await;
        assert_eq!((note.value_json.as_str(), note.version), ("\"raced\"", 1));
    }
    assert_eq!(
        approval(&replicas[2], &decided.approval_id).await.status(),
        pb::ApprovalStatus::Consumed
    );
}

/// What a poster was told was committed: (session id, call id, version,
/// receipt id).
type Acknowledged = Vec<(String, String, u64, String)>;

/// Calls a poster makes in one session (a session's decisions are
/// budgeted), so that replays of them fit too.
const CALLS_PER_SESSION: u64 = 300;

/// Posts to the one queue through `client` until `stop` is set: each post
/// at the version it last saw (STALE says the one in force; a new call id
/// then), an UNAVAILABLE retried with the same call until it is answered
/// (for up to 60 s: the store resumes). Returns what was acknowledged.
async fn post_until(
    mut client: pb::policy_decision_point_client::PolicyDecisionPointClient<
        tonic::transport::Channel,
    >,
    name: String,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Acknowledged {
    let mut acknowledged = Vec::new();
    let (mut version, mut attempt) = (0, 0);
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        attempt += 1;
        let session_id = format!("{name}-s{}", attempt / CALLS_PER_SESSION);
        let call = post(&format!("{name}-{attempt}"), version, &name);
        let deadline = Instant::now() + Duration::from_secs(60);
        let answer = loop {
            let request =
                crate::support::dispatch_request(session("agent", &session_id, "w"), call.clone());
            match client.dispatch(request).await {
                Ok(answer) => break answer.into_inner(),
                Err(status)
                    if matches!(
                        status.code(),
                        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded
                    ) && Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                // A replica that is gone ends its poster.
                Err(_) => return acknowledged,
            }
        };
        match answer.status() {
            pb::DispatchStatus::Ok => {
                acknowledged.push((
                    session_id,
                    call.call_id.clone(),
                    version,
                    answer.receipt_id.clone(),
                ));
                version = answer.version;
            }
            pb::DispatchStatus::StaleVersion => version = answer.version,
            other => panic!("{other:?}: {answer:?}"),
        }
    }
    acknowledged
}

/// Every acknowledged post replays on `server` with its receipt, and no two
/// made the same version: each committed once, in one order. The queue
/// holds each poster's acknowledged posts and nothing else, but for one
/// more of each poster in `killed`: a post that committed while its
/// replica was killed, whose answer never left it (its poster, gone with
/// the replica, had one post in flight at most).
async fn every_post_committed_once(server: &Spawned, acknowledged: &Acknowledged, killed: &[&str]) {
    let mut client = server.pdp().await;
    let mut versions = HashSet::new();
    for (session_id, call_id, version, receipt_id) in acknowledged {
        let text = call_id.split('-').next().unwrap_or_default();
        let request = crate::support::dispatch_request(
            session("agent", session_id, "w"),
            post(call_id, *version, text),
        );
        let answer = client.dispatch(request).await.expect("replay").into_inner();
        assert!(answer.replayed, "{call_id}: {answer:?}");
        assert_eq!(&answer.receipt_id, receipt_id, "{call_id}");
        assert!(versions.insert(answer.version), "{call_id}: {answer:?}");
    }
    let mut told: BTreeMap<String, u64> = BTreeMap::new();
    for (_, call_id, _, _) in acknowledged {
        let poster = call_id.split('-').next().unwrap_or_default();
        *told.entry(poster.to_string()).or_default() += 1;
    }
    let mut held: BTreeMap<String, u64> = BTreeMap::new();
    let (mut items, mut page_token) = (0, String::new());
    let count = loop {
        let page = resource_page(server, "queue", page_token).await;
        let posts: Vec<serde_json::Value> =
            serde_json::from_str(&page.value_json).expect("the queue's items");
        for post in &posts {
            let poster = post["text"].as_str().expect("a post's text");
            *held.entry(poster.to_string()).or_default() += 1;
        }
        items += posts.len() as u64;
        if page.next_page_token.is_empty() {
            break page.item_count;
        }
        page_token = page.next_page_token;
    };
    assert_eq!(count, Some(items));
    for (poster, &count) in &held {
        let acknowledged = told.get(poster).copied().unwrap_or(0);
        let unanswered = u64::from(killed.contains(&poster.as_str()));
        assert!(
            (acknowledged..=acknowledged + unanswered).contains(&count),
            "{poster}: {count} posts in the queue, {acknowledged} acknowledged"
        );
    }
    assert!(told.keys().all(|poster| held.contains_key(poster)));
}

/// Runs one poster per replica for `load`, doing `fault` in the middle;
/// the posters' call ids begin with `round`.
async fn under_load(
    round: &str,
    replicas: &[&Spawned],
    load: Duration,
    fault: impl FnOnce(),
) -> Acknowledged {
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut posters = Vec::new();
    for (index, server) in replicas.iter().enumerate() {
        posters.push(tokio::spawn(post_until(
            server.pdp().await,
            format!("{round}r{index}"),
            std::sync::Arc::clone(&stop),
        )));
    }
    tokio::time::sleep(load / 2).await;
    tokio::task::block_in_place(fault);
    tokio::time::sleep(load / 2).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut acknowledged = Vec::new();
    for poster in posters {
        acknowledged.extend(poster.await.expect("the poster"));
    }
    acknowledged
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_killed_under_load_loses_nothing_acknowledged() {
    let schema = TestSchema::new();
    let doomed = replica(&schema);
    let (b, c) = (replica(&schema), replica(&schema));
    let pid = doomed.pid().to_string();
    let acknowledged = under_load("k", &[&doomed, &b, &c], Duration::from_secs(3), || {
        let killed = std::process::Command::new("kill")
            .args(["-KILL", &pid])
            .status()
            .expect("kill");
        assert!(killed.success());
    })
    .await;
    assert!(acknowledged.len() >= 30, "{}", acknowledged.len());
    every_post_committed_once(&c, &acknowledged, &["kr0"]).await;
    for server in [b, c] {
        assert_eq!(server.stop(), Some(0));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgresql_restarted_and_cut_under_load_loses_no_grant_and_commits_nothing_twice() {
    let cluster = PrivateCluster::start();
    let schema = cluster.schema();
    let replicas = [replica(&schema), replica(&schema), replica(&schema)];
    let [a, b, c] = &replicas;
    // A grant made before the faults.
    let call = set_note("c-before", "granted before");
    let decided = decide(a, &call).await;
    grant(b, &decided.approval_id).await;
    // A restart, then a crash with the server gone for two seconds
    // (commits in flight at that moment lose their connection).
    let mut acknowledged = under_load("f", &[a, b, c], Duration::from_secs(4), || {
        cluster.restart("fast", Duration::ZERO)
    })
    .await;
    acknowledged.extend(
        under_load("i", &[a, b, c], Duration::from_secs(4), || {
            cluster.restart("immediate", Duration::from_secs(2))
        })
        .await,
    );
    assert!(acknowledged.len() >= 30, "{}", acknowledged.len());
    // Every replica serves again by itself.
    for server in &replicas {
        let deadline = Instant::now() + Duration::from_secs(30);
        while server.health().await
            != tonic_health::pb::health_check_response::ServingStatus::Serving
        {
            assert!(Instant::now() < deadline, "health stayed NOT_SERVING");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    every_post_committed_once(c, &acknowledged, &[]).await;
    // The grant is still there, and commits once.
    let committed = dispatch(c, &call).await.expect("Dispatch");
    assert_eq!(
        (committed.status(), committed.replayed),
        (pb::DispatchStatus::Ok, false),
        "{committed:?}"
    );
    let replayed = dispatch(a, &call).await.expect("Dispatch");
    assert!(replayed.replayed, "{replayed:?}");
    assert_eq!(replayed.receipt_id, committed.receipt_id);
}

#[tokio::test]
async fn a_replica_too_far_behind_for_the_transitions_tells_its_watchers_they_lagged() {
    use toolgate::domain::records::{Change, Kind};
    use toolgate::store::Store;
    use toolgate::store::postgres::{KEEP_COMMITS, PURGE_EVERY, PostgresStore};

    let schema = TestSchema::new();
    let (a, b) = (replica(&schema), replica(&schema));
    let mut events = watch(&b).await;
    let call = set_note("lag-note", "far behind");
    let decided = decide(&a, &call).await;
    assert_eq!(decided.reason, "approval-required", "{decided:?}");
    let requested = next_event(&mut events).await.expect("REQUESTED on B");
    assert_eq!(requested.kind(), pb::ApprovalEventKind::Requested);
    // B stops; A grants, and more commits are made than the store keeps
    // the transitions of (each rewrites the granted record as it is).
    b.signal("STOP");
    assert_eq!(
        grant(&a, &decided.approval_id).await.status(),
        pb::ApprovalStatus::Granted
    );
    let target = schema.target.clone();
    std::thread::spawn(move || {
        let mut store = PostgresStore::open(&target).expect("open");
        let granted = store
            .load()
            .expect("load")
            .into_iter()
            .find(|record| record.kind == Kind::Approval)
            .expect("the approval");
        let again = [Change {
            kind: Kind::Approval,
            key: granted.key,
            value: Some(granted.value),
        }];
        for _ in 0..KEEP_COMMITS + PURGE_EVERY {
            store.commit(&again).expect("commit");
        }
    })
    .join()
    .expect("the committing thread");
    b.signal("CONT");
    // B loads everything in its next turn, and cannot tell its watcher the
    // grant as a transition: it says what it missed.
    let lagged = next_event(&mut events).await.expect("LAGGED on B");
    assert_eq!(lagged.kind(), pb::ApprovalEventKind::Lagged, "{lagged:?}");
    // One approval changed meanwhile (its grant): at least one missed.
    assert_eq!(lagged.lagged, 1, "{lagged:?}");
    assert_eq!(
        approval(&b, &decided.approval_id).await.status(),
        pb::ApprovalStatus::Granted
    );
    // Transitions after the reload reach the watcher one by one again.
    let committed = dispatch(&a, &call).await.expect("Dispatch on A");
    assert_eq!(committed.status(), pb::DispatchStatus::Ok, "{committed:?}");
    let consumed = next_event(&mut events).await.expect("CONSUMED on B");
    assert_eq!(
        consumed.kind(),
        pb::ApprovalEventKind::Consumed,
        "{consumed:?}"
    );
}

/// A replica sends its own transitions before the other replicas' that
/// came after them in the store, even when the call that made its own is
/// not polled again after it ran: the catch-up (or turn) that takes the
/// others' in publishes first what this replica still holds. (In-process
/// engines, so that the granting call can be left waiting.)
#[tokio::test]
async fn a_replica_hears_its_own_grant_before_a_consumption_made_after_it_elsewhere() {
    use std::sync::Arc;

    use futures_util::FutureExt;
    use toolgate::domain::clock::SystemClock;
    use toolgate::engine::Watched;

    use crate::support::{
        Engine, EventKind, PostgresStore, Proposal, SessionRef, Verdict, policies,
    };

    let schema = TestSchema::new();
    let text = std::fs::read_to_string(policies::repo_path(RECOVERY)).expect(RECOVERY);
    let open = || {
        let store = PostgresStore::open(&schema.target).expect("open the store");
        Engine::open(
            policies::parse(&text),
            Arc::new(SystemClock),
            Box::new(store),
        )
        .expect("an engine")
    };
    let (a, b) = (open(), open());
    let mut watched = a.subscribe();
    let mut context = std::task::Context::from_waker(futures_util::task::noop_waker_ref());
    // A round whose granting call happens to finish in the one poll that
    // ran it (its batch durable at once) shows nothing: try again.
    let mut left_waiting = false;
    for round in 0..20 {
        let session =
            SessionRef::new("agent".into(), format!("s{round}"), "w".into()).expect("session");
        let version = a.resource("note").expect("note").1;
        let proposal = Proposal::new(
            format!("c{round}"),
            "agent".into(),
            "set_item".into(),
            version,
            &format!(r#"{{"item":"note","value":"{round}"}}"#),
        )
        .expect("proposal");
        let (decision, _) = a.decide(&session, &proposal).await.expect("Decide");
        let (id, _) = decision.approval.expect("a request");
        // A grants: its call is polled until the grant is made in A's
        // state, then never again (it never publishes anything itself).
        let mut granting = Box::pin(a.review(id, Verdict::Grant, "lead", String::new()));
        let deadline = Instant::now() + Duration::from_secs(10);
        left_waiting = loop {
            if granting.poll_unpin(&mut context).is_ready() {
                break false;
            }
            let status = a.get_approval(id).expect("the approval").status;
            if status == crate::support::ApprovalStatus::Granted {
                break true;
            }
            assert!(Instant::now() < deadline, "the grant never ran");
            tokio::time::sleep(Duration::from_millis(1)).await;
        };
        // B consumes it: after the grant, in the store's order.
        let (dispatched, _) = b
            .dispatch(&session, &proposal)
            .await
            .expect("Dispatch on B");
        assert_eq!(
            dispatched.status,
            crate::support::DispatchStatus::Ok,
            "{dispatched:?}"
        );
        let mut heard = Vec::new();
        while heard.len() < 3 {
            let event = tokio::time::timeout(Duration::from_secs(10), watched.recv())
                .await
                .map_err(|_| format!("A's watcher heard only {heard:?}"))
                .expect("in time")
                .expect("a transition");
            if let Watched::Transition(event) = event
                && event.approval.id == id
            {
                heard.push(event.kind);
            }
        }
        assert_eq!(
            heard,
            [
                EventKind::Requested,
                EventKind::Granted,
                EventKind::Consumed
            ],
            "round {round}"
        );
        drop(granting);
        if left_waiting {
            break;
        }
    }
    assert!(left_waiting, "no round left the granting call waiting");
    a.close_store();
    b.close_store();
}
