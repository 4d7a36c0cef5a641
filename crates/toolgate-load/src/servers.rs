//! Server processes under test: `toolgate serve` and the no-op baseline,
//! each a child process on `127.0.0.1:0` whose port is read from its first
//! stdout line; their resident memory and CPU time from `/proc`.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use tonic::transport::{Channel, Endpoint};

use crate::BoxResult;

/// Which implementation a process runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Toolgate,
    Baseline,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Toolgate => "toolgate",
            Kind::Baseline => "baseline",
        }
    }
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
}

/// A running server; killed when dropped.
#[derive(Debug)]
pub struct ServerProcess {
    pub kind: Kind,
    pub address: String,
    pub startup: Duration,
    child: Child,
    /// Kept open: the server must not get EPIPE if it prints again.
    _stdout: BufReader<ChildStdout>,
}

impl Launcher {
    pub fn start(
        &self,
        kind: Kind,
        label: &str,
        policy: Option<&Path>,
        workers: Option<usize>,
    ) -> BoxResult<ServerProcess> {
        let mut command = match kind {
            Kind::Toolgate => {
                let mut command = Command::new(&self.toolgate_bin);
                command.arg("serve");
                if let Some(policy) = policy {
                    command.arg("--config").arg(policy);
                }
                command
            }
            Kind::Baseline => {
                let mut command = Command::new(&self.load_bin);
                command.arg("baseline-server");
                command
            }
        };
        command.args(["--listen", "127.0.0.1:0"]);
        match workers.or(self.workers) {
            Some(workers) => command.env("TOKIO_WORKER_THREADS", workers.to_string()),
            None => command.env_remove("TOKIO_WORKER_THREADS"),
        };
        let stderr = match &self.server_log {
            Some(path) => Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)?,
            ),
            None => Stdio::null(),
        };
        let started = Instant::now();
        let mut child = command
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .map_err(|error| format!("cannot start {}: {error}", kind.name()))?;
        let Some(stdout) = child.stdout.take() else {
            return Err("child has no stdout".into());
        };
        let mut stdout = BufReader::new(stdout);
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        let Some(address) = line.trim().strip_prefix("toolgate listening on ") else {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!(
                "{label}: expected `toolgate listening on ADDR`, got {line:?} (see --server-log)"
            )
            .into());
        };
        Ok(ServerProcess {
            kind,
            address: address.to_string(),
            startup: started.elapsed(),
            child,
            _stdout: stdout,
        })
    }
}

impl ServerProcess {
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident set size in bytes (`VmRSS`).
    pub fn rss_bytes(&self) -> u64 {
        rss_bytes(self.pid()).unwrap_or(0)
    }

    /// User + system CPU time consumed so far.
    pub fn cpu_time(&self) -> Duration {
        cpu_time(&format!("/proc/{}/stat", self.pid())).unwrap_or_default()
    }

    /// `connections` HTTP/2 connections (one tonic `Channel` each).
    pub async fn connect(&self, connections: usize) -> BoxResult<Vec<Channel>> {
        let mut channels = Vec::with_capacity(connections);
        for _ in 0..connections.max(1) {
            let channel = Endpoint::from_shared(format!("http://{}", self.address))?
                .tcp_nodelay(true)
                .connect()
                .await?;
            channels.push(channel);
        }
        Ok(channels)
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
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
    // The command name may hold spaces; the fields after it are fixed.
    let after_name = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    // Fields 14 and 15 of stat(5), counted from `state` (field 3) here.
    let user: u64 = fields.get(11)?.parse().ok()?;
    let system: u64 = fields.get(12)?.parse().ok()?;
    let ticks = clock_ticks();
    Some(Duration::from_nanos(
        (user + system).saturating_mul(1_000_000_000) / ticks,
    ))
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
