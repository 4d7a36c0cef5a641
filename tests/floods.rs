//! Floods over real gRPC: many concurrent callers on several HTTP/2
//! connections push sessions, pending approvals and receipts past their caps.
//! The caps hold exactly (RESOURCE_EXHAUSTED, or the Dispatch status
//! LOG_FULL for receipts), refused calls store nothing, and once the test
//! clock passes the idle time, the pending TTL or the receipt retention,
//! eviction and expiry make room again. Two memory bounds: a flood of 20,000
//! refused requests with ~10 KB arguments, and a WatchApprovals client that
//! never reads while thousands of ledger transitions happen, each grow the
//! process's resident set (the server runs in this test process) by less
//! than a stated budget.
//!
//! The tests of this file run one at a time (`SERIAL`) so that one test's
//! allocations never show in another's RSS measurement.
//!
//! A test crate of its own, apart from `tests/integration/`: it reads the
//! resident set of this process, which any other test running alongside in
//! the same process would grow.

// The shared support module; the integration binary uses all of it (and is
// where the dead-code lint checks it), this crate a part.
#[expect(
    dead_code,
    unused_imports,
    reason = "this crate uses a part of support"
)]
mod support;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::process::Command;
use std::time::Duration;

use tokio::task::JoinSet;
use tokio_stream::StreamExt;
use tonic::Code;
use tonic::transport::{Channel, Endpoint};
use toolgate::domain::pins::MAX_API_PINS;
use toolgate::domain::policy::ServerSettings;
use toolgate::engine::WATCH_BUFFER;

use support::pb::policy_decision_point_client::PolicyDecisionPointClient;
use support::policies::{decide_text, integer, policy_with};
use support::spawn::{Serve, Spawned};
use support::tokens::{ALICE, HOST};
use support::{
    Stats, TestServer, authed, decide_request, dispatch_request, pb, proposal, read_balance,
    session,
};

const MAX_SESSIONS: usize = 50;
const SESSION_IDLE_SECONDS: u64 = 600;
const MAX_PENDING_PER_ACTOR: usize = 5;
const MAX_PENDING_TOTAL: usize = 20;
const MAX_APPROVAL_RECORDS: usize = 40;
const PENDING_TTL_SECONDS: u64 = 300;
const RECEIPT_CAPACITY: usize = 10;
const RECEIPT_RETENTION_SECONDS: u64 = 120;
const ACTORS: usize = 8;
const RESOURCES: usize = 100;

/// How much the resident set may grow during 20,000 refused requests with
/// ~10 KB arguments (~200 MB of request data). Nothing of a refused request
/// is kept, so the growth is allocator slack and connection buffers: a few
/// MiB. 64 MiB is far below what keeping even a third of the arguments
/// would cost, and far above the noise of glibc's per-thread arenas.
const REFUSED_FLOOD_RSS_BUDGET: u64 = 64 * 1024 * 1024;

/// How much the resident set may grow while a watcher that never reads sits
/// through 12,000 ledger transitions of ~8 KB approvals (~100 MB if they
/// were queued for it). What is legitimately held: the broadcast buffer
/// (`WATCH_BUFFER` = 1024 events ≈ 9 MB), the ledger (40 records ≈ 0.4 MB),
/// the session's decided call ids (~0.5 MB), HTTP/2 windows, allocator slack.
const SLOW_WATCHER_RSS_BUDGET: u64 = 48 * 1024 * 1024;

/// One test at a time: RSS is a property of the whole process.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// `floods.toml` with the limits above, resources `r000`… and actors
/// `a0`…, and `extra` values.
fn policy(extra: &[(&str, toml::Value)]) -> String {
    let mut values = vec![
        ("limits.max_sessions", integer(MAX_SESSIONS)),
        ("limits.session_idle_seconds", integer(SESSION_IDLE_SECONDS)),
        (
            "limits.max_pending_per_actor",
            integer(MAX_PENDING_PER_ACTOR),
        ),
        ("limits.max_pending_total", integer(MAX_PENDING_TOTAL)),
        ("limits.max_approval_records", integer(MAX_APPROVAL_RECORDS)),
        ("limits.approval_retention_seconds", integer(3600)),
        ("limits.pending_ttl_seconds", integer(PENDING_TTL_SECONDS)),
        ("limits.receipt_capacity", integer(RECEIPT_CAPACITY)),
        (
            "limits.receipt_retention_seconds",
            integer(RECEIPT_RETENTION_SECONDS),
        ),
    ];
    let resources: Vec<String> = (0..RESOURCES)
        .map(|index| format!("state.resources.r{index:03}"))
        .collect();
    let actors: Vec<String> = (0..ACTORS)
        .map(|index| format!("actors.a{index}.profile"))
        .collect();
    values.extend(resources.iter().map(|key| (key.as_str(), "v0".into())));
    values.extend(actors.iter().map(|key| (key.as_str(), "agent".into())));
    values.extend(extra.iter().cloned());
    policy_with("floods", &values)
}

fn actor(index: usize) -> String {
    format!("a{}", index % ACTORS)
}

/// Several HTTP/2 connections, so that callers do not share one.
async fn connections(server: &TestServer, count: usize) -> Vec<Channel> {
    let mut channels = Vec::new();
    for _ in 0..count {
        channels.push(
            Endpoint::from_shared(format!("http://{}", server.addr))
                .expect("endpoint")
                .connect()
                .await
                .expect("connect"),
        );
    }
    channels
}

/// Runs every task at once and returns their results in order.
async fn all<T, F>(tasks: Vec<F>) -> Vec<T>
where
    T: Send + 'static,
    F: Future<Output = T> + Send + 'static,
{
    let mut set = JoinSet::new();
    for (index, task) in tasks.into_iter().enumerate() {
        set.spawn(async move { (index, task.await) });
    }
    let mut results: Vec<(usize, T)> = Vec::new();
    while let Some(joined) = set.join_next().await {
        results.push(joined.expect("task"));
    }
    results.sort_by_key(|(index, _)| *index);
    results.into_iter().map(|(_, result)| result).collect()
}

async fn decide_on(
    channel: Channel,
    session: pb::Session,
    proposal: pb::Proposal,
) -> Result<pb::DecideResponse, tonic::Status> {
    PolicyDecisionPointClient::new(channel)
        .decide(decide_request(session, proposal))
        .await
        .map(tonic::Response::into_inner)
}

async fn dispatch_on(
    channel: Channel,
    session: pb::Session,
    proposal: pb::Proposal,
) -> Result<pb::DispatchResponse, tonic::Status> {
    PolicyDecisionPointClient::new(channel)
        .dispatch(dispatch_request(session, proposal))
        .await
        .map(tonic::Response::into_inner)
}

/// Counts results by gRPC code (OK for answers).
fn codes<T>(results: &[Result<T, tonic::Status>]) -> HashMap<Code, usize> {
    let mut counts = HashMap::new();
    for result in results {
        let code = match result {
            Ok(_) => Code::Ok,
            Err(status) => status.code(),
        };
        *counts.entry(code).or_insert(0) += 1;
    }
    counts
}

fn stats(server: &TestServer) -> Stats {
    server.engine.stats().expect("stats")
}

/// The process's resident set, from /proc/self/status.
fn rss_bytes() -> u64 {
    vm_rss(&std::fs::read_to_string("/proc/self/status").expect("/proc/self/status"))
}

/// A spawned server's resident set, from /proc/PID/status.
fn server_rss(server: &Spawned) -> u64 {
    let path = format!("/proc/{}/status", server.child.id());
    vm_rss(&std::fs::read_to_string(path).expect("/proc/PID/status"))
}

