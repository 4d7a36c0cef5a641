//! The load scenarios: the requests each one sends, and the state toolgate
//! must hold before it is measured (made over gRPC, as a host and a
//! reviewer would).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use tonic::metadata::MetadataValue;
use tonic::transport::Channel;

use toolgate::pb;
use toolgate::pb::approvals_client::ApprovalsClient;

use crate::BoxResult;
use crate::load::{Call, Expect, Generator, PdpClient, with_token};
use crate::policies::{
    ACTOR, EXT_AUTHZ_ACTOR_HEADER, HOST_TOKEN, REPLAY_RESOURCE, REVIEWER_TOKEN, WORKSPACE,
    commit_resource, manifest_message,
};

/// The throughput scenarios, in the order `all` runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scenario {
    DecideAllow,
    DecidePending,
    DecideSessions,
    DecideFewSessions,
    DecideAgain,
    DispatchReplay,
    DispatchCommit,
    DispatchContended,
    DispatchDirect,
    AssessManifest,
    Mixed,
    ExtAuthzCheck,
}

pub const ALL: [Scenario; 12] = [
    Scenario::DecideAllow,
    Scenario::DecidePending,
    Scenario::DecideSessions,
    Scenario::DecideFewSessions,
    Scenario::DecideAgain,
    Scenario::DispatchReplay,
    Scenario::DispatchCommit,
    Scenario::DispatchContended,
    Scenario::DispatchDirect,
    Scenario::AssessManifest,
    Scenario::Mixed,
    Scenario::ExtAuthzCheck,
];

/// Callers that send each granted proposal of `dispatch-contended`: one
/// commits it, the others replay it.
pub const RACERS: u64 = 8;

/// Sessions the `decide-1000-sessions` scenario (and the mixed one) spread over.
pub const DISTINCT_SESSIONS: u64 = 1000;
/// Sessions the `decide-10-sessions` scenario spreads over (new ones each
/// round, so that none reaches its cap of call ids).
pub const FEW_SESSIONS: u64 = 10;

impl Scenario {
    pub fn name(self) -> &'static str {
        match self {
            Scenario::DecideAllow => "decide-allow",
            Scenario::DecidePending => "decide-pending",
            Scenario::DecideSessions => "decide-1000-sessions",
            Scenario::DecideFewSessions => "decide-10-sessions",
            Scenario::DecideAgain => "decide-again-1000-sessions",
            Scenario::DispatchReplay => "dispatch-replay",
            Scenario::DispatchCommit => "dispatch-commit",
            Scenario::DispatchContended => "dispatch-contended",
            Scenario::DispatchDirect => "dispatch-commit-direct",
            Scenario::AssessManifest => "assess-manifest",
            Scenario::Mixed => "mixed",
            Scenario::ExtAuthzCheck => "ext-authz-check",
        }
    }

    pub fn describe(self) -> &'static str {
        match self {
            Scenario::DecideAllow => {
                "Decide, read tool gated on a pinned manifest, ~200-byte proposal, one warm session, the same call id (re-evaluated in full, costs nothing) → ALLOW `allowed`"
            }
            Scenario::DecidePending => {
                "Decide, threshold tool above the threshold, the same proposal → REQUIRE_APPROVAL on the existing pending approval"
            }
            Scenario::DecideSessions => {
                "Decide, read tool, request i in session i mod 1000 with a new call id each time (a new decision charged to the session) → ALLOW"
            }
            Scenario::DecideFewSessions => {
                "Decide, read tool, request i in session i mod 10 (new sessions each round) with a new call id each time → ALLOW"
            }
            Scenario::DecideAgain => {
                "Decide, read tool, request i in session i mod 1000 with that session's one call id (decided again: hosts re-evaluating or polling across 1,000 sessions, each session's last activity written once a second) → ALLOW"
            }
            Scenario::DispatchReplay => {
                "Dispatch of a proposal committed at setup → OK, `replayed`"
            }
            Scenario::DispatchCommit => {
                "Dispatch of fresh proposals, each decided and granted at setup (not timed), one resource per proposal, version scope `resource` → OK, committed"
            }
            Scenario::DispatchContended => {
                "Dispatch of proposals each decided and granted at setup, each sent by 8 consecutive requests (8 callers racing for one grant; over the replicas, round-robin) → one OK committed and 7 OK replayed per grant; grants committed/s = req/s ÷ 8"
            }
            Scenario::DispatchDirect => {
                "Dispatch of a tool that needs no approval (`set_direct`), a new call id each time (charged to its session as a Decide would be), request i on resource i mod the resource count at its current version, version scope `resource` → OK, committed"
            }
            Scenario::AssessManifest => {
                "AssessManifest of a 20-tool manifest (~10 KB) equal to the pinned one → accepted, MATCHED"
            }
            Scenario::Mixed => {
                "60 % decide-allow, 15 % decide-1000-sessions, 10 % decide-pending, 10 % dispatch-replay, 5 % assess-manifest"
            }
            Scenario::ExtAuthzCheck => {
                "Envoy ext_authz Check of an MCP tools/call (a read tool, a 200-byte arguments object, one warm session, the call id derived from session, tool and arguments) as Envoy sends it → OK `allowed`"
            }
        }
    }

    pub fn from_name(name: &str) -> Option<Scenario> {
        ALL.into_iter().find(|scenario| scenario.name() == name)
    }
}

