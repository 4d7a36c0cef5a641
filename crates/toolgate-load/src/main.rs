//! `toolgate-load`: the load generator of toolgate's benchmarks
//! (BENCHMARKS.md).
//!
//! - `toolgate-load baseline-server --listen ADDR` serves the no-op
//!   `PolicyDecisionPoint` (fixed answers): the ceiling for any gRPC PDP.
//! - `toolgate-load run` starts `toolgate serve` twice — on the durable
//!   store in a fresh data directory and on `--store memory` — and the
//!   baseline, as child processes on `127.0.0.1:0`, drives all three over
//!   real gRPC (several HTTP/2 connections, closed and open loop,
//!   alternating rounds), and prints markdown tables: requests/s, latency
//!   percentiles, errors by gRPC code, RSS, the store's operations per group
//!   commit, and the durable/memory, durable/baseline and memory/baseline
//!   ratios; then the scaling figures (commit callers, memory per session
//!   and per pending approval, policy size, worker threads) and recovery
//!   (bytes on disk per approval and per receipt, restart time).
//! - `toolgate-load recovery`: the recovery figures alone (`run --scenario
//!   recovery`).
//!
//! # Layout
//! - `policies`: the generated policy files and the 20-tool manifest.
//! - `servers`: child processes, their ports, RSS and CPU time.
//! - `baseline`: the no-op server.
//! - `grpc`: the lean gRPC client (on h2) the measured calls go through.
//! - `load`: closed and open loop, and what a round measures.
//! - `scenarios`: each scenario's requests and setup.
//! - `run`: the throughput scenarios, alternating toolgate and baseline.
//! - `scaling`: commit callers, memory, tool count, worker threads.
//! - `recovery`: bytes on disk and restart time of a filled durable store.
//! - `report`: markdown tables.
//! - `callgrind`: `run --callgrind`, instructions per request under valgrind.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};

mod baseline;
mod callgrind;
mod grpc;
mod load;
mod policies;
mod recovery;
mod report;
mod run;
mod scaling;
mod scenarios;
mod servers;

pub type BoxResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

#[derive(Debug, Parser)]
#[command(
    name = "toolgate-load",
    about = "Load generator for toolgate's benchmarks"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve the no-op PolicyDecisionPoint and Authorization (fixed answers).
    BaselineServer {
        #[arg(long, default_value = "127.0.0.1:50052")]
        listen: SocketAddr,
        /// Tokio worker threads (default: TOKIO_WORKER_THREADS, else one per CPU).
        #[arg(long)]
        workers: Option<usize>,
    },
    /// Run scenarios against toolgate and the baseline and print the tables.
    Run(RunArgs),
    /// Fill a durable toolgate with approvals and receipts, restart it on
    /// the same data directory, and print the bytes on disk and the
    /// recovery time (`run --scenario recovery`).
    Recovery(RunArgs),
}

