//! `toolgate check-config FILE`: validates a policy file offline and
//! prints what it defines (never credential digests).

use std::fmt::Write as _;
use std::path::Path;
use std::process::ExitCode;

use toolgate::domain::canonical;
use toolgate::domain::policy::{
    ApprovalRule, Credential, Effect, Mode, Policy, PolicyWarning, VersionScope,
};

use crate::args::{CheckConfigArgs, OutputFormat, StoreKind};
use crate::output::{emit, emit_json, record, say, table};

/// `toolgate check-config FILE [--strict] [--output json]`.
///
/// - Valid: exit 0, the summary on stdout, each warning (a dangling name)
///   as `warning: FILE: KEY: MESSAGE` on stderr.
/// - Invalid: exit 1, `error: FILE: KEY: MESSAGE` on stderr, nothing on
///   stdout. With `--strict` warnings are errors.
/// - `--output json`: one object on stdout in every case: `valid`,
///   `errors` and `warnings` (each `{"file", "key", "message"}`) and, when
///   valid, the summary's fields; exit status as above.
pub fn run_check_config(args: &CheckConfigArgs) -> ExitCode {
    let file = args.file.display().to_string();
    // A `[server] store` that `serve` would refuse is an error here too.
    let loaded = Policy::load(&args.file).and_then(|policy| match store_shown(&policy) {
        Ok(_) => Ok(policy),
        Err(message) => Err(toolgate::domain::policy::PolicyError {
            source_name: args.file.display().to_string(),
            key: "server.store".to_string(),
            message,
        }),
    });
    let (policy, errors, warnings) = match loaded {
        // `--strict` refuses dangling names; the note of what serve needs of
        // its command line stays a warning.
        Ok(policy) if args.strict && !policy.warnings.is_empty() => {
            (None, policy.warnings.clone(), Vec::new())
        }
        Ok(policy) => {
            let warnings = said_of(&policy);
            (Some(policy), Vec::new(), warnings)
        }
        Err(error) => (
            None,
            vec![PolicyWarning {
                key: error.key,
                message: error.message,
            }],
            Vec::new(),
        ),
    };
    // A file that cannot be read is named by its message.
    let source = |message: &str| {
        if message.starts_with("cannot read ") {
            ""
        } else {
            file.as_str()
        }
    };
    let written = match args.output {
        OutputFormat::Table => {
            for (label, items) in [("error", &errors), ("warning", &warnings)] {
                for item in items {
                    let parts = [source(&item.message), item.key.as_str(), &item.message];
                    let line: Vec<&str> =
                        parts.into_iter().filter(|part| !part.is_empty()).collect();
                    say(&format!("{label}: {}", line.join(": ")));
                }
            }
            match &policy {
                Some(policy) => emit(&policy_summary(policy, &args.file)),
                None => Ok(()),
            }
        }
        OutputFormat::Json => {
            let entries = |items: &[PolicyWarning]| -> Vec<serde_json::Value> {
                items
                    .iter()
                    .map(|item| {
                        serde_json::json!({
                            "file": file,
                            "key": item.key,
                            "message": item.message,
                        })
                    })
                    .collect()
            };
            let mut object = match &policy {
                Some(policy) => policy_json(policy, &args.file),
                None => serde_json::json!({ "file": file }),
            };
            if let Some(fields) = object.as_object_mut() {
                fields.insert("valid".to_string(), policy.is_some().into());
                fields.insert("errors".to_string(), entries(&errors).into());
                fields.insert("warnings".to_string(), entries(&warnings).into());
            }
            emit_json(&object)
        }
    };
    match (written, policy.is_some()) {
        (Ok(()), true) => ExitCode::SUCCESS,
        (Ok(()), false) => ExitCode::FAILURE,
        (Err(failure), _) => failure.report(),
    }
}

/// Where `serve` would keep the state by `[server] store` (when neither
/// `--store` nor `TOOLGATE_STORE` says): a URL without its password. The
/// error names the rule, never the password.
fn store_shown(policy: &Policy) -> Result<String, String> {
    let Some(setting) = &policy.server.store else {
        return Ok("sqlite".to_string());
    };
    Ok(match StoreKind::parse(&setting.0)? {
        StoreKind::Sqlite => "sqlite".to_string(),
        StoreKind::Memory => "memory".to_string(),
        StoreKind::Postgres(target) => target.to_string(),
    })
}

