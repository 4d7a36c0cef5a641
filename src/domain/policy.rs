//! The policy file (TOML, SPEC §3), parsed into an immutable, validated
//! snapshot. A reload builds a whole new `Policy`; readers never see half of
//! one. Every error names the key path and what is wrong; unknown keys are
//! errors.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use crate::domain::canonical::{self, Fingerprint, Value};
use crate::domain::ids::{check_identifier, check_server_id};
use crate::domain::manifest::{Manifest, PinReference};

/// The policy `toolgate serve` uses when no `--config` is given.
pub const EMBEDDED_DEFAULT: &str = include_str!("../../examples/policy.toml");

/// A policy file that could not be loaded: which key, what is wrong.
///
/// Displayed as `FILE: KEY: MESSAGE`; an empty part is left out (a file
/// that cannot be read has no key, and its message names the file).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", join_parts(&[source_name, key, message]))]
pub struct PolicyError {
    /// The file (or `<embedded>`).
    pub source_name: String,
    /// Key path inside the file, e.g. `tools.payment_execute.approval`.
    pub key: String,
    pub message: String,
}

/// Something a valid policy names that nothing else in it supplies (an
/// approver role that no reviewer holds, say). Not an error: `check-config`
/// prints it, `check-config --strict` fails on it, and a reload refuses a
/// policy that adds one (see [`Policy::reload_refusal`]).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct PolicyWarning {
    /// Key path inside the file.
    pub key: String,
    pub message: String,
}

impl std::fmt::Display for PolicyWarning {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(formatter, "{}: {}", self.key, self.message)
    }
}

fn join_parts(parts: &[&String]) -> String {
    parts
        .iter()
        .filter(|part| !part.is_empty())
        .map(|part| part.as_str())
        .collect::<Vec<_>>()
        .join(": ")
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
    /// `[server] open_host_api = true`: the host API takes calls without a
    /// token (as an anonymous host that may assert any actor). Only ever
    /// explicit, never the result of an absence; refused with host
    /// credentials and on a non-loopback listener, at start and at reload.
    pub open_host_api: bool,
    /// Dangling names, in key order (see [`PolicyWarning`]).
    pub warnings: Vec<PolicyWarning>,
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
    /// Longest (redacted, canonical) arguments of one approval request.
    pub max_approval_argument_bytes: usize,
    /// Bytes the approval ledger, the receipt log and the sessions'
    /// remembered call ids may hold together.
    pub max_state_bytes: usize,
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
    open_host_api: bool,
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
            open_host_api: false,
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
    max_approval_argument_bytes: usize,
    max_state_bytes: usize,
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
            max_approval_argument_bytes: 64 * 1024,
            max_state_bytes: 256 * 1024 * 1024,
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

    fn server_id(&self, key: &str, value: &str) -> Result<(), PolicyError> {
        check_server_id(key, value).map_err(|error| match error {
            crate::domain::error::Error::InvalidArgument { rule, .. } => self.error(key, rule),
            other => self.error(key, other.to_string()),
        })
    }

    fn identifier(&self, key: &str, value: &str) -> Result<(), PolicyError> {
        check_identifier(key, value).map_err(|error| match error {
            crate::domain::error::Error::InvalidArgument { rule, .. } => self.error(key, rule),
            other => self.error(key, other.to_string()),
        })
    }
}

impl Policy {
    /// Reads and validates a policy file.
    pub fn load(path: &Path) -> Result<Policy, PolicyError> {
        let source_name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|error| PolicyError {
            source_name: String::new(),
            key: String::new(),
            message: format!("cannot read {source_name}: {error}"),
        })?;
        Policy::parse(&text, &source_name, path.parent())
    }

    /// The embedded default policy.
    pub fn embedded_default() -> Result<Policy, PolicyError> {
        Policy::parse(EMBEDDED_DEFAULT, "<embedded>", None)
    }

    /// Parses and validates policy text. `base_dir` resolves relative paths
    /// (manifest files); without one they are refused.
    ///
    /// Sections are checked in this order, and the first error wins:
    /// limits, actors, profiles, state, tools, reviewers, credentials, pins,
    /// server; then how hosts authenticate.
    pub fn parse(
        text: &str,
        source_name: &str,
        base_dir: Option<&Path>,
    ) -> Result<Policy, PolicyError> {
        let loader = Loader {
            source_name,
            base_dir,
        };
        let raw: RawPolicy = decode(&loader, text)?;
        let limits = limits(&loader, raw.limits, host_credential_count(&raw.credentials))?;
        let actors = actors(&loader, raw.actors, &raw.profiles)?;
        check_profiles(&loader, &raw.profiles)?;
        let state = state_policy(&loader, raw.state)?;
        let tools = tools(&loader, raw.tools, &state)?;
        let reviewers = reviewers(&loader, raw.reviewers)?;
        let credentials = credentials(&loader, raw.credentials, &reviewers)?;
        let pins = pins(&loader, raw.pins)?;
        let open_host_api = raw.server.open_host_api;
        let server = server_settings(&loader, raw.server)?;
        let mut policy = Policy {
            revision: revision_of(text),
            tools,
            actors,
            reviewers,
            credentials,
            pins,
            limits,
            state,
            server,
            open_host_api,
            warnings: Vec::new(),
        };
        policy.check_host_access(&loader)?;
        policy.warnings = policy.dangling_names();
        Ok(policy)
    }
}

/// Host credentials decide the default per-host shares of the limits.
fn host_credential_count(credentials: &[RawCredential]) -> usize {
    credentials
        .iter()
        .filter(|credential| credential.kind == CredentialKind::Host)
        .count()
}

/// `[actors]`: each actor named by an identifier, with a profile from
/// `[profiles]` whose settings it takes.
fn actors(
    loader: &Loader<'_>,
    raw_actors: BTreeMap<String, RawActor>,
    profiles: &BTreeMap<String, RawProfile>,
) -> Result<HashMap<String, ActorProfile>, PolicyError> {
    let mut actors = HashMap::new();
    for (name, actor) in raw_actors {
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
                profile: actor.profile,
                roles: profile.roles.clone(),
                approval_threshold: profile.approval_threshold,
                max_decisions: profile.max_decisions,
                max_tool_calls: profile.max_tool_calls,
                max_session_seconds: profile.max_session_seconds,
            },
        );
    }
    Ok(actors)
}

/// `[profiles]`: an approval threshold is a finite number (checked for
/// every profile, used by an actor or not).
fn check_profiles(
    loader: &Loader<'_>,
    profiles: &BTreeMap<String, RawProfile>,
) -> Result<(), PolicyError> {
    for (name, profile) in profiles {
        if let Some(threshold) = profile.approval_threshold
            && !threshold.is_finite()
        {
            return Err(loader.error(
                format!("profiles.{name}.approval_threshold"),
                "must be a finite number",
            ));
        }
    }
    Ok(())
}

