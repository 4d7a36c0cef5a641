//! Hostile input over real gRPC, on `tests/fixtures/hostile.toml`: tables
//! of bad (and borderline) requests, one test per contract section or RPC
//! (the modules below). Each case states the exact gRPC code and, for
//! INVALID_ARGUMENT, the field path of the `google.rpc.BadRequest`
//! violation; refusals that SPEC makes answers (DENY, Dispatch statuses)
//! state the exact outcome and reason instead. Around every case the whole
//! observable state — store sizes, every approval record, every resource,
//! every pin, every session's counters — is compared: a refused call
//! changes nothing (SPEC §2, §4–§7). Each test runs its section on a
//! server of its own, set up the same way ([`setup`]); the server must
//! still answer health checks at the end.

/// The test that runs one section's cases, after `before`.
macro_rules! section_test {
    ($name:ident, $cases:ident, $before:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            run_section($cases, $before).await;
        }
    };
}

mod auth;
mod decide;
mod dispatch;
mod manifests;
mod reads;
mod review;
mod wire;

use std::marker::PhantomData;

use bytes::{Buf, BufMut};
use prost::Message;
use tonic::Code;
use tonic::Status;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic_health::pb::health_check_response::ServingStatus;

use crate::support::policies::{HOSTILE as POLICY, repo_path};
use crate::support::tokens::{ALICE, BOB, CAROL, DAVE, HOST, OTHER_HOST};
use crate::support::{
    MAX_ARGUMENTS_BYTES, Manifest, Stats, TestServer, authed, decide_request, pb, proposal,
    session, violation_field,
};
use crate::support::{deny_request, grant_request, revoke_request};

/// The server's default `max_message_bytes`.
const MIB: usize = 1024 * 1024;

/// Sessions and resources whose observable state is compared around each case.
const SESSIONS: [&str; 2] = ["s-base", "s-carol"];
const RESOURCES: [&str; 2] = ["lamp", "sensor"];

/// Look-alikes of `a` and `e` (more, inline: fullwidth ｐ, zero-width space,
/// right-to-left override, Arabic-Indic digits).
const CYRILLIC_A: char = '\u{0430}';
const CYRILLIC_E: char = '\u{0435}';

// ---------------------------------------------------------------------------
// Raw protobuf on the wire: a codec that sends bytes as they are, for
// requests no generated client can build (wrong wire types, invalid UTF-8,
// truncation, unknown fields).
// ---------------------------------------------------------------------------

struct RawCodec<M>(PhantomData<M>);

impl<M> Default for RawCodec<M> {
    fn default() -> Self {
        RawCodec(PhantomData)
    }
}

struct RawEncoder;

impl Encoder for RawEncoder {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

struct MessageDecoder<M>(PhantomData<M>);

impl<M: Message + Default> Decoder for MessageDecoder<M> {
    type Item = M;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<M>, Status> {
        let bytes = src.copy_to_bytes(src.remaining());
        M::decode(bytes)
            .map(Some)
            .map_err(|error| Status::internal(format!("client could not decode: {error}")))
    }
}

impl<M: Message + Default + Send + 'static> Codec for RawCodec<M> {
    type Encode = Vec<u8>;
    type Decode = M;
    type Encoder = RawEncoder;
    type Decoder = MessageDecoder<M>;

    fn encoder(&mut self) -> RawEncoder {
        RawEncoder
    }

    fn decoder(&mut self) -> MessageDecoder<M> {
        MessageDecoder(PhantomData)
    }
}

async fn raw_call<M: Message + Default + Send + 'static>(
    server: &TestServer,
    token: &str,
    path: &'static str,
    body: Vec<u8>,
) -> Result<M, Status> {
    let mut grpc = tonic::client::Grpc::new(server.channel.clone());
    grpc.ready()
        .await
        .map_err(|error| Status::unknown(format!("channel not ready: {error}")))?;
    grpc.unary(
        authed(body, token),
        http::uri::PathAndQuery::from_static(path),
        RawCodec::<M>::default(),
    )
    .await
    .map(tonic::Response::into_inner)
}

