//! The command line, as clap reads it: `serve`, the offline tools
//! (`canonical`, `fingerprint`, `manifest fingerprint`, `check-config`,
//! `eval`, `test`, `store check`, `store backup`, `store migrate`,
//! `completions`, `man`)
//! and the reviewer/operator clients (`approvals`, `pins`, `resource`,
//! `manifest assess`). The types only; each command runs in its own module.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use toolgate::domain::limits::APPROVALS_PAGE;
use toolgate::store::postgres::{self, PostgresTarget};

#[derive(Debug, Parser)]
#[command(
    name = "toolgate",
    version = toolgate::ops::build_info::LONG_VERSION,
    about = "gRPC policy decision point for AI-agent hosts",
    long_about = "gRPC policy decision point for AI-agent hosts.\n\n\
        A host (the application around a language model) asks toolgate, over gRPC, \
        whether a tool call the model proposed may run (Decide), and commits approved \
        writes through it exactly once (Dispatch). Reviewers grant or deny approvals \
        (`toolgate approvals`); operators pin trusted manifests (`toolgate pins`).\n\n\
        `toolgate serve --config POLICY.toml` runs the server; `toolgate <command> --help` \
        describes each command; `toolgate man` prints this manual as a man page and \
        `toolgate completions bash|zsh|fish` a shell completion script.",
    after_long_help = "EXIT STATUS:\n  0 on success; 1 when a check fails (`check-config` refusing the \
        policy, a failing `test` case, `store check` finding a problem), the server \
        refuses a call, or `serve` stopped with log lines or a store batch it could not \
        write in time; 2 for usage errors, an input file a command cannot use (a client \
        command's, `eval`'s, `test`'s or `pins add`'s) and connection errors; 3 when `manifest assess` \
        is answered that the manifest is not accepted.\n\n\
        ENVIRONMENT:\n  TOOLGATE_TOKEN  the bearer token of the client commands (never printed)\n  \
        TOOLGATE_STORE  the store of `serve --store` and the `store` commands (a \
        PostgreSQL URL may hold a password: never printed)\n  \
        RUST_LOG        the log filter of `serve` (tracing-subscriber's EnvFilter)\n\n\
        SIGNALS:\n  SIGHUP reloads the policy file of `serve`; SIGTERM and SIGINT shut down gracefully."
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
    /// Ask a policy one Decide (or Dispatch) offline and print the answer
    /// as JSON, as the gRPC API answers it (protobuf's JSON mapping).
    ///
    /// The proposal runs through the server's own handlers on a fresh
    /// in-memory state (the policy's initial state), as one host of the
    /// policy. Exit status 0 when answered (whatever the outcome), 1 when
    /// the call is refused with an error status (`error: CODE: message`),
    /// 2 for a bad policy, proposal file or option.
    Eval(EvalArgs),
    /// Run a policy's test file offline: each case's proposals (and
    /// reviewer actions between them) against the expected answers.
    ///
    /// Exit status 0 when every case passes, 1 when one fails (what
    /// differed is printed), 2 for a bad policy or test file.
    Test(TestArgs),
    /// Check or back up the durable store (offline; also beside a running
    /// server), or create and migrate its tables.
    Store(StoreArgs),
    /// Print a shell completion script (for example
    /// `toolgate completions bash > /etc/bash_completion.d/toolgate`).
    Completions(CompletionsArgs),
    /// Print the manual page (roff, section 1), with every command and
    /// option: `toolgate man | man -l -`.
    Man,
}