/// `[tools]`, each checked against the declared state (for its effect).
fn tools(
    loader: &Loader<'_>,
    raw_tools: BTreeMap<String, RawTool>,
    state: &StatePolicy,
) -> Result<HashMap<String, Tool>, PolicyError> {
    let mut tools = HashMap::new();
    for (name, raw_tool) in raw_tools {
        let tool = tool(loader, name.clone(), raw_tool, state)?;
        tools.insert(name, tool);
    }
    Ok(tools)
}

/// `[reviewers]`: each named by an identifier, acting in at least one
/// workspace.
fn reviewers(
    loader: &Loader<'_>,
    raw_reviewers: BTreeMap<String, RawReviewer>,
) -> Result<HashMap<String, Reviewer>, PolicyError> {
    let mut reviewers = HashMap::new();
    for (identity, raw_reviewer) in raw_reviewers {
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
    Ok(reviewers)
}

/// `[[credentials]]`, by token digest; a digest is listed once.
fn credentials(
    loader: &Loader<'_>,
    raw_credentials: Vec<RawCredential>,
    reviewers: &HashMap<String, Reviewer>,
) -> Result<HashMap<Fingerprint, Arc<Credential>>, PolicyError> {
    let mut credentials = HashMap::new();
    for (index, raw_credential) in raw_credentials.into_iter().enumerate() {
        let key = |field: &str| format!("credentials[{index}].{field}");
        let (digest, credential) = credential(loader, &key, raw_credential, reviewers)?;
        if credentials.insert(digest, Arc::new(credential)).is_some() {
            return Err(loader.error(key("sha256"), "the same token digest is listed twice"));
        }
    }
    Ok(credentials)
}

/// One credential: an identifier, a SHA-256 digest, and actors for a host
/// only (at least one); a reviewer credential names a declared reviewer.
fn credential(
    loader: &Loader<'_>,
    key: &impl Fn(&str) -> String,
    raw: RawCredential,
    reviewers: &HashMap<String, Reviewer>,
) -> Result<(Fingerprint, Credential), PolicyError> {
    loader.identifier(&key("identity"), &raw.identity)?;
    let digest = Fingerprint::from_hex(&raw.sha256).ok_or_else(|| {
        loader.error(
            key("sha256"),
            "must be the 64-hex-digit SHA-256 digest of the token",
        )
    })?;
    match raw.kind {
        CredentialKind::Host if raw.actors.is_empty() => {
            return Err(loader.error(
                key("actors"),
                "a host credential must list the actors it may assert (or \"*\")",
            ));
        }
        CredentialKind::Reviewer if !raw.actors.is_empty() => {
            return Err(loader.error(key("actors"), "only host credentials assert actors"));
        }
        CredentialKind::Reviewer if !reviewers.contains_key(&raw.identity) => {
            return Err(loader.error(
                key("identity"),
                format!("no reviewer {:?} in [reviewers]", raw.identity),
            ));
        }
        _ => {}
    }
    let credential = Credential {
        kind: raw.kind,
        identity: raw.identity,
        actors: raw.actors,
    };
    Ok((digest, credential))
}

impl Policy {
    /// Whether the policy declares at least one credential of `kind`.
    pub fn has_credentials(&self, kind: CredentialKind) -> bool {
        self.credentials
            .values()
            .any(|credential| credential.kind == kind)
    }

    /// A policy says how hosts authenticate: host credentials, or the
    /// explicit `open_host_api = true` (never both). A file with neither,
    /// such as one cut short before its `[[credentials]]`, is refused.
    fn check_host_access(&self, loader: &Loader<'_>) -> Result<(), PolicyError> {
        if self.tools.is_empty() {
            return Err(loader.error(
                "tools",
                "the policy defines no tools (is the file complete?)",
            ));
        }
        match (
            self.open_host_api,
            self.has_credentials(CredentialKind::Host),
        ) {
            (false, false) => Err(loader.error(
                "credentials",
                "no host credential: declare one ([[credentials]] with kind = \"host\"), \
                 or set [server] open_host_api = true to let any local client call the host API",
            )),
            (true, true) => Err(loader.error(
                "server.open_host_api",
                "cannot be true while [[credentials]] declares host credentials",
            )),
            _ => Ok(()),
        }
    }

    /// Whether the policy may serve on `listen`: an open host API only on a
    /// loopback address. Checked at start and at every reload.
    pub fn check_listen(&self, listen: std::net::SocketAddr) -> Result<(), String> {
        if self.open_host_api && !listen.ip().is_loopback() {
            return Err(format!(
                "refusing to serve an open host API ([server] open_host_api = true) on the non-loopback address {listen}"
            ));
        }
        Ok(())
    }

    /// Why the running server must not swap `self` (the running policy)
    /// for `new`, if it must not. A reload can never open the door nor leave
    /// the server in a state start would refuse:
    /// - `new` must be allowed on `listen` ([`Policy::check_listen`]);
    /// - it must keep at least one credential of each kind the server has
    ///   now (`running_kinds`: the policy's and those made at start);
    /// - it must not add a dangling name ([`PolicyWarning`]) that the
    ///   running policy does not have: that is what a file cut short looks
    ///   like (a reviewer whose credential is gone, a tool whose pin is gone).
    pub fn reload_refusal(
        &self,
        running_kinds: &[CredentialKind],
        new: &Policy,
        listen: std::net::SocketAddr,
    ) -> Option<String> {
        if let Err(refusal) = new.check_listen(listen) {
            return Some(refusal);
        }
        for kind in running_kinds {
            if !new.has_credentials(*kind) {
                return Some(format!(
                    "the new policy has no {kind} credential and the server has some: \
                     a reload cannot remove every {kind} credential (restart to do that)",
                    kind = kind.as_str()
                ));
            }
        }
        let added: Vec<&PolicyWarning> = new
            .warnings
            .iter()
            .filter(|warning| !self.warnings.contains(warning))
            .collect();
        if let Some(first) = added.first() {
            let more = match added.len() {
                1 => String::new(),
                count => format!(" (and {} more)", count - 1),
            };
            return Some(format!(
                "the new policy adds a dangling name (a file cut short?): {first}{more}"
            ));
        }
        None
    }

    /// Names the policy uses that nothing in it supplies, sorted.
    fn dangling_names(&self) -> Vec<PolicyWarning> {
        let mut warnings = Vec::new();
        self.unheld_roles(&mut warnings);
        self.unpinned_servers(&mut warnings);
        self.effects_without_state(&mut warnings);
        self.reviewers_without_credentials(&mut warnings);
        warnings.sort();
        warnings
    }

    /// A tool's approver role that no reviewer holds; a role that may call
    /// a (not forbidden) tool that no actor holds.
    fn unheld_roles(&self, warnings: &mut Vec<PolicyWarning>) {
        let reviewer_roles = held_roles(self.reviewers.values().map(|reviewer| &reviewer.roles));
        let actor_roles = held_roles(self.actors.values().map(|actor| &actor.roles));
        for tool in self.tools.values() {
            let key = format!("tools.{}", tool.name);
            let unheld = missing_roles(&tool.approvers, &reviewer_roles);
            if !unheld.is_empty() {
                warnings.push(PolicyWarning {
                    key: format!("{key}.approvers"),
                    message: format!("no reviewer holds role {}", unheld.join(", ")),
                });
            }
            let unheld = missing_roles(&tool.roles, &actor_roles);
            if tool.mode != Mode::Forbidden && !unheld.is_empty() {
                warnings.push(PolicyWarning {
                    key: format!("{key}.roles"),
                    message: format!("no actor holds role {}", unheld.join(", ")),
                });
            }
        }
    }

    /// A tool's server that no `[[pins]]` entry pins.
    fn unpinned_servers(&self, warnings: &mut Vec<PolicyWarning>) {
        for tool in self.tools.values() {
            if let Some(server) = &tool.server
                && !self.pins.contains_key(server)
            {
                warnings.push(PolicyWarning {
                    key: format!("tools.{}.server", tool.name),
                    message: format!(
                        "no [[pins]] entry for server {server:?}: the tool is denied \
                         manifest-unverified until a reviewer pins it"
                    ),
                });
            }
        }
    }

    /// A tool that sets a resource when the state declares none.
    fn effects_without_state(&self, warnings: &mut Vec<PolicyWarning>) {
        for tool in self.tools.values() {
            if matches!(tool.effect, Effect::Set { .. }) && self.state.resources.is_empty() {
                warnings.push(PolicyWarning {
                    key: format!("tools.{}.effect", tool.name),
                    message: "sets a resource, but [state.resources] declares none".to_string(),
                });
            }
        }
    }

    /// A reviewer with no reviewer credential to sign in with.
    fn reviewers_without_credentials(&self, warnings: &mut Vec<PolicyWarning>) {
        for reviewer in self.reviewers.values() {
            let has_credential = self.credentials.values().any(|credential| {
                credential.kind == CredentialKind::Reviewer
                    && credential.identity == reviewer.identity
            });
            if !has_credential {
                warnings.push(PolicyWarning {
                    key: format!("reviewers.{}", reviewer.identity),
                    message:
                        "no reviewer credential in [[credentials]]: this reviewer cannot sign in"
                            .to_string(),
                });
            }
        }
    }
}

/// Every role in `lists`.
fn held_roles<'a>(lists: impl Iterator<Item = &'a Vec<String>>) -> HashSet<&'a str> {
    lists.flatten().map(String::as_str).collect()
}

