//! `toolgate-load run`: the throughput scenarios, each against toolgate and
//! the baseline in alternating rounds (closed loop, then open loop at a
//! fraction of toolgate's closed-loop throughput), then the scaling figures.

use std::fmt::Write as _;
use std::process::Command;
use std::time::Instant;

use crate::load::{RoundStats, Target, Window, closed_loop, open_loop, wait_for_quiet};
use crate::policies::{Workdir, manifest_json, throughput_policy};
use crate::report;
use crate::scaling;
use crate::scenarios::{self, CommitPool, Scenario, host_token, setup_fixtures};
use crate::servers::{Kind, Launcher, ServerProcess};
use crate::{BoxResult, RunArgs};

/// What `--scenario` selected.
#[derive(Debug, Default)]
struct Selection {
    throughput: Vec<Scenario>,
    memory: bool,
    tools: bool,
    workers: bool,
}

impl Selection {
    fn parse(text: &str) -> BoxResult<Selection> {
        let mut selection = Selection::default();
        for name in text
            .split(',')
            .map(str::trim)
            .filter(|name| !name.is_empty())
        {
            match name {
                "all" => {
                    selection.throughput = scenarios::ALL.to_vec();
                    selection.memory = true;
                    selection.tools = true;
                    selection.workers = true;
                }
                "throughput" => selection.throughput = scenarios::ALL.to_vec(),
                "scaling" => {
                    selection.memory = true;
                    selection.tools = true;
                    selection.workers = true;
                }
                "memory" => selection.memory = true,
                "tools" => selection.tools = true,
                "workers" => selection.workers = true,
                other => match Scenario::from_name(other) {
                    Some(scenario) if !selection.throughput.contains(&scenario) => {
                        selection.throughput.push(scenario);
                    }
                    Some(_) => {}
                    None => return Err(format!("unknown scenario {other:?}").into()),
                },
            }
        }
        Ok(selection)
    }
}

pub fn run(args: RunArgs) -> BoxResult<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(args.client_threads.max(1))
        .enable_all()
        .build()?;
    runtime.block_on(run_all(args))
}

fn command_output(program: &str, arguments: &[&str]) -> Option<String> {
    let output = Command::new(program).args(arguments).output().ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_string())
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|text| {
            text.lines()
                .find(|line| line.starts_with("model name"))
                .and_then(|line| line.split_once(':'))
                .map(|(_, model)| model.trim().to_string())
        })
        .unwrap_or_else(|| "unknown".into())
}

async fn run_all(args: RunArgs) -> BoxResult<()> {
    let selection = Selection::parse(&args.scenario)?;
    let load_bin = std::env::current_exe()?;
    let toolgate_bin = args
        .toolgate_bin
        .clone()
        .unwrap_or_else(|| load_bin.with_file_name("toolgate"));
    if !toolgate_bin.exists() {
        return Err(format!(
            "no toolgate binary at {} (cargo build --release -p toolgate --bin toolgate, or --toolgate-bin)",
            toolgate_bin.display()
        )
        .into());
    }
    let launcher = Launcher {
        toolgate_bin,
        load_bin,
        workers: args.workers,
        server_log: args.server_log.clone(),
    };
    let workdir = Workdir::create()?;
    let started = Instant::now();

    let mut header = String::from("# toolgate-load run\n\n");
    let _ = writeln!(
        header,
        "- date: {}; commit: {}",
        command_output("date", &["-u", "+%Y-%m-%d %H:%M UTC"]).unwrap_or_default(),
        command_output("git", &["rev-parse", "--short", "HEAD"])
            .unwrap_or_else(|| "unknown".into()),
    );
    let _ = writeln!(
        header,
        "- machine: {} CPUs (nproc), {}; kernel {}",
        std::thread::available_parallelism().map_or(0, usize::from),
        cpu_model(),
        command_output("uname", &["-r"]).unwrap_or_default(),
    );
    let _ = writeln!(
        header,
        "- load: {} connections, closed loop {} callers, open loop at {} of toolgate's closed-loop req/s{}; rounds of {:.1} s (+{:.1} s warm-up), {} alternations per load model; server workers: {}; load-generator threads: {}",
        args.connections,
        args.concurrency,
        args.open_fraction,
        args.rate
            .map(|rate| format!(" (fixed: {rate} req/s)"))
            .unwrap_or_default(),
        args.duration().as_secs_f64(),
        args.warmup().as_secs_f64(),
        args.alternations,
        args.workers.map_or_else(
            || "tokio default (one per CPU)".to_string(),
            |workers| workers.to_string()
        ),
        args.client_threads,
    );
    header.push_str("- the load generator and the servers share the machine's CPUs\n");
    println!("{header}");

    if !selection.throughput.is_empty() {
        throughput(&args, &launcher, &workdir, &selection.throughput).await?;
    }
    if selection.memory {
        scaling::memory(&args, &launcher, &workdir).await?;
    }
    if selection.tools {
        scaling::tools(&args, &launcher, &workdir).await?;
    }
    if selection.workers {
        scaling::workers(&args, &launcher, &workdir).await?;
    }
    println!("_Run took {:.0} s._", started.elapsed().as_secs_f64());
    Ok(())
}