pub fn host_token() -> MetadataValue<tonic::metadata::Ascii> {
    bearer(HOST_TOKEN)
}

/// The host's `authorization` header for the measured calls (`grpc`).
pub fn host_header() -> http::HeaderValue {
    match http::HeaderValue::try_from(format!("Bearer {HOST_TOKEN}")) {
        Ok(value) => value,
        Err(error) => unreachable!("a constant ASCII token: {error}"),
    }
}

fn bearer(token: &str) -> MetadataValue<tonic::metadata::Ascii> {
    match format!("Bearer {token}").parse() {
        Ok(value) => value,
        Err(error) => unreachable!("a constant ASCII token: {error}"),
    }
}

pub fn session(session_id: String) -> pb::Session {
    pb::Session {
        actor: ACTOR.into(),
        session_id,
        workspace: WORKSPACE.into(),
    }
}

fn proposal(call_id: String, name: &str, version: u64, arguments_json: String) -> pb::Proposal {
    pb::Proposal {
        call_id,
        actor: ACTOR.into(),
        name: name.into(),
        version,
        arguments_json,
    }
}

/// A read-tool Decide of about 200 bytes of proposal.
pub fn read_request(session_id: String, call_id: String) -> pb::DecideRequest {
    pb::DecideRequest {
        session: Some(session(session_id)),
        proposal: Some(proposal(
            call_id,
            "search_docs",
            0,
            r#"{"query":"how do I reset the sensor on a lamp that keeps blinking after a firmware update?","limit":10}"#.into(),
        )),
    }
}

fn pending_request() -> pb::DecideRequest {
    pb::DecideRequest {
        session: Some(session("pending".into())),
        proposal: Some(proposal(
            "pay-1".into(),
            "pay",
            0,
            r#"{"amount":15000,"currency":"BRL","account_number":"00123456789","memo":"invoice 2026/11"}"#.into(),
        )),
    }
}