fn mode_name(mode: Mode) -> &'static str {
    match mode {
        Mode::Read => "read",
        Mode::Propose => "propose",
        Mode::Execute => "execute",
        Mode::Forbidden => "forbidden",
    }
}

fn approval_name(rule: &ApprovalRule) -> String {
    match rule {
        ApprovalRule::Never => "never".to_string(),
        ApprovalRule::Always => "always".to_string(),
        ApprovalRule::Threshold { argument } => format!("threshold({argument})"),
    }
}

/// The warnings check-config gives a valid policy: its dangling names, and
/// what `serve` would need of its command line to start it (a file cannot
/// say whether `--tls-client-ca` will be given).
fn said_of(policy: &Policy) -> Vec<PolicyWarning> {
    let mut said = policy.warnings.clone();
    let mutual = (policy.server.tls.as_ref()).is_some_and(|tls| tls.client_ca.is_some());
    if policy.binds_client_identities() && !mutual {
        said.push(PolicyWarning {
            key: "credentials".to_string(),
            message: "credentials with client_identity need mTLS, which the policy does not \
                      serve: serve starts it only with --tls-cert, --tls-key and --tls-client-ca"
                .to_string(),
        });
    }
    said
}

fn effect_name(effect: &Effect) -> String {
    match effect {
        Effect::None => "none".to_string(),
        Effect::Set {
            resource_argument,
            value_argument,
            resources: None,
        } => format!("set({resource_argument} = {value_argument}; any resource)"),
        Effect::Set {
            resource_argument,
            value_argument,
            resources: Some(resources),
        } => format!(
            "set({resource_argument} = {value_argument}; only {})",
            resources.join(", ")
        ),
        Effect::Append { resource } => format!("append({resource})"),
    }
}

fn effect_json(effect: &Effect) -> serde_json::Value {
    match effect {
        Effect::None => serde_json::json!({ "kind": "none" }),
        Effect::Set {
            resource_argument,
            value_argument,
            resources,
        } => serde_json::json!({
            "kind": "set",
            "resource_argument": resource_argument,
            "value_argument": value_argument,
            // As the policy says it: `["*"]` for every resource.
            "resources": resources.clone().unwrap_or_else(|| vec!["*".to_string()]),
        }),
        Effect::Append { resource } => {
            serde_json::json!({ "kind": "append", "resource": resource })
        }
    }
}

fn list_cell(items: &[String]) -> String {
    if items.is_empty() {
        "-".to_string()
    } else {
        items.join(",")
    }
}

fn optional_cell<T: ToString>(value: Option<T>) -> String {
    value.map_or_else(|| "-".to_string(), |value| value.to_string())
}

fn sorted<'a, T>(items: impl Iterator<Item = (&'a String, &'a T)>) -> Vec<(&'a String, &'a T)>
where
    T: 'a,
{
    let mut items: Vec<_> = items.collect();
    items.sort_by(|left, right| left.0.cmp(right.0));
    items
}

/// A titled section: `title (n)` then the table indented (no table when empty).
fn section(text: &mut String, title: &str, headers: &[&str], rows: &[Vec<String>]) {
    let _ = writeln!(text, "\n{title} ({})", rows.len());
    if !rows.is_empty() {
        for line in table(headers, rows).lines() {
            let _ = writeln!(text, "  {line}");
        }
    }
}

fn sorted_credentials(policy: &Policy) -> Vec<&Credential> {
    // Only kind, identity and actors: the digests (map keys) are never shown.
    let mut credentials: Vec<_> = policy
        .all_credentials()
        .map(std::sync::Arc::as_ref)
        .collect();
    credentials.sort_by(|left, right| {
        (left.kind.as_str(), &left.identity).cmp(&(right.kind.as_str(), &right.identity))
    });
    credentials
}