/// A server with its connections.
pub struct Connected {
    pub server: ServerProcess,
    pub channels: Vec<tonic::transport::Channel>,
    /// RSS once listening and connected, before any request.
    pub rss_at_start: u64,
}

impl Connected {
    pub async fn start(
        launcher: &Launcher,
        kind: Kind,
        label: &str,
        policy: Option<&std::path::Path>,
        workers: Option<usize>,
        connections: usize,
    ) -> BoxResult<Connected> {
        let server = launcher.start(kind, label, policy, workers)?;
        let channels = server.connect(connections).await?;
        let rss_at_start = server.rss_bytes();
        Ok(Connected {
            server,
            channels,
            rss_at_start,
        })
    }

    pub fn target(&self) -> Target<'_> {
        Target {
            server: &self.server,
            channels: &self.channels,
            token: host_token(),
            check: self.server.kind == Kind::Toolgate,
        }
    }
}

/// A load model.
#[derive(Debug, Clone, Copy)]
enum Model {
    Closed,
    Open(f64),
}

/// The merged rounds of both servers under one load model.
struct Pair {
    toolgate: RoundStats,
    baseline: RoundStats,
}

struct ScenarioResult {
    scenario: Scenario,
    closed: Pair,
    open: Pair,
    open_rate: f64,
}

fn merge_into(slot: &mut Option<RoundStats>, stats: &RoundStats) {
    match slot {
        Some(merged) => merged.merge(stats),
        None => *slot = Some(stats.clone()),
    }
}

async fn throughput(
    args: &RunArgs,
    launcher: &Launcher,
    workdir: &Workdir,
    selected: &[Scenario],
) -> BoxResult<()> {
    let policy = workdir.write("bench.toml", &throughput_policy(args.commit_pool))?;
    workdir.write("bench-docs.json", &manifest_json())?;
    let toolgate = Connected::start(
        launcher,
        Kind::Toolgate,
        "toolgate",
        Some(&policy),
        None,
        args.connections,
    )
    .await?;
    let baseline = Connected::start(
        launcher,
        Kind::Baseline,
        "baseline",
        None,
        None,
        args.connections,
    )
    .await?;
    setup_fixtures(&toolgate.channels[0]).await?;
    let commits = CommitPool::new(args.commit_pool);
    println!("## Throughput and latency: toolgate vs the no-op baseline\n");
    println!(
        "Policy: `bench.toml` written by toolgate-load (host and reviewer credentials, limits raised so no budget or cap is hit, {} resources, version scope `resource`); every request carries a host bearer token. Server CPU/req is the server process's user+system CPU time over the measured window divided by the answers (10 ms clock ticks); client CPU/req is the load generator's.\n",
        args.commit_pool + 1
    );
    let mut results = Vec::new();
    for &scenario in selected {
        eprintln!("== {}", scenario.name());
        let rss_before = (toolgate.server.rss_bytes(), baseline.server.rss_bytes());
        let closed = alternate(
            args,
            scenario,
            Model::Closed,
            &toolgate,
            &baseline,
            &commits,
        )
        .await?;
        let open_rate = args
            .rate
            .unwrap_or(closed.toolgate.throughput() * args.open_fraction);
        let open = alternate(
            args,
            scenario,
            Model::Open(open_rate),
            &toolgate,
            &baseline,
            &commits,
        )
        .await?;
        let rss_after = (toolgate.server.rss_bytes(), baseline.server.rss_bytes());
        let result = ScenarioResult {
            scenario,
            closed,
            open,
            open_rate,
        };
        println!("{}", scenario_table(args, &result, rss_before, rss_after));
        results.push(result);
    }
    println!("{}", summary(&results));
    Ok(())
}

