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
use std::sync::OnceLock;
use std::time::Duration;

use prost_reflect::{DescriptorPool, DynamicMessage};
use serde::Serialize;
use tonic::metadata::{Ascii, MetadataValue};
use tonic::service::Interceptor;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Request, Status};

use crate::canonical;
use crate::cli::ManifestAssessArgs;
use crate::cli::{
    ApprovalsArgs, ApprovalsCommand, CheckConfigArgs, ClientArgs, ListApprovalsArgs, OutputFormat,
    PinsArgs, PinsCommand, ResourceArgs, ResourceCommand, StatusFilter,
};
use crate::manifest::{Manifest, ManifestForm};
use crate::pb;
use crate::pb::approvals_client::ApprovalsClient;
use crate::pb::manifest_pins_client::ManifestPinsClient;
use crate::pb::policy_decision_point_client::PolicyDecisionPointClient;
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
    /// Refused on the server's answer, by the client (exit 1): e.g. no
    /// approval id starts with the prefix given.
    Refused(String),
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
            Failure::Refused(message) => {
                say(&format!("error: {message}"));
                ExitCode::FAILURE
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

// ----- JSON: protobuf's canonical JSON mapping -----------------------------

/// The descriptors of the toolgate API, decoded once.
fn descriptor_pool() -> Result<&'static DescriptorPool, Failure> {
    static POOL: OnceLock<Result<DescriptorPool, String>> = OnceLock::new();
    POOL.get_or_init(|| {
        DescriptorPool::decode(pb::FILE_DESCRIPTOR_SET).map_err(|error| error.to_string())
    })
    .as_ref()
    .map_err(|error| {
        Failure::Output(io::Error::other(format!(
            "cannot read the API descriptors: {error}"
        )))
    })
}

/// A message in protobuf's canonical JSON mapping, as grpcurl prints it:
/// lowerCamelCase field names, enum value names, 64-bit integers as
/// strings, timestamps in RFC 3339, fields with default values left out.
/// `full_name` is the message's proto name (`toolgate.v1.Approval`).
fn proto_json<M: prost::Message>(
    message: &M,
    full_name: &str,
    pretty: bool,
) -> Result<String, Failure> {
    let failed = |what: String| Failure::Output(io::Error::other(what));
    let descriptor = descriptor_pool()?
        .get_message_by_name(full_name)
        .ok_or_else(|| failed(format!("no message {full_name} in the API descriptors")))?;
    let dynamic = DynamicMessage::decode(descriptor, message.encode_to_vec().as_slice())
        .map_err(|error| failed(format!("cannot re-read {full_name}: {error}")))?;
    let text = if pretty {
        serde_json::to_string_pretty(&dynamic)
    } else {
        serde_json::to_string(&dynamic)
    };
    text.map_err(|error| failed(format!("cannot write {full_name} as JSON: {error}")))
}

/// One message as a pretty JSON document on stdout.
fn emit_proto<M: prost::Message>(message: &M, full_name: &str) -> Result<(), Failure> {
    let mut text = proto_json(message, full_name, true)?;
    text.push('\n');
    emit(&text)
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

// ----- tables -------------------------------------------------------------

/// The widest line `approvals list`, `approvals watch` and `resource list`
/// print: they fit a 100-column terminal.
pub const LINE_WIDTH: usize = 100;
/// Ends a cell or line that was cut to fit.
const CUT_MARKER: char = '…';
/// Shown approval ids are unique prefixes of at least this many characters.
const SHORT_ID_LEN: usize = 8;

/// `text` cut to `width` characters, the last one the cut marker.
fn clip(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_string();
    }
    let mut clipped: String = text.chars().take(width.saturating_sub(1)).collect();
    if width > 0 {
        clipped.push(CUT_MARKER);
    }
    clipped
}

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

