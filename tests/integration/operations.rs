//! The operable sidecar: metrics exposition, load shedding, request timeout,
//! oversize messages, and graceful shutdown of a real `toolgate serve`.

use std::time::Duration;

use prost::Message;
use tonic::Code;
use tonic_health::pb::health_check_response::ServingStatus;

use crate::support::metrics::{samples, scrape};
use crate::support::policies::{DECIDE, TICKETS, decide_policy, portable, repo_path, section_cuts};
use crate::support::raw::HeldCall;
use crate::support::spawn::{self, Serve, Spawned};
use crate::support::tokens::HOST;
use crate::support::{TestServer, authed, decide_request, pb, proposal, read_balance, session};

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
    let dispatched = server.dispatch(HOST, &payer, &pay).await.expect("dispatch");
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
    let decide =
        r#"grpc_service="toolgate.v1.PolicyDecisionPoint",grpc_method="Decide",grpc_type="unary""#;
    assert_eq!(
        sample(&format!(
            r#"grpc_server_handled_total{{{decide},grpc_code="OK"}}"#
        )),
        4.0
    );
    assert_eq!(
        sample(&format!(
            r#"grpc_server_handled_total{{{decide},grpc_code="UNAUTHENTICATED"}}"#
        )),
        1.0
    );
    assert_eq!(
        sample(&format!("grpc_server_started_total{{{decide}}}")),
        5.0
    );
    assert!(text.contains(&format!(
        r#"grpc_server_handling_seconds_bucket{{{decide},le="0.001"}}"#
    )));
    assert_eq!(sample("toolgate_approvals_pending"), 1.0);
    assert_eq!(sample("toolgate_sessions"), 1.0);
    assert_eq!(sample("toolgate_load_shed_total"), 0.0);
    // Every answered call that changed the state (the four Decides, not the
    // refused call, nor the Dispatch, whose call id was decided: it changed
    // only the session's last activity) was made durable in some batch.
    assert_eq!(sample("toolgate_store_batch_operations_sum"), 4.0);
    assert!(sample("toolgate_store_batch_operations_count") >= 1.0);
    assert!(sample("toolgate_store_sync_seconds_count") >= 1.0);
    assert!(sample("toolgate_store_bytes") > 0.0);
    let revision = server.engine.policy().revision.clone();
    assert_eq!(
        sample(&format!(r#"toolgate_policy_info{{revision="{revision}"}}"#)),
        1.0
    );
    server.stop().await;
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
    let first = HeldCall::start(server.addr, path, HOST).await;
    let second = HeldCall::start(server.addr, path, HOST).await;
    let third = HeldCall::start(server.addr, path, HOST).await;
    // Three calls wait for their message; the limit of two is untouched.
    server.reads_are_allowed(HOST, 5).await;
    assert_eq!(server.health().await, ServingStatus::Serving);
    // The held calls complete normally once their message arrives.
    for (held, call_id) in [(first, "h1"), (second, "h2"), (third, "h3")] {
        let answer = held.finish(&read_balance(call_id).encode_to_vec()).await;
        assert_eq!(answer.code, Some(0), "{answer:?}");
    }
    let samples = samples(&scrape(server.metrics_addr.expect("metrics")).await);
    assert_eq!(samples.get("toolgate_load_shed_total").copied(), Some(0.0));
    server.stop().await;
}

#[tokio::test]
async fn a_call_past_the_request_timeout_is_deadline_exceeded() {
    let server =
        TestServer::start_with(decide_policy("[server]\nrequest_timeout_ms = 200\n")).await;
    // The call's message never comes.
    let held = HeldCall::start(server.addr, "/toolgate.v1.PolicyDecisionPoint/Decide", HOST).await;
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

/// `serve` runs on small pages: a transparent huge page's first touch
/// zeroes 2 MiB on a worker and stalled calls for milliseconds.
#[cfg(target_os = "linux")]
#[test]
fn serve_runs_with_transparent_huge_pages_off() {
    let server = Serve::new(&portable(DECIDE)).start();
    let status = std::fs::read_to_string(format!("/proc/{}/status", server.pid()))
        .expect("the server's /proc status");
    let thp = status
        .lines()
        .find_map(|line| line.strip_prefix("THP_enabled:"))
        .map(str::trim);
    assert_eq!(thp, Some("0"), "THP_enabled of toolgate serve");
    assert_eq!(server.stop(), Some(0));
}

/// SIGTERM's handler is installed before the address is announced: one
/// sent the moment `listening on` is read stops the process cleanly (it
/// was installed only once the server first polled its shutdown, and a
/// SIGTERM before that killed it: exit by signal, no clean store close).
#[test]
fn a_sigterm_right_after_listening_on_stops_cleanly() {
    for _ in 0..5 {
        let server = Serve::new(&portable(DECIDE)).start();
        assert_eq!(
            server.stop(),
            Some(0),
            "exit code (None: killed by the signal)"
        );
    }
}

#[tokio::test]
async fn sigterm_lets_in_flight_calls_finish_refuses_new_ones_and_exits_zero() {
    let server = Serve::new(&portable(DECIDE)).start();
    let addr = server.addr;

    let in_flight = HeldCall::start(addr, "/toolgate.v1.PolicyDecisionPoint/Decide", HOST).await;
    server.signal("TERM");

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
                        .decide(authed(read_balance("late"), HOST))
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
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    assert!(refused, "new calls were still accepted after SIGTERM");
    // … while the call already in flight completes normally.
    let answer = in_flight
        .finish(&read_balance("inflight").encode_to_vec())
        .await;
    assert_eq!(answer.code, Some(0), "{answer:?}");
    let exit = tokio::task::spawn_blocking(move || server.wait())
        .await
        .expect("join");
    assert_eq!(exit, Some(0));
}

// ----- policy reload (SIGHUP to a spawned binary) -------------------------

/// A server on its embedded default policy has nothing to reload: SIGHUP
/// says so and the server goes on serving (no handler was installed, so
/// the signal killed it).
#[tokio::test]
async fn sighup_to_a_server_on_the_embedded_policy_leaves_it_serving() {
    let mut server = Serve::new("")
        .embedded()
        .args(&["--store", "memory"])
        .pipe_stderr()
        .start();
    let lines = server.stderr_lines();
    server.signal("HUP");
    // The lines are read to the end: a stderr nobody reads any more loses
    // the last lines, and the exit status says so.
    let (said, lines) = tokio::task::spawn_blocking(move || {
        let deadline = std::time::Instant::now() + PATIENCE;
        while let Some(left) = deadline.checked_duration_since(std::time::Instant::now()) {
            match lines.recv_timeout(left) {
                Ok(line) if line.contains("SIGHUP: nothing to reload") => return (true, lines),
                Ok(_) => continue,
                Err(_) => return (false, lines),
            }
        }
        (false, lines)
    })
    .await
    .expect("join");
    assert!(said, "no 'nothing to reload' line");
    assert_eq!(server.health().await, ServingStatus::Serving);
    assert_eq!(server.stop(), Some(0));
    drop(lines);
}

/// Bound on every wait for the child, so a bug fails instead of hanging.
const PATIENCE: Duration = Duration::from_secs(30);

/// `toolgate serve --log-format json` as a child process, its stderr read
/// as it comes.
struct Served {
    server: Spawned,
    lines: std::sync::mpsc::Receiver<String>,
}

impl Served {
    fn start(text: &str) -> Served {
        let mut server = Serve::new(text)
            .args(&["--log-format", "json"])
            .pipe_stderr()
            .start();
        let lines = server.stderr_lines();
        Served { server, lines }
    }

    /// Writes `text` to the policy file, sends SIGHUP and returns the reload
    /// event that follows (`policy_reloaded` or `policy_reload_failed`).
    async fn reload(&self, text: &str) -> serde_json::Value {
        self.server.reload(text);
        loop {
            let line = match tokio::task::block_in_place(|| self.lines.recv_timeout(PATIENCE)) {
                Ok(line) => line,
                Err(error) => panic!("no reload event ({error}) after reloading {text:?}"),
            };
            let Ok(event) = serde_json::from_str::<serde_json::Value>(&line) else {
                continue;
            };
            if matches!(
                event["event"].as_str(),
                Some("policy_reloaded" | "policy_reload_failed")
            ) {
                return event;
            }
        }
    }

    /// The first line of stderr from now on that holds `text`.
    fn line_with(&self, text: &str) -> String {
        loop {
            match self.lines.recv_timeout(PATIENCE) {
                Ok(line) if line.contains(text) => return line,
                Ok(_) => continue,
                Err(error) => panic!("no line with {text:?} ({error})"),
            }
        }
    }

    /// Decide as `token`: the code, or the reason and policy revision.
    async fn decide(
        &self,
        token: &str,
        request: pb::DecideRequest,
    ) -> Result<(String, String), Code> {
        self.server
            .pdp()
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

fn support_request(call_id: &str) -> pb::DecideRequest {
    decide_request(
        session("support-agent", "s1", "desk"),
        proposal(
            call_id,
            "support-agent",
            "draft_reply",
            0,
            r#"{"ticket": "t-1", "text": "hello"}"#,
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sighup_reload_of_a_file_cut_at_any_section_is_refused_and_the_old_policy_stays() {
    // (file, token, a request it allows)
    type Allowed = fn(&str) -> pb::DecideRequest;
    let files: [(&str, &str, Allowed); 2] = [
        (DECIDE, HOST, read_balance),
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
async fn a_server_says_its_dangling_names_and_keeps_its_server_settings_to_a_restart() {
    let text =
        portable(DECIDE) + "\n[reviewers.zed]\nroles = [\"auditor\"]\nworkspaces = [\"*\"]\n";
    let served = Served::start(&text);
    let said = served.line_with("policy: no reviewer credential in [[credentials]]");
    assert!(said.contains("reviewers.zed"), "{said}");
    // [server] applies at start only: a reload that changes it is refused,
    // naming the keys, and the policy in force stays.
    let (_, revision) = served
        .decide(HOST, read_balance("before"))
        .await
        .expect("allowed");
    let event = served
        .reload(&format!("{text}\n[server]\nmax_connections = 7\n"))
        .await;
    assert_eq!(event["event"], "policy_reload_failed", "{event}");
    assert_eq!(
        event["error"],
        "the new policy changes [server] (max_connections): [server] applies at start \
         only; restart to change it"
    );
    assert_eq!(
        served.decide(HOST, read_balance("after")).await,
        Ok(("allowed".to_string(), revision))
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_cannot_open_the_host_api_nor_remove_every_credential_of_a_kind() {
    let text = portable(DECIDE);
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
        served.decide("", read_balance("no-token")).await,
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
        .decide(HOST, read_balance("still"))
        .await
        .expect("allowed");
    assert_eq!(reason, "allowed");
}

#[tokio::test]
async fn an_open_host_api_is_refused_off_loopback_at_start() {
    let output = tokio::task::spawn_blocking(|| {
        spawn::command()
            .args(["serve", "--listen", "0.0.0.0:0", "--config"])
            .arg(repo_path(TICKETS))
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
