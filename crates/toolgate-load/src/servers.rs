//! Server processes under test: `toolgate serve` (on a durable store in a
//! fresh data directory, or on `--store memory`) and the no-op baseline,
//! each a child process on `127.0.0.1:0` whose port is read from its first
//! stdout line; their resident memory and CPU time from `/proc`, the store's
//! group-commit counters from toolgate's `/metrics`, the "state recovered"
//! line from its log.

use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tonic::transport::{Channel, Endpoint};

use crate::BoxResult;
use crate::callgrind;
use crate::grpc::Connection;

/// Where toolgate keeps its state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Store {
    /// The default: SQLite in a data directory of its own (`--data-dir`),
    /// every answer released after its batch is synced.
    Durable,
    /// `--store memory`: no records kept, no group commit.
    Memory,
    /// `--store postgres://…?schema=bench_…`: one replica on a fresh schema
    /// of the PostgreSQL server of `--postgres`.
    Postgres,
    /// Three `toolgate serve` processes on one fresh schema; the load is
    /// spread over their addresses round-robin.
    Postgres3,
}

impl Store {
    pub fn name(self) -> &'static str {
        match self {
            Store::Durable => "durable",
            Store::Memory => "memory",
            Store::Postgres => "postgres",
            Store::Postgres3 => "postgres×3",
        }
    }

    pub fn from_name(name: &str) -> Option<Store> {
        match name {
            "durable" | "sqlite" => Some(Store::Durable),
            "memory" => Some(Store::Memory),
            "postgres" => Some(Store::Postgres),
            "postgres×3" | "postgres3" | "postgres-3" => Some(Store::Postgres3),
            _ => None,
        }
    }

    /// The `toolgate serve` processes of one server under test.
    pub fn replicas(self) -> usize {
        match self {
            Store::Postgres3 => 3,
            _ => 1,
        }
    }

    pub fn is_postgres(self) -> bool {
        matches!(self, Store::Postgres | Store::Postgres3)
    }
}

/// Which implementation a process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Toolgate(Store),
    Baseline,
}

impl Kind {
    /// "durable", "memory" or "baseline": the label of its rows.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Toolgate(store) => store.name(),
            Kind::Baseline => "baseline",
        }
    }

    pub fn is_toolgate(self) -> bool {
        matches!(self, Kind::Toolgate(_))
    }

    pub fn is_postgres(self) -> bool {
        matches!(self, Kind::Toolgate(store) if store.is_postgres())
    }
}

/// The PostgreSQL server of `--postgres`: its URL (no `schema=`), and its
/// postmaster's pid when it could be found (`SHOW data_directory` through
/// `psql`, then `postmaster.pid`), for the database's CPU time.
#[derive(Debug, Clone)]
pub struct Postgres {
    pub url: String,
    pub postmaster: Option<u32>,
}

impl Postgres {
    pub fn new(url: String) -> Postgres {
        let postmaster = psql(&url, "SHOW data_directory")
            .and_then(|dir| std::fs::read_to_string(Path::new(&dir).join("postmaster.pid")).ok())
            .and_then(|text| {
                text.lines()
                    .next()
                    .and_then(|line| line.trim().parse().ok())
            });
        Postgres { url, postmaster }
    }

    /// The URL of schema `schema`.
    pub fn url_of(&self, schema: &str) -> String {
        let separator = if self.url.contains('?') { '&' } else { '?' };
        format!("{}{separator}schema={schema}", self.url)
    }

    /// The URL without its password, for the tables.
    pub fn display(&self) -> String {
        match (self.url.find("://"), self.url.rfind('@')) {
            (Some(scheme), Some(at)) if at > scheme => {
                let user_info = &self.url[scheme + 3..at];
                let user = user_info.split(':').next().unwrap_or("");
                format!("{}{user}{}", &self.url[..scheme + 3], &self.url[at..])
            }
            _ => self.url.clone(),
        }
    }

