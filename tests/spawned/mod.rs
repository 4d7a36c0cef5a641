//! A `toolgate serve` process of its own, for tests that measure what only
//! a separate process shows: its resident set, its log sink.
#![allow(dead_code)] // each test crate uses a different part

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, Command, Stdio};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic_health::pb::health_check_response::ServingStatus;

pub const HOST: &str = "host-secret";

fn repo_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

pub struct Spawned {
    pub child: Child,
    pub addr: SocketAddr,
    pub metrics_addr: SocketAddr,
    pub stderr: Option<ChildStderr>,
    pub directory: tempfile::TempDir,
}

/// `tests/fixtures/decide.toml` plus `extra` (a `[server]` section, say),
/// with its manifest paths made absolute so that it can live elsewhere.
pub fn decide_policy_text(extra: &str) -> String {
    let examples = repo_path("examples");
    let text = std::fs::read_to_string(repo_path("tests/fixtures/decide.toml"))
        .expect("fixture")
        .replace("../../examples", &examples.display().to_string());
    format!("{text}\n{extra}\n")
}

impl Spawned {
    /// Starts `toolgate serve` on `policy_text` with `args`; stderr is piped
    /// (and left to the test) when `pipe_stderr`, discarded otherwise.
    pub fn start(policy_text: &str, args: &[&str], pipe_stderr: bool) -> Spawned {
        Spawned::start_with(policy_text, args, pipe_stderr, None)
    }

    /// As [`Spawned::start`], with a descriptor limit (`ulimit -n`).
    pub fn start_with(
        policy_text: &str,
        args: &[&str],
        pipe_stderr: bool,
        descriptors: Option<u32>,
    ) -> Spawned {
        let directory = tempfile::tempdir().expect("temp dir");
        let config = directory.path().join("policy.toml");
        std::fs::write(&config, policy_text).expect("write policy");
        let binary = env!("CARGO_BIN_EXE_toolgate");
        let mut command = match descriptors {
            None => Command::new(binary),
            Some(limit) => {
                let mut shell = Command::new("sh");
                shell
                    .arg("-c")
                    .arg(format!("ulimit -n {limit} && exec \"$0\" \"$@\""))
                    .arg(binary);
                shell
            }
        };
        command
            .args(["serve", "--listen", "127.0.0.1:0"])
            .args(["--metrics-listen", "127.0.0.1:0", "--config"])
            .arg(&config)
            .args(args)
            .stdout(Stdio::piped())
            .stderr(match pipe_stderr {
                true => Stdio::piped(),
                false => Stdio::null(),
            });
        let mut child = command.spawn().expect("start toolgate");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout"));
        let mut address = |prefix: &str| -> SocketAddr {
            let mut line = String::new();
            lines.read_line(&mut line).expect("a line on stdout");
            assert!(line.starts_with(prefix), "{line:?}");
            line.trim()
                .rsplit(' ')
                .next()
                .expect("address")
                .parse()
                .expect("socket address")
        };
        let addr = address("toolgate listening on");
        let metrics_addr = address("toolgate metrics on");
        let stderr = child.stderr.take();
        Spawned {
            child,
            addr,
            metrics_addr,
            stderr,
            directory,
        }
    }

    /// The process's resident set, from /proc/PID/status.
    pub fn rss_bytes(&self) -> u64 {
        let path = format!("/proc/{}/status", self.child.id());
        let status = std::fs::read_to_string(path).expect("/proc/PID/status");
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

    /// The process's CPU time so far (user + system), in clock ticks.
    pub fn cpu_ticks(&self) -> u64 {
        let path = format!("/proc/{}/stat", self.child.id());
        let stat = std::fs::read_to_string(path).expect("/proc/PID/stat");
        let after_name = stat.rsplit_once(')').expect("stat").1;
        let fields: Vec<&str> = after_name.split_whitespace().collect();
        fields[11].parse::<u64>().expect("utime") + fields[12].parse::<u64>().expect("stime")
    }

    pub async fn channel(&self) -> tonic::transport::Channel {
        tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr))
            .expect("endpoint")
            .connect()
            .await
            .expect("connect")
    }

    /// Overall health, asked on a new connection.
    pub async fn health(&self) -> ServingStatus {
        tonic_health::pb::health_client::HealthClient::new(self.channel().await)
            .check(tonic_health::pb::HealthCheckRequest {
                service: String::new(),
            })
            .await
            .expect("health")
            .into_inner()
            .status()
    }

    /// GET /metrics: the samples by `name{labels}`.
    pub async fn metrics(&self) -> HashMap<String, f64> {
        let mut stream = TcpStream::connect(self.metrics_addr)
            .await
            .expect("connect metrics");
        stream
            .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
            .await
            .expect("request");
        let mut response = String::new();
        stream
            .read_to_string(&mut response)
            .await
            .expect("response");
        let (_, body) = response.split_once("\r\n\r\n").expect("http response");
        body.lines()
            .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
            .filter_map(|line| {
                let (series, value) = line.rsplit_once(' ')?;
                Some((series.to_string(), value.parse().ok()?))
            })
            .collect()
    }

    pub async fn metric(&self, series: &str) -> f64 {
        self.metrics().await.get(series).copied().unwrap_or(0.0)
    }

    /// SIGTERM, then the exit code.
    pub fn stop(mut self) -> Option<i32> {
        let status = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
        self.child.wait().expect("wait").code()
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
