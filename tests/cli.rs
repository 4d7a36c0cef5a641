//! The reviewer/operator command line, run as the built binary against a
//! real server on `127.0.0.1:0`: approvals, pins, resources, check-config,
//! output formats, exit codes and error lines.

mod common;

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStderr, ChildStdout, Command, Stdio};
use std::time::Duration;

use common::{TestServer, proposal, repo_path, session};
use serde_json::{Value, json};
use toolgate::pb;

const POLICY: &str = "tests/fixtures/decide.toml";
const TICKETS: &str = "examples/tickets.toml";
const HOST: &str = "host-secret";
const ALICE: &str = "alice-secret";
const BOB: &str = "bob-secret";
/// Every test clock starts at `common::EPOCH`; pending requests live 300 s.
const REQUESTED_AT: &str = "2026-11-29T00:00:00Z";
const PENDING_EXPIRES_AT: &str = "2026-11-29T00:05:00Z";
/// Bound on every wait for the child process, so a bug fails instead of hanging.
const PATIENCE: Duration = Duration::from_secs(30);

/// What one run of the binary did.
#[derive(Debug)]
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    fn json(&self) -> Value {
        serde_json::from_str(&self.stdout)
            .unwrap_or_else(|error| panic!("stdout is not JSON ({error}): {}", self.stdout))
    }

    /// `key  value` lines of a record as a map.
    fn record(&self) -> BTreeMap<String, String> {
        self.stdout
            .lines()
            .filter_map(|line| {
                let (key, value) = line.split_once(' ')?;
                Some((key.to_string(), value.trim_start().to_string()))
            })
            .collect()
    }

    /// Table rows (header included) split on whitespace.
    fn rows(&self) -> Vec<Vec<String>> {
        self.stdout
            .lines()
            .map(|line| line.split_whitespace().map(str::to_string).collect())
            .collect()
    }
}

fn toolgate_command(args: &[String], token: Option<&str>) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_toolgate"));
    command
        .args(args)
        .env_remove("TOOLGATE_TOKEN")
        .stdin(Stdio::null());
    if let Some(token) = token {
        command.env("TOOLGATE_TOKEN", token);
    }
    command
}

/// Runs `toolgate ARGS` (token, if any, through `TOOLGATE_TOKEN`) off the
/// runtime thread, so the in-process server keeps serving meanwhile.
async fn toolgate(args: &[&str], token: Option<&str>) -> Run {
    let args: Vec<String> = args.iter().map(|arg| arg.to_string()).collect();
    let token = token.map(str::to_string);
    let output = tokio::time::timeout(
        PATIENCE,
        tokio::task::spawn_blocking(move || {
            toolgate_command(&args, token.as_deref())
                .output()
                .expect("run toolgate")
        }),
    )
    .await
    .expect("toolgate finishes")
    .expect("join");
    Run {
        code: output.status.code(),
        stdout: String::from_utf8(output.stdout).expect("utf-8 stdout"),
        stderr: String::from_utf8(output.stderr).expect("utf-8 stderr"),
    }
}