/// Options of `run`.
#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Comma-separated: all, throughput (every load scenario), scaling
    /// (callers, memory, tools, workers), or names: decide-allow,
    /// decide-pending, decide-1000-sessions, decide-10-sessions,
    /// decide-again-1000-sessions, dispatch-replay, dispatch-commit,
    /// dispatch-contended, dispatch-commit-direct, assess-manifest, mixed,
    /// ext-authz-check, callers, memory, tools, workers, recovery.
    #[arg(long, default_value = "all")]
    pub scenario: String,
    /// The stores toolgate is run on, comma-separated: durable (SQLite in a
    /// fresh data directory, the default of `toolgate serve`) and/or memory
    /// (`--store memory`). The first one is the server the open-loop rate
    /// is taken from and the scaling figures run on.
    #[arg(long, default_value = "durable,memory")]
    pub stores: String,
    /// A PostgreSQL database (`postgres://USER:PW@HOST:PORT/DB`, no
    /// `schema=`; default: the environment's TOOLGATE_BENCH_DATABASE_URL):
    /// adds the stores `postgres` (one replica) and `postgres×3` (three
    /// `toolgate serve` on one schema, the load spread over them) to
    /// `--stores` unless it names one of them. Each runs on a fresh schema
    /// `bench_<random>`, dropped (with `psql`) when its servers stop.
    #[arg(long)]
    pub postgres: Option<String>,
    /// Where the durable servers' data directories are made (default: the
    /// run's temporary directory). Must be on the file system a deployment
    /// would use: a tmpfs makes every sync free.
    #[arg(long)]
    pub data_root: Option<PathBuf>,
    /// Measured seconds per round.
    #[arg(long, default_value_t = 4.0)]
    pub duration: f64,
    /// Unmeasured warm-up seconds at the start of every round.
    #[arg(long, default_value_t = 0.5)]
    pub warmup: f64,
    /// Rounds per server and load model, alternating toolgate and baseline.
    #[arg(long, default_value_t = 3)]
    pub alternations: usize,
    /// HTTP/2 connections per server that the measured calls are spread
    /// over (and as many tonic Channels for the setup calls).
    #[arg(long, default_value_t = 4)]
    pub connections: usize,
    /// Closed-loop concurrent callers.
    #[arg(long, default_value_t = 256)]
    pub concurrency: usize,
    /// Closed-loop callers compared in the commit-callers figure,
    /// comma-separated.
    #[arg(long, default_value = "64,256,1024")]
    pub caller_counts: String,
    /// Open-loop rate in requests/s for every scenario (default: a fraction
    /// of toolgate's closed-loop throughput in the same scenario).
    #[arg(long)]
    pub rate: Option<f64>,
    /// The open-loop rate as a fraction of toolgate's closed-loop throughput.
    #[arg(long, default_value_t = 0.5)]
    pub open_fraction: f64,
    /// The open loop's scheduler sleeps at least this many microseconds
    /// between two wake-ups and sends what fell due meanwhile together: a
    /// cheaper load generator, at the price of up to this much lag, which
    /// the latencies include (0: each request on its own time).
    #[arg(long, default_value_t = 0)]
    pub open_tick: u64,
    /// Tokio worker threads of both servers (TOKIO_WORKER_THREADS; default:
    /// tokio's, one per CPU).
    #[arg(long)]
    pub workers: Option<usize>,
    /// Tokio worker threads of the load generator itself.
    #[arg(long, default_value_t = 2)]
    pub client_threads: usize,
    /// Pre-granted proposals per closed-loop dispatch-commit round (also the
    /// number of resources in the bench policy).
    #[arg(long, default_value_t = 80_000)]
    pub commit_pool: usize,
    /// Sessions and pending approvals created for the memory figures.
    #[arg(long, default_value_t = 100_000)]
    pub memory_count: usize,
    /// Approvals, receipts and decisions each filled into the durable store
    /// for the recovery figures.
    #[arg(long, default_value_t = 100_000)]
    pub recovery_count: usize,
    /// Restarts of the filled store timed for the recovery figures.
    #[arg(long, default_value_t = 3)]
    pub restarts: usize,
    /// Policy sizes (tools) for the tool-count figures, comma-separated.
    #[arg(long, default_value = "10,1000,10000")]
    pub tool_counts: String,
    /// Worker-thread counts compared in the workers figures, comma-separated.
    #[arg(long, default_value = "1,2")]
    pub worker_counts: String,
    /// The toolgate binary (default: `toolgate` next to this one, so
    /// target/release/toolgate for target/release/toolgate-load).
    #[arg(long)]
    pub toolgate_bin: Option<PathBuf>,
    /// Append the servers' stderr (logs, audit events) to this file
    /// (default: discarded; the audit events are still formatted).
    #[arg(long)]
    pub server_log: Option<PathBuf>,
    /// A round during which other processes used more than this many cores
    /// (from /proc/stat) is run again (up to 3 times); rounds also wait for
    /// the machine to be this idle before they start.
    #[arg(long, default_value_t = 0.15)]
    pub max_foreign_load: f64,
    /// Longest wait for an idle machine before a round, in seconds.
    #[arg(long, default_value_t = 120.0)]
    pub quiet_wait: f64,
    /// A smoke run: short rounds, one alternation, small pools.
    #[arg(long)]
    pub quick: bool,
    /// Pin the load generator to CPU 0 and every server process to CPU 1
    /// (`taskset`), so that on a 2-core machine each server is bound by a
    /// core of its own, not by the load generator beside it; servers get
    /// one tokio worker unless --workers says. PostgreSQL is not pinned.
    #[arg(long)]
    pub pin_cores: bool,
    /// Run every server under valgrind's callgrind and count the
    /// instructions it executes per request in the closed-loop rounds'
    /// measured windows (a figure the machine's drifting speed does not
    /// move); the profiles go to this directory. Servers run some 50 times
    /// slower there: give rounds 10 s and a warm-up of 10 s, one
    /// alternation.
    #[arg(long)]
    pub callgrind: Option<PathBuf>,
}

