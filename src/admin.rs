//! The reviewer/operator command line: `approvals`, `pins` and `resource`
//! talk to a running server through the generated gRPC clients;
//! `check-config` validates a policy file offline.
//!
//! Every client command builds a current-thread tokio runtime, connects
//! once, sends `authorization: Bearer <token>` through an interceptor and
//! prints either aligned tables or JSON. The token is never printed.
//! Failures end in one `error: …` line on stderr and an exit status:
//! 1 when the server refused the call, 2 for usage, input-file and
//! connection errors.

use std::fmt::Write as _;
use std::future::Future;
use std::io::{self, Write as _};
use std::path::Path;
use std::process::ExitCode;
use std::time::Duration;

use serde::Serialize;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Status};

use crate::canonical;
use crate::cli::{
    ApprovalsArgs, ApprovalsCommand, CheckConfigArgs, ClientArgs, ListApprovalsArgs, OutputFormat,
    PinsArgs, PinsCommand, ResourceArgs, ResourceCommand, StatusFilter,
};
use crate::manifest::Manifest;
use crate::pb;
use crate::pb::approvals_client::ApprovalsClient;
use crate::pb::manifest_pins_client::ManifestPinsClient;
use crate::pb::resources_client::ResourcesClient;
use crate::policy::{ApprovalRule, Effect, Mode, Policy, PolicyWarning};

/// How long to wait for the TCP + HTTP/2 connection before giving up.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest page `ListApprovals` serves.
const MAX_PAGE_SIZE: u32 = 500;

// ----- failures and exit codes --------------------------------------------

/// Why a command failed; decides the message and the exit status.
#[derive(Debug)]
enum Failure {
    /// Bad command-line value or local input file (exit 2).
    Usage(String),
    /// The server could not be reached (exit 2).
    Connect(String),
    /// The server answered with an error status (exit 1; 2 for `Unavailable`).
    Status(Status),
    /// Writing to stdout failed (a closed pipe ends quietly).
    Output(io::Error),
}

impl Failure {
    fn report(self) -> ExitCode {
        match self {
            Failure::Usage(message) | Failure::Connect(message) => {
                say(&format!("error: {message}"));
                ExitCode::from(2)
            }
            Failure::Status(status) => {
                say(&format!(
                    "error: {:?}: {}",
                    status.code(),
                    printable(status.message())
                ));
                if status.code() == Code::Unavailable {
                    ExitCode::from(2)
                } else {
                    ExitCode::FAILURE
                }
            }
            Failure::Output(error) if error.kind() == io::ErrorKind::BrokenPipe => {
                ExitCode::SUCCESS
            }
            Failure::Output(error) => {
                say(&format!("error: cannot write output: {error}"));
                ExitCode::from(2)
            }
        }
    }
}

impl From<Status> for Failure {
    fn from(status: Status) -> Self {
        Failure::Status(status)
    }
}

impl From<io::Error> for Failure {
    fn from(error: io::Error) -> Self {
        Failure::Output(error)
    }
}

/// An error and its sources, `: `-separated (tonic's transport errors say
/// little at the top level).
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.ends_with(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    text
}

/// One line on stderr. Unlike `eprintln!`, a closed stderr is ignored
/// rather than a panic.
fn say(line: &str) {
    let mut stderr = io::stderr().lock();
    let _ = writeln!(stderr, "{line}");
}

/// Server- or reviewer-supplied text made safe for a terminal: control
/// characters are escaped so they cannot move the cursor or recolour it.
fn printable(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_string();
    }
    text.chars()
        .map(|character| {
            if character.is_control() {
                character.escape_default().to_string()
            } else {
                character.to_string()
            }
        })
        .collect()
}

/// Runs a client command on a fresh current-thread runtime.
fn run<F>(future: F) -> ExitCode
where
    F: Future<Output = Result<(), Failure>>,
{
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            say(&format!("error: cannot start the runtime: {error}"));
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(future) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => failure.report(),
    }
}

/// Writes `text` to stdout and flushes it.
fn emit(text: &str) -> Result<(), Failure> {
    let mut stdout = io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    stdout.flush()?;
    Ok(())
}

fn emit_json<T: Serialize>(value: &T) -> Result<(), Failure> {
    let mut text = serde_json::to_string_pretty(value)
        .map_err(|error| Failure::Output(io::Error::other(error)))?;
    text.push('\n');
    emit(&text)
}

// ----- connection ---------------------------------------------------------

