//! `toolgate-load run`: the throughput scenarios, each against toolgate on
//! every store of `--stores` (durable, memory) and the baseline in
//! alternating rounds (closed loop, then open loop at a fraction of the
//! first toolgate's closed-loop throughput), then the scaling and recovery
//! figures.

use std::fmt::Write as _;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::callgrind;
use crate::load::{RoundStats, Target, Window, closed_loop, open_loop, wait_for_quiet};
use crate::policies::{Workdir, manifest_json, throughput_policy};
use crate::recovery;
use crate::report::{self, Ratio};
use crate::scaling;
use crate::scenarios::{self, CommitPool, Scenario, host_header, setup_fixtures};
use crate::servers::{Kind, Launcher, Postgres, ServerProcess, Store};
use crate::{BoxResult, RunArgs};

/// What `--scenario` selected.
#[derive(Debug, Default)]
struct Selection {
    throughput: Vec<Scenario>,
    callers: bool,
    memory: bool,
    tools: bool,
    workers: bool,
    recovery: bool,
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
                    selection.callers = true;
                    selection.memory = true;
                    selection.tools = true;
                    selection.workers = true;
                    selection.recovery = true;
                }
                "throughput" => selection.throughput = scenarios::ALL.to_vec(),
                "scaling" => {
                    selection.callers = true;
                    selection.memory = true;
                    selection.tools = true;
                    selection.workers = true;
                }
                "callers" => selection.callers = true,
                "recovery" => selection.recovery = true,
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

/// The CPUs of the load generator and of the servers with `--pin-cores`.
const CLIENT_CPUS: &str = "0";
const SERVER_CPUS: &str = "1";

