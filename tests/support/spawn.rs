//! The `toolgate` binary as a process of its own: `serve` for what only a
//! separate process shows (its resident set, its log sink, signals,
//! reloads, exit codes), and the command line the CLI tests run.

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, ChildStderr, Command, Stdio};
use std::sync::mpsc;

use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::health_check_response::ServingStatus;

use super::pb::policy_decision_point_client::PolicyDecisionPointClient;

/// The built binary, with nothing from the environment that changes what it
/// does (`RUST_LOG`, `TOOLGATE_TOKEN`, `TOOLGATE_STORE`) and no stdin.
pub fn command() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_toolgate"));
    command
        .env_remove("RUST_LOG")
        .env_remove("TOOLGATE_TOKEN")
        .env_remove("TOOLGATE_STORE")
        .stdin(Stdio::null());
    command
}

/// How to start `toolgate serve`: on a policy given as text (written to a
/// file of a temporary directory), on `127.0.0.1:0` unless told otherwise.
pub struct Serve {
    policy_text: String,
    listen: String,
    metrics: bool,
    args: Vec<String>,
    pipe_stderr: bool,
    /// A `--data-dir` of the test's own unless the arguments choose a
    /// store (false: the policy's `[server] store` does).
    data_dir: bool,
    /// No `--config`: the embedded default policy.
    embedded: bool,
}

impl Serve {
    pub fn new(policy_text: &str) -> Serve {
        Serve {
            policy_text: policy_text.to_string(),
            listen: "127.0.0.1:0".to_string(),
            metrics: false,
            args: Vec::new(),
            pipe_stderr: false,
            data_dir: true,
            embedded: false,
        }
    }

    /// No `--config`: the server runs on its embedded default policy (the
    /// policy text is not used).
    pub fn embedded(mut self) -> Serve {
        self.embedded = true;
        self
    }

    /// No `--data-dir` of the test's own: the policy names the store.
    pub fn store_from_policy(mut self) -> Serve {
        self.data_dir = false;
        self
    }

    /// `--listen ADDR` (the default is `127.0.0.1:0`).
    pub fn listen(mut self, addr: &str) -> Serve {
        self.listen = addr.to_string();
        self
    }

    /// A metrics listener on `127.0.0.1:0` too (`--metrics-listen`).
    pub fn with_metrics(mut self) -> Serve {
        self.metrics = true;
        self
    }

    /// More arguments after `serve`'s own.
    pub fn args(mut self, args: &[&str]) -> Serve {
        self.args.extend(args.iter().map(|arg| arg.to_string()));
        self
    }

    /// Stderr piped and left to the test ([`Spawned::stderr`],
    /// [`Spawned::stderr_lines`]); discarded otherwise.
    pub fn pipe_stderr(mut self) -> Serve {
        self.pipe_stderr = true;
        self
    }

    /// Starts the process and waits for the addresses it prints.
    pub fn start(self) -> Spawned {
        self.start_wrapped(|command| command)
    }

    /// As [`Serve::start`], with the `toolgate serve …` command passed
    /// through `wrap` first (to run it under `sh -c 'ulimit -n N; exec …'`,
    /// say, or with an environment variable).
    pub fn start_wrapped(self, wrap: impl FnOnce(Command) -> Command) -> Spawned {
        let directory = tempfile::tempdir().expect("temp dir");
        let policy_path = directory.path().join("policy.toml");
        std::fs::write(&policy_path, &self.policy_text).expect("write policy");
        let mut serve = Command::new(env!("CARGO_BIN_EXE_toolgate"));
        serve
            .env_remove("RUST_LOG")
            .args(["serve", "--listen", &self.listen]);
        if !self.embedded {
            serve.arg("--config").arg(&policy_path);
        }
        if self.metrics {
            serve.args(["--metrics-listen", "127.0.0.1:0"]);
        }
        // The durable default, in this test's own directory, unless the test
        // chose a store itself.
        if self.data_dir
            && !self
                .args
                .iter()
                .any(|arg| arg == "--data-dir" || arg == "--store")
        {
            serve.arg("--data-dir").arg(directory.path().join("data"));
        }
        serve.args(&self.args);
        let mut command = wrap(serve);
        command
            .env_remove("TOOLGATE_TOKEN")
            .env_remove("TOOLGATE_STORE")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(match self.pipe_stderr {
                true => Stdio::piped(),
                false => Stdio::null(),
            });
        let mut child = command.spawn().expect("start toolgate");
        let mut lines = BufReader::new(child.stdout.take().expect("stdout"));
        let mut address = |prefix: &str| -> SocketAddr {
            let mut line = String::new();
            lines.read_line(&mut line).expect("a line on stdout");
            line.strip_prefix(prefix)
                .unwrap_or_else(|| panic!("expected {prefix:?}, got {line:?}"))
                .trim()
                .parse()
                .expect("socket address")
        };
        let addr = address("toolgate listening on ");
        let metrics_addr = self.metrics.then(|| address("toolgate metrics on "));
        // Keep draining stdout, so that the server never blocks on it.
        std::thread::spawn(move || {
            let _ = std::io::copy(&mut lines, &mut std::io::sink());
        });
        let stderr = child.stderr.take();
        Spawned {
            child,
            addr,
            metrics_addr,
            stderr,
            policy_path,
            _directory: directory,
        }
    }
}

/// A running `toolgate serve`; killed when dropped.
pub struct Spawned {
    pub child: Child,
    pub addr: SocketAddr,
    pub metrics_addr: Option<SocketAddr>,
    /// Stderr, when piped.
    pub stderr: Option<ChildStderr>,
    policy_path: PathBuf,
    _directory: tempfile::TempDir,
}

impl Spawned {
    /// A new connection.
    pub async fn channel(&self) -> Channel {
        Endpoint::from_shared(format!("http://{}", self.addr))
            .expect("endpoint")
            .connect()
            .await
            .expect("connect")
    }

    /// A PolicyDecisionPoint client on a new connection.
    pub async fn pdp(&self) -> PolicyDecisionPointClient<Channel> {
        PolicyDecisionPointClient::new(self.channel().await)
    }

    /// Overall health, asked on a new connection.
    pub async fn health(&self) -> ServingStatus {
        super::server::overall_health(self.channel().await).await
    }

    /// GET /metrics: the samples by `name{labels}`.
    pub async fn metrics(&self) -> HashMap<String, f64> {
        let addr = self.metrics_addr.expect("started with a metrics listener");
        super::metrics::samples(&super::metrics::scrape(addr).await)
    }

    /// Stderr, line by line as it comes, read on a thread of its own so
    /// that the test never blocks on a pipe the child keeps open.
    pub fn stderr_lines(&mut self) -> mpsc::Receiver<String> {
        let stderr = self.stderr.take().expect("stderr piped");
        let (lines, received) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if lines.send(line).is_err() {
                    return;
                }
            }
        });
        received
    }

    /// Writes `text` to the policy file the process serves and sends it
    /// SIGHUP, which reloads it.
    pub fn reload(&self, text: &str) {
        std::fs::write(&self.policy_path, text).expect("write policy");
        self.signal("HUP");
    }

    /// Sends `kill -NAME`.
    pub fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([format!("-{name}"), self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
    }

    /// Waits for the process to exit; its exit code.
    pub fn wait(mut self) -> Option<i32> {
        self.child.wait().expect("wait").code()
    }

    /// SIGTERM, then the exit code.
    pub fn stop(self) -> Option<i32> {
        self.signal("TERM");
        self.wait()
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Spawned {
    fn drop(&mut self) {
        self.kill();
    }
}
