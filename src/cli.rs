//! The command line. `serve` is wired up in `main.rs`; the offline tools
//! (`canonical`, `fingerprint`, `manifest fingerprint`) live here; the
//! reviewer/operator clients (`approvals`, `pins`, `resource`) and
//! `check-config` parse here and run in [`crate::admin`].

use std::io::{self, BufWriter, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::canonical::{self, Fingerprint};
use crate::manifest::Manifest;

#[derive(Debug, Parser)]
#[command(
    name = "toolgate",
    version,
    about = "gRPC policy decision point for AI-agent hosts"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gRPC server.
    Serve(ServeArgs),
    /// Print the canonical JSON of a JSON text (SPEC §1).
    Canonical(JsonInput),
    /// Print the SHA-256 fingerprint (hex) of a JSON text's canonical form.
    Fingerprint(JsonInput),
    /// Manifest tools.
    #[command(subcommand)]
    Manifest(ManifestCommand),
    /// Review the approval ledger (reviewer credential).
    Approvals(ApprovalsArgs),
    /// List, add and remove trusted manifest pins (reviewer credential).
    Pins(PinsArgs),
    /// Read the versioned resources Dispatch changes (host or reviewer credential).
    Resource(ResourceArgs),
    /// Validate a policy file and print what it defines (never credential digests).
    ///
    /// Exit status 0 when the file is valid (warnings about dangling names
    /// on stderr); 1 with the error (naming the key path) on stderr
    /// otherwise, or on any warning with `--strict`.
    CheckConfig(CheckConfigArgs),
}

/// Where and how the client commands talk to a running server. Each option
/// may be given before or after the sub-subcommand
/// (`toolgate approvals --server H:P list` or `toolgate approvals list --server H:P`).
///
/// Exit status: 0 on success; 1 when the server refuses the call (printed
/// as `error: <code>: <message>`); 2 for usage, input-file and connection
/// errors (including `Unavailable`).
#[derive(Debug, Clone, Args)]
pub struct ClientArgs {
    /// Server address: a URL (`http://host:port`) or `host:port` (http is assumed).
    #[arg(
        long,
        global = true,
        value_name = "URL",
        default_value = "http://127.0.0.1:50051"
    )]
    pub server: String,
    /// Bearer token sent as `authorization: Bearer <token>`; never printed.
    /// Prefer the environment variable: a command-line value is visible to
    /// other local users.
    #[arg(
        long,
        global = true,
        value_name = "TOKEN",
        env = "TOOLGATE_TOKEN",
        hide_env_values = true
    )]
    pub token: Option<Token>,
    /// Output format: aligned tables for people, or JSON (proto field names,
    /// enums as short lowercase names, JSON text fields parsed, timestamps as
    /// RFC 3339 UTC strings, absent timestamps as null).
    #[arg(long, global = true, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
}

/// A bearer token. Its `Debug` form hides the value so that printing the
/// parsed command line can never leak it.
#[derive(Clone, PartialEq, Eq)]
pub struct Token(pub String);

impl std::fmt::Debug for Token {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("Token([hidden])")
    }
}

impl std::str::FromStr for Token {
    type Err = std::convert::Infallible;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Ok(Token(text.to_string()))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// Aligned columns (lists) or `key  value` lines (one record).
    Table,
    /// One JSON document; `approvals watch` prints one JSON object per line.
    Json,
}

#[derive(Debug, Args)]
pub struct ApprovalsArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub command: ApprovalsCommand,
}

#[derive(Debug, Subcommand)]
pub enum ApprovalsCommand {
    /// List approvals, following pages until done or `--limit` is reached.
    ///
    /// JSON: `{"approvals": [...]}`.
    List(ListApprovalsArgs),
    /// Show one approval.
    Get {
        /// Approval id (UUID).
        id: String,
    },
    /// Grant a pending approval as the authenticated reviewer.
    Grant {
        /// Approval id (UUID).
        id: String,
        /// Comment stored with the grant.
        #[arg(long, value_name = "TEXT", default_value = "")]
        comment: String,
    },
    /// Deny a pending approval as the authenticated reviewer.
    Deny {
        /// Approval id (UUID).
        id: String,
        /// Why it is denied.
        #[arg(long, value_name = "TEXT", default_value = "")]
        reason: String,
    },
    /// Revoke a granted, not yet consumed approval.
    Revoke {
        /// Approval id (UUID).
        id: String,
        /// Why it is revoked.
        #[arg(long, value_name = "TEXT", default_value = "")]
        reason: String,
    },
    /// Print every ledger transition as it happens, one line each.
    ///
    /// Table: one human line per event; JSON: one object per line
    /// (`{"kind", "approval", "lagged"}`). A line on stderr says when the
    /// stream is open. Exits 0 when the server ends the stream (also when it
    /// shuts down).
    Watch,
}

