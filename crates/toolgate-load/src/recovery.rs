//! Recovery figures: a durable toolgate filled over gRPC with approvals and
//! receipts, stopped (SIGTERM) and started again on the same data
//! directory. Reported: the bytes on disk per approval and per receipt, the
//! "state recovered" time from the restart's log, and the wall time from
//! process start to `toolgate listening on`.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use toolgate::pb;

use crate::grpc::Connection;
use crate::load::{Call, Expect, Generator, RoundStats, Target, Window, closed_loop};
use crate::policies::{ACTOR, Workdir, recovery_policy};
use crate::report;
use crate::scenarios::{CommitPool, direct_request, host_header, session};
use crate::servers::{Kind, Launcher, Recovered, ServerProcess, Start, Store, StoreCounters};
use crate::{BoxResult, RunArgs};

/// Long enough for any fill to finish.
const UNTIL_DONE: Duration = Duration::from_secs(3600);
/// How long a restarted server runs before it is stopped again.
const SETTLE: Duration = Duration::from_millis(300);

/// One kind of record the fill makes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fill {
    /// Decide of a read tool with a new call id: a decided-call record.
    Decisions,
    /// Decide of an always-approved tool with a new call id: a pending
    /// approval and its decided-call record.
    Approvals,
    /// Dispatch of an approval-free `set` tool with a new call id: a receipt,
    /// its decided-call record and the resource's new version.
    Receipts,
}

impl Fill {
    fn name(self) -> &'static str {
        match self {
            Fill::Decisions => "decisions",
            Fill::Approvals => "pending approvals",
            Fill::Receipts => "receipts",
        }
    }
}