fn limit_fields(policy: &Policy) -> Vec<(&'static str, u64)> {
    let limits = &policy.limits;
    let count = |value: usize| u64::try_from(value).unwrap_or(u64::MAX);
    vec![
        ("pending_ttl_seconds", limits.pending_ttl.as_secs()),
        ("grant_ttl_seconds", limits.grant_ttl.as_secs()),
        ("max_pending_per_actor", count(limits.max_pending_per_actor)),
        ("max_pending_total", count(limits.max_pending_total)),
        ("max_approval_records", count(limits.max_approval_records)),
        (
            "approval_retention_seconds",
            limits.approval_retention.as_secs(),
        ),
        ("max_sessions", count(limits.max_sessions)),
        ("session_idle_seconds", limits.session_idle_ttl.as_secs()),
        ("decision_cost", limits.decision_cost),
        ("receipt_capacity", count(limits.receipt_capacity)),
        (
            "receipt_retention_seconds",
            limits.receipt_retention.as_secs(),
        ),
        ("max_sessions_per_host", count(limits.max_sessions_per_host)),
        ("max_pending_per_host", count(limits.max_pending_per_host)),
    ]
}

fn version_scope_name(policy: &Policy) -> &'static str {
    match policy.state.version_scope {
        VersionScope::Global => "global",
        VersionScope::Resource => "resource",
    }
}

fn policy_summary(policy: &Policy, file: &Path) -> String {
    let mut text = String::new();
    let _ = writeln!(text, "policy {}: valid", file.display());
    text.push_str(&record(&[
        ("revision", policy.revision.clone()),
        ("version_scope", version_scope_name(policy).to_string()),
        ("open_host_api", policy.open_host_api.to_string()),
        ("store", store_shown(policy).unwrap_or_default()),
    ]));

    let tools: Vec<Vec<String>> = sorted(policy.tools.iter())
        .into_iter()
        .map(|(name, tool)| {
            vec![
                name.clone(),
                mode_name(tool.mode).to_string(),
                approval_name(&tool.approval),
                list_cell(&tool.roles),
                list_cell(&tool.approvers),
                optional_cell(tool.server.as_deref()),
                list_cell(&tool.sensitive),
                tool.cost.to_string(),
                effect_name(&tool.effect),
            ]
        })
        .collect();
    section(
        &mut text,
        "tools",
        &[
            "NAME",
            "MODE",
            "APPROVAL",
            "ROLES",
            "APPROVERS",
            "SERVER",
            "SENSITIVE",
            "COST",
            "EFFECT",
        ],
        &tools,
    );

    let actors: Vec<Vec<String>> = sorted(policy.actors.iter())
        .into_iter()
        .map(|(name, actor)| {
            vec![
                name.clone(),
                actor.profile.clone(),
                list_cell(&actor.roles),
                optional_cell(actor.approval_threshold),
                optional_cell(actor.max_decisions),
                optional_cell(actor.max_tool_calls),
                optional_cell(actor.max_session_seconds),
            ]
        })
        .collect();
    section(
        &mut text,
        "actors",
        &[
            "NAME",
            "PROFILE",
            "ROLES",
            "THRESHOLD",
            "MAX_DECISIONS",
            "MAX_TOOL_CALLS",
            "MAX_SESSION_SECONDS",
        ],
        &actors,
    );

    let reviewers: Vec<Vec<String>> = sorted(policy.reviewers.iter())
        .into_iter()
        .map(|(name, reviewer)| {
            vec![
                name.clone(),
                list_cell(&reviewer.roles),
                list_cell(&reviewer.workspaces),
            ]
        })
        .collect();
    section(
        &mut text,
        "reviewers",
        &["NAME", "ROLES", "WORKSPACES"],
        &reviewers,
    );

    let credentials: Vec<Vec<String>> = sorted_credentials(policy)
        .into_iter()
        .map(|credential| {
            vec![
                credential.kind.as_str().to_string(),
                credential.identity.clone(),
                list_cell(&credential.actors),
            ]
        })
        .collect();
    section(
        &mut text,
        "credentials",
        &["KIND", "IDENTITY", "ACTORS"],
        &credentials,
    );

    let pins: Vec<Vec<String>> = sorted(policy.pins.iter())
        .into_iter()
        .map(|(server, pin)| {
            vec![
                server.clone(),
                optional_cell(
                    pin.manifest
                        .as_ref()
                        .map(|manifest| manifest.revision.clone()),
                ),
                optional_cell(pin.manifest.as_ref().map(|manifest| manifest.tools.len())),
                pin.fingerprint.to_hex(),
            ]
        })
        .collect();
    section(
        &mut text,
        "pins",
        &["SERVER_ID", "REVISION", "TOOLS", "FINGERPRINT"],
        &pins,
    );

    let resources: Vec<Vec<String>> = policy
        .state
        .resources
        .iter()
        .map(|(name, value)| vec![name.clone(), canonical::to_canonical(value)])
        .collect();
    section(&mut text, "resources", &["NAME", "VALUE"], &resources);

    text.push_str("\nlimits\n");
    let limits: Vec<(&str, String)> = limit_fields(policy)
        .into_iter()
        .map(|(key, value)| (key, value.to_string()))
        .collect();
    for line in record(&limits).lines() {
        let _ = writeln!(text, "  {line}");
    }
    text
}