async fn alternate(
    args: &RunArgs,
    scenario: Scenario,
    model: Model,
    toolgate: &Connected,
    baseline: &Connected,
    commits: &CommitPool,
) -> BoxResult<Pair> {
    let window = Window {
        warmup: args.warmup(),
        duration: args.duration(),
    };
    let mut merged_toolgate = None;
    let mut merged_baseline = None;
    for round in 0..args.alternations.max(1) {
        let order = if round % 2 == 0 {
            [toolgate, baseline]
        } else {
            [baseline, toolgate]
        };
        for server in order {
            let kind = server.server.kind;
            let model_letter = match model {
                Model::Closed => 'c',
                Model::Open(_) => 'o',
            };
            let mut attempt = 0;
            let stats = loop {
                // Unique per round and attempt: a "new call id" stays new.
                let tag = format!("{model_letter}{round}{}{attempt}", &kind.name()[..1]);
                wait_for_quiet(args.max_foreign_load, args.quiet_wait()).await;
                let stats = one_round(
                    args, scenario, model, &tag, server, toolgate, commits, window,
                )
                .await?;
                let foreign = stats.foreign_load();
                if foreign <= args.max_foreign_load || attempt >= MAX_REPEATS {
                    break RoundStats {
                        repeated: attempt,
                        ..stats
                    };
                }
                attempt += 1;
                eprintln!(
                    "   {model_letter} round {round} {}: other processes used {foreign:.2} cores; repeating",
                    kind.name()
                );
            };
            eprintln!(
                "   {model_letter} round {round} {:<8} {:>9} req/s  p50 {:>9}  p99 {:>9}  errors {}  wrong {}",
                kind.name(),
                report::rate(stats.throughput()),
                report::latency(stats.percentile(0.5)),
                report::latency(stats.percentile(0.99)),
                stats.error_count(),
                stats.wrong,
            );
            match kind {
                Kind::Toolgate => merge_into(&mut merged_toolgate, &stats),
                Kind::Baseline => merge_into(&mut merged_baseline, &stats),
            }
        }
    }
    match (merged_toolgate, merged_baseline) {
        (Some(toolgate), Some(baseline)) => Ok(Pair { toolgate, baseline }),
        _ => Err("no rounds ran".into()),
    }
}

/// How often a disturbed round is run again before it is kept anyway.
const MAX_REPEATS: u32 = 3;

