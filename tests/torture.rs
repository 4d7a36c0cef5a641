//! Concurrency torture (SPEC §5, §6): one real server, tokio tasks racing
//! Decide, grant, deny, revoke, Dispatch and clock advances (so approvals
//! expire mid-flight) on a shared pool of approvals over 16 resources with
//! per-resource versions, for a few seconds (a deadline, not a sleep). Then,
//! from the `toolgate::audit` events (captured by a tracing layer, so none
//! can be lost), the WatchApprovals stream, the clients' answers and the
//! final state:
//! - every consumed approval is consumed exactly once, by exactly one fresh
//!   commit naming it, and no fresh commit of this approval-requiring tool
//!   happens without a consumption;
//! - no approval both consumed and denied, revoked or expired; a consumed
//!   grant was consumed before its deadline;
//! - one fresh commit per fingerprint; replays return that commit's result;
//! - each resource's commits carry versions 1..=n exactly once and its final
//!   value is the value of commit n.
//!
//! A test crate of its own, apart from `tests/integration/`: it installs the
//! process's global tracing subscriber, which would capture (and slow) every
//! other test running in the same process.

// The shared support module; the integration binary uses all of it (and is
// where the dead-code lint checks it), this crate a part.
#[expect(
    dead_code,
    unused_imports,
    reason = "this crate uses a part of support"
)]
mod support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio_stream::StreamExt;
use tonic::Code;
use toolgate::domain::ledger::ListQuery;
use toolgate::ops::audit::TARGET;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::registry::Registry;

use support::policies::policy_with;
use support::tokens::EXAMPLE_REVIEWER as REVIEWER;
use support::{ApprovalStatus, TestServer, authed, dispatch_request, pb, proposal, session};

const RESOURCES: usize = 16;
const RUN_FOR: Duration = Duration::from_secs(4);

/// `torture.toml` with the resources `k0`… at 0.
fn policy() -> String {
    let resources: Vec<String> = (0..RESOURCES)
        .map(|index| format!("state.resources.k{index}"))
        .collect();
    let values: Vec<(&str, toml::Value)> = resources
        .iter()
        .map(|key| (key.as_str(), toml::Value::Integer(0)))
        .collect();
    policy_with("torture", &values)
}

// ----- audit capture --------------------------------------------------------

type AuditEvent = HashMap<String, String>;

/// Records every `toolgate::audit` event's fields, synchronously.
#[derive(Clone, Default)]
struct AuditCapture {
    events: Arc<Mutex<Vec<AuditEvent>>>,
}

struct Fields<'a>(&'a mut AuditEvent);