fn put_varint(mut value: u64, out: &mut Vec<u8>) {
    while value >= 0x80 {
        out.push((value as u8 & 0x7f) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// A length-delimited field (wire type 2).
fn wire_bytes(field: u64, bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    put_varint(field << 3 | 2, &mut out);
    put_varint(bytes.len() as u64, &mut out);
    out.extend_from_slice(bytes);
    out
}

/// A varint field (wire type 0).
fn wire_varint(field: u64, value: u64) -> Vec<u8> {
    let mut out = Vec::new();
    put_varint(field << 3, &mut out);
    put_varint(value, &mut out);
    out
}

// ---------------------------------------------------------------------------
// The calls, their answers and what each case expects.
// ---------------------------------------------------------------------------

/// What a raw call's answer is decoded as.
#[derive(Debug, Clone, Copy)]
enum RawAnswer {
    Decide,
    List,
}

#[derive(Debug, Clone)]
enum Call {
    Decide(&'static str, pb::DecideRequest),
    Dispatch(&'static str, pb::DispatchRequest),
    Assess(&'static str, pb::AssessManifestRequest),
    GetSession(&'static str, pb::GetSessionRequest),
    GetApproval(&'static str, pb::GetApprovalRequest),
    List(&'static str, pb::ListApprovalsRequest),
    Grant(&'static str, pb::GrantApprovalRequest),
    Deny(&'static str, pb::DenyApprovalRequest),
    Revoke(&'static str, pb::RevokeApprovalRequest),
    Pin(&'static str, pb::PinManifestRequest),
    RemovePin(&'static str, pb::RemovePinRequest),
    GetResource(&'static str, pb::GetResourceRequest),
    Raw {
        token: &'static str,
        path: &'static str,
        body: Vec<u8>,
        answer: RawAnswer,
    },
}

#[derive(Debug)]
enum Answer {
    Decide(pb::DecideResponse),
    Dispatch(pb::DispatchResponse),
    Assess(pb::AssessManifestResponse),
    List(pb::ListApprovalsResponse),
    Other(#[allow(dead_code)] String),
}

#[derive(Debug)]
enum Expect {
    /// A gRPC error: the code, the BadRequest field (INVALID_ARGUMENT only;
    /// empty otherwise) and a fragment of the message.
    Error {
        code: Code,
        field: &'static str,
        contains: &'static str,
    },
    /// A Decide answer (gRPC OK).
    Decide {
        outcome: pb::Outcome,
        reason: &'static str,
        approval_id: Option<String>,
    },
    /// A Dispatch answer (gRPC OK).
    Dispatch {
        status: pb::DispatchStatus,
        reason: &'static str,
        approval_id: Option<String>,
        replayed: bool,
    },
    Assess(pb::AssessReason),
    /// A ListApprovals page with this many approvals.
    Listed(usize),
}

struct Case {
    name: String,
    call: Call,
    expect: Expect,
    /// SPEC §4 "Charging": an answered call id new to its session charges
    /// it one decision (and a tool attempt for an unknown or `execute`
    /// tool), whatever the answer — the only change a case may make.
    charges: Option<Charged>,
    /// The answer made its session (it exists from its first answer).
    opens: bool,
}

/// What a case charges to one of the compared sessions.
#[derive(Debug, Clone, Copy)]
struct Charged {
    session_id: &'static str,
    tool_attempt: bool,
}

/// A case whose answer charges a new call id to the base session.
fn charged(tool_attempt: bool, case: Case) -> Case {
    Case {
        charges: Some(Charged {
            session_id: "s-base",
            tool_attempt,
        }),
        ..case
    }
}

/// A case whose answer opens a session that was not there.
fn opening(case: Case) -> Case {
    Case {
        opens: true,
        ..case
    }
}

fn case(name: impl Into<String>, call: Call, expect: Expect) -> Case {
    Case {
        name: name.into(),
        call,
        expect,
        charges: None,
        opens: false,
    }
}

fn invalid(field: &'static str, contains: &'static str) -> Expect {
    Expect::Error {
        code: Code::InvalidArgument,
        field,
        contains,
    }
}

fn error(code: Code, contains: &'static str) -> Expect {
    Expect::Error {
        code,
        field: "",
        contains,
    }
}

fn answer(outcome: pb::Outcome, reason: &'static str) -> Expect {
    Expect::Decide {
        outcome,
        reason,
        approval_id: None,
    }
}

fn dispatched(status: pb::DispatchStatus, reason: &'static str) -> Expect {
    Expect::Dispatch {
        status,
        reason,
        approval_id: None,
        replayed: false,
    }
}

async fn run(server: &TestServer, call: &Call) -> Result<Answer, Status> {
    let mut pdp = server.pdp();
    let mut approvals = server.approvals();
    let mut pins = server.pins();
    let mut resources = server.resources();
    let other = |value: &dyn std::fmt::Debug| Answer::Other(format!("{value:?}"));
    Ok(match call.clone() {
        Call::Decide(token, request) => {
            Answer::Decide(pdp.decide(authed(request, token)).await?.into_inner())
        }
        Call::Dispatch(token, request) => {
            Answer::Dispatch(pdp.dispatch(authed(request, token)).await?.into_inner())
        }
        Call::Assess(token, request) => Answer::Assess(
            pdp.assess_manifest(authed(request, token))
                .await?
                .into_inner(),
        ),
        Call::GetSession(token, request) => {
            other(&pdp.get_session(authed(request, token)).await?.into_inner())
        }
        Call::GetApproval(token, request) => other(
            &approvals
                .get_approval(authed(request, token))
                .await?
                .into_inner(),
        ),
        Call::List(token, request) => Answer::List(
            approvals
                .list_approvals(authed(request, token))
                .await?
                .into_inner(),
        ),
        Call::Grant(token, request) => other(
            &approvals
                .grant_approval(authed(request, token))
                .await?
                .into_inner(),
        ),
        Call::Deny(token, request) => other(
            &approvals
                .deny_approval(authed(request, token))
                .await?
                .into_inner(),
        ),
        Call::Revoke(token, request) => other(
            &approvals
                .revoke_approval(authed(request, token))
                .await?
                .into_inner(),
        ),
        Call::Pin(token, request) => other(
            &pins
                .pin_manifest(authed(request, token))
                .await?
                .into_inner(),
        ),
        Call::RemovePin(token, request) => {
            other(&pins.remove_pin(authed(request, token)).await?.into_inner())
        }
        Call::GetResource(token, request) => other(
            &resources
                .get_resource(authed(request, token))
                .await?
                .into_inner(),
        ),
        Call::Raw {
            token,
            path,
            body,
            answer,
        } => match answer {
            RawAnswer::Decide => Answer::Decide(raw_call(server, token, path, body).await?),
            RawAnswer::List => Answer::List(raw_call(server, token, path, body).await?),
        },
    })
}

/// Checks one answer against its expectation; `Err` describes the mismatch.
fn check(expect: &Expect, result: Result<Answer, Status>) -> Result<(), String> {
    match (expect, result) {
        (
            Expect::Error {
                code,
                field,
                contains,
            },
            Err(status),
        ) => {
            let got_field = violation_field(&status);
            if status.code() != *code || got_field != *field {
                return Err(format!(
                    "expected {code:?} at {field:?}, got {:?} at {got_field:?}: {}",
                    status.code(),
                    status.message()
                ));
            }
            if *code == Code::InvalidArgument
                && !status.message().starts_with(&format!("{field}: "))
            {
                return Err(format!(
                    "the message must start with the field path: {}",
                    status.message()
                ));
            }
            if !status.message().contains(contains) {
                return Err(format!(
                    "expected {contains:?} in the message: {}",
                    status.message()
                ));
            }
            Ok(())
        }
        (_, Err(status)) => Err(format!(
            "expected an answer, got {:?} at {:?}: {}",
            status.code(),
            violation_field(&status),
            status.message()
        )),
        (Expect::Error { code, field, .. }, Ok(answer)) => Err(format!(
            "expected {code:?} at {field:?}, got an answer: {answer:?}"
        )),
        (
            Expect::Decide {
                outcome,
                reason,
                approval_id,
            },
            Ok(Answer::Decide(decision)),
        ) => {
            let id_matches = approval_id
                .as_ref()
                .is_none_or(|id| *id == decision.approval_id);
            if decision.outcome() != *outcome || decision.reason != *reason || !id_matches {
                return Err(format!(
                    "expected {outcome:?} {reason:?} {approval_id:?}, got {decision:?}"
                ));
            }
            if approval_id.is_none() && !decision.approval_id.is_empty() {
                return Err(format!("no approval expected, got {decision:?}"));
            }
            Ok(())
        }
        (
            Expect::Dispatch {
                status,
                reason,
                approval_id,
                replayed,
            },
            Ok(Answer::Dispatch(result)),
        ) => {
            let id_matches = approval_id
                .as_ref()
                .is_none_or(|id| *id == result.approval_id);
            if result.status() != *status
                || result.reason != *reason
                || result.replayed != *replayed
                || !id_matches
            {
                return Err(format!(
                    "expected {status:?} {reason:?} replayed={replayed} {approval_id:?}, got {result:?}"
                ));
            }
            Ok(())
        }
        (Expect::Assess(reason), Ok(Answer::Assess(assessment))) => {
            if assessment.reason() != *reason || assessment.accepted {
                return Err(format!("expected {reason:?}, got {assessment:?}"));
            }
            Ok(())
        }
        (Expect::Listed(count), Ok(Answer::List(page))) => {
            if page.approvals.len() != *count {
                return Err(format!("expected {count} approvals, got {page:?}"));
            }
            Ok(())
        }
        (expect, Ok(answer)) => Err(format!("expected {expect:?}, got {answer:?}")),
    }
}

// ---------------------------------------------------------------------------
// State snapshots.
// ---------------------------------------------------------------------------

/// Everything a refused call must leave as it was.
#[derive(Debug, Clone, PartialEq)]
struct Snapshot {
    stats: Stats,
    approvals: Vec<pb::Approval>,
    resources: Vec<pb::Resource>,
    pins: Vec<pb::Pin>,
    sessions: Vec<pb::SessionInfo>,
}

async fn snapshot(server: &TestServer) -> Snapshot {
    let stats = server.engine.stats().expect("stats");
    let mut approvals = server.all_approvals(CAROL).await;
    approvals.sort_by(|left, right| left.approval_id.cmp(&right.approval_id));
    let mut resources = Vec::new();
    for name in RESOURCES {
        resources.push(
            server
                .resources()
                .get_resource(authed(
                    pb::GetResourceRequest {
                        name: name.into(),
                        ..Default::default()
                    },
                    HOST,
                ))
                .await
                .expect("get resource")
                .into_inner(),
        );
    }
    let pins = server
        .pins()
        .list_pins(authed(pb::ListPinsRequest {}, ALICE))
        .await
        .expect("list pins")
        .into_inner()
        .pins;
    let mut sessions = Vec::new();
    for session_id in SESSIONS {
        sessions.push(
            server
                .get_session(HOST, session_id)
                .await
                .expect("get session"),
        );
    }
    Snapshot {
        stats,
        approvals,
        resources,
        pins,
        sessions,
    }
}

// ---------------------------------------------------------------------------
// The state the hostile requests are thrown at.
// ---------------------------------------------------------------------------

struct Fixture {
    /// Pending: payer's payment over the threshold, workspace acme.
    pending: String,
    /// Pending: carol's own payment (carol is also a reviewer).
    carols: String,
    /// Pending: a set_ticket proposal at version 1.
    pending_ticket: String,
    /// Granted, not yet used.
    granted: String,
    /// Denied.
    denied: String,
    /// Consumed by the one commit.
    consumed: String,
    /// Fingerprint of the policy pin of docs-search.
    docs_pin: String,
}

fn payer() -> pb::Session {
    session("payer", "s-base", "acme")
}

/// guest's session `s-guest`: guest holds no role for payment_execute.
fn guest() -> pb::Session {
    session("guest", "s-guest", "acme")
}

/// guest's payment_execute proposal with a new call id.
fn guest_payment() -> pb::Proposal {
    proposal(
        "c-new",
        "guest",
        "payment_execute",
        0,
        r#"{"amount":5,"account_number":"12345678"}"#,
    )
}

fn decide(session: pb::Session, proposal: pb::Proposal) -> Call {
    Call::Decide(HOST, decide_request(session, proposal))
}

fn dispatch(session: pb::Session, proposal: pb::Proposal) -> Call {
    Call::Dispatch(
        HOST,
        pb::DispatchRequest {
            session: Some(session),
            proposal: Some(proposal),
        },
    )
}

/// A read_balance proposal by payer with a new call id.
fn read(arguments: &str) -> pb::Proposal {
    proposal("c-new", "payer", "read_balance", 0, arguments)
}

fn payment(call_id: &str, version: u64, amount: &str) -> pb::Proposal {
    proposal(
        call_id,
        "payer",
        "payment_execute",
        version,
        &format!(r#"{{"amount":{amount},"account_number":"12345678"}}"#),
    )
}

fn ticket(call_id: &str, version: u64, ticket: &str, status: &str) -> pb::Proposal {
    proposal(
        call_id,
        "payer",
        "set_ticket",
        version,
        &format!(r#"{{"ticket":"{ticket}","status":"{status}"}}"#),
    )
}

fn manifest(server_id: &str, tools: Vec<pb::ManifestTool>) -> pb::Manifest {
    pb::Manifest {
        server_id: server_id.into(),
        revision: "1".into(),
        tools,
    }
}

fn tool(name: &str) -> pb::ManifestTool {
    pb::ManifestTool {
        name: name.into(),
        description: "does a thing".into(),
        parameters: vec!["q".into()],
        read_only: true,
        scopes: vec!["s:read".into()],
        ..pb::ManifestTool::default()
    }
}

fn docs_search() -> pb::Manifest {
    let bytes =
        std::fs::read(repo_path("examples/manifests/docs-search.json")).expect("example manifest");
    let manifest = Manifest::from_json(&bytes).expect("valid");
    pb::Manifest::from(&manifest)
}

async fn require_approval(
    server: &TestServer,
    session: &pb::Session,
    proposal: &pb::Proposal,
) -> String {
    let answer = server.decide_ok(HOST, session, proposal).await;
    assert_eq!(answer.outcome(), pb::Outcome::RequireApproval, "{answer:?}");
    answer.approval_id
}

async fn setup(server: &TestServer) -> Fixture {
    let payer = payer();
    let carol = session("carol", "s-carol", "acme");
    let base = server
        .decide_ok(
            HOST,
            &payer,
            &proposal("c-base", "payer", "read_balance", 0, r#"{"account":"a1"}"#),
        )
        .await;
    assert_eq!(base.reason, "allowed");
    let pending = require_approval(server, &payer, &payment("c-pay", 0, "20000")).await;
    let carols = require_approval(
        server,
        &carol,
        &proposal(
            "c-carol",
            "carol",
            "payment_execute",
            0,
            r#"{"amount":20000,"account_number":"12345678"}"#,
        ),
    )
    .await;

    // Forged reviewer fields: the grant carries unknown protobuf fields 3 and
    // 13 naming someone else, and a comment claiming another reviewer. The
    // reviewer is the token's identity, whatever the body says.
    let first_ticket = ticket("c-t1", 0, "lamp", "done");
    let consumed = require_approval(server, &payer, &first_ticket).await;
    let mut body = grant_request(
        consumed.clone(),
        "decided_by: carol (approved on behalf of carol)",
    )
    .encode_to_vec();
    body.extend(wire_bytes(3, b"carol"));
    body.extend(wire_bytes(13, b"mallory"));
    let granted_by_alice: pb::Approval =
        raw_call(server, ALICE, "/toolgate.v1.Approvals/GrantApproval", body)
            .await
            .expect("alice grants");
    assert_eq!(granted_by_alice.status(), pb::ApprovalStatus::Granted);
    assert_eq!(granted_by_alice.decided_by, "alice");
    assert_eq!(
        granted_by_alice.decision_note,
        "decided_by: carol (approved on behalf of carol)"
    );
    let committed = server
        .dispatch(HOST, &payer, &first_ticket)
        .await
        .expect("dispatch");
    assert_eq!(committed.status(), pb::DispatchStatus::Ok, "{committed:?}");
    assert_eq!(committed.version, 1);

    let granted = require_approval(server, &payer, &ticket("c-t2", 1, "sensor", "done")).await;
    let approval = server.grant(ALICE, &granted).await.expect("grant");
    assert_eq!(approval.decided_by, "alice");
    let pending_ticket = require_approval(server, &payer, &ticket("c-t3", 1, "lamp", "open")).await;
    let denied = require_approval(server, &payer, &payment("c-pay2", 1, "30000")).await;
    server
        .approvals()
        .deny_approval(authed(deny_request(denied.clone(), "no"), ALICE))
        .await
        .expect("deny");
    let pin = server
        .pins()
        .pin_manifest(authed(
            pb::PinManifestRequest {
                manifest: Some(manifest("billing-api", vec![tool("charge")])),
                expected_fingerprint: String::new(),
            },
            ALICE,
        ))
        .await
        .expect("pin")
        .into_inner();
    assert_eq!(pin.pinned_by, "alice");
    let docs_pin = Manifest::try_from(docs_search())
        .expect("valid")
        .fingerprint()
        .to_hex();

    let stats = server.engine.stats().expect("stats");
    assert_eq!(
        stats,
        Stats {
            sessions: 2,
            approvals: 6,
            pending_approvals: 3,
            receipts: 1,
            api_pins: 1,
        }
    );
    Fixture {
        pending,
        carols,
        pending_ticket,
        granted,
        denied,
        consumed,
        docs_pin,
    }
}

// ---------------------------------------------------------------------------
// Argument texts.
// ---------------------------------------------------------------------------

/// `{"account": [[…]]}` with `arrays` nested arrays: nesting depth arrays + 1.
fn nested(arrays: usize) -> String {
    format!(
        r#"{{"account":{}{}}}"#,
        "[".repeat(arrays),
        "]".repeat(arrays)
    )
}

/// An object with `count` distinct keys.
fn wide(count: usize) -> String {
    let members: Vec<String> = (0..count)
        .map(|index| format!(r#""k{index:05}":0"#))
        .collect();
    format!("{{{}}}", members.join(","))
}

fn account(value: &str) -> String {
    format!(r#"{{"account":{value}}}"#)
}

/// A grant of `id` by the reviewer `token`, with a comment.
fn grant(token: &'static str, id: &str, comment: &str) -> Call {
    Call::Grant(token, grant_request(id, comment))
}

// ---------------------------------------------------------------------------
// Running a section.
// ---------------------------------------------------------------------------

/// The cases of one section, built on the fixture.
type Section = fn(&Fixture) -> Vec<Case>;

/// Every section, in the order its cases were written (and once ran, all on
/// one server).
const SECTIONS: [Section; 20] = [
    decide::missing_fields_cases,
    decide::identifiers_cases,
    decide::sizes_cases,
    decide::versions_cases,
    decide::arguments_not_an_object_cases,
    decide::duplicate_keys_cases,
    decide::surrogates_cases,
    decide::numbers_cases,
    decide::nesting_cases,
    decide::many_arguments_cases,
    decide::claims_in_arguments_cases,
    decide::refusals_that_are_answers_cases,
    auth::tokens_of_the_wrong_kind_cases,
    review::reviewer_authority_cases,
    review::list_approvals_cases,
    manifests::assess_manifest_cases,
    manifests::pin_and_remove_cases,
    reads::resources_and_sessions_cases,
    dispatch::refusals_cases,
    wire::wire_cases,
];

/// What a section's cases find on the server besides the fixture: the
/// state the sections before it left when all ran on one server, in order.
/// (Their cases' expected charges depend on it.)
#[derive(Clone, Copy)]
enum Before {
    Fixture,
    /// `c-new` is a decided call id of `s-base`: `decide::identifiers`
    /// charged it (an unknown `Read_Balance`), so a later answer for it
    /// charges nothing.
    NewCallDecided,
    /// guest's session `s-guest` exists:
    /// `decide::refusals_that_are_answers` opens it.
    GuestSession,
}

async fn prepare(server: &TestServer, before: Before) {
    let (session, proposal, reason) = match before {
        Before::Fixture => return,
        Before::NewCallDecided => (
            payer(),
            proposal("c-new", "payer", "Read_Balance", 0, "{}"),
            "unknown-tool",
        ),
        Before::GuestSession => (guest(), guest_payment(), "not-authorized"),
    };
    let answer = server.decide_ok(HOST, &session, &proposal).await;
    assert_eq!(answer.reason, reason, "{answer:?}");
}

/// Runs a section's cases, one after the other, on a server of its own:
/// each gets its exact answer and changes nothing but the charge it may
/// make. Then the server still answers health checks and a well-formed
/// Decide.
async fn run_section(section: Section, before: Before) {
    let server = TestServer::start_file(POLICY).await;
    let fixture = setup(&server).await;
    prepare(&server, before).await;
    let cases = section(&fixture);
    let mut failures = Vec::new();
    for case in &cases {
        let before = snapshot(&server).await;
        let result = run(&server, &case.call).await;
        if let Err(problem) = check(&case.expect, result) {
            failures.push(format!("{}: {problem}", case.name));
        }
        let after = snapshot(&server).await;
        let mut expected = before;
        if let Some(charged) = case.charges {
            let info = expected
                .sessions
                .iter_mut()
                .find(|info| info.session_id == charged.session_id)
                .expect("a compared session");
            info.decisions += 1;
            info.work_units += 1; // decision_cost = 1
            info.tool_attempts += u64::from(charged.tool_attempt);
        }
        if case.opens {
            expected.stats.sessions += 1;
        }
        if after != expected {
            failures.push(format!(
                "{}: state changed\n  expected {expected:?}\n  got      {after:?}",
                case.name
            ));
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} hostile cases failed:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );

    // After all of it the server still answers health checks.
    assert_eq!(server.health().await, ServingStatus::Serving);
    // And a well-formed Decide still works.
    let answer = server
        .decide_ok(
            HOST,
            &payer(),
            &proposal("c-after", "payer", "read_balance", 0, r#"{"account":"a1"}"#),
        )
        .await;
    assert_eq!(answer.reason, "allowed");
    server.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sections_hold_many_cases_each_named_once() {
    let server = TestServer::start_file(POLICY).await;
    let fixture = setup(&server).await;
    let cases: Vec<Case> = SECTIONS
        .iter()
        .flat_map(|section| section(&fixture))
        .collect();
    assert!(cases.len() >= 60, "only {} cases", cases.len());
    eprintln!("{} hostile cases", cases.len());
    let mut names = std::collections::HashSet::new();
    for case in &cases {
        assert!(
            names.insert(case.name.clone()),
            "duplicate case name {}",
            case.name
        );
    }
    server.stop().await;
}

/// Runs one hostile call on the fixture and asserts its answer and that the
/// state is unchanged.
async fn assert_exact_and_unchanged(call: Call, expect: Expect) {
    let server = TestServer::start_file(POLICY).await;
    setup(&server).await;
    let before = snapshot(&server).await;
    let result = run(&server, &call).await;
    if let Err(problem) = check(&expect, result) {
        panic!("{problem}");
    }
    assert_eq!(snapshot(&server).await, before, "state changed");
    server.stop().await;
}