    /// The statements of this database so far, from `pg_stat_statements`
    /// (`None` when the extension is not there): every statement executed
    /// (a `batch_execute` of several counts each), the
    /// `pg_advisory_xact_lock`s (one per turn, sent with its `BEGIN` as one
    /// simple query) and the `BEGIN`s (turns and idle catch-ups).
    pub fn statements(&self) -> Option<DatabaseCounters> {
        let text = psql(
            &self.url,
            "SELECT coalesce(sum(calls), 0), \
             coalesce(sum(calls) FILTER (WHERE query ILIKE '%pg_advisory_xact_lock%'), 0), \
             coalesce(sum(calls) FILTER (WHERE query ILIKE 'BEGIN%'), 0) \
             FROM pg_stat_statements \
             WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())",
        )?;
        let mut fields = text.split('|').map(|field| field.trim().parse::<f64>());
        Some(DatabaseCounters {
            statements: fields.next()?.ok()?,
            locks: fields.next()?.ok()?,
            begins: fields.next()?.ok()?,
        })
    }

    /// A setting of the server (`SHOW name`), if `psql` answers.
    pub fn setting(&self, name: &str) -> Option<String> {
        psql(&self.url, &format!("SHOW {name}"))
    }

    /// User + system CPU time of the postmaster and every process it
    /// started (backends, WAL writer, checkpointer, …), those it reaped
    /// included; zero when the postmaster is unknown.
    pub fn cpu_time(&self) -> Duration {
        let Some(postmaster) = self.postmaster else {
            return Duration::ZERO;
        };
        let mut total = Duration::ZERO;
        let Ok(entries) = std::fs::read_dir("/proc") else {
            return total;
        };
        for entry in entries.filter_map(Result::ok) {
            let name = entry.file_name();
            let Some(pid) = name.to_str().and_then(|name| name.parse::<u32>().ok()) else {
                continue;
            };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
                continue;
            };
            let Some(fields) = stat_fields(&stat) else {
                continue;
            };
            let field = |index: usize| -> u64 {
                fields
                    .get(index)
                    .and_then(|value| value.parse().ok())
                    .unwrap_or(0)
            };
            // Field 4 (ppid) is index 1 here; utime, stime, cutime, cstime 11-14.
            if pid == postmaster {
                total += ticks(field(11) + field(12) + field(13) + field(14));
            } else if u32::try_from(field(1)).ok() == Some(postmaster) {
                total += ticks(field(11) + field(12));
            }
        }
        total
    }
}

/// What `pg_stat_statements` counted (see [`Postgres::statements`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct DatabaseCounters {
    pub statements: f64,
    pub locks: f64,
    pub begins: f64,
}

impl DatabaseCounters {
    pub fn since(&self, earlier: &DatabaseCounters) -> DatabaseCounters {
        DatabaseCounters {
            statements: self.statements - earlier.statements,
            locks: self.locks - earlier.locks,
            begins: self.begins - earlier.begins,
        }
    }

    pub fn add(&mut self, other: &DatabaseCounters) {
        self.statements += other.statements;
        self.locks += other.locks;
        self.begins += other.begins;
    }

    /// Round trips: every statement but the lock, which travels with its
    /// `BEGIN`.
    pub fn round_trips(&self) -> f64 {
        self.statements - self.locks
    }
}

/// `psql URL -Atc SQL`'s answer, trimmed; `None` without psql or on an error.
pub fn psql(url: &str, sql: &str) -> Option<String> {
    let output = Command::new("psql")
        .args([url, "-X", "-q", "-At", "-c", sql])
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// How to start the servers.
#[derive(Debug, Clone)]
pub struct Launcher {
    pub toolgate_bin: PathBuf,
    pub load_bin: PathBuf,
    /// `TOKIO_WORKER_THREADS` for both servers; `None` keeps tokio's default
    /// (one worker per CPU).
    pub workers: Option<usize>,
    /// Where the servers' stderr (toolgate's log and audit events) goes.
    pub server_log: Option<PathBuf>,
    /// Where fresh data directories of durable servers are made.
    pub data_root: PathBuf,
    /// The PostgreSQL server of the postgres stores (`--postgres`).
    pub postgres: Option<Postgres>,
    /// The CPUs every server process is pinned to (`taskset -c`), if any.
    pub cpus: Option<&'static str>,
    /// Every server runs under callgrind, its profiles written here
    /// (`--callgrind`).
    pub callgrind: Option<PathBuf>,
}

/// What the "state recovered" line of toolgate's log says.
#[derive(Debug, Clone, Copy, Default)]
pub struct Recovered {
    pub approvals: u64,
    pub receipts: u64,
    pub sessions: u64,
    pub millis: u64,
}

/// One server to start.
#[derive(Debug, Clone)]
pub struct Start<'a> {
    pub kind: Kind,
    pub label: &'a str,
    pub policy: Option<&'a Path>,
    pub workers: Option<usize>,
    /// A durable server's data directory; a fresh one under the launcher's
    /// data root when `None`.
    pub data_dir: Option<PathBuf>,
    /// Log as JSON to a pipe this process reads, for the "state recovered"
    /// line (else the log goes to `--server-log` or nowhere).
    pub watch_log: bool,
}

