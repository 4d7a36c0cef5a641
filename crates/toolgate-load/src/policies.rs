//! The policy files and the manifest the load generator serves toolgate
//! with, written to a temporary directory. Limits are raised so that no
//! budget, cap or TTL ends a run: what is measured is the work of a
//! decision, not a refusal.

use std::fmt::Write as _;
use std::path::PathBuf;

use sha2::{Digest, Sha256};
use toolgate::pb;

/// The host token every load request carries (the policy lists its digest).
pub const HOST_TOKEN: &str = "toolgate-load-host-token";
/// The reviewer token the setup grants approvals with.
pub const REVIEWER_TOKEN: &str = "toolgate-load-reviewer-token";
/// The one actor every session runs as.
pub const ACTOR: &str = "bench-agent";
/// The workspace every session works in.
pub const WORKSPACE: &str = "bench";
/// The header the ext-authz scenario's actor comes in (`[ext_authz]`).
pub const EXT_AUTHZ_ACTOR_HEADER: &str = "x-bench-actor";
/// The manifest server the read tool belongs to (pinned by the policy).
pub const MANIFEST_SERVER: &str = "bench-docs";
/// Tools in the manifest of the AssessManifest scenario.
pub const MANIFEST_TOOLS: usize = 20;
/// The resource the Dispatch replay scenario commits once.
pub const REPLAY_RESOURCE: &str = "replay-lamp";

fn sha256_hex(text: &str) -> String {
    hex::encode(Sha256::digest(text.as_bytes()))
}

/// The name of commit slot `slot`'s resource (one resource per slot, so
/// pre-granted proposals commit in any order; see `scenarios::CommitPool`).
pub fn commit_resource(slot: usize) -> String {
    format!("t-{slot:06}")
}

/// TTLs and retention far longer than a run; pending approvals and records
/// capped at 500,000, so that in the commit scenario the ledger evicts its
/// consumed approvals and stops growing, as a deployment's would; the
/// receipt log (kept for its retention, by contract) does grow, so the byte
/// budget of the state is raised past what a run commits (8 GiB).
const LIMITS: &str = r#"[limits]
pending_ttl_seconds = 86400
grant_ttl_seconds = 86400
max_pending_per_actor = 500000
max_pending_total = 500000
max_pending_per_host = 500000
max_approval_records = 500000
approval_retention_seconds = 86400
max_sessions = 1000000
session_idle_seconds = 86400
receipt_capacity = 10000000
receipt_retention_seconds = 86400
max_state_bytes = 8589934592
"#;

fn credentials() -> String {
    format!(
        r#"
[reviewers.bench-reviewer]
roles = ["bench-approver"]
workspaces = ["*"]

[[credentials]]
kind = "host"
identity = "bench-host"
sha256 = "{host}"
actors = ["{ACTOR}"]

[[credentials]]
kind = "reviewer"
identity = "bench-reviewer"
sha256 = "{reviewer}"
"#,
        host = sha256_hex(HOST_TOKEN),
        reviewer = sha256_hex(REVIEWER_TOKEN),
    )
}