fn decide(session_id: String, call_id: String, tool: &str, n: u64) -> pb::DecideRequest {
    pb::DecideRequest {
        session: Some(session(session_id)),
        proposal: Some(pb::Proposal {
            call_id,
            actor: ACTOR.into(),
            name: tool.into(),
            version: 0,
            arguments_json: format!(r#"{{"n":{n}}}"#),
        }),
    }
}

/// The requests of a fill: `count` of them, new call ids, 1,000 per session
/// (10,000 for receipts).
fn generator(fill: Fill, count: u64, pool: &CommitPool) -> Generator {
    let versions = pool.versions();
    Arc::new(move |index| {
        if index >= count {
            return None;
        }
        Some(match fill {
            Fill::Decisions => Call::Decide(
                decide(
                    format!("n{}", index / 1000),
                    format!("n{index}"),
                    "note",
                    index,
                ),
                Expect::Decide {
                    outcome: pb::Outcome::Allow,
                    reason: "allowed",
                },
            ),
            Fill::Approvals => Call::Decide(
                decide(
                    format!("a{}", index / 1000),
                    format!("a{index}"),
                    "approve_me",
                    index,
                ),
                Expect::Decide {
                    outcome: pb::Outcome::RequireApproval,
                    reason: "approval-required",
                },
            ),
            Fill::Receipts => {
                let slot = usize::try_from(index).unwrap_or(0) % versions.len().max(1);
                let version = versions
                    .get(slot)
                    .map_or(0, |version| version.load(Ordering::Relaxed));
                Call::Dispatch(
                    direct_request("r", index, slot, version),
                    Expect::Committed {
                        versions: Arc::clone(&versions),
                        slot,
                    },
                )
            }
        })
    })
}

/// A durable toolgate on `dir` (a fresh one when `None`), its log watched.
async fn start(
    launcher: &Launcher,
    label: &str,
    policy: &Path,
    dir: Option<PathBuf>,
    connections: usize,
) -> BoxResult<(ServerProcess, Vec<Connection>, Recovered)> {
    let server = launcher.start_with(Start {
        policy: Some(policy),
        data_dir: dir,
        watch_log: true,
        ..Start::new(Kind::Toolgate(Store::Durable), label)
    })?;
    let recovered = server.recovered()?;
    let connections = server.open_connections(connections).await?;
    Ok((server, connections, recovered))
}

/// What one fill did.
struct Filled {
    stats: RoundStats,
    /// Bytes of the data directory while the server still runs (WAL
    /// included) and what the store reports (`toolgate_store_bytes`).
    live_bytes: u64,
    store_bytes: f64,
}

async fn fill(
    args: &RunArgs,
    server: &ServerProcess,
    connections: &[Connection],
    fill: Fill,
    pool: &CommitPool,
) -> BoxResult<Filled> {
    let count = args.recovery_count as u64;
    let target = Target {
        server,
        connections,
        token: host_header(),
        check: true,
    };
    eprintln!("   filling {count} {}", fill.name());
    let before = server.store_counters();
    let mut stats = closed_loop(
        &target,
        generator(fill, count, pool),
        args.concurrency,
        Window {
            warmup: Duration::ZERO,
            duration: UNTIL_DONE,
        },
    )
    .await;
    let after = server.store_counters();
    stats.store = after.since(&before);
    if stats.error_count() > 0 || stats.wrong > 0 || stats.completed != count {
        return Err(format!(
            "filling {}: {} answered of {count}, {} errors ({}), {} wrong ({})",
            fill.name(),
            stats.completed,
            stats.error_count(),
            stats.first_error.clone().unwrap_or_default(),
            stats.wrong,
            stats.first_wrong.clone().unwrap_or_default()
        )
        .into());
    }
    Ok(Filled {
        live_bytes: server.data_dir_bytes(),
        store_bytes: after.store_bytes,
        stats,
    })
}

/// Stops a server (SIGTERM) and returns its data directory, its size after
/// the clean stop and how long the stop took.
fn stop(
    server: ServerProcess,
    connections: Vec<Connection>,
) -> BoxResult<(PathBuf, u64, Duration)> {
    drop(connections);
    let dir = server
        .data_dir
        .clone()
        .ok_or("a durable server without a data directory")?;
    let took = server.terminate()?;
    Ok((dir.clone(), crate::servers::dir_bytes(&dir), took))
}

/// One restart of a stopped store.
#[derive(Debug, Clone, Copy)]
struct Restart {
    recovered: Recovered,
    /// Process start to `toolgate listening on`.
    wall: Duration,
    /// SIGTERM to exit, after it.
    stop: Duration,
}

/// `times` restarts of the store in `dir`, each stopped again; the last
/// one is left running (with its connections) when `keep_last`.
async fn restarts(
    args: &RunArgs,
    launcher: &Launcher,
    policy: &Path,
    dir: &Path,
    label: &str,
    times: usize,
    keep_last: bool,
) -> BoxResult<(Vec<Restart>, Option<(ServerProcess, Vec<Connection>)>)> {
    let mut done = Vec::new();
    for time in 0..times.max(1) {
        let (server, connections, recovered) = start(
            launcher,
            label,
            policy,
            Some(dir.to_path_buf()),
            args.connections,
        )
        .await?;
        let wall = server.startup;
        eprintln!(
            "   restart {time} of {label}: state recovered in {} ms ({} approvals, {} receipts, {} sessions), listening after {}",
            recovered.millis,
            recovered.approvals,
            recovered.receipts,
            recovered.sessions,
            report::latency(wall)
        );
        if keep_last && time + 1 == times.max(1) {
            done.push(Restart {
                recovered,
                wall,
                stop: Duration::ZERO,
            });
            return Ok((done, Some((server, connections))));
        }
        // toolgate installs its SIGTERM handler once it serves, just after
        // it prints `toolgate listening on`; a SIGTERM sent at once can
        // beat it (and kill the process uncleanly).
        tokio::time::sleep(SETTLE).await;
        let (_, _, stop) = stop(server, connections)?;
        done.push(Restart {
            recovered,
            wall,
            stop,
        });
    }
    Ok((done, None))
}

fn median<T: Copy + PartialOrd>(values: &[T]) -> Option<T> {
    let mut sorted = values.to_vec();
    sorted.sort_by(|a, b| a.partial_cmp(b).unwrap_or(std::cmp::Ordering::Equal));
    sorted.get(sorted.len() / 2).copied()
}

/// "median (min–max)" of durations.
fn spread(values: &[Duration]) -> String {
    let (Some(median), Some(min), Some(max)) = (
        median(values),
        values.iter().min().copied(),
        values.iter().max().copied(),
    ) else {
        return "–".into();
    };
    if values.len() == 1 {
        return report::latency(median);
    }
    format!(
        "{} ({}–{})",
        report::latency(median),
        report::latency(min),
        report::latency(max)
    )
}

fn restart_row(text: &mut String, store: &str, restarts: &[Restart]) {
    let millis: Vec<Duration> = restarts
        .iter()
        .map(|restart| Duration::from_millis(restart.recovered.millis))
        .collect();
    let walls: Vec<Duration> = restarts.iter().map(|restart| restart.wall).collect();
    let stops: Vec<Duration> = restarts
        .iter()
        .filter(|restart| !restart.stop.is_zero())
        .map(|restart| restart.stop)
        .collect();
    let last = restarts
        .last()
        .map(|restart| restart.recovered)
        .unwrap_or_default();
    let _ = writeln!(
        text,
        "| {store} | {} | {} | {} | {} / {} / {} | {} |",
        restarts.len(),
        spread(&millis),
        spread(&walls),
        last.approvals,
        last.receipts,
        last.sessions,
        spread(&stops),
    );
}

fn fill_note(text: &mut String, what: &str, filled: &Filled, callers: usize) {
    let store: &StoreCounters = &filled.stats.store;
    let _ = writeln!(
        text,
        "- filling {what}: {} req/s ({callers} closed-loop callers), p99 {}, {} operations per batch, sync mean {}; while running: data directory {} (WAL included), `toolgate_store_bytes` {}",
        report::rate(filled.stats.throughput()),
        report::latency(filled.stats.percentile(0.99)),
        store
            .operations_per_batch()
            .map_or_else(|| "–".to_string(), |ops| format!("{ops:.1}")),
        store
            .mean_sync()
            .map_or_else(|| "–".to_string(), report::latency),
        report::mib(filled.live_bytes),
        report::mib(filled.store_bytes as u64),
    );
}

pub async fn recovery(args: &RunArgs, launcher: &Launcher, workdir: &Workdir) -> BoxResult<()> {
    eprintln!("== recovery");
    let count = args.recovery_count.max(1);
    let resources = count.clamp(1, 10_000);
    let policy = workdir.write("recovery.toml", &recovery_policy(count, resources))?;
    let times = args.restarts.max(1);

    // An empty store: its size, and the restart time of a store with
    // nothing to recover (process start, policy, opening SQLite).
    let (server, connections, _) =
        start(launcher, "empty", &policy, None, args.connections).await?;
    tokio::time::sleep(SETTLE).await;
    let (empty_dir, empty_bytes, _) = stop(server, connections)?;
    let (empty_restarts, _) =
        restarts(args, launcher, &policy, &empty_dir, "empty", times, false).await?;

    // Decisions only: the decided-call record every approval and receipt
    // of the fills below also makes, to subtract.
    let (server, connections, _) =
        start(launcher, "decisions", &policy, None, args.connections).await?;
    let decisions = fill(
        args,
        &server,
        &connections,
        Fill::Decisions,
        &CommitPool::new(0),
    )
    .await?;
    let (_, decision_bytes, _) = stop(server, connections)?;

    // Approvals, then receipts, in one store.
    let (server, connections, _) =
        start(launcher, "approvals", &policy, None, args.connections).await?;
    let approvals = fill(
        args,
        &server,
        &connections,
        Fill::Approvals,
        &CommitPool::new(0),
    )
    .await?;
    let (dir, approval_bytes, _) = stop(server, connections)?;
    let (approval_restarts, running) =
        restarts(args, launcher, &policy, &dir, "approvals", times, true).await?;
    let Some((server, connections)) = running else {
        return Err("the approvals store is not running".into());
    };
    let receipts = fill(
        args,
        &server,
        &connections,
        Fill::Receipts,
        &CommitPool::new(resources),
    )
    .await?;
    let (dir, both_bytes, _) = stop(server, connections)?;
    let (both_restarts, _) = restarts(
        args,
        launcher,
        &policy,
        &dir,
        "approvals + receipts",
        times,
        false,
    )
    .await?;

    let per = |bytes: u64, base: u64| bytes.saturating_sub(base) as f64 / count as f64;
    let per_decision = per(decision_bytes, empty_bytes);
    let per_approval = per(approval_bytes, empty_bytes);
    let per_receipt = per(both_bytes, approval_bytes);
    let mut text = format!(
        "## Recovery and bytes on disk (durable store)\n\nA fresh `toolgate serve --data-dir DIR` per store, filled over gRPC ({} closed-loop callers, new call ids, 1,000 per session; receipts over {resources} resources at their current versions, 10,000 per session), stopped with SIGTERM, and started again on the same directory {times} time(s). Bytes: the apparent sizes of the files in the data directory after the clean stop (the WAL is checkpointed into the database file at close). Recovery: the `millis` of the restart's \"state recovered\" log line (opening the store, loading every record, rebuilding the state); wall: process start to `toolgate listening on`.\n\n| store | bytes on disk | growth | per record |\n| --- | ---: | ---: | ---: |\n",
        args.concurrency
    );
    let _ = writeln!(text, "| empty | {} | | |", report::mib(empty_bytes));
    let _ = writeln!(
        text,
        "| {count} decisions (read tool) | {} | {} | {per_decision:.0} B per decided call |",
        report::mib(decision_bytes),
        report::mib(decision_bytes.saturating_sub(empty_bytes)),
    );
    let _ = writeln!(
        text,
        "| {count} pending approvals | {} | {} | **{per_approval:.0} B per approval** (with its decided call; {:.0} B without) |",
        report::mib(approval_bytes),
        report::mib(approval_bytes.saturating_sub(empty_bytes)),
        per_approval - per_decision,
    );
    let _ = writeln!(
        text,
        "| the same + {count} receipts (approval-free commits) | {} | {} | **{per_receipt:.0} B per receipt** (with its decided call and version; {:.0} B without the decided call) |",
        report::mib(both_bytes),
        report::mib(both_bytes.saturating_sub(approval_bytes)),
        per_receipt - per_decision,
    );
    text.push('\n');
    fill_note(
        &mut text,
        &format!("{count} decisions"),
        &decisions,
        args.concurrency,
    );
    fill_note(
        &mut text,
        &format!("{count} pending approvals"),
        &approvals,
        args.concurrency,
    );
    fill_note(
        &mut text,
        &format!("{count} receipts"),
        &receipts,
        args.concurrency,
    );
    text.push_str(
        "\n| store recovered | restarts | \"state recovered\" millis, median (min–max) | wall to listening, median (min–max) | approvals / receipts / sessions recovered | SIGTERM → exit |\n| --- | ---: | ---: | ---: | ---: | ---: |\n",
    );
    restart_row(&mut text, "empty", &empty_restarts);
    restart_row(
        &mut text,
        &format!("{count} pending approvals"),
        &approval_restarts,
    );
    restart_row(
        &mut text,
        &format!("{count} pending approvals + {count} receipts"),
        &both_restarts,
    );
    let last = both_restarts
        .last()
        .map(|restart| restart.recovered)
        .unwrap_or_default();
    if last.approvals != count as u64 || last.receipts != count as u64 {
        let _ = writeln!(
            text,
            "\n- **the restart recovered {} approvals and {} receipts, not {count} of each**",
            last.approvals, last.receipts
        );
    }
    println!("{text}");
    Ok(())
}