impl<'a> Start<'a> {
    pub fn new(kind: Kind, label: &'a str) -> Self {
        Start {
            kind,
            label,
            policy: None,
            workers: None,
            data_dir: None,
            watch_log: false,
        }
    }
}

/// A running server; killed when dropped.
#[derive(Debug)]
pub struct ServerProcess {
    pub kind: Kind,
    /// The label it was started with (its callgrind profiles' name).
    pub label: String,
    /// Where its callgrind profiles go, when it runs under callgrind.
    pub callgrind: Option<PathBuf>,
    pub address: String,
    /// Process start to `toolgate listening on` (policy, store opening and
    /// recovery included).
    pub startup: Duration,
    /// toolgate's `/metrics` listener.
    pub metrics_address: Option<String>,
    /// A durable server's data directory.
    pub data_dir: Option<PathBuf>,
    child: Child,
    /// Kept open: the server must not get EPIPE if it prints again.
    _stdout: BufReader<ChildStdout>,
    /// With `watch_log`: the "state recovered" line, once read.
    recovered: Option<mpsc::Receiver<Recovered>>,
    /// The other replicas of a postgres×3 server (same schema), each with
    /// its own address; CPU, RSS and store counters are summed over all.
    replicas: Vec<ServerProcess>,
    /// A postgres server's database and schema, dropped with the server.
    postgres: Option<(Postgres, String)>,
}

impl Launcher {
    pub fn start(
        &self,
        kind: Kind,
        label: &str,
        policy: Option<&Path>,
        workers: Option<usize>,
    ) -> BoxResult<ServerProcess> {
        self.start_with(Start {
            policy,
            workers,
            ..Start::new(kind, label)
        })
    }

    /// A data directory that does not exist yet (toolgate creates it, owner-only).
    pub fn fresh_data_dir(&self, label: &str) -> PathBuf {
        let label: String = label
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
            .collect();
        self.data_root
            .join(format!("data-{label}-{}", uuid::Uuid::new_v4().simple()))
    }

    /// Starts a server; a postgres one on a fresh schema (`bench_…`,
    /// dropped when the server is), as many processes as its replicas.
    pub fn start_with(&self, start: Start<'_>) -> BoxResult<ServerProcess> {
        let store = match start.kind {
            Kind::Toolgate(store) if store.is_postgres() => store,
            _ => return self.spawn(start, None),
        };
        let postgres = self.postgres.clone().ok_or(
            "the postgres stores need a PostgreSQL server: --postgres URL (or TOOLGATE_BENCH_DATABASE_URL)",
        )?;
        let schema = format!("bench_{}", uuid::Uuid::new_v4().simple());
        let url = postgres.url_of(&schema);
        let mut first = self.spawn(start.clone(), Some(&url))?;
        first.postgres = Some((postgres, schema));
        for _ in 1..store.replicas() {
            let replica = self.spawn(start.clone(), Some(&url))?;
            first.replicas.push(replica);
        }
        Ok(first)
    }

