//! Scaling figures: durable and memory commits against the number of
//! concurrent callers, memory per session and per pending approval, Decide
//! latency against the size of the policy, throughput against the number
//! of server worker threads. toolgate runs on the first store of
//! `--stores` (the durable one by default) but in the callers figure, which
//! runs on each.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use toolgate::pb;

use crate::load::{Call, Expect, Generator, RoundStats, Window, closed_loop, wait_for_quiet};
use crate::policies::{
    Workdir, manifest_json, memory_policy, scaling_tool, throughput_policy, tools_policy,
};
use crate::report;
use crate::run::Connected;
use crate::scenarios::{self, CommitPool, Scenario, session, setup_fixtures};
use crate::servers::{Kind, Store};
use crate::{BoxResult, RunArgs};

/// Long enough for any finite request count to finish.
const UNTIL_DONE: Duration = Duration::from_secs(3600);

fn decide(session_id: String, call_id: String, tool: &str, n: usize) -> pb::DecideRequest {
    pb::DecideRequest {
        session: Some(session(session_id)),
        proposal: Some(pb::Proposal {
            call_id,
            actor: crate::policies::ACTOR.into(),
            name: tool.into(),
            version: 0,
            arguments_json: format!(r#"{{"n":{n}}}"#),
        }),
    }
}

/// One memory measurement: what `count` requests add to a fresh server.
struct MemoryCase {
    name: &'static str,
    what: &'static str,
    generator: fn(usize) -> Call,
}

const ALLOWED: Expect = Expect::Decide {
    outcome: pb::Outcome::Allow,
    reason: "allowed",
};

const MEMORY_CASES: [MemoryCase; 3] = [
    MemoryCase {
        name: "sessions",
        what: "one new session per request (its first decision: one call id remembered)",
        generator: |index| {
            Call::Decide(decide(format!("m{index}"), "c".into(), "note", 1), ALLOWED)
        },
    },
    MemoryCase {
        name: "decisions",
        what: "one new call id per request, 1,000 per session (the per-decision record, to subtract)",
        generator: |index| {
            Call::Decide(
                decide(
                    format!("d{}", index / 1000),
                    format!("c{index}"),
                    "note",
                    index,
                ),
                ALLOWED,
            )
        },
    },
    MemoryCase {
        name: "pending approvals",
        what: "one new call id per request, 1,000 per session, each opening a pending approval (arguments `{\"n\":N}`)",
        generator: |index| {
            Call::Decide(
                decide(
                    format!("d{}", index / 1000),
                    format!("c{index}"),
                    "approve_me",
                    index,
                ),
                Expect::Decide {
                    outcome: pb::Outcome::RequireApproval,
                    reason: "approval-required",
                },
            )
        },
    },
];

pub async fn memory(
    args: &RunArgs,
    launcher: &crate::servers::Launcher,
    workdir: &Workdir,
) -> BoxResult<()> {
    eprintln!("== memory");
    let policy = workdir.write("memory.toml", &memory_policy())?;
    let count = args.memory_count.max(1);
    let mut text = format!(
        "## Memory\n\nRSS (`VmRSS`) of a fresh `toolgate serve` before and after {count} Decide calls over gRPC (after 1,000 warm-up calls in another session), divided by {count}. RSS counts pages the allocator touched, so these are upper bounds of what the state holds, allocator slack included.\n\n| case | what each request adds | RSS before | RSS after | per item | req/s while filling |\n| --- | --- | ---: | ---: | ---: | ---: |\n"
    );
    let mut per_item = Vec::new();
    for case in &MEMORY_CASES {
        let server = Connected::start(
            launcher,
            Kind::Toolgate(args.scaling_store()),
            case.name,
            Some(&policy),
            None,
            args.connections,
        )
        .await?;
        let target = server.target();
        let warm: Generator = Arc::new(|index| {
            (index < 1000).then(|| {
                Call::Decide(
                    decide("warm".into(), format!("w{index}"), "note", 1),
                    ALLOWED,
                )
            })
        });
        let warmed = closed_loop(
            &target,
            warm,
            args.concurrency,
            Window {
                warmup: Duration::ZERO,
                duration: UNTIL_DONE,
            },
        )
        .await;
        check_clean("memory warm-up", &warmed)?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let before = server.server.rss_bytes();
        let generate = case.generator;
        let generator: Generator = Arc::new(move |index| {
            let index = usize::try_from(index).ok()?;
            (index < count).then(|| generate(index))
        });
        let filled = closed_loop(
            &target,
            generator,
            args.concurrency,
            Window {
                warmup: Duration::ZERO,
                duration: UNTIL_DONE,
            },
        )
        .await;
        check_clean(case.name, &filled)?;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let after = server.server.rss_bytes();
        let bytes_per_item = after.saturating_sub(before) as f64 / count as f64;
        per_item.push(bytes_per_item);
        let _ = writeln!(
            text,
            "| {} | {} | {} | {} | {:.0} B | {} |",
            case.name,
            case.what,
            report::mib(before),
            report::mib(after),
            bytes_per_item,
            report::rate(filled.throughput()),
        );
        eprintln!("   {}: {:.0} B each", case.name, bytes_per_item);
    }
    if let [sessions, decisions, approvals] = per_item[..] {
        let _ = writeln!(
            text,
            "\n- per idle session (a session with one decided call id): **{sessions:.0} B** (target ≤ 1 KiB: {})",
            if sessions <= 1024.0 { "met" } else { "MISSED" }
        );
        let approval_only = approvals - decisions;
        let _ = writeln!(
            text,
            "- per pending approval, the decision record subtracted (pending approvals − decisions): **{approval_only:.0} B** (target ≤ 2 KiB excluding arguments; the arguments here are ~8 bytes: {})",
            if approval_only <= 2048.0 {
                "met"
            } else {
                "MISSED"
            }
        );
        let _ = writeln!(
            text,
            "- per decision record (a call id remembered in a session): {decisions:.0} B"
        );
    }
    println!("{text}");
    Ok(())
}

fn check_clean(what: &str, stats: &RoundStats) -> BoxResult<()> {
    if stats.error_count() > 0 || stats.wrong > 0 {
        return Err(format!(
            "{what}: {} errors ({}), {} wrong answers ({})",
            stats.error_count(),
            stats.first_error.clone().unwrap_or_default(),
            stats.wrong,
            stats.first_wrong.clone().unwrap_or_default()
        )
        .into());
    }
    Ok(())
}

fn parse_list(text: &str) -> BoxResult<Vec<usize>> {
    text.split(',')
        .map(str::trim)
        .filter(|item| !item.is_empty())
        .map(|item| {
            item.parse::<usize>()
                .map_err(|error| format!("{item:?}: {error}").into())
        })
        .collect()
}

pub async fn tools(
    args: &RunArgs,
    launcher: &crate::servers::Launcher,
    workdir: &Workdir,
) -> BoxResult<()> {
    eprintln!("== tools");
    let counts = parse_list(&args.tool_counts)?;
    let mut servers = Vec::new();
    for &count in &counts {
        let policy = workdir.write(&format!("tools-{count}.toml"), &tools_policy(count.max(1)))?;
        let server = Connected::start(
            launcher,
            Kind::Toolgate(args.scaling_store()),
            &format!("{count} tools"),
            Some(&policy),
            None,
            args.connections,
        )
        .await?;
        servers.push((count.max(1), server));
    }
    let window = Window {
        warmup: args.warmup(),
        duration: args.duration(),
    };
    let mut merged: Vec<Option<RoundStats>> = vec![None; servers.len()];
    for round in 0..args.alternations.max(1) {
        for (index, (count, server)) in servers.iter().enumerate() {
            let count = *count;
            // Request i asks about tool (i × 7919) mod N: the whole table is
            // touched, not one hot entry. One call id per tool: re-evaluated,
            // no budget growth.
            let generator: Generator = Arc::new(move |request| {
                let tool = usize::try_from(request.wrapping_mul(7919)).unwrap_or(0) % count;
                let name = scaling_tool(tool);
                Some(Call::Decide(
                    pb::DecideRequest {
                        session: Some(session("tools".into())),
                        proposal: Some(pb::Proposal {
                            call_id: format!("c-{tool}"),
                            actor: crate::policies::ACTOR.into(),
                            name,
                            version: 0,
                            arguments_json: r#"{"query":"how do I reset the sensor on a lamp that keeps blinking after a firmware update?","limit":10}"#.into(),
                        }),
                    },
                    ALLOWED,
                ))
            });
            wait_for_quiet(args.max_foreign_load, args.quiet_wait()).await;
            let stats = closed_loop(&server.target(), generator, args.concurrency, window).await;
            eprintln!(
                "   round {round} {count:>6} tools {:>9} req/s  p50 {:>9}  p99 {:>9}",
                report::rate(stats.throughput()),
                report::latency(stats.percentile(0.5)),
                report::latency(stats.percentile(0.99)),
            );
            match &mut merged[index] {
                Some(total) => total.merge(&stats),
                None => merged[index] = Some(stats),
            }
        }
    }
    let mut text = format!(
        "## Decide against the size of the policy\n\nA fresh `toolgate serve` per policy of N read tools (each with its own small input schema); closed loop, {} callers, Decide ALLOW on tool (i × 7919) mod N, alternating over the servers. Startup is process start to listening (policy parsing and schema compilation included).\n\n| tools | startup | RSS idle → after | req/s | p50 | p90 | p99 | p99.9 | server CPU/req | errors + wrong |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
        args.concurrency
    );
    let mut first_p50 = None;
    let mut last_p50 = None;
    for ((count, server), stats) in servers.iter().zip(&merged) {
        let Some(stats) = stats else { continue };
        let _ = writeln!(
            text,
            "| {count} | {} | {} → {} | {} | {} | {} | {} | {} | {} | {} |",
            report::latency(server.server.startup),
            report::mib(server.rss_at_start),
            report::mib(server.server.rss_bytes()),
            report::rate(stats.throughput()),
            report::latency(stats.percentile(0.5)),
            report::latency(stats.percentile(0.9)),
            report::latency(stats.percentile(0.99)),
            report::latency(stats.percentile(0.999)),
            report::latency(stats.server_cpu_per_request()),
            stats.error_count() + stats.wrong,
        );
        first_p50.get_or_insert(stats.server_cpu_per_request());
        last_p50 = Some(stats.server_cpu_per_request());
    }
    if let (Some(first), Some(last)) = (first_p50, last_p50) {
        let _ = writeln!(
            text,
            "\n- server CPU per Decide, largest policy / smallest: {}",
            report::ratio(last.as_secs_f64(), first.as_secs_f64())
        );
    }
    println!("{text}");
    Ok(())
}

pub async fn workers(
    args: &RunArgs,
    launcher: &crate::servers::Launcher,
    workdir: &Workdir,
) -> BoxResult<()> {
    eprintln!("== workers");
    let counts = parse_list(&args.worker_counts)?;
    let policy = workdir.write("workers.toml", &throughput_policy(16))?;
    workdir.write("bench-docs.json", &manifest_json())?;
    let mut pairs = Vec::new();
    for &count in &counts {
        let toolgate = Connected::start(
            launcher,
            Kind::Toolgate(args.scaling_store()),
            &format!("toolgate w{count}"),
            Some(&policy),
            Some(count.max(1)),
            args.connections,
        )
        .await?;
        setup_fixtures(&toolgate.channels[0]).await?;
        let baseline = Connected::start(
            launcher,
            Kind::Baseline,
            &format!("baseline w{count}"),
            None,
            Some(count.max(1)),
            args.connections,
        )
        .await?;
        pairs.push((count, toolgate, baseline));
    }
    let window = Window {
        warmup: args.warmup(),
        duration: args.duration(),
    };
    let mut merged: Vec<[Option<RoundStats>; 2]> = vec![[None, None]; pairs.len()];
    for round in 0..args.alternations.max(1) {
        for (index, (count, toolgate, baseline)) in pairs.iter().enumerate() {
            for (side, server) in [(0, toolgate), (1, baseline)] {
                let generator =
                    scenarios::generator(Scenario::DecideAllow, "w", &CommitPool::new(0), None);
                wait_for_quiet(args.max_foreign_load, args.quiet_wait()).await;
                let stats =
                    closed_loop(&server.target(), generator, args.concurrency, window).await;
                eprintln!(
                    "   round {round} {:<8} {count} workers {:>9} req/s  p99 {:>9}",
                    server.server.kind.name(),
                    report::rate(stats.throughput()),
                    report::latency(stats.percentile(0.99)),
                );
                match &mut merged[index][side] {
                    Some(total) => total.merge(&stats),
                    None => merged[index][side] = Some(stats),
                }
            }
        }
    }
    let mut text = format!(
        "## Server worker threads\n\nDecide ALLOW (the decide-allow scenario), closed loop, {} callers; each server started with `TOKIO_WORKER_THREADS=N`; the load generator keeps its {} threads.\n\n| workers | toolgate req/s | baseline req/s | toolgate/baseline | toolgate p99 | baseline p99 | toolgate server CPU/req | baseline server CPU/req |\n| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
        args.concurrency, args.client_threads
    );
    let mut toolgate_rates = Vec::new();
    for ((count, _, _), [toolgate, baseline]) in pairs.iter().zip(&merged) {
        let (Some(toolgate), Some(baseline)) = (toolgate, baseline) else {
            continue;
        };
        toolgate_rates.push((*count, toolgate.throughput()));
        let _ = writeln!(
            text,
            "| {count} | {} | {} | {} | {} | {} | {} | {} |",
            report::rate(toolgate.throughput()),
            report::rate(baseline.throughput()),
            report::ratio(toolgate.throughput(), baseline.throughput()),
            report::latency(toolgate.percentile(0.99)),
            report::latency(baseline.percentile(0.99)),
            report::latency(toolgate.server_cpu_per_request()),
            report::latency(baseline.server_cpu_per_request()),
        );
    }
    if let [(first_count, first), .., (last_count, last)] = toolgate_rates[..] {
        let _ = writeln!(
            text,
            "\n- toolgate throughput, {last_count} workers / {first_count}: {}",
            report::ratio(last, first)
        );
    }
    println!("{text}");
    Ok(())
}

/// Approval-free commits (the dispatch-commit-direct scenario), closed loop,
/// against the number of concurrent callers, on a fresh toolgate per store:
/// group commit batches what arrives during one sync, so its throughput
/// needs callers in flight.
pub async fn callers(
    args: &RunArgs,
    launcher: &crate::servers::Launcher,
    workdir: &Workdir,
    stores: &[Store],
) -> BoxResult<()> {
    eprintln!("== callers");
    let counts = parse_list(&args.caller_counts)?;
    let policy = workdir.write("callers.toml", &throughput_policy(args.commit_pool))?;
    workdir.write("bench-docs.json", &manifest_json())?;
    let mut servers = Vec::new();
    for store in stores {
        let kind = Kind::Toolgate(*store);
        let server = Connected::start(
            launcher,
            kind,
            &format!("callers {}", kind.name()),
            Some(&policy),
            None,
            args.connections,
        )
        .await?;
        setup_fixtures(&server.channels[0]).await?;
        servers.push((server, CommitPool::new(args.commit_pool)));
    }
    let window = Window {
        warmup: args.warmup(),
        duration: args.duration(),
    };
    let mut merged: Vec<Vec<Option<RoundStats>>> = vec![vec![None; servers.len()]; counts.len()];
    for round in 0..args.alternations.max(1) {
        for (count_index, &callers) in counts.iter().enumerate() {
            for offset in 0..servers.len() {
                let index = (round + offset) % servers.len();
                let (server, pool) = &servers[index];
                let tag = format!("k{round}{callers}{}", &server.kind().name()[..1]);
                let generator = scenarios::generator(Scenario::DispatchDirect, &tag, pool, None);
                wait_for_quiet(args.max_foreign_load, args.quiet_wait()).await;
                let before = server.server.store_counters();
                let mut stats =
                    closed_loop(&server.target(), generator, callers.max(1), window).await;
                stats.store = server.server.store_counters().since(&before);
                eprintln!(
                    "   round {round} {:<8} {callers:>5} callers {:>9} commits/s  p99 {:>9}  ops/batch {}",
                    server.kind().name(),
                    report::rate(stats.throughput()),
                    report::latency(stats.percentile(0.99)),
                    report::store_cells(&stats).0,
                );
                match &mut merged[count_index][index] {
                    Some(total) => total.merge(&stats),
                    None => merged[count_index][index] = Some(stats),
                }
            }
        }
    }
    let mut text = String::from(
        "## Commits against concurrent callers\n\nApproval-free Dispatch commits (the dispatch-commit-direct scenario), closed loop; a fresh toolgate per store, the rounds alternating over the stores. An answer is released when its group commit is durable, so throughput is at most callers / (time a call waits for its batch): group commit needs callers in flight.\n\n| callers | store | commits/s | p50 | p99 | ops/batch | sync mean (p99 ≤, max ≤) | batches/s (warm-up included) | server CPU/commit | errors + wrong |\n| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for (count_index, &callers) in counts.iter().enumerate() {
        for (index, (server, _)) in servers.iter().enumerate() {
            let Some(stats) = &merged[count_index][index] else {
                continue;
            };
            let (operations, sync) = report::store_cells(stats);
            let _ = writeln!(
                text,
                "| {callers} | {} | {} | {} | {} | {operations} | {sync} | {} | {} | {} |",
                server.kind().name(),
                report::rate(stats.throughput()),
                report::latency(stats.percentile(0.5)),
                report::latency(stats.percentile(0.99)),
                report::rate(
                    stats.store.batches
                        / (stats.elapsed + window.warmup * stats.rounds)
                            .as_secs_f64()
                            .max(1e-9)
                ),
                report::latency(stats.server_cpu_per_request()),
                stats.error_count() + stats.wrong,
            );
        }
    }
    println!("{text}");
    Ok(())
}