/// The policy of the throughput scenarios: a read tool gated on a pinned
/// 20-tool manifest, a threshold tool, and two `set` tools over
/// `commit_resources` resources, versioned per resource: `set_ticket`
/// always needs approval, `set_direct` never does.
pub fn throughput_policy(commit_resources: usize) -> String {
    let mut text =
        String::from("# Written by toolgate-load: the policy of the throughput scenarios.\n");
    text.push_str(LIMITS);
    text.push_str(&format!(
        r#"
[profiles.bench]
roles = ["reader", "payer", "ticketer"]
approval_threshold = 1000

[actors.{ACTOR}]
profile = "bench"

[tools.search_docs]
mode = "read"
roles = ["reader"]
server = "{MANIFEST_SERVER}"
cost = 1
input_schema = {{ type = "object", required = ["query"], additionalProperties = false, properties = {{ query = {{ type = "string", maxLength = 512 }}, limit = {{ type = "integer", minimum = 1, maximum = 50 }} }} }}

[tools.pay]
mode = "execute"
roles = ["payer"]
approvers = ["bench-approver"]
approval = "threshold"
threshold_argument = "amount"
sensitive = ["account_number"]
cost = 5
input_schema = {{ type = "object", required = ["amount", "currency", "account_number"], additionalProperties = false, properties = {{ amount = {{ type = "number", exclusiveMinimum = 0 }}, currency = {{ type = "string", enum = ["BRL", "EUR", "USD"] }}, account_number = {{ type = "string", pattern = "^[0-9]{{6,20}}$" }}, memo = {{ type = "string", maxLength = 140 }} }} }}

[tools.set_ticket]
mode = "execute"
roles = ["ticketer"]
approvers = ["bench-approver"]
approval = "always"
cost = 1
effect = {{ kind = "set", resource_argument = "ticket", value_argument = "status", resources = ["*"] }}
input_schema = {{ type = "object", required = ["ticket", "status"], additionalProperties = false, properties = {{ ticket = {{ type = "string", pattern = "^[a-z][a-z0-9-]{{0,31}}$" }}, status = {{ type = "string", enum = ["open", "done"] }} }} }}

[tools.set_direct]
mode = "execute"
roles = ["ticketer"]
approval = "never"
cost = 1
effect = {{ kind = "set", resource_argument = "ticket", value_argument = "status", resources = ["*"] }}
input_schema = {{ type = "object", required = ["ticket", "status"], additionalProperties = false, properties = {{ ticket = {{ type = "string", pattern = "^[a-z][a-z0-9-]{{0,31}}$" }}, status = {{ type = "string", enum = ["open", "done"] }} }} }}

[tools.lookup]
mode = "read"
roles = ["reader"]
cost = 1
input_schema = {{ type = "object", required = ["query"], additionalProperties = false, properties = {{ query = {{ type = "string", maxLength = 512 }}, limit = {{ type = "integer", minimum = 1, maximum = 50 }} }} }}

[[pins]]
server = "{MANIFEST_SERVER}"
manifest = "bench-docs.json"

[ext_authz]
actor_header = "{EXT_AUTHZ_ACTOR_HEADER}"
session_header = "mcp-session-id"
workspace = "{WORKSPACE}"
host_credential = "bench-host"
"#
    ));
    text.push_str(&credentials());
    text.push_str("\n[state]\nversion_scope = \"resource\"\n\n[state.resources]\n");
    let _ = writeln!(text, "{REPLAY_RESOURCE} = \"open\"");
    for slot in 0..commit_resources {
        let _ = writeln!(text, "{} = \"open\"", commit_resource(slot));
    }
    text
}

/// Name of tool `index` in the tool-count policies.
pub fn scaling_tool(index: usize) -> String {
    format!("tool_{index:05}")
}

/// A policy with `tools` read tools, each with its own small input schema.
pub fn tools_policy(tools: usize) -> String {
    let mut text = format!("# Written by toolgate-load: {tools} tools.\n");
    text.push_str(LIMITS);
    text.push_str(&format!(
        "\n[profiles.bench]\nroles = [\"reader\"]\n\n[actors.{ACTOR}]\nprofile = \"bench\"\n"
    ));
    for index in 0..tools {
        let _ = write!(
            text,
            "\n[tools.{}]\nmode = \"read\"\nroles = [\"reader\"]\ninput_schema = {{ type = \"object\", required = [\"query\"], additionalProperties = false, properties = {{ query = {{ type = \"string\", maxLength = {} }}, limit = {{ type = \"integer\", minimum = 1, maximum = 50 }} }} }}\n",
            scaling_tool(index),
            256 + index % 256,
        );
    }
    text.push_str(&credentials());
    text
}

/// The memory policy: a read tool and an always-approved execute tool, both
/// taking one small integer argument (so an approval's arguments are tiny).
pub fn memory_policy() -> String {
    let mut text = String::from("# Written by toolgate-load: memory per session / approval.\n");
    text.push_str(LIMITS);
    text.push_str(&format!(
        r#"
[profiles.bench]
roles = ["reader", "ticketer"]

[actors.{ACTOR}]
profile = "bench"

[tools.note]
mode = "read"
roles = ["reader"]
input_schema = {{ type = "object", required = ["n"], additionalProperties = false, properties = {{ n = {{ type = "integer" }} }} }}

[tools.approve_me]
mode = "execute"
roles = ["ticketer"]
approvers = ["bench-approver"]
approval = "always"
input_schema = {{ type = "object", required = ["n"], additionalProperties = false, properties = {{ n = {{ type = "integer" }} }} }}
"#
    ));
    text.push_str(&credentials());
    text
}