/// Adds `authorization: Bearer <token>` to every request (nothing without a token).
#[derive(Clone)]
struct BearerAuth {
    header: Option<MetadataValue<Ascii>>,
}

impl Interceptor for BearerAuth {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(header) = &self.header {
            request
                .metadata_mut()
                .insert("authorization", header.clone());
        }
        Ok(request)
    }
}

type Authed = InterceptedService<Channel, BearerAuth>;

/// `--server` as a URL: `host:port` gets `http://`.
fn server_url(server: &str) -> Result<String, Failure> {
    let url = if server.contains("://") {
        server.to_string()
    } else {
        format!("http://{server}")
    };
    if !url.starts_with("http://") {
        return Err(Failure::Usage(format!(
            "--server {server:?}: only http:// is supported"
        )));
    }
    Ok(url)
}

/// The authorization header; the token itself never appears in an error.
fn bearer(client: &ClientArgs) -> Result<BearerAuth, Failure> {
    let token = match &client.token {
        Some(token) if !token.0.is_empty() => token,
        _ => return Ok(BearerAuth { header: None }),
    };
    let mut header = MetadataValue::try_from(format!("Bearer {}", token.0)).map_err(|_| {
        Failure::Usage("the token (--token or TOOLGATE_TOKEN) must be printable ASCII".into())
    })?;
    header.set_sensitive(true);
    Ok(BearerAuth {
        header: Some(header),
    })
}

/// Connects eagerly so that an unreachable server is reported as such.
async fn connect(client: &ClientArgs) -> Result<(Channel, BearerAuth), Failure> {
    let auth = bearer(client)?;
    let url = server_url(&client.server)?;
    let endpoint = Endpoint::from_shared(url.clone())
        .map_err(|error| Failure::Usage(format!("--server {url:?}: {}", error_chain(&error))))?
        .connect_timeout(CONNECT_TIMEOUT);
    let channel = endpoint.connect().await.map_err(|error| {
        Failure::Connect(format!("cannot connect to {url}: {}", error_chain(&error)))
    })?;
    Ok((channel, auth))
}

// ----- JSON forms ---------------------------------------------------------

/// A JSON text field as a JSON value (strictly parsed, numbers kept exact);
/// text that does not parse is passed on as a string rather than dropped.
fn json_field(text: &str) -> serde_json::Value {
    match canonical::parse(text.as_bytes()) {
        Ok(value) => canonical::to_serde_json(&value),
        Err(_) => serde_json::Value::String(text.to_string()),
    }
}

/// A JSON text field for a table cell: canonical (ASCII-only) when it parses.
fn json_cell(text: &str) -> String {
    match canonical::parse(text.as_bytes()) {
        Ok(value) => canonical::to_canonical(&value),
        Err(_) => printable(text),
    }
}

fn rfc3339(timestamp: Option<&prost_types::Timestamp>) -> Option<String> {
    timestamp.map(ToString::to_string)
}

fn status_name(status: pb::ApprovalStatus) -> &'static str {
    match status {
        pb::ApprovalStatus::Unspecified => "unspecified",
        pb::ApprovalStatus::Pending => "pending",
        pb::ApprovalStatus::Granted => "granted",
        pb::ApprovalStatus::Denied => "denied",
        pb::ApprovalStatus::Expired => "expired",
        pb::ApprovalStatus::Consumed => "consumed",
        pb::ApprovalStatus::Revoked => "revoked",
    }
}

fn event_kind_name(kind: pb::ApprovalEventKind) -> &'static str {
    match kind {
        pb::ApprovalEventKind::Unspecified => "unspecified",
        pb::ApprovalEventKind::Requested => "requested",
        pb::ApprovalEventKind::Granted => "granted",
        pb::ApprovalEventKind::Denied => "denied",
        pb::ApprovalEventKind::Revoked => "revoked",
        pb::ApprovalEventKind::Expired => "expired",
        pb::ApprovalEventKind::Consumed => "consumed",
        pb::ApprovalEventKind::Lagged => "lagged",
    }
}

fn pin_source_name(source: pb::PinSource) -> &'static str {
    match source {
        pb::PinSource::Unspecified => "unspecified",
        pb::PinSource::Policy => "policy",
        pb::PinSource::Api => "api",
    }
}

