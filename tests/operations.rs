//! The operable sidecar: metrics exposition, load shedding, request timeout,
//! oversize messages, and graceful shutdown of a real `toolgate serve`.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Command, Stdio};

use bytes::Bytes;
use common::{TestServer, authed, proposal, repo_path, session};
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;
use toolgate::pb;
use toolgate::policy::Policy;

const HOST: &str = "host-secret";

fn decide_policy(server_section: &str) -> Policy {
    let text = std::fs::read_to_string(repo_path("tests/fixtures/decide.toml"))
        .expect("fixture")
        .replace("manifest = \"../../examples", "manifest = \"examples");
    Policy::parse(
        &format!("{text}\n{server_section}"),
        "decide.toml",
        Some(&repo_path("")),
    )
    .expect("policy")
}

/// GET /metrics over plain HTTP/1.1; the exposition text.
async fn scrape(addr: SocketAddr) -> String {
    let mut stream = TcpStream::connect(addr).await.expect("connect metrics");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
        .await
        .expect("request");
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .expect("response");
    let (head, body) = response.split_once("\r\n\r\n").expect("http response");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    body.to_string()
}

/// Samples `name{labels} value` of the exposition text, by `name{labels}`.
fn samples(text: &str) -> HashMap<String, f64> {
    text.lines()
        .filter(|line| !line.starts_with('#') && !line.trim().is_empty())
        .filter_map(|line| {
            let (series, value) = line.rsplit_once(' ')?;
            Some((series.to_string(), value.parse().ok()?))
        })
        .collect()
}