pub fn run(mut args: RunArgs) -> BoxResult<()> {
    if args.pin_cores {
        // Before the runtime's threads exist: they inherit the affinity.
        let pid = std::process::id().to_string();
        command_output("taskset", &["-a", "-p", "-c", CLIENT_CPUS, &pid])
            .ok_or("--pin-cores: `taskset -a -p -c 0` failed (is util-linux installed?)")?;
        args.workers = args.workers.or(Some(1));
    }
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

/// The file system `path` is on and its device (`stat -f`, `df`): the
/// durable figures mean nothing on a tmpfs.
fn file_system(path: &std::path::Path) -> String {
    let path = path.to_string_lossy();
    let kind = command_output("stat", &["-f", "-c", "%T", &path]).unwrap_or_default();
    let device = command_output("df", &["--output=source", &path])
        .and_then(|text| text.lines().nth(1).map(str::to_string))
        .unwrap_or_default();
    format!("file system {kind} on {device}")
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
    let stores = args.stores()?;
    let workdir = Workdir::create()?;
    let data_root = match &args.data_root {
        Some(root) => {
            std::fs::create_dir_all(root)?;
            root.clone()
        }
        None => workdir.path().to_path_buf(),
    };
    let launcher = Launcher {
        toolgate_bin,
        load_bin,
        workers: args.workers,
        server_log: args.server_log.clone(),
        data_root,
        postgres: args.postgres_url().map(Postgres::new),
        cpus: args.pin_cores.then_some(SERVER_CPUS),
        callgrind: match &args.callgrind {
            Some(dir) => {
                std::fs::create_dir_all(dir)?;
                Some(std::path::absolute(dir)?)
            }
            None => None,
        },
    };
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
        "- machine: {} CPUs (nproc --all), {}; kernel {}",
        // All of them, not the ones --pin-cores left this process.
        command_output("nproc", &["--all"]).unwrap_or_else(|| "?".into()),
        cpu_model(),
        command_output("uname", &["-r"]).unwrap_or_default(),
    );
    let _ = writeln!(
        header,
        "- load: {} connections, closed loop {} callers, open loop at {} of the {} server's closed-loop req/s{}; rounds of {:.1} s (+{:.1} s warm-up), {} alternations per load model; server workers: {}; load-generator threads: {}",
        args.connections,
        args.concurrency,
        args.open_fraction,
        stores[0].name(),
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
    let _ = writeln!(
        header,
        "- toolgate stores: {}; durable data directories under {} ({})",
        stores
            .iter()
            .map(|store| match store {
                Store::Durable => "durable (`--store sqlite --data-dir` a fresh directory)",
                Store::Memory => "memory (`--store memory`)",
                Store::Postgres => "postgres (`--store postgres://…?schema=bench_…`, one replica)",
                Store::Postgres3 =>
                    "postgres×3 (three `toolgate serve` on one fresh schema, connections round-robin over them)",
            })
            .collect::<Vec<_>>()
            .join(", "),
        launcher.data_root.display(),
        file_system(&launcher.data_root),
    );
    if let Some(postgres) = &launcher.postgres {
        let setting = |name: &str| postgres.setting(name).unwrap_or_else(|| "?".into());
        let data_directory = postgres.setting("data_directory");
        let _ = writeln!(
            header,
            "- PostgreSQL: {} ({}); fsync {}, synchronous_commit {}, full_page_writes {}, wal_level {}, shared_buffers {}; data directory {} ({}); its CPU time (postmaster and children, /proc): {}",
            postgres.display(),
            setting("server_version"),
            setting("fsync"),
            setting("synchronous_commit"),
            setting("full_page_writes"),
            setting("wal_level"),
            setting("shared_buffers"),
            data_directory.as_deref().unwrap_or("?"),
            data_directory
                .as_deref()
                .map_or_else(String::new, |dir| file_system(std::path::Path::new(dir))),
            postgres.postmaster.map_or_else(
                || "not measured (postmaster not found through psql)".to_string(),
                |pid| format!("measured (postmaster pid {pid})")
            ),
        );
    }
    match launcher.cpus {
        Some(cpus) => {
            let _ = writeln!(
                header,
                "- pinned (`--pin-cores`, taskset): the load generator on CPU {CLIENT_CPUS}, every server process on CPU {cpus}; PostgreSQL not pinned"
            );
        }
        None => header.push_str("- the load generator and the servers share the machine's CPUs\n"),
    }
    if let Some(dir) = &launcher.callgrind {
        let _ = writeln!(
            header,
            "- under callgrind (`--callgrind`): every server runs in valgrind, counting instructions only in the closed-loop rounds' measured windows; profiles in {}",
            dir.display()
        );
    }
    println!("{header}");

    if !selection.throughput.is_empty() {
        throughput(&args, &launcher, &workdir, &stores, &selection.throughput).await?;
    }
    if selection.callers {
        scaling::callers(&args, &launcher, &workdir, &stores).await?;
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
    if selection.recovery {
        recovery::recovery(&args, &launcher, &workdir).await?;
    }
    println!("_Run took {:.0} s._", started.elapsed().as_secs_f64());
    Ok(())
}

/// A server with its connections: tonic's for the setup calls, the lean
/// client's for the measured ones (as many of each).
pub struct Connected {
    pub server: ServerProcess,
    pub channels: Vec<tonic::transport::Channel>,
    pub connections: Vec<crate::grpc::Connection>,
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
        Connected::on(server, connections).await
    }

    /// Connects to a server already started.
    pub async fn on(server: ServerProcess, connections: usize) -> BoxResult<Connected> {
        let channels = server.connect(connections).await?;
        let connections = server.open_connections(connections).await?;
        let rss_at_start = server.rss_bytes();
        Ok(Connected {
            server,
            channels,
            connections,
            rss_at_start,
        })
    }

    pub fn target(&self) -> Target<'_> {
        Target {
            server: &self.server,
            connections: &self.connections,
            token: host_header(),
            check: self.server.kind.is_toolgate(),
        }
    }

    pub fn kind(&self) -> Kind {
        self.server.kind
    }
}

/// A server of the throughput scenarios, with the versions of its commit
/// resources (each toolgate has its own).
struct UnderTest {
    connected: Connected,
    commits: CommitPool,
}

/// A load model.
#[derive(Debug, Clone, Copy)]
enum Model {
    Closed,
    Open(f64),
}

struct ScenarioResult {
    scenario: Scenario,
    /// The merged rounds of each server, in the order of the servers.
    closed: Vec<RoundStats>,
    open: Vec<RoundStats>,
    /// The open-loop rate of the first server (and of every one but the
    /// postgres servers).
    open_rate: f64,
    /// Each server's open-loop rate.
    open_rates: Vec<f64>,
}

/// The index of the server of `kind` among `kinds`.
fn index_of(kinds: &[Kind], kind: Kind) -> Option<usize> {
    kinds.iter().position(|other| *other == kind)
}

