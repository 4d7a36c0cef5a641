//! toolgate as Envoy's external authorizer for MCP tool calls (issue 17):
//! `envoy.service.auth.v3.Authorization/Check` over real gRPC, with the
//! envoy-types client, sent as Envoy sends it (headers, a string or raw
//! body, `metadata_context` with the JWT filter's claims, the peer
//! principal), on `tests/fixtures/decide.toml` with an `[ext_authz]`
//! section.

use std::collections::HashMap;

use envoy_types::pb::envoy::config::core::v3::{HeaderValueOption, Metadata};
use envoy_types::pb::envoy::service::auth::v3::attribute_context::{HttpRequest, Peer, Request};
use envoy_types::pb::envoy::service::auth::v3::authorization_client::AuthorizationClient;
use envoy_types::pb::envoy::service::auth::v3::check_response::HttpResponse;
use envoy_types::pb::envoy::service::auth::v3::{AttributeContext, CheckRequest, CheckResponse};
use envoy_types::pb::google::protobuf::{Struct, Value as ProtoValue, value::Kind};
use serde_json::{Value, json};
use tonic::Code;
use tonic::transport::Channel;

use crate::audit_events::AuditLog;
use crate::support::policies::decide_text;
use crate::support::tokens::{ALICE, HOST, OTHER_HOST};
use crate::support::{AuditFormat, TestServer, authed, pb};

/// The mapping most tests use: the actor from a header, sessions from
/// `mcp-session-id`, workspace `acme` (alice reviews there).
const MAPPING: &str = r#"
[ext_authz]
actor_header = "x-agent"
session_header = "mcp-session-id"
workspace = "acme"
host_credential = "agent-host"
"#;

async fn start(mapping: &str) -> TestServer {
    TestServer::start(&decide_text(mapping)).await
}

/// A JSON-RPC `tools/call` body.
fn tool_call(id: Value, name: &str, arguments: Value) -> String {
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call",
           "params": {"name": name, "arguments": arguments}})
    .to_string()
}

/// A Check of a POST as Envoy sends it with `with_request_body` (the body
/// as a string), with these headers (lowercase, as Envoy sends them).
fn post(headers: &[(&str, &str)], body: &str) -> CheckRequest {
    let mut http = http_request("POST", headers);
    http.body = body.to_string();
    http.size = body.len() as i64;
    check_of(http)
}

fn http_request(method: &str, headers: &[(&str, &str)]) -> HttpRequest {
    let mut all: HashMap<String, String> = [
        (":method", method),
        (":path", "/mcp"),
        (":authority", "mcp.local"),
        ("content-type", "application/json"),
        ("accept", "application/json, text/event-stream"),
    ]
    .into_iter()
    .map(|(key, value)| (key.to_string(), value.to_string()))
    .collect();
    for (key, value) in headers {
        all.insert((*key).to_string(), (*value).to_string());
    }
    HttpRequest {
        id: "10512434565396349786".into(),
        method: method.into(),
        headers: all,
        path: "/mcp".into(),
        host: "mcp.local".into(),
        scheme: "http".into(),
        protocol: "HTTP/1.1".into(),
        size: -1,
        ..Default::default()
    }
}

fn check_of(http: HttpRequest) -> CheckRequest {
    CheckRequest {
        attributes: Some(AttributeContext {
            source: Some(Peer::default()),
            request: Some(Request {
                http: Some(http),
                ..Default::default()
            }),
            ..Default::default()
        }),
    }
}

/// The usual headers of payer's session `s1`.
const PAYER: [(&str, &str); 2] = [("x-agent", "payer"), ("mcp-session-id", "s1")];

fn client(server: &TestServer) -> AuthorizationClient<Channel> {
    AuthorizationClient::new(server.channel.clone())
}

async fn check(server: &TestServer, request: CheckRequest) -> CheckResponse {
    client(server)
        .check(authed(request, HOST))
        .await
        .expect("Check answers")
        .into_inner()
}

fn header<'a>(headers: &'a [HeaderValueOption], name: &str) -> Option<&'a str> {
    headers
        .iter()
        .filter_map(|option| option.header.as_ref())
        .find(|header| header.key == name)
        .map(|header| header.value.as_str())
}

fn metadata(response: &CheckResponse, key: &str) -> String {
    let value = response
        .dynamic_metadata
        .as_ref()
        .and_then(|metadata| metadata.fields.get(key))
        .and_then(|value| value.kind.as_ref());
    match value {
        Some(Kind::StringValue(text)) => text.clone(),
        other => panic!("metadata {key}: {other:?}"),
    }
}

/// An allowed answer: the decision id and fingerprint headers upstream.
fn assert_allowed(response: &CheckResponse, reason: &str) -> (String, String) {
    assert_eq!(
        response.status.as_ref().map(|status| status.code),
        Some(0),
        "{response:?}"
    );
    let Some(HttpResponse::OkResponse(ok)) = &response.http_response else {
        panic!("not an OK response: {response:?}");
    };
    assert_eq!(metadata(response, "outcome"), "allow");
    assert_eq!(metadata(response, "reason"), reason);
    let decision_id = header(&ok.headers, "x-toolgate-decision-id").expect("decision id header");
    assert_eq!(decision_id, metadata(response, "decision_id"));
    let fingerprint = header(&ok.headers, "x-toolgate-fingerprint").unwrap_or_default();
    (decision_id.to_string(), fingerprint.to_string())
}

/// A denied answer: HTTP 403, JSON, the JSON-RPC error body (returned),
/// metadata that agrees with it.
fn assert_denied(response: &CheckResponse, reason: &str) -> Value {
    assert_eq!(
        response.status.as_ref().map(|status| status.code),
        Some(Code::PermissionDenied as i32),
        "{response:?}"
    );
    let Some(HttpResponse::DeniedResponse(denied)) = &response.http_response else {
        panic!("not a denied response: {response:?}");
    };
    // A limit of the state is one the call may pass later: 429.
    let http_status = match reason {
        "resource-exhausted" => 429,
        _ => 403,
    };
    assert_eq!(
        denied.status.as_ref().map(|status| status.code),
        Some(http_status)
    );
    assert_eq!(
        header(&denied.headers, "content-type"),
        Some("application/json")
    );
    let body: Value = serde_json::from_str(&denied.body).expect("a JSON body");
    assert_eq!(body["jsonrpc"], "2.0");
    assert_eq!(body["error"]["data"]["reason"], reason, "{body}");
    assert_eq!(metadata(response, "reason"), reason);
    assert_eq!(
        body["error"]["data"]["decision_id"].as_str(),
        Some(metadata(response, "decision_id").as_str())
    );
    body
}