/// `pb::Approval` with proto field names, short enum names, parsed arguments.
#[derive(Serialize)]
struct ApprovalJson<'a> {
    approval_id: &'a str,
    fingerprint: &'a str,
    actor: &'a str,
    session_id: &'a str,
    workspace: &'a str,
    tool: &'a str,
    call_id: &'a str,
    arguments: serde_json::Value,
    reason: &'a str,
    status: &'static str,
    requested_at: Option<String>,
    expires_at: Option<String>,
    decided_by: &'a str,
    decided_at: Option<String>,
    decision_note: &'a str,
    version: u64,
}

impl<'a> From<&'a pb::Approval> for ApprovalJson<'a> {
    fn from(approval: &'a pb::Approval) -> Self {
        ApprovalJson {
            approval_id: &approval.approval_id,
            fingerprint: &approval.fingerprint,
            actor: &approval.actor,
            session_id: &approval.session_id,
            workspace: &approval.workspace,
            tool: &approval.tool,
            call_id: &approval.call_id,
            arguments: json_field(&approval.arguments_json),
            reason: &approval.reason,
            status: status_name(approval.status()),
            requested_at: rfc3339(approval.requested_at.as_ref()),
            expires_at: rfc3339(approval.expires_at.as_ref()),
            decided_by: &approval.decided_by,
            decided_at: rfc3339(approval.decided_at.as_ref()),
            decision_note: &approval.decision_note,
            version: approval.version,
        }
    }
}

#[derive(Serialize)]
struct ApprovalListJson<'a> {
    approvals: Vec<ApprovalJson<'a>>,
}

#[derive(Serialize)]
struct ApprovalEventJson<'a> {
    kind: &'static str,
    approval: Option<ApprovalJson<'a>>,
    lagged: u64,
}

#[derive(Serialize)]
struct PinJson<'a> {
    server_id: &'a str,
    fingerprint: &'a str,
    revision: &'a str,
    source: &'static str,
    pinned_by: &'a str,
    pinned_at: Option<String>,
    tool_count: u32,
}

impl<'a> From<&'a pb::Pin> for PinJson<'a> {
    fn from(pin: &'a pb::Pin) -> Self {
        PinJson {
            server_id: &pin.server_id,
            fingerprint: &pin.fingerprint,
            revision: &pin.revision,
            source: pin_source_name(pin.source()),
            pinned_by: &pin.pinned_by,
            pinned_at: rfc3339(pin.pinned_at.as_ref()),
            tool_count: pin.tool_count,
        }
    }
}

#[derive(Serialize)]
struct PinListJson<'a> {
    pins: Vec<PinJson<'a>>,
}

#[derive(Serialize)]
struct ResourceJson<'a> {
    name: &'a str,
    value: serde_json::Value,
    version: u64,
}

// ----- tables -------------------------------------------------------------

/// Columns padded to their widest cell; the last column is not padded.
fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers
        .iter()
        .map(|header| header.chars().count())
        .collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    let header_row: Vec<String> = headers.iter().map(ToString::to_string).collect();
    for row in std::iter::once(&header_row).chain(rows) {
        let mut line = String::new();
        for (index, (cell, width)) in row.iter().zip(&widths).enumerate() {
            if index + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<width$}  ");
            }
        }
        text.push_str(line.trim_end());
        text.push('\n');
    }
    text
}

/// One record as `key  value` lines, keys aligned.
fn record(fields: &[(&str, String)]) -> String {
    let width = fields
        .iter()
        .map(|(key, _)| key.chars().count())
        .max()
        .unwrap_or(0);
    let mut text = String::new();
    for (key, value) in fields {
        let _ = writeln!(text, "{key:<width$}  {value}");
    }
    text
}

/// A possibly empty cell: `-` when empty, terminal-safe otherwise.
fn cell(text: &str) -> String {
    if text.is_empty() {
        "-".to_string()
    } else {
        printable(text)
    }
}

fn time_cell(timestamp: Option<&prost_types::Timestamp>) -> String {
    rfc3339(timestamp).unwrap_or_else(|| "-".to_string())
}

fn approval_record(approval: &pb::Approval) -> String {
    record(&[
        ("approval_id", cell(&approval.approval_id)),
        ("status", status_name(approval.status()).to_string()),
        ("actor", cell(&approval.actor)),
        ("session_id", cell(&approval.session_id)),
        ("workspace", cell(&approval.workspace)),
        ("tool", cell(&approval.tool)),
        ("call_id", cell(&approval.call_id)),
        ("arguments", json_cell(&approval.arguments_json)),
        ("reason", cell(&approval.reason)),
        ("fingerprint", cell(&approval.fingerprint)),
        ("requested_at", time_cell(approval.requested_at.as_ref())),
        ("expires_at", time_cell(approval.expires_at.as_ref())),
        ("decided_by", cell(&approval.decided_by)),
        ("decided_at", time_cell(approval.decided_at.as_ref())),
        ("decision_note", cell(&approval.decision_note)),
        ("version", approval.version.to_string()),
    ])
}

