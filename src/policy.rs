//! The policy file (TOML, SPEC §3), parsed into an immutable, validated
//! snapshot. A reload builds a whole new `Policy`; readers never see half of
//! one. Every error names the key path and what is wrong; unknown keys are
//! errors.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::canonical::{self, Fingerprint, Value};
use crate::ids::{check_identifier, check_server_id};
use crate::manifest::{Manifest, PinReference};

/// The policy `toolgate serve` uses when no `--config` is given.
pub const EMBEDDED_DEFAULT: &str = include_str!("../examples/policy.toml");

/// A policy file that could not be loaded: which key, what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{source_name}: {key}: {message}")]
pub struct PolicyError {
    /// The file (or `<embedded>`).
    pub source_name: String,
    /// Key path inside the file, e.g. `tools.payment_execute.approval`.
    pub key: String,
    pub message: String,
}

/// A validated, immutable policy.
#[derive(Debug)]
pub struct Policy {
    /// Short SHA-256 of the file text, reported with every decision.
    pub revision: String,
    pub tools: HashMap<String, Tool>,
    pub actors: HashMap<String, ActorProfile>,
    pub reviewers: HashMap<String, Reviewer>,
    /// Credentials by the SHA-256 digest of their bearer token.
    pub credentials: HashMap<Fingerprint, Arc<Credential>>,
    pub pins: HashMap<String, PolicyPin>,
    pub limits: Limits,
    pub state: StatePolicy,
    /// Listener settings; applied at start (a reload does not change them).
    pub server: ServerSettings,
}

/// The `[server]` section: overload protection and HTTP/2 settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSettings {
    /// Calls served at once; more fail fast with RESOURCE_EXHAUSTED.
    pub max_concurrent_requests: usize,
    pub request_timeout: Duration,
    /// Largest decoded request message.
    pub max_message_bytes: usize,
    pub http2_keepalive_interval: Duration,
    pub http2_keepalive_timeout: Duration,
    pub max_concurrent_streams: u32,
    /// How long in-flight calls may take to finish after SIGTERM.
    pub shutdown_grace: Duration,
    /// Connections open at once, and from one peer address.
    pub max_connections: usize,
    pub max_connections_per_peer: usize,
    /// Time a new connection has for its HTTP/2 preface and first request.
    pub handshake_timeout: Duration,
    /// Time a call has for its whole request message to arrive.
    pub read_timeout: Duration,
    /// Time a response (or a blocked socket write) has to make progress.
    pub write_timeout: Duration,
    /// Request and response bytes buffered at once, over all calls.
    pub max_buffered_request_bytes: usize,
    pub max_buffered_response_bytes: usize,
}

impl Default for ServerSettings {
    fn default() -> Self {
        ServerSettings::from(RawServer::default())
    }
}