async fn throughput(
    args: &RunArgs,
    launcher: &Launcher,
    workdir: &Workdir,
    stores: &[Store],
    selected: &[Scenario],
) -> BoxResult<()> {
    let policy = workdir.write("bench.toml", &throughput_policy(args.commit_pool))?;
    workdir.write("bench-docs.json", &manifest_json())?;
    let mut servers = Vec::new();
    for store in stores {
        let kind = Kind::Toolgate(*store);
        let connected = Connected::start(
            launcher,
            kind,
            kind.name(),
            Some(&policy),
            None,
            args.connections,
        )
        .await?;
        if let Some(schema) = connected.server.schema() {
            eprintln!(
                "   {} on schema {schema} ({} processes, {} connections)",
                kind.name(),
                store.replicas(),
                connected.channels.len()
            );
        }
        setup_fixtures(&connected.channels[0]).await?;
        servers.push(UnderTest {
            connected,
            commits: CommitPool::new(args.commit_pool),
        });
    }
    let baseline = Connected::start(
        launcher,
        Kind::Baseline,
        "baseline",
        None,
        None,
        args.connections,
    )
    .await?;
    servers.push(UnderTest {
        connected: baseline,
        commits: CommitPool::new(args.commit_pool),
    });
    let kinds: Vec<Kind> = servers
        .iter()
        .map(|server| server.connected.kind())
        .collect();
    println!("## Throughput and latency: toolgate (durable, memory) vs the no-op baseline\n");
    println!(
        "Policy: `bench.toml` written by toolgate-load (host and reviewer credentials, limits raised so no budget or cap is hit, {} resources, version scope `resource`); every request carries a host bearer token. The durable server keeps its state in SQLite in a fresh data directory (`--data-dir`), the memory server with `--store memory`; the durable server releases an answer only after its changes went through the group commit, the memory server keeps no records (nothing is encoded or written; no writer thread). Server CPU/req is the server process's user+system CPU time over the measured window divided by the answers (10 ms clock ticks); client CPU/req is the load generator's. Ops/batch: operations per group commit (`toolgate_store_batch_operations` sum / count over the rounds); sync: the mean time of a batch's transaction and sync (`toolgate_store_sync_seconds`), with the upper bounds of the histogram buckets holding the 99th percentile and the slowest batch (the buckets are 1, 2.5, 5, 10, 25, 50, 100, 500 ms, 1 s, 5 s).\n",
        args.commit_pool + 1
    );
    let mut results = Vec::new();
    for &scenario in selected {
        eprintln!("== {}", scenario.name());
        let rss_before: Vec<u64> = servers
            .iter()
            .map(|server| server.connected.server.rss_bytes())
            .collect();
        let closed_models = vec![Model::Closed; servers.len()];
        let closed = alternate(args, scenario, &closed_models, &servers).await?;
        let open_rate = args
            .rate
            .unwrap_or(closed[0].throughput() * args.open_fraction);
        // A postgres server runs at the fraction of its own closed-loop
        // throughput: the first server's half load may be past its saturation.
        let open_rates: Vec<f64> = kinds
            .iter()
            .zip(&closed)
            .map(|(kind, stats)| match args.rate {
                None if kind.is_postgres() => stats.throughput() * args.open_fraction,
                _ => open_rate,
            })
            .collect();
        let open_models: Vec<Model> = open_rates.iter().map(|rate| Model::Open(*rate)).collect();
        let open = alternate(args, scenario, &open_models, &servers).await?;
        let rss_after: Vec<u64> = servers
            .iter()
            .map(|server| server.connected.server.rss_bytes())
            .collect();
        let result = ScenarioResult {
            scenario,
            closed,
            open,
            open_rate,
            open_rates,
        };
        println!(
            "{}",
            scenario_table(args, &kinds, &result, &rss_before, &rss_after)
        );
        results.push(result);
    }
    let disk: Vec<(Kind, u64)> = servers
        .iter()
        .filter_map(|server| {
            let process = &server.connected.server;
            process
                .data_dir
                .as_ref()
                .map(|_| (process.kind, process.data_dir_bytes()))
        })
        .collect();
    println!("{}", summary(&kinds, &results, &disk));
    println!("{}", targets(&kinds, &results));
    Ok(())
}