/// The roles of `roles` not in `held`, quoted, in order.
fn missing_roles(roles: &[String], held: &HashSet<&str>) -> Vec<String> {
    roles
        .iter()
        .filter(|role| !held.contains(role.as_str()))
        .map(|role| format!("{role:?}"))
        .collect()
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

/// `[limits]`: every cap and lifetime positive, the caps consistent with
/// each other, and the per-host shares of the global caps.
fn limits(
    loader: &Loader<'_>,
    raw: RawLimits,
    host_credentials: usize,
) -> Result<Limits, PolicyError> {
    check_positive_limits(loader, &raw)?;
    check_limit_relations(loader, &raw)?;
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
        max_approval_argument_bytes: raw.max_approval_argument_bytes,
        max_state_bytes: raw.max_state_bytes,
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

/// Caps and lifetimes that cannot be 0 (the first one that is, in this
/// order, is the error).
fn check_positive_limits(loader: &Loader<'_>, raw: &RawLimits) -> Result<(), PolicyError> {
    let positive = [
        ("pending_ttl_seconds", raw.pending_ttl_seconds as usize),
        ("grant_ttl_seconds", raw.grant_ttl_seconds as usize),
        ("max_pending_per_actor", raw.max_pending_per_actor),
        ("max_pending_total", raw.max_pending_total),
        ("max_approval_records", raw.max_approval_records),
        ("max_sessions", raw.max_sessions),
        ("session_idle_seconds", raw.session_idle_seconds as usize),
        ("receipt_capacity", raw.receipt_capacity),
        (
            "max_approval_argument_bytes",
            raw.max_approval_argument_bytes,
        ),
        ("max_state_bytes", raw.max_state_bytes),
    ];
    for (key, value) in positive {
        if value == 0 {
            return Err(loader.error(format!("limits.{key}"), "must be greater than 0"));
        }
    }
    Ok(())
}

/// Records hold at least every pending request; one request's arguments
/// fit in the state's byte budget.
fn check_limit_relations(loader: &Loader<'_>, raw: &RawLimits) -> Result<(), PolicyError> {
    if raw.max_approval_records < raw.max_pending_total {
        return Err(loader.error(
            "limits.max_approval_records",
            "must be at least limits.max_pending_total",
        ));
    }
    if raw.max_approval_argument_bytes > raw.max_state_bytes {
        return Err(loader.error(
            "limits.max_approval_argument_bytes",
            "must be at most limits.max_state_bytes",
        ));
    }
    Ok(())
}

/// One tool: who may call it, when it needs approval and by whom, the
/// schema of its arguments, and its effect.
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
    let approval = approval_rule(loader, &key, &raw.approval, raw.threshold_argument)?;
    check_approval_gate(loader, &key, &approval, raw.mode, &raw.approvers)?;
    if let Some(server) = &raw.server {
        loader.server_id(&format!("{key}.server"), server)?;
    }
    let input_schema = input_schema(loader, &key, raw.input_schema)?;
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

/// `approval = "never" | "always" | "threshold"`; a threshold names its
/// argument, and only a threshold does.
fn approval_rule(
    loader: &Loader<'_>,
    key: &str,
    approval: &str,
    threshold_argument: Option<String>,
) -> Result<ApprovalRule, PolicyError> {
    match (approval, threshold_argument) {
        ("never", None) => Ok(ApprovalRule::Never),
        ("always", None) => Ok(ApprovalRule::Always),
        ("threshold", Some(argument)) => Ok(ApprovalRule::Threshold { argument }),
        ("threshold", None) => Err(loader.error(
            format!("{key}.threshold_argument"),
            "is required with approval = \"threshold\"",
        )),
        ("never" | "always", Some(_)) => Err(loader.error(
            format!("{key}.threshold_argument"),
            "is only used with approval = \"threshold\"",
        )),
        (other, _) => Err(loader.error(
            format!("{key}.approval"),
            format!("must be \"never\", \"always\" or \"threshold\", not {other:?}"),
        )),
    }
}

/// A tool that can require approval executes, and names the reviewer roles
/// that may give it.
fn check_approval_gate(
    loader: &Loader<'_>,
    key: &str,
    approval: &ApprovalRule,
    mode: Mode,
    approvers: &[String],
) -> Result<(), PolicyError> {
    if *approval == ApprovalRule::Never {
        return Ok(());
    }
    if mode != Mode::Execute {
        return Err(loader.error(
            format!("{key}.approval"),
            "only tools of mode \"execute\" can require approval",
        ));
    }
    if approvers.is_empty() {
        return Err(loader.error(
            format!("{key}.approvers"),
            "must list the reviewer roles that may approve the tool",
        ));
    }
    Ok(())
}

/// `input_schema`: a JSON Schema object (a TOML table, or JSON text in a
/// string; `{"type": "object"}` when absent), compiled once here.
fn input_schema(
    loader: &Loader<'_>,
    key: &str,
    raw: Option<toml::Value>,
) -> Result<jsonschema::Validator, PolicyError> {
    let schema_json = match raw {
        None => serde_json::json!({"type": "object"}),
        Some(toml::Value::String(text)) => serde_json::from_str(&text).map_err(|error| {
            loader.error(format!("{key}.input_schema"), format!("not JSON: {error}"))
        })?,
        Some(value) => toml_to_json(&value, "")
            .map_err(|error| loader.error(format!("{key}.input_schema"), error))?,
    };
    if !schema_json.is_object() {
        return Err(loader.error(
            format!("{key}.input_schema"),
            "must be a JSON Schema object",
        ));
    }
    jsonschema::validator_for(&schema_json).map_err(|error| {
        loader.error(
            format!("{key}.input_schema"),
            schema_error_message(&schema_json, &error),
        )
    })
}

/// Why a schema does not compile, with the JSON pointer inside the schema.
/// The schema is the instance its meta-schema checks: the instance path is
/// that pointer.
fn schema_error_message(
    schema_json: &serde_json::Value,
    error: &jsonschema::ValidationError<'_>,
) -> String {
    match error.kind() {
        jsonschema::error::ValidationErrorKind::Referencing(_) => {
            match outside_reference(schema_json, "") {
                Some((pointer, target)) => format!(
                    "invalid JSON Schema at {pointer}: cannot resolve {target:?}: \
                     only references inside the schema (\"#/...\") are followed"
                ),
                None => format!("invalid JSON Schema: {error}"),
            }
        }
        _ => match error.instance_path().as_str() {
            "" => format!("invalid JSON Schema: {error}"),
            pointer => format!("invalid JSON Schema at {pointer}: {error}"),
        },
    }
}

/// `effect`: what a committed Dispatch of the tool does (SPEC §6), by kind.
fn effect(
    loader: &Loader<'_>,
    key: &str,
    raw: RawEffect,
    state: &StatePolicy,
) -> Result<Effect, PolicyError> {
    let key = format!("{key}.effect");
    match raw.kind.as_deref().unwrap_or("none") {
        "none" => no_effect(loader, &key, &raw),
        "set" => set_effect(loader, &key, raw, state),
        "append" => append_effect(loader, &key, raw, state),
        other => Err(loader.error(
            format!("{key}.kind"),
            format!("must be \"none\", \"set\" or \"append\", not {other:?}"),
        )),
    }
}

/// `none` (the default): a receipt only, and no other keys.
fn no_effect(loader: &Loader<'_>, key: &str, raw: &RawEffect) -> Result<Effect, PolicyError> {
    if raw.resource.is_some()
        || raw.resource_argument.is_some()
        || raw.value_argument.is_some()
        || raw.resources.is_some()
    {
        return Err(loader.error(key, "effect \"none\" takes no other keys"));
    }
    Ok(Effect::None)
}

/// `set`: names the resource and the value by argument, and may only
/// change the listed `resources`, which the state declares.
fn set_effect(
    loader: &Loader<'_>,
    key: &str,
    raw: RawEffect,
    state: &StatePolicy,
) -> Result<Effect, PolicyError> {
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

/// `append`: pushes onto one declared state resource that is a list, and
/// takes no other keys.
fn append_effect(
    loader: &Loader<'_>,
    key: &str,
    raw: RawEffect,
    state: &StatePolicy,
) -> Result<Effect, PolicyError> {
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
    if raw.resource_argument.is_some() || raw.value_argument.is_some() || raw.resources.is_some() {
        return Err(loader.error(key, "effect \"append\" takes only resource"));
    }
    Ok(Effect::Append { resource })
}

fn state_policy(loader: &Loader<'_>, raw: RawState) -> Result<StatePolicy, PolicyError> {
    let mut resources = BTreeMap::new();
    for (name, value) in raw.resources {
        let key = format!("state.resources.{name}");
        if name.is_empty() || name.len() > 64 {
            return Err(loader.error(key, "resource names are 1 to 64 characters"));
        }
        let json = toml_to_json(&value, "").map_err(|error| loader.error(&key, error))?;
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

/// `[[pins]]`: one pin per server.
fn pins(
    loader: &Loader<'_>,
    raw_pins: Vec<RawPin>,
) -> Result<HashMap<String, PolicyPin>, PolicyError> {
    let mut pins = HashMap::new();
    for (index, raw_pin) in raw_pins.into_iter().enumerate() {
        let key = |field: &str| format!("pins[{index}].{field}");
        let pin = pin(loader, &key, &raw_pin)?;
        if pins.insert(raw_pin.server.clone(), pin).is_some() {
            return Err(loader.error(
                key("server"),
                format!("server {:?} is pinned twice", raw_pin.server),
            ));
        }
    }
    Ok(pins)
}

/// One pin: a server id, and a fingerprint, a reviewed manifest file, or
/// both (when they agree).
fn pin(
    loader: &Loader<'_>,
    key: &impl Fn(&str) -> String,
    raw_pin: &RawPin,
) -> Result<PolicyPin, PolicyError> {
    loader.server_id(&key("server"), &raw_pin.server)?;
    let manifest = match &raw_pin.manifest {
        None => None,
        Some(relative) => Some(Arc::new(pinned_manifest(
            loader,
            &key("manifest"),
            relative,
            &raw_pin.server,
        )?)),
    };
    let fingerprint = pin_fingerprint(
        loader,
        &key("fingerprint"),
        raw_pin.fingerprint.as_deref(),
        manifest.as_deref(),
    )?;
    Ok(PolicyPin {
        server_id: raw_pin.server.clone(),
        fingerprint,
        manifest,
    })
}

/// The manifest file of a pin, relative to the policy file: readable, a
/// valid manifest, safe, and for the pinned server.
fn pinned_manifest(
    loader: &Loader<'_>,
    key: &str,
    relative: &Path,
    server: &str,
) -> Result<Manifest, PolicyError> {
    let Some(base) = loader.base_dir else {
        return Err(loader.error(key, "a manifest file needs a policy loaded from a file"));
    };
    let path = base.join(relative);
    let bytes = std::fs::read(&path)
        .map_err(|io| loader.error(key, format!("cannot read {}: {io}", path.display())))?;
    let manifest = Manifest::from_json(&bytes)
        .map_err(|invalid| loader.error(key, format!("{}: {invalid}", path.display())))?;
    if let Some(problem) = manifest.problems().first() {
        return Err(loader.error(
            key,
            format!(
                "{}: an unsafe manifest cannot be pinned: {problem}",
                path.display()
            ),
        ));
    }
    if manifest.server_id != server {
        return Err(loader.error(
            key,
            format!(
                "manifest is for server {:?}, not {:?}",
                manifest.server_id, server
            ),
        ));
    }
    Ok(manifest)
}

/// The pinned fingerprint: as declared (64 hex digits), which must match
/// the manifest file when there is one, or else the manifest file's.
fn pin_fingerprint(
    loader: &Loader<'_>,
    key: &str,
    declared: Option<&str>,
    manifest: Option<&Manifest>,
) -> Result<Fingerprint, PolicyError> {
    let declared = match declared {
        None => None,
        Some(hex) => Some(
            Fingerprint::from_hex(hex)
                .ok_or_else(|| loader.error(key, "must be 64 hexadecimal characters (SHA-256)"))?,
        ),
    };
    match (declared, manifest) {
        (Some(declared), Some(manifest)) if declared != manifest.fingerprint() => Err(loader
            .error(
                key,
                format!(
                    "does not match the manifest file, whose fingerprint is {}",
                    manifest.fingerprint()
                ),
            )),
        (Some(declared), _) => Ok(declared),
        (None, Some(manifest)) => Ok(manifest.fingerprint()),
        (None, None) => Err(loader.error(key, "is required when no manifest file is given")),
    }
}

// ----- decoding errors in plain words ---------------------------------------

/// Parses the TOML and decodes it into the raw policy. An error names the
/// key path it is about (found from the error's position in the text) and
/// says what is wrong in the policy's own terms, never in Rust's.
fn decode(loader: &Loader<'_>, text: &str) -> Result<RawPolicy, PolicyError> {
    let document = toml::de::DeTable::parse(text).map_err(|error| {
        let message = error.message().replace('\n', "; ");
        match error.span() {
            Some(span) => loader.error(line_and_column(text, span.start), message),
            None => loader.error("", message),
        }
    })?;
    if document.get_ref().is_empty() {
        return Err(loader.error(
            "",
            "the policy is empty: it must declare its tools and how hosts authenticate",
        ));
    }
    toml::from_str::<RawPolicy>(text).map_err(|error| {
        let path = error
            .span()
            .map(|span| key_path_at(document.get_ref(), span.start))
            .unwrap_or_default();
        let at_table = matches!(
            value_at(document.get_ref(), &path),
            Some(toml::de::DeValue::Table(_))
        );
        match plain_message(error.message(), path, at_table) {
            Some((key, message)) => loader.error(key, message),
            // Not a message we know: say where it is, as TOML put it.
            None => match error.span() {
                Some(span) => loader.error(line_and_column(text, span.start), error.message()),
                None => loader.error("", error.message()),
            },
        }
    })
}

/// The value a key path leads to.
fn value_at<'a>(
    table: &'a toml::de::DeTable<'_>,
    path: &[Segment],
) -> Option<&'a toml::de::DeValue<'a>> {
    let (Segment::Key(first), rest) = path.split_first()? else {
        return None;
    };
    let mut value = table
        .iter()
        .find(|(key, _)| key.get_ref() == first)
        .map(|(_, value)| value.get_ref())?;
    for segment in rest {
        value = match (segment, value) {
            (Segment::Key(name), toml::de::DeValue::Table(table)) => table
                .iter()
                .find(|(key, _)| key.get_ref() == name)
                .map(|(_, value)| value.get_ref())?,
            (Segment::Index(index), toml::de::DeValue::Array(items)) => {
                items.get(*index).map(|item| item.get_ref())?
            }
            _ => return None,
        };
    }
    Some(value)
}

fn line_and_column(text: &str, offset: usize) -> String {
    let before = &text[..floor_char_boundary(text, offset)];
    let line = before.matches('\n').count() + 1;
    let column = before.len() - before.rfind('\n').map_or(0, |newline| newline + 1) + 1;
    format!("line {line}, column {column}")
}

fn floor_char_boundary(text: &str, offset: usize) -> usize {
    let mut offset = offset.min(text.len());
    while !text.is_char_boundary(offset) {
        offset -= 1;
    }
    offset
}

/// One step of a key path.
enum Segment {
    Key(String),
    Index(usize),
}

/// The path of the deepest key or value whose text contains `offset`.
fn key_path_at(table: &toml::de::DeTable<'_>, offset: usize) -> Vec<Segment> {
    let mut path = Vec::new();
    descend_table(table, offset, &mut path);
    path
}

fn descend_table(table: &toml::de::DeTable<'_>, offset: usize, path: &mut Vec<Segment>) {
    for (key, value) in table {
        if key.span().contains(&offset) {
            path.push(Segment::Key(key.get_ref().to_string()));
            return;
        }
        if value.span().contains(&offset) || nested_contains(value.get_ref(), offset) {
            path.push(Segment::Key(key.get_ref().to_string()));
            descend_value(value.get_ref(), offset, path);
            return;
        }
    }
}

fn descend_value(value: &toml::de::DeValue<'_>, offset: usize, path: &mut Vec<Segment>) {
    match value {
        toml::de::DeValue::Table(table) => descend_table(table, offset, path),
        toml::de::DeValue::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                if item.span().contains(&offset) || nested_contains(item.get_ref(), offset) {
                    path.push(Segment::Index(index));
                    descend_value(item.get_ref(), offset, path);
                    return;
                }
            }
        }
        _ => {}
    }
}

/// Whether a table's or array's entries contain `offset` (a table made by
/// `[header]` sections has no one span covering all its keys).
fn nested_contains(value: &toml::de::DeValue<'_>, offset: usize) -> bool {
    match value {
        toml::de::DeValue::Table(table) => table.iter().any(|(key, value)| {
            key.span().contains(&offset)
                || value.span().contains(&offset)
                || nested_contains(value.get_ref(), offset)
        }),
        toml::de::DeValue::Array(items) => items
            .iter()
            .any(|item| item.span().contains(&offset) || nested_contains(item.get_ref(), offset)),
        _ => false,
    }
}

fn render_path(path: &[Segment]) -> String {
    let mut text = String::new();
    for segment in path {
        match segment {
            Segment::Key(key) => {
                if !text.is_empty() {
                    text.push('.');
                }
                let bare = !key.is_empty()
                    && key
                        .chars()
                        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
                if bare {
                    text.push_str(key);
                } else {
                    text.push_str(&format!("{key:?}"));
                }
            }
            Segment::Index(index) => text.push_str(&format!("[{index}]")),
        }
    }
    text
}

/// Rewrites serde's decoding messages (`invalid type: string "300",
/// expected u64`, `missing field `mode``, `unknown field `limit`, …`) in
/// plain words, and decides which key the message belongs to: a missing or
/// unknown key is reported on the table that should (not) hold it. `None`
/// for a message it does not know.
fn plain_message(
    message: &str,
    mut path: Vec<Segment>,
    at_table: bool,
) -> Option<(String, String)> {
    if let Some(rest) = message.strip_prefix("missing field ") {
        let name = first_backquoted(rest).unwrap_or(rest);
        // The position may be one of the table's keys: name the table.
        if !at_table {
            path.pop();
        }
        return Some((render_path(&path), format!("missing key {name}")));
    }
    if let Some(rest) = message.strip_prefix("unknown field ") {
        let name = first_backquoted(rest).unwrap_or(rest);
        if matches!(path.last(), Some(Segment::Key(last)) if last == name) {
            path.pop();
        }
        return Some((render_path(&path), format!("unknown key {name}")));
    }
    if let Some(rest) = message.strip_prefix("unknown variant ") {
        let name = first_backquoted(rest).unwrap_or(rest);
        let allowed = rest
            .split_once("expected ")
            .map(|(_, expected)| quote_backquoted(expected.trim_start_matches("one of ")))
            .unwrap_or_default();
        return Some((
            render_path(&path),
            format!("must be {allowed}, not {name:?}"),
        ));
    }
    for prefix in ["invalid type: ", "invalid value: "] {
        if let Some(rest) = message.strip_prefix(prefix)
            && let Some((found, expected)) = rest.rsplit_once(", expected ")
        {
            return Some((
                render_path(&path),
                format!(
                    "expected {}, found {}",
                    plain_expected(expected),
                    plain_found(found)
                ),
            ));
        }
    }
    None
}

fn first_backquoted(text: &str) -> Option<&str> {
    let start = text.find('`')? + 1;
    let length = text[start..].find('`')?;
    Some(&text[start..start + length])
}

/// `` `a`, `b` or `c` `` → `"a", "b" or "c"`.
fn quote_backquoted(text: &str) -> String {
    let mut quoted = String::new();
    let mut inside = false;
    for character in text.chars() {
        if character == '`' {
            quoted.push('"');
            inside = !inside;
        } else {
            quoted.push(character);
        }
    }
    quoted
}

fn plain_expected(expected: &str) -> String {
    match expected {
        "u8" | "u16" | "u32" | "u64" | "u128" | "usize" => "a non-negative integer".to_string(),
        "i8" | "i16" | "i32" | "i64" | "i128" | "isize" => "an integer".to_string(),
        "f32" | "f64" => "a number".to_string(),
        "a boolean" => "true or false".to_string(),
        "a sequence" => "an array".to_string(),
        "a map" => "a table".to_string(),
        "path string" => "a string (a file path)".to_string(),
        other if other.starts_with("struct ") => "a table".to_string(),
        other if other.starts_with("enum ") => "a string".to_string(),
        other => quote_backquoted(other),
    }
}

fn plain_found(found: &str) -> String {
    let value = first_backquoted(found);
    match found.split_once(' ').map_or(found, |(kind, _)| kind) {
        "string" => format!("the string {}", &found["string ".len()..]),
        "integer" => format!("the integer {}", value.unwrap_or("")),
        "floating" => format!("the number {}", value.unwrap_or("")),
        "boolean" => value.unwrap_or(found).to_string(),
        "sequence" => "an array".to_string(),
        "map" => "a table".to_string(),
        _ => quote_backquoted(found),
    }
}

/// The JSON pointer and target of the first `$ref` in a schema that points
/// outside it.
fn outside_reference(schema: &serde_json::Value, pointer: &str) -> Option<(String, String)> {
    match schema {
        serde_json::Value::Object(members) => members.iter().find_map(|(key, value)| {
            let here = format!("{pointer}/{}", key.replace('~', "~0").replace('/', "~1"));
            match (key.as_str(), value) {
                ("$ref", serde_json::Value::String(target)) if !target.starts_with('#') => {
                    Some((here, target.clone()))
                }
                _ => outside_reference(value, &here),
            }
        }),
        serde_json::Value::Array(items) => items
            .iter()
            .enumerate()
            .find_map(|(index, item)| outside_reference(item, &format!("{pointer}/{index}"))),
        _ => None,
    }
}

/// TOML has no null and distinguishes integers from floats like JSON does.
/// `nan` and `inf` have no JSON form: refused (with the JSON pointer of the
/// value below the key, `pointer` being where `value` is), never turned
/// into something else.
fn toml_to_json(value: &toml::Value, pointer: &str) -> Result<serde_json::Value, String> {
    Ok(match value {
        toml::Value::String(text) => serde_json::Value::String(text.clone()),
        toml::Value::Integer(number) => serde_json::Value::from(*number),
        toml::Value::Float(number) => match serde_json::Number::from_f64(*number) {
            Some(number) => serde_json::Value::Number(number),
            None => {
                let at = if pointer.is_empty() { "/" } else { pointer };
                return Err(format!(
                    "at {at}: {} has no JSON form (nan and inf are refused)",
                    number.to_string().to_lowercase()
                ));
            }
        },
        toml::Value::Boolean(flag) => serde_json::Value::Bool(*flag),
        toml::Value::Datetime(datetime) => serde_json::Value::String(datetime.to_string()),
        toml::Value::Array(items) => serde_json::Value::Array(
            items
                .iter()
                .enumerate()
                .map(|(index, item)| toml_to_json(item, &format!("{pointer}/{index}")))
                .collect::<Result<_, _>>()?,
        ),
        toml::Value::Table(table) => serde_json::Value::Object(
            table
                .iter()
                .map(|(key, item)| {
                    let escaped = key.replace('~', "~0").replace('/', "~1");
                    toml_to_json(item, &format!("{pointer}/{escaped}"))
                        .map(|json| (key.clone(), json))
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
            ("[limits]\nmax_state_bytes = 0\n", "limits.max_state_bytes"),
            (
                "[limits]\nmax_approval_argument_bytes = 2048\nmax_state_bytes = 1024\n",
                "limits.max_approval_argument_bytes",
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
        assert_eq!(error.message, "unknown key fingerprnt");
        assert_eq!(error.key, "pins[0]");
    }

    /// A valid base: one tool, an open host API.
    const BASE: &str = "[tools.t]\nmode = \"read\"\nroles = [\"r\"]\n[profiles.p]\nroles = [\"r\"]\n[actors.a]\nprofile = \"p\"\n[server]\nopen_host_api = true\n";

    fn error_of(text: &str) -> (String, String) {
        let error = Policy::parse(text, "p.toml", None).unwrap_err();
        (error.key, error.message)
    }

    fn pair(key: &str, message: &str) -> (String, String) {
        (key.to_string(), message.to_string())
    }

    #[test]
    fn decoding_errors_name_the_key_in_plain_words() {
        let cases = [
            (
                "[limits]\npending_ttl_seconds = \"300\"\n",
                pair(
                    "limits.pending_ttl_seconds",
                    "expected a non-negative integer, found the string \"300\"",
                ),
            ),
            (
                "[limits]\npending_ttl_seconds = -1\n",
                pair(
                    "limits.pending_ttl_seconds",
                    "expected a non-negative integer, found the integer -1",
                ),
            ),
            ("[limits]\nlimit = 3\n", pair("limits", "unknown key limit")),
            (
                "[tools.x]\nroles = [\"r\"]\n",
                pair("tools.x", "missing key mode"),
            ),
            (
                "[tools.x]\nmode = \"writ\"\nroles = [\"r\"]\n",
                pair(
                    "tools.x.mode",
                    "must be \"read\", \"propose\", \"execute\", \"forbidden\", not \"writ\"",
                ),
            ),
            (
                "[tools.x]\nmode = \"read\"\nroles = \"r\"\n",
                pair("tools.x.roles", "expected an array, found the string \"r\""),
            ),
            (
                "[[credentials]]\nkind = \"reviewer\"\nidentity = \"b\"\n",
                pair("credentials[0]", "missing key sha256"),
            ),
            ("bogus = 1\n", pair("", "unknown key bogus")),
            (
                "[reviewers.bob]\nroles = [\"x\"]\n",
                pair("reviewers.bob", "missing key workspaces"),
            ),
            (
                "[tools.x]\nmode = \"read\"\nroles = [\"r\"]\neffect = { kind = \"set\", bogus = 1 }\n",
                pair("tools.x.effect", "unknown key bogus"),
            ),
        ];
        for (text, expected) in cases {
            assert_eq!(error_of(&format!("{text}{BASE}")), expected, "{text}");
        }
        let (key, message) = error_of("[limits\n");
        assert_eq!(key, "line 1, column 8");
        assert_eq!(message, "unclosed table, expected `]`");
        let (key, message) =
            error_of("[server]\nopen_host_api = \"yes\"\n[tools.t]\nmode = \"read\"\n");
        assert_eq!(key, "server.open_host_api");
        assert_eq!(message, "expected true or false, found the string \"yes\"");
    }

    #[test]
    fn schema_errors_give_the_pointer_inside_the_schema() {
        let tool = |schema: &str| {
            format!("[tools.x]\nmode = \"read\"\nroles = [\"r\"]\ninput_schema = {schema}\n{BASE}")
        };
        let cases = [
            (
                "{ type = 12 }",
                "invalid JSON Schema at /type: 12 is not valid under any of the schemas listed in the 'anyOf' keyword",
            ),
            (
                "{ properties = { x = { minimum = \"a\" } } }",
                "invalid JSON Schema at /properties/x/minimum: \"a\" is not of type \"number\"",
            ),
            (
                "{ properties = { x = { minimum = nan } } }",
                "at /properties/x/minimum: nan has no JSON form (nan and inf are refused)",
            ),
            (
                "{ allOf = [{ properties = { x = { \"$ref\" = \"https://example.com/s.json\" } } }] }",
                "invalid JSON Schema at /allOf/0/properties/x/$ref: cannot resolve \"https://example.com/s.json\": only references inside the schema (\"#/...\") are followed",
            ),
            (
                "'{\"type\": \"object\", \"properties\": {\"a/b\": {\"type\": 1}}}'",
                "invalid JSON Schema at /properties/a~1b/type: 1 is not valid under any of the schemas listed in the 'anyOf' keyword",
            ),
        ];
        for (schema, message) in cases {
            assert_eq!(
                error_of(&tool(schema)),
                pair("tools.x.input_schema", message),
                "{schema}"
            );
        }
    }

    #[test]
    fn host_access_is_declared_and_empty_policies_are_errors() {
        let empty = "the policy is empty: it must declare its tools and how hosts authenticate";
        assert_eq!(error_of(""), pair("", empty));
        assert_eq!(error_of("# nothing\n\n"), pair("", empty));
        assert_eq!(
            error_of("[server]\nopen_host_api = true\n"),
            pair(
                "tools",
                "the policy defines no tools (is the file complete?)"
            )
        );
        assert_eq!(
            error_of(&BASE.replace("open_host_api = true", "")),
            pair(
                "credentials",
                "no host credential: declare one ([[credentials]] with kind = \"host\"), \
                 or set [server] open_host_api = true to let any local client call the host API"
            )
        );
        let both = format!(
            "{BASE}[[credentials]]\nkind = \"host\"\nidentity = \"h\"\nactors = [\"a\"]\nsha256 = \"{}\"\n",
            "0".repeat(64)
        );
        assert_eq!(
            error_of(&both),
            pair(
                "server.open_host_api",
                "cannot be true while [[credentials]] declares host credentials"
            )
        );
        let open = Policy::parse(BASE, "p.toml", None).unwrap();
        assert!(open.open_host_api);
        let loopback: std::net::SocketAddr = "127.0.0.1:1".parse().unwrap();
        let anywhere: std::net::SocketAddr = "0.0.0.0:1".parse().unwrap();
        assert_eq!(open.check_listen(loopback), Ok(()));
        assert_eq!(
            open.check_listen(anywhere),
            Err(
                "refusing to serve an open host API ([server] open_host_api = true) \
                 on the non-loopback address 0.0.0.0:1"
                    .to_string()
            )
        );
    }

    #[test]
    fn a_missing_file_is_named() {
        let error = Policy::load(Path::new("/nope.toml")).unwrap_err();
        assert_eq!(
            error.to_string(),
            "cannot read /nope.toml: No such file or directory (os error 2)"
        );
        let error = Policy::parse("[limits]\nlimit = 1\n", "p.toml", None).unwrap_err();
        assert_eq!(error.to_string(), "p.toml: limits: unknown key limit");
    }

    #[test]
    fn dangling_names_are_warnings() {
        let text = format!(
            "{BASE}[tools.pay]\nmode = \"execute\"\nroles = [\"payer\"]\napproval = \"always\"\napprovers = [\"finance\"]\nserver = \"pay-server\"\n\
             [tools.set]\nmode = \"execute\"\nroles = [\"r\"]\neffect = {{ kind = \"set\", resource_argument = \"a\", value_argument = \"b\" }}\n\
             [reviewers.bob]\nroles = [\"support\"]\nworkspaces = [\"*\"]\n"
        );
        let policy = Policy::parse(&text, "p.toml", None).unwrap();
        let warnings: Vec<String> = policy.warnings.iter().map(ToString::to_string).collect();
        assert_eq!(
            warnings,
            [
                "reviewers.bob: no reviewer credential in [[credentials]]: this reviewer cannot sign in",
                "tools.pay.approvers: no reviewer holds role \"finance\"",
                "tools.pay.roles: no actor holds role \"payer\"",
                "tools.pay.server: no [[pins]] entry for server \"pay-server\": the tool is denied manifest-unverified until a reviewer pins it",
                "tools.set.effect: sets a resource, but [state.resources] declares none",
            ]
        );
        assert!(
            Policy::parse(BASE, "p.toml", None)
                .unwrap()
                .warnings
                .is_empty()
        );
    }

    fn kinds_of(policy: &Policy) -> Vec<CredentialKind> {
        [CredentialKind::Host, CredentialKind::Reviewer]
            .into_iter()
            .filter(|kind| policy.has_credentials(*kind))
            .collect()
    }

    #[test]
    fn a_reload_never_opens_the_door() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures");
        let fixture = std::fs::read_to_string(dir.join("decide.toml")).unwrap();
        let running = Policy::parse(&fixture, "decide.toml", Some(&dir)).unwrap();
        let loopback: std::net::SocketAddr = "127.0.0.1:1".parse().unwrap();
        let kinds = kinds_of(&running);
        let refusal = |text: &str, listen| {
            let new = Policy::parse(text, "new.toml", Some(&dir)).unwrap();
            running.reload_refusal(&kinds, &new, listen)
        };
        // A real change is accepted.
        assert_eq!(
            refusal(
                &fixture.replace("max_decisions = 100\n", "max_decisions = 99\n"),
                loopback
            ),
            None
        );
        // Host credentials swapped for an open host API.
        let hosts_cut = fixture
            .split("[[credentials]]\nkind = \"host\"")
            .next()
            .unwrap();
        let reviewers = fixture
            .split("[[credentials]]")
            .skip(1)
            .filter(|entry| entry.contains("kind = \"reviewer\""))
            .map(|entry| format!("[[credentials]]{entry}"))
            .collect::<String>();
        let open = format!("{hosts_cut}{reviewers}\n[server]\nopen_host_api = true\n");
        assert_eq!(
            refusal(&open, loopback),
            Some(
                "the new policy has no host credential and the server has some: \
                 a reload cannot remove every host credential (restart to do that)"
                    .to_string()
            )
        );
        // Every reviewer credential gone (and the reviewers with them).
        let no_reviewers = fixture
            .split("[reviewers.alice]")
            .next()
            .unwrap()
            .to_string()
            + &fixture
                .split("[[credentials]]")
                .skip(1)
                .filter(|entry| entry.contains("kind = \"host\""))
                .map(|entry| format!("[[credentials]]{entry}"))
                .collect::<String>()
            + "[[pins]]\nserver = \"docs-search\"\nmanifest = \"../../examples/manifests/docs-search.json\"\n";
        assert_eq!(
            refusal(&no_reviewers, loopback),
            Some(
                "the new policy has no reviewer credential and the server has some: \
                 a reload cannot remove every reviewer credential (restart to do that)"
                    .to_string()
            )
        );
        // A reviewer whose credential vanished.
        let start = fixture
            .find("[[credentials]]\nkind = \"reviewer\"\nidentity = \"bob\"")
            .unwrap();
        let end = start + fixture[start + 1..].find("[[credentials]]").unwrap() + 1;
        let without_bob = format!("{}{}", &fixture[..start], &fixture[end..]);
        assert_eq!(
            refusal(&without_bob, loopback),
            Some(
                "the new policy adds a dangling name (a file cut short?): reviewers.bob: \
                 no reviewer credential in [[credentials]]: this reviewer cannot sign in"
                    .to_string()
            )
        );
        // An open host API, on a server without host credentials, off loopback.
        let tickets_dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
        let tickets = std::fs::read_to_string(tickets_dir.join("tickets.toml")).unwrap();
        let open_running = Policy::parse(&tickets, "tickets.toml", None).unwrap();
        let anywhere: std::net::SocketAddr = "0.0.0.0:1".parse().unwrap();
        assert_eq!(
            open_running.reload_refusal(&kinds_of(&open_running), &open_running, anywhere),
            Some(
                "refusing to serve an open host API ([server] open_host_api = true) \
                 on the non-loopback address 0.0.0.0:1"
                    .to_string()
            )
        );
    }

    /// Every prefix of `text` that ends before a line starting with `[`.
    pub(crate) fn cuts(text: &str) -> Vec<String> {
        let mut cuts = Vec::new();
        let mut offset = 0;
        for line in text.split_inclusive('\n') {
            if line.starts_with('[') {
                cuts.push(text[..offset].to_string());
            }
            offset += line.len();
        }
        cuts
    }

    #[test]
    fn a_file_cut_at_any_section_is_refused() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        let loopback: std::net::SocketAddr = "127.0.0.1:1".parse().unwrap();
        for relative in [
            "examples/policy.toml",
            "examples/tickets.toml",
            "tests/fixtures/decide.toml",
            "tests/fixtures/hostile.toml",
        ] {
            let path = root.join(relative);
            let dir = path.parent().unwrap();
            let text = std::fs::read_to_string(&path).unwrap();
            let full = Policy::parse(&text, relative, Some(dir)).unwrap();
            let cuts = cuts(&text);
            assert!(cuts.len() >= 8, "{relative}");
            for cut in cuts {
                let at = cut.lines().count();
                match Policy::parse(&cut, relative, Some(dir)) {
                    Err(_) => {}
                    Ok(truncated) => {
                        let added = truncated
                            .warnings
                            .iter()
                            .any(|warning| !full.warnings.contains(warning));
                        assert!(added, "{relative} cut after line {at}: no new warning");
                        assert!(
                            full.reload_refusal(&kinds_of(&full), &truncated, loopback)
                                .is_some(),
                            "{relative} cut after line {at}: reload accepted"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_file_cut_anywhere_never_panics_the_loader() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        for relative in ["examples/policy.toml", "tests/fixtures/hostile.toml"] {
            let path = root.join(relative);
            let text = std::fs::read_to_string(&path).unwrap();
            for end in (0..text.len()).step_by(17) {
                if text.is_char_boundary(end) {
                    // Errors or not, the loader answers.
                    let _ = Policy::parse(&text[..end], relative, path.parent());
                }
            }
        }
    }
}