#[tokio::test]
async fn a_read_tool_call_is_allowed_with_its_decision_id_and_fingerprint() {
    let server = start(MAPPING).await;
    let body = tool_call(json!(1), "read_balance", json!({"account": "main"}));
    let answer = check(&server, post(&PAYER, &body)).await;
    let (decision_id, fingerprint) = assert_allowed(&answer, "allowed");
    assert_eq!(decision_id.len(), 36, "a UUID");
    assert_eq!(fingerprint.len(), 64);
    assert_eq!(fingerprint, metadata(&answer, "fingerprint"));
    assert_eq!(metadata(&answer, "approval_id"), "");
    // The same call again is the same proposal: the same fingerprint.
    let again = check(&server, post(&PAYER, &body)).await;
    assert_eq!(assert_allowed(&again, "allowed").1, fingerprint);
    server.stop().await;
}

#[tokio::test]
async fn a_raw_body_is_read_like_a_string_one() {
    let server = start(MAPPING).await;
    let body = tool_call(json!("r1"), "read_balance", json!({}));
    let mut http = http_request("POST", &PAYER);
    http.raw_body = body.into_bytes();
    let answer = check(&server, check_of(http)).await;
    assert_allowed(&answer, "allowed");
    server.stop().await;
}

#[tokio::test]
async fn a_denied_tool_call_answers_403_with_a_json_rpc_error_of_the_same_id() {
    let server = start(MAPPING).await;
    let body = tool_call(json!("call-7"), "change_role", json!({}));
    let answer = check(&server, post(&PAYER, &body)).await;
    let error = assert_denied(&answer, "forbidden-tool");
    assert_eq!(error["id"], "call-7");
    assert_eq!(error["error"]["code"], -32001);
    assert_eq!(error["error"]["data"]["outcome"], "deny");
    assert_eq!(
        error["error"]["data"]["fingerprint"].as_str(),
        Some(metadata(&answer, "fingerprint").as_str())
    );
    assert!(error["error"]["data"].get("approval_id").is_none());
    // An unknown tool is Decide's unknown-tool.
    let unknown = tool_call(json!(8), "no_such_tool", json!({}));
    let answer = check(&server, post(&PAYER, &unknown)).await;
    assert_eq!(assert_denied(&answer, "unknown-tool")["id"], 8);
    server.stop().await;
}

/// The Check of a wire transfer to `to` with JSON-RPC id `id`.
fn wire(id: Value, to: &str) -> CheckRequest {
    post(&PAYER, &tool_call(id, "wire_transfer", json!({"to": to})))
}

/// REQUIRE_APPROVAL: the approval id, in the body and the metadata.
fn approval_of(answer: &CheckResponse) -> String {
    let error = assert_denied(answer, "approval-required");
    assert_eq!(error["error"]["code"], -32002);
    assert_eq!(error["error"]["data"]["outcome"], "require_approval");
    let approval_id = error["error"]["data"]["approval_id"]
        .as_str()
        .expect("an approval id")
        .to_string();
    assert_eq!(approval_id, metadata(answer, "approval_id"));
    assert!(
        error["error"]["message"]
            .as_str()
            .is_some_and(|message| message.contains(&approval_id)),
        "{error}"
    );
    approval_id
}

#[tokio::test]
async fn a_grant_lets_one_call_through_and_a_retry_with_a_new_id_meets_it() {
    let server = start(MAPPING).await;
    let first = check(&server, wire(json!(1), "acct-9")).await;
    let approval_id = approval_of(&first);
    // A retry with a new JSON-RPC id is the same action: the same approval.
    let retry = check(&server, wire(json!("retry-2"), "acct-9")).await;
    assert_eq!(approval_of(&retry), approval_id);
    assert_eq!(assert_denied(&retry, "approval-required")["id"], "retry-2");
    server
        .grant(ALICE, &approval_id)
        .await
        .expect("alice grants");
    // Granted: the next call (yet another JSON-RPC id) passes and consumes it.
    let allowed = check(&server, wire(json!(3), "acct-9")).await;
    assert_allowed(&allowed, "approved");
    assert_eq!(metadata(&allowed, "approval_id"), approval_id);
    let approval = server.get_approval(ALICE, &approval_id).await.expect("get");
    assert_eq!(
        approval.status(),
        pb::ApprovalStatus::Consumed,
        "{approval:?}"
    );
    // Consumed: a second identical call needs a new approval.
    let second = check(&server, wire(json!(4), "acct-9")).await;
    let new_approval = approval_of(&second);
    assert_ne!(new_approval, approval_id);
    server.stop().await;
}

