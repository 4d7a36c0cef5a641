//! `toolgate approvals …`: list, show, grant, deny, revoke and watch the
//! approval ledger (reviewer credential).

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use tonic::{Code, Status};

use toolgate::domain::ledger::ApprovalStatus;
use toolgate::domain::limits::APPROVALS_PAGE;
use toolgate::pb;
use toolgate::pb::approvals_client::ApprovalsClient;

use crate::args::{
    ApprovalsArgs, ApprovalsCommand, ClientArgs, ListApprovalsArgs, OutputFormat, StatusFilter,
};
use crate::client::{Authed, MAX_ANSWER_BYTES, bearer, connect, error_chain, run};
use crate::output::{
    Failure, LINE_WIDTH, cell, clip, emit, emit_proto, fitted_table, json_cell, printable,
    proto_json, record, rfc3339, say, time_cell,
};

/// The largest page `ListApprovals` serves.
const MAX_PAGE_SIZE: u32 = APPROVALS_PAGE.max;

/// A status by its domain name (`ApprovalStatus::as_str`).
fn status_name(status: pb::ApprovalStatus) -> &'static str {
    ApprovalStatus::try_from(status).map_or("unspecified", ApprovalStatus::as_str)
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

/// Shown approval ids are unique prefixes of at least this many characters.
const SHORT_ID_LEN: usize = 8;

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

fn print_approval(approval: &pb::Approval, output: OutputFormat) -> Result<(), Failure> {
    match output {
        OutputFormat::Table => emit(&approval_record(approval)),
        OutputFormat::Json => emit_proto(approval, "toolgate.v1.Approval"),
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
    let mut client = ApprovalsClient::with_interceptor(channel, auth)
        .max_decoding_message_size(MAX_ANSWER_BYTES);
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
                approval_id: resolve_decided_id(&mut client, &id).await?,
                comment,
            };
            let approval = client.grant_approval(request).await?.into_inner();
            print_approval(&approval, output)
        }
        ApprovalsCommand::Deny { id, reason } => {
            let request = pb::DenyApprovalRequest {
                approval_id: resolve_decided_id(&mut client, &id).await?,
                reason,
            };
            let approval = client.deny_approval(request).await?.into_inner();
            print_approval(&approval, output)
        }
        ApprovalsCommand::Revoke { id, reason } => {
            let request = pb::RevokeApprovalRequest {
                approval_id: resolve_decided_id(&mut client, &id).await?,
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
                // Nothing was watched: an error, not an orderly end.
                WatchEnd::NotOpened(status) => Err(Failure::Status(status)),
            }
        }
    }
}

/// The shortest prefix that grants, denies or revokes: the table's short
/// ids, not a digit or two typed by mistake.
const DECIDED_PREFIX: usize = 8;

/// [`resolve_id`] for a grant, deny or revoke: a prefix of at least
/// [`DECIDED_PREFIX`] characters.
async fn resolve_decided_id(
    client: &mut ApprovalsClient<Authed>,
    text: &str,
) -> Result<String, Failure> {
    if text.len() < DECIDED_PREFIX {
        return Err(Failure::Usage(format!(
            "approval id {:?}: a grant, deny or revoke names at least the first \
             {DECIDED_PREFIX} characters of the id",
            printable(text)
        )));
    }
    resolve_id(client, text).await
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
    /// It never opened: the server was unreachable, or answered the call
    /// UNAVAILABLE (its log sink stalled, a proxy's 503).
    NotOpened(Status),
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
        Err(status) if is_disconnect(&status) => return Ok(WatchEnd::NotOpened(status)),
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
    let (endpoint, url) = crate::client::endpoint(client_args)?;
    let mut backoff = FOLLOW_FIRST_BACKOFF;
    loop {
        let why = match endpoint.connect().await {
            Ok(channel) => {
                let mut client = ApprovalsClient::with_interceptor(channel, auth.clone())
                    .max_decoding_message_size(MAX_ANSWER_BYTES);
                match watch_once(&mut client, &client_args.server, output).await? {
                    WatchEnd::Ended(message) => {
                        backoff = FOLLOW_FIRST_BACKOFF;
                        message
                    }
                    WatchEnd::NotOpened(status) => status.message().to_string(),
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