#[derive(Debug, Args)]
pub struct ListApprovalsArgs {
    /// Only approvals with this status.
    #[arg(long, value_enum)]
    pub status: Option<StatusFilter>,
    /// Only approvals requested by this actor.
    #[arg(long, value_name = "ACTOR")]
    pub actor: Option<String>,
    /// Only approvals for this tool.
    #[arg(long, value_name = "TOOL")]
    pub tool: Option<String>,
    /// Stop after this many approvals.
    #[arg(long, value_name = "N")]
    pub limit: Option<u32>,
    /// Approvals asked for per request (pages are followed until done).
    #[arg(long, value_name = "N", default_value_t = 500, value_parser = clap::value_parser!(u32).range(1..=500))]
    pub page_size: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum StatusFilter {
    Pending,
    Granted,
    Denied,
    Expired,
    Consumed,
    Revoked,
}

#[derive(Debug, Args)]
pub struct PinsArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub command: PinsCommand,
}

#[derive(Debug, Subcommand)]
pub enum PinsCommand {
    /// List the pins in force (policy and API). JSON: `{"pins": [...]}`.
    List,
    /// Pin a manifest (JSON file, as `toolgate manifest fingerprint` reads it).
    Add {
        /// Manifest file (JSON).
        file: PathBuf,
        /// Refuse the pin unless the manifest has this fingerprint (the one reviewed).
        #[arg(long, value_name = "FINGERPRINT")]
        expect: Option<String>,
    },
    /// Remove the API pin of a server.
    Remove {
        /// Manifest server id.
        server_id: String,
    },
}

#[derive(Debug, Args)]
pub struct ResourceArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(subcommand)]
    pub command: ResourceCommand,
}

#[derive(Debug, Subcommand)]
pub enum ResourceCommand {
    /// Show a resource's value and version. JSON: `{"name", "value", "version"}`.
    Get {
        /// Resource name.
        name: String,
    },
}

#[derive(Debug, Args)]
pub struct CheckConfigArgs {
    /// Policy file (TOML).
    pub file: PathBuf,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
    /// Treat warnings (dangling names) as errors: exit 1 on any.
    #[arg(long)]
    pub strict: bool,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Policy file (TOML); the embedded default policy serves without one.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Serve Prometheus metrics on this address (`GET /metrics`); off when absent.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Args)]
pub struct JsonInput {
    /// Input file; standard input when absent.
    pub file: Option<PathBuf>,
    /// Treat every input line as a separate JSON text and print one result
    /// per line (`error: <kind>` for a rejected line).
    #[arg(long)]
    pub lines: bool,
}

#[derive(Debug, Subcommand)]
pub enum ManifestCommand {
    /// Print the fingerprint of a manifest in JSON.
    Fingerprint {
        /// Manifest file (JSON).
        file: PathBuf,
    },
}

fn read_input(file: Option<&Path>) -> io::Result<Vec<u8>> {
    match file {
        Some(path) => std::fs::read(path),
        None => {
            let mut bytes = Vec::new();
            io::stdin().lock().read_to_end(&mut bytes)?;
            Ok(bytes)
        }
    }
}

/// `toolgate canonical` (`hash = false`) and `toolgate fingerprint` (`hash = true`).
pub fn run_json_tool(input: &JsonInput, hash: bool) -> ExitCode {
    let bytes = match read_input(input.file.as_deref()) {
        Ok(bytes) => bytes,
        Err(error) => {
            eprintln!("error: cannot read input: {error}");
            return ExitCode::from(2);
        }
    };
    let render = |text: &[u8]| -> Result<String, canonical::CanonicalError> {
        let value = canonical::parse(text)?;
        Ok(if hash {
            canonical::fingerprint(&value).to_hex()
        } else {
            canonical::to_canonical(&value)
        })
    };
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let mut failed = false;
    let written = if input.lines {
        let body = bytes.strip_suffix(b"\n").unwrap_or(&bytes);
        body.split(|byte| *byte == b'\n')
            .try_for_each(|line| match render(line) {
                Ok(text) => writeln!(out, "{text}"),
                Err(error) => {
                    failed = true;
                    writeln!(out, "error: {}", error.kind.as_str())
                }
            })
    } else {
        match render(&bytes) {
            Ok(text) => writeln!(out, "{text}"),
            Err(error) => {
                eprintln!("error: {error}");
                return ExitCode::FAILURE;
            }
        }
    };
    if let Err(error) = written.and_then(|()| out.flush()) {
        eprintln!("error: cannot write output: {error}");
        return ExitCode::from(2);
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// `toolgate manifest fingerprint FILE`.
pub fn run_manifest(command: &ManifestCommand) -> ExitCode {
    match command {
        ManifestCommand::Fingerprint { file } => {
            let fingerprint = std::fs::read(file)
                .map_err(|error| format!("cannot read {}: {error}", file.display()))
                .and_then(|bytes| Manifest::from_json(&bytes).map_err(|error| error.to_string()))
                .map(|manifest| manifest.fingerprint());
            match fingerprint {
                Ok(fingerprint) => print_fingerprint(fingerprint),
                Err(message) => {
                    eprintln!("error: {message}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn print_fingerprint(fingerprint: Fingerprint) -> ExitCode {
    println!("{fingerprint}");
    ExitCode::SUCCESS
}
