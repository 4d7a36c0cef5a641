//! `toolgate manifest assess FILE`: a manifest file sent to a running
//! server's AssessManifest, and its answer printed.

use std::process::ExitCode;

use serde::Serialize;

use toolgate::domain::manifest::ManifestForm;
use toolgate::pb;
use toolgate::pb::policy_decision_point_client::PolicyDecisionPointClient;

use crate::args::{ManifestAssessArgs, OutputFormat};
use crate::client::{MAX_ANSWER_BYTES, connect, run};
use crate::offline::{describe_manifest, read_manifest_file};
use crate::output::{Failure, cell, emit, emit_json, printable, record, say};

/// `toolgate manifest assess FILE`: 0 when accepted, 3 when the server
/// answered that it is not.
pub fn run_manifest_assess(args: &ManifestAssessArgs) -> ExitCode {
    let mut accepted = false;
    let code = run(async {
        accepted = manifest_assess(args).await?;
        Ok(())
    });
    if code == ExitCode::SUCCESS && !accepted {
        ExitCode::from(3)
    } else {
        code
    }
}

async fn manifest_assess(args: &ManifestAssessArgs) -> Result<bool, Failure> {
    // Local input is checked before any connection is made.
    let (manifest, form) = read_manifest_file(
        &args.file,
        args.server_id.as_deref(),
        args.revision.as_deref(),
        "--server-id",
    )
    .map_err(Failure::Usage)?;
    say(&describe_manifest(&args.file, &manifest, form));
    let (channel, auth) = connect(&args.client).await?;
    let mut client = PolicyDecisionPointClient::with_interceptor(channel, auth)
        .max_decoding_message_size(MAX_ANSWER_BYTES);
    let answer = client
        .assess_manifest(pb::AssessManifestRequest {
            manifest: Some(pb::Manifest::from(&manifest)),
        })
        .await?
        .into_inner();
    match args.client.output {
        OutputFormat::Table => emit(&assessment_record(&answer, form))?,
        OutputFormat::Json => emit_json(&AssessmentJson::new(&answer, form))?,
    }
    Ok(answer.accepted)
}

fn assess_reason_name(reason: pb::AssessReason) -> &'static str {
    match reason {
        pb::AssessReason::Matched => "matched",
        pb::AssessReason::Changed => "changed",
        pb::AssessReason::Unpinned => "unpinned",
        pb::AssessReason::Unspecified => "unspecified",
    }
}

fn tool_change_name(change: pb::ToolChange) -> &'static str {
    match change {
        pb::ToolChange::Added => "added",
        pb::ToolChange::Removed => "removed",
        pb::ToolChange::Modified => "modified",
        pb::ToolChange::Unsafe => "unsafe",
        pb::ToolChange::Unspecified => "unspecified",
    }
}

/// One line per diff: the tool, the change and what changed.
fn diff_summary(diff: &pb::ToolDiff) -> String {
    if diff.change() == pb::ToolChange::Unsafe {
        return format!("{} ({})", printable(&diff.problem_message), diff.problem);
    }
    let mut parts: Vec<String> = [
        (diff.description_changed, "description"),
        (diff.parameters_changed, "parameters"),
        (diff.scopes_changed, "scopes"),
        (diff.read_only_changed, "read_only"),
        (diff.title_changed, "title"),
        (diff.input_schema_changed, "inputSchema"),
        (diff.output_schema_changed, "outputSchema"),
        (diff.annotations_changed, "annotations"),
    ]
    .into_iter()
    .filter(|(changed, _)| *changed)
    .map(|(_, name)| name.to_string())
    .collect();
    let listed = |sign: char, items: &[String]| {
        items
            .iter()
            .map(|item| format!("{sign}{}", printable(item)))
            .collect::<Vec<_>>()
    };
    parts.extend(
        listed('+', &diff.scopes_added)
            .into_iter()
            .map(|item| format!("scope {item}")),
    );
    parts.extend(
        listed('-', &diff.scopes_removed)
            .into_iter()
            .map(|item| format!("scope {item}")),
    );
    if diff.widened {
        parts.push("widened".into());
    }
    parts.join(", ")
}

fn assessment_record(answer: &pb::AssessManifestResponse, form: ManifestForm) -> String {
    let mut fields = vec![
        ("form", form.as_str().to_string()),
        ("accepted", answer.accepted.to_string()),
        ("reason", assess_reason_name(answer.reason()).to_string()),
        ("fingerprint", cell(&answer.fingerprint)),
        ("pinned_fingerprint", cell(&answer.pinned_fingerprint)),
        ("pinned_revision", cell(&answer.pinned_revision)),
        ("diff_available", answer.diff_available.to_string()),
    ];
    for diff in &answer.diffs {
        fields.push((
            "diff",
            format!(
                "{} {}: {}",
                cell(&diff.tool),
                tool_change_name(diff.change()),
                diff_summary(diff)
            ),
        ));
    }
    record(&fields)
}

#[derive(Serialize)]
struct AssessmentJson<'a> {
    form: &'static str,
    accepted: bool,
    reason: &'static str,
    fingerprint: &'a str,
    pinned_fingerprint: Option<&'a str>,
    pinned_revision: Option<&'a str>,
    diff_available: bool,
    diffs: Vec<ToolDiffJson<'a>>,
}

#[derive(Serialize)]
struct ToolDiffJson<'a> {
    tool: &'a str,
    change: &'static str,
    problem: Option<&'a str>,
    problem_message: Option<&'a str>,
    description_changed: bool,
    parameters_changed: bool,
    scopes_changed: bool,
    read_only_changed: bool,
    title_changed: bool,
    input_schema_changed: bool,
    output_schema_changed: bool,
    annotations_changed: bool,
    parameters_added: &'a [String],
    parameters_removed: &'a [String],
    scopes_added: &'a [String],
    scopes_removed: &'a [String],
    widened: bool,
}

impl<'a> AssessmentJson<'a> {
    fn new(answer: &'a pb::AssessManifestResponse, form: ManifestForm) -> Self {
        let non_empty = |text: &'a str| (!text.is_empty()).then_some(text);
        AssessmentJson {
            form: match form {
                ManifestForm::Reference => "reference",
                ManifestForm::McpToolsList => "mcp-tools-list",
            },
            accepted: answer.accepted,
            reason: assess_reason_name(answer.reason()),
            fingerprint: &answer.fingerprint,
            pinned_fingerprint: non_empty(&answer.pinned_fingerprint),
            pinned_revision: non_empty(&answer.pinned_revision),
            diff_available: answer.diff_available,
            diffs: answer
                .diffs
                .iter()
                .map(|diff| ToolDiffJson {
                    tool: &diff.tool,
                    change: tool_change_name(diff.change()),
                    problem: non_empty(&diff.problem),
                    problem_message: non_empty(&diff.problem_message),
                    description_changed: diff.description_changed,
                    parameters_changed: diff.parameters_changed,
                    scopes_changed: diff.scopes_changed,
                    read_only_changed: diff.read_only_changed,
                    title_changed: diff.title_changed,
                    input_schema_changed: diff.input_schema_changed,
                    output_schema_changed: diff.output_schema_changed,
                    annotations_changed: diff.annotations_changed,
                    parameters_added: &diff.parameters_added,
                    parameters_removed: &diff.parameters_removed,
                    scopes_added: &diff.scopes_added,
                    scopes_removed: &diff.scopes_removed,
                    widened: diff.widened,
                })
                .collect(),
        }
    }
}