fn payment(call_id: &str, amount: u64) -> pb::Proposal {
    proposal(
        call_id,
        "payer",
        "payment_execute",
        0,
        &format!(r#"{{"amount": {amount}, "account_number": "12345678"}}"#),
    )
}

/// A new pending approval; returns the Decide answer.
async fn pending(server: &TestServer, proposal: &pb::Proposal) -> pb::DecideResponse {
    let answer = server
        .decide_ok(HOST, &session("payer", "s1", "acme"), proposal)
        .await;
    assert_eq!(answer.outcome(), pb::Outcome::RequireApproval);
    answer
}

fn url(server: &TestServer) -> String {
    format!("http://{}", server.addr)
}

#[tokio::test]
async fn approvals_list_and_get_as_table_and_json() {
    let server = TestServer::start_file(POLICY).await;
    let answer = pending(&server, &payment("c1", 15000)).await;
    let id = answer.approval_id.as_str();
    let addr = server.addr.to_string();

    // `host:port` without a scheme; token from TOOLGATE_TOKEN.
    let table = toolgate(&["approvals", "list", "--server", &addr], Some(ALICE)).await;
    assert_eq!(table.code, Some(0), "{table:?}");
    assert_eq!(
        table.rows(),
        vec![
            vec![
                "ID",
                "STATUS",
                "ACTOR",
                "TOOL",
                "WORKSPACE",
                "REASON",
                "REQUESTED",
                "EXPIRES"
            ],
            vec![
                id,
                "pending",
                "payer",
                "payment_execute",
                "acme",
                "approval-threshold-exceeded",
                REQUESTED_AT,
                PENDING_EXPIRES_AT
            ],
        ]
    );
    assert_eq!(table.stderr, "");

    // Options before the sub-subcommand work too.
    let listed = toolgate(
        &[
            "approvals",
            "--output",
            "json",
            "--server",
            &url(&server),
            "list",
        ],
        Some(ALICE),
    )
    .await;
    assert_eq!(listed.code, Some(0), "{listed:?}");
    assert_eq!(
        listed.json(),
        json!({"approvals": [{
            "approval_id": id,
            "fingerprint": answer.fingerprint,
            "actor": "payer",
            "session_id": "s1",
            "workspace": "acme",
            "tool": "payment_execute",
            "call_id": "c1",
            "arguments": {"account_number": "[redacted]", "amount": 15000},
            "reason": "approval-threshold-exceeded",
            "status": "pending",
            "requested_at": REQUESTED_AT,
            "expires_at": PENDING_EXPIRES_AT,
            "decided_by": "",
            "decided_at": null,
            "decision_note": "",
            "version": 0,
        }]})
    );

    let got = toolgate(
        &[
            "approvals",
            "get",
            id,
            "--server",
            &addr,
            "--output",
            "json",
        ],
        Some(ALICE),
    )
    .await;
    assert_eq!(got.code, Some(0), "{got:?}");
    assert_eq!(got.json(), listed.json()["approvals"][0]);

    let record = toolgate(&["approvals", "get", id, "--server", &addr], Some(ALICE)).await;
    assert_eq!(record.code, Some(0), "{record:?}");
    let fields = record.record();
    assert_eq!(fields["approval_id"], id);
    assert_eq!(fields["status"], "pending");
    assert_eq!(
        fields["arguments"],
        r#"{"account_number":"[redacted]","amount":15000}"#
    );
    assert_eq!(fields["fingerprint"], answer.fingerprint);
    assert_eq!(fields["requested_at"], REQUESTED_AT);
    assert_eq!(fields["decided_by"], "-");

    // Filters: nothing granted yet; the other tool has nothing.
    let granted = toolgate(
        &[
            "approvals",
            "list",
            "--server",
            &addr,
            "--status",
            "granted",
            "--output",
            "json",
        ],
        Some(ALICE),
    )
    .await;
    assert_eq!(granted.json(), json!({"approvals": []}));
    let by_tool = toolgate(
        &[
            "approvals",
            "list",
            "--server",
            &addr,
            "--actor",
            "payer",
            "--tool",
            "wire_transfer",
            "--output",
            "json",
        ],
        Some(ALICE),
    )
    .await;
    assert_eq!(by_tool.json(), json!({"approvals": []}));
    server.stop().await;
}

#[tokio::test]
async fn approvals_list_follows_pages_and_stops_at_the_limit() {
    let server = TestServer::start_file(POLICY).await;
    let mut ids = Vec::new();
    for index in 0..5 {
        let answer = pending(&server, &payment(&format!("p{index}"), 20000 + index)).await;
        ids.push(answer.approval_id);
    }
    ids.sort();
    let addr = server.addr.to_string();
    let listed_ids = |run: &Run| -> Vec<String> {
        let mut listed: Vec<String> = run.json()["approvals"]
            .as_array()
            .expect("approvals array")
            .iter()
            .map(|approval| approval["approval_id"].as_str().expect("id").to_string())
            .collect();
        listed.sort();
        listed
    };

    let all = toolgate(
        &[
            "approvals",
            "list",
            "--server",
            &addr,
            "--page-size",
            "2",
            "--output",
            "json",
        ],
        Some(ALICE),
    )
    .await;
    assert_eq!(all.code, Some(0), "{all:?}");
    assert_eq!(listed_ids(&all), ids);

    let limited = toolgate(
        &[
            "approvals",
            "list",
            "--server",
            &addr,
            "--page-size",
            "2",
            "--limit",
            "3",
            "--output",
            "json",
        ],
        Some(ALICE),
    )
    .await;
    assert_eq!(limited.code, Some(0), "{limited:?}");
    let limited_ids = listed_ids(&limited);
    assert_eq!(limited_ids.len(), 3);
    assert!(limited_ids.iter().all(|id| ids.contains(id)));

    let table = toolgate(
        &["approvals", "list", "--server", &addr, "--limit", "1"],
        Some(ALICE),
    )
    .await;
    assert_eq!(table.rows().len(), 2, "header and one row: {table:?}");
    server.stop().await;
}

#[tokio::test]
async fn grant_deny_and_revoke_change_the_ledger() {
    let server = TestServer::start_file(POLICY).await;
    let addr = url(&server);
    let payment_id = pending(&server, &payment("c1", 15000)).await.approval_id;
    let wire = proposal("w1", "payer", "wire_transfer", 0, r#"{"to":"x"}"#);
    let wire_id = pending(&server, &wire).await.approval_id;

    let granted = toolgate(
        &[
            "approvals",
            "grant",
            &payment_id,
            "--comment",
            "ok to pay",
            "--server",
            &addr,
        ],
        Some(ALICE),
    )
    .await;
    assert_eq!(granted.code, Some(0), "{granted:?}");
    let fields = granted.record();
    assert_eq!(fields["status"], "granted");
    assert_eq!(fields["decided_by"], "alice");
    assert_eq!(fields["decision_note"], "ok to pay");
    assert_eq!(fields["decided_at"], REQUESTED_AT);
    let stored = server.get_approval(ALICE, &payment_id).await.expect("get");
    assert_eq!(stored.status(), pb::ApprovalStatus::Granted);
    assert_eq!(stored.decided_by, "alice");
    assert_eq!(stored.decision_note, "ok to pay");

    let revoked = toolgate(
        &[
            "approvals",
            "revoke",
            &payment_id,
            "--reason",
            "changed my mind",
            "--server",
            &addr,
            "--output",
            "json",
        ],
        Some(ALICE),
    )
    .await;
    assert_eq!(revoked.code, Some(0), "{revoked:?}");
    let revoked_json = revoked.json();
    assert_eq!(revoked_json["status"], "revoked");
    assert_eq!(revoked_json["decision_note"], "changed my mind");
    assert_eq!(revoked_json["approval_id"], payment_id.as_str());
    let stored = server.get_approval(ALICE, &payment_id).await.expect("get");
    assert_eq!(stored.status(), pb::ApprovalStatus::Revoked);

    let denied = toolgate(
        &[
            "approvals",
            "deny",
            &wire_id,
            "--reason",
            "unknown payee",
            "--server",
            &addr,
            "--output",
            "json",
        ],
        Some(ALICE),
    )
    .await;
    assert_eq!(denied.code, Some(0), "{denied:?}");
    assert_eq!(denied.json()["status"], "denied");
    assert_eq!(denied.json()["arguments"], json!({"to": "x"}));
    let stored = server.get_approval(ALICE, &wire_id).await.expect("get");
    assert_eq!(stored.status(), pb::ApprovalStatus::Denied);
    assert_eq!(stored.decision_note, "unknown payee");

    // A finished approval cannot be granted: the server's refusal, exit 1.
    let again = toolgate(
        &["approvals", "grant", &wire_id, "--server", &addr],
        Some(ALICE),
    )
    .await;
    assert_eq!(again.code, Some(1), "{again:?}");
    assert!(
        again.stderr.starts_with("error: FailedPrecondition: "),
        "{again:?}"
    );
    assert_eq!(again.stdout, "");
    server.stop().await;
}

#[tokio::test]
async fn refusals_name_the_code_and_never_the_token() {
    let server = TestServer::start_file(POLICY).await;
    let addr = url(&server);
    let id = pending(&server, &payment("c1", 15000)).await.approval_id;

    // bob is a reviewer without the finance-approver role; token on the command line.
    let unauthorised = toolgate(
        &["approvals", "grant", &id, "--server", &addr, "--token", BOB],
        None,
    )
    .await;
    assert_eq!(unauthorised.code, Some(1), "{unauthorised:?}");
    assert!(
        unauthorised.stderr.starts_with("error: PermissionDenied: "),
        "{unauthorised:?}"
    );
    assert_eq!(unauthorised.stderr.lines().count(), 1);
    assert!(!unauthorised.stderr.contains(BOB));
    assert_eq!(unauthorised.stdout, "");
    let stored = server.get_approval(ALICE, &id).await.expect("get");
    assert_eq!(stored.status(), pb::ApprovalStatus::Pending);

    let anonymous = toolgate(&["approvals", "list", "--server", &addr], None).await;
    assert_eq!(anonymous.code, Some(1), "{anonymous:?}");
    assert!(
        anonymous.stderr.starts_with("error: Unauthenticated: "),
        "{anonymous:?}"
    );

    let unknown_token = "not-a-known-token";
    let unknown = toolgate(
        &["approvals", "get", &id, "--server", &addr],
        Some(unknown_token),
    )
    .await;
    assert_eq!(unknown.code, Some(1), "{unknown:?}");
    assert!(unknown.stderr.starts_with("error: Unauthenticated: "));
    assert!(!unknown.stderr.contains(unknown_token));

    let missing = toolgate(
        &[
            "approvals",
            "get",
            "6f1e2a9c-57f5-4c8e-9a55-0d3a1c2b4e5f",
            "--server",
            &addr,
        ],
        Some(ALICE),
    )
    .await;
    assert_eq!(missing.code, Some(1), "{missing:?}");
    assert!(
        missing.stderr.starts_with("error: NotFound: "),
        "{missing:?}"
    );

    // Usage errors exit 2.
    let usage = toolgate(
        &["approvals", "list", "--status", "maybe", "--server", &addr],
        Some(ALICE),
    )
    .await;
    assert_eq!(usage.code, Some(2), "{usage:?}");
    let scheme = toolgate(&["pins", "list", "--server", "ftp://x"], Some(ALICE)).await;
    assert_eq!(scheme.code, Some(2), "{scheme:?}");
    assert!(scheme.stderr.starts_with("error: --server"), "{scheme:?}");

    // --help never shows the token taken from the environment.
    let help = toolgate(&["approvals", "list", "--help"], Some(ALICE)).await;
    assert_eq!(help.code, Some(0));
    assert!(help.stdout.contains("TOOLGATE_TOKEN"));
    assert!(!help.stdout.contains(ALICE));
    server.stop().await;
}

#[tokio::test]
async fn an_unreachable_server_is_a_connection_error_not_a_panic() {
    // A port that was bound and released: nothing listens on it any more.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    drop(listener);
    let run = toolgate(&["approvals", "list", "--server", &addr], Some(ALICE)).await;
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(
        run.stderr
            .starts_with(&format!("error: cannot connect to http://{addr}: ")),
        "{run:?}"
    );
    assert!(!run.stderr.contains("panicked"));
    assert!(!run.stderr.contains(ALICE));
    assert_eq!(run.stdout, "");
}

/// A running `toolgate approvals watch`, killed when dropped.
struct Watcher {
    child: Option<Child>,
    stdout: Option<BufReader<ChildStdout>>,
    stderr: Option<BufReader<ChildStderr>>,
}

impl Watcher {
    /// Starts the watcher and waits until it reports (on stderr) that the
    /// stream is open: from then on no transition can be missed.
    async fn start(server: &TestServer, output: &str) -> Watcher {
        let args: Vec<String> = ["approvals", "watch", "--output", output, "--server"]
            .iter()
            .map(|arg| arg.to_string())
            .chain([url(server)])
            .collect();
        let mut child = toolgate_command(&args, Some(ALICE))
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn watch");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let stderr = BufReader::new(child.stderr.take().expect("stderr"));
        let (stderr, ready) = read_line(stderr).await;
        assert!(
            ready.starts_with("toolgate: watching approvals on "),
            "{ready:?}"
        );
        assert!(!ready.contains(ALICE));
        Watcher {
            child: Some(child),
            stdout: Some(stdout),
            stderr: Some(stderr),
        }
    }

    async fn next_line(&mut self) -> String {
        let reader = self.stdout.take().expect("stdout reader");
        let (reader, line) = read_line(reader).await;
        self.stdout = Some(reader);
        line
    }

    /// Waits for the watcher to exit on its own: (rest of stdout, rest of
    /// stderr, exit code).
    async fn finish(mut self) -> (String, String, Option<i32>) {
        let mut child = self.child.take().expect("child");
        let mut stdout = self.stdout.take().expect("stdout");
        let mut stderr = self.stderr.take().expect("stderr");
        tokio::time::timeout(
            PATIENCE,
            tokio::task::spawn_blocking(move || {
                let mut rest_out = String::new();
                stdout.read_to_string(&mut rest_out).expect("read stdout");
                let mut rest_err = String::new();
                stderr.read_to_string(&mut rest_err).expect("read stderr");
                let status = child.wait().expect("wait");
                (rest_out, rest_err, status.code())
            }),
        )
        .await
        .expect("watch exits")
        .expect("join")
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        if let Some(child) = self.child.as_mut() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One line from a child's pipe, read off the runtime thread.
async fn read_line<R: BufRead + Send + 'static>(mut reader: R) -> (R, String) {
    tokio::time::timeout(
        PATIENCE,
        tokio::task::spawn_blocking(move || {
            let mut line = String::new();
            reader.read_line(&mut line).expect("read line");
            (reader, line)
        }),
    )
    .await
    .expect("a line arrives")
    .expect("join")
}

#[tokio::test]
async fn watch_prints_each_transition_as_json_lines() {
    let server = TestServer::start_file(POLICY).await;
    let mut watcher = Watcher::start(&server, "json").await;

    let wire = proposal("w1", "payer", "wire_transfer", 0, r#"{"to":"x"}"#);
    let answer = pending(&server, &wire).await;
    let requested: Value = serde_json::from_str(&watcher.next_line().await).expect("json line");
    assert_eq!(requested["kind"], "requested");
    assert_eq!(requested["lagged"], 0);
    assert_eq!(
        requested["approval"]["approval_id"],
        answer.approval_id.as_str()
    );
    assert_eq!(requested["approval"]["status"], "pending");
    assert_eq!(requested["approval"]["tool"], "wire_transfer");
    assert_eq!(requested["approval"]["arguments"], json!({"to": "x"}));
    assert_eq!(requested["approval"]["reason"], "approval-required");

    server
        .grant(ALICE, &answer.approval_id)
        .await
        .expect("grant");
    let granted: Value = serde_json::from_str(&watcher.next_line().await).expect("json line");
    assert_eq!(granted["kind"], "granted");
    assert_eq!(granted["approval"]["status"], "granted");
    assert_eq!(granted["approval"]["decided_by"], "alice");
    assert_eq!(granted["approval"]["decision_note"], "looks right");
    drop(watcher);
    server.stop().await;
}

#[tokio::test]
async fn watch_prints_human_lines_and_exits_zero_when_the_server_ends_the_stream() {
    let server = TestServer::start_file(POLICY).await;
    let mut watcher = Watcher::start(&server, "table").await;
    let wire = proposal("w1", "payer", "wire_transfer", 0, r#"{"to":"x"}"#);
    let answer = pending(&server, &wire).await;
    assert_eq!(
        watcher.next_line().await,
        format!(
            "requested approval_id={} status=pending actor=payer tool=wire_transfer \
             workspace=acme reason=approval-required\n",
            answer.approval_id
        )
    );

    server.stop().await;
    let (rest_out, rest_err, code) = watcher.finish().await;
    assert_eq!(rest_out, "");
    assert_eq!(
        rest_err,
        "toolgate: watch ended: toolgate is shutting down\n"
    );
    assert_eq!(code, Some(0));
}

#[tokio::test]
async fn pins_add_list_and_remove() {
    let server = TestServer::start_file(POLICY).await;
    let addr = url(&server);
    // decide.toml pins docs-search already; pin a copy under another id.
    let original: Value = serde_json::from_slice(
        &std::fs::read(repo_path("examples/manifests/docs-search.json")).expect("manifest"),
    )
    .expect("manifest json");
    let mut copy = original.clone();
    copy["server_id"] = json!("docs-search-copy");
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), serde_json::to_vec(&copy).expect("json")).expect("write");
    let path = file.path().to_str().expect("utf-8 path");
    let fingerprint =
        toolgate::manifest::Manifest::from_json(&std::fs::read(file.path()).expect("read"))
            .expect("valid manifest")
            .fingerprint()
            .to_hex();

    // The wrong expected fingerprint refuses the pin.
    let refused = toolgate(
        &[
            "pins",
            "add",
            path,
            "--expect",
            &"0".repeat(64),
            "--server",
            &addr,
        ],
        Some(ALICE),
    )
    .await;
    assert_eq!(refused.code, Some(1), "{refused:?}");
    assert!(
        refused.stderr.starts_with("error: FailedPrecondition: "),
        "{refused:?}"
    );

    let added = toolgate(
        &[
            "pins",
            "add",
            path,
            "--expect",
            &fingerprint,
            "--server",
            &addr,
        ],
        Some(ALICE),
    )
    .await;
    assert_eq!(added.code, Some(0), "{added:?}");
    let fields = added.record();
    assert_eq!(fields["server_id"], "docs-search-copy");
    assert_eq!(fields["fingerprint"], fingerprint);
    assert_eq!(fields["revision"], "2026-11-01");
    assert_eq!(fields["source"], "api");
    assert_eq!(fields["pinned_by"], "alice");
    assert_eq!(fields["pinned_at"], REQUESTED_AT);
    assert_eq!(fields["tool_count"], "2");

    let listed = toolgate(
        &["pins", "list", "--server", &addr, "--output", "json"],
        Some(ALICE),
    )
    .await;
    assert_eq!(listed.code, Some(0), "{listed:?}");
    let mut pins: Vec<(String, String, String)> = listed.json()["pins"]
        .as_array()
        .expect("pins")
        .iter()
        .map(|pin| {
            (
                pin["server_id"].as_str().expect("id").to_string(),
                pin["source"].as_str().expect("source").to_string(),
                pin["pinned_by"].as_str().expect("by").to_string(),
            )
        })
        .collect();
    pins.sort();
    assert_eq!(
        pins,
        vec![
            ("docs-search".into(), "policy".into(), String::new()),
            ("docs-search-copy".into(), "api".into(), "alice".into()),
        ]
    );
    let table = toolgate(&["pins", "list", "--server", &addr], Some(ALICE)).await;
    let rows = table.rows();
    assert_eq!(
        rows[0],
        vec![
            "SERVER_ID",
            "SOURCE",
            "REVISION",
            "TOOLS",
            "PINNED_BY",
            "PINNED_AT",
            "FINGERPRINT"
        ]
    );
    assert!(rows.contains(&vec![
        "docs-search-copy".to_string(),
        "api".to_string(),
        "2026-11-01".to_string(),
        "2".to_string(),
        "alice".to_string(),
        REQUESTED_AT.to_string(),
        fingerprint.clone(),
    ]));

    let removed = toolgate(
        &[
            "pins",
            "remove",
            "docs-search-copy",
            "--server",
            &addr,
            "--output",
            "json",
        ],
        Some(ALICE),
    )
    .await;
    assert_eq!(removed.code, Some(0), "{removed:?}");
    assert_eq!(removed.json()["server_id"], "docs-search-copy");
    assert_eq!(removed.json()["fingerprint"], fingerprint.as_str());
    let after = toolgate(
        &["pins", "list", "--server", &addr, "--output", "json"],
        Some(ALICE),
    )
    .await;
    let after_json = after.json();
    let ids: Vec<&str> = after_json["pins"]
        .as_array()
        .expect("pins")
        .iter()
        .map(|pin| pin["server_id"].as_str().expect("id"))
        .collect();
    assert_eq!(ids, vec!["docs-search"]);

    // A file that is not a manifest is refused before connecting (exit 2).
    let bad = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(bad.path(), br#"{"server_id": "x", "extra": 1}"#).expect("write");
    let invalid = toolgate(
        &[
            "pins",
            "add",
            bad.path().to_str().expect("utf-8"),
            "--server",
            &addr,
        ],
        Some(ALICE),
    )
    .await;
    assert_eq!(invalid.code, Some(2), "{invalid:?}");
    assert!(invalid.stderr.contains("extra"), "{invalid:?}");
    server.stop().await;
}

#[tokio::test]
async fn resource_get_shows_value_and_version() {
    let server = TestServer::start_file(TICKETS).await;
    let token = Some("example-reviewer-token");
    let addr = server.addr.to_string();

    let table = toolgate(&["resource", "get", "lamp", "--server", &addr], token).await;
    assert_eq!(table.code, Some(0), "{table:?}");
    assert_eq!(
        table.stdout,
        "name     lamp\nvalue    \"open\"\nversion  0\n"
    );

    let json_run = toolgate(
        &[
            "resource", "get", "outbox", "--server", &addr, "--output", "json",
        ],
        token,
    )
    .await;
    assert_eq!(json_run.code, Some(0), "{json_run:?}");
    assert_eq!(
        json_run.json(),
        json!({"name": "outbox", "value": [], "version": 0})
    );
    let lamp = toolgate(
        &[
            "resource", "get", "lamp", "--server", &addr, "--output", "json",
        ],
        token,
    )
    .await;
    assert_eq!(
        lamp.json(),
        json!({"name": "lamp", "value": "open", "version": 0})
    );

    let missing = toolgate(&["resource", "get", "nothing", "--server", &addr], token).await;
    assert_eq!(missing.code, Some(1), "{missing:?}");
    assert!(
        missing.stderr.starts_with("error: NotFound: "),
        "{missing:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn check_config_prints_what_a_policy_defines() {
    let path = repo_path("examples/policy.toml");
    let path = path.to_str().expect("utf-8 path");
    let revision = toolgate::policy::Policy::load(&repo_path("examples/policy.toml"))
        .expect("valid")
        .revision;

    let run = toolgate(&["check-config", path], None).await;
    assert_eq!(run.code, Some(0), "{run:?}");
    // Its reviewer has a token only when serving the embedded copy.
    assert_eq!(
        run.stderr,
        format!(
            "warning: {path}: reviewers.admin: no reviewer credential in [[credentials]]: \
             this reviewer cannot sign in\n"
        )
    );
    let rows = run.rows();
    assert!(rows.contains(&vec!["open_host_api".to_string(), "true".to_string()]));
    assert!(rows.contains(&vec!["revision".to_string(), revision.clone()]));
    assert!(rows.contains(&vec!["version_scope".to_string(), "global".to_string()]));
    assert!(rows.contains(&vec!["tools".to_string(), "(6)".to_string()]));
    assert!(
        rows.contains(
            &[
                "payment_execute",
                "execute",
                "threshold(amount)",
                "payments",
                "finance-approver",
                "-",
                "account_number",
                "5",
                "none",
            ]
            .map(str::to_string)
            .to_vec()
        ),
        "{}",
        run.stdout
    );
    assert!(
        rows.contains(
            &[
                "payments-agent",
                "Finance.Payments",
                "payments,reader",
                "10000",
                "200",
                "50",
                "3600"
            ]
            .map(str::to_string)
            .to_vec()
        )
    );
    assert!(rows.contains(&["lamp", "\"open\""].map(str::to_string).to_vec()));
    assert!(rows.contains(&["credentials", "(0)"].map(str::to_string).to_vec()));

    // JSON, on a policy with credentials: identities and kinds, never digests.
    let fixture = repo_path(POLICY);
    let fixture_text = std::fs::read_to_string(&fixture).expect("fixture");
    let json_run = toolgate(
        &[
            "check-config",
            fixture.to_str().expect("utf-8"),
            "--output",
            "json",
        ],
        None,
    )
    .await;
    assert_eq!(json_run.code, Some(0), "{json_run:?}");
    let summary = json_run.json();
    assert_eq!(summary["valid"], true);
    assert_eq!(summary["errors"], json!([]));
    assert_eq!(summary["warnings"], json!([]));
    assert_eq!(summary["open_host_api"], false);
    let credentials: Vec<(String, String)> = summary["credentials"]
        .as_array()
        .expect("credentials")
        .iter()
        .map(|credential| {
            (
                credential["kind"].as_str().expect("kind").to_string(),
                credential["identity"]
                    .as_str()
                    .expect("identity")
                    .to_string(),
            )
        })
        .collect();
    assert_eq!(
        credentials,
        [
            ("host", "agent-host"),
            ("host", "other-host"),
            ("reviewer", "alice"),
            ("reviewer", "bob"),
            ("reviewer", "carol"),
            ("reviewer", "dave"),
        ]
        .map(|(kind, identity)| (kind.to_string(), identity.to_string()))
        .to_vec()
    );
    for line in fixture_text.lines() {
        if let Some(digest) = line.strip_prefix("sha256 = ") {
            let digest = digest.trim_matches('"');
            assert!(!json_run.stdout.contains(digest), "digest leaked");
        }
    }
    let payment = summary["tools"]
        .as_array()
        .expect("tools")
        .iter()
        .find(|tool| tool["name"] == "payment_execute")
        .expect("payment_execute");
    assert_eq!(payment["mode"], "execute");
    assert_eq!(payment["approval"], "threshold");
    assert_eq!(payment["threshold_argument"], "amount");
    assert_eq!(summary["pins"][0]["server_id"], "docs-search");
    assert_eq!(summary["pins"][0]["revision"], "2026-11-01");
    assert_eq!(summary["limits"]["max_pending_per_actor"], 6);

    let broken = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(
        broken.path(),
        "[tools.t]\nmode = \"read\"\nroles = [\"r\"]\napproval = \"sometimes\"\n",
    )
    .expect("write");
    let bad = toolgate(
        &["check-config", broken.path().to_str().expect("utf-8")],
        None,
    )
    .await;
    assert_eq!(bad.code, Some(1), "{bad:?}");
    assert_eq!(bad.stdout, "");
    assert!(bad.stderr.starts_with("error: "), "{bad:?}");
    assert!(bad.stderr.contains(": tools.t.approval: "), "{bad:?}");
    assert_eq!(bad.stderr.lines().count(), 1);
}

/// A policy file in a temporary directory, removed with the value.
struct PolicyFile {
    _dir: tempfile::TempDir,
    path: std::path::PathBuf,
}

impl PolicyFile {
    fn new(text: &str) -> PolicyFile {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("policy.toml");
        std::fs::write(&path, text).expect("write policy");
        PolicyFile { _dir: dir, path }
    }

    fn path(&self) -> &str {
        self.path.to_str().expect("utf-8 path")
    }
}

/// One tool, one actor holding its role, an open host API.
const VALID_TAIL: &str = "[tools.t]\nmode = \"read\"\nroles = [\"r\"]\n\n[profiles.p]\nroles = [\"r\"]\n\n[actors.a]\nprofile = \"p\"\n\n[server]\nopen_host_api = true\n";

#[tokio::test]
async fn check_config_errors_name_the_key_in_plain_words() {
    let cases = [
        (
            "[limits]\npending_ttl_seconds = \"300\"\n",
            "limits.pending_ttl_seconds: expected a non-negative integer, found the string \"300\"",
        ),
        ("[limits]\nlimit = 5\n", "limits: unknown key limit"),
        ("[tools.x]\nroles = [\"r\"]\n", "tools.x: missing key mode"),
        (
            "[[credentials]]\nkind = \"reviewer\"\nidentity = \"b\"\n",
            "credentials[0]: missing key sha256",
        ),
        (
            "[tools.x]\nmode = \"read\"\nroles = [\"r\"]\ninput_schema = { type = \"object\", properties = { n = { type = \"integer\", minimum = \"1\" } } }\n",
            "tools.x.input_schema: invalid JSON Schema at /properties/n/minimum: \"1\" is not of type \"number\"",
        ),
    ];
    for (text, expected) in cases {
        let file = PolicyFile::new(&format!("{text}\n{VALID_TAIL}"));
        let run = toolgate(&["check-config", file.path()], None).await;
        assert_eq!(run.code, Some(1), "{run:?}");
        assert_eq!(run.stdout, "");
        assert_eq!(run.stderr, format!("error: {}: {expected}\n", file.path()));
    }
    let closed = PolicyFile::new(&VALID_TAIL.replace("open_host_api = true", ""));
    let run = toolgate(&["check-config", closed.path()], None).await;
    assert_eq!(run.code, Some(1), "{run:?}");
    assert_eq!(
        run.stderr,
        format!(
            "error: {}: credentials: no host credential: declare one ([[credentials]] with \
             kind = \"host\"), or set [server] open_host_api = true to let any local client \
             call the host API\n",
            closed.path()
        )
    );
    let empty = PolicyFile::new("# nothing yet\n");
    let run = toolgate(&["check-config", empty.path()], None).await;
    assert_eq!(run.code, Some(1), "{run:?}");
    assert_eq!(
        run.stderr,
        format!(
            "error: {}: the policy is empty: it must declare its tools and how hosts authenticate\n",
            empty.path()
        )
    );
}

#[tokio::test]
async fn check_config_names_a_missing_file() {
    let run = toolgate(&["check-config", "/nope.toml"], None).await;
    assert_eq!(run.code, Some(1), "{run:?}");
    assert_eq!(run.stdout, "");
    assert_eq!(
        run.stderr,
        "error: cannot read /nope.toml: No such file or directory (os error 2)\n"
    );
    let json_run = toolgate(&["check-config", "/nope.toml", "--output", "json"], None).await;
    assert_eq!(json_run.code, Some(1), "{json_run:?}");
    assert_eq!(
        json_run.json(),
        json!({
            "file": "/nope.toml",
            "valid": false,
            "errors": [{
                "file": "/nope.toml",
                "key": "",
                "message": "cannot read /nope.toml: No such file or directory (os error 2)",
            }],
            "warnings": [],
        })
    );
}

#[tokio::test]
async fn check_config_warns_of_dangling_names_and_strict_refuses_them() {
    let text = format!(
        "{VALID_TAIL}\n[tools.pay]\nmode = \"execute\"\nroles = [\"payer\"]\napproval = \"always\"\napprovers = [\"finance\"]\n\n[reviewers.bob]\nroles = [\"support\"]\nworkspaces = [\"*\"]\n"
    );
    let file = PolicyFile::new(&text);
    let path = file.path();
    let warnings = [
        (
            "reviewers.bob",
            "no reviewer credential in [[credentials]]: this reviewer cannot sign in",
        ),
        ("tools.pay.approvers", "no reviewer holds role \"finance\""),
        ("tools.pay.roles", "no actor holds role \"payer\""),
    ];
    let lines = |label: &str| -> String {
        warnings
            .iter()
            .map(|(key, message)| format!("{label}: {path}: {key}: {message}\n"))
            .collect()
    };

    let run = toolgate(&["check-config", path], None).await;
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(run.stderr, lines("warning"));
    assert!(
        run.stdout.starts_with(&format!("policy {path}: valid\n")),
        "{run:?}"
    );

    let strict = toolgate(&["check-config", "--strict", path], None).await;
    assert_eq!(strict.code, Some(1), "{strict:?}");
    assert_eq!(strict.stdout, "");
    assert_eq!(strict.stderr, lines("error"));

    let entries: Vec<Value> = warnings
        .iter()
        .map(|(key, message)| json!({ "file": path, "key": key, "message": message }))
        .collect();
    let json_run = toolgate(&["check-config", path, "--output", "json"], None).await;
    assert_eq!(json_run.code, Some(0), "{json_run:?}");
    assert_eq!(json_run.stderr, "");
    let summary = json_run.json();
    assert_eq!(summary["valid"], true);
    assert_eq!(summary["errors"], json!([]));
    assert_eq!(summary["warnings"], Value::Array(entries.clone()));
    assert_eq!(summary["open_host_api"], true);

    let strict_json = toolgate(
        &["check-config", path, "--strict", "--output", "json"],
        None,
    )
    .await;
    assert_eq!(strict_json.code, Some(1), "{strict_json:?}");
    assert_eq!(
        strict_json.json(),
        json!({ "file": path, "valid": false, "errors": entries, "warnings": [] })
    );

    let broken = PolicyFile::new("[limits]\nlimit = 5\n");
    let broken_json = toolgate(&["check-config", broken.path(), "--output", "json"], None).await;
    assert_eq!(broken_json.code, Some(1), "{broken_json:?}");
    assert_eq!(broken_json.stderr, "");
    assert_eq!(
        broken_json.json(),
        json!({
            "file": broken.path(),
            "valid": false,
            "errors": [{ "file": broken.path(), "key": "limits", "message": "unknown key limit" }],
            "warnings": [],
        })
    );
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

/// A policy file's text with its manifest paths made absolute, so that a
/// copy elsewhere still finds them.
fn portable(relative: &str) -> String {
    std::fs::read_to_string(repo_path(relative))
        .expect("policy file")
        .replace(
            "manifest = \"../../examples/",
            &format!("manifest = \"{}/", repo_path("examples").display()),
        )
}

#[tokio::test]
async fn check_config_strict_refuses_a_file_cut_at_any_section() {
    for relative in [
        "examples/policy.toml",
        "examples/tickets.toml",
        POLICY,
        "tests/fixtures/hostile.toml",
    ] {
        let text = portable(relative);
        let whole = PolicyFile::new(&text);
        let run = toolgate(&["check-config", whole.path()], None).await;
        assert_eq!(run.code, Some(0), "{relative}: {run:?}");
        let whole_warnings = run.stderr.replace(whole.path(), "FILE");
        let cuts = section_cuts(&text);
        assert!(cuts.len() >= 8, "{relative}");
        for cut in cuts {
            let at = cut.lines().count();
            let file = PolicyFile::new(&cut);
            let strict = toolgate(&["check-config", "--strict", file.path()], None).await;
            assert_eq!(
                strict.code,
                Some(1),
                "{relative} cut after line {at}: {strict:?}"
            );
            assert_eq!(strict.stdout, "");
            // Without --strict: an error, or a warning the whole file does not have.
            let plain = toolgate(&["check-config", file.path()], None).await;
            let warnings = plain.stderr.replace(file.path(), "FILE");
            let new_warning = warnings
                .lines()
                .any(|line| line.starts_with("warning: ") && !whole_warnings.contains(line));
            assert!(
                plain.code == Some(1) || new_warning,
                "{relative} cut after line {at}: {plain:?}"
            );
        }
    }
}