fn policy_json(policy: &Policy, file: &Path) -> serde_json::Value {
    use serde_json::json;
    let tools: Vec<_> = sorted(policy.tools.iter())
        .into_iter()
        .map(|(name, tool)| {
            let (approval, threshold_argument) = match &tool.approval {
                ApprovalRule::Never => ("never", None),
                ApprovalRule::Always => ("always", None),
                ApprovalRule::Threshold { argument } => ("threshold", Some(argument)),
            };
            json!({
                "name": name,
                "mode": mode_name(tool.mode),
                "approval": approval,
                "threshold_argument": threshold_argument,
                "roles": tool.roles,
                "approvers": tool.approvers,
                "server": tool.server,
                "sensitive": tool.sensitive,
                "cost": tool.cost,
                "effect": effect_json(&tool.effect),
            })
        })
        .collect();
    let actors: Vec<_> = sorted(policy.actors.iter())
        .into_iter()
        .map(|(name, actor)| {
            json!({
                "name": name,
                "profile": actor.profile,
                "roles": actor.roles,
                "approval_threshold": actor.approval_threshold,
                "max_decisions": actor.max_decisions,
                "max_tool_calls": actor.max_tool_calls,
                "max_session_seconds": actor.max_session_seconds,
            })
        })
        .collect();
    let reviewers: Vec<_> = sorted(policy.reviewers.iter())
        .into_iter()
        .map(|(name, reviewer)| {
            json!({ "name": name, "roles": reviewer.roles, "workspaces": reviewer.workspaces })
        })
        .collect();
    let credentials: Vec<_> = sorted_credentials(policy)
        .into_iter()
        .map(|credential| {
            json!({
                "kind": credential.kind.as_str(),
                "identity": credential.identity,
                "actors": credential.actors,
            })
        })
        .collect();
    let pins: Vec<_> = sorted(policy.pins.iter())
        .into_iter()
        .map(|(server, pin)| {
            json!({
                "server_id": server,
                "fingerprint": pin.fingerprint.to_hex(),
                "revision": pin.manifest.as_ref().map(|manifest| manifest.revision.clone()),
                "tool_count": pin.manifest.as_ref().map(|manifest| manifest.tools.len()),
            })
        })
        .collect();
    let resources: serde_json::Map<String, serde_json::Value> = policy
        .state
        .resources
        .iter()
        .map(|(name, value)| (name.clone(), canonical::to_serde_json(value)))
        .collect();
    let limits: serde_json::Map<String, serde_json::Value> = limit_fields(policy)
        .into_iter()
        .map(|(key, value)| (key.to_string(), json!(value)))
        .collect();
    json!({
        "file": file.display().to_string(),
        "revision": policy.revision,
        "open_host_api": policy.open_host_api,
        "store": store_shown(policy).ok(),
        "tools": tools,
        "actors": actors,
        "reviewers": reviewers,
        "credentials": credentials,
        "pins": pins,
        "state": { "version_scope": version_scope_name(policy), "resources": resources },
        "limits": limits,
    })
}