impl Visit for Fields<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.0
            .insert(field.name().to_string(), format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.0.insert(field.name().to_string(), value.to_string());
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for AuditCapture {
    fn on_event(&self, event: &tracing::Event<'_>, _context: Context<'_, S>) {
        if event.metadata().target() != TARGET {
            return;
        }
        let mut fields = AuditEvent::new();
        event.record(&mut Fields(&mut fields));
        self.events.lock().expect("audit log").push(fields);
    }
}

impl AuditCapture {
    fn named(&self, name: &str) -> Vec<AuditEvent> {
        self.events
            .lock()
            .expect("audit log")
            .iter()
            .filter(|event| event.get("event").map(String::as_str) == Some(name))
            .cloned()
            .collect()
    }
}

// ----- the race ---------------------------------------------------------------

#[derive(Debug, Clone)]
struct Entry {
    approval_id: String,
    session: pb::Session,
    proposal: pb::Proposal,
}

type Pool = Arc<Mutex<Vec<Entry>>>;

/// Mostly one of the newest entries, so that work piles onto the same approvals.
fn pick(pool: &Pool, rng: &mut StdRng) -> Option<Entry> {
    let pool = pool.lock().expect("pool");
    if pool.is_empty() {
        return None;
    }
    let back = rng.random_range(0..pool.len().min(24));
    Some(pool[pool.len() - 1 - back].clone())
}

async fn propose(server: Arc<TestServer>, pool: Pool, worker: usize, deadline: Instant) -> usize {
    let mut rng = StdRng::seed_from_u64(worker as u64);
    let session = session("agent", &format!("s{worker}"), "desk");
    let mut resources = server.resources();
    let mut made = 0;
    while Instant::now() < deadline {
        let item = format!("k{}", rng.random_range(0..RESOURCES));
        let version = resources
            .get_resource(authed(
                pb::GetResourceRequest {
                    name: item.clone(),
                    ..Default::default()
                },
                REVIEWER,
            ))
            .await
            .expect("get resource")
            .into_inner()
            .version;
        let value: i64 = rng.random_range(0..1_000_000);
        let proposal = proposal(
            &format!("w{worker}-{made}"),
            "agent",
            "set_item",
            version,
            &format!(r#"{{"item":"{item}","value":{value}}}"#),
        );
        made += 1;
        let decision = match server.decide("", &session, &proposal).await {
            Ok(decision) => decision,
            Err(status) if status.code() == Code::ResourceExhausted => continue,
            Err(status) => panic!("decide: {status:?}"),
        };
        assert_eq!(
            decision.outcome(),
            pb::Outcome::RequireApproval,
            "{decision:?}"
        );
        pool.lock().expect("pool").push(Entry {
            approval_id: decision.approval_id,
            session: session.clone(),
            proposal,
        });
    }
    made
}

async fn review(server: Arc<TestServer>, pool: Pool, worker: usize, deadline: Instant) {
    let mut rng = StdRng::seed_from_u64(100 + worker as u64);
    let mut approvals = server.approvals();
    while Instant::now() < deadline {
        let Some(entry) = pick(&pool, &mut rng) else {
            tokio::task::yield_now().await;
            continue;
        };
        let roll = rng.random_range(0..100);
        let id = entry.approval_id;
        let answer = if roll < 80 {
            approvals
                .grant_approval(authed(
                    pb::GrantApprovalRequest {
                        approval_id: id,
                        comment: String::new(),
                    },
                    REVIEWER,
                ))
                .await
        } else if roll < 90 {
            approvals
                .deny_approval(authed(
                    pb::DenyApprovalRequest {
                        approval_id: id,
                        reason: String::new(),
                    },
                    REVIEWER,
                ))
                .await
        } else {
            approvals
                .revoke_approval(authed(
                    pb::RevokeApprovalRequest {
                        approval_id: id,
                        reason: String::new(),
                    },
                    REVIEWER,
                ))
                .await
        };
        if let Err(status) = answer {
            assert_eq!(status.code(), Code::FailedPrecondition, "{status:?}");
        }
    }
}

async fn dispatch(
    server: Arc<TestServer>,
    pool: Pool,
    worker: usize,
    deadline: Instant,
) -> Vec<(Entry, pb::DispatchResponse)> {
    let mut rng = StdRng::seed_from_u64(200 + worker as u64);
    let mut pdp = server.pdp();
    let mut answers = Vec::new();
    while Instant::now() < deadline {
        let Some(entry) = pick(&pool, &mut rng) else {
            tokio::task::yield_now().await;
            continue;
        };
        let answer = pdp
            .dispatch(dispatch_request(
                entry.session.clone(),
                entry.proposal.clone(),
            ))
            .await
            .expect("dispatch answers")
            .into_inner();
        answers.push((entry, answer));
    }
    answers
}

/// Moves the clock 5 s every 10 ms: a pending request lives ~0.6 s of real
/// time, a grant ~1.2 s, so expiry races everything else. 4 s of this is
/// ~2000 s, below the hour after which finished approvals are evicted.
async fn advance_clock(server: Arc<TestServer>, deadline: Instant) {
    while Instant::now() < deadline {
        server.clock.advance(Duration::from_secs(5));
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn racing_reviewers_dispatchers_and_the_clock_commit_each_grant_once() {
    let audit = AuditCapture::default();
    tracing::subscriber::set_global_default(Registry::default().with(audit.clone()))
        .expect("the only subscriber in this test binary");
    let server = Arc::new(TestServer::start(&policy()).await);

    let mut watch = server
        .approvals()
        .watch_approvals(authed(pb::WatchApprovalsRequest {}, REVIEWER))
        .await
        .expect("watch")
        .into_inner();
    let watched = tokio::spawn(async move {
        let mut events = Vec::new();
        while let Some(Ok(event)) = watch.next().await {
            let marker = event
                .approval
                .as_ref()
                .is_some_and(|approval| approval.call_id == "marker");
            events.push(event);
            if marker {
                break;
            }
        }
        events
    });

    let pool: Pool = Arc::default();
    let deadline = Instant::now() + RUN_FOR;
    let proposers: Vec<_> = (0..3)
        .map(|worker| tokio::spawn(propose(server.clone(), pool.clone(), worker, deadline)))
        .collect();
    let reviewers: Vec<_> = (0..2)
        .map(|worker| tokio::spawn(review(server.clone(), pool.clone(), worker, deadline)))
        .collect();
    let dispatchers: Vec<_> = (0..4)
        .map(|worker| tokio::spawn(dispatch(server.clone(), pool.clone(), worker, deadline)))
        .collect();
    let clock = tokio::spawn(advance_clock(server.clone(), deadline));

    let mut proposed = 0;
    for task in proposers {
        proposed += task.await.expect("proposer");
    }
    for task in reviewers {
        task.await.expect("reviewer");
    }
    let mut answers = Vec::new();
    for task in dispatchers {
        answers.extend(task.await.expect("dispatcher"));
    }
    clock.await.expect("clock");

    // A last request marks the end of the watch stream.
    let marker = server
        .decide_ok(
            "",
            &session("agent", "s-marker", "desk"),
            &proposal(
                "marker",
                "agent",
                "set_item",
                0,
                r#"{"item":"k0","value":0}"#,
            ),
        )
        .await;
    assert_eq!(marker.outcome(), pb::Outcome::RequireApproval);
    let watched = tokio::time::timeout(Duration::from_secs(30), watched)
        .await
        .expect("watch stream reaches the marker")
        .expect("watch task");

    // ----- audit: consumptions and commits --------------------------------
    let ids_of = |name: &str| -> Vec<String> {
        audit
            .named(name)
            .iter()
            .map(|event| event.get("approval_id").cloned().unwrap_or_default())
            .collect()
    };
    let consumed = ids_of("approval_consumed");
    let consumed_set: HashSet<&String> = consumed.iter().collect();
    assert_eq!(consumed.len(), consumed_set.len(), "a grant consumed twice");
    let granted: HashSet<String> = ids_of("approval_granted").into_iter().collect();
    assert!(
        consumed_set.iter().all(|id| granted.contains(*id)),
        "consumed without a grant"
    );
    for other in ["approval_denied", "approval_revoked", "approval_expired"] {
        let finished = ids_of(other);
        let mut seen = HashSet::new();
        for id in &finished {
            assert!(seen.insert(id), "{other} twice for {id}");
            assert!(!consumed_set.contains(id), "{id} both consumed and {other}");
        }
    }

    let commits: Vec<AuditEvent> = audit
        .named("tool_call_dispatched")
        .into_iter()
        .filter(|event| event.get("replayed").map(String::as_str) == Some("false"))
        .collect();
    let mut committed_by_approval = HashSet::new();
    let mut committed_fingerprints = HashSet::new();
    for commit in &commits {
        let approval_id = commit.get("approval_id").cloned().unwrap_or_default();
        assert!(
            consumed_set.contains(&approval_id),
            "a commit without a consumed grant: {commit:?}"
        );
        assert!(
            committed_by_approval.insert(approval_id),
            "two commits name one grant"
        );
        assert!(
            committed_fingerprints.insert(commit.get("fingerprint").cloned()),
            "one fingerprint committed twice"
        );
    }
    assert_eq!(
        commits.len(),
        consumed.len(),
        "a consumption without a commit"
    );

    // ----- the watch stream saw the same consumptions ----------------------
    let lagged = watched
        .iter()
        .any(|event| event.kind() == pb::ApprovalEventKind::Lagged);
    let watched_consumed: HashSet<String> = watched
        .iter()
        .filter(|event| event.kind() == pb::ApprovalEventKind::Consumed)
        .filter_map(|event| event.approval.as_ref().map(|a| a.approval_id.clone()))
        .collect();
    if !lagged {
        let audited: HashSet<String> = consumed.iter().cloned().collect();
        assert_eq!(watched_consumed, audited, "watch and audit disagree");
    }

    // ----- the clients' answers --------------------------------------------
    let mut fresh: HashMap<String, pb::DispatchResponse> = HashMap::new();
    let mut by_resource: BTreeMap<String, BTreeMap<u64, String>> = BTreeMap::new();
    let mut statuses: BTreeMap<String, usize> = BTreeMap::new();
    for (entry, answer) in &answers {
        *statuses
            .entry(format!("{:?}/{}", answer.status(), answer.replayed))
            .or_default() += 1;
        if answer.status() != pb::DispatchStatus::Ok || answer.replayed {
            assert!(answer.receipt_id.is_empty() || answer.replayed);
            continue;
        }
        assert_eq!(answer.approval_id, entry.approval_id, "{answer:?}");
        assert!(consumed_set.contains(&answer.approval_id));
        let call_id = entry.proposal.call_id.clone();
        assert!(
            fresh.insert(call_id, answer.clone()).is_none(),
            "a call id committed twice"
        );
        let versions = by_resource.entry(answer.resource.clone()).or_default();
        assert!(
            versions
                .insert(answer.version, answer.value_json.clone())
                .is_none(),
            "two commits made {} version {}",
            answer.resource,
            answer.version
        );
    }
    assert_eq!(fresh.len(), commits.len(), "clients and audit disagree");
    for (entry, answer) in &answers {
        if answer.replayed {
            let Some(first) = fresh.get(&entry.proposal.call_id) else {
                // Committed by a call whose answer we did not keep? Every
                // dispatch answer is kept, so a replay has its commit here.
                panic!("a replay without a commit: {answer:?}");
            };
            assert_eq!(
                (&answer.receipt_id, answer.version, &answer.value_json),
                (&first.receipt_id, first.version, &first.value_json),
                "a replay differs from its commit"
            );
        }
    }

    // ----- the final state ---------------------------------------------------
    let mut resources = server.resources();
    for index in 0..RESOURCES {
        let name = format!("k{index}");
        let resource = resources
            .get_resource(authed(
                pb::GetResourceRequest {
                    name: name.clone(),
                    ..Default::default()
                },
                REVIEWER,
            ))
            .await
            .expect("resource")
            .into_inner();
        let commits = by_resource.remove(&name).unwrap_or_default();
        let versions: Vec<u64> = commits.keys().copied().collect();
        let expected: Vec<u64> = (1..=versions.len() as u64).collect();
        assert_eq!(versions, expected, "{name}: commit versions");
        assert_eq!(resource.version, versions.len() as u64, "{name}: version");
        let last = commits.values().last().cloned().unwrap_or("0".into());
        assert_eq!(resource.value_json, last, "{name}: value");
    }
    assert!(by_resource.is_empty(), "commits to unknown resources");

    let page = server
        .engine
        .list_approvals(&ListQuery {
            page_size: usize::MAX,
            ..ListQuery::default()
        })
        .await
        .expect("list");
    let mut final_consumed = 0;
    for approval in &page.approvals {
        let id = approval.id.to_string();
        if approval.status == ApprovalStatus::Consumed {
            final_consumed += 1;
            assert!(consumed_set.contains(&id), "consumed without an event");
            let finished = approval.finished_at.expect("finished");
            assert!(
                finished < approval.expires_at,
                "consumed at or after the grant's deadline"
            );
        } else {
            assert!(!consumed_set.contains(&id), "{id} is {:?}", approval.status);
        }
    }
    assert_eq!(final_consumed, consumed.len());

    println!(
        "torture: {proposed} proposals, {} requests, {} grants, {} consumed, {} denied, {} revoked, {} expired, {} watch events (lagged: {lagged}), dispatch answers {statuses:?}",
        ids_of("tool_call_require_approval").len(),
        granted.len(),
        consumed.len(),
        ids_of("approval_denied").len(),
        ids_of("approval_revoked").len(),
        ids_of("approval_expired").len(),
        watched.len(),
    );
    assert!(!consumed.is_empty(), "the race committed nothing");

    match Arc::try_unwrap(server) {
        Ok(server) => server.stop().await,
        Err(_) => panic!("tasks still hold the server"),
    }
}