/// A table whose last column is cut so that every line fits [`LINE_WIDTH`]
/// (the other columns are expected to be bounded already).
fn fitted_table(headers: &[&str], mut rows: Vec<Vec<String>>) -> String {
    let leading = headers.len().saturating_sub(1);
    let mut widths: Vec<usize> = headers[..leading]
        .iter()
        .map(|header| header.chars().count())
        .collect();
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let used: usize = widths.iter().map(|width| width + 2).sum();
    let last_width = LINE_WIDTH.saturating_sub(used).max(1);
    for row in &mut rows {
        if let Some(last) = row.last_mut() {
            *last = clip(last, last_width);
        }
    }
    table(headers, &rows)
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

/// `HH:MM:SS` (UTC) of a timestamp, for narrow tables.
fn clock_cell(timestamp: Option<&prost_types::Timestamp>) -> String {
    match rfc3339(timestamp) {
        Some(text) => text.get(11..19).map_or(text.clone(), str::to_string),
        None => "-".to_string(),
    }
}

/// The shortest prefixes, at least [`SHORT_ID_LEN`] long, that tell these
/// ids apart (each is accepted wherever the CLI takes an approval id).
fn short_ids(ids: &[&str]) -> Vec<String> {
    let longest = ids.iter().map(|id| id.len()).max().unwrap_or(0);
    let mut length = SHORT_ID_LEN.min(longest);
    loop {
        let prefixes: Vec<&str> = ids
            .iter()
            .map(|id| id.get(..length).unwrap_or(id))
            .collect();
        let distinct: std::collections::HashSet<&str> = prefixes.iter().copied().collect();
        if distinct.len() == prefixes.len() || length >= longest {
            return prefixes.into_iter().map(printable).collect();
        }
        length += 1;
    }
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

/// Column caps of the approval table; the arguments take what is left.
const ACTOR_WIDTH: usize = 14;
const TOOL_WIDTH: usize = 20;
const WORKSPACE_WIDTH: usize = 12;

fn approval_table(approvals: &[pb::Approval]) -> String {
    let ids: Vec<&str> = approvals
        .iter()
        .map(|approval| approval.approval_id.as_str())
        .collect();
    let rows: Vec<Vec<String>> = approvals
        .iter()
        .zip(short_ids(&ids))
        .map(|(approval, id)| {
            vec![
                id,
                status_name(approval.status()).to_string(),
                clip(&cell(&approval.actor), ACTOR_WIDTH),
                clip(&cell(&approval.tool), TOOL_WIDTH),
                clip(&cell(&approval.workspace), WORKSPACE_WIDTH),
                clock_cell(approval.expires_at.as_ref()),
                json_cell(&approval.arguments_json),
            ]
        })
        .collect();
    fitted_table(
        &[
            "ID",
            "STATUS",
            "ACTOR",
            "TOOL",
            "WORKSPACE",
            "EXPIRES",
            "ARGUMENTS",
        ],
        rows,
    )
}

/// One human line per watch event, cut to [`LINE_WIDTH`]: kind, short id,
/// status, actor, tool, workspace, the reviewer of a decision, arguments.
fn event_line(event: &pb::ApprovalEvent) -> String {
    let kind = event_kind_name(event.kind());
    let Some(approval) = &event.approval else {
        return format!(
            "{kind} missed={} (events were dropped; list approvals to resync)\n",
            event.lagged
        );
    };
    let id = approval
        .approval_id
        .get(..SHORT_ID_LEN)
        .unwrap_or(&approval.approval_id);
    let mut line = format!(
        "{kind} {} {} {} {} {}",
        cell(id),
        status_name(approval.status()),
        clip(&cell(&approval.actor), ACTOR_WIDTH),
        clip(&cell(&approval.tool), TOOL_WIDTH),
        clip(&cell(&approval.workspace), WORKSPACE_WIDTH),
    );
    if !approval.decided_by.is_empty() {
        let _ = write!(line, " by={}", printable(&approval.decided_by));
    }
    let _ = write!(line, " {}", json_cell(&approval.arguments_json));
    let mut line = clip(&line, LINE_WIDTH);
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
        OutputFormat::Json => emit_proto(approval, "toolgate.v1.Approval"),
    }
}

fn print_pin(pin: &pb::Pin, output: OutputFormat) -> Result<(), Failure> {
    match output {
        OutputFormat::Table => emit(&pin_record(pin)),
        OutputFormat::Json => emit_proto(pin, "toolgate.v1.Pin"),
    }
}

// ----- approvals ----------------------------------------------------------

/// `toolgate approvals …`.
pub fn run_approvals(args: ApprovalsArgs) -> ExitCode {
    run(approvals(args))
}

async fn approvals(args: ApprovalsArgs) -> Result<(), Failure> {
    let output = args.client.output;
    if let ApprovalsCommand::Watch { follow: true } = args.command {
        return follow_approvals(&args.client, output).await;
    }
    let (channel, auth) = connect(&args.client).await?;
    let mut client = ApprovalsClient::with_interceptor(channel, auth);
    match args.command {
        ApprovalsCommand::List(filters) => list_approvals(&mut client, &filters, output).await,
        ApprovalsCommand::Get { id } => {
            let approval_id = resolve_id(&mut client, &id).await?;
            let request = pb::GetApprovalRequest { approval_id };
            let approval = client.get_approval(request).await?.into_inner();
            print_approval(&approval, output)
        }
        ApprovalsCommand::Grant { id, comment } => {
            let request = pb::GrantApprovalRequest {
                approval_id: resolve_id(&mut client, &id).await?,
                comment,
            };
            let approval = client.grant_approval(request).await?.into_inner();
            print_approval(&approval, output)
        }
        ApprovalsCommand::Deny { id, reason } => {
            let request = pb::DenyApprovalRequest {
                approval_id: resolve_id(&mut client, &id).await?,
                reason,
            };
            let approval = client.deny_approval(request).await?.into_inner();
            print_approval(&approval, output)
        }
        ApprovalsCommand::Revoke { id, reason } => {
            let request = pb::RevokeApprovalRequest {
                approval_id: resolve_id(&mut client, &id).await?,
                reason,
            };
            let approval = client.revoke_approval(request).await?.into_inner();
            print_approval(&approval, output)
        }
        ApprovalsCommand::Watch { .. } => {
            match watch_once(&mut client, &args.client.server, output).await? {
                WatchEnd::Ended(message) => {
                    say(&format!("toolgate: watch ended: {}", printable(&message)));
                    Ok(())
                }
            }
        }
    }
}

/// The whole approval id that `text` (a whole id or a unique prefix of
/// one, any case) names among the approvals this reviewer can see.
async fn resolve_id(client: &mut ApprovalsClient<Authed>, text: &str) -> Result<String, Failure> {
    if let Ok(id) = uuid::Uuid::parse_str(text) {
        return Ok(id.hyphenated().to_string());
    }
    let prefix = text.to_ascii_lowercase();
    if prefix.is_empty()
        || prefix.len() > 36
        || !prefix
            .chars()
            .all(|character| character.is_ascii_hexdigit() || character == '-')
    {
        return Err(Failure::Usage(format!(
            "approval id {:?}: expected a UUID or the start of one (hexadecimal digits and `-`)",
            printable(text)
        )));
    }
    let mut found: Vec<String> = Vec::new();
    let mut page_token = String::new();
    // Two matches are enough to know the prefix is ambiguous.
    while found.len() < 2 {
        let request = pb::ListApprovalsRequest {
            page_size: 2,
            page_token: page_token.clone(),
            approval_id_prefix: prefix.clone(),
            ..Default::default()
        };
        let page = client.list_approvals(request).await?.into_inner();
        found.extend(
            page.approvals
                .into_iter()
                .map(|approval| approval.approval_id),
        );
        if page.next_page_token.is_empty() {
            break;
        }
        page_token = page.next_page_token;
    }
    match found.len() {
        0 => Err(Failure::Refused(format!(
            "no approval id starts with {prefix:?} (among the approvals this reviewer can see)"
        ))),
        1 => Ok(found.remove(0)),
        _ => Err(Failure::Usage(format!(
            "approval id prefix {prefix:?} is ambiguous: it starts {} and more; give more characters",
            found
                .iter()
                .map(|id| printable(id))
                .collect::<Vec<_>>()
                .join(", ")
        ))),
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
            ..Default::default()
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
        OutputFormat::Json => emit_proto(
            &pb::ListApprovalsResponse {
                approvals,
                next_page_token: String::new(),
            },
            "toolgate.v1.ListApprovalsResponse",
        ),
    }
}

/// How one watch stream ended, when not with a refusal.
enum WatchEnd {
    /// The server ended it (at shutdown, or the connection went away).
    Ended(String),
}

/// Prints one watch stream until it ends. A refusal (a bad token, a
/// credential revoked by a reload) is an error; the server going away is
/// an orderly end.
async fn watch_once(
    client: &mut ApprovalsClient<Authed>,
    server: &str,
    output: OutputFormat,
) -> Result<WatchEnd, Failure> {
    let mut events = match client.watch_approvals(pb::WatchApprovalsRequest {}).await {
        Ok(response) => response.into_inner(),
        Err(status) if is_disconnect(&status) => {
            return Ok(WatchEnd::Ended(status.message().to_string()));
        }
        Err(status) => return Err(Failure::Status(status)),
    };
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
                        let mut line = proto_json(&event, "toolgate.v1.ApprovalEvent", false)?;
                        line.push('\n');
                        line
                    }
                };
                emit(&line)?;
            }
            Ok(None) => return Ok(WatchEnd::Ended("the server ended the stream".into())),
            Err(status) if is_disconnect(&status) => {
                return Ok(WatchEnd::Ended(status.message().to_string()));
            }
            Err(status) => return Err(Failure::Status(status)),
        }
    }
}