    fn spawn(&self, start: Start<'_>, postgres_url: Option<&str>) -> BoxResult<ServerProcess> {
        let Start {
            kind,
            label,
            policy,
            workers,
            data_dir,
            watch_log,
        } = start;
        let mut data_dir_used = None;
        let program = match kind {
            Kind::Toolgate(_) => &self.toolgate_bin,
            Kind::Baseline => &self.load_bin,
        };
        // taskset and valgrind execute the server in their own process: the
        // pid is the server's.
        let mut argv: Vec<std::ffi::OsString> = Vec::new();
        if let Some(cpus) = self.cpus {
            argv.extend(["taskset".into(), "-c".into(), cpus.into()]);
        }
        if let Some(dir) = &self.callgrind {
            argv.push("valgrind".into());
            argv.extend(callgrind::options(dir, label).map(Into::into));
        }
        argv.push(program.into());
        let mut command = Command::new(&argv[0]);
        command.args(&argv[1..]);
        match kind {
            Kind::Toolgate(store) => {
                command.arg("serve");
                if let Some(policy) = policy {
                    command.arg("--config").arg(policy);
                }
                match store {
                    Store::Durable => {
                        let dir = data_dir.unwrap_or_else(|| self.fresh_data_dir(label));
                        command
                            .arg("--store")
                            .arg("sqlite")
                            .arg("--data-dir")
                            .arg(&dir);
                        data_dir_used = Some(dir);
                    }
                    Store::Memory => {
                        command.args(["--store", "memory"]);
                    }
                    Store::Postgres | Store::Postgres3 => {
                        let url = postgres_url.ok_or("a postgres server without a URL")?;
                        command.arg("--store").arg(url).arg("--migrate");
                    }
                }
                command.args(["--metrics-listen", "127.0.0.1:0"]);
                if watch_log {
                    command.args(["--log-format", "json"]);
                }
            }
            Kind::Baseline => {
                command.arg("baseline-server");
            }
        }
        command.args(["--listen", "127.0.0.1:0"]);
        command.env_remove("TOOLGATE_DATA_DIR");
        match workers.or(self.workers) {
            Some(workers) => command.env("TOKIO_WORKER_THREADS", workers.to_string()),
            None => command.env_remove("TOKIO_WORKER_THREADS"),
        };
        let log_file = match &self.server_log {
            Some(path) => Some(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?,
            ),
            None => None,
        };
        let stderr = match (&log_file, watch_log) {
            (_, true) => Stdio::piped(),
            (Some(file), false) => Stdio::from(file.try_clone()?),
            (None, false) => Stdio::null(),
        };
        let started = Instant::now();
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .map_err(|error| format!("cannot start {}: {error}", kind.name()))?;
        let recovered = match child.stderr.take() {
            Some(stderr) if watch_log => Some(watch(stderr, log_file)),
            _ => None,
        };
        let Some(stdout) = child.stdout.take() else {
            return Err("child has no stdout".into());
        };
        let mut stdout = BufReader::new(stdout);
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        let startup = started.elapsed();
        let Some(address) = line.trim().strip_prefix("toolgate listening on ") else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "{label}: expected `toolgate listening on ADDR`, got {line:?} (see --server-log)"
            )
            .into());
        };
        let address = address.to_string();
        let mut metrics_address = None;
        if kind.is_toolgate() {
            line.clear();
            stdout.read_line(&mut line)?;
            metrics_address = line
                .trim()
                .strip_prefix("toolgate metrics on ")
                .map(str::to_string);
        }
        Ok(ServerProcess {
            kind,
            label: label.to_string(),
            callgrind: self.callgrind.clone(),
            address,
            startup,
            metrics_address,
            data_dir: data_dir_used,
            child,
            _stdout: stdout,
            recovered,
            replicas: Vec::new(),
            postgres: None,
        })
    }
}

/// Reads a JSON log from `stderr` until it ends (so the server never blocks
/// on a full pipe), copying it to `log_file`; sends the "state recovered"
/// line's fields.
fn watch(
    stderr: std::process::ChildStderr,
    mut log_file: Option<std::fs::File>,
) -> mpsc::Receiver<Recovered> {
    let (sender, receiver) = mpsc::channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stderr);
        let mut line = String::new();
        while matches!(reader.read_line(&mut line), Ok(read) if read > 0) {
            if let Some(file) = &mut log_file {
                let _ = file.write_all(line.as_bytes());
            }
            if line.contains("state recovered")
                && let Ok(event) = serde_json::from_str::<serde_json::Value>(&line)
                && event["message"] == "state recovered"
            {
                let field = |name: &str| event[name].as_u64().unwrap_or(0);
                let _ = sender.send(Recovered {
                    approvals: field("approvals"),
                    receipts: field("receipts"),
                    sessions: field("sessions"),
                    millis: field("millis"),
                });
            }
            line.clear();
        }
    });
    receiver
}

impl ServerProcess {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The processes of this server: itself and its other replicas.
    fn processes(&self) -> impl Iterator<Item = &ServerProcess> {
        std::iter::once(self).chain(&self.replicas)
    }

    /// Whether the process (or any replica) has ended (a zombie not yet
    /// reaped, or gone): a round against it would only count connection
    /// errors.
    pub fn exited(&self) -> bool {
        self.processes().any(ServerProcess::exited_alone)
    }