/// The rounds of one load model over every server, the order rotating each
/// alternation (A B C, B C A, C A B) to cancel drift.
async fn alternate(
    args: &RunArgs,
    scenario: Scenario,
    models: &[Model],
    servers: &[UnderTest],
) -> BoxResult<Vec<RoundStats>> {
    let window = Window {
        warmup: args.warmup(),
        duration: args.duration(),
    };
    let mut merged: Vec<Option<RoundStats>> = vec![None; servers.len()];
    for round in 0..args.alternations.max(1) {
        for offset in 0..servers.len() {
            let index = (round + offset) % servers.len();
            let server = &servers[index];
            let kind = server.connected.kind();
            let model = models[index];
            let model_letter = match model {
                Model::Closed => 'c',
                Model::Open(_) => 'o',
            };
            let mut attempt = 0;
            let stats = loop {
                // Unique per round, server and attempt: a "new call id" stays new.
                let tag = format!("{model_letter}{round}{}{attempt}", &kind.name()[..1]);
                wait_for_quiet(args.max_foreign_load, args.quiet_wait()).await;
                let stats = one_round(args, scenario, model, &tag, server, window).await?;
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
                "   {model_letter} round {round} {:<8} {:>9} req/s  p50 {:>9}  p99 {:>9}  ops/batch {:>6}  errors {}  wrong {}",
                kind.name(),
                report::rate(stats.throughput()),
                report::latency(stats.percentile(0.5)),
                report::latency(stats.percentile(0.99)),
                stats
                    .store
                    .operations_per_batch()
                    .map_or_else(|| "–".to_string(), |ops| format!("{ops:.1}")),
                stats.error_count(),
                stats.wrong,
            );
            merge_into(&mut merged[index], &stats);
            if let Some(gone) = servers
                .iter()
                .find(|server| server.connected.server.exited())
            {
                return Err(format!(
                    "the {} server exited during {} (a crash, or a signal from outside: see --server-log)",
                    gone.connected.kind().name(),
                    scenario.name()
                )
                .into());
            }
        }
    }
    merged
        .into_iter()
        .map(|stats| stats.ok_or_else(|| "no rounds ran".into()))
        .collect()
}

fn merge_into(slot: &mut Option<RoundStats>, stats: &RoundStats) {
    match slot {
        Some(merged) => merged.merge(stats),
        None => *slot = Some(stats.clone()),
    }
}

/// How often a disturbed round is run again before it is kept anyway.
const MAX_REPEATS: u32 = 3;

async fn one_round(
    args: &RunArgs,
    scenario: Scenario,
    model: Model,
    tag: &str,
    server: &UnderTest,
    window: Window,
) -> BoxResult<RoundStats> {
    let connected = &server.connected;
    let kind = connected.kind();
    let measured = window;
    let mut window = window;
    let prepared = if matches!(
        scenario,
        Scenario::DispatchCommit | Scenario::DispatchContended
    ) {
        let requests = match model {
            // A closed-loop commit round runs until its pool is used up.
            Model::Closed => {
                window = Window {
                    warmup: Duration::ZERO,
                    duration: window.duration * 20,
                };
                args.commit_pool
            }
            Model::Open(rate) => {
                ((window.warmup + window.duration).as_secs_f64() * rate * 1.1) as usize + 1000
            }
        };
        // A contended proposal is sent by several requests.
        let size = match scenario {
            Scenario::DispatchContended => requests / crate::scenarios::RACERS as usize + 1,
            _ => requests,
        };
        let grant_on = kind.is_toolgate().then_some(&connected.channels[..]);
        let preparing = Instant::now();
        let prepared = server
            .commits
            .prepare(tag, size, grant_on, args.concurrency)
            .await?;
        if grant_on.is_some() {
            eprintln!(
                "   prepared {} granted proposals on {} in {:.1} s",
                prepared.len(),
                kind.name(),
                preparing.elapsed().as_secs_f64()
            );
        }
        Some(prepared)
    } else {
        None
    };
    let generator = scenarios::generator(scenario, tag, &server.commits, prepared);
    let target = connected.target();
    let counters_before = connected.server.store_counters();
    let statements_before = connected.server.database_statements();
    // Counting starts when the round's warm-up ends (a commit round has
    // none, and runs until its pool is used up: counted for the duration).
    let counting = match (&connected.server.callgrind, model) {
        (Some(dir), Model::Closed) => Some(tokio::spawn(callgrind::measure(
            dir.clone(),
            connected.server.label.clone(),
            connected.server.pid(),
            window.warmup,
            measured.duration,
        ))),
        _ => None,
    };
    let mut stats = match model {
        Model::Closed => closed_loop(&target, generator, args.concurrency, window).await,
        Model::Open(rate) => {
            let tick = Duration::from_micros(args.open_tick);
            open_loop(&target, generator, rate, tick, window).await
        }
    };
    if let Some(counting) = counting {
        stats.instructions = Some(counting.await??);
    }
    stats.store = connected.server.store_counters().since(&counters_before);
    stats.database = statements_before
        .zip(connected.server.database_statements())
        .map(|(before, after)| after.since(&before));
    Ok(stats)
}