impl RunArgs {
    pub fn duration(&self) -> Duration {
        Duration::from_secs_f64(self.duration.max(0.1))
    }

    pub fn warmup(&self) -> Duration {
        Duration::from_secs_f64(self.warmup.max(0.0))
    }

    /// `--postgres`, else TOOLGATE_BENCH_DATABASE_URL.
    pub fn postgres_url(&self) -> Option<String> {
        self.postgres
            .clone()
            .or_else(|| std::env::var("TOOLGATE_BENCH_DATABASE_URL").ok())
            .filter(|url| !url.trim().is_empty())
    }

    /// The stores of `--stores`, in order, each once; with a PostgreSQL
    /// URL and no postgres store named, postgres and postgres×3 appended.
    pub fn stores(&self) -> BoxResult<Vec<servers::Store>> {
        let mut stores = Vec::new();
        for name in self
            .stores
            .split(',')
            .map(str::trim)
            .filter(|name| !name.is_empty())
        {
            let store = servers::Store::from_name(name).ok_or_else(|| {
                format!("unknown store {name:?} (durable, memory, postgres, postgres×3)")
            })?;
            if !stores.contains(&store) {
                stores.push(store);
            }
        }
        let postgres_named = stores.iter().any(|store| store.is_postgres());
        if self.postgres_url().is_some() {
            if !postgres_named {
                stores.extend([servers::Store::Postgres, servers::Store::Postgres3]);
            }
        } else if postgres_named {
            return Err(
                "the postgres stores need --postgres URL (or TOOLGATE_BENCH_DATABASE_URL)".into(),
            );
        }
        if stores.is_empty() {
            return Err("--stores names no store".into());
        }
        Ok(stores)
    }

    /// The store the scaling figures run toolgate on: the first of `--stores`.
    pub fn scaling_store(&self) -> servers::Store {
        self.stores()
            .ok()
            .and_then(|stores| stores.first().copied())
            .unwrap_or(servers::Store::Durable)
    }

    pub fn quiet_wait(&self) -> Duration {
        Duration::from_secs_f64(self.quiet_wait.max(0.0))
    }

    fn apply_quick(&mut self) {
        if self.quick {
            self.duration = self.duration.min(1.0);
            self.warmup = self.warmup.min(0.2);
            self.alternations = 1;
            self.commit_pool = self.commit_pool.min(20_000);
            self.memory_count = self.memory_count.min(10_000);
            self.recovery_count = self.recovery_count.min(10_000);
            self.restarts = self.restarts.min(1);
        }
    }
}

/// The allocator toolgate uses, for the baseline server and the load alike.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::BaselineServer { listen, workers } => baseline::run(listen, workers),
        Command::Run(mut args) => {
            args.apply_quick();
            run::run(args)
        }
        Command::Recovery(mut args) => {
            args.apply_quick();
            args.scenario = "recovery".into();
            run::run(args)
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("toolgate-load: {error}");
            ExitCode::FAILURE
        }
    }
}