    fn exited_alone(&self) -> bool {
        std::fs::read_to_string(format!("/proc/{}/stat", self.pid()))
            .ok()
            .and_then(|stat| {
                let after_name = stat.get(stat.rfind(')')? + 2..)?;
                after_name.chars().next()
            })
            .is_none_or(|state| state == 'Z' || state == 'X')
    }

    /// Resident set size in bytes (`VmRSS`).
    pub fn rss_bytes(&self) -> u64 {
        self.processes()
            .map(|process| rss_bytes(process.pid()).unwrap_or(0))
            .sum()
    }

    /// User + system CPU time consumed so far (all replicas).
    pub fn cpu_time(&self) -> Duration {
        self.processes()
            .map(|process| cpu_time(&format!("/proc/{}/stat", process.pid())).unwrap_or_default())
            .sum()
    }

    /// The CPU time of the PostgreSQL server under a postgres server (all
    /// of its processes, whoever they serve); zero for the other kinds.
    pub fn database_cpu_time(&self) -> Duration {
        self.postgres
            .as_ref()
            .map_or(Duration::ZERO, |(postgres, _)| postgres.cpu_time())
    }

    /// `pg_stat_statements`' counts now (postgres servers with the
    /// extension; `None` otherwise).
    pub fn database_statements(&self) -> Option<DatabaseCounters> {
        self.postgres
            .as_ref()
            .and_then(|(postgres, _)| postgres.statements())
    }

    /// The schema of a postgres server.
    pub fn schema(&self) -> Option<&str> {
        self.postgres.as_ref().map(|(_, schema)| schema.as_str())
    }

    /// The "state recovered" line (started with `watch_log`); it is logged
    /// before `toolgate listening on` but may reach the pipe after it.
    pub fn recovered(&self) -> BoxResult<Recovered> {
        let Some(receiver) = &self.recovered else {
            return Err("the server was not started with watch_log".into());
        };
        receiver
            .recv_timeout(Duration::from_secs(30))
            .map_err(|_| "no \"state recovered\" line in the server's log".into())
    }

    /// The store's group-commit counters now (toolgate only; zero for the
    /// baseline or when the endpoint does not answer).
    pub fn store_counters(&self) -> StoreCounters {
        let mut total = StoreCounters::default();
        for process in self.processes() {
            let counters = process
                .metrics_address
                .as_deref()
                .and_then(|address| scrape(address).ok())
                .map(|text| StoreCounters::parse(&text))
                .unwrap_or_default();
            total.add(&counters);
        }
        total
    }

    /// Bytes of the files in the data directory (apparent sizes).
    pub fn data_dir_bytes(&self) -> u64 {
        self.data_dir.as_deref().map_or(0, dir_bytes)
    }

    /// SIGTERM (the server drains, commits what is pending and closes the
    /// store), then waits for the exit; how long that took.
    pub fn terminate(mut self) -> BoxResult<Duration> {
        let started = Instant::now();
        let status = Command::new("kill")
            .arg("-TERM")
            .arg(self.pid().to_string())
            .status()?;
        if !status.success() {
            return Err(format!("kill -TERM {} failed", self.pid()).into());
        }
        let exit = self.child.wait()?;
        let took = started.elapsed();
        if !exit.success() {
            return Err(format!(
                "{} exited with {exit} after SIGTERM (killed by it: the signal came before toolgate listened for it?)",
                self.kind.name()
            )
            .into());
        }
        Ok(took)
    }

    /// `connections` HTTP/2 connections (one tonic `Channel` each) for the
    /// setup calls; with replicas, rounded up to a multiple of them and
    /// spread round-robin (connection `i` to replica `i % replicas`).
    pub async fn connect(&self, connections: usize) -> BoxResult<Vec<Channel>> {
        let addresses = self.spread(connections);
        let mut channels = Vec::with_capacity(addresses.len());
        for address in addresses {
            let channel = Endpoint::from_shared(format!("http://{address}"))?
                .tcp_nodelay(true)
                .connect()
                .await?;
            channels.push(channel);
        }
        Ok(channels)
    }

    /// `connections` HTTP/2 connections of the lean client (`grpc`) that
    /// the measured calls go through, spread over the replicas as
    /// `connect`'s are, so that the callers and the open loop's requests,
    /// which take the connections in turn, are spread so too.
    pub async fn open_connections(&self, connections: usize) -> BoxResult<Vec<Connection>> {
        let addresses = self.spread(connections);
        let mut opened = Vec::with_capacity(addresses.len());
        for address in addresses {
            opened.push(Connection::open(address).await?);
        }
        Ok(opened)
    }