/// A limit of the state (here the actor's pending requests,
/// `max_pending_per_actor = 6` in decide.toml) is a denied answer the
/// client can read, HTTP 429, not a failed Check; it asks for nothing.
#[tokio::test]
async fn a_limit_reached_is_a_denied_answer_of_429() {
    let server = start(MAPPING).await;
    for to in 0..6 {
        approval_of(&check(&server, wire(json!(to), &format!("acct-{to}"))).await);
    }
    let full = check(&server, wire(json!("seventh"), "acct-6")).await;
    let error = assert_denied(&full, "resource-exhausted");
    assert_eq!(error["id"], "seventh");
    assert_eq!(error["error"]["code"], -32001);
    let message = error["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("pending approval requests"), "{message}");
    assert_eq!(metadata(&full, "fingerprint").len(), 64);
    assert_eq!(server.all_approvals(ALICE).await.len(), 6);
    server.stop().await;
}

#[tokio::test]
async fn two_hundred_racing_checks_on_one_grant_let_exactly_one_through() {
    let server = start(MAPPING).await;
    let approval_id = approval_of(&check(&server, wire(json!(0), "acct-race")).await);
    server
        .grant(ALICE, &approval_id)
        .await
        .expect("alice grants");
    let racers = (0..200).map(|index| {
        let mut client = client(&server);
        async move {
            client
                .check(authed(wire(json!(index), "acct-race"), HOST))
                .await
                .expect("Check answers")
                .into_inner()
        }
    });
    let answers = futures_util::future::join_all(racers).await;
    let allowed: Vec<&CheckResponse> = answers
        .iter()
        .filter(|answer| matches!(answer.http_response, Some(HttpResponse::OkResponse(_))))
        .collect();
    assert_eq!(allowed.len(), 1, "exactly one passes on one grant");
    assert_allowed(allowed[0], "approved");
    // Every Check is a tool attempt (payer: max_tool_calls = 50, one spent
    // on the request): 49 reach the ledger, where the others wait for a new
    // approval; the rest are over the budget.
    let mut over_budget = 0;
    for answer in &answers {
        if matches!(answer.http_response, Some(HttpResponse::OkResponse(_))) {
            continue;
        }
        if metadata(answer, "reason") == "tool-budget" {
            assert_denied(answer, "tool-budget");
            over_budget += 1;
        } else {
            assert_ne!(
                approval_of(answer),
                approval_id,
                "the others wait for a new approval"
            );
        }
    }
    assert_eq!(over_budget, 200 - 49);
    server.stop().await;
}

/// Envoy forwards every call a Check lets through, so a repeat of one call
/// id (an identical call, a retry) runs again: it is budgeted again and
/// costs a tool attempt, and an allowed `execute` tool counts its cost each
/// time — but no second decision.
#[tokio::test]
async fn every_call_let_through_is_charged_to_its_session() {
    let server = start(MAPPING).await;
    // tight: max_tool_calls = 1, max_session_seconds = 60.
    let tight = [("x-agent", "tight"), ("mcp-session-id", "s-pay")];
    let pay = |id: i64| {
        let arguments = json!({"amount": 5, "account_number": "123456"});
        post(&tight, &tool_call(json!(id), "payment_execute", arguments))
    };
    assert_allowed(&check(&server, pay(1)).await, "allowed");
    assert_denied(&check(&server, pay(2)).await, "tool-budget");
    let info = server.get_session(HOST, "s-pay").await.expect("session");
    assert_eq!(
        (info.decisions, info.tool_attempts, info.executed_tools),
        (1, 1, 1)
    );
    assert_eq!(
        info.work_units,
        1 + 5,
        "one decision, one payment of cost 5"
    );

    let reader = [("x-agent", "tight"), ("mcp-session-id", "s-read")];
    let read = |id: i64| {
        let arguments = json!({"account": "main"});
        post(&reader, &tool_call(json!(id), "read_balance", arguments))
    };
    assert_allowed(&check(&server, read(1)).await, "allowed");
    assert_allowed(&check(&server, read(2)).await, "allowed");
    server.clock.advance(std::time::Duration::from_secs(60));
    assert_denied(&check(&server, read(3)).await, "session-expired");
    server.stop().await;
}

#[tokio::test]
async fn an_idempotency_key_is_the_call_id() {
    let server = start(MAPPING).await;
    let keyed = |to: &str| {
        let mut headers = PAYER.to_vec();
        headers.push(("idempotency-key", "4f1c2b7e-0d9a-4c1e-9f3b-6a2d8e5c7b10"));
        post(
            &headers,
            &tool_call(json!(1), "read_balance", json!({"account": to})),
        )
    };
    assert_allowed(&check(&server, keyed("a")).await, "allowed");
    // The same key for other arguments: another action under one call id.
    let conflict = check(&server, keyed("b")).await;
    assert_denied(&conflict, "call-id-conflict");
    server.stop().await;
}

#[tokio::test]
async fn arguments_failing_the_input_schema_are_denied_with_the_field() {
    let server = start(MAPPING).await;
    let body = tool_call(json!(5), "wire_transfer", json!({"to": 7}));
    let error = assert_denied(
        &check(&server, post(&PAYER, &body)).await,
        "invalid-arguments",
    );
    assert_eq!(error["id"], 5);
    assert_eq!(error["error"]["code"], -32602);
    let message = error["error"]["message"].as_str().expect("message");
    assert!(message.starts_with("proposal.arguments.to: "), "{message}");
    assert!(message.contains("`type`"), "{message}");
    let fingerprint = error["error"]["data"]["fingerprint"].as_str();
    assert_eq!(fingerprint.map(str::len), Some(64), "{error}");
    let answer = check(&server, post(&PAYER, &body)).await;
    assert_eq!(metadata(&answer, "fingerprint"), fingerprint.unwrap_or(""));
    server.stop().await;
}

/// A refused Check's `request_rejected` line names the session's actor and
/// id once the mapping read them, and neither before.
#[tokio::test]
async fn a_refused_checks_audit_line_names_its_session_once_it_was_read() {
    let audit = AuditLog::capture(AuditFormat::Json);
    let server = start(MAPPING).await;
    let body = tool_call(json!(5), "wire_transfer", json!({"to": 7}));
    assert_denied(
        &check(&server, post(&PAYER, &body)).await,
        "invalid-arguments",
    );
    let no_actor = [("mcp-session-id", "s1")];
    assert_denied(
        &check(&server, post(&no_actor, &body)).await,
        "actor-missing",
    );
    let lines = audit.named("request_rejected");
    assert_eq!(lines.len(), 2, "{lines:#?}");
    let (schema, anonymous) = (&lines[0], &lines[1]);
    assert_eq!(schema["field"], "invalid-arguments", "{schema}");
    assert_eq!(schema["actor"], "payer", "{schema}");
    assert_eq!(schema["session_id"], "s1", "{schema}");
    assert_eq!(anonymous["field"], "actor-missing", "{anonymous}");
    assert_eq!(anonymous["actor"], Value::Null, "{anonymous}");
    assert_eq!(anonymous["session_id"], Value::Null, "{anonymous}");
    server.stop().await;
}

/// Decide's bound on the arguments (256 KiB of JSON) holds for a Check.
#[tokio::test]
async fn arguments_over_decides_bound_are_denied() {
    let server = start(MAPPING).await;
    let big = "x".repeat(300 * 1024);
    let body = tool_call(json!(6), "read_balance", json!({"account": big}));
    let error = assert_denied(
        &check(&server, post(&PAYER, &body)).await,
        "invalid-arguments",
    );
    assert_eq!(error["error"]["code"], -32602);
    let message = error["error"]["message"].as_str().expect("message");
    assert!(
        message.starts_with("params.arguments: must be at most 262144 bytes"),
        "{message}"
    );
    assert_eq!(server.engine.stats().expect("stats").sessions, 0);
    server.stop().await;
}

/// The bound is on the arguments' canonical text, which the body's length
/// does not bound: 50 KiB of DEL characters (one byte each in the body) are
/// 300 KiB once escaped; 43,000 of them (258,000 bytes) are within it.
#[tokio::test]
async fn arguments_whose_canonical_text_is_over_the_bound_are_denied() {
    let server = start(MAPPING).await;
    let escaped = |count: usize| {
        let body = tool_call(
            json!(7),
            "read_balance",
            json!({"account": "\u{7f}".repeat(count)}),
        );
        assert!(body.len() < 60 * 1024, "the body carries DEL unescaped");
        body
    };
    let error = assert_denied(
        &check(&server, post(&PAYER, &escaped(50 * 1024))).await,
        "invalid-arguments",
    );
    let message = error["error"]["message"].as_str().expect("message");
    assert!(
        message.starts_with("params.arguments: must be at most 262144 bytes"),
        "{message}"
    );
    assert_eq!(server.engine.stats().expect("stats").sessions, 0);
    assert_allowed(
        &check(&server, post(&PAYER, &escaped(43_000))).await,
        "allowed",
    );
    server.stop().await;
}

/// A session id stays bound to its first actor: another actor's Check in
/// it is refused for that, not as bad arguments.
#[tokio::test]
async fn a_session_of_another_actor_is_a_session_conflict() {
    let server = start(MAPPING).await;
    let body = tool_call(json!(1), "read_balance", json!({}));
    assert_allowed(&check(&server, post(&PAYER, &body)).await, "allowed");
    let carol = [("x-agent", "carol"), ("mcp-session-id", "s1")];
    let error = assert_denied(
        &check(&server, post(&carol, &body)).await,
        "session-conflict",
    );
    let message = error["error"]["message"].as_str().expect("message");
    assert!(message.starts_with("session.actor: "), "{message}");
    server.stop().await;
}

/// An MCP client picks the session id it sends: one actor's Checks hold at
/// most `max_sessions_per_actor` sessions, so a client cycling session ids
/// fills its own share (429), not the table every other client needs.
#[tokio::test]
async fn one_actor_cycling_session_ids_fills_only_its_own_share() {
    let server = start(&format!("{MAPPING}max_sessions_per_actor = 3\n")).await;
    let body = tool_call(json!(1), "read_balance", json!({}));
    let as_in = |actor, session| [("x-agent", actor), ("mcp-session-id", session)];
    for session in ["s1", "s2", "s3"] {
        assert_allowed(
            &check(&server, post(&as_in("payer", session), &body)).await,
            "allowed",
        );
    }
    let error = assert_denied(
        &check(&server, post(&as_in("payer", "s4"), &body)).await,
        "resource-exhausted",
    );
    let message = error["error"]["message"].as_str().unwrap_or("");
    assert!(
        message.contains(
            "\"payer\" holds its maximum of 3 sessions (ext_authz.max_sessions_per_actor)"
        ),
        "{message}"
    );
    // Its sessions still answer; another actor still opens sessions.
    assert_allowed(
        &check(&server, post(&as_in("payer", "s2"), &body)).await,
        "allowed",
    );
    assert_allowed(
        &check(&server, post(&as_in("carol", "c1"), &body)).await,
        "allowed",
    );
    server.stop().await;
}

/// With Envoy's `encode_raw_headers` the headers come as a list: every
/// copy of a header counts (joined as Envoy's `headers` map joins them),
/// and a value that is not UTF-8 matches nothing, so neither gets a call
/// past the header check nor makes the actor ambiguous.
#[tokio::test]
async fn raw_headers_are_read_copy_by_copy() {
    use envoy_types::pb::envoy::config::core::v3::{HeaderMap, HeaderValue};
    let server = start(MAPPING).await;
    let raw = |headers: &[(&str, &[u8])]| {
        let mut http = http_request("POST", &[]);
        http.headers.clear();
        http.header_map = Some(HeaderMap {
            headers: [("content-type", &b"application/json"[..])]
                .iter()
                .chain(headers)
                .map(|(key, value)| HeaderValue {
                    key: (*key).to_string(),
                    raw_value: value.to_vec(),
                    ..Default::default()
                })
                .collect(),
        });
        http.body = tool_call(json!(1), "read_balance", json!({}));
        check_of(http)
    };
    let payer: [(&str, &[u8]); 2] = [("x-agent", b"payer"), ("mcp-session-id", b"s1")];
    assert_allowed(&check(&server, raw(&payer)).await, "allowed");
    let mut twice = payer.to_vec();
    twice.extend([
        ("mcp-name", &b"read_balance"[..]),
        ("mcp-name", b"wire_transfer"),
    ]);
    assert_denied(&check(&server, raw(&twice)).await, "mcp-header-mismatch");
    let mut undecodable = payer.to_vec();
    undecodable.push(("mcp-name", b"\xff"));
    assert_denied(
        &check(&server, raw(&undecodable)).await,
        "mcp-header-mismatch",
    );
    let two_actors: [(&str, &[u8]); 3] = [
        ("x-agent", b"guest"),
        ("x-agent", b"payer"),
        ("mcp-session-id", b"s2"),
    ];
    assert_denied(&check(&server, raw(&two_actors)).await, "actor-missing");
    let two_sessions: [(&str, &[u8]); 3] = [
        ("x-agent", b"payer"),
        ("mcp-session-id", b"s1"),
        ("mcp-session-id", b"s9"),
    ];
    assert_denied(&check(&server, raw(&two_sessions)).await, "session-missing");
    let mut partial = payer.to_vec();
    partial.extend([
        ("x-envoy-auth-partial-body", &b"false"[..]),
        ("x-envoy-auth-partial-body", b"true"),
    ]);
    assert_denied(&check(&server, raw(&partial)).await, "body-truncated");
    server.stop().await;
}

/// A body is decided only as the UTF-8 JSON it is declared to be. This one
/// reads in UTF-8 as a `read_balance` (allowed), but a server that honours
/// `charset=utf-7` (the TypeScript SDK's body reader does) decodes the
/// `+…-` run into quotes and braces: a second `name` and `arguments`, and
/// `JSON.parse` keeps the last — a `wire_transfer` nobody approved.
#[tokio::test]
async fn a_body_in_another_charset_is_refused_not_read_as_utf8() {
    let server = start(MAPPING).await;
    let body = concat!(
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"read_balance","#,
        r#""arguments":{"account":"+ACIAfQAsACIAbgBhAG0AZQAiADoAIgB3AGkAcgBlAF8AdAByAGEAbgBz"#,
        r#"AGYAZQByACIALAAiAGEAcgBnAHUAbQBlAG4AdABzACIAOgB7ACIAdABvACIAOgAiAGEAYwBjAHQALQA5ACIA"#,
        r#"LAAiAGEAbQBvAHUAbgB0ACIAOgA1ACwAIgBhAGMAYwBvAHUAbgB0ACIAOgAi-"}}}"#,
    );
    let mut utf7 = PAYER.to_vec();
    utf7.push(("content-type", "application/json; charset=utf-7"));
    let error = assert_denied(
        &check(&server, post(&utf7, body)).await,
        "unsupported-media-type",
    );
    let message = error["error"]["message"].as_str().expect("message");
    assert!(message.contains("charset=utf-7"), "{message}");
    let mut declared = PAYER.to_vec();
    declared.push(("content-type", "Application/JSON; charset=\"UTF-8\""));
    assert_allowed(&check(&server, post(&declared, body)).await, "allowed");
    server.stop().await;
}

/// A Go MCP server (encoding/json) matches member names case-insensitively
/// and keeps the last: `"Params"` after `"params"` would have it run a
/// `wire_transfer` while the Check decided a `read_balance`, and `"Method"`
/// a `tools/call` that toolgate took for a response let through as
/// another request.
#[tokio::test]
async fn member_names_a_go_server_reads_as_one_are_refused() {
    let server = start(&format!("{MAPPING}other_methods = \"allow\"\n")).await;
    let smuggled = concat!(
        r#"{"jsonrpc":"2.0","id":5,"method":"tools/call","params":{"name":"read_balance"},"#,
        r#""Params":{"name":"wire_transfer","arguments":{"to":"acct-9","amount":5}}}"#,
    );
    let error = assert_denied(
        &check(&server, post(&PAYER, smuggled)).await,
        "ambiguous-member-names",
    );
    assert_eq!(error["id"], 5);
    let message = error["error"]["message"].as_str().expect("message");
    assert!(message.contains(r#""Params""#), "{message}");
    let as_response = concat!(
        r#"{"jsonrpc":"2.0","id":6,"result":{},"Method":"tools/call","#,
        r#""params":{"name":"wire_transfer","arguments":{"to":"acct-9","amount":5}}}"#,
    );
    assert_denied(
        &check(&server, post(&PAYER, as_response)).await,
        "ambiguous-member-names",
    );
    assert_eq!(server.engine.stats().expect("stats").sessions, 0);
    server.stop().await;
}

#[tokio::test]
async fn malformed_requests_fail_closed_with_a_precise_reason() {
    let server = start(MAPPING).await;
    let good = tool_call(json!(1), "read_balance", json!({}));
    let mut partial = PAYER.to_vec();
    partial.push(("x-envoy-auth-partial-body", "true"));
    let mut wrong_method = PAYER.to_vec();
    wrong_method.push(("mcp-method", "tools/list"));
    let mut wrong_name = PAYER.to_vec();
    wrong_name.push(("mcp-name", "change_role"));
    let mut text = PAYER.to_vec();
    text.push(("content-type", "text/plain"));
    let mut gzip = PAYER.to_vec();
    gzip.push(("content-encoding", "gzip"));
    let mut untyped = post(&PAYER, &good);
    if let Some(http) = untyped
        .attributes
        .as_mut()
        .and_then(|attributes| attributes.request.as_mut())
        .and_then(|request| request.http.as_mut())
    {
        http.headers.remove("content-type");
    }
    let cases: Vec<(&str, CheckRequest, &str)> = vec![
        ("truncated", post(&partial, &good), "body-truncated"),
        ("no body", post(&PAYER, ""), "body-missing"),
        (
            "not JSON",
            post(&PAYER, "{\"jsonrpc\": \"2.0\","),
            "body-not-json",
        ),
        (
            "a batch",
            post(&PAYER, &format!("[{good}]")),
            "batch-not-supported",
        ),
        (
            "not JSON-RPC",
            post(&PAYER, "{\"method\": \"tools/call\"}"),
            "not-json-rpc",
        ),
        (
            "Mcp-Method",
            post(&wrong_method, &good),
            "mcp-header-mismatch",
        ),
        ("Mcp-Name", post(&wrong_name, &good), "mcp-header-mismatch"),
        ("text/plain", post(&text, &good), "unsupported-media-type"),
        ("gzip", post(&gzip, &good), "unsupported-media-type"),
        ("no content-type", untyped, "unsupported-media-type"),
        (
            "no params",
            post(&PAYER, r#"{"jsonrpc":"2.0","id":1,"method":"tools/call"}"#),
            "invalid-tool-call",
        ),
        (
            "no session",
            post(&[("x-agent", "payer")], &good),
            "session-missing",
        ),
        (
            "two session ids joined",
            post(&[("x-agent", "payer"), ("mcp-session-id", "s1,s2")], &good),
            "session-missing",
        ),
        (
            "a session id with a space",
            post(&[("x-agent", "payer"), ("mcp-session-id", "s 1")], &good),
            "session-missing",
        ),
        (
            "no actor",
            post(&[("mcp-session-id", "s1")], &good),
            "actor-missing",
        ),
        (
            "an actor the host credential may not assert",
            post(&[("x-agent", "mallory"), ("mcp-session-id", "s1")], &good),
            "actor-not-permitted",
        ),
    ];
    for (case, request, reason) in cases {
        let answer = check(&server, request).await;
        let error = assert_denied(&answer, reason);
        assert!(
            !error["error"]["message"].as_str().unwrap_or("").is_empty(),
            "{case}"
        );
    }
    // Nothing was decided: no session exists.
    assert_eq!(server.engine.stats().expect("stats").sessions, 0);
    server.stop().await;
}

#[tokio::test]
async fn other_mcp_methods_follow_the_policy_setting() {
    let denied = start(MAPPING).await;
    let list = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;
    let error = assert_denied(
        &check(&denied, post(&PAYER, list)).await,
        "method-not-allowed",
    );
    assert_eq!(error["id"], 2);
    let stream = check_of(http_request("GET", &PAYER));
    assert_denied(&check(&denied, stream).await, "method-not-allowed");
    denied.stop().await;

    let allowed = start(&format!("{MAPPING}other_methods = \"allow\"\n")).await;
    for body in [
        list,
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#,
        r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#,
    ] {
        let answer = check(&allowed, post(&[], body)).await;
        assert_allowed(&answer, "method-allowed");
    }
    let stream = check_of(http_request("GET", &[]));
    assert_allowed(&check(&allowed, stream).await, "method-allowed");
    // A client's answer to the server's own request (sampling, roots) is
    // another method too; a fingerprint a client sent never goes upstream.
    let response = r#"{"jsonrpc":"2.0","id":"srv-1","result":{}}"#;
    let forged = [("x-toolgate-fingerprint", "00")];
    let answer = check(&allowed, post(&forged, response)).await;
    assert_allowed(&answer, "method-allowed");
    let Some(HttpResponse::OkResponse(ok)) = &answer.http_response else {
        panic!("allowed");
    };
    assert_eq!(ok.headers_to_remove, ["x-toolgate-fingerprint"]);
    let mut claimed = PAYER.to_vec();
    claimed.push(("mcp-method", "tools/call"));
    assert_denied(
        &check(&allowed, post(&claimed, response)).await,
        "mcp-header-mismatch",
    );
    allowed.stop().await;
    let denied = start(MAPPING).await;
    let error = assert_denied(
        &check(&denied, post(&[], response)).await,
        "method-not-allowed",
    );
    assert_eq!(error["id"], "srv-1");
    denied.stop().await;
}

/// Only a POST carries a JSON-RPC message to decide: a `tools/call` body
/// in a PUT or a PATCH (which a lenient server might read) is refused even
/// where other requests are let through, and so is a method MCP does not
/// use; GET, DELETE, HEAD and OPTIONS follow `other_methods`, but not with
/// a body.
#[tokio::test]
async fn a_tool_call_in_another_http_method_is_refused() {
    let server = start(&format!("{MAPPING}other_methods = \"allow\"\n")).await;
    let body = tool_call(
        json!(8),
        "wire_transfer",
        json!({"to": "acct-9", "amount": 5}),
    );
    for method in ["PUT", "patch", "BREW"] {
        let mut http = http_request(method, &PAYER);
        http.body = body.clone();
        http.size = body.len() as i64;
        let error = assert_denied(&check(&server, check_of(http)).await, "method-not-allowed");
        let message = error["error"]["message"].as_str().expect("message");
        assert!(
            message.contains("is not a method of MCP's streamable HTTP"),
            "{method}: {message}"
        );
    }
    for method in ["GET", "DELETE", "head", "OPTIONS"] {
        let answer = check(&server, check_of(http_request(method, &PAYER))).await;
        assert_allowed(&answer, "method-allowed");
        let mut http = http_request(method, &PAYER);
        http.body = body.clone();
        let error = assert_denied(&check(&server, check_of(http)).await, "method-not-allowed");
        let message = error["error"]["message"].as_str().expect("message");
        assert!(
            message.contains("but this one has a body"),
            "{method}: {message}"
        );
    }
    assert_eq!(server.engine.stats().expect("stats").sessions, 0);
    server.stop().await;
}

/// The JWT filter's metadata: the payload under `jwt_payload`.
fn jwt_metadata(claims: &[(&str, &str)]) -> Metadata {
    let text = |text: &str| ProtoValue {
        kind: Some(Kind::StringValue(text.to_string())),
    };
    let claims = Struct {
        fields: claims
            .iter()
            .map(|(key, value)| ((*key).to_string(), text(value)))
            .collect(),
    };
    let payload = Struct {
        fields: HashMap::from([(
            "jwt_payload".to_string(),
            ProtoValue {
                kind: Some(Kind::StructValue(claims)),
            },
        )]),
    };
    Metadata {
        filter_metadata: HashMap::from([("envoy.filters.http.jwt_authn".to_string(), payload)]),
        ..Default::default()
    }
}

/// The workspace from a header (`workspace_header`), refused when it is
/// missing or no workspace name (and an actor header that is no actor name,
/// naming the header); a tools/call sent as a notification (no `id`) is
/// decided like any other, its denied answer with `"id": null`.
#[tokio::test]
async fn the_workspace_can_come_from_a_header() {
    let server = start(
        r#"
[ext_authz]
actor_header = "x-agent"
session_header = "mcp-session-id"
workspace_header = "x-workspace"
host_credential = "agent-host"
"#,
    )
    .await;
    let read = tool_call(json!(1), "read_balance", json!({}));
    let mut acme = PAYER.to_vec();
    acme.push(("x-workspace", "acme"));
    assert_allowed(&check(&server, post(&acme, &read)).await, "allowed");
    assert_denied(
        &check(&server, post(&PAYER, &read)).await,
        "workspace-missing",
    );
    let odd_actor = [
        ("x-agent", "9-payer"),
        ("mcp-session-id", "s1"),
        ("x-workspace", "acme"),
    ];
    let error = assert_denied(
        &check(&server, post(&odd_actor, &read)).await,
        "actor-missing",
    );
    let message = error["error"]["message"].as_str().expect("message");
    assert!(
        message.starts_with("header x-agent: \"9-payer\" is not an actor name"),
        "{message}"
    );
    let mut bad = PAYER.to_vec();
    bad.push(("x-workspace", "9-not-a-name"));
    let error = assert_denied(
        &check(&server, post(&bad, &read)).await,
        "workspace-missing",
    );
    let message = error["error"]["message"].as_str().expect("message");
    assert!(message.starts_with("header x-workspace: "), "{message}");

    let notification = json!({"jsonrpc": "2.0", "method": "tools/call",
        "params": {"name": "wire_transfer", "arguments": {"to": "acct-n"}}})
    .to_string();
    let error = assert_denied(
        &check(&server, post(&acme, &notification)).await,
        "approval-required",
    );
    assert_eq!(error["id"], Value::Null);
    server.stop().await;
}

#[tokio::test]
async fn the_actor_can_come_from_a_jwt_claim() {
    let server = start(
        "[ext_authz]\nactor_claim = \"sub\"\njwt_payload = \"jwt_payload\"\nworkspace = \"acme\"\n",
    )
    .await;
    let body = tool_call(json!(1), "read_balance", json!({}));
    let mut request = post(&[("mcp-session-id", "s1"), ("x-agent", "guest")], &body);
    if let Some(attributes) = request.attributes.as_mut() {
        attributes.metadata_context = Some(jwt_metadata(&[("sub", "payer"), ("iss", "idp")]));
    }
    assert_allowed(&check(&server, request).await, "allowed");
    // No verified JWT: no actor (the header is not trusted under this mapping).
    let unverified = post(&[("mcp-session-id", "s2"), ("x-agent", "payer")], &body);
    assert_denied(&check(&server, unverified).await, "actor-missing");
    // A claim that is no actor name: the message says which claim.
    let mut odd = post(&[("mcp-session-id", "s3")], &body);
    if let Some(attributes) = odd.attributes.as_mut() {
        attributes.metadata_context = Some(jwt_metadata(&[("sub", "9-payer")]));
    }
    let error = assert_denied(&check(&server, odd).await, "actor-missing");
    let message = error["error"]["message"].as_str().unwrap_or("");
    assert!(
        message.starts_with("JWT claim \"sub\": \"9-payer\" is not an actor name"),
        "{message}"
    );
    server.stop().await;
}

/// A Check of `body` in session `s1`, from the peer `principal`.
fn from_principal(principal: &str, body: &str) -> CheckRequest {
    let mut request = post(&[("mcp-session-id", "s1")], body);
    if let Some(source) = request
        .attributes
        .as_mut()
        .and_then(|attributes| attributes.source.as_mut())
    {
        source.principal = principal.to_string();
    }
    request
}

#[tokio::test]
async fn the_actor_can_come_from_the_peer_principal() {
    let server = start(
        "[ext_authz]\nactor_from_principal = true\nworkspace = \"acme\"\n\
         [ext_authz.principals]\n\"spiffe://cluster.local/ns/agents/sa/payer\" = \"payer\"\n",
    )
    .await;
    let body = tool_call(json!(1), "read_balance", json!({}));
    let request = from_principal("spiffe://cluster.local/ns/agents/sa/payer", &body);
    assert_allowed(&check(&server, request).await, "allowed");
    let stranger = from_principal("spiffe://cluster.local/ns/x/sa/y", &body);
    let error = assert_denied(&check(&server, stranger).await, "actor-missing");
    let message = error["error"]["message"].as_str().unwrap_or("");
    assert!(
        message.starts_with("the peer principal: \"spiffe://"),
        "{message}"
    );
    // A principal that is itself an actor name is that actor, which the
    // host credential must be allowed to assert: a denied answer with the
    // call's JSON-RPC id, not a failed Check.
    let unlisted = from_principal("mallory", &body);
    let error = assert_denied(&check(&server, unlisted).await, "actor-not-permitted");
    assert_eq!(error["id"], 1);
    assert_eq!(error["error"]["code"], -32001);
    let message = error["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("\"mallory\""), "{message}");
    server.stop().await;
}

#[tokio::test]
async fn only_the_named_host_credential_may_ask() {
    let server = start(MAPPING).await;
    let body = tool_call(json!(1), "read_balance", json!({}));
    let refused = client(&server)
        .check(authed(post(&PAYER, &body), OTHER_HOST))
        .await
        .expect_err("another host");
    assert_eq!(refused.code(), Code::PermissionDenied);
    let anonymous = client(&server)
        .check(tonic::Request::new(post(&PAYER, &body)))
        .await
        .expect_err("no token");
    assert_eq!(anonymous.code(), Code::Unauthenticated);
    server.stop().await;
}

#[test]
fn the_ext_authz_section_is_validated_with_the_key_named() {
    let cases = [
        (
            "[ext_authz]\nactor_header = \"X-Agent\"\n",
            "ext_authz.actor_header",
        ),
        (
            "[ext_authz]\nactor_header = \"x\"\nactor_claim = \"sub\"\n",
            "ext_authz.actor_header",
        ),
        (
            "[ext_authz]\nworkspace = \"a\"\nworkspace_header = \"w\"\n",
            "ext_authz.workspace",
        ),
        ("[ext_authz]\nworkspace = \"1bad\"\n", "ext_authz.workspace"),
        (
            "[ext_authz]\nother_methods = \"maybe\"\n",
            "ext_authz.other_methods",
        ),
        (
            "[ext_authz]\nhost_credential = \"nobody\"\n",
            "ext_authz.host_credential",
        ),
        (
            "[ext_authz]\njwt_payload = \"p\"\n",
            "ext_authz.jwt_payload",
        ),
        (
            "[ext_authz]\n[ext_authz.principals]\n\"a\" = \"b\"\n",
            "ext_authz.principals",
        ),
        (
            "[ext_authz]\nmax_sessions_per_actor = 0\n",
            "ext_authz.max_sessions_per_actor",
        ),
        // More than the host's share (decide.toml: 100 sessions, two
        // host credentials) could never be reached.
        (
            "[ext_authz]\nmax_sessions_per_actor = 51\n",
            "ext_authz.max_sessions_per_actor",
        ),
        ("[ext_authz]\nactor_heder = \"x\"\n", "ext_authz"),
        // The ext_authz listener sees no token: which of its host's
        // credentials it acts with must not matter.
        (
            "[[credentials]]\nkind = \"host\"\nidentity = \"agent-host\"\nactors = [\"other\"]\n\
             sha256 = \"8f434346648f6b96df89dda901c5176b10a6d83961dd3c1ac88b59b2dc327aa4\"\n\n\
             [ext_authz]\nhost_credential = \"agent-host\"\n",
            "ext_authz.host_credential",
        ),
    ];
    for (section, key) in cases {
        let root = crate::support::policies::repo_path("");
        let error = crate::support::Policy::parse(&decide_text(section), "p.toml", Some(&root))
            .expect_err(section);
        assert!(error.key.starts_with(key), "{section}: {error}");
    }
    let default = crate::support::Policy::embedded_default().expect("embedded default");
    assert!(default.ext_authz.allow_other_methods);
    // An eighth of a host's share of the session table by default.
    let decide = crate::support::policies::parse(&decide_text("[ext_authz]\n"));
    assert_eq!(decide.limits.max_sessions_per_host, 50);
    assert_eq!(decide.ext_authz.max_sessions_per_actor, 6);
    assert_eq!(
        default.ext_authz.max_sessions_per_actor,
        default.limits.max_sessions_per_host / 8
    );
}

#[tokio::test]
async fn a_grant_consumed_by_a_check_stays_consumed_after_a_restart() {
    let directory = tempfile::tempdir().expect("temp dir");
    let data = directory.path().join("data");
    let store = || -> Box<dyn crate::support::Store> {
        Box::new(crate::support::SqliteStore::open(&data).expect("open the store"))
    };
    let policy = || crate::support::policies::parse(&decide_text(MAPPING));
    let clock = crate::support::ManualClock::starting_at(crate::support::EPOCH);
    let first = TestServer::start_on(policy(), store(), clock.clone()).await;
    let approval_id = approval_of(&check(&first, wire(json!(1), "acct-restart")).await);
    first
        .grant(ALICE, &approval_id)
        .await
        .expect("alice grants");
    assert_allowed(
        &check(&first, wire(json!(2), "acct-restart")).await,
        "approved",
    );
    first.engine.close_store();
    first.stop().await;

    let second = TestServer::start_on(policy(), store(), clock).await;
    let approval = second.get_approval(ALICE, &approval_id).await.expect("get");
    assert_eq!(
        approval.status(),
        pb::ApprovalStatus::Consumed,
        "{approval:?}"
    );
    let again = check(&second, wire(json!(3), "acct-restart")).await;
    assert_ne!(
        approval_of(&again),
        approval_id,
        "a consumed grant never lets a call through again"
    );
    second.stop().await;
}

/// The same through a real `toolgate serve` on its durable default, killed
/// with SIGKILL right after the allowed answer: a Check's answer is
/// released only once the consumption it made is on disk, so the server
/// started again on the same directory holds the grant consumed, and the
/// same call needs a new approval.
#[tokio::test]
async fn a_grant_consumed_by_a_check_stays_consumed_after_a_kill() {
    use crate::support::spawn::Serve;

    let directory = tempfile::tempdir().expect("temp dir");
    let data = directory.path().join("data");
    let data = data.to_str().expect("a UTF-8 path");
    let serve = || {
        Serve::new(&decide_text(MAPPING))
            .args(&["--data-dir", data])
            .start()
    };
    async fn check_at(channel: &Channel, request: CheckRequest) -> CheckResponse {
        AuthorizationClient::new(channel.clone())
            .check(authed(request, HOST))
            .await
            .expect("Check answers")
            .into_inner()
    }
    async fn approval_status(channel: &Channel, approval_id: &str) -> pb::ApprovalStatus {
        let request = pb::GetApprovalRequest {
            approval_id: approval_id.to_string(),
        };
        pb::approvals_client::ApprovalsClient::new(channel.clone())
            .get_approval(authed(request, ALICE))
            .await
            .expect("get the approval")
            .into_inner()
            .status()
    }

    let mut first = serve();
    let channel = first.channel().await;
    let approval_id = approval_of(&check_at(&channel, wire(json!(1), "acct-kill")).await);
    let grant = pb::GrantApprovalRequest {
        approval_id: approval_id.clone(),
        comment: "looks right".to_string(),
    };
    pb::approvals_client::ApprovalsClient::new(channel.clone())
        .grant_approval(authed(grant, ALICE))
        .await
        .expect("alice grants");
    assert_allowed(
        &check_at(&channel, wire(json!(2), "acct-kill")).await,
        "approved",
    );
    first.kill();

    let mut second = serve();
    let channel = second.channel().await;
    assert_eq!(
        approval_status(&channel, &approval_id).await,
        pb::ApprovalStatus::Consumed
    );
    let again = approval_of(&check_at(&channel, wire(json!(3), "acct-kill")).await);
    assert_ne!(
        again, approval_id,
        "a consumed grant never lets a call through again"
    );
    // The new request is durable too: the same call meets it after
    // another kill.
    second.kill();
    let third = serve();
    let channel = third.channel().await;
    assert_eq!(
        approval_status(&channel, &again).await,
        pb::ApprovalStatus::Pending
    );
    assert_eq!(
        approval_of(&check_at(&channel, wire(json!(4), "acct-kill")).await),
        again
    );
}

/// Without an actor source in `[ext_authz]` no tool call is decided: there
/// is no default header, for one a client can set (the default used to be
/// `x-toolgate-actor`) would name any actor the host may assert.
#[tokio::test]
async fn without_an_actor_source_no_tool_call_is_decided() {
    let section = "[ext_authz]\nworkspace = \"acme\"\nhost_credential = \"agent-host\"\n";
    // check-config says so.
    let policy = crate::support::policies::parse(&decide_text(section));
    assert!(
        policy
            .warnings
            .iter()
            .any(|warning| warning.key == "ext_authz"
                && warning.message.contains("names no actor source")),
        "{:?}",
        policy.warnings
    );
    let server = start(section).await;
    let body = tool_call(json!(1), "read_balance", json!({}));
    let forged = [("x-toolgate-actor", "payer"), ("mcp-session-id", "s1")];
    let error = assert_denied(&check(&server, post(&forged, &body)).await, "actor-missing");
    let message = error["error"]["message"].as_str().unwrap_or("");
    assert!(message.contains("names no actor source"), "{message}");
    server.stop().await;
}