#[allow(clippy::too_many_arguments)]
async fn one_round(
    args: &RunArgs,
    scenario: Scenario,
    model: Model,
    tag: &str,
    server: &Connected,
    toolgate: &Connected,
    commits: &CommitPool,
    window: Window,
) -> BoxResult<RoundStats> {
    let kind = server.server.kind;
    let mut window = window;
    let prepared = if scenario == Scenario::DispatchCommit {
        let size = match model {
            // A closed-loop commit round runs until its pool is used up.
            Model::Closed => {
                window = Window {
                    warmup: std::time::Duration::ZERO,
                    duration: window.duration * 20,
                };
                args.commit_pool
            }
            Model::Open(rate) => {
                ((window.warmup + window.duration).as_secs_f64() * rate * 1.1) as usize + 1000
            }
        };
        let grant_on = (kind == Kind::Toolgate).then_some(&toolgate.channels[..]);
        let preparing = Instant::now();
        let prepared = commits.prepare(tag, size, grant_on, 32).await?;
        if grant_on.is_some() {
            eprintln!(
                "   prepared {} granted proposals in {:.1} s",
                prepared.len(),
                preparing.elapsed().as_secs_f64()
            );
        }
        Some(prepared)
    } else {
        None
    };
    let generator =
        scenarios::generator(scenario, tag, prepared.map(|prepared| (commits, prepared)));
    let target = server.target();
    Ok(match model {
        Model::Closed => closed_loop(&target, generator, args.concurrency, window).await,
        Model::Open(rate) => open_loop(&target, generator, rate, window).await,
    })
}