    /// The address of each of `connections` connections: rounded up to a
    /// multiple of the processes, connection `i` to process `i % processes`.
    fn spread(&self, connections: usize) -> Vec<&str> {
        let addresses: Vec<&str> = self
            .processes()
            .map(|process| process.address.as_str())
            .collect();
        let connections = connections.max(1).div_ceil(addresses.len()) * addresses.len();
        (0..connections)
            .map(|index| addresses[index % addresses.len()])
            .collect()
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        self.replicas.clear();
        if let Some((postgres, schema)) = &self.postgres {
            // Left behind (and named on stderr) when psql is missing or fails.
            if psql(&postgres.url, &format!("DROP SCHEMA {schema} CASCADE")).is_none() {
                eprintln!("toolgate-load: could not drop schema {schema} (psql); drop it by hand");
            }
        }
    }
}

/// Sum of the apparent sizes of the files in `dir` (not recursive: the
/// data directory holds the database, its WAL and shared-memory files and
/// the lock file).
pub fn dir_bytes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter_map(|entry| entry.metadata().ok())
                .filter(std::fs::Metadata::is_file)
                .map(|metadata| metadata.len())
                .sum()
        })
        .unwrap_or(0)
}

/// `GET /metrics` over HTTP/1.0 (loopback, once per round: no client
/// library needed).
fn scrape(address: &str) -> std::io::Result<String> {
    let mut stream = std::net::TcpStream::connect(address)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    stream.write_all(b"GET /metrics HTTP/1.0\r\nHost: toolgate\r\n\r\n")?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    Ok(text)
}

/// The store's counters from `/metrics`: `toolgate_store_batch_operations`
/// (operations per group commit) and `toolgate_store_sync_seconds` (the
/// transaction and its sync), as sums, counts and cumulative buckets.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct StoreCounters {
    pub batches: f64,
    pub operations: f64,
    pub syncs: f64,
    pub sync_seconds: f64,
    /// `(le, cumulative count)` of the sync histogram, in bucket order.
    pub sync_buckets: Vec<(f64, f64)>,
    pub store_bytes: f64,
    /// Decide and Dispatch answers (`toolgate_decisions_total`,
    /// `toolgate_dispatches_total`, every label).
    pub rpcs: f64,
}