#[derive(Debug, Clone, Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    pub shell: clap_complete::Shell,
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
    /// Server address: a URL (`http://host:port`, `https://host:port`) or
    /// `host:port` (http is assumed).
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
    /// Output format: tables for people (lists fit 100 columns, cut with
    /// `…`), or JSON in protobuf's canonical JSON mapping, as grpcurl prints
    /// it (lowerCamelCase names, enum value names, 64-bit integers as
    /// strings, RFC 3339 timestamps, default values left out).
    #[arg(long, global = true, value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
    /// https: the PEM CA certificate(s) the server's certificate must chain
    /// to (the system's roots when absent).
    #[arg(long, global = true, value_name = "PEM")]
    pub ca: Option<PathBuf>,
    /// https with mTLS: the client's PEM certificate chain (with `--key`).
    #[arg(long, global = true, value_name = "PEM", requires = "key")]
    pub cert: Option<PathBuf>,
    /// https with mTLS: the PEM private key of `--cert`.
    #[arg(long, global = true, value_name = "PEM", requires = "cert")]
    pub key: Option<PathBuf>,
    /// Send the token over `http://` to a host that is not this machine
    /// (refused otherwise): only where a mesh encrypts the connection.
    #[arg(long, global = true)]
    pub insecure_plaintext: bool,
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
    /// Table: short unique ids, tool and redacted arguments, 100 columns.
    /// JSON: a `ListApprovalsResponse` of all pages.
    List(ListApprovalsArgs),
    /// Show one approval.
    Get {
        /// Approval id (UUID), or a unique prefix of one.
        id: String,
    },
    /// Grant a pending approval as the authenticated reviewer.
    Grant {
        /// Approval id (UUID), or a unique prefix of one.
        id: String,
        /// Comment stored with the grant.
        #[arg(long, value_name = "TEXT", default_value = "")]
        comment: String,
    },
    /// Deny a pending approval as the authenticated reviewer.
    Deny {
        /// Approval id (UUID), or a unique prefix of one.
        id: String,
        /// Why it is denied.
        #[arg(long, value_name = "TEXT", default_value = "")]
        reason: String,
    },
    /// Revoke a granted, not yet consumed approval.
    Revoke {
        /// Approval id (UUID), or a unique prefix of one.
        id: String,
        /// Why it is revoked.
        #[arg(long, value_name = "TEXT", default_value = "")]
        reason: String,
    },
    /// Print every ledger transition as it happens, one line each.
    ///
    /// Table: one line of at most 100 columns per event (kind, short id,
    /// status, actor, tool, workspace, reviewer, redacted arguments); JSON:
    /// one `ApprovalEvent` object per line. A line on stderr says when the
    /// stream is open. Exits 0 when the server ends the stream (also when it
    /// shuts down), 1 when the credential is refused or revoked.
    Watch {
        /// When the server goes away, reconnect with backoff (200 ms
        /// doubling to 5 s) instead of exiting.
        #[arg(long)]
        follow: bool,
    },
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
    #[arg(long, value_name = "N", default_value_t = APPROVALS_PAGE.max, value_parser = clap::value_parser!(u32).range(1..=i64::from(APPROVALS_PAGE.max)))]
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
    /// Pin a manifest (a reference-form JSON file, not an MCP tools/list result).
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
    /// Show a resource's value and version. JSON: a `Resource`.
    Get {
        /// Resource name.
        name: String,
    },
    /// List every resource with its version and value (cut to fit 100
    /// columns). JSON: a `ListResourcesResponse` of all pages.
    List,
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
pub struct EvalArgs {
    /// Policy file (TOML).
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
    /// The trusted session the host asserts: `ACTOR,SESSION_ID,WORKSPACE`.
    #[arg(long, value_name = "ACTOR,SESSION,WORKSPACE")]
    pub session: String,
    /// The host credential identity to call as; by default the
    /// alphabetically first host of the policy (`anonymous` when its host
    /// API is open).
    #[arg(long, value_name = "IDENTITY")]
    pub host: Option<String>,
    /// Print the Dispatch answer instead of the Decide answer.
    #[arg(long)]
    pub dispatch: bool,
    /// The proposal, as JSON: `{"call_id", "actor", "name", "version",
    /// "arguments"}` (the keys its fingerprint is made of); `-` for stdin.
    #[arg(value_name = "PROPOSAL.json")]
    pub proposal: PathBuf,
}

#[derive(Debug, Args)]
pub struct TestArgs {
    /// Policy file (TOML).
    #[arg(long, value_name = "FILE")]
    pub config: PathBuf,
    /// Test file (TOML): `[[case]]` tables (README, "Testing a policy").
    #[arg(value_name = "TESTS.toml")]
    pub tests: PathBuf,
}

/// The data directory of `serve` and the store commands when `--data-dir`
/// is not given.
pub const DEFAULT_DATA_DIR: &str = "./toolgate-data";