/// The recovery policy: pending approvals, sessions and receipts capped far
/// above what the fill makes (`count` of each), a read tool (decisions
/// only), an always-approved tool (one pending approval per call) and an
/// approval-free `set` tool over `resources` resources, versioned per
/// resource (receipts).
pub fn recovery_policy(count: usize, resources: usize) -> String {
    let cap = (count * 4).max(1000);
    let mut text = String::from("# Written by toolgate-load: recovery and bytes on disk.\n");
    let _ = write!(
        text,
        r#"[limits]
pending_ttl_seconds = 86400
grant_ttl_seconds = 86400
max_pending_per_actor = {cap}
max_pending_total = {cap}
max_pending_per_host = {cap}
max_approval_records = {cap}
approval_retention_seconds = 86400
max_sessions = {cap}
max_sessions_per_host = {cap}
session_idle_seconds = 86400
receipt_capacity = {cap}
receipt_retention_seconds = 86400
max_state_bytes = 8589934592
"#
    );
    text.push_str(&format!(
        r#"
[profiles.bench]
roles = ["reader", "ticketer"]

[actors.{ACTOR}]
profile = "bench"

[tools.note]
mode = "read"
roles = ["reader"]
input_schema = {{ type = "object", required = ["n"], additionalProperties = false, properties = {{ n = {{ type = "integer" }} }} }}

[tools.approve_me]
mode = "execute"
roles = ["ticketer"]
approvers = ["bench-approver"]
approval = "always"
input_schema = {{ type = "object", required = ["n"], additionalProperties = false, properties = {{ n = {{ type = "integer" }} }} }}

[tools.set_direct]
mode = "execute"
roles = ["ticketer"]
approval = "never"
effect = {{ kind = "set", resource_argument = "ticket", value_argument = "status", resources = ["*"] }}
input_schema = {{ type = "object", required = ["ticket", "status"], additionalProperties = false, properties = {{ ticket = {{ type = "string", pattern = "^[a-z][a-z0-9-]{{0,31}}$" }}, status = {{ type = "string", enum = ["open", "done"] }} }} }}
"#
    ));
    text.push_str(&credentials());
    text.push_str("\n[state]\nversion_scope = \"resource\"\n\n[state.resources]\n");
    for slot in 0..resources {
        let _ = writeln!(text, "{} = \"open\"", commit_resource(slot));
    }
    text
}

/// The 20-tool manifest (about 10 KB as JSON, the shape of the criterion
/// bench `canonicalize+fingerprint/manifest_10KB`), as the gRPC message.
pub fn manifest_message() -> pb::Manifest {
    let tools = (0..MANIFEST_TOOLS)
        .map(|index| pb::ManifestTool {
            name: format!("tool_{index:02}"),
            description: "Searches the documentation index and returns ranked passages. "
                .repeat(3),
            parameters: vec![
                "query".into(),
                "limit".into(),
                "cursor".into(),
                format!("filter_{index}"),
            ],
            read_only: index % 2 == 0,
            scopes: vec![
                "docs:read".into(),
                "cache:read".into(),
                format!("scope_{index}"),
            ],
            input_schema_json: r#"{"type":"object","properties":{"query":{"type":"string","maxLength":256},"limit":{"type":"integer","minimum":1,"maximum":50}},"required":["query"]}"#.into(),
            ..pb::ManifestTool::default()
        })
        .collect();
    pb::Manifest {
        server_id: MANIFEST_SERVER.into(),
        revision: "2026-11-01".into(),
        tools,
    }
}

/// The same manifest as the JSON file the policy pins.
pub fn manifest_json() -> String {
    let manifest = manifest_message();
    let tools: Vec<serde_json::Value> = manifest
        .tools
        .iter()
        .map(|tool| {
            let schema: serde_json::Value =
                serde_json::from_str(&tool.input_schema_json).unwrap_or_default();
            serde_json::json!({
                "tool": tool.name,
                "description": tool.description,
                "parameters": tool.parameters,
                "read_only": tool.read_only,
                "scopes": tool.scopes,
                "inputSchema": schema,
            })
        })
        .collect();
    serde_json::json!({
        "server": manifest.server_id,
        "revision": manifest.revision,
        "tools": tools,
    })
    .to_string()
}

/// A temporary directory that holds the generated files; removed on drop.
#[derive(Debug)]
pub struct Workdir {
    path: PathBuf,
}

impl Workdir {
    pub fn create() -> std::io::Result<Self> {
        let path = std::env::temp_dir().join(format!(
            "toolgate-load-{}-{}",
            std::process::id(),
            uuid::Uuid::new_v4().simple()
        ));
        std::fs::create_dir_all(&path)?;
        Ok(Workdir { path })
    }

    pub fn path(&self) -> &std::path::Path {
        &self.path
    }

    /// Writes `text` to `name` inside the directory and returns its path.
    pub fn write(&self, name: &str, text: &str) -> std::io::Result<PathBuf> {
        let path = self.path.join(name);
        std::fs::write(&path, text)?;
        Ok(path)
    }
}

impl Drop for Workdir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.path);
    }
}