impl StoreCounters {
    pub fn parse(text: &str) -> StoreCounters {
        let mut counters = StoreCounters::default();
        for line in text.lines() {
            let Some((name, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Ok(value) = value.trim().parse::<f64>() else {
                continue;
            };
            match name {
                "toolgate_store_batch_operations_count" => counters.batches = value,
                "toolgate_store_batch_operations_sum" => counters.operations = value,
                "toolgate_store_sync_seconds_count" => counters.syncs = value,
                "toolgate_store_sync_seconds_sum" => counters.sync_seconds = value,
                "toolgate_store_bytes" => counters.store_bytes = value,
                _ if ["toolgate_decisions_total", "toolgate_dispatches_total"]
                    .iter()
                    .any(|metric| {
                        name.strip_prefix(metric)
                            .is_some_and(|rest| rest.is_empty() || rest.starts_with('{'))
                    }) =>
                {
                    counters.rpcs += value;
                }
                _ => {
                    if let Some(le) = name
                        .strip_prefix("toolgate_store_sync_seconds_bucket{le=\"")
                        .and_then(|rest| rest.strip_suffix("\"}"))
                    {
                        let le = if le == "+Inf" {
                            f64::INFINITY
                        } else {
                            le.parse().unwrap_or(f64::INFINITY)
                        };
                        counters.sync_buckets.push((le, value));
                    }
                }
            }
        }
        counters
    }

    /// What happened between `earlier` and `self`.
    pub fn since(&self, earlier: &StoreCounters) -> StoreCounters {
        StoreCounters {
            batches: self.batches - earlier.batches,
            operations: self.operations - earlier.operations,
            syncs: self.syncs - earlier.syncs,
            sync_seconds: self.sync_seconds - earlier.sync_seconds,
            sync_buckets: self
                .sync_buckets
                .iter()
                .map(|(le, count)| {
                    let before = earlier
                        .sync_buckets
                        .iter()
                        .find(|(other, _)| other == le)
                        .map_or(0.0, |(_, count)| *count);
                    (*le, count - before)
                })
                .collect(),
            store_bytes: self.store_bytes,
            rpcs: self.rpcs - earlier.rpcs,
        }
    }

    /// Adds the deltas of another round.
    pub fn add(&mut self, other: &StoreCounters) {
        self.batches += other.batches;
        self.operations += other.operations;
        self.syncs += other.syncs;
        self.sync_seconds += other.sync_seconds;
        if self.sync_buckets.is_empty() {
            self.sync_buckets.clone_from(&other.sync_buckets);
        } else {
            for ((_, mine), (_, theirs)) in self.sync_buckets.iter_mut().zip(&other.sync_buckets) {
                *mine += theirs;
            }
        }
        self.store_bytes = self.store_bytes.max(other.store_bytes);
        self.rpcs += other.rpcs;
    }

    /// Operations per batch (group commit), on average.
    pub fn operations_per_batch(&self) -> Option<f64> {
        (self.batches > 0.0).then(|| self.operations / self.batches)
    }

    /// The mean time of a batch's transaction and sync.
    pub fn mean_sync(&self) -> Option<Duration> {
        (self.syncs > 0.0).then(|| Duration::from_secs_f64(self.sync_seconds / self.syncs))
    }

    /// The upper bound of the histogram bucket that holds quantile `q` of
    /// the syncs (the buckets are coarse: 1, 2.5, 5, 10 ms, ...).
    pub fn sync_quantile_bound(&self, quantile: f64) -> Option<Duration> {
        let total = self.sync_buckets.last().map(|(_, count)| *count)?;
        if total <= 0.0 {
            return None;
        }
        self.sync_buckets
            .iter()
            .find(|(_, count)| *count >= total * quantile)
            .filter(|(le, _)| le.is_finite())
            .map(|(le, _)| Duration::from_secs_f64(*le))
    }
}

fn rss_bytes(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|line| line.starts_with("VmRSS:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// Clock ticks per second of `/proc/*/stat` times (`getconf CLK_TCK`).
fn clock_ticks() -> u64 {
    static TICKS: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *TICKS.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|output| String::from_utf8(output.stdout).ok())
            .and_then(|text| text.trim().parse().ok())
            .unwrap_or(100)
    })
}

/// utime + stime of a process (`/proc/PID/stat` or `/proc/self/stat`).
pub fn cpu_time(stat_path: &str) -> Option<Duration> {
    let stat = std::fs::read_to_string(stat_path).ok()?;
    let fields = stat_fields(&stat)?;
    // Fields 14 and 15 of stat(5), counted from `state` (field 3) here.
    let user: u64 = fields.get(11)?.parse().ok()?;
    let system: u64 = fields.get(12)?.parse().ok()?;
    Some(ticks(user + system))
}

/// The fields of a `/proc/PID/stat` line after the command name (which may
/// hold spaces), from `state` (field 3 of stat(5)) on.
fn stat_fields(stat: &str) -> Option<Vec<&str>> {
    let after_name = stat.get(stat.rfind(')')? + 2..)?;
    Some(after_name.split_whitespace().collect())
}

/// Clock ticks as a duration.
fn ticks(count: u64) -> Duration {
    Duration::from_nanos(count.saturating_mul(1_000_000_000) / clock_ticks())
}

/// The CPU time of this process (the load generator).
pub fn own_cpu_time() -> Duration {
    cpu_time("/proc/self/stat").unwrap_or_default()
}

/// CPU time all CPUs spent busy since boot (`/proc/stat`: everything but
/// idle and iowait; steal included, as time this machine did not get).
pub fn machine_busy() -> Duration {
    let Ok(stat) = std::fs::read_to_string("/proc/stat") else {
        return Duration::ZERO;
    };
    let Some(line) = stat.lines().find(|line| line.starts_with("cpu ")) else {
        return Duration::ZERO;
    };
    let fields: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|field| field.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal (guest time is in user).
    let busy: u64 = fields
        .iter()
        .take(8)
        .enumerate()
        .filter(|(index, _)| *index != 3 && *index != 4)
        .map(|(_, ticks)| ticks)
        .sum();
    Duration::from_nanos(busy.saturating_mul(1_000_000_000) / clock_ticks())
}