/// The label of the ratio of server `a` to server `b`.
fn ratio_label(kinds: &[Kind], a: usize, b: usize) -> String {
    format!("{}/{}", kinds[a].name(), kinds[b].name())
}

/// The ratio rows of a table: every toolgate store but postgres against
/// every later one of them and the baseline (durable/memory,
/// durable/baseline, memory/baseline); each postgres store against durable
/// and the baseline, and postgres×3/postgres.
fn ratio_pairs(kinds: &[Kind]) -> Vec<(usize, usize)> {
    let mut pairs = Vec::new();
    for a in 0..kinds.len() {
        for b in a + 1..kinds.len() {
            if kinds[a].is_toolgate() && !kinds[a].is_postgres() && !kinds[b].is_postgres() {
                pairs.push((a, b));
            }
        }
    }
    let durable = index_of(kinds, Kind::Toolgate(Store::Durable));
    let baseline = index_of(kinds, Kind::Baseline);
    let one = index_of(kinds, Kind::Toolgate(Store::Postgres));
    let three = index_of(kinds, Kind::Toolgate(Store::Postgres3));
    for postgres in [one, three].into_iter().flatten() {
        pairs.extend(durable.map(|durable| (postgres, durable)));
        pairs.extend(baseline.map(|baseline| (postgres, baseline)));
    }
    if let (Some(one), Some(three)) = (one, three) {
        pairs.push((three, one));
    }
    pairs
}