fn scenario_table(
    args: &RunArgs,
    result: &ScenarioResult,
    rss_before: (u64, u64),
    rss_after: (u64, u64),
) -> String {
    let mut text = format!(
        "### {}\n\n{}.\n\n",
        result.scenario.name(),
        result.scenario.describe()
    );
    text.push_str(&report::header("load / server"));
    let closed_label = format!("closed, {} callers", args.concurrency);
    text.push_str(&report::row(
        &format!("{closed_label}: toolgate"),
        &result.closed.toolgate,
    ));
    text.push_str(&report::row(
        &format!("{closed_label}: baseline"),
        &result.closed.baseline,
    ));
    text.push_str(&report::ratio_row(
        &result.closed.toolgate,
        &result.closed.baseline,
    ));
    let open_label = format!("open, {} req/s", report::rate(result.open_rate));
    text.push_str(&report::row(
        &format!("{open_label}: toolgate"),
        &result.open.toolgate,
    ));
    text.push_str(&report::row(
        &format!("{open_label}: baseline"),
        &result.open.baseline,
    ));
    text.push_str(&report::ratio_row(
        &result.open.toolgate,
        &result.open.baseline,
    ));
    text.push('\n');
    let lag = |stats: &RoundStats| {
        stats.send_lag.as_ref().map_or_else(String::new, |lag| {
            report::latency(std::time::Duration::from_nanos(lag.value_at_quantile(0.99)))
        })
    };
    let _ = writeln!(
        text,
        "- RSS: toolgate {} → {}, baseline {} → {}",
        report::mib(rss_before.0),
        report::mib(rss_after.0),
        report::mib(rss_before.1),
        report::mib(rss_after.1),
    );
    let rounds_p99 = |stats: &RoundStats| {
        stats
            .round_p99s
            .iter()
            .map(|p99| report::latency(*p99))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(
        text,
        "- p99 of each open-loop round: toolgate {}; baseline {}",
        rounds_p99(&result.open.toolgate),
        rounds_p99(&result.open.baseline),
    );
    let _ = writeln!(
        text,
        "- open loop send lag p99 (scheduled → sent, included in the latencies): toolgate {}, baseline {}",
        lag(&result.open.toolgate),
        lag(&result.open.baseline),
    );
    let all = [
        &result.closed.toolgate,
        &result.closed.baseline,
        &result.open.toolgate,
        &result.open.baseline,
    ];
    let rounds: u32 = all.iter().map(|stats| stats.rounds).sum();
    let repeated: u32 = all.iter().map(|stats| stats.repeated).sum();
    let foreign = all
        .iter()
        .map(|stats| stats.foreign_load())
        .fold(0.0, f64::max);
    let _ = writeln!(
        text,
        "- other processes used up to {foreign:.2} cores during the rounds kept; {repeated} of {rounds} rounds were run again because they used more than {:.2}",
        args.max_foreign_load
    );
    for (label, stats) in [
        ("closed toolgate", &result.closed.toolgate),
        ("closed baseline", &result.closed.baseline),
        ("open toolgate", &result.open.toolgate),
        ("open baseline", &result.open.baseline),
    ] {
        text.push_str(&report::notes(label, stats));
    }
    text
}

fn summary(results: &[ScenarioResult]) -> String {
    let mut text = String::from(
        "### Summary: toolgate / baseline\n\n| scenario | closed req/s toolgate | closed req/s baseline | **throughput ratio** | closed p99 ratio | open rate | open p99 toolgate | open p99 baseline | **open p99 ratio** | open p99 ratio, median of rounds | server CPU/req toolgate | server CPU/req baseline | **server CPU ratio** | errors + wrong (toolgate) |\n| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n",
    );
    for result in results {
        let closed = &result.closed;
        let open = &result.open;
        let faults = closed.toolgate.error_count()
            + closed.toolgate.wrong
            + open.toolgate.error_count()
            + open.toolgate.wrong;
        let _ = writeln!(
            text,
            "| {} | {} | {} | **{}** | {} | {} | {} | {} | **{}** | {} | {} | {} | **{}** | {} |",
            result.scenario.name(),
            report::rate(closed.toolgate.throughput()),
            report::rate(closed.baseline.throughput()),
            report::ratio(closed.toolgate.throughput(), closed.baseline.throughput()),
            report::ratio(
                closed.toolgate.percentile(0.99).as_secs_f64(),
                closed.baseline.percentile(0.99).as_secs_f64()
            ),
            report::rate(result.open_rate),
            report::latency(open.toolgate.percentile(0.99)),
            report::latency(open.baseline.percentile(0.99)),
            report::ratio(
                open.toolgate.percentile(0.99).as_secs_f64(),
                open.baseline.percentile(0.99).as_secs_f64()
            ),
            report::ratio(
                open.toolgate.median_round_p99().as_secs_f64(),
                open.baseline.median_round_p99().as_secs_f64()
            ),
            report::latency(closed.toolgate.server_cpu_per_request()),
            report::latency(closed.baseline.server_cpu_per_request()),
            report::ratio(
                closed.toolgate.server_cpu_per_request().as_secs_f64(),
                closed.baseline.server_cpu_per_request().as_secs_f64()
            ),
            faults,
        );
    }
    text.push('\n');
    for result in results {
        let throughput_ratio =
            result.closed.toolgate.throughput() / result.closed.baseline.throughput().max(1e-9);
        let p99_ratio = result.open.toolgate.percentile(0.99).as_secs_f64()
            / result
                .open
                .baseline
                .percentile(0.99)
                .as_secs_f64()
                .max(1e-12);
        let measured = result.closed.baseline.throughput() > 0.0
            && result.open.baseline.percentile(0.99) > std::time::Duration::ZERO;
        let verdict = |met: bool| match (measured, met) {
            (false, _) => "no data",
            (true, true) => "met",
            (true, false) => "MISSED",
        };
        match result.scenario {
            Scenario::DecideAllow => {
                let _ = writeln!(
                    text,
                    "- target decide-allow throughput ≥ 0.90× baseline: {:.2}× — {}",
                    throughput_ratio,
                    verdict(throughput_ratio >= 0.90)
                );
                let median_ratio = result.open.toolgate.median_round_p99().as_secs_f64()
                    / result
                        .open
                        .baseline
                        .median_round_p99()
                        .as_secs_f64()
                        .max(1e-12);
                let _ = writeln!(
                    text,
                    "- target decide-allow p99 at half of saturation ≤ 1.5× baseline: {:.2}× over all rounds — {}; {:.2}× as the median of the rounds' p99s — {}",
                    p99_ratio,
                    verdict(p99_ratio <= 1.5),
                    median_ratio,
                    verdict(median_ratio <= 1.5)
                );
            }
            Scenario::DispatchCommit => {
                let _ = writeln!(
                    text,
                    "- target dispatch-commit throughput ≥ 0.80× baseline: {:.2}× — {}",
                    throughput_ratio,
                    verdict(throughput_ratio >= 0.80)
                );
            }
            _ => {}
        }
    }
    text
}