impl From<RawServer> for ServerSettings {
    fn from(raw: RawServer) -> Self {
        ServerSettings {
            max_concurrent_requests: raw.max_concurrent_requests,
            request_timeout: Duration::from_millis(raw.request_timeout_ms),
            max_message_bytes: raw.max_message_bytes,
            http2_keepalive_interval: Duration::from_secs(raw.http2_keepalive_interval_seconds),
            http2_keepalive_timeout: Duration::from_secs(raw.http2_keepalive_timeout_seconds),
            max_concurrent_streams: raw.max_concurrent_streams,
            shutdown_grace: Duration::from_secs(raw.shutdown_grace_seconds),
            max_connections: raw.max_connections,
            max_connections_per_peer: raw.max_connections_per_peer,
            handshake_timeout: Duration::from_millis(raw.handshake_timeout_ms),
            read_timeout: Duration::from_millis(raw.read_timeout_ms),
            write_timeout: Duration::from_millis(raw.write_timeout_ms),
            max_buffered_request_bytes: raw.max_buffered_request_bytes,
            max_buffered_response_bytes: raw.max_buffered_response_bytes,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// Reads only: allowed for authorised actors.
    Read,
    /// Drafts a change for a person to act on: allowed for authorised actors.
    Propose,
    /// Changes something: allowed, or gated on approval by its rule.
    Execute,
    /// Never allowed.
    Forbidden,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApprovalRule {
    Never,
    Always,
    /// Approval needed when the numeric argument exceeds the caller
    /// profile's `approval_threshold` (or is missing / not a number).
    Threshold {
        argument: String,
    },
}

/// What a committed Dispatch does to the versioned state (SPEC §6).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    /// Receipt only: the host performs the side effect itself.
    None,
    /// The resource named by argument `resource_argument` becomes the value
    /// of argument `value_argument`; only the listed `resources` when the
    /// policy lists them (so a ticket tool cannot overwrite the outbox).
    Set {
        resource_argument: String,
        value_argument: String,
        resources: Option<Vec<String>>,
    },
    /// An object built from the arguments is pushed onto list `resource`.
    Append { resource: String },
}

/// A tool as the policy declares it.
#[derive(Debug)]
pub struct Tool {
    pub name: String,
    pub mode: Mode,
    /// Compiled once at load; never per request.
    pub input_schema: jsonschema::Validator,
    /// Actor roles that may call it.
    pub roles: Vec<String>,
    /// Reviewer roles that may approve it.
    pub approvers: Vec<String>,
    pub approval: ApprovalRule,
    /// Manifest server the tool belongs to, if any.
    pub server: Option<String>,
    /// Top-level argument names shown redacted to reviewers.
    pub sensitive: Vec<String>,
    /// Work units charged when the tool is executed.
    pub cost: u64,
    pub effect: Effect,
}

/// An actor's resolved profile.
#[derive(Debug, Clone, PartialEq)]
pub struct ActorProfile {
    pub actor: String,
    pub profile: String,
    pub roles: Vec<String>,
    pub approval_threshold: Option<f64>,
    pub max_decisions: Option<u64>,
    pub max_tool_calls: Option<u64>,
    pub max_session_seconds: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reviewer {
    pub identity: String,
    pub roles: Vec<String>,
    /// Workspaces the reviewer may act in; `*` means all.
    pub workspaces: Vec<String>,
    /// Sees (lists, reads, watches) every approval, not only those it could
    /// review. Off unless the policy says `see_all = true`.
    pub see_all: bool,
}

impl Reviewer {
    pub fn covers_workspace(&self, workspace: &str) -> bool {
        self.workspaces
            .iter()
            .any(|allowed| allowed == "*" || allowed == workspace)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CredentialKind {
    Host,
    Reviewer,
}

impl CredentialKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CredentialKind::Host => "host",
            CredentialKind::Reviewer => "reviewer",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    pub kind: CredentialKind,
    pub identity: String,
    /// For hosts: the actors it may assert; `*` means any.
    pub actors: Vec<String>,
}

impl Credential {
    pub fn may_assert(&self, actor: &str) -> bool {
        self.actors
            .iter()
            .any(|allowed| allowed == "*" || allowed == actor)
    }
}

/// Capacities and lifetimes.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    pub pending_ttl: Duration,
    pub grant_ttl: Duration,
    pub max_pending_per_actor: usize,
    pub max_pending_total: usize,
    /// Approval records kept in all (terminal ones are evicted oldest first).
    pub max_approval_records: usize,
    /// How long a finished (expired, consumed, revoked) approval stays readable.
    pub approval_retention: Duration,
    pub max_sessions: usize,
    pub session_idle_ttl: Duration,
    pub decision_cost: u64,
    pub receipt_capacity: usize,
    pub receipt_retention: Duration,
    /// Sessions one host credential may hold (sessions are namespaced by
    /// host identity); by default the whole table when the policy declares
    /// at most one host credential, half of it otherwise.
    pub max_sessions_per_host: usize,
    /// Pending approval requests one host credential may hold; by default
    /// `max_pending_total` with at most one host credential, half otherwise.
    pub max_pending_per_host: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VersionScope {
    /// One version for the whole state, bumped by every commit.
    Global,
    /// Each resource has its own version.
    Resource,
}

/// Initial versioned state for Dispatch.
#[derive(Debug, Clone, PartialEq)]
pub struct StatePolicy {
    pub version_scope: VersionScope,
    pub resources: BTreeMap<String, Value>,
}

/// A pin declared in the policy file.
#[derive(Debug, Clone)]
pub struct PolicyPin {
    pub server_id: String,
    pub fingerprint: Fingerprint,
    /// The reviewed manifest, when the policy names its file.
    pub manifest: Option<Arc<Manifest>>,
}

impl PinReference for PolicyPin {
    fn pinned_fingerprint(&self) -> Fingerprint {
        self.fingerprint
    }

    fn pinned_manifest(&self) -> Option<&Manifest> {
        self.manifest.as_deref()
    }
}

// ----- the file as written ------------------------------------------------

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPolicy {
    #[serde(default)]
    limits: RawLimits,
    #[serde(default)]
    profiles: BTreeMap<String, RawProfile>,
    #[serde(default)]
    actors: BTreeMap<String, RawActor>,
    #[serde(default)]
    tools: BTreeMap<String, RawTool>,
    #[serde(default)]
    reviewers: BTreeMap<String, RawReviewer>,
    #[serde(default)]
    credentials: Vec<RawCredential>,
    #[serde(default)]
    pins: Vec<RawPin>,
    #[serde(default)]
    state: RawState,
    #[serde(default)]
    server: RawServer,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawServer {
    max_concurrent_requests: usize,
    request_timeout_ms: u64,
    max_message_bytes: usize,
    http2_keepalive_interval_seconds: u64,
    http2_keepalive_timeout_seconds: u64,
    max_concurrent_streams: u32,
    shutdown_grace_seconds: u64,
    max_connections: usize,
    max_connections_per_peer: usize,
    handshake_timeout_ms: u64,
    read_timeout_ms: u64,
    write_timeout_ms: u64,
    max_buffered_request_bytes: usize,
    max_buffered_response_bytes: usize,
}

impl Default for RawServer {
    fn default() -> Self {
        RawServer {
            max_concurrent_requests: 1024,
            request_timeout_ms: 10_000,
            max_message_bytes: 1024 * 1024,
            http2_keepalive_interval_seconds: 30,
            http2_keepalive_timeout_seconds: 10,
            max_concurrent_streams: 100,
            shutdown_grace_seconds: 10,
            max_connections: 1024,
            max_connections_per_peer: 256,
            handshake_timeout_ms: 5_000,
            read_timeout_ms: 5_000,
            write_timeout_ms: 10_000,
            max_buffered_request_bytes: 64 * 1024 * 1024,
            max_buffered_response_bytes: 64 * 1024 * 1024,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
struct RawLimits {
    pending_ttl_seconds: u64,
    grant_ttl_seconds: u64,
    max_pending_per_actor: usize,
    max_pending_total: usize,
    max_approval_records: usize,
    approval_retention_seconds: u64,
    max_sessions: usize,
    session_idle_seconds: u64,
    decision_cost: u64,
    receipt_capacity: usize,
    receipt_retention_seconds: u64,
    max_sessions_per_host: Option<usize>,
    max_pending_per_host: Option<usize>,
}

impl Default for RawLimits {
    fn default() -> Self {
        RawLimits {
            pending_ttl_seconds: 300,
            grant_ttl_seconds: 600,
            max_pending_per_actor: 64,
            max_pending_total: 4096,
            max_approval_records: 100_000,
            approval_retention_seconds: 3600,
            max_sessions: 10_000,
            session_idle_seconds: 3600,
            decision_cost: 1,
            receipt_capacity: 100_000,
            receipt_retention_seconds: 86_400,
            max_sessions_per_host: None,
            max_pending_per_host: None,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProfile {
    #[serde(default)]
    roles: Vec<String>,
    approval_threshold: Option<f64>,
    max_decisions: Option<u64>,
    max_tool_calls: Option<u64>,
    max_session_seconds: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawActor {
    profile: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTool {
    mode: Mode,
    input_schema: Option<toml::Value>,
    #[serde(default)]
    roles: Vec<String>,
    #[serde(default)]
    approvers: Vec<String>,
    #[serde(default = "default_approval")]
    approval: String,
    threshold_argument: Option<String>,
    server: Option<String>,
    #[serde(default)]
    sensitive: Vec<String>,
    #[serde(default)]
    cost: u64,
    #[serde(default)]
    effect: RawEffect,
}

fn default_approval() -> String {
    "never".to_string()
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEffect {
    /// `none` | `set` | `append`
    kind: Option<String>,
    resource_argument: Option<String>,
    value_argument: Option<String>,
    resource: Option<String>,
    /// For `set`: the resources it may change (all when absent).
    resources: Option<Vec<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawReviewer {
    roles: Vec<String>,
    workspaces: Vec<String>,
    #[serde(default)]
    see_all: bool,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawCredential {
    kind: CredentialKind,
    identity: String,
    /// Hex SHA-256 digest of the bearer token (never the token itself).
    sha256: String,
    #[serde(default)]
    actors: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPin {
    server: String,
    fingerprint: Option<String>,
    /// Path of the reviewed manifest (JSON), relative to the policy file.
    manifest: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawState {
    #[serde(default = "default_scope")]
    version_scope: VersionScope,
    #[serde(default)]
    resources: BTreeMap<String, toml::Value>,
}

impl Default for RawState {
    fn default() -> Self {
        RawState {
            version_scope: default_scope(),
            resources: BTreeMap::new(),
        }
    }
}

fn default_scope() -> VersionScope {
    VersionScope::Global
}

// ----- loading ------------------------------------------------------------

/// Collects the error context while validating.
struct Loader<'a> {
    source_name: &'a str,
    base_dir: Option<&'a Path>,
}

impl Loader<'_> {
    fn error(&self, key: impl Into<String>, message: impl Into<String>) -> PolicyError {
        PolicyError {
            source_name: self.source_name.to_string(),
            key: key.into(),
            message: message.into(),
        }
    }

    fn identifier(&self, key: &str, value: &str) -> Result<(), PolicyError> {
        check_identifier(key, value).map_err(|error| match error {
            crate::error::Error::InvalidArgument { rule, .. } => self.error(key, rule),
            other => self.error(key, other.to_string()),
        })
    }
}

impl Policy {
    /// Reads and validates a policy file.
    pub fn load(path: &Path) -> Result<Policy, PolicyError> {
        let source_name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|error| PolicyError {
            source_name: source_name.clone(),
            key: String::new(),
            message: format!("cannot read: {error}"),
        })?;
        Policy::parse(&text, &source_name, path.parent())
    }

    /// The embedded default policy.
    pub fn embedded_default() -> Result<Policy, PolicyError> {
        Policy::parse(EMBEDDED_DEFAULT, "<embedded>", None)
    }

    /// Parses and validates policy text. `base_dir` resolves relative paths
    /// (manifest files); without one they are refused.
    pub fn parse(
        text: &str,
        source_name: &str,
        base_dir: Option<&Path>,
    ) -> Result<Policy, PolicyError> {
        let loader = Loader {
            source_name,
            base_dir,
        };
        let raw: RawPolicy = toml::from_str(text).map_err(|error| {
            let message = error.message().to_string();
            let location = error
                .span()
                .map(|span| {
                    let line = text[..span.start.min(text.len())].matches('\n').count() + 1;
                    format!("line {line}")
                })
                .unwrap_or_default();
            loader.error(location, message)
        })?;
        let host_credentials = raw
            .credentials
            .iter()
            .filter(|credential| credential.kind == CredentialKind::Host)
            .count();
        let limits = limits(&loader, raw.limits, host_credentials)?;
        let profiles = raw.profiles;
        let mut actors = HashMap::new();
        for (name, actor) in raw.actors {
            let key = format!("actors.{name}");
            loader.identifier(&key, &name)?;
            let Some(profile) = profiles.get(&actor.profile) else {
                return Err(loader.error(
                    format!("{key}.profile"),
                    format!("no profile {:?} in [profiles]", actor.profile),
                ));
            };
            actors.insert(
                name.clone(),
                ActorProfile {
                    actor: name,
                    profile: actor.profile.clone(),
                    roles: profile.roles.clone(),
                    approval_threshold: profile.approval_threshold,
                    max_decisions: profile.max_decisions,
                    max_tool_calls: profile.max_tool_calls,
                    max_session_seconds: profile.max_session_seconds,
                },
            );
        }
        for (name, profile) in &profiles {
            if let Some(threshold) = profile.approval_threshold
                && !threshold.is_finite()
            {
                return Err(loader.error(
                    format!("profiles.{name}.approval_threshold"),
                    "must be a finite number",
                ));
            }
        }
        let state = state_policy(&loader, raw.state)?;
        let mut tools = HashMap::new();
        for (name, raw_tool) in raw.tools {
            let tool = tool(&loader, name.clone(), raw_tool, &state)?;
            tools.insert(name, tool);
        }
        let mut reviewers = HashMap::new();
        for (identity, raw_reviewer) in raw.reviewers {
            let key = format!("reviewers.{identity}");
            loader.identifier(&key, &identity)?;
            if raw_reviewer.workspaces.is_empty() {
                return Err(loader.error(
                    format!("{key}.workspaces"),
                    "must name at least one workspace (or \"*\")",
                ));
            }
            reviewers.insert(
                identity.clone(),
                Reviewer {
                    identity,
                    roles: raw_reviewer.roles,
                    workspaces: raw_reviewer.workspaces,
                    see_all: raw_reviewer.see_all,
                },
            );
        }
        let mut credentials = HashMap::new();
        for (index, raw_credential) in raw.credentials.into_iter().enumerate() {
            let key = |field: &str| format!("credentials[{index}].{field}");
            loader.identifier(&key("identity"), &raw_credential.identity)?;
            let digest = Fingerprint::from_hex(&raw_credential.sha256).ok_or_else(|| {
                loader.error(
                    key("sha256"),
                    "must be the 64-hex-digit SHA-256 digest of the token",
                )
            })?;
            match raw_credential.kind {
                CredentialKind::Host if raw_credential.actors.is_empty() => {
                    return Err(loader.error(
                        key("actors"),
                        "a host credential must list the actors it may assert (or \"*\")",
                    ));
                }
                CredentialKind::Reviewer if !raw_credential.actors.is_empty() => {
                    return Err(loader.error(key("actors"), "only host credentials assert actors"));
                }
                CredentialKind::Reviewer if !reviewers.contains_key(&raw_credential.identity) => {
                    return Err(loader.error(
                        key("identity"),
                        format!("no reviewer {:?} in [reviewers]", raw_credential.identity),
                    ));
                }
                _ => {}
            }
            let credential = Credential {
                kind: raw_credential.kind,
                identity: raw_credential.identity,
                actors: raw_credential.actors,
            };
            if credentials.insert(digest, Arc::new(credential)).is_some() {
                return Err(loader.error(key("sha256"), "the same token digest is listed twice"));
            }
        }
        let pins = pins(&loader, raw.pins)?;
        let server = server_settings(&loader, raw.server)?;
        Ok(Policy {
            revision: revision_of(text),
            tools,
            actors,
            reviewers,
            credentials,
            pins,
            limits,
            state,
            server,
        })
    }
}

fn server_settings(loader: &Loader<'_>, raw: RawServer) -> Result<ServerSettings, PolicyError> {
    let positive = [
        (
            "max_concurrent_requests",
            raw.max_concurrent_requests as u64,
        ),
        ("request_timeout_ms", raw.request_timeout_ms),
        ("max_message_bytes", raw.max_message_bytes as u64),
        (
            "http2_keepalive_interval_seconds",
            raw.http2_keepalive_interval_seconds,
        ),
        (
            "http2_keepalive_timeout_seconds",
            raw.http2_keepalive_timeout_seconds,
        ),
        (
            "max_concurrent_streams",
            u64::from(raw.max_concurrent_streams),
        ),
        ("max_connections", raw.max_connections as u64),
        (
            "max_connections_per_peer",
            raw.max_connections_per_peer as u64,
        ),
        ("handshake_timeout_ms", raw.handshake_timeout_ms),
        ("read_timeout_ms", raw.read_timeout_ms),
        ("write_timeout_ms", raw.write_timeout_ms),
        (
            "max_buffered_request_bytes",
            raw.max_buffered_request_bytes as u64,
        ),
        (
            "max_buffered_response_bytes",
            raw.max_buffered_response_bytes as u64,
        ),
    ];
    for (key, value) in positive {
        if value == 0 {
            return Err(loader.error(format!("server.{key}"), "must be greater than 0"));
        }
    }
    if raw.max_message_bytes > 64 * 1024 * 1024 {
        return Err(loader.error("server.max_message_bytes", "must be at most 64 MiB"));
    }
    Ok(ServerSettings::from(raw))
}

/// A per-host share of a global cap: as set (at most the cap), else the
/// whole cap for one host and half of it (rounded up) for more.
fn per_host_share(
    loader: &Loader<'_>,
    key: &str,
    set: Option<usize>,
    global: usize,
    host_credentials: usize,
) -> Result<usize, PolicyError> {
    match set {
        Some(0) => Err(loader.error(format!("limits.{key}"), "must be greater than 0")),
        Some(share) if share > global => Err(loader.error(
            format!("limits.{key}"),
            format!("must be at most the global cap ({global})"),
        )),
        Some(share) => Ok(share),
        None if host_credentials > 1 => Ok(global.div_ceil(2)),
        None => Ok(global),
    }
}

fn limits(
    loader: &Loader<'_>,
    raw: RawLimits,
    host_credentials: usize,
) -> Result<Limits, PolicyError> {
    let positive = [
        ("pending_ttl_seconds", raw.pending_ttl_seconds as usize),
        ("grant_ttl_seconds", raw.grant_ttl_seconds as usize),
        ("max_pending_per_actor", raw.max_pending_per_actor),
        ("max_pending_total", raw.max_pending_total),
        ("max_approval_records", raw.max_approval_records),
        ("max_sessions", raw.max_sessions),
        ("session_idle_seconds", raw.session_idle_seconds as usize),
        ("receipt_capacity", raw.receipt_capacity),
    ];
    for (key, value) in positive {
        if value == 0 {
            return Err(loader.error(format!("limits.{key}"), "must be greater than 0"));
        }
    }
    if raw.max_approval_records < raw.max_pending_total {
        return Err(loader.error(
            "limits.max_approval_records",
            "must be at least limits.max_pending_total",
        ));
    }
    Ok(Limits {
        pending_ttl: Duration::from_secs(raw.pending_ttl_seconds),
        grant_ttl: Duration::from_secs(raw.grant_ttl_seconds),
        max_pending_per_actor: raw.max_pending_per_actor,
        max_pending_total: raw.max_pending_total,
        max_approval_records: raw.max_approval_records,
        approval_retention: Duration::from_secs(raw.approval_retention_seconds),
        max_sessions: raw.max_sessions,
        session_idle_ttl: Duration::from_secs(raw.session_idle_seconds),
        decision_cost: raw.decision_cost,
        receipt_capacity: raw.receipt_capacity,
        receipt_retention: Duration::from_secs(raw.receipt_retention_seconds),
        max_sessions_per_host: per_host_share(
            loader,
            "max_sessions_per_host",
            raw.max_sessions_per_host,
            raw.max_sessions,
            host_credentials,
        )?,
        max_pending_per_host: per_host_share(
            loader,
            "max_pending_per_host",
            raw.max_pending_per_host,
            raw.max_pending_total,
            host_credentials,
        )?,
    })
}

fn tool(
    loader: &Loader<'_>,
    name: String,
    raw: RawTool,
    state: &StatePolicy,
) -> Result<Tool, PolicyError> {
    let key = format!("tools.{name}");
    loader.identifier(&key, &name)?;
    if raw.roles.is_empty() && raw.mode != Mode::Forbidden {
        return Err(loader.error(
            format!("{key}.roles"),
            "must list the actor roles that may call the tool",
        ));
    }
    let approval = match (raw.approval.as_str(), raw.threshold_argument) {
        ("never", None) => ApprovalRule::Never,
        ("always", None) => ApprovalRule::Always,
        ("threshold", Some(argument)) => ApprovalRule::Threshold { argument },
        ("threshold", None) => {
            return Err(loader.error(
                format!("{key}.threshold_argument"),
                "is required with approval = \"threshold\"",
            ));
        }
        ("never" | "always", Some(_)) => {
            return Err(loader.error(
                format!("{key}.threshold_argument"),
                "is only used with approval = \"threshold\"",
            ));
        }
        (other, _) => {
            return Err(loader.error(
                format!("{key}.approval"),
                format!("must be \"never\", \"always\" or \"threshold\", not {other:?}"),
            ));
        }
    };
    if approval != ApprovalRule::Never {
        if raw.mode != Mode::Execute {
            return Err(loader.error(
                format!("{key}.approval"),
                "only tools of mode \"execute\" can require approval",
            ));
        }
        if raw.approvers.is_empty() {
            return Err(loader.error(
                format!("{key}.approvers"),
                "must list the reviewer roles that may approve the tool",
            ));
        }
    }
    if let Some(server) = &raw.server {
        check_server_id("server", server)
            .map_err(|error| loader.error(format!("{key}.server"), error.to_string()))?;
    }
    let schema_json = match raw.input_schema {
        None => serde_json::json!({"type": "object"}),
        Some(toml::Value::String(text)) => serde_json::from_str(&text).map_err(|error| {
            loader.error(format!("{key}.input_schema"), format!("not JSON: {error}"))
        })?,
        Some(value) => toml_to_json(&value)
            .map_err(|error| loader.error(format!("{key}.input_schema"), error))?,
    };
    if !schema_json.is_object() {
        return Err(loader.error(
            format!("{key}.input_schema"),
            "must be a JSON Schema object",
        ));
    }
    let input_schema = jsonschema::validator_for(&schema_json).map_err(|error| {
        loader.error(
            format!("{key}.input_schema"),
            format!("invalid JSON Schema: {error}"),
        )
    })?;
    let effect = effect(loader, &key, raw.effect, state)?;
    if effect != Effect::None && raw.mode != Mode::Execute {
        return Err(loader.error(
            format!("{key}.effect"),
            "only tools of mode \"execute\" have an effect",
        ));
    }
    Ok(Tool {
        name,
        mode: raw.mode,
        input_schema,
        roles: raw.roles,
        approvers: raw.approvers,
        approval,
        server: raw.server,
        sensitive: raw.sensitive,
        cost: raw.cost,
        effect,
    })
}

fn effect(
    loader: &Loader<'_>,
    key: &str,
    raw: RawEffect,
    state: &StatePolicy,
) -> Result<Effect, PolicyError> {
    let key = format!("{key}.effect");
    match raw.kind.as_deref().unwrap_or("none") {
        "none" => {
            if raw.resource.is_some()
                || raw.resource_argument.is_some()
                || raw.value_argument.is_some()
                || raw.resources.is_some()
            {
                return Err(loader.error(key, "effect \"none\" takes no other keys"));
            }
            Ok(Effect::None)
        }
        "set" => {
            let (Some(resource_argument), Some(value_argument)) =
                (raw.resource_argument, raw.value_argument)
            else {
                return Err(loader.error(
                    key,
                    "effect \"set\" needs resource_argument and value_argument",
                ));
            };
            if raw.resource.is_some() {
                return Err(loader.error(
                    format!("{key}.resource"),
                    "effect \"set\" names its resource by resource_argument",
                ));
            }
            if let Some(unknown) = raw
                .resources
                .iter()
                .flatten()
                .find(|name| !state.resources.contains_key(*name))
            {
                return Err(loader.error(
                    format!("{key}.resources"),
                    format!("no state resource {unknown:?}"),
                ));
            }
            Ok(Effect::Set {
                resource_argument,
                value_argument,
                resources: raw.resources,
            })
        }
        "append" => {
            let Some(resource) = raw.resource else {
                return Err(loader.error(key, "effect \"append\" needs resource"));
            };
            match state.resources.get(&resource) {
                Some(Value::Array(_)) => {}
                Some(_) => {
                    return Err(loader.error(
                        format!("{key}.resource"),
                        format!("state resource {resource:?} is not a list"),
                    ));
                }
                None => {
                    return Err(loader.error(
                        format!("{key}.resource"),
                        format!("no state resource {resource:?}"),
                    ));
                }
            }
            if raw.resource_argument.is_some()
                || raw.value_argument.is_some()
                || raw.resources.is_some()
            {
                return Err(loader.error(key, "effect \"append\" takes only resource"));
            }
            Ok(Effect::Append { resource })
        }
        other => Err(loader.error(
            format!("{key}.kind"),
            format!("must be \"none\", \"set\" or \"append\", not {other:?}"),
        )),
    }
}

fn state_policy(loader: &Loader<'_>, raw: RawState) -> Result<StatePolicy, PolicyError> {
    let mut resources = BTreeMap::new();
    for (name, value) in raw.resources {
        let key = format!("state.resources.{name}");
        if name.is_empty() || name.len() > 64 {
            return Err(loader.error(key, "resource names are 1 to 64 characters"));
        }
        let json = toml_to_json(&value).map_err(|error| loader.error(&key, error))?;
        let text =
            serde_json::to_string(&json).map_err(|error| loader.error(&key, error.to_string()))?;
        let value =
            canonical::parse_str(&text).map_err(|error| loader.error(&key, error.to_string()))?;
        resources.insert(name, value);
    }
    Ok(StatePolicy {
        version_scope: raw.version_scope,
        resources,
    })
}

fn pins(
    loader: &Loader<'_>,
    raw_pins: Vec<RawPin>,
) -> Result<HashMap<String, PolicyPin>, PolicyError> {
    let mut pins = HashMap::new();
    for (index, raw_pin) in raw_pins.into_iter().enumerate() {
        let key = |field: &str| format!("pins[{index}].{field}");
        check_server_id("server", &raw_pin.server)
            .map_err(|invalid| loader.error(key("server"), invalid.to_string()))?;
        let manifest = match &raw_pin.manifest {
            None => None,
            Some(relative) => {
                let Some(base) = loader.base_dir else {
                    return Err(loader.error(
                        key("manifest"),
                        "a manifest file needs a policy loaded from a file",
                    ));
                };
                let path = base.join(relative);
                let bytes = std::fs::read(&path).map_err(|io| {
                    loader.error(
                        key("manifest"),
                        format!("cannot read {}: {io}", path.display()),
                    )
                })?;
                let manifest = Manifest::from_json(&bytes).map_err(|invalid| {
                    loader.error(key("manifest"), format!("{}: {invalid}", path.display()))
                })?;
                if let Some(problem) = manifest.problems().first() {
                    return Err(loader.error(
                        key("manifest"),
                        format!(
                            "{}: an unsafe manifest cannot be pinned: {problem}",
                            path.display()
                        ),
                    ));
                }
                if manifest.server_id != raw_pin.server {
                    return Err(loader.error(
                        key("manifest"),
                        format!(
                            "manifest is for server {:?}, not {:?}",
                            manifest.server_id, raw_pin.server
                        ),
                    ));
                }
                Some(Arc::new(manifest))
            }
        };
        let declared = match &raw_pin.fingerprint {
            None => None,
            Some(hex) => Some(Fingerprint::from_hex(hex).ok_or_else(|| {
                loader.error(
                    key("fingerprint"),
                    "must be 64 hexadecimal characters (SHA-256)",
                )
            })?),
        };
        let fingerprint = match (declared, &manifest) {
            (Some(declared), Some(manifest)) if declared != manifest.fingerprint() => {
                return Err(loader.error(
                    key("fingerprint"),
                    format!(
                        "does not match the manifest file, whose fingerprint is {}",
                        manifest.fingerprint()
                    ),
                ));
            }
            (Some(declared), _) => declared,
            (None, Some(manifest)) => manifest.fingerprint(),
            (None, None) => {
                return Err(loader.error(
                    key("fingerprint"),
                    "is required when no manifest file is given",
                ));
            }
        };
        let pin = PolicyPin {
            server_id: raw_pin.server.clone(),
            fingerprint,
            manifest,
        };
        if pins.insert(raw_pin.server.clone(), pin).is_some() {
            return Err(loader.error(
                key("server"),
                format!("server {:?} is pinned twice", raw_pin.server),
            ));
        }
    }
    Ok(pins)
}

/// TOML has no null and distinguishes integers from floats like JSON does.
/// `nan` and `inf` have no JSON form: refused (with the path below the key),
/// never turned into something else.
fn toml_to_json(value: &toml::Value) -> Result<serde_json::Value, String> {
    Ok(match value {
        toml::Value::String(text) => serde_json::Value::String(text.clone()),
        toml::Value::Integer(number) => serde_json::Value::from(*number),
        toml::Value::Float(number) => match serde_json::Number::from_f64(*number) {
            Some(number) => serde_json::Value::Number(number),
            None => {
                return Err(format!(
                    "{number} has no JSON form (nan and inf are refused)"
                ));
            }
        },
        toml::Value::Boolean(flag) => serde_json::Value::Bool(*flag),
        toml::Value::Datetime(datetime) => serde_json::Value::String(datetime.to_string()),
        toml::Value::Array(items) => serde_json::Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(index, item)| {
                    toml_to_json(item).map_err(|error| format!("[{index}]: {error}"))
                })
                .collect::<Result<_, _>>()?,
        ),
        toml::Value::Table(table) => serde_json::Value::Object(
            table
                .iter()
                .map(|(key, item)| {
                    toml_to_json(item)
                        .map(|json| (key.clone(), json))
                        .map_err(|error| format!(".{key}: {error}"))
                })
                .collect::<Result<_, _>>()?,
        ),
    })
}

/// First 12 hex digits of the SHA-256 of the policy text.
fn revision_of(text: &str) -> String {
    let mut hex = Fingerprint::of_bytes(text.as_bytes()).to_hex();
    hex.truncate(12);
    hex
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_default_loads() {
        let policy = Policy::embedded_default().unwrap();
        assert_eq!(policy.revision.len(), 12);
        assert!(!policy.tools.is_empty());
    }

    #[test]
    fn errors_name_the_key() {
        let cases = [
            (
                "[[pins]]\nserver = \"s\"\nfingerprint = \"xyz\"\n",
                "pins[0].fingerprint",
            ),
            ("[[pins]]\nserver = \"s\"\n", "pins[0].fingerprint"),
            (
                "[tools.t]\nmode = \"execute\"\nroles = [\"r\"]\napproval = \"sometimes\"\n",
                "tools.t.approval",
            ),
            (
                "[tools.t]\nmode = \"execute\"\nroles = [\"r\"]\napproval = \"threshold\"\napprovers = [\"x\"]\n",
                "tools.t.threshold_argument",
            ),
            (
                "[tools.t]\nmode = \"read\"\nroles = [\"r\"]\ninput_schema = { type = 12 }\n",
                "tools.t.input_schema",
            ),
            (
                "[tools.t]\nmode = \"read\"\nroles = [\"r\"]\ninput_schema = { \"$ref\" = \"https://example.com/s.json\" }\n",
                "tools.t.input_schema",
            ),
            ("[actors.a]\nprofile = \"missing\"\n", "actors.a.profile"),
            (
                "[limits]\npending_ttl_seconds = 0\n",
                "limits.pending_ttl_seconds",
            ),
            (
                "[[credentials]]\nkind = \"reviewer\"\nidentity = \"bob\"\nsha256 = \"00\"\n",
                "credentials[0].sha256",
            ),
        ];
        for (text, key) in cases {
            let error = Policy::parse(text, "p.toml", None).unwrap_err();
            assert_eq!(error.key, key, "{text}: {error}");
        }
        let error = Policy::parse(
            "[[pins]]\nserver = \"s\"\nfingerprnt = \"xyz\"\n",
            "p.toml",
            None,
        )
        .unwrap_err();
        assert!(
            error.message.contains("unknown field `fingerprnt`"),
            "{error}"
        );
        assert_eq!(error.key, "line 3");
    }
}