/// The store commands. `check` and `backup` read the SQLite store through a
/// read-only connection and never take the data directory's lock, so they
/// work on a running server's store (a consistent snapshot of it) as on a
/// stopped one. `migrate` opens the store as `serve` does (so not beside a
/// running server on SQLite).
///
/// Exit status: 0 on success; 1 when `check` finds a problem; 2 for usage
/// errors and a store that cannot be read at all.
#[derive(Debug, Args)]
pub struct StoreArgs {
    /// The data directory (as `serve` uses it).
    #[arg(long, global = true, value_name = "DIR", default_value = DEFAULT_DATA_DIR)]
    pub data_dir: PathBuf,
    /// The store, as `serve --store` takes it: `sqlite` (the data
    /// directory) or a `postgres://…` URL (`migrate` only).
    #[arg(
        long,
        global = true,
        value_name = "STORE",
        env = "TOOLGATE_STORE",
        hide_env_values = true,
        value_parser = StoreParser
    )]
    pub store: Option<StoreKind>,
    /// The policy `serve` runs on: without --store (or TOOLGATE_STORE), its
    /// `[server] store` says which store, as it does for `serve`.
    #[arg(long, global = true, value_name = "FILE")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: StoreCommand,
}

#[derive(Debug, Subcommand)]
pub enum StoreCommand {
    /// Create the store's tables, or migrate them to this toolgate's
    /// schema version, and print the version (what `serve` does at start).
    ///
    /// With `--store postgres://…`: the tables in the URL's schema, under
    /// the store's lock (stop the replicas first: one still running on the
    /// older schema answers UNAVAILABLE once it finds the new one); with
    /// the SQLite store: the data directory, refused while a server holds
    /// it.
    Migrate,
    /// Check the store's integrity (SQLite integrity_check), schema version
    /// and directory mode, and count each table's records.
    Check,
    /// Write a consistent copy of the store to FILE (never overwritten).
    ///
    /// To restore: stop toolgate, `mkdir -m 700 NEW`, copy FILE to
    /// `NEW/toolgate.sqlite3`, and start toolgate with NEW as its data
    /// directory. A restore goes back to the backup's moment: grants
    /// consumed since are grants again until they expire, and Dispatches
    /// committed since have no receipt (their replays commit again).
    Backup {
        /// The copy to write; must not exist.
        file: PathBuf,
    },
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
    /// Serve Envoy's external authorization (`envoy.service.auth.v3`) alone on
    /// this address too, without a token: its Checks act as the policy's
    /// `[ext_authz] host_credential` (required). Off when absent.
    #[arg(long, value_name = "ADDR")]
    pub ext_authz_listen: Option<SocketAddr>,
    /// Write logs and audit lines to this file instead of stderr, rotated by size.
    #[arg(long, value_name = "PATH")]
    pub log_file: Option<PathBuf>,
    /// Rotate the log file when a write would take it past this many bytes.
    #[arg(long, value_name = "BYTES", default_value_t = 100 * 1024 * 1024, value_parser = clap::value_parser!(u64).range(1..))]
    pub log_max_bytes: u64,
    /// Rotated log files kept (`PATH.1` is the newest).
    #[arg(long, value_name = "COUNT", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=1000))]
    pub log_max_files: u64,
    /// Seconds a log write may block before the sink counts as stalled
    /// (health NOT_SERVING, calls UNAVAILABLE until it drains).
    #[arg(long, value_name = "SECONDS", default_value_t = 5, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub log_stall_seconds: u64,
    /// Where the state is kept: `sqlite`, durable, in `--data-dir`;
    /// `memory`, forgotten at exit (tests and benchmarks); or a PostgreSQL
    /// database, `postgres://USER[:PASSWORD]@HOST[:PORT]/DB[?schema=NAME]`
    /// (or `postgresql://`; the tables in schema NAME, default `toolgate`,
    /// created when absent), which any number of toolgate processes
    /// (replicas) may share. Without it, the policy's `[server] store`, else
    /// `sqlite`. Prefer the environment variable for a URL with a password:
    /// a command-line value is visible to other local users.
    #[arg(
        long,
        value_name = "STORE",
        env = "TOOLGATE_STORE",
        hide_env_values = true,
        value_parser = StoreParser
    )]
    pub store: Option<StoreKind>,
    /// The durable store's directory (created owner-only; one process at a
    /// time) [default: ./toolgate-data].
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Create or migrate a postgres:// store's tables at start (as `toolgate
    /// store migrate` does); without it, a schema without the tables or of
    /// an older version is refused untouched. The embedded store migrates
    /// itself.
    #[arg(long)]
    pub migrate: bool,
    /// Serve TLS with this PEM certificate chain (leaf first); instead of
    /// the policy's `[server.tls] cert`. Read again on SIGHUP.
    #[arg(long, value_name = "PEM", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The PEM private key of `--tls-cert`.
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// mTLS: require client certificates signed by these PEM CA
    /// certificates (with `--tls-cert`).
    #[arg(long, value_name = "PEM", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// Serve plaintext on a non-loopback `--listen` address: only where a
    /// service mesh (a sidecar proxy) provides TLS in front of toolgate.
    /// Same as `[server] plaintext_behind_mesh = true`.
    #[arg(long)]
    pub insecure_plaintext_behind_mesh: bool,
}