fn approval_table(approvals: &[pb::Approval]) -> String {
    let rows: Vec<Vec<String>> = approvals
        .iter()
        .map(|approval| {
            vec![
                cell(&approval.approval_id),
                status_name(approval.status()).to_string(),
                cell(&approval.actor),
                cell(&approval.tool),
                cell(&approval.workspace),
                cell(&approval.reason),
                time_cell(approval.requested_at.as_ref()),
                time_cell(approval.expires_at.as_ref()),
            ]
        })
        .collect();
    table(
        &[
            "ID",
            "STATUS",
            "ACTOR",
            "TOOL",
            "WORKSPACE",
            "REASON",
            "REQUESTED",
            "EXPIRES",
        ],
        &rows,
    )
}

/// One human line per watch event.
fn event_line(event: &pb::ApprovalEvent) -> String {
    let kind = event_kind_name(event.kind());
    let Some(approval) = &event.approval else {
        return format!(
            "{kind} missed={} (events were dropped; list approvals to resync)\n",
            event.lagged
        );
    };
    let mut line = format!(
        "{kind} approval_id={} status={} actor={} tool={} workspace={} reason={}",
        cell(&approval.approval_id),
        status_name(approval.status()),
        cell(&approval.actor),
        cell(&approval.tool),
        cell(&approval.workspace),
        cell(&approval.reason),
    );
    if !approval.decided_by.is_empty() {
        let _ = write!(line, " decided_by={}", printable(&approval.decided_by));
    }
    if !approval.decision_note.is_empty() {
        let _ = write!(line, " note={:?}", approval.decision_note);
    }
    line.push('\n');
    line
}

fn pin_record(pin: &pb::Pin) -> String {
    record(&[
        ("server_id", cell(&pin.server_id)),
        ("fingerprint", cell(&pin.fingerprint)),
        ("revision", cell(&pin.revision)),
        ("source", pin_source_name(pin.source()).to_string()),
        ("pinned_by", cell(&pin.pinned_by)),
        ("pinned_at", time_cell(pin.pinned_at.as_ref())),
        ("tool_count", pin.tool_count.to_string()),
    ])
}

fn pin_table(pins: &[pb::Pin]) -> String {
    let rows: Vec<Vec<String>> = pins
        .iter()
        .map(|pin| {
            vec![
                cell(&pin.server_id),
                pin_source_name(pin.source()).to_string(),
                cell(&pin.revision),
                pin.tool_count.to_string(),
                cell(&pin.pinned_by),
                time_cell(pin.pinned_at.as_ref()),
                cell(&pin.fingerprint),
            ]
        })
        .collect();
    table(
        &[
            "SERVER_ID",
            "SOURCE",
            "REVISION",
            "TOOLS",
            "PINNED_BY",
            "PINNED_AT",
            "FINGERPRINT",
        ],
        &rows,
    )
}

fn print_approval(approval: &pb::Approval, output: OutputFormat) -> Result<(), Failure> {
    match output {
        OutputFormat::Table => emit(&approval_record(approval)),
        OutputFormat::Json => emit_json(&ApprovalJson::from(approval)),
    }
}

fn print_pin(pin: &pb::Pin, output: OutputFormat) -> Result<(), Failure> {
    match output {
        OutputFormat::Table => emit(&pin_record(pin)),
        OutputFormat::Json => emit_json(&PinJson::from(pin)),
    }
}

// ----- approvals ----------------------------------------------------------

/// `toolgate approvals …`.
pub fn run_approvals(args: ApprovalsArgs) -> ExitCode {
    run(approvals(args))
}