fn replay_request() -> pb::DispatchRequest {
    pb::DispatchRequest {
        session: Some(session("replay".into())),
        proposal: Some(proposal(
            "replay-1".into(),
            "set_ticket",
            0,
            format!(r#"{{"ticket":"{REPLAY_RESOURCE}","status":"done"}}"#),
        )),
    }
}

fn assess_request() -> pb::AssessManifestRequest {
    pb::AssessManifestRequest {
        manifest: Some(manifest_message()),
    }
}

const ALLOWED: Expect = Expect::Decide {
    outcome: pb::Outcome::Allow,
    reason: "allowed",
};
const PENDING: Expect = Expect::Decide {
    outcome: pb::Outcome::RequireApproval,
    reason: "approval-threshold-exceeded",
};

/// Grants an approval as the bench reviewer.
async fn grant(channel: &Channel, approval_id: String) -> BoxResult<()> {
    let mut reviewer = ApprovalsClient::new(channel.clone());
    reviewer
        .grant_approval(with_token(
            pb::GrantApprovalRequest {
                approval_id,
                comment: "toolgate-load setup".into(),
            },
            &bearer(REVIEWER_TOKEN),
        ))
        .await?;
    Ok(())
}

/// Decides a proposal that needs approval and grants the approval.
async fn decide_and_grant(channel: &Channel, request: pb::DecideRequest) -> BoxResult<()> {
    let mut host = PdpClient::new(channel.clone());
    let decided = host
        .decide(with_token(request, &host_token()))
        .await?
        .into_inner();
    if decided.outcome != i32::from(pb::Outcome::RequireApproval) {
        return Err(format!(
            "setup: expected REQUIRE_APPROVAL, got {} {}",
            decided.reason, decided.message
        )
        .into());
    }
    grant(channel, decided.approval_id).await
}

/// What every throughput scenario needs on a fresh toolgate: the manifest
/// assessed (the read tool's gate), the pending approval, the committed
/// replay proposal. Idempotent.
pub async fn setup_fixtures(channel: &Channel) -> BoxResult<()> {
    let mut host = PdpClient::new(channel.clone());
    let token = host_token();
    let assessed = host
        .assess_manifest(with_token(assess_request(), &token))
        .await?
        .into_inner();
    if !assessed.accepted {
        return Err(format!("setup: the bench manifest was not accepted: {assessed:?}").into());
    }
    let pending = host
        .decide(with_token(pending_request(), &token))
        .await?
        .into_inner();
    if pending.outcome != i32::from(pb::Outcome::RequireApproval) {
        return Err(format!("setup: no pending approval: {pending:?}").into());
    }
    let replay = host
        .dispatch(with_token(replay_request(), &token))
        .await?
        .into_inner();
    if !replay.replayed {
        let replay_proposal = replay_request();
        decide_and_grant(
            channel,
            pb::DecideRequest {
                session: replay_proposal.session,
                proposal: replay_proposal.proposal,
            },
        )
        .await?;
        let committed = host
            .dispatch(with_token(replay_request(), &token))
            .await?
            .into_inner();
        if committed.status != i32::from(pb::DispatchStatus::Ok) {
            return Err(format!("setup: replay commit failed: {committed:?}").into());
        }
    }
    let allowed = host
        .decide(with_token(
            read_request("warm".into(), "warm-1".into()),
            &token,
        ))
        .await?
        .into_inner();
    if allowed.outcome != i32::from(pb::Outcome::Allow) {
        return Err(format!("setup: the read tool is not allowed: {allowed:?}").into());
    }
    Ok(())
}

/// The resources of the commit scenario and the version each is at. Every
/// pre-granted proposal targets its own resource (`set` effect, version
/// scope `resource`) at that resource's current version, so the proposals
/// of a pool commit in any order and concurrently: none can make another
/// stale. (With scope `global`, or with effect `none`, which is checked
/// against the global counter, all but one concurrent commit would be
/// `STALE_VERSION`.)
#[derive(Debug)]
pub struct CommitPool {
    versions: Arc<Vec<AtomicU64>>,
}

/// A round's prepared Dispatch requests.
pub type PreparedCommits = Arc<Vec<(pb::DispatchRequest, usize)>>;

impl CommitPool {
    pub fn new(resources: usize) -> Self {
        CommitPool {
            versions: Arc::new((0..resources).map(|_| AtomicU64::new(0)).collect()),
        }
    }

    pub fn capacity(&self) -> usize {
        self.versions.len()
    }

    fn request(&self, tag: &str, slot: usize) -> pb::DispatchRequest {
        let version = self
            .versions
            .get(slot)
            .map_or(0, |version| version.load(Ordering::Relaxed));
        pb::DispatchRequest {
            session: Some(session(format!("commit-{tag}-{}", slot / 10_000))),
            proposal: Some(proposal(
                format!("{tag}-{slot}"),
                "set_ticket",
                version,
                set_arguments(slot, version),
            )),
        }
    }

    /// `size` fresh proposals; with `grant_on`, each is decided and granted
    /// there first (`workers` at a time).
    pub async fn prepare(
        &self,
        tag: &str,
        size: usize,
        grant_on: Option<&[Channel]>,
        workers: usize,
    ) -> BoxResult<PreparedCommits> {
        let size = size.min(self.capacity());
        let requests: Vec<(pb::DispatchRequest, usize)> = (0..size)
            .map(|slot| (self.request(tag, slot), slot))
            .collect();
        let requests = Arc::new(requests);
        if let Some(channels) = grant_on {
            let workers = workers.max(1);
            let mut tasks = Vec::with_capacity(workers);
            for worker in 0..workers {
                let channel = channels[worker % channels.len()].clone();
                let requests = Arc::clone(&requests);
                tasks.push(tokio::spawn(async move {
                    let mut index = worker;
                    while let Some((request, _)) = requests.get(index) {
                        let decide = pb::DecideRequest {
                            session: request.session.clone(),
                            proposal: request.proposal.clone(),
                        };
                        if let Err(error) = decide_and_grant(&channel, decide).await {
                            return Err(error.to_string());
                        }
                        index += workers;
                    }
                    Ok(())
                }));
            }
            for task in tasks {
                task.await??;
            }
        }
        Ok(requests)
    }

    pub fn versions(&self) -> Arc<Vec<AtomicU64>> {
        Arc::clone(&self.versions)
    }
}

/// The requests of one round. `tag` makes call ids unique per round, so a
/// "new call id" stays new across rounds.
/// `pool` holds the server's commit resources and their versions;
/// `prepared`, the pre-granted proposals of a dispatch-commit round.
pub fn generator(
    scenario: Scenario,
    tag: &str,
    pool: &CommitPool,
    prepared: Option<PreparedCommits>,
) -> Generator {
    let tag = tag.to_string();
    match scenario {
        Scenario::DecideAllow => {
            let request = read_request("allow".into(), "read-1".into());
            Arc::new(move |_| Some(Call::Decide(request.clone(), ALLOWED)))
        }
        Scenario::DecidePending => {
            let request = pending_request();
            Arc::new(move |_| Some(Call::Decide(request.clone(), PENDING)))
        }
        Scenario::DecideSessions => Arc::new(move |index| Some(sessions_call(&tag, index))),
        Scenario::DecideFewSessions => Arc::new(move |index| {
            let session = format!("few-{tag}-{}", index % FEW_SESSIONS);
            Some(Call::Decide(
                read_request(session, format!("{tag}-{index}")),
                ALLOWED,
            ))
        }),
        Scenario::DecideAgain => Arc::new(move |index| {
            let session = format!("again-{}", index % DISTINCT_SESSIONS);
            Some(Call::Decide(
                read_request(session.clone(), session),
                ALLOWED,
            ))
        }),
        Scenario::DispatchReplay => {
            let request = replay_request();
            Arc::new(move |_| Some(Call::Dispatch(request.clone(), Expect::Replayed)))
        }
        Scenario::DispatchCommit => {
            let Some(prepared) = prepared else {
                return Arc::new(|_| None);
            };
            let versions = pool.versions();
            Arc::new(move |index| {
                let (request, slot) = prepared.get(usize::try_from(index).ok()?)?;
                Some(Call::Dispatch(
                    request.clone(),
                    Expect::Committed {
                        versions: Arc::clone(&versions),
                        slot: *slot,
                    },
                ))
            })
        }
        Scenario::DispatchContended => {
            let Some(prepared) = prepared else {
                return Arc::new(|_| None);
            };
            // How many times each grant committed: more than once is wrong.
            let commits: Arc<Vec<AtomicU64>> =
                Arc::new((0..prepared.len()).map(|_| AtomicU64::new(0)).collect());
            let versions = pool.versions();
            Arc::new(move |index| {
                let position = usize::try_from(index / RACERS).ok()?;
                let (request, slot) = prepared.get(position)?;
                Some(Call::Dispatch(
                    request.clone(),
                    Expect::Once {
                        commits: Arc::clone(&commits),
                        position,
                        versions: Arc::clone(&versions),
                        slot: *slot,
                    },
                ))
            })
        }
        Scenario::DispatchDirect => {
            let versions = pool.versions();
            Arc::new(move |index| {
                let slot = usize::try_from(index).ok()? % versions.len().max(1);
                let version = versions.get(slot)?.load(Ordering::Relaxed);
                Some(Call::Dispatch(
                    direct_request(&tag, index, slot, version),
                    Expect::Committed {
                        versions: Arc::clone(&versions),
                        slot,
                    },
                ))
            })
        }
        Scenario::AssessManifest => {
            let request = assess_request();
            Arc::new(move |_| Some(Call::Assess(request.clone(), Expect::Matched)))
        }
        Scenario::ExtAuthzCheck => {
            let request = Box::new(mcp_check_request());
            Arc::new(move |_| {
                Some(Call::Check(
                    request.clone(),
                    Expect::CheckAllowed { reason: "allowed" },
                ))
            })
        }
        Scenario::Mixed => {
            let allow = read_request("allow".into(), "read-1".into());
            let pending = pending_request();
            let replay = replay_request();
            let assess = assess_request();
            Arc::new(move |index| {
                Some(match index % 20 {
                    0..12 => Call::Decide(allow.clone(), ALLOWED),
                    12..15 => sessions_call(&tag, index),
                    15..17 => Call::Decide(pending.clone(), PENDING),
                    17..19 => Call::Dispatch(replay.clone(), Expect::Replayed),
                    _ => Call::Assess(assess.clone(), Expect::Matched),
                })
            })
        }
    }
}

fn sessions_call(tag: &str, index: u64) -> Call {
    Call::Decide(
        read_request(
            format!("s-{}", index % DISTINCT_SESSIONS),
            format!("{tag}-{index}"),
        ),
        ALLOWED,
    )
}

/// The arguments of a `set` on commit resource `slot` at `version`: the
/// other status than the one it holds, so every commit changes the value.
fn set_arguments(slot: usize, version: u64) -> String {
    format!(
        r#"{{"ticket":"{}","status":"{}"}}"#,
        commit_resource(slot),
        if version.is_multiple_of(2) {
            "done"
        } else {
            "open"
        }
    )
}

/// Request `index` of an approval-free commit round: a new call id, 10,000
/// per session, on resource `slot` at `version`.
pub fn direct_request(tag: &str, index: u64, slot: usize, version: u64) -> pb::DispatchRequest {
    pb::DispatchRequest {
        session: Some(session(format!("direct-{tag}-{}", index / 10_000))),
        proposal: Some(proposal(
            format!("{tag}-d{index}"),
            "set_direct",
            version,
            set_arguments(slot, version),
        )),
    }
}

/// The arguments of the ext-authz scenario: a JSON object of exactly 200
/// bytes.
pub fn mcp_arguments() -> String {
    let frame = r#"{"query":"","limit":10}"#.len();
    let query: String =
        "how do I reset the sensor on a lamp that keeps blinking after a firmware update "
            .chars()
            .cycle()
            .take(200 - frame)
            .collect();
    format!(r#"{{"query":"{query}","limit":10}}"#)
}

/// An Envoy Check of an MCP `tools/call` of the read tool `lookup`, as the
/// ext_authz filter sends it with `with_request_body` (headers, the body
/// as a string).
pub fn mcp_check_request() -> envoy_types::pb::envoy::service::auth::v3::CheckRequest {
    use envoy_types::pb::envoy::service::auth::v3::attribute_context::{
        HttpRequest, Peer, Request,
    };
    use envoy_types::pb::envoy::service::auth::v3::{AttributeContext, CheckRequest};

    let body = format!(
        r#"{{"jsonrpc":"2.0","id":17,"method":"tools/call","params":{{"name":"lookup","arguments":{}}}}}"#,
        mcp_arguments()
    );
    let headers = [
        (":method", "POST"),
        (":path", "/mcp"),
        (":authority", "mcp.bench"),
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
        ("mcp-session-id", "mcp-warm"),
        ("mcp-method", "tools/call"),
        ("mcp-name", "lookup"),
        (EXT_AUTHZ_ACTOR_HEADER, ACTOR),
    ]
    .into_iter()
    .map(|(key, value)| (key.to_string(), value.to_string()))
    .collect();
    CheckRequest {
        attributes: Some(AttributeContext {
            source: Some(Peer::default()),
            request: Some(Request {
                http: Some(HttpRequest {
                    id: "1".into(),
                    method: "POST".into(),
                    headers,
                    path: "/mcp".into(),
                    host: "mcp.bench".into(),
                    scheme: "http".into(),
                    protocol: "HTTP/1.1".into(),
                    size: i64::try_from(body.len()).unwrap_or(-1),
                    body,
                    ..Default::default()
                }),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
}