#[tokio::test]
async fn metrics_show_the_traffic() {
    let server = TestServer::start_with_options(decide_policy(""), true).await;
    let payer = session("payer", "s1", "acme");
    for index in 0..3 {
        let read = proposal(&format!("r{index}"), "payer", "read_balance", 0, "{}");
        assert_eq!(
            server.decide_ok(HOST, &payer, &read).await.reason,
            "allowed"
        );
    }
    let pay = proposal(
        "p1",
        "payer",
        "payment_execute",
        0,
        r#"{"amount":20000,"account_number":"12345678"}"#,
    );
    assert_eq!(
        server.decide_ok(HOST, &payer, &pay).await.reason,
        "approval-threshold-exceeded"
    );
    let refused = server
        .decide("wrong-token", &payer, &pay)
        .await
        .expect_err("unauthenticated");
    assert_eq!(refused.code(), Code::Unauthenticated);
    let dispatched = server
        .pdp()
        .dispatch(authed(
            pb::DispatchRequest {
                session: Some(payer.clone()),
                proposal: Some(pay.clone()),
            },
            HOST,
        ))
        .await
        .expect("dispatch")
        .into_inner();
    assert_eq!(dispatched.status(), pb::DispatchStatus::ApprovalRequired);

    let text = scrape(server.metrics_addr.expect("metrics listener")).await;
    let samples = samples(&text);
    let sample = |series: &str| {
        samples
            .get(series)
            .copied()
            .unwrap_or_else(|| panic!("{series} missing:\n{text}"))
    };
    assert_eq!(
        sample(r#"toolgate_decisions_total{outcome="allow",reason="allowed"}"#),
        3.0
    );
    assert_eq!(
        sample(
            r#"toolgate_decisions_total{outcome="require_approval",reason="approval-threshold-exceeded"}"#
        ),
        1.0
    );
    assert_eq!(
        sample(r#"toolgate_dispatches_total{status="approval-required"}"#),
        1.0
    );
    assert_eq!(
        sample(r#"toolgate_approval_transitions_total{event="tool_call_require_approval"}"#),
        1.0
    );
    assert_eq!(
        sample(
            r#"toolgate_rpc_duration_seconds_count{method="toolgate.v1.PolicyDecisionPoint/Decide",code="OK"}"#
        ),
        4.0
    );
    assert_eq!(
        sample(
            r#"toolgate_rpc_duration_seconds_count{method="toolgate.v1.PolicyDecisionPoint/Decide",code="UNAUTHENTICATED"}"#
        ),
        1.0
    );
    assert!(text.contains(r#"toolgate_rpc_duration_seconds_bucket{method="toolgate.v1.PolicyDecisionPoint/Decide",code="OK",le="0.001"}"#));
    assert_eq!(sample("toolgate_approvals_pending"), 1.0);
    assert_eq!(sample("toolgate_sessions"), 1.0);
    assert_eq!(sample("toolgate_load_shed_total"), 0.0);
    let revision = server.engine.policy().revision.clone();
    assert_eq!(
        sample(&format!(r#"toolgate_policy_info{{revision="{revision}"}}"#)),
        1.0
    );
    server.stop().await;
}

/// A raw HTTP/2 gRPC call whose request body is held back: the call is in
/// flight (it holds its concurrency permit) until `finish` sends the body.
struct HeldCall {
    body: h2::SendStream<Bytes>,
    response: h2::client::ResponseFuture,
    message: Bytes,
    _connection: tokio::task::JoinHandle<()>,
}

impl HeldCall {
    async fn start(addr: SocketAddr, path: &str, message: &impl Message, token: &str) -> HeldCall {
        let tcp = TcpStream::connect(addr).await.expect("connect");
        let (client, mut connection) = h2::client::handshake(tcp).await.expect("h2 handshake");
        let mut ping_pong = connection.ping_pong().expect("ping pong");
        let connection = tokio::spawn(async move {
            let _ = connection.await;
        });
        let mut client = client.ready().await.expect("ready");
        let request = http::Request::post(format!("http://{addr}{path}"))
            .header("content-type", "application/grpc")
            .header("te", "trailers")
            .header("authorization", format!("Bearer {token}"))
            .body(())
            .expect("request");
        let (response, body) = client.send_request(request, false).expect("send headers");
        // A PING answered after the HEADERS frame means the server has seen
        // the stream: from here on the call is in flight.
        ping_pong.ping(h2::Ping::opaque()).await.expect("ping");
        let encoded = message.encode_to_vec();
        let mut framed = Vec::with_capacity(encoded.len() + 5);
        framed.push(0);
        framed.extend_from_slice(&u32::try_from(encoded.len()).expect("small").to_be_bytes());
        framed.extend_from_slice(&encoded);
        HeldCall {
            body,
            response,
            message: Bytes::from(framed),
            _connection: connection,
        }
    }

    /// Sends the body and returns the call's grpc-status (0 = OK).
    async fn finish(mut self) -> i32 {
        self.body
            .send_data(self.message.clone(), true)
            .expect("send body");
        let response = self.response.await.expect("response");
        if let Some(status) = response.headers().get("grpc-status") {
            return status.to_str().expect("ascii").parse().expect("code");
        }
        let mut body = response.into_body();
        while let Some(chunk) = body.data().await {
            let chunk = chunk.expect("data");
            let _ = body.flow_control().release_capacity(chunk.len());
        }
        let trailers = body
            .trailers()
            .await
            .expect("trailers")
            .expect("trailers present");
        trailers
            .get("grpc-status")
            .expect("grpc-status")
            .to_str()
            .expect("ascii")
            .parse()
            .expect("code")
    }
}

fn read_request(call_id: &str) -> pb::DecideRequest {
    pb::DecideRequest {
        session: Some(session("payer", "s1", "acme")),
        proposal: Some(proposal(call_id, "payer", "read_balance", 0, "{}")),
    }
}

/// A permit is taken once the whole request message has arrived (the shed
/// itself is covered by `overload`'s unit tests): calls that sent headers
/// and no body hold none, so they cannot lock other callers out.
#[tokio::test]
async fn calls_without_their_message_hold_no_permit_and_the_rest_are_served() {
    let server = TestServer::start_with_options(
        decide_policy("[server]\nmax_concurrent_requests = 2\n"),
        true,
    )
    .await;
    let path = "/toolgate.v1.PolicyDecisionPoint/Decide";
    let first = HeldCall::start(server.addr, path, &read_request("h1"), HOST).await;
    let second = HeldCall::start(server.addr, path, &read_request("h2"), HOST).await;
    let third = HeldCall::start(server.addr, path, &read_request("h3"), HOST).await;
    // Three calls wait for their message; the limit of two is untouched.
    let payer = session("payer", "s1", "acme");
    for index in 0..5 {
        let answer = server
            .decide_ok(
                HOST,
                &payer,
                &proposal(&format!("x{index}"), "payer", "read_balance", 0, "{}"),
            )
            .await;
        assert_eq!(answer.reason, "allowed");
    }
    assert_eq!(server.health().await, ServingStatus::Serving);
    // The held calls complete normally once their message arrives.
    assert_eq!(first.finish().await, 0);
    assert_eq!(second.finish().await, 0);
    assert_eq!(third.finish().await, 0);
    let samples = samples(&scrape(server.metrics_addr.expect("metrics")).await);
    assert_eq!(samples.get("toolgate_load_shed_total").copied(), Some(0.0));
    server.stop().await;
}

#[tokio::test]
async fn a_call_past_the_request_timeout_is_deadline_exceeded() {
    let server =
        TestServer::start_with(decide_policy("[server]\nrequest_timeout_ms = 200\n")).await;
    let held = HeldCall::start(
        server.addr,
        "/toolgate.v1.PolicyDecisionPoint/Decide",
        &read_request("slow"),
        HOST,
    )
    .await;
    let response = held.response.await.expect("response");
    assert_eq!(
        response
            .headers()
            .get("grpc-status")
            .map(|value| value.as_bytes().to_vec()),
        Some(b"4".to_vec()),
        "DEADLINE_EXCEEDED"
    );
    server.stop().await;
}

#[tokio::test]
async fn an_oversize_message_is_refused_and_the_server_stays_up() {
    let server = TestServer::start_with(decide_policy("")).await;
    let huge = format!(r#"{{"account":"{}"}}"#, "x".repeat(1_100_000));
    let status = server
        .decide(
            HOST,
            &session("payer", "s1", "acme"),
            &proposal("big", "payer", "read_balance", 0, &huge),
        )
        .await
        .expect_err("oversize");
    assert_eq!(status.code(), Code::ResourceExhausted, "{status:?}");
    assert!(
        status.message().contains("too large"),
        "{}",
        status.message()
    );
    let answer = server
        .decide_ok(
            HOST,
            &session("payer", "s1", "acme"),
            &proposal("small", "payer", "read_balance", 0, "{}"),
        )
        .await;
    assert_eq!(answer.reason, "allowed");
    assert_eq!(
        server.engine.stats().expect("stats").sessions,
        1,
        "the oversize call changed nothing"
    );
    server.stop().await;
}

#[tokio::test]
async fn sigterm_lets_in_flight_calls_finish_refuses_new_ones_and_exits_zero() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_toolgate"))
        .args(["serve", "--listen", "127.0.0.1:0", "--config"])
        .arg(repo_path("tests/fixtures/decide.toml"))
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start toolgate");
    let mut line = String::new();
    BufReader::new(child.stdout.take().expect("stdout"))
        .read_line(&mut line)
        .expect("listening line");
    let addr: SocketAddr = line
        .trim()
        .rsplit(' ')
        .next()
        .expect("address")
        .parse()
        .expect("socket address");

    let in_flight = HeldCall::start(
        addr,
        "/toolgate.v1.PolicyDecisionPoint/Decide",
        &read_request("inflight"),
        HOST,
    )
    .await;
    let status = Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());

    // New calls are refused: on a new connection (the listener is closed) …
    let mut refused = false;
    for _ in 0..200 {
        match tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("endpoint")
            .connect()
            .await
        {
            Err(_) => {
                refused = true;
                break;
            }
            Ok(channel) => {
                let answer =
                    pb::policy_decision_point_client::PolicyDecisionPointClient::new(channel)
                        .decide(authed(read_request("late"), HOST))
                        .await;
                if let Err(status) = answer {
                    assert!(
                        matches!(
                            status.code(),
                            Code::Unavailable | Code::Unknown | Code::Cancelled
                        ),
                        "{status:?}"
                    );
                    refused = true;
                    break;
                }
                // The signal may not have been handled yet: try again shortly.
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
        }
    }
    assert!(refused, "new calls were still accepted after SIGTERM");
    // … while the call already in flight completes normally.
    assert_eq!(in_flight.finish().await, 0);
    let exit = tokio::task::spawn_blocking(move || child.wait())
        .await
        .expect("join")
        .expect("wait");
    assert_eq!(exit.code(), Some(0));
}

// ----- policy reload (SIGHUP to a spawned binary) -------------------------

/// Bound on every wait for the child, so a bug fails instead of hanging.
const PATIENCE: std::time::Duration = std::time::Duration::from_secs(30);

/// `toolgate serve --config FILE --log-format json` as a child process,
/// its audit events read from stderr as they come.
struct Served {
    child: std::process::Child,
    addr: SocketAddr,
    events: std::sync::mpsc::Receiver<serde_json::Value>,
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
}

impl Served {
    fn start(text: &str) -> Served {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("policy.toml");
        std::fs::write(&path, text).expect("write policy");
        let mut child = Command::new(env!("CARGO_BIN_EXE_toolgate"))
            .args(["serve", "--listen", "127.0.0.1:0", "--log-format", "json"])
            .arg("--config")
            .arg(&path)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start toolgate");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("listening line");
        let addr: SocketAddr = line
            .trim()
            .rsplit(' ')
            .next()
            .expect("address")
            .parse()
            .expect("socket address");
        let (sender, events) = std::sync::mpsc::channel();
        let stderr = child.stderr.take().expect("stderr");
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Ok(event) = serde_json::from_str::<serde_json::Value>(&line)
                    && sender.send(event).is_err()
                {
                    break;
                }
            }
        });
        Served {
            child,
            addr,
            events,
            _dir: dir,
            path,
        }
    }

    /// Writes `text` to the policy file, sends SIGHUP and returns the reload
    /// event that follows (`policy_reloaded` or `policy_reload_failed`).
    async fn reload(&self, text: &str) -> serde_json::Value {
        std::fs::write(&self.path, text).expect("write policy");
        let status = Command::new("kill")
            .args(["-HUP", &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(status.success());
        loop {
            let event = match tokio::task::block_in_place(|| self.events.recv_timeout(PATIENCE)) {
                Ok(event) => event,
                Err(error) => panic!("no reload event ({error}) after reloading {text:?}"),
            };
            if matches!(
                event["event"].as_str(),
                Some("policy_reloaded" | "policy_reload_failed")
            ) {
                return event;
            }
        }
    }

    async fn pdp(
        &self,
    ) -> pb::policy_decision_point_client::PolicyDecisionPointClient<tonic::transport::Channel>
    {
        let channel = tonic::transport::Endpoint::from_shared(format!("http://{}", self.addr))
            .expect("endpoint")
            .connect()
            .await
            .expect("connect");
        pb::policy_decision_point_client::PolicyDecisionPointClient::new(channel)
    }

    /// Decide as `token`: the code, or the reason and policy revision.
    async fn decide(
        &self,
        token: &str,
        request: pb::DecideRequest,
    ) -> Result<(String, String), Code> {
        self.pdp()
            .await
            .decide(authed(request, token))
            .await
            .map(|answer| {
                let answer = answer.into_inner();
                (answer.reason, answer.policy_revision)
            })
            .map_err(|status| status.code())
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Every prefix of `text` that ends before a line starting with `[`.
fn section_cuts(text: &str) -> Vec<String> {
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

/// A policy file's text with its manifest paths made absolute.
fn portable(relative: &str) -> String {
    std::fs::read_to_string(repo_path(relative))
        .expect("policy file")
        .replace(
            "manifest = \"../../examples/",
            &format!("manifest = \"{}/", repo_path("examples").display()),
        )
}

fn support_request(call_id: &str) -> pb::DecideRequest {
    pb::DecideRequest {
        session: Some(session("support-agent", "s1", "desk")),
        proposal: Some(proposal(
            call_id,
            "support-agent",
            "draft_reply",
            0,
            r#"{"ticket": "t-1", "text": "hello"}"#,
        )),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sighup_reload_of_a_file_cut_at_any_section_is_refused_and_the_old_policy_stays() {
    // (file, token, a request it allows)
    type Allowed = fn(&str) -> pb::DecideRequest;
    let files: [(&str, &str, Allowed); 2] = [
        ("tests/fixtures/decide.toml", HOST, read_request),
        ("examples/policy.toml", "", support_request),
    ];
    for (relative, token, request) in files {
        let text = portable(relative);
        let served = Served::start(&text);
        let (reason, revision) = served
            .decide(token, request("before"))
            .await
            .expect("allowed");
        assert_eq!(reason, "allowed");
        let cuts = section_cuts(&text);
        assert!(cuts.len() >= 8, "{relative}");
        for (index, cut) in cuts.iter().enumerate() {
            let at = cut.lines().count();
            let event = served.reload(cut).await;
            assert_eq!(
                event["event"], "policy_reload_failed",
                "{relative} cut after line {at}: {event}"
            );
            assert!(
                event["error"]
                    .as_str()
                    .is_some_and(|error| !error.is_empty()),
                "{event}"
            );
            // The policy in force is the old one, closed as it was.
            assert_eq!(
                served.decide(token, request(&format!("c{index}"))).await,
                Ok(("allowed".to_string(), revision.clone())),
                "{relative} cut after line {at}"
            );
            if !token.is_empty() {
                assert_eq!(
                    served.decide("", request(&format!("open{index}"))).await,
                    Err(Code::Unauthenticated),
                    "{relative} cut after line {at}"
                );
            }
        }
        // The whole file, changed, is taken: the refusals were the decision's.
        let changed = format!("{text}\n# edited\n");
        let event = served.reload(&changed).await;
        assert_eq!(event["event"], "policy_reloaded", "{event}");
        let (_, new_revision) = served
            .decide(token, request("after"))
            .await
            .expect("allowed");
        assert_ne!(new_revision, revision);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_cannot_open_the_host_api_nor_remove_every_credential_of_a_kind() {
    let text = portable("tests/fixtures/decide.toml");
    let served = Served::start(&text);
    let host_credential = |identity: &str| {
        let start = text
            .find(&format!(
                "[[credentials]]\nkind = \"host\"\nidentity = \"{identity}\""
            ))
            .expect("host credential");
        let length = text[start + 1..].find("[[").expect("next section") + 1;
        text[start..start + length].to_string()
    };
    // Host credentials swapped for an open host API.
    let open = text
        .replace(&host_credential("agent-host"), "")
        .replace(&host_credential("other-host"), "")
        + "\n[server]\nopen_host_api = true\n";
    let event = served.reload(&open).await;
    assert_eq!(event["event"], "policy_reload_failed", "{event}");
    assert_eq!(
        event["error"],
        "the new policy has no host credential and the server has some: \
         a reload cannot remove every host credential (restart to do that)"
    );
    assert_eq!(
        served.decide("", read_request("no-token")).await,
        Err(Code::Unauthenticated)
    );
    // Every reviewer and reviewer credential removed.
    let reviewers_start = text.find("[reviewers.alice]").expect("reviewers");
    let reviewers_end = text.find("[[credentials]]").expect("credentials");
    let mut no_reviewers = format!("{}{}", &text[..reviewers_start], &text[reviewers_end..]);
    for identity in ["alice", "bob", "carol", "dave"] {
        let start = no_reviewers
            .find(&format!(
                "[[credentials]]\nkind = \"reviewer\"\nidentity = \"{identity}\""
            ))
            .expect("reviewer credential");
        let length = no_reviewers[start + 1..].find("[[").expect("next section") + 1;
        no_reviewers.replace_range(start..start + length, "");
    }
    let event = served.reload(&no_reviewers).await;
    assert_eq!(event["event"], "policy_reload_failed", "{event}");
    assert_eq!(
        event["error"],
        "the new policy has no reviewer credential and the server has some: \
         a reload cannot remove every reviewer credential (restart to do that)"
    );
    // An empty file.
    let event = served.reload("").await;
    assert_eq!(event["event"], "policy_reload_failed", "{event}");
    assert!(
        event["error"].as_str().is_some_and(|error| error.ends_with(
            "the policy is empty: it must declare its tools and how hosts authenticate"
        )),
        "{event}"
    );
    let (reason, _) = served
        .decide(HOST, read_request("still"))
        .await
        .expect("allowed");
    assert_eq!(reason, "allowed");
}

#[tokio::test]
async fn an_open_host_api_is_refused_off_loopback_at_start() {
    let output = tokio::task::spawn_blocking(|| {
        Command::new(env!("CARGO_BIN_EXE_toolgate"))
            .args(["serve", "--listen", "0.0.0.0:0", "--config"])
            .arg(repo_path("examples/tickets.toml"))
            .stdin(Stdio::null())
            .output()
            .expect("run toolgate")
    })
    .await
    .expect("join");
    assert_eq!(output.status.code(), Some(1));
    assert_eq!(String::from_utf8_lossy(&output.stdout), "");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains(
            "refusing to serve an open host API ([server] open_host_api = true) \
             on the non-loopback address 0.0.0.0:0"
        ),
        "{stderr}"
    );
}