/// Where the state is kept (`--store`, `TOOLGATE_STORE`). The PostgreSQL
/// URL's `Debug` form hides its password.
#[derive(Debug, Clone)]
pub enum StoreKind {
    Sqlite,
    Memory,
    /// Boxed: a parsed URL is large, the other kinds are nothing.
    Postgres(Box<PostgresTarget>),
}

impl StoreKind {
    /// `sqlite`, `memory`, or a `postgres://…`/`postgresql://…` URL; the
    /// error names the rule broken and never shows a password.
    pub fn parse(text: &str) -> Result<StoreKind, String> {
        match text {
            "sqlite" => Ok(StoreKind::Sqlite),
            "memory" => Ok(StoreKind::Memory),
            _ if text.starts_with("postgres://") || text.starts_with("postgresql://") => {
                PostgresTarget::parse(text)
                    .map(|target| StoreKind::Postgres(Box::new(target)))
                    .map_err(|error| error.0)
            }
            _ => Err(format!(
                "expected `sqlite`, `memory` or a postgres://… URL, got {:?}",
                postgres::redact(text)
            )),
        }
    }
}

/// Parses `--store` with [`StoreKind::parse`]. Its own, rather than clap's
/// `FromStr` parser, because clap's message repeats the value given, and a
/// mistyped URL's password with it.
#[derive(Debug, Clone, Copy)]
pub struct StoreParser;

impl clap::builder::TypedValueParser for StoreParser {
    type Value = StoreKind;

    fn parse_ref(
        &self,
        command: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<StoreKind, clap::Error> {
        let name = arg.map_or_else(|| "--store".to_string(), |arg| arg.to_string());
        let parsed = match value.to_str() {
            Some(text) => StoreKind::parse(text),
            None => Err("not UTF-8".to_string()),
        };
        parsed.map_err(|message| {
            clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!("invalid value for '{name}' (or TOOLGATE_STORE): {message}\n"),
            )
            .with_cmd(command)
        })
    }
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
    /// Print the fingerprint of a manifest file (SPEC §7), the reference
    /// algorithm's byte for byte.
    ///
    /// FILE is either the reference form (`{"server", "revision", "tools":
    /// [{"tool", "description", "parameters", "read_only", "scopes"}]}`) or
    /// an MCP `tools/list` result (`{"tools": [{"name", …}]}`, bare or as a
    /// JSON-RPC response) with `--server ID --revision REV`. The fingerprint
    /// goes to stdout; which form was read, and any reason the manifest is
    /// unsafe to accept, to stderr.
    Fingerprint(ManifestFingerprintArgs),
    /// Send a manifest file to a running server's AssessManifest and print
    /// the answer.
    ///
    /// FILE is read as by `manifest fingerprint`; since `--server` is the
    /// server address here, an MCP result's server id is `--server-id ID`.
    /// Exit status 0 when the manifest is accepted (MATCHED), 3 when the
    /// server answered that it is not (CHANGED, UNPINNED or unsafe), 1 or 2
    /// as for the other client commands.
    Assess(ManifestAssessArgs),
}

#[derive(Debug, Args)]
pub struct ManifestFingerprintArgs {
    /// Manifest file (JSON): the reference form or an MCP tools/list result.
    pub file: PathBuf,
    /// For an MCP tools/list result: the server id it is hashed under.
    #[arg(long = "server", visible_alias = "server-id", value_name = "ID")]
    pub server_id: Option<String>,
    /// For an MCP tools/list result: the revision it is hashed under.
    #[arg(long, value_name = "REV")]
    pub revision: Option<String>,
}

#[derive(Debug, Args)]
pub struct ManifestAssessArgs {
    #[command(flatten)]
    pub client: ClientArgs,
    /// Manifest file (JSON): the reference form or an MCP tools/list result.
    pub file: PathBuf,
    /// For an MCP tools/list result: the server id it is assessed under.
    #[arg(long = "server-id", value_name = "ID")]
    pub server_id: Option<String>,
    /// For an MCP tools/list result: the revision it is assessed under.
    #[arg(long, value_name = "REV")]
    pub revision: Option<String>,
}