/// A spawned server's CPU time so far (user + system), in clock ticks.
fn cpu_ticks(server: &Spawned) -> u64 {
    let path = format!("/proc/{}/stat", server.child.id());
    let stat = std::fs::read_to_string(path).expect("/proc/PID/stat");
    let after_name = stat.rsplit_once(')').expect("stat").1;
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime")
}

/// One sample of a spawned server's `/metrics`; 0 when absent.
async fn metric(server: &Spawned, series: &str) -> f64 {
    server.metrics().await.get(series).copied().unwrap_or(0.0)
}

/// `VmRSS` of a /proc/…/status text, in bytes.
fn vm_rss(status: &str) -> u64 {
    let line = status
        .lines()
        .find(|line| line.starts_with("VmRSS:"))
        .expect("VmRSS line");
    let kib: u64 = line
        .trim_start_matches("VmRSS:")
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .expect("VmRSS in kB");
    kib * 1024
}

fn look(call_id: &str, actor: &str) -> pb::Proposal {
    proposal(call_id, actor, "look", 0, r#"{"q":"x"}"#)
}

fn ask(call_id: &str, actor: &str, n: usize) -> pb::Proposal {
    proposal(call_id, actor, "ask", 0, &format!(r#"{{"n":{n}}}"#))
}

async fn session_exists(server: &TestServer, session_id: &str) -> bool {
    match server.get_session("", session_id).await {
        Ok(_) => true,
        Err(status) if status.code() == Code::NotFound => false,
        Err(status) => panic!("GetSession: {status:?}"),
    }
}

/// One Decide per new session id, all at once, on `channels`.
async fn session_wave(
    channels: &[Channel],
    prefix: &str,
    count: usize,
) -> (Vec<String>, HashMap<Code, usize>) {
    let tasks = (0..count)
        .map(|index| {
            let channel = channels[index % channels.len()].clone();
            let session_id = format!("{prefix}{index}");
            let actor = actor(index);
            async move {
                let answer = decide_on(
                    channel,
                    session(&actor, &session_id, "w"),
                    look("c1", &actor),
                )
                .await;
                (session_id, answer)
            }
        })
        .collect();
    let results: Vec<(String, Result<pb::DecideResponse, tonic::Status>)> = all(tasks).await;
    let mut opened = Vec::new();
    for (session_id, answer) in &results {
        match answer {
            Ok(answer) => {
                assert_eq!(answer.reason, "allowed", "{answer:?}");
                opened.push(session_id.clone());
            }
            Err(status) => assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}"),
        }
    }
    let answers: Vec<_> = results.into_iter().map(|(_, answer)| answer).collect();
    (opened, codes(&answers))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_session_cap_holds_under_a_flood_and_idle_sessions_make_room() {
    let _serial = SERIAL.lock().await;
    let server = TestServer::start(&policy(&[])).await;
    let channels = connections(&server, 4).await;

    // 10× the cap, all at once, from 500 callers on 4 connections.
    let (first, counts) = session_wave(&channels, "s", 10 * MAX_SESSIONS).await;
    assert_eq!(first.len(), MAX_SESSIONS, "{counts:?}");
    assert_eq!(counts[&Code::ResourceExhausted], 9 * MAX_SESSIONS);
    assert_eq!(stats(&server).sessions, MAX_SESSIONS);

    // One session stays active half-way through the idle time; the others
    // go idle for the whole of it and are evicted to make room.
    let keep = first[0].clone();
    let keep_actor = server.get_session("", &keep).await.expect("session").actor;
    server
        .clock
        .advance(Duration::from_secs(SESSION_IDLE_SECONDS / 2));
    let again = server
        .decide_ok(
            "",
            &session(&keep_actor, &keep, "w"),
            &look("c1", &keep_actor),
        )
        .await;
    assert_eq!(again.reason, "allowed");
    server
        .clock
        .advance(Duration::from_secs(SESSION_IDLE_SECONDS / 2));

    let (second, counts) = session_wave(&channels, "t", 10 * MAX_SESSIONS).await;
    assert_eq!(second.len(), MAX_SESSIONS - 1, "{counts:?}");
    assert_eq!(stats(&server).sessions, MAX_SESSIONS);
    assert!(
        session_exists(&server, &keep).await,
        "an active session is kept"
    );
    assert!(
        !session_exists(&server, &first[1]).await,
        "an idle session is evicted"
    );
    server.stop().await;
}

/// A wave of approval requests: `per_actor` new proposals for each of
/// `actors`, all at once. Returns the approval ids made and the codes.
async fn pending_wave(
    channels: &[Channel],
    wave: &str,
    actors: std::ops::Range<usize>,
    per_actor: usize,
) -> (Vec<(String, String)>, HashMap<Code, usize>) {
    let mut tasks = Vec::new();
    for actor_index in actors {
        for index in 0..per_actor {
            let channel = channels[(actor_index + index) % channels.len()].clone();
            let actor = actor(actor_index);
            let call_id = format!("{wave}-{index}");
            tasks.push(async move {
                let answer = decide_on(
                    channel,
                    session(&actor, &format!("p-{actor}"), "w"),
                    ask(&call_id, &actor, index),
                )
                .await;
                (actor, answer)
            });
        }
    }
    let results = all(tasks).await;
    let mut made = Vec::new();
    for (actor, answer) in &results {
        match answer {
            Ok(answer) => {
                assert_eq!(
                    (answer.outcome(), answer.reason.as_str()),
                    (pb::Outcome::RequireApproval, "approval-required"),
                    "{answer:?}"
                );
                made.push((actor.clone(), answer.approval_id.clone()));
            }
            Err(status) => assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}"),
        }
    }
    let answers: Vec<_> = results.into_iter().map(|(_, answer)| answer).collect();
    (made, codes(&answers))
}

fn per_actor(made: &[(String, String)]) -> HashMap<String, usize> {
    let mut counts = HashMap::new();
    for (actor, _) in made {
        *counts.entry(actor.clone()).or_insert(0) += 1;
    }
    counts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pending_caps_hold_under_a_flood_and_expiry_and_eviction_make_room() {
    let _serial = SERIAL.lock().await;
    let server = TestServer::start(&policy(&[])).await;
    let channels = connections(&server, 4).await;

    // One actor, 12× its cap at once: exactly its cap is made.
    let (made, counts) = pending_wave(&channels, "w1", 0..1, 12 * MAX_PENDING_PER_ACTOR).await;
    assert_eq!(made.len(), MAX_PENDING_PER_ACTOR, "{counts:?}");
    let info = server.get_session("", "p-a0").await.expect("session");
    assert_eq!(
        info.decisions, MAX_PENDING_PER_ACTOR as u64,
        "refused requests are not charged"
    );

    // Seven more actors, 20 each at once: the total cap binds.
    let (more, counts) = pending_wave(&channels, "w1", 1..ACTORS, 20).await;
    assert_eq!(
        more.len(),
        MAX_PENDING_TOTAL - MAX_PENDING_PER_ACTOR,
        "{counts:?}"
    );
    assert!(
        per_actor(&more)
            .values()
            .all(|count| *count <= MAX_PENDING_PER_ACTOR)
    );
    let after = stats(&server);
    assert_eq!(after.pending_approvals, MAX_PENDING_TOTAL);
    assert_eq!(after.approvals, MAX_PENDING_TOTAL, "refusals store nothing");
    let first_wave: Vec<String> = made.iter().chain(&more).map(|(_, id)| id.clone()).collect();
    assert_eq!(
        first_wave.iter().collect::<HashSet<_>>().len(),
        MAX_PENDING_TOTAL
    );

    // At the cap, a proposal that is already pending still gets its request.
    let pending = server
        .get_approval(ALICE, &made[0].1)
        .await
        .expect("pending");
    let index: usize = pending
        .call_id
        .trim_start_matches("w1-")
        .parse()
        .expect("call id");
    let repeat = server
        .decide_ok(
            "",
            &session(&pending.actor, &pending.session_id, "w"),
            &ask(&pending.call_id, &pending.actor, index),
        )
        .await;
    assert_eq!(repeat.outcome(), pb::Outcome::RequireApproval);
    assert_eq!(repeat.approval_id, made[0].1);

    // Past the pending TTL every request expires and the caps free up.
    server
        .clock
        .advance(Duration::from_secs(PENDING_TTL_SECONDS));
    let (second, counts) = pending_wave(&channels, "w2", 0..ACTORS, 20).await;
    assert_eq!(second.len(), MAX_PENDING_TOTAL, "{counts:?}");
    assert!(
        per_actor(&second)
            .values()
            .all(|count| *count <= MAX_PENDING_PER_ACTOR)
    );
    let after = stats(&server);
    assert_eq!(after.pending_approvals, MAX_PENDING_TOTAL);
    assert_eq!(after.approvals, MAX_APPROVAL_RECORDS);
    let expired = server
        .get_approval(ALICE, &first_wave[0])
        .await
        .expect("kept while there is room");
    assert_eq!(expired.status(), pb::ApprovalStatus::Expired);

    // Again: the record cap is reached, so the oldest finished records are
    // evicted to make room; live ones never are.
    server
        .clock
        .advance(Duration::from_secs(PENDING_TTL_SECONDS));
    let (third, counts) = pending_wave(&channels, "w3", 0..ACTORS, 20).await;
    assert_eq!(third.len(), MAX_PENDING_TOTAL, "{counts:?}");
    let after = stats(&server);
    assert_eq!(after.approvals, MAX_APPROVAL_RECORDS);
    assert_eq!(after.pending_approvals, MAX_PENDING_TOTAL);
    for id in &first_wave {
        let status = server
            .get_approval(ALICE, id)
            .await
            .expect_err("evicted for room");
        assert_eq!(status.code(), Code::NotFound);
    }
    for (_, id) in &second {
        assert_eq!(
            server.get_approval(ALICE, id).await.expect("kept").status(),
            pb::ApprovalStatus::Expired
        );
    }
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_refused_at_the_pending_cap_opens_no_session() {
    let _serial = SERIAL.lock().await;
    let server = TestServer::start(&policy(&[])).await;
    for index in 0..MAX_PENDING_PER_ACTOR {
        let answer = server
            .decide_ok(
                "",
                &session("a0", "p-a0", "w"),
                &ask(&format!("c{index}"), "a0", index),
            )
            .await;
        assert_eq!(answer.outcome(), pb::Outcome::RequireApproval);
    }
    let before = stats(&server);
    let status = server
        .decide("", &session("a0", "fresh", "w"), &ask("c-new", "a0", 99))
        .await
        .expect_err("over the per-actor cap");
    assert_eq!(status.code(), Code::ResourceExhausted);
    assert_eq!(
        stats(&server),
        before,
        "README: past the caps Decide creates nothing"
    );
    assert!(!session_exists(&server, "fresh").await);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_receipt_log_cap_holds_under_a_flood_and_retention_makes_room() {
    let _serial = SERIAL.lock().await;
    let server = TestServer::start(&policy(&[])).await;
    let channels = connections(&server, 4).await;
    let commit = |index: usize| {
        let actor = actor(index);
        (
            session(&actor, &format!("d-{actor}"), "w"),
            proposal(
                &format!("d{index}"),
                &actor,
                "commit",
                0,
                &format!(r#"{{"target":"r{index:03}","value":"v{index}"}}"#),
            ),
        )
    };
    let wave = |indexes: Vec<usize>| {
        let tasks: Vec<_> = indexes
            .into_iter()
            .map(|index| {
                let channel = channels[index % channels.len()].clone();
                let (session, proposal) = commit(index);
                async move { (index, dispatch_on(channel, session, proposal).await) }
            })
            .collect();
        all(tasks)
    };
    let split = |results: Vec<(usize, Result<pb::DispatchResponse, tonic::Status>)>| {
        let mut committed = Vec::new();
        let mut full = Vec::new();
        for (index, result) in results {
            let result = result.expect("Dispatch answers");
            match result.status() {
                pb::DispatchStatus::Ok => {
                    assert!(!result.replayed);
                    committed.push(index);
                }
                pb::DispatchStatus::LogFull => {
                    assert_eq!(result.reason, "log-full");
                    assert!(result.receipt_id.is_empty());
                    full.push(index);
                }
                other => panic!("unexpected {other:?}: {result:?}"),
            }
        }
        (committed, full)
    };

    // 10× the capacity at once, each to its own resource: exactly the
    // capacity commits, the rest is LOG_FULL and changes nothing.
    let (committed, full) = split(wave((0..RESOURCES).collect()).await);
    assert_eq!(committed.len(), RECEIPT_CAPACITY);
    assert_eq!(full.len(), RESOURCES - RECEIPT_CAPACITY);
    assert_eq!(stats(&server).receipts, RECEIPT_CAPACITY);
    let mut resources = server.resources();
    for index in 0..RESOURCES {
        let resource = resources
            .get_resource(authed(
                pb::GetResourceRequest {
                    name: format!("r{index:03}"),
                    ..Default::default()
                },
                ALICE,
            ))
            .await
            .expect("resource")
            .into_inner();
        let expected = match committed.contains(&index) {
            true => (format!("\"v{index}\""), 1),
            false => ("\"v0\"".to_string(), 0),
        };
        assert_eq!(
            (resource.value_json, resource.version),
            expected,
            "r{index:03}"
        );
    }

    // A full log still replays what it holds.
    let (session0, proposal0) = commit(committed[0]);
    let replay = dispatch_on(server.channel.clone(), session0, proposal0.clone())
        .await
        .expect("replay");
    assert_eq!(
        (replay.status(), replay.replayed),
        (pb::DispatchStatus::Ok, true)
    );

    // Within retention nothing is evicted.
    server
        .clock
        .advance(Duration::from_secs(RECEIPT_RETENTION_SECONDS - 1));
    let (none, _) = split(wave(full.clone()).await);
    assert!(none.is_empty(), "young receipts are never evicted");

    // Past retention old receipts make room: again exactly the capacity.
    server.clock.advance(Duration::from_secs(1));
    let (later, still_full) = split(wave(full.clone()).await);
    assert_eq!(later.len(), RECEIPT_CAPACITY);
    assert_eq!(still_full.len(), full.len() - RECEIPT_CAPACITY);
    assert_eq!(stats(&server).receipts, RECEIPT_CAPACITY);

    // An evicted receipt does not allow a second commit: the resource moved on.
    let (session0, _) = commit(committed[0]);
    let again = dispatch_on(server.channel.clone(), session0, proposal0)
        .await
        .expect("answer");
    assert_eq!(
        again.status(),
        pb::DispatchStatus::StaleVersion,
        "{again:?}"
    );
    assert_eq!(again.version, 1);
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_pin_cap_holds_under_a_flood() {
    let _serial = SERIAL.lock().await;
    let server = TestServer::start(&policy(&[])).await;
    let channels = connections(&server, 4).await;
    let max = MAX_API_PINS;
    let pin = |channel: Channel, server_id: String| async move {
        pb::manifest_pins_client::ManifestPinsClient::new(channel)
            .pin_manifest(authed(
                pb::PinManifestRequest {
                    manifest: Some(pb::Manifest {
                        server_id,
                        revision: "1".into(),
                        tools: vec![],
                    }),
                    expected_fingerprint: String::new(),
                },
                ALICE,
            ))
            .await
            .map(tonic::Response::into_inner)
    };
    let tasks: Vec<_> = (0..max + max / 4)
        .map(|index| {
            let server_id = format!("srv-{index}");
            let pinned = pin(channels[index % channels.len()].clone(), server_id.clone());
            async move { (server_id, pinned.await) }
        })
        .collect();
    let results = all(tasks).await;
    let pinned: Vec<String> = results
        .iter()
        .filter(|(_, result)| result.is_ok())
        .map(|(server_id, _)| server_id.clone())
        .collect();
    let answers: Vec<_> = results.into_iter().map(|(_, result)| result).collect();
    let counts = codes(&answers);
    assert_eq!(pinned.len(), max, "{counts:?}");
    assert_eq!(counts.get(&Code::ResourceExhausted), Some(&(max / 4)));
    assert_eq!(stats(&server).api_pins, max);

    // At the cap: re-pinning a pinned server replaces its pin (no room
    // needed); a new server is refused; removing a pin makes room.
    pin(server.channel.clone(), pinned[0].clone())
        .await
        .expect("re-pin");
    let status = pin(server.channel.clone(), "srv-new".into())
        .await
        .expect_err("no room");
    assert_eq!(status.code(), Code::ResourceExhausted);
    pb::manifest_pins_client::ManifestPinsClient::new(server.channel.clone())
        .remove_pin(authed(
            pb::RemovePinRequest {
                server_id: pinned[1].clone(),
            },
            ALICE,
        ))
        .await
        .expect("remove");
    pin(server.channel.clone(), "srv-new".into())
        .await
        .expect("room again");
    assert_eq!(stats(&server).api_pins, max);
    server.stop().await;
}

/// ~10 KB of padding.
fn pad() -> String {
    "p".repeat(10 * 1024)
}

/// One refused request of kind `index % 5` with ~10 KB arguments and a
/// call id never used before; returns the gRPC code and the DENY reason.
async fn refused(channel: Channel, index: usize, pad: &str) -> (Code, String) {
    let actor = actor(index);
    let session = session(&actor, &format!("rss-{actor}"), "w");
    let call_id = format!("x{index}");
    let proposal = match index % 5 {
        // Schema: `q` must be a string (small error message, big arguments).
        0 => proposal(
            &call_id,
            &actor,
            "look",
            0,
            &format!(r#"{{"q":{index},"pad":"{pad}"}}"#),
        ),
        // Unknown tool.
        1 => proposal(
            &call_id,
            &actor,
            "exfiltrate",
            0,
            &format!(r#"{{"pad":"{pad}"}}"#),
        ),
        // A new approval request at the full pending caps.
        2 => proposal(
            &call_id,
            &actor,
            "ask",
            0,
            &format!(r#"{{"n":{index},"pad":"{pad}"}}"#),
        ),
        // Duplicate keys.
        3 => proposal(
            &call_id,
            &actor,
            "look",
            0,
            &format!(r#"{{"pad":"{pad}","pad":"x"}}"#),
        ),
        // The proposal claims another actor.
        _ => proposal(
            &call_id,
            "a-other",
            "look",
            0,
            &format!(r#"{{"pad":"{pad}"}}"#),
        ),
    };
    match decide_on(channel, session, proposal).await {
        Ok(answer) => (Code::Ok, answer.reason),
        Err(status) => (status.code(), String::new()),
    }
}

async fn refused_flood(
    channels: &[Channel],
    start: usize,
    count: usize,
) -> HashMap<(Code, String), usize> {
    const WORKERS: usize = 32;
    let tasks: Vec<_> = (0..WORKERS)
        .map(|worker| {
            let channel = channels[worker % channels.len()].clone();
            async move {
                let pad = pad();
                let mut counts: HashMap<(Code, String), usize> = HashMap::new();
                let mut index = start + worker;
                while index < start + count {
                    *counts
                        .entry(refused(channel.clone(), index, &pad).await)
                        .or_insert(0) += 1;
                    index += WORKERS;
                }
                counts
            }
        })
        .collect();
    let mut total = HashMap::new();
    for counts in all(tasks).await {
        for (key, count) in counts {
            *total.entry(key).or_insert(0) += count;
        }
    }
    total
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_refused_requests_keeps_memory_bounded() {
    let _serial = SERIAL.lock().await;
    let server = TestServer::start(&policy(&[])).await;
    let channels = connections(&server, 4).await;
    // Fill the pending caps (from the flood's own sessions, so that refused
    // requests at the cap never need a new session).
    for index in 0..MAX_PENDING_TOTAL {
        let actor = actor(index);
        let answer = server
            .decide_ok(
                "",
                &session(&actor, &format!("rss-{actor}"), "w"),
                &ask(&format!("fill{index}"), &actor, index),
            )
            .await;
        assert_eq!(answer.outcome(), pb::Outcome::RequireApproval);
    }
    let before_stats = stats(&server);

    // Warm up connections, buffers and allocator arenas, then measure.
    refused_flood(&channels, 0, 2_000).await;
    let baseline = rss_bytes();
    let total = 20_000;
    let counts = refused_flood(&channels, 1_000_000, total).await;
    let grown = rss_bytes().saturating_sub(baseline);
    eprintln!(
        "refused flood: RSS {} MiB -> grew {:.1} MiB (budget {} MiB)",
        baseline / (1024 * 1024),
        grown as f64 / (1024.0 * 1024.0),
        REFUSED_FLOOD_RSS_BUDGET / (1024 * 1024)
    );

    let fifth = total / 5;
    let expected: HashMap<(Code, String), usize> = [
        ((Code::InvalidArgument, String::new()), 2 * fifth),
        ((Code::Ok, "unknown-tool".to_string()), fifth),
        ((Code::ResourceExhausted, String::new()), fifth),
        ((Code::Ok, "forbidden".to_string()), fifth),
    ]
    .into_iter()
    .collect();
    assert_eq!(counts, expected);
    assert_eq!(
        stats(&server),
        before_stats,
        "refused requests store nothing"
    );
    assert!(
        grown < REFUSED_FLOOD_RSS_BUDGET,
        "RSS grew {grown} bytes over a flood of refused requests (budget {REFUSED_FLOOD_RSS_BUDGET})"
    );
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_that_never_reads_does_not_grow_memory() {
    let _serial = SERIAL.lock().await;
    // This test is about the broadcast buffer's bound, not the write timeout
    // (which would, rightly, cancel a stream stalled for 10 s on a slow
    // machine): it gets a write timeout longer than the test.
    let server = TestServer::start(&policy(&[("server.write_timeout_ms", integer(600_000))])).await;
    // A watcher that subscribes and then never reads.
    let mut stalled = server.stalled_watcher(ALICE).await;
    let channels = connections(&server, 4).await;

    // Request + deny cycles: two ledger transitions each, ~8 KB approvals,
    // the pending caps never reached (one cycle in flight per actor).
    let cycles = |start: usize, count: usize| {
        let tasks: Vec<_> = (0..ACTORS)
            .map(|worker| {
                let channel = channels[worker % channels.len()].clone();
                async move {
                    let actor = actor(worker);
                    let pad = "q".repeat(8 * 1024);
                    let session = session(&actor, &format!("watch-{actor}"), "w");
                    let mut pdp = PolicyDecisionPointClient::new(channel.clone());
                    let mut approvals = pb::approvals_client::ApprovalsClient::new(channel);
                    let mut index = start + worker;
                    while index < start + count {
                        let answer = pdp
                            .decide(pb::DecideRequest {
                                session: Some(session.clone()),
                                proposal: Some(proposal(
                                    &format!("c{index}"),
                                    &actor,
                                    "ask",
                                    0,
                                    &format!(r#"{{"n":{index},"pad":"{pad}"}}"#),
                                )),
                            })
                            .await
                            .expect("decide")
                            .into_inner();
                        assert_eq!(answer.outcome(), pb::Outcome::RequireApproval);
                        approvals
                            .deny_approval(authed(
                                pb::DenyApprovalRequest {
                                    approval_id: answer.approval_id,
                                    reason: "flood".into(),
                                },
                                ALICE,
                            ))
                            .await
                            .expect("deny");
                        index += ACTORS;
                    }
                }
            })
            .collect();
        all(tasks)
    };

    // Warm up: fills the broadcast buffer and the ledger to their caps.
    let warm_up = 1_200;
    cycles(0, warm_up).await;
    let baseline = rss_bytes();
    let measured = 6_000;
    cycles(warm_up, measured).await;
    let grown = rss_bytes().saturating_sub(baseline);
    eprintln!(
        "slow watcher: RSS {} MiB -> grew {:.1} MiB over {} transitions (budget {} MiB)",
        baseline / (1024 * 1024),
        grown as f64 / (1024.0 * 1024.0),
        2 * measured,
        SLOW_WATCHER_RSS_BUDGET / (1024 * 1024)
    );
    assert!(stats(&server).approvals <= MAX_APPROVAL_RECORDS);
    assert!(
        grown < SLOW_WATCHER_RSS_BUDGET,
        "RSS grew {grown} bytes while a watcher did not read (budget {SLOW_WATCHER_RSS_BUDGET})"
    );

    // When it reads, the watcher learns that it fell behind, and by how much.
    let total = 2 * (warm_up + measured) as u64;
    let (mut seen, mut lagged) = (0u64, 0u64);
    while seen + lagged < total {
        let event = tokio::time::timeout(Duration::from_secs(30), stalled.next())
            .await
            .expect("the watcher gets its events")
            .expect("stream open")
            .expect("event");
        if event.kind() == pb::ApprovalEventKind::Lagged {
            assert!(event.approval.is_none());
            lagged += event.lagged;
        } else {
            seen += 1;
        }
    }
    assert_eq!(seen + lagged, total);
    assert!(lagged > 0, "a watcher {total} events behind must be told");
    assert!(
        seen <= WATCH_BUFFER as u64 + 64,
        "the watcher got {seen} events: more than the buffer was kept for it"
    );
    server.stop().await;
}

// ----- byte bounds, measured on a spawned server (issue 13 items 5, 12) ---

/// Floods against the `toolgate` binary in a process of its own, so that
/// its resident set (`VmRSS`) counts the server and nothing of the test.
mod spawned_byte_bounds {
    use std::time::Duration;

    use tonic::Code;

    use super::{SERIAL, server_rss};
    use crate::support::pb::approvals_client::ApprovalsClient;
    use crate::support::pb::policy_decision_point_client::PolicyDecisionPointClient;
    use crate::support::policies::{integer, policy_text, policy_with};
    use crate::support::spawn::{Serve, Spawned};
    use crate::support::tokens::{ALICE as REVIEWER, FLOOD_HOST as HOST};
    use crate::support::{authed, decide_request, dispatch_request, pb, proposal, session};

    /// `toolgate serve` on `policy`, logging only warnings.
    fn start(policy: &str) -> Spawned {
        Serve::new(policy).start_wrapped(|mut command| {
            command.env("RUST_LOG", "warn");
            command
        })
    }

    const APPENDS: usize = 1000;
    const APPEND_TEXT_BYTES: usize = 4096;

    /// What the resident set may grow by over 1,000 appends of 4 KB. Held
    /// legitimately: the queue (~4 MB) and one receipt per commit with a
    /// copy of its item (~4 MB), plus allocator slack. Before, every receipt
    /// and answer copied the whole queue: 1,000 appends held ~2 GB.
    const APPEND_RSS_BUDGET: u64 = 48 * 1024 * 1024;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_thousand_appends_of_4_kb_stay_linear_in_memory() {
        let _serial = SERIAL.lock().await;
        let server = start(&policy_text("floods_appends"));
        let text = "q".repeat(APPEND_TEXT_BYTES);
        let mut pdp = PolicyDecisionPointClient::new(server.channel().await);
        let mut append = async |index: usize| {
            let arguments = format!(r#"{{"text":"{text}"}}"#);
            let request = dispatch_request(
                session("agent", "s1", "w"),
                proposal(
                    &format!("c{index}"),
                    "agent",
                    "post",
                    index as u64,
                    &arguments,
                ),
            );
            let answer = pdp
                .dispatch(authed(request, HOST))
                .await
                .expect("Dispatch answers")
                .into_inner();
            assert_eq!(answer.status(), pb::DispatchStatus::Ok, "{answer:?}");
            assert_eq!(answer.appended_index, Some(index as u64));
            // The item and a few fields: never the queue.
            assert_eq!(answer.value_json.len(), APPEND_TEXT_BYTES + 11);
        };
        let warm_up = 20;
        for index in 0..warm_up {
            append(index).await;
        }
        let baseline = server_rss(&server);
        for index in warm_up..warm_up + APPENDS {
            append(index).await;
        }
        let grown = server_rss(&server).saturating_sub(baseline);
        eprintln!("{APPENDS} appends of {APPEND_TEXT_BYTES} B: RSS grew {grown} bytes");
        assert!(
            grown < APPEND_RSS_BUDGET,
            "RSS grew {grown} bytes over {APPENDS} appends (budget {APPEND_RSS_BUDGET})"
        );
    }

    const EXPIRED_RECORDS: usize = 16_384;
    /// Canonical `{"pad":"…"}` of exactly the default per-approval limit.
    const RECORD_ARGUMENT_BYTES: usize = 64 * 1024;
    const STATE_BYTES: usize = 32 * 1024 * 1024;

    /// What the resident set may grow by while 16,384 requests of 64 KiB
    /// (1 GiB) are made and expire. Held legitimately: the byte budget
    /// (32 MiB of records, live or expired), HTTP/2 buffers and allocator
    /// slack (measured: ~63 MB in all). Before, expired records stayed for
    /// the retention window: 16,384 held 1.2 GB.
    const LEDGER_RSS_BUDGET: u64 = 128 * 1024 * 1024;

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn expired_records_of_64_kib_never_pile_up_past_the_byte_budget() {
        let _serial = SERIAL.lock().await;
        let server = start(&policy_with(
            "floods_expiry",
            &[
                ("limits.pending_ttl_seconds", integer(1)),
                ("limits.max_pending_per_actor", integer(EXPIRED_RECORDS)),
                ("limits.max_pending_total", integer(EXPIRED_RECORDS)),
                ("limits.max_approval_records", integer(EXPIRED_RECORDS)),
                ("limits.max_state_bytes", integer(STATE_BYTES)),
            ],
        ));
        let channel = server.channel().await;
        let pad = "p".repeat(RECORD_ARGUMENT_BYTES - 10);
        let arguments = format!(r#"{{"pad":"{pad}"}}"#);
        let mut pdp = PolicyDecisionPointClient::new(channel.clone());
        let mut ask = async |index: usize| {
            let request = decide_request(
                // A session per 1,000 requests: call ids are bytes too.
                session("agent", &format!("s{}", index / 1000), "w"),
                proposal(&format!("c{index}"), "agent", "ask", 0, &arguments),
            );
            pdp.decide(authed(request, HOST))
                .await
                .map(tonic::Response::into_inner)
        };
        let mut first = Vec::new();
        for index in 0..16 {
            let decision = ask(index).await.expect("Decide answers");
            assert_eq!(decision.outcome(), pb::Outcome::RequireApproval);
            first.push(decision.approval_id);
        }
        let baseline = server_rss(&server);
        let (mut made, mut refused, mut index) = (16usize, 0usize, 16usize);
        while made < EXPIRED_RECORDS {
            match ask(index).await {
                Ok(decision) => {
                    assert_eq!(decision.outcome(), pb::Outcome::RequireApproval);
                    made += 1;
                    index += 1;
                }
                Err(status) => {
                    // The budget is full of live requests: wait for some to
                    // expire (a real clock: the TTL is 1 s).
                    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
                    assert!(
                        status.message().contains("(limits.max_state_bytes)"),
                        "{status:?}"
                    );
                    refused += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        let grown = server_rss(&server).saturating_sub(baseline);
        eprintln!(
            "{made} requests of {RECORD_ARGUMENT_BYTES} B ({refused} refused while full): RSS grew {grown} bytes"
        );
        assert!(
            grown < LEDGER_RSS_BUDGET,
            "RSS grew {grown} bytes over {made} requests (budget {LEDGER_RSS_BUDGET})"
        );
        // The first requests expired long ago and were evicted for room,
        // well within their retention (an hour).
        let mut approvals = ApprovalsClient::new(channel);
        for id in &first {
            let status = approvals
                .get_approval(authed(
                    pb::GetApprovalRequest {
                        approval_id: id.clone(),
                    },
                    REVIEWER,
                ))
                .await
                .unwrap_err();
            assert_eq!(status.code(), Code::NotFound, "{status:?}");
        }
    }
}

// ---------------------------------------------------------------------------
// Transport floods against a `toolgate serve` process of its own, whose
// resident set is read from /proc/PID/status (issue 13, items 2–4).
// ---------------------------------------------------------------------------

use tokio::net::TcpStream;
use tonic_health::pb::health_check_response::ServingStatus;

use support::raw::{GUARD, closed_by_server, framed, grpc_request, read_answer, until};

const MIB: u64 = 1024 * 1024;

/// How much the server's resident set may grow while 5,000 connections
/// that never speak are open against it: at most 256 are held at once
/// (the per-peer share), each a socket and a few KiB of HTTP/2 state.
const SILENT_FLOOD_RSS_BUDGET: u64 = 64 * MIB;

/// How much the resident set may grow while 1,000 calls each send half of
/// a 1,000,000-byte message and stall (~500 MB if each were buffered):
/// the request buffer is bounded by `max_buffered_request_bytes` (64 MiB),
/// plus HTTP/2 windows and allocator slack.
const STALLED_REQUESTS_RSS_BUDGET: u64 = 160 * MIB;
/// What 800 health checks may grow the server by: the probes' 1 MiB, and
/// what HTTP/2 holds of eight connections' windows.
const PROBES_RSS_BUDGET: u64 = 64 * MIB;

/// How much the resident set may grow while 1,000 GetResource answers of
/// 800 KB wait for windows that never open (~800 MB if each were held):
/// the response buffer is bounded by `max_buffered_response_bytes`
/// (64 MiB), plus answers being encoded and refused, and allocator slack.
const STALLED_RESPONSES_RSS_BUDGET: u64 = 160 * MIB;

/// `toolgate serve` run through `sh -c 'ulimit -n LIMIT; exec …'`.
fn descriptor_limit(limit: u32) -> impl FnOnce(Command) -> Command {
    move |serve| {
        let mut shell = Command::new("sh");
        shell
            .arg("-c")
            .arg(format!("ulimit -n {limit} && exec \"$0\" \"$@\""))
            .arg(serve.get_program())
            .args(serve.get_args());
        for (key, value) in serve.get_envs() {
            match value {
                Some(value) => shell.env(key, value),
                None => shell.env_remove(key),
            };
        }
        shell
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / MIB as f64
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_thousand_connections_that_never_speak_are_capped_and_closed() {
    let _serial = SERIAL.lock().await;
    let server = Serve::new(&decide_text("[server]\nhandshake_timeout_ms = 2000"))
        .with_metrics()
        .start();
    assert_eq!(server.health().await, ServingStatus::Serving);
    let before = server_rss(&server);
    let mut silent = Vec::with_capacity(5_000);
    for _ in 0..5_000 {
        silent.push(TcpStream::connect(server.addr).await.expect("connect"));
    }
    // At the cap, a health probe on a new connection is still answered.
    assert_eq!(server.health().await, ServingStatus::Serving);
    let open = metric(&server, "toolgate_connections_open").await;
    let during = server_rss(&server);
    // Every silent connection is closed: made room for, or timed out.
    for stream in &mut silent {
        assert!(closed_by_server(stream).await);
    }
    until("every connection closed", || async {
        metric(&server, "toolgate_connections_open").await == 0.0
    })
    .await;
    let samples = server.metrics().await;
    let evicted = samples[r#"toolgate_connections_closed_total{reason="evicted"}"#];
    let timed_out = samples[r#"toolgate_connections_closed_total{reason="handshake-timeout"}"#];
    eprintln!(
        "5,000 silent connections: open at the cap {open}, evicted {evicted}, timed out {timed_out}, RSS {:.1} -> {:.1} MiB",
        mib(before),
        mib(during)
    );
    assert!(open <= 256.0, "{open} connections open from one peer");
    assert!(evicted + timed_out >= 5_000.0, "{evicted} + {timed_out}");
    assert!(
        during.saturating_sub(before) < SILENT_FLOOD_RSS_BUDGET,
        "RSS grew {:.1} MiB",
        mib(during.saturating_sub(before))
    );
    assert_eq!(server.stop(), Some(0));
}

/// A `Health/Watch` takes no token and never ends: it does not keep its
/// connection from eviction, so connections that only watch health cannot
/// hold every slot against new ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn health_watchers_do_not_hold_every_connection() {
    let _serial = SERIAL.lock().await;
    let server = Serve::new(&decide_text(
        "[server]\nmax_connections = 4\nmax_connections_per_peer = 4",
    ))
    .start();
    let mut watches = Vec::new();
    for _ in 0..4 {
        let mut health = tonic_health::pb::health_client::HealthClient::new(server.channel().await);
        let mut watch = health
            .watch(tonic_health::pb::HealthCheckRequest {
                service: String::new(),
            })
            .await
            .expect("watch")
            .into_inner();
        let first = watch.message().await.expect("status").expect("a status");
        assert_eq!(first.status(), ServingStatus::Serving);
        watches.push((health, watch));
    }
    // Every slot holds a watch; a new connection is still served.
    assert_eq!(server.health().await, ServingStatus::Serving);
    drop(watches);
    assert_eq!(server.stop(), Some(0));
}

/// The metrics listener holds at most 16 connections, each closed after
/// 10 s without progress: 40 silent ones take no more descriptors than
/// that (each was a descriptor the gRPC listener needs too), and a scrape
/// gets through once they are closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_metrics_connections_are_capped_and_closed() {
    let _serial = SERIAL.lock().await;
    let server = Serve::new(&decide_text("")).with_metrics().start();
    let descriptors = || {
        std::fs::read_dir(format!("/proc/{}/fd", server.pid()))
            .expect("/proc/PID/fd")
            .count()
    };
    let before = descriptors();
    let addr = server.metrics_addr.expect("metrics");
    let mut silent = Vec::new();
    for _ in 0..40 {
        silent.push(TcpStream::connect(addr).await.expect("connect"));
    }
    // Time for the listener to take what it may (the old one took all 40).
    tokio::time::sleep(Duration::from_secs(1)).await;
    let during = descriptors();
    assert!(during <= before + 20, "{before} -> {during} descriptors");
    let samples = tokio::time::timeout(GUARD, server.metrics())
        .await
        .expect("scraped once the silent ones are closed");
    assert!(samples.contains_key("toolgate_connections_open"));
    drop(silent);
    assert_eq!(server.stop(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_the_descriptor_limit_accept_backs_off_and_health_answers() {
    let _serial = SERIAL.lock().await;
    // 128 descriptors: the limit comes long before max_connections.
    let server = Serve::new(&decide_text("[server]\nhandshake_timeout_ms = 600000"))
        .with_metrics()
        .start_wrapped(descriptor_limit(128));
    let mut silent = Vec::with_capacity(500);
    for _ in 0..500 {
        silent.push(TcpStream::connect(server.addr).await.expect("connect"));
    }
    // Silent connections are closed to free descriptors, so the probe (at
    // the back of the kernel's queue) gets in.
    assert_eq!(server.health().await, ServingStatus::Serving);
    // Still at the limit, with connections waiting in the backlog: the
    // accept loop must not spin.
    let ticks_before = cpu_ticks(&server);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let ticks = cpu_ticks(&server) - ticks_before;
    eprintln!("at the descriptor limit: {ticks} CPU ticks in 2 s (100 a second is one core)");
    assert!(ticks < 60, "{ticks} ticks in 2 s: the accept loop spins");
    assert_eq!(server.health().await, ServingStatus::Serving);
    drop(silent);
    assert_eq!(server.stop(), Some(0));
}

/// `streams` calls on one connection, each sending the header of a
/// `declared`-byte message and `sent` bytes of it, then nothing.
async fn stalled_requests(
    addr: std::net::SocketAddr,
    path: &str,
    streams: usize,
    declared: u32,
    sent: usize,
) -> (
    h2::client::SendRequest<bytes::Bytes>,
    Vec<(h2::client::ResponseFuture, h2::SendStream<bytes::Bytes>)>,
) {
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let (client, connection) = h2::client::handshake(tcp).await.expect("handshake");
    tokio::spawn(connection);
    let mut client = client.ready().await.expect("ready");
    let mut body = vec![0u8];
    body.extend_from_slice(&declared.to_be_bytes());
    body.resize(5 + sent, b'x');
    let body = bytes::Bytes::from(body);
    let mut calls = Vec::new();
    for _ in 0..streams {
        let request = grpc_request(addr, path, "application/grpc", HOST);
        client = client.ready().await.expect("ready");
        let (response, mut stream) = client.send_request(request, false).expect("headers");
        stream.reserve_capacity(body.len());
        // Refused streams are reset by the server; that is fine.
        let _ = stream.send_data(body.clone(), false);
        calls.push((response, stream));
    }
    (client, calls)
}

/// A call without a valid credential is refused on its headers,
/// UNAUTHENTICATED: its stalled message is never waited for (the read
/// timeout here is ten minutes), so it holds no request-buffer bytes and
/// no permit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calls_without_a_credential_are_refused_before_their_message_is_read() {
    let _serial = SERIAL.lock().await;
    let server = Serve::new(&decide_text("[server]\nread_timeout_ms = 600000")).start();
    assert_eq!(server.health().await, ServingStatus::Serving);
    let tcp = TcpStream::connect(server.addr).await.expect("connect");
    let (client, connection) = h2::client::handshake(tcp).await.expect("handshake");
    tokio::spawn(connection);
    let mut client = client.ready().await.expect("ready");
    let mut body = vec![0u8];
    body.extend_from_slice(&1_000_000u32.to_be_bytes());
    body.resize(5 + 1_000, b'x');
    let request = grpc_request(
        server.addr,
        "/toolgate.v1.PolicyDecisionPoint/Decide",
        "application/grpc",
        "not-a-token",
    );
    let (response, mut stream) = client.send_request(request, false).expect("headers");
    stream
        .send_data(bytes::Bytes::from(body), false)
        .expect("part of the message");
    // Generous: reading the message first, the old order answered only
    // when the call's 10 s ran out, with DEADLINE_EXCEEDED.
    let response = tokio::time::timeout(Duration::from_secs(60), response)
        .await
        .expect("refused before the message is read")
        .expect("response");
    let status = response
        .headers()
        .get("grpc-status")
        .map(|value| value.to_str().unwrap());
    assert_eq!(status, Some("16"), "{response:?}");
    drop(stream);
    assert_eq!(server.stop(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stalled_request_bodies_are_bounded_in_memory_and_hold_no_permit() {
    let _serial = SERIAL.lock().await;
    let server = Serve::new(&decide_text("[server]\nread_timeout_ms = 600000"))
        .with_metrics()
        .start();
    assert_eq!(server.health().await, ServingStatus::Serving);
    let before = server_rss(&server);
    const CONNECTIONS: usize = 10;
    const STREAMS: usize = 100;
    const SENT: usize = 500_000;
    let mut connections = Vec::new();
    for _ in 0..CONNECTIONS {
        connections.push(
            stalled_requests(
                server.addr,
                "/toolgate.v1.PolicyDecisionPoint/Decide",
                STREAMS,
                1_000_000,
                SENT,
            )
            .await,
        );
    }
    // Every stalled call ends up holding its 500,005 bytes or refused: at
    // most 134 fit in the default 64 MiB, so at least 866 are refused once
    // the buffer settles, and what is left (at least 108 KB) takes a small
    // call. (While the stalled bytes still arrive, a small call may find
    // the buffer full for a moment and be told to retry: that is the
    // bound at work, not what this test is about.)
    let fit = ServerSettings::default().max_buffered_request_bytes / (SENT + 5);
    until("the request buffer fills and settles", || async {
        metric(
            &server,
            r#"toolgate_transport_refused_total{reason="request-buffer-full"}"#,
        )
        .await
            >= (CONNECTIONS * STREAMS - fit) as f64
    })
    .await;
    // Others are served: nothing stalled holds a permit.
    let channel = server.channel().await;
    let answer = PolicyDecisionPointClient::new(channel)
        .decide(authed(read_balance("c1"), HOST))
        .await
        .expect("served while 1,000 requests stall")
        .into_inner();
    assert_eq!(answer.reason, "allowed");
    let during = server_rss(&server);
    let refused = metric(
        &server,
        r#"toolgate_transport_refused_total{reason="request-buffer-full"}"#,
    )
    .await;
    let shed = metric(&server, "toolgate_load_shed_total").await;
    eprintln!(
        "1,000 stalled half-messages of 1,000,000 bytes: {refused} refused at the buffer bound, {shed} shed, RSS {:.1} -> {:.1} MiB",
        mib(before),
        mib(during)
    );
    assert_eq!(shed, 0.0);
    assert!(
        during.saturating_sub(before) < STALLED_REQUESTS_RSS_BUDGET,
        "RSS grew {:.1} MiB",
        mib(during.saturating_sub(before))
    );
    drop(connections);
    assert_eq!(server.stop(), Some(0));
}

/// Health and reflection take no token and are exempt from the permits
/// and the request buffer, so they have bounds of their own: a message over
/// 16 KiB is refused from its length prefix, the bytes of all probes in
/// flight share 1 MiB, and a probe's request ends within the read timeout.
/// (Before, 400 health checks each sending most of a 4 MB message grew the
/// server by 1.5 GiB, and held it.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probes_without_a_token_are_bounded_in_memory_and_time() {
    let _serial = SERIAL.lock().await;
    let server = Serve::new(&decide_text(
        "[server]\nread_timeout_ms = 2000\nhandshake_timeout_ms = 600000",
    ))
    .with_metrics()
    .start();
    assert_eq!(server.health().await, ServingStatus::Serving);
    let before = server_rss(&server);
    const CONNECTIONS: usize = 8;
    const STREAMS: usize = 50;
    // Health checks on 8 connections of 50 streams, each sending `sent`
    // bytes of a `declared`-byte message and stopping: their grpc-status
    // codes, counted.
    let answers = |declared: u32, sent: usize| async move {
        let mut connections = Vec::new();
        for _ in 0..CONNECTIONS {
            let path = "/grpc.health.v1.Health/Check";
            connections.push(stalled_requests(server.addr, path, STREAMS, declared, sent).await);
        }
        let mut codes = HashMap::new();
        for (_, calls) in &mut connections {
            for (response, _) in calls.drain(..) {
                let answer = tokio::time::timeout(GUARD, read_answer(response))
                    .await
                    .expect("answered in time");
                *codes.entry(answer.code).or_insert(0) += 1;
            }
        }
        codes
    };
    // Most of a 4 MB message each: refused as soon as the prefix arrives.
    let codes = answers(4_000_000, 3_990_000).await;
    assert_eq!(codes, HashMap::from([(Some(8), CONNECTIONS * STREAMS)]));
    // 15,000 bytes of a 16,000-byte message each, then nothing: what fits
    // in the probes' 1 MiB waits, the rest is refused, and the waiting ones
    // end at the read timeout.
    let codes = answers(16_000, 15_000).await;
    let during = server_rss(&server);
    eprintln!(
        "400 health checks of 4 MB, 400 stalled at 15 KB: {codes:?}, RSS {:.1} -> {:.1} MiB",
        mib(before),
        mib(during)
    );
    let timed_out = codes.get(&Some(4)).copied().unwrap_or(0);
    let refused = codes.get(&Some(8)).copied().unwrap_or(0);
    assert_eq!(timed_out + refused, CONNECTIONS * STREAMS, "{codes:?}");
    // Each counts 15,000 bytes less its free 512: at most 72 fit.
    assert!((1..=72).contains(&timed_out), "{codes:?}");
    assert!(
        during.saturating_sub(before) < PROBES_RSS_BUDGET,
        "RSS grew {:.1} MiB",
        mib(during.saturating_sub(before))
    );
    assert!(
        metric(
            &server,
            r#"toolgate_transport_refused_total{reason="read-timeout"}"#
        )
        .await
            >= timed_out as f64
    );
    // Once they have ended, probes answer again.
    assert_eq!(server.health().await, ServingStatus::Serving);
    assert_eq!(server.stop(), Some(0));
}

/// Probes stalled to fill the probes' request bytes never shut out a
/// health check: its first 512 bytes are its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_health_check_is_answered_while_stalled_probes_fill_their_bytes() {
    let _serial = SERIAL.lock().await;
    let server = Serve::new(&decide_text(
        "[server]\nread_timeout_ms = 600000\nhandshake_timeout_ms = 600000",
    ))
    .with_metrics()
    .start();
    let path = "/grpc.health.v1.Health/Check";
    // 100 stalled checks of 15,000 bytes, then 100 of 300: over the 1 MiB
    // either way, so some are refused once it is full.
    let mut stalled = Vec::new();
    for sent in [15_000, 15_000, 300] {
        let streams = if sent == 300 { 100 } else { 50 };
        stalled.push(stalled_requests(server.addr, path, streams, 16_000, sent).await);
    }
    until("the probes' bytes are full", || async {
        metric(
            &server,
            r#"toolgate_transport_refused_total{reason="request-buffer-full"}"#,
        )
        .await
            >= 1.0
    })
    .await;
    // Time for the last stalls to arrive (only the old code's failure
    // depends on it: with every 300-byte stall in, what it left was small).
    tokio::time::sleep(Duration::from_secs(1)).await;
    // A check of 305 bytes is read (the service is unknown), not refused
    // for the buffer (RESOURCE_EXHAUSTED, before: what the 300-byte stalls
    // left was under 305).
    let mut health = tonic_health::pb::health_client::HealthClient::new(server.channel().await);
    let answer = health
        .check(tonic_health::pb::HealthCheckRequest {
            service: "x".repeat(300),
        })
        .await
        .expect_err("an unknown service");
    assert_eq!(answer.code(), Code::NotFound, "{answer:?}");
    drop(stalled);
    assert_eq!(server.stop(), Some(0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_nobody_reads_are_bounded_in_memory_and_dropped_after_the_write_timeout() {
    let _serial = SERIAL.lock().await;
    let big = "x".repeat(800_000);
    // The handshake timeout counts until a connection's first call reaches
    // the service, and the read timeout until its request is read; the
    // 1,000 calls queue behind each other's 800 KB answers (seconds in a
    // debug build on a busy machine), and a connection closed for the one,
    // or a call cut by the other (DEADLINE_EXCEEDED), is not what this
    // test is about.
    let server = Serve::new(&decide_text(&format!(
        "[server]\nwrite_timeout_ms = 30000\nhandshake_timeout_ms = 600000\n\
         read_timeout_ms = 600000\n\
         [state.resources]\nbig = \"{big}\"\n"
    )))
    .with_metrics()
    .start();
    assert_eq!(server.health().await, ServingStatus::Serving);
    let before = server_rss(&server);
    let request = framed(
        0,
        &prost::Message::encode_to_vec(&pb::GetResourceRequest {
            name: "big".into(),
            ..Default::default()
        }),
    );
    let mut connections = Vec::new();
    let mut responses = Vec::new();
    for _ in 0..10 {
        let tcp = TcpStream::connect(server.addr).await.expect("connect");
        let (client, connection) = h2::client::Builder::new()
            .initial_window_size(0)
            .handshake(tcp)
            .await
            .expect("handshake");
        tokio::spawn(connection);
        let mut client = client.ready().await.expect("ready");
        for _ in 0..100 {
            let http_request = grpc_request(
                server.addr,
                "/toolgate.v1.Resources/GetResource",
                "application/grpc",
                HOST,
            );
            client = client.ready().await.expect("ready");
            let (response, mut stream) = client.send_request(http_request, false).expect("send");
            stream.send_data(request.clone(), true).expect("body");
            responses.push(response);
        }
        connections.push(client);
    }
    // Every call is answered with headers: held (waiting for a window) or
    // refused at the response buffer bound.
    let mut held = Vec::new();
    let mut refused = 0;
    for response in responses {
        let response = tokio::time::timeout(GUARD, response)
            .await
            .expect("headers in time")
            .expect("headers");
        match response.headers().get("grpc-status") {
            Some(code) => {
                assert_eq!(code.as_bytes(), b"8");
                refused += 1;
            }
            None => held.push(response),
        }
    }
    let during = server_rss(&server);
    until("the answers waiting are dropped", || async {
        metric(
            &server,
            r#"toolgate_transport_refused_total{reason="write-timeout"}"#,
        )
        .await
            >= held.len() as f64
    })
    .await;
    let after = server_rss(&server);
    eprintln!(
        "1,000 GetResource of 800 KB, windows never opened: {} held, {refused} refused, RSS {:.1} -> {:.1} MiB, {:.1} MiB after the write timeout",
        held.len(),
        mib(before),
        mib(during),
        mib(after)
    );
    assert_eq!(held.len() + refused, 1_000);
    assert!(held.len() <= 84, "{} answers held", held.len());
    assert!(
        during.saturating_sub(before) < STALLED_RESPONSES_RSS_BUDGET,
        "RSS grew {:.1} MiB",
        mib(during.saturating_sub(before))
    );
    // Others are still served, a big answer included.
    let resource = pb::resources_client::ResourcesClient::new(server.channel().await)
        .get_resource(authed(
            pb::GetResourceRequest {
                name: "big".into(),
                ..Default::default()
            },
            HOST,
        ))
        .await
        .expect("served")
        .into_inner();
    assert_eq!(resource.value_json.len(), 800_002);
    drop(connections);
    assert_eq!(server.stop(), Some(0));
}