fn scenario_table(
    args: &RunArgs,
    kinds: &[Kind],
    result: &ScenarioResult,
    rss_before: &[u64],
    rss_after: &[u64],
) -> String {
    let mut text = format!(
        "### {}\n\n{}.\n\n",
        result.scenario.name(),
        result.scenario.describe()
    );
    text.push_str(&report::header("load / server"));
    let closed_label = format!("closed, {} callers", args.concurrency);
    for (closed, stats) in [(true, &result.closed), (false, &result.open)] {
        for (index, (kind, stats)) in kinds.iter().zip(stats).enumerate() {
            let label = if closed {
                closed_label.clone()
            } else {
                format!("open, {} req/s", report::rate(result.open_rates[index]))
            };
            text.push_str(&report::row(&format!("{label}: {}", kind.name()), stats));
        }
        for (a, b) in ratio_pairs(kinds) {
            text.push_str(&report::ratio_row(
                &ratio_label(kinds, a, b),
                &stats[a],
                &stats[b],
            ));
        }
    }
    text.push('\n');
    let list = |value: &dyn Fn(usize) -> String| {
        (0..kinds.len())
            .map(|index| format!("{} {}", kinds[index].name(), value(index)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(
        text,
        "- RSS: {}",
        list(&|index| format!(
            "{} → {}",
            report::mib(rss_before[index]),
            report::mib(rss_after[index])
        ))
    );
    let per_request = |index: usize| {
        result.closed[index]
            .instructions
            .and_then(|instructions| instructions.per_request())
    };
    if (0..kinds.len()).any(|index| per_request(index).is_some()) {
        let ratios = ratio_pairs(kinds)
            .into_iter()
            .filter_map(|(a, b)| {
                Some(format!(
                    "{} {:.2}×",
                    ratio_label(kinds, a, b),
                    per_request(a)? / per_request(b)?
                ))
            })
            .collect::<Vec<_>>()
            .join(", ");
        let _ = writeln!(
            text,
            "- instructions per request (callgrind, closed loop, measured windows): {}; {ratios}",
            list(&|index| match result.closed[index].instructions {
                Some(instructions) => format!(
                    "{:.0} ({:.0} in sha2's portable SHA-256; {} requests)",
                    instructions.per_request().unwrap_or(0.0),
                    instructions.portable_sha_per_request().unwrap_or(0.0),
                    instructions.requests
                ),
                None => "–".to_string(),
            })
        );
    }
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
        "- p99 of each closed-loop round: {}",
        list(&|index| rounds_p99(&result.closed[index]))
    );
    let _ = writeln!(
        text,
        "- p99 of each open-loop round: {}",
        list(&|index| rounds_p99(&result.open[index]))
    );
    let lag = |stats: &RoundStats| {
        stats.send_lag.as_ref().map_or_else(String::new, |lag| {
            report::latency(std::time::Duration::from_nanos(lag.value_at_quantile(0.99)))
        })
    };
    let _ = writeln!(
        text,
        "- open loop send lag p99 (scheduled → sent, included in the latencies): {}",
        list(&|index| lag(&result.open[index]))
    );
    if kinds.iter().any(|kind| kind.is_postgres()) {
        let database = |stats: &RoundStats| {
            let seconds = stats.elapsed.as_secs_f64().max(1e-9);
            format!(
                "{} ({:.2} cores)",
                report::latency(stats.database_cpu_per_request()),
                stats.database_cpu.as_secs_f64() / seconds
            )
        };
        for (model, stats) in [("closed", &result.closed), ("open", &result.open)] {
            let cells: Vec<String> = kinds
                .iter()
                .zip(stats)
                .filter(|(kind, _)| kind.is_postgres())
                .map(|(kind, stats)| format!("{} {}", kind.name(), database(stats)))
                .collect();
            let _ = writeln!(
                text,
                "- PostgreSQL CPU/req ({model} loop; all of the database server's processes, the cores it kept busy): {}",
                cells.join(", ")
            );
        }
    }
    for (model, stats) in [("closed", &result.closed), ("open", &result.open)] {
        let cells: Vec<String> = kinds
            .iter()
            .zip(stats)
            .filter_map(|(kind, stats)| {
                let database = stats.database?;
                let rpcs = stats.store.rpcs.max(1.0);
                let turns = database.locks.max(1.0);
                Some(format!(
                    "{} {:.2} round trips/RPC ({:.2} statements; {:.3} turns/RPC, {:.1} round trips/turn; BEGINs {:.3}/RPC)",
                    kind.name(),
                    database.round_trips() / rpcs,
                    database.statements / rpcs,
                    database.locks / rpcs,
                    database.round_trips() / turns,
                    database.begins / rpcs,
                ))
            })
            .collect();
        if !cells.is_empty() {
            let _ = writeln!(
                text,
                "- PostgreSQL round trips ({model} loop; pg_stat_statements over the rounds, warm-up included, per Decide/Dispatch answer from toolgate's counters; a turn's BEGIN and lock are one round trip; idle replicas of the other postgres server catching up every 50 ms count too): {}",
                cells.join("; ")
            );
        }
    }
    let all: Vec<&RoundStats> = result.closed.iter().chain(&result.open).collect();
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
    for (model, stats) in [("closed", &result.closed), ("open", &result.open)] {
        for (kind, stats) in kinds.iter().zip(stats) {
            text.push_str(&report::notes(&format!("{model} {}", kind.name()), stats));
        }
    }
    text
}

fn summary(kinds: &[Kind], results: &[ScenarioResult], disk: &[(Kind, u64)]) -> String {
    let names: Vec<&str> = kinds.iter().map(|kind| kind.name()).collect();
    let pairs = ratio_pairs(kinds);
    let mut header = String::from("| scenario |");
    let mut align = String::from("| --- |");
    for name in &names {
        let _ = write!(header, " closed req/s {name} |");
        align.push_str(" ---: |");
    }
    for (a, b) in &pairs {
        let _ = write!(header, " **{}** |", ratio_label(kinds, *a, *b));
        align.push_str(" ---: |");
    }
    header.push_str(" open rate |");
    align.push_str(" ---: |");
    for name in &names {
        let _ = write!(header, " open p99 {name} |");
        align.push_str(" ---: |");
    }
    for name in &names {
        let _ = write!(header, " server CPU/req {name} |");
        align.push_str(" ---: |");
    }
    for (index, name) in names.iter().enumerate() {
        if kinds[index].is_toolgate() {
            let _ = write!(header, " ops/batch {name} (closed) |");
            align.push_str(" ---: |");
        }
    }
    header.push_str(" errors + wrong (toolgate) |\n");
    align.push_str(" ---: |\n");
    let mut text = format!(
        "### Summary: toolgate on each store / baseline\n\nThroughput ratios of the closed loop (higher is better for the first named).\n\n{header}{align}"
    );
    for result in results {
        let _ = write!(text, "| {} |", result.scenario.name());
        for stats in &result.closed {
            let _ = write!(text, " {} |", report::rate(stats.throughput()));
        }
        for (a, b) in &pairs {
            let _ = write!(
                text,
                " **{}** |",
                Ratio::of(&result.closed[*a], &result.closed[*b]).text()
            );
        }
        let _ = write!(text, " {} |", report::rate(result.open_rate));
        for stats in &result.open {
            let _ = write!(text, " {} |", report::latency(stats.percentile(0.99)));
        }
        for stats in &result.closed {
            let _ = write!(
                text,
                " {} |",
                report::latency(stats.server_cpu_per_request())
            );
        }
        for (index, stats) in result.closed.iter().enumerate() {
            if kinds[index].is_toolgate() {
                let _ = write!(
                    text,
                    " {} |",
                    stats
                        .store
                        .operations_per_batch()
                        .map_or_else(|| "–".to_string(), |ops| format!("{ops:.1}"))
                );
            }
        }
        let faults: u64 = kinds
            .iter()
            .zip(result.closed.iter().zip(&result.open))
            .filter(|(kind, _)| kind.is_toolgate())
            .map(|(_, (closed, open))| {
                closed.error_count() + closed.wrong + open.error_count() + open.wrong
            })
            .sum();
        let _ = writeln!(text, " {faults} |");
    }
    for (kind, bytes) in disk {
        let _ = writeln!(
            text,
            "\n- the {} server's data directory after every scenario: {}",
            kind.name(),
            report::mib(*bytes)
        );
    }
    text
}

/// The targets of issue 15 (durable against memory) and the earlier ones
/// (toolgate against the baseline), each with its measured value.
fn targets(kinds: &[Kind], results: &[ScenarioResult]) -> String {
    let durable = index_of(kinds, Kind::Toolgate(Store::Durable));
    let memory = index_of(kinds, Kind::Toolgate(Store::Memory));
    let baseline = index_of(kinds, Kind::Baseline);
    let verdict = |met: bool| if met { "met" } else { "NOT MET" };
    let find = |scenario: Scenario| results.iter().find(|result| result.scenario == scenario);
    let mut text = String::from("### Targets\n\n");
    for postgres in [Store::Postgres, Store::Postgres3] {
        let Some(index) = index_of(kinds, Kind::Toolgate(postgres)) else {
            continue;
        };
        let name = postgres.name();
        if let Some(result) = find(Scenario::DecideAllow) {
            for (model, stats, rate) in [
                ("closed loop", &result.closed[index], None),
                (
                    "open loop",
                    &result.open[index],
                    Some(result.open_rates[index]),
                ),
            ] {
                let p50 = stats.percentile(0.5);
                let _ = writeln!(
                    text,
                    "- decide-allow on {name}: p50 ≤ 2 ms ({model}{}): {} (p99 {}) — {}",
                    rate.map_or_else(String::new, |rate| format!(
                        " at {} req/s",
                        report::rate(rate)
                    )),
                    report::latency(p50),
                    report::latency(stats.percentile(0.99)),
                    verdict(p50.as_secs_f64() <= 0.002)
                );
            }
        }
        if let Some(result) = find(Scenario::DispatchCommit) {
            let rate = result.closed[index].throughput();
            let _ = writeln!(
                text,
                "- dispatch-commit on {name}: ≥ 5,000 durable commits/s (issue 16's goal is for three replicas): {} /s — {}",
                report::rate(rate),
                verdict(rate >= 5_000.0)
            );
        }
        if let Some(result) = find(Scenario::DispatchContended) {
            let rate = result.closed[index].throughput();
            let _ = writeln!(
                text,
                "- dispatch-contended on {name}: {} grants committed/s ({} Dispatches/s, {} racing for each grant; no goal)",
                report::rate(rate / crate::scenarios::RACERS as f64),
                report::rate(rate),
                crate::scenarios::RACERS
            );
        }
    }
    if let Some(durable) = durable {
        for scenario in [Scenario::DispatchCommit, Scenario::DispatchDirect] {
            let Some(result) = find(scenario) else {
                continue;
            };
            let rate = result.closed[durable].throughput();
            let _ = writeln!(
                text,
                "- {}: durable commits ≥ 20,000/s: {} /s — {}",
                scenario.name(),
                report::rate(rate),
                verdict(rate >= 20_000.0)
            );
            if let Some(memory) = memory {
                let ratio = Ratio::of(&result.closed[durable], &result.closed[memory]);
                let _ = writeln!(
                    text,
                    "- {}: durable ≥ 0.5× memory: {} ({} vs {} /s) — {}",
                    scenario.name(),
                    ratio.text(),
                    report::rate(rate),
                    report::rate(result.closed[memory].throughput()),
                    ratio.verdict(0.5)
                );
            }
        }
        let a_write = " (Decide ALLOW of a new call id: a write)";
        for (scenario, what) in [
            (Scenario::DecideAllow, ""),
            (Scenario::DecideAgain, ""),
            (Scenario::DecideSessions, a_write),
            (Scenario::DecideFewSessions, a_write),
        ] {
            if let (Some(memory), Some(result)) = (memory, find(scenario)) {
                let ratio = Ratio::of(&result.closed[durable], &result.closed[memory]);
                let _ = writeln!(
                    text,
                    "- {}{what}: durable ≥ 0.8× memory: {} — {}",
                    scenario.name(),
                    ratio.text(),
                    ratio.verdict(0.8)
                );
            }
        }
        for result in results {
            let p99 = result.open[durable].percentile(0.99);
            let median = result.open[durable].median_round_p99();
            let _ = writeln!(
                text,
                "- {}: durable p99 at half load ({} req/s) ≤ 5 ms: {} over all rounds — {}; {} as the median of the rounds' p99s — {}",
                result.scenario.name(),
                report::rate(result.open_rate),
                report::latency(p99),
                verdict(p99.as_secs_f64() <= 0.005),
                report::latency(median),
                verdict(median.as_secs_f64() <= 0.005),
            );
        }
    }
    // Issue 19's goals against the baseline are the memory store's; another
    // store is judged by them only when it ran alone.
    let against_baseline = memory.or_else(|| kinds.iter().position(|kind| kind.is_toolgate()));
    if let (Some(first), Some(baseline)) = (against_baseline, baseline) {
        let name = kinds[first].name();
        for result in results {
            let ratio = Ratio::of(&result.closed[first], &result.closed[baseline]);
            let p99_ratio = result.open[first].percentile(0.99).as_secs_f64()
                / result.open[baseline]
                    .percentile(0.99)
                    .as_secs_f64()
                    .max(1e-12);
            match result.scenario {
                Scenario::DecideAllow => {
                    let _ = writeln!(
                        text,
                        "- decide-allow throughput ≥ 0.90× baseline ({name}): {} — {}",
                        ratio.text(),
                        ratio.verdict(0.90)
                    );
                    let _ = writeln!(
                        text,
                        "- decide-allow p99 at half of saturation ≤ 1.5× baseline ({name}): {p99_ratio:.2}× — {}",
                        verdict(p99_ratio <= 1.5)
                    );
                }
                Scenario::DispatchCommit => {
                    let _ = writeln!(
                        text,
                        "- dispatch-commit throughput ≥ 0.80× baseline ({name}): {} — {}",
                        ratio.text(),
                        ratio.verdict(0.80)
                    );
                }
                Scenario::ExtAuthzCheck => {
                    let p99 = result.open[first].percentile(0.99);
                    let _ = writeln!(
                        text,
                        "- ext-authz-check throughput ≥ 0.80× baseline ({name}): {} — {}",
                        ratio.text(),
                        ratio.verdict(0.80)
                    );
                    let _ = writeln!(
                        text,
                        "- ext-authz-check p99 at half of saturation ≤ 1 ms ({name}): {:.3} ms — {}",
                        p99.as_secs_f64() * 1000.0,
                        verdict(p99 <= std::time::Duration::from_millis(1))
                    );
                }
                _ => {}
            }
        }
    }
    text
}