async fn approvals(args: ApprovalsArgs) -> Result<(), Failure> {
    let output = args.client.output;
    let (channel, auth) = connect(&args.client).await?;
    let mut client = ApprovalsClient::with_interceptor(channel, auth);
    match args.command {
        ApprovalsCommand::List(filters) => list_approvals(&mut client, &filters, output).await,
        ApprovalsCommand::Get { id } => {
            let request = pb::GetApprovalRequest { approval_id: id };
            let approval = client.get_approval(request).await?.into_inner();
            print_approval(&approval, output)
        }
        ApprovalsCommand::Grant { id, comment } => {
            let request = pb::GrantApprovalRequest {
                approval_id: id,
                comment,
            };
            let approval = client.grant_approval(request).await?.into_inner();
            print_approval(&approval, output)
        }
        ApprovalsCommand::Deny { id, reason } => {
            let request = pb::DenyApprovalRequest {
                approval_id: id,
                reason,
            };
            let approval = client.deny_approval(request).await?.into_inner();
            print_approval(&approval, output)
        }
        ApprovalsCommand::Revoke { id, reason } => {
            let request = pb::RevokeApprovalRequest {
                approval_id: id,
                reason,
            };
            let approval = client.revoke_approval(request).await?.into_inner();
            print_approval(&approval, output)
        }
        ApprovalsCommand::Watch => watch_approvals(&mut client, &args.client.server, output).await,
    }
}

fn status_filter(status: StatusFilter) -> pb::ApprovalStatus {
    match status {
        StatusFilter::Pending => pb::ApprovalStatus::Pending,
        StatusFilter::Granted => pb::ApprovalStatus::Granted,
        StatusFilter::Denied => pb::ApprovalStatus::Denied,
        StatusFilter::Expired => pb::ApprovalStatus::Expired,
        StatusFilter::Consumed => pb::ApprovalStatus::Consumed,
        StatusFilter::Revoked => pb::ApprovalStatus::Revoked,
    }
}