/// The server went away (shut down, restarted, unreachable) rather than
/// refusing the call.
fn is_disconnect(status: &Status) -> bool {
    matches!(
        status.code(),
        Code::Unavailable | Code::Unknown | Code::Cancelled
    )
}

/// First and largest pause before `watch --follow` reconnects.
const FOLLOW_FIRST_BACKOFF: Duration = Duration::from_millis(200);
const FOLLOW_MAX_BACKOFF: Duration = Duration::from_secs(5);

/// `approvals watch --follow`: watches, and when the server goes away
/// reconnects with exponential backoff (200 ms doubling to 5 s) until a
/// refusal or the user stops it. Events while disconnected are missed.
async fn follow_approvals(client_args: &ClientArgs, output: OutputFormat) -> Result<(), Failure> {
    let auth = bearer(client_args)?;
    let url = server_url(&client_args.server)?;
    let endpoint = Endpoint::from_shared(url.clone())
        .map_err(|error| Failure::Usage(format!("--server {url:?}: {}", error_chain(&error))))?
        .connect_timeout(CONNECT_TIMEOUT);
    let mut backoff = FOLLOW_FIRST_BACKOFF;
    loop {
        let why = match endpoint.connect().await {
            Ok(channel) => {
                let mut client = ApprovalsClient::with_interceptor(channel, auth.clone());
                match watch_once(&mut client, &client_args.server, output).await? {
                    WatchEnd::Ended(message) => {
                        backoff = FOLLOW_FIRST_BACKOFF;
                        message
                    }
                }
            }
            Err(error) => format!("cannot connect to {url}: {}", error_chain(&error)),
        };
        say(&format!(
            "toolgate: watch ended: {}; reconnecting in {} ms (events meanwhile are missed; list approvals to resync)",
            printable(&why),
            backoff.as_millis()
        ));
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(FOLLOW_MAX_BACKOFF);
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
            let pins = client.list_pins(pb::ListPinsRequest {}).await?.into_inner();
            match output {
                OutputFormat::Table => emit(&pin_table(&pins.pins)),
                OutputFormat::Json => emit_proto(&pins, "toolgate.v1.ListPinsResponse"),
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

// ----- manifest assess ----------------------------------------------------

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
    let (manifest, form) = crate::cli::read_manifest_file(
        &args.file,
        args.server_id.as_deref(),
        args.revision.as_deref(),
        "--server-id",
    )
    .map_err(Failure::Usage)?;
    say(&crate::cli::describe_manifest(&args.file, &manifest, form));
    let (channel, auth) = connect(&args.client).await?;
    let mut client = PolicyDecisionPointClient::with_interceptor(channel, auth);
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

// ----- resources ----------------------------------------------------------

/// `toolgate resource …`.
pub fn run_resource(args: ResourceArgs) -> ExitCode {
    run(resource(args))
}

/// Column cap of the resource table's names; the values take what is left.
const RESOURCE_NAME_WIDTH: usize = 32;

async fn resource(args: ResourceArgs) -> Result<(), Failure> {
    let output = args.client.output;
    let (channel, auth) = connect(&args.client).await?;
    let mut client = ResourcesClient::with_interceptor(channel, auth);
    match args.command {
        ResourceCommand::Get { name } => {
            let mut resource = client
                .get_resource(pb::GetResourceRequest {
                    name: name.clone(),
                    ..Default::default()
                })
                .await?
                .into_inner();
            // A queue comes a page at a time: join the pages' items.
            while !resource.next_page_token.is_empty() {
                let page = client
                    .get_resource(pb::GetResourceRequest {
                        name: name.clone(),
                        page_token: std::mem::take(&mut resource.next_page_token),
                        ..Default::default()
                    })
                    .await?
                    .into_inner();
                let items = |json: &str| {
                    json.strip_prefix('[')
                        .and_then(|rest| rest.strip_suffix(']'))
                        .unwrap_or_default()
                        .to_string()
                };
                let (head, tail) = (items(&resource.value_json), items(&page.value_json));
                resource.value_json = match (head.is_empty(), tail.is_empty()) {
                    (_, true) => format!("[{head}]"),
                    (true, false) => format!("[{tail}]"),
                    (false, false) => format!("[{head},{tail}]"),
                };
                resource.version = page.version;
                resource.next_page_token = page.next_page_token;
            }
            match output {
                OutputFormat::Table => emit(&record(&[
                    ("name", cell(&resource.name)),
                    ("value", json_cell(&resource.value_json)),
                    ("version", resource.version.to_string()),
                ])),
                OutputFormat::Json => emit_proto(&resource, "toolgate.v1.Resource"),
            }
        }
        ResourceCommand::List => {
            let mut resources = Vec::new();
            let mut page_token = String::new();
            loop {
                let request = pb::ListResourcesRequest {
                    page_size: 0,
                    page_token: page_token.clone(),
                };
                let page = client.list_resources(request).await?.into_inner();
                resources.extend(page.resources);
                if page.next_page_token.is_empty() {
                    break;
                }
                page_token = page.next_page_token;
            }
            match output {
                OutputFormat::Table => {
                    let rows = resources
                        .iter()
                        .map(|resource| {
                            vec![
                                clip(&cell(&resource.name), RESOURCE_NAME_WIDTH),
                                resource.version.to_string(),
                                json_cell(&resource.value_json),
                            ]
                        })
                        .collect();
                    emit(&fitted_table(&["NAME", "VERSION", "VALUE"], rows))
                }
                OutputFormat::Json => emit_proto(
                    &pb::ListResourcesResponse {
                        resources,
                        next_page_token: String::new(),
                    },
                    "toolgate.v1.ListResourcesResponse",
                ),
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
        ("max_sessions_per_host", count(limits.max_sessions_per_host)),
        ("max_pending_per_host", count(limits.max_pending_per_host)),
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