async fn list_approvals(
    client: &mut ApprovalsClient<Authed>,
    filters: &ListApprovalsArgs,
    output: OutputFormat,
) -> Result<(), Failure> {
    let limit = filters.limit.map_or(usize::MAX, |limit| {
        usize::try_from(limit).unwrap_or(usize::MAX)
    });
    let mut approvals: Vec<pb::Approval> = Vec::new();
    let mut page_token = String::new();
    while approvals.len() < limit {
        let remaining = limit - approvals.len();
        let page_size = u32::try_from(remaining)
            .map_or(filters.page_size, |remaining| {
                remaining.min(filters.page_size)
            })
            .clamp(1, MAX_PAGE_SIZE);
        let request = pb::ListApprovalsRequest {
            status: filters
                .status
                .map_or(pb::ApprovalStatus::Unspecified, status_filter)
                .into(),
            actor: filters.actor.clone().unwrap_or_default(),
            tool: filters.tool.clone().unwrap_or_default(),
            page_size,
            page_token: page_token.clone(),
        };
        let page = client.list_approvals(request).await?.into_inner();
        approvals.extend(page.approvals);
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    approvals.truncate(limit);
    match output {
        OutputFormat::Table => emit(&approval_table(&approvals)),
        OutputFormat::Json => emit_json(&ApprovalListJson {
            approvals: approvals.iter().map(ApprovalJson::from).collect(),
        }),
    }
}

async fn watch_approvals(
    client: &mut ApprovalsClient<Authed>,
    server: &str,
    output: OutputFormat,
) -> Result<(), Failure> {
    let mut events = client
        .watch_approvals(pb::WatchApprovalsRequest {})
        .await?
        .into_inner();
    // The server subscribed before answering: from here on nothing is missed.
    say(&format!(
        "toolgate: watching approvals on {}",
        printable(server)
    ));
    loop {
        match events.message().await {
            Ok(Some(event)) => {
                let line = match output {
                    OutputFormat::Table => event_line(&event),
                    OutputFormat::Json => {
                        let approval_json = event.approval.as_ref().map(ApprovalJson::from);
                        let json = ApprovalEventJson {
                            kind: event_kind_name(event.kind()),
                            approval: approval_json,
                            lagged: event.lagged,
                        };
                        let mut line = serde_json::to_string(&json)
                            .map_err(|error| Failure::Output(io::Error::other(error)))?;
                        line.push('\n');
                        line
                    }
                };
                emit(&line)?;
            }
            Ok(None) => return Ok(()),
            // The server ending the stream at shutdown is an orderly end.
            Err(status) if status.code() == Code::Unavailable => {
                say(&format!(
                    "toolgate: watch ended: {}",
                    printable(status.message())
                ));
                return Ok(());
            }
            Err(status) => return Err(Failure::Status(status)),
        }
    }
}

// ----- pins ---------------------------------------------------------------

/// `toolgate pins …`.
pub fn run_pins(args: PinsArgs) -> ExitCode {
    run(pins(args))
}

fn read_manifest(file: &Path) -> Result<Manifest, Failure> {
    let bytes = std::fs::read(file)
        .map_err(|error| Failure::Usage(format!("cannot read {}: {error}", file.display())))?;
    Manifest::from_json(&bytes)
        .map_err(|error| Failure::Usage(format!("{}: {error}", file.display())))
}

async fn pins(args: PinsArgs) -> Result<(), Failure> {
    let output = args.client.output;
    // Local input is checked before any connection is made.
    let manifest = match &args.command {
        PinsCommand::Add { file, .. } => Some(read_manifest(file)?),
        PinsCommand::List | PinsCommand::Remove { .. } => None,
    };
    let (channel, auth) = connect(&args.client).await?;
    let mut client = ManifestPinsClient::with_interceptor(channel, auth);
    match args.command {
        PinsCommand::List => {
            let pins = client
                .list_pins(pb::ListPinsRequest {})
                .await?
                .into_inner()
                .pins;
            match output {
                OutputFormat::Table => emit(&pin_table(&pins)),
                OutputFormat::Json => emit_json(&PinListJson {
                    pins: pins.iter().map(PinJson::from).collect(),
                }),
            }
        }
        PinsCommand::Add { expect, .. } => {
            let request = pb::PinManifestRequest {
                manifest: manifest.as_ref().map(pb::Manifest::from),
                expected_fingerprint: expect.unwrap_or_default(),
            };
            let pin = client.pin_manifest(request).await?.into_inner();
            print_pin(&pin, output)
        }
        PinsCommand::Remove { server_id } => {
            let pin = client
                .remove_pin(pb::RemovePinRequest { server_id })
                .await?
                .into_inner();
            print_pin(&pin, output)
        }
    }
}

// ----- resources ----------------------------------------------------------

/// `toolgate resource …`.
pub fn run_resource(args: ResourceArgs) -> ExitCode {
    run(resource(args))
}

async fn resource(args: ResourceArgs) -> Result<(), Failure> {
    let output = args.client.output;
    let (channel, auth) = connect(&args.client).await?;
    let mut client = ResourcesClient::with_interceptor(channel, auth);
    match args.command {
        ResourceCommand::Get { name } => {
            let resource = client
                .get_resource(pb::GetResourceRequest { name })
                .await?
                .into_inner();
            match output {
                OutputFormat::Table => emit(&record(&[
                    ("name", cell(&resource.name)),
                    ("value", json_cell(&resource.value_json)),
                    ("version", resource.version.to_string()),
                ])),
                OutputFormat::Json => emit_json(&ResourceJson {
                    name: &resource.name,
                    value: json_field(&resource.value_json),
                    version: resource.version,
                }),
            }
        }
    }
}

// ----- check-config -------------------------------------------------------

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
    let (policy, errors, warnings) = match Policy::load(&args.file) {
        Ok(policy) if args.strict && !policy.warnings.is_empty() => {
            let errors = policy.warnings.clone();
            (None, errors, Vec::new())
        }
        Ok(policy) => {
            let warnings = policy.warnings.clone();
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

fn effect_name(effect: &Effect) -> String {
    match effect {
        Effect::None => "none".to_string(),
        Effect::Set {
            resource_argument,
            value_argument,
            resources: None,
        } => format!("set({resource_argument} = {value_argument})"),
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
            "resources": resources,
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

fn sorted_credentials(policy: &Policy) -> Vec<&crate::policy::Credential> {
    // Only kind, identity and actors: the digests (map keys) are never shown.
    let mut credentials: Vec<_> = policy
        .credentials
        .values()
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
    ]
}

fn version_scope_name(policy: &Policy) -> &'static str {
    match policy.state.version_scope {
        crate::policy::VersionScope::Global => "global",
        crate::policy::VersionScope::Resource => "resource",
    }
}

fn policy_summary(policy: &Policy, file: &Path) -> String {
    let mut text = String::new();
    let _ = writeln!(text, "policy {}: valid", file.display());
    text.push_str(&record(&[
        ("revision", policy.revision.clone()),
        ("version_scope", version_scope_name(policy).to_string()),
        ("open_host_api", policy.open_host_api.to_string()),
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
        "tools": tools,
        "actors": actors,
        "reviewers": reviewers,
        "credentials": credentials,
        "pins": pins,
        "state": { "version_scope": version_scope_name(policy), "resources": resources },
        "limits": limits,
    })
}
