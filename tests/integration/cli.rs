//! The reviewer/operator command line, run as the built binary against a
//! real server on `127.0.0.1:0`: approvals, pins, resources, check-config,
//! output formats, exit codes and error lines.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read};
use std::process::{Child, ChildStderr, ChildStdout, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::policies::{
    self, DECIDE as POLICY, DECIDE_ALICE_CREDENTIAL, HOSTILE, TICKETS, policy_text, portable,
    repo_path, section_cuts,
};
use crate::support::spawn::{self, Serve, Spawned};
use crate::support::tokens::{ALICE, BOB, EXAMPLE_REVIEWER, HOST};
use crate::support::{Manifest, Policy, TestServer, authed, decide_request, pb, proposal, session};

/// Every test clock starts at `support::EPOCH`; pending requests live 300 s.
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

/// JSON printed by the CLI, read back through protobuf's JSON mapping
/// into the generated message `M` (named `full_name` in the descriptors).
fn parse_proto<M: prost::Message + Default>(text: &str, full_name: &str) -> M {
    let pool = prost_reflect::DescriptorPool::decode(pb::FILE_DESCRIPTOR_SET).expect("descriptors");
    let descriptor = pool.get_message_by_name(full_name).expect("message");
    let mut deserializer = serde_json::Deserializer::from_str(text);
    let dynamic = prost_reflect::DynamicMessage::deserialize(descriptor, &mut deserializer)
        .unwrap_or_else(|error| panic!("not {full_name} JSON ({error}): {text}"));
    dynamic.transcode_to::<M>().expect("transcode")
}

fn toolgate_command(args: &[String], token: Option<&str>) -> Command {
    let mut command = spawn::command();
    command.args(args);
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

/// Runs `toolgate ARGS` as [`toolgate`] does, which must exit with `code`.
async fn run_cli(args: &[&str], token: Option<&str>, code: i32) -> Run {
    let run = toolgate(args, token).await;
    assert_exit(&run, code);
    run
}

/// Runs `toolgate ARGS`, which must exit with `code` and a stderr that
/// starts with `prefix`.
async fn run_refused(args: &[&str], token: Option<&str>, code: i32, prefix: &str) -> Run {
    let run = run_cli(args, token, code).await;
    assert!(run.stderr.starts_with(prefix), "{run:?}");
    run
}

/// `toolgate ARGS --server ADDR` with alice's token, which must exit with `code`.
async fn as_alice(args: &[&str], addr: &str, code: i32) -> Run {
    let mut args = args.to_vec();
    args.extend(["--server", addr]);
    run_cli(&args, Some(ALICE), code).await
}

/// [`as_alice`] with `--output json` last.
async fn alice_json(args: &[&str], addr: &str, code: i32) -> Run {
    let mut args = args.to_vec();
    args.extend(["--server", addr, "--output", "json"]);
    run_cli(&args, Some(ALICE), code).await
}

/// The run exited with `code`.
fn assert_exit(run: &Run, code: i32) {
    assert_eq!(run.code, Some(code), "{run:?}");
}

/// `toolgate manifest fingerprint PATH FLAGS...`, which must exit with `code`.
async fn fingerprint(path: &str, flags: &[&str], code: i32) -> Run {
    let mut args = vec!["manifest", "fingerprint", path];
    args.extend_from_slice(flags);
    run_cli(&args, None, code).await
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
    let table = as_alice(&["approvals", "list"], &addr, 0).await;
    assert_eq!(
        table.rows(),
        vec![
            vec![
                "ID",
                "STATUS",
                "ACTOR",
                "TOOL",
                "WORKSPACE",
                "EXPIRES",
                "ARGUMENTS"
            ],
            vec![
                &id[..8],
                "pending",
                "payer",
                "payment_execute",
                "acme",
                "00:05:00",
                // Cut so that the line fits 100 columns.
                r#"{"account_number":"[redacted]","amo…"#,
            ],
        ]
    );
    assert!(
        table.stdout.lines().all(|line| line.chars().count() <= 100),
        "{}",
        table.stdout
    );
    assert_eq!(table.stderr, "");

    // Options before the sub-subcommand work too.
    let listed = run_cli(
        &[
            "approvals",
            "--output",
            "json",
            "--server",
            &url(&server),
            "list",
        ],
        Some(ALICE),
        0,
    )
    .await;
    // Protobuf's canonical JSON mapping: camelCase, enum names, RFC 3339
    // timestamps, default values (version 0, empty decidedBy) left out.
    assert_eq!(
        listed.json(),
        json!({"approvals": [{
            "approvalId": id,
            "fingerprint": answer.fingerprint,
            "actor": "payer",
            "sessionId": "s1",
            "workspace": "acme",
            "tool": "payment_execute",
            "callId": "c1",
            "argumentsJson": r#"{"account_number":"[redacted]","amount":15000}"#,
            "reason": "approval-threshold-exceeded",
            "status": "APPROVAL_STATUS_PENDING",
            "requestedAt": REQUESTED_AT,
            "expiresAt": PENDING_EXPIRES_AT,
        }]})
    );
    // Parsed back through the same mapping, it is the server's message.
    let parsed = parse_proto::<pb::ListApprovalsResponse>(
        &listed.stdout,
        "toolgate.v1.ListApprovalsResponse",
    );
    let stored = server.get_approval(ALICE, id).await.expect("get");
    assert_eq!(parsed.approvals, vec![stored]);

    let got = alice_json(&["approvals", "get", id], &addr, 0).await;
    assert_eq!(got.json(), listed.json()["approvals"][0]);

    let record = as_alice(&["approvals", "get", id], &addr, 0).await;
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
    assert_eq!(granted.json(), json!({}));
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
    assert_eq!(by_tool.json(), json!({}));
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
            .map(|approval| approval["approvalId"].as_str().expect("id").to_string())
            .collect();
        listed.sort();
        listed
    };

    let all = run_cli(
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
        0,
    )
    .await;
    assert_eq!(listed_ids(&all), ids);

    let limited = run_cli(
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
        0,
    )
    .await;
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

    let granted = as_alice(
        &["approvals", "grant", &payment_id, "--comment", "ok to pay"],
        &addr,
        0,
    )
    .await;
    let fields = granted.record();
    assert_eq!(fields["status"], "granted");
    assert_eq!(fields["decided_by"], "alice");
    assert_eq!(fields["decision_note"], "ok to pay");
    assert_eq!(fields["decided_at"], REQUESTED_AT);
    let stored = server.get_approval(ALICE, &payment_id).await.expect("get");
    assert_eq!(stored.status(), pb::ApprovalStatus::Granted);
    assert_eq!(stored.decided_by, "alice");
    assert_eq!(stored.decision_note, "ok to pay");

    let revoked = alice_json(
        &[
            "approvals",
            "revoke",
            &payment_id,
            "--reason",
            "changed my mind",
        ],
        &addr,
        0,
    )
    .await;
    let revoked_json = revoked.json();
    assert_eq!(revoked_json["status"], "APPROVAL_STATUS_REVOKED");
    assert_eq!(revoked_json["decisionNote"], "changed my mind");
    assert_eq!(revoked_json["approvalId"], payment_id.as_str());
    let stored = server.get_approval(ALICE, &payment_id).await.expect("get");
    assert_eq!(stored.status(), pb::ApprovalStatus::Revoked);

    let denied = alice_json(
        &["approvals", "deny", &wire_id, "--reason", "unknown payee"],
        &addr,
        0,
    )
    .await;
    assert_eq!(denied.json()["status"], "APPROVAL_STATUS_DENIED");
    assert_eq!(denied.json()["argumentsJson"], r#"{"to":"x"}"#);
    let stored = server.get_approval(ALICE, &wire_id).await.expect("get");
    assert_eq!(stored.status(), pb::ApprovalStatus::Denied);
    assert_eq!(stored.decision_note, "unknown payee");

    // A finished approval cannot be granted: the server's refusal, exit 1.
    let again = run_refused(
        &["approvals", "grant", &wire_id, "--server", &addr],
        Some(ALICE),
        1,
        "error: FailedPrecondition: ",
    )
    .await;
    assert_eq!(again.stdout, "");
    server.stop().await;
}

#[tokio::test]
async fn refusals_name_the_code_and_never_the_token() {
    let server = TestServer::start_file(POLICY).await;
    let addr = url(&server);
    let id = pending(&server, &payment("c1", 15000)).await.approval_id;

    // bob is a reviewer without the finance-approver role; token on the command line.
    let unauthorised = run_refused(
        &["approvals", "grant", &id, "--server", &addr, "--token", BOB],
        None,
        1,
        "error: PermissionDenied: ",
    )
    .await;
    assert_eq!(unauthorised.stderr.lines().count(), 1);
    assert!(!unauthorised.stderr.contains(BOB));
    assert_eq!(unauthorised.stdout, "");
    let stored = server.get_approval(ALICE, &id).await.expect("get");
    assert_eq!(stored.status(), pb::ApprovalStatus::Pending);

    run_refused(
        &["approvals", "list", "--server", &addr],
        None,
        1,
        "error: Unauthenticated: ",
    )
    .await;

    let unknown_token = "not-a-known-token";
    let unknown = run_cli(
        &["approvals", "get", &id, "--server", &addr],
        Some(unknown_token),
        1,
    )
    .await;
    assert!(unknown.stderr.starts_with("error: Unauthenticated: "));
    assert!(!unknown.stderr.contains(unknown_token));

    run_refused(
        &[
            "approvals",
            "get",
            "6f1e2a9c-57f5-4c8e-9a55-0d3a1c2b4e5f",
            "--server",
            &addr,
        ],
        Some(ALICE),
        1,
        "error: NotFound: ",
    )
    .await;

    // Usage errors exit 2.
    as_alice(&["approvals", "list", "--status", "maybe"], &addr, 2).await;
    run_refused(
        &["pins", "list", "--server", "ftp://x"],
        Some(ALICE),
        2,
        "error: --server",
    )
    .await;

    // --help never shows the token taken from the environment.
    let help = run_cli(&["approvals", "list", "--help"], Some(ALICE), 0).await;
    assert!(help.stdout.contains("TOOLGATE_TOKEN"));
    assert!(!help.stdout.contains(ALICE));
    server.stop().await;
}

/// A token goes over plain `http://` only to this machine: to any other
/// host (here `0.0.0.0`, which Linux routes to this machine, so that
/// nothing leaves it) the CLI refuses before connecting, unless told
/// `--insecure-plaintext` (a mesh encrypts the hop).
#[tokio::test]
async fn a_token_is_never_sent_in_plaintext_off_this_machine_unless_told() {
    let server = TestServer::start_file(POLICY).await;
    let port = server.addr.port();
    let id = pending(&server, &payment("c1", 15000)).await.approval_id;
    let off_machine = format!("http://0.0.0.0:{port}");
    let refused = run_refused(
        &["approvals", "grant", &id, "--server", &off_machine],
        Some(ALICE),
        2,
        &format!("error: --server {off_machine}: the token would cross the network in plaintext"),
    )
    .await;
    assert!(!refused.stderr.contains(ALICE));
    let stored = server.get_approval(ALICE, &id).await.expect("get");
    assert_eq!(stored.status(), pb::ApprovalStatus::Pending);
    // localhost is this machine.
    as_alice(&["approvals", "get", &id], &format!("localhost:{port}"), 0).await;
    as_alice(
        &["approvals", "grant", &id, "--insecure-plaintext"],
        &off_machine,
        0,
    )
    .await;
    let stored = server.get_approval(ALICE, &id).await.expect("get");
    assert_eq!(stored.status(), pb::ApprovalStatus::Granted);
    server.stop().await;
}

#[tokio::test]
async fn an_unreachable_server_is_a_connection_error_not_a_panic() {
    // A port that was bound and released: nothing listens on it any more.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    drop(listener);
    let run = as_alice(&["approvals", "list"], &addr, 2).await;
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
        Watcher::start_with(args).await
    }

    /// Starts `toolgate ARGS` as ALICE and waits for the stream to open.
    async fn start_with(args: Vec<String>) -> Watcher {
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

    async fn next_error_line(&mut self) -> String {
        let reader = self.stderr.take().expect("stderr reader");
        let (reader, line) = read_line(reader).await;
        self.stderr = Some(reader);
        line
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
    assert_eq!(requested["kind"], "APPROVAL_EVENT_KIND_REQUESTED");
    assert_eq!(requested.get("lagged"), None, "0 is left out");
    assert_eq!(
        requested["approval"]["approvalId"],
        answer.approval_id.as_str()
    );
    assert_eq!(requested["approval"]["status"], "APPROVAL_STATUS_PENDING");
    assert_eq!(requested["approval"]["tool"], "wire_transfer");
    assert_eq!(requested["approval"]["argumentsJson"], r#"{"to":"x"}"#);
    assert_eq!(requested["approval"]["reason"], "approval-required");

    server
        .grant(ALICE, &answer.approval_id)
        .await
        .expect("grant");
    let line = watcher.next_line().await;
    let granted: Value = serde_json::from_str(&line).expect("json line");
    assert_eq!(granted["kind"], "APPROVAL_EVENT_KIND_GRANTED");
    assert_eq!(granted["approval"]["status"], "APPROVAL_STATUS_GRANTED");
    assert_eq!(granted["approval"]["decidedBy"], "alice");
    assert_eq!(granted["approval"]["decisionNote"], "looks right");
    let event = parse_proto::<pb::ApprovalEvent>(&line, "toolgate.v1.ApprovalEvent");
    assert_eq!(event.kind(), pb::ApprovalEventKind::Granted);
    assert_eq!(
        event.approval.expect("approval"),
        server
            .get_approval(ALICE, &answer.approval_id)
            .await
            .expect("get")
    );
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
            "requested {} pending payer wire_transfer acme {{\"to\":\"x\"}}\n",
            &answer.approval_id[..8]
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
    copy["server"] = json!("docs-search-copy");
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), serde_json::to_vec(&copy).expect("json")).expect("write");
    let path = file.path().to_str().expect("utf-8 path");
    let fingerprint = Manifest::from_json(&std::fs::read(file.path()).expect("read"))
        .expect("valid manifest")
        .fingerprint()
        .to_hex();

    // The wrong expected fingerprint refuses the pin.
    run_refused(
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
        1,
        "error: FailedPrecondition: ",
    )
    .await;

    let added = as_alice(&["pins", "add", path, "--expect", &fingerprint], &addr, 0).await;
    let fields = added.record();
    assert_eq!(fields["server_id"], "docs-search-copy");
    assert_eq!(fields["fingerprint"], fingerprint);
    assert_eq!(fields["revision"], "2026-11-01");
    assert_eq!(fields["source"], "api");
    assert_eq!(fields["pinned_by"], "alice");
    assert_eq!(fields["pinned_at"], REQUESTED_AT);
    assert_eq!(fields["tool_count"], "2");

    let listed = alice_json(&["pins", "list"], &addr, 0).await;
    let mut pins: Vec<(String, String, String)> = listed.json()["pins"]
        .as_array()
        .expect("pins")
        .iter()
        .map(|pin| {
            (
                pin["serverId"].as_str().expect("id").to_string(),
                pin["source"].as_str().expect("source").to_string(),
                pin["pinnedBy"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect();
    pins.sort();
    assert_eq!(
        pins,
        vec![
            (
                "docs-search".into(),
                "PIN_SOURCE_POLICY".into(),
                String::new()
            ),
            (
                "docs-search-copy".into(),
                "PIN_SOURCE_API".into(),
                "alice".into()
            ),
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

    let removed = alice_json(&["pins", "remove", "docs-search-copy"], &addr, 0).await;
    assert_eq!(removed.json()["serverId"], "docs-search-copy");
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
        .map(|pin| pin["serverId"].as_str().expect("id"))
        .collect();
    assert_eq!(ids, vec!["docs-search"]);

    // A file that is not a manifest is refused before connecting (exit 2).
    let bad = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(bad.path(), br#"{"server": "x", "extra": 1}"#).expect("write");
    let invalid = as_alice(
        &["pins", "add", bad.path().to_str().expect("utf-8")],
        &addr,
        2,
    )
    .await;
    assert!(invalid.stderr.contains("extra"), "{invalid:?}");
    server.stop().await;
}

#[tokio::test]
async fn resource_get_shows_value_and_version() {
    let server = TestServer::start_file(TICKETS).await;
    let token = Some(EXAMPLE_REVIEWER);
    let addr = server.addr.to_string();

    let table = run_cli(&["resource", "get", "lamp", "--server", &addr], token, 0).await;
    assert_eq!(
        table.stdout,
        "name     lamp\nvalue    \"open\"\nversion  0\n"
    );

    let json_run = run_cli(
        &[
            "resource", "get", "outbox", "--server", &addr, "--output", "json",
        ],
        token,
        0,
    )
    .await;
    assert_eq!(
        json_run.json(),
        json!({"name": "outbox", "valueJson": "[]", "itemCount": "0"})
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
        json!({"name": "lamp", "valueJson": "\"open\""})
    );

    run_refused(
        &["resource", "get", "nothing", "--server", &addr],
        token,
        1,
        "error: NotFound: ",
    )
    .await;
    server.stop().await;
}

#[tokio::test]
async fn check_config_prints_what_a_policy_defines() {
    let path = repo_path("examples/policy.toml");
    let path = path.to_str().expect("utf-8 path");
    let revision = Policy::load(&repo_path("examples/policy.toml"))
        .expect("valid")
        .revision;

    let run = run_cli(&["check-config", path], None, 0).await;
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
    assert!(rows.contains(&vec!["store".to_string(), "sqlite".to_string()]));
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
    let json_run = run_cli(
        &[
            "check-config",
            fixture.to_str().expect("utf-8"),
            "--output",
            "json",
        ],
        None,
        0,
    )
    .await;
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
    let bad = run_cli(
        &["check-config", broken.path().to_str().expect("utf-8")],
        None,
        1,
    )
    .await;
    assert_eq!(bad.stdout, "");
    assert!(bad.stderr.starts_with("error: "), "{bad:?}");
    assert!(bad.stderr.contains(": tools.t.approval: "), "{bad:?}");
    assert_eq!(bad.stderr.lines().count(), 1);
}

// ----- manifest fingerprint / manifest assess (SPEC §7) ---------------------

/// The reference's worked example and its fingerprint.
const WORKED_EXAMPLE: &str = r#"{"server":"a","revision":"r1","tools":[{"tool":"read","description":"[[tool:elders/read]]","parameters":["target","mode"],"read_only":true,"scopes":["read","audit"]},{"tool":"paint","description":"Kleur kaart.","parameters":["target","color"],"read_only":false,"scopes":["paint"]}]}"#;
const WORKED_EXAMPLE_FINGERPRINT: &str =
    "57c402536871ebb9cb2093abe956200d0e8b124ccd75959aad08503ceba6a5d1";

/// The worked example's tools as an MCP `tools/list` JSON-RPC response.
const MCP_TOOLS_LIST: &str = r#"{"jsonrpc":"2.0","id":2,"result":{"tools":[
  {"name":"read","description":"[[tool:elders/read]]","inputSchema":{"type":"object","properties":{"target":{"type":"string"},"mode":{"type":"string"}}},"annotations":{"readOnlyHint":true}},
  {"name":"paint","title":"Paint","description":"Kleur kaart.","inputSchema":{"type":"object","properties":{"target":{"type":"string"},"color":{"type":"string"}}}}
]}}"#;

/// The same tools in the reference form, with the MCP fields kept: what the
/// MCP result must hash as.
const MCP_AS_REFERENCE: &str = r#"{"server":"a","revision":"r1","tools":[
  {"tool":"read","description":"[[tool:elders/read]]","parameters":["mode","target"],"read_only":true,"scopes":[],"inputSchema":{"type":"object","properties":{"target":{"type":"string"},"mode":{"type":"string"}}},"annotations":{"readOnlyHint":true}},
  {"tool":"paint","title":"Paint","description":"Kleur kaart.","parameters":["color","target"],"read_only":false,"scopes":[],"inputSchema":{"type":"object","properties":{"target":{"type":"string"},"color":{"type":"string"}}}}
]}"#;

fn temp_json(text: &str) -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), text).expect("write");
    file
}

fn path_of(file: &tempfile::NamedTempFile) -> &str {
    file.path().to_str().expect("utf-8 path")
}

#[tokio::test]
async fn manifest_fingerprint_of_the_worked_example_is_the_references() {
    let file = temp_json(WORKED_EXAMPLE);
    let run = fingerprint(path_of(&file), &[], 0).await;
    assert_eq!(run.stdout, format!("{WORKED_EXAMPLE_FINGERPRINT}\n"));
    assert_eq!(
        run.stderr,
        format!(
            "read {} as a reference manifest: server \"a\", revision \"r1\", 2 tools\n",
            path_of(&file)
        )
    );
}

#[tokio::test]
async fn manifest_fingerprint_reads_an_mcp_tools_list_result() {
    let listed = temp_json(MCP_TOOLS_LIST);
    let reference = temp_json(MCP_AS_REFERENCE);
    let from_mcp = fingerprint(path_of(&listed), &["--server", "a", "--revision", "r1"], 0).await;
    assert_eq!(
        from_mcp.stderr,
        format!(
            "read {} as an MCP tools/list result: server \"a\", revision \"r1\", 2 tools\n",
            path_of(&listed)
        )
    );
    let from_reference = fingerprint(path_of(&reference), &[], 0).await;
    assert_eq!(from_mcp.stdout, from_reference.stdout);
    // The MCP fields are hashed: not the five-field worked example.
    assert_ne!(from_mcp.stdout.trim(), WORKED_EXAMPLE_FINGERPRINT);

    // An MCP result names no server: the flags are required ...
    let missing = fingerprint(path_of(&listed), &[], 1).await;
    assert_eq!(missing.stdout, "");
    assert_eq!(
        missing.stderr,
        format!(
            "error: {} is an MCP tools/list result, which names no server or revision: pass --server ID --revision REV\n",
            path_of(&listed)
        )
    );
    // ... and a reference manifest, which names its own, refuses them.
    let worked = temp_json(WORKED_EXAMPLE);
    let extra = fingerprint(path_of(&worked), &["--server", "b", "--revision", "r2"], 1).await;
    assert!(
        extra
            .stderr
            .contains("is a reference manifest, which names its own server"),
        "{extra:?}"
    );
}

#[tokio::test]
async fn manifest_fingerprint_errors_name_the_field() {
    for (text, expected) in [
        (
            r#"{"server_id":"a","revision":"r1","tools":[]}"#,
            "server_id: unknown field; expected one of server, revision, tools",
        ),
        (
            r#"{"server":"a","revision":"r1","tools":[{"tool":"t","description":"","parameters":[],"scopes":[]}]}"#,
            "tools[0].read_only: is required",
        ),
        (
            r#"{"server":"a","revision":"r1","tools":[{"tool":7,"description":"","parameters":[],"read_only":true,"scopes":[]}]}"#,
            "tools[0].tool: must be a string, got number",
        ),
    ] {
        let file = temp_json(text);
        let run = fingerprint(path_of(&file), &[], 1).await;
        assert_eq!(run.stdout, "");
        assert_eq!(
            run.stderr,
            format!("error: {}: {expected}\n", path_of(&file)),
            "{text}"
        );
    }
}

#[tokio::test]
async fn manifest_fingerprint_of_an_unsafe_manifest_warns() {
    let file = temp_json(
        r#"{"server":"a","revision":"r1","tools":[
          {"tool":"zoek in één","description":"","parameters":[],"read_only":true,"scopes":[""]},
          {"tool":"zoek in één","description":"other","parameters":[],"read_only":true,"scopes":[]}]}"#,
    );
    let run = fingerprint(path_of(&file), &[], 0).await;
    assert_eq!(run.stdout.trim().len(), 64, "{run:?}");
    assert!(
        run.stderr.ends_with(
            "warning: unsafe manifest: 2 tools are named \"zoek in één\"; tool names must be unique; AssessManifest never accepts it and PinManifest refuses it\n"
        ),
        "{run:?}"
    );
}

#[tokio::test]
async fn manifest_assess_sends_the_readme_example_to_the_default_policy() {
    let server =
        TestServer::start_with(Policy::embedded_default().expect("embedded default")).await;
    let addr = url(&server);
    let example = repo_path("examples/manifests/docs-search.json");
    let example = example.to_str().expect("utf-8 path");

    // Before any assessment the default's search_docs says "never assessed".
    let search = proposal(
        "d1",
        "support-agent",
        "search_docs",
        0,
        r#"{"query":"refunds"}"#,
    );
    let agent = session("support-agent", "s1", "w");
    let before = server.decide_ok("", &agent, &search).await;
    assert_eq!(before.reason, "manifest-unverified");
    assert!(before.message.contains("was never assessed"), "{before:?}");

    let matched = run_cli(&["manifest", "assess", example, "--server", &addr], None, 0).await;
    let fields = matched.record();
    assert_eq!(fields["form"], "reference manifest");
    assert_eq!(fields["accepted"], "true");
    assert_eq!(fields["reason"], "matched");
    assert_eq!(fields["fingerprint"], fields["pinned_fingerprint"]);
    let after = server
        .decide_ok(
            "",
            &agent,
            &proposal(
                "d2",
                "support-agent",
                "search_docs",
                0,
                r#"{"query":"refunds"}"#,
            ),
        )
        .await;
    assert_eq!(after.reason, "allowed", "{after:?}");

    // A changed copy: exit 3, CHANGED with the diff, JSON on request.
    let mut changed: Value =
        serde_json::from_slice(&std::fs::read(example).expect("read")).expect("json");
    changed["tools"][1]["scopes"]
        .as_array_mut()
        .expect("scopes")
        .push(json!("docs:write"));
    let changed_file = temp_json(&changed.to_string());
    let answer = run_cli(
        &[
            "manifest",
            "assess",
            path_of(&changed_file),
            "--server",
            &addr,
            "--output",
            "json",
        ],
        None,
        3,
    )
    .await;
    let answer = answer.json();
    assert_eq!(answer["form"], "reference");
    assert_eq!(answer["accepted"], false);
    assert_eq!(answer["reason"], "changed");
    assert_eq!(answer["diff_available"], false);
    assert_eq!(answer["diffs"], json!([]));
    let refused = server
        .decide_ok(
            "",
            &agent,
            &proposal(
                "d3",
                "support-agent",
                "search_docs",
                0,
                r#"{"query":"refunds"}"#,
            ),
        )
        .await;
    assert_eq!(refused.reason, "manifest-unverified");
    assert!(
        refused.message.contains("differed from its pin"),
        "{refused:?}"
    );
    server.stop().await;
}

#[tokio::test]
async fn manifest_assess_of_the_worked_example_and_an_mcp_result() {
    let server = TestServer::start_file(POLICY).await;
    let addr = url(&server);
    let worked = temp_json(WORKED_EXAMPLE);
    let unpinned = run_cli(
        &["manifest", "assess", path_of(&worked), "--server", &addr],
        Some(HOST),
        3,
    )
    .await;
    let fields = unpinned.record();
    assert_eq!(fields["fingerprint"], WORKED_EXAMPLE_FINGERPRINT);
    assert_eq!(fields["reason"], "unpinned");
    assert_eq!(fields["pinned_fingerprint"], "-");

    // An MCP result: its server id is --server-id, since --server is the address.
    let listed = temp_json(MCP_TOOLS_LIST);
    let reference = temp_json(MCP_AS_REFERENCE);
    let expected = toolgate(&["manifest", "fingerprint", path_of(&reference)], None).await;
    let mcp = run_cli(
        &[
            "manifest",
            "assess",
            path_of(&listed),
            "--server-id",
            "a",
            "--revision",
            "r1",
            "--server",
            &addr,
        ],
        Some(HOST),
        3,
    )
    .await;
    assert_eq!(mcp.record()["form"], "MCP tools/list result");
    assert_eq!(mcp.record()["fingerprint"], expected.stdout.trim());
    assert!(
        mcp.stderr.starts_with(&format!(
            "read {} as an MCP tools/list result",
            path_of(&listed)
        )),
        "{mcp:?}"
    );

    // Pinned by alice, the duplicate-name copy is unsafe: a diff line says why.
    let pinned = as_alice(&["pins", "add", path_of(&worked)], &addr, 0).await;
    assert_eq!(pinned.record()["fingerprint"], WORKED_EXAMPLE_FINGERPRINT);
    let mut duplicate: Value = serde_json::from_str(WORKED_EXAMPLE).expect("json");
    let first = duplicate["tools"][0].clone();
    duplicate["tools"]
        .as_array_mut()
        .expect("tools")
        .push(first);
    let duplicate_file = temp_json(&duplicate.to_string());
    let answer = run_cli(
        &[
            "manifest",
            "assess",
            path_of(&duplicate_file),
            "--server",
            &addr,
        ],
        Some(HOST),
        3,
    )
    .await;
    assert_eq!(answer.record()["accepted"], "false");
    assert!(
        answer.stdout.contains(
            "diff                read unsafe: 2 tools are named \"read\"; tool names must be unique (duplicate-tool-name)"
        ),
        "{answer:?}"
    );
    server.stop().await;
}

/// A pending request for tool `t` with these arguments; its approval id.
async fn roomy_pending(server: &TestServer, call_id: &str, arguments: &str) -> String {
    let answer = server
        .decide_ok(
            HOST,
            &session("a", "s1", "w"),
            &proposal(call_id, "a", "t", 0, arguments),
        )
        .await;
    assert_eq!(answer.outcome(), pb::Outcome::RequireApproval, "{answer:?}");
    answer.approval_id
}

fn fits_100_columns(text: &str) -> bool {
    text.lines().all(|line| line.chars().count() <= 100)
}

#[tokio::test]
async fn list_and_watch_cut_long_arguments_and_hide_sensitive_values() {
    let server = TestServer::start_file(POLICY).await;
    let mut watcher = Watcher::start(&server, "table").await;
    let memo = "m".repeat(140);
    let arguments =
        format!(r#"{{"amount": 20000, "account_number": "12345678", "memo": "{memo}"}}"#);
    let answer = pending(
        &server,
        &proposal("c1", "payer", "payment_execute", 0, &arguments),
    )
    .await;

    let line = watcher.next_line().await;
    let expected_start = format!(
        r#"requested {} pending payer payment_execute acme {{"account_number":"[redacted]","amount":20000"#,
        &answer.approval_id[..8]
    );
    assert!(line.starts_with(&expected_start), "{line:?}");
    assert!(line.ends_with("…\n"), "{line:?}");
    assert_eq!(line.trim_end().chars().count(), 100, "{line:?}");
    assert!(!line.contains("12345678"), "{line:?}");

    let addr = url(&server);
    let table = as_alice(&["approvals", "list"], &addr, 0).await;
    assert!(fits_100_columns(&table.stdout), "{}", table.stdout);
    let row = table.stdout.lines().nth(1).expect("one row");
    assert!(row.ends_with('…'), "{row:?}");
    assert!(row.contains(r#"{"account_number":"[redacted]""#), "{row:?}");
    assert!(!table.stdout.contains("12345678"));

    let listed = toolgate(
        &["approvals", "list", "--server", &addr, "--output", "json"],
        Some(ALICE),
    )
    .await;
    let arguments: Value = serde_json::from_str(
        listed.json()["approvals"][0]["argumentsJson"]
            .as_str()
            .expect("argumentsJson"),
    )
    .expect("arguments are JSON");
    assert_eq!(
        arguments,
        json!({"account_number": "[redacted]", "amount": 20000, "memo": memo})
    );
    drop(watcher);
    server.stop().await;
}

/// A resource page larger than tonic's default 4 MiB answer (a server
/// whose `max_message_bytes` allows one) is read whole.
#[tokio::test]
async fn a_resource_page_over_four_mib_is_read_whole() {
    let text = policies::policy_with(
        "append",
        &[(
            "server.max_message_bytes",
            policies::integer(8 * 1024 * 1024),
        )],
    );
    let server = TestServer::start(&text).await;
    let addr = url(&server);
    let blob = "x".repeat(240 * 1024);
    for index in 0..20u64 {
        let arguments = format!(r#"{{"text":"{index}{blob}"}}"#);
        let posted = server
            .dispatch_agent(&proposal(
                &format!("p{index}"),
                "agent",
                "post",
                index,
                &arguments,
            ))
            .await
            .expect("Dispatch answers");
        assert_eq!(posted.status(), pb::DispatchStatus::Ok, "{posted:?}");
    }
    let got = run_cli(
        &[
            "resource", "get", "queue", "--server", &addr, "--output", "json",
        ],
        Some(ALICE),
        0,
    )
    .await;
    assert!(
        got.stdout.len() > 4 * 1024 * 1024,
        "{} bytes",
        got.stdout.len()
    );
    assert!(got.stdout.contains(&format!("19{blob}")));
    server.stop().await;
}

#[tokio::test]
async fn approval_ids_take_a_unique_prefix_and_refuse_others() {
    let server = TestServer::start(&policy_text("roomy")).await;
    let addr = url(&server);
    // 17 ids over 16 possible first digits: two of them share one.
    let mut ids = Vec::new();
    for index in 0..17 {
        ids.push(
            roomy_pending(
                &server,
                &format!("c{index}"),
                &format!(r#"{{"n":{index}}}"#),
            )
            .await,
        );
    }
    let shared_first = ids
        .iter()
        .map(|id| &id[..1])
        .find(|first| ids.iter().filter(|id| id.starts_with(*first)).count() > 1)
        .expect("pigeonhole");
    let ambiguous = run_refused(
        &["approvals", "get", shared_first, "--server", &addr],
        Some(ALICE),
        2,
        &format!("error: approval id prefix \"{shared_first}\" is ambiguous: "),
    )
    .await;
    assert_eq!(ambiguous.stdout, "");

    // 17 ids cannot start with all 256 two-digit prefixes.
    let unused = (0..256)
        .map(|value| format!("{value:02x}"))
        .find(|prefix| !ids.iter().any(|id| id.starts_with(prefix.as_str())))
        .expect("an unused prefix");
    let unknown = as_alice(&["approvals", "get", &unused], &addr, 1).await;
    assert_eq!(
        unknown.stderr,
        format!(
            "error: no approval id starts with \"{unused}\" (among the approvals this reviewer can see)\n"
        )
    );
    // A grant, deny or revoke names at least the table's 8 characters.
    for command in ["grant", "deny", "revoke"] {
        let short = as_alice(&["approvals", command, &ids[0][..7]], &addr, 2).await;
        assert!(
            short
                .stderr
                .contains("names at least the first 8 characters"),
            "{short:?}"
        );
    }
    let statuses: Vec<pb::ApprovalStatus> = (server.all_approvals(ALICE).await.iter())
        .map(pb::Approval::status)
        .collect();
    assert_eq!(
        statuses,
        [pb::ApprovalStatus::Pending; 17],
        "nothing was decided"
    );

    let invalid = as_alice(&["approvals", "get", "xyz"], &addr, 2).await;
    assert!(
        invalid
            .stderr
            .contains("expected a UUID or the start of one"),
        "{invalid:?}"
    );

    // The short ids the table shows are unique and accepted, in any case.
    let table = toolgate(&["approvals", "list", "--server", &addr], Some(ALICE)).await;
    let shown: Vec<String> = table.rows()[1..].iter().map(|row| row[0].clone()).collect();
    assert_eq!(shown.len(), 17);
    for short in &shown {
        assert_eq!(
            ids.iter()
                .filter(|id| id.starts_with(short.as_str()))
                .count(),
            1,
            "{short}"
        );
    }
    let target = &ids[0];
    let short = shown
        .iter()
        .find(|short| target.starts_with(short.as_str()))
        .expect("shown");
    let got = alice_json(&["approvals", "get", &short.to_uppercase()], &addr, 0).await;
    assert_eq!(got.json()["approvalId"], target.as_str());
    let granted = as_alice(&["approvals", "grant", short], &addr, 0).await;
    assert_eq!(granted.record()["approval_id"], *target);
    assert_eq!(
        server
            .get_approval(ALICE, target)
            .await
            .expect("get")
            .status(),
        pb::ApprovalStatus::Granted
    );
    let revoked = toolgate(
        &["approvals", "revoke", short, "--server", &addr],
        Some(ALICE),
    )
    .await;
    assert_eq!(revoked.record()["status"], "revoked", "{revoked:?}");
    let other = &ids[1];
    let denied = toolgate(
        &["approvals", "deny", &other[..12], "--server", &addr],
        Some(ALICE),
    )
    .await;
    assert_eq!(denied.record()["status"], "denied", "{denied:?}");
    server.stop().await;
}

#[tokio::test]
async fn resource_list_shows_every_resource() {
    let server = TestServer::start_file(TICKETS).await;
    let token = Some(EXAMPLE_REVIEWER);
    let addr = server.addr.to_string();
    let table = run_cli(&["resource", "list", "--server", &addr], token, 0).await;
    assert_eq!(
        table.rows(),
        [
            vec!["NAME", "VERSION", "VALUE"],
            vec!["lamp", "0", "\"open\""],
            vec!["outbox", "0", "[]"],
            vec!["sensor", "0", "\"open\""],
        ]
        .map(|row| row.into_iter().map(str::to_string).collect::<Vec<_>>())
        .to_vec()
    );
    let listed = run_cli(
        &["resource", "list", "--server", &addr, "--output", "json"],
        token,
        0,
    )
    .await;
    let parsed = parse_proto::<pb::ListResourcesResponse>(
        &listed.stdout,
        "toolgate.v1.ListResourcesResponse",
    );
    let mut expected = Vec::new();
    for name in ["lamp", "outbox", "sensor"] {
        expected.push(server.resource(EXAMPLE_REVIEWER, name).await);
    }
    assert_eq!(parsed.resources, expected);
    server.stop().await;
}

#[tokio::test]
async fn approvals_list_pages_by_bytes_through_500_large_requests() {
    let server = TestServer::start(&policy_text("roomy")).await;
    // As large as arguments may be (256 KiB in all).
    let blob = "b".repeat(256 * 1024 - 64);
    let mut ids = Vec::new();
    for index in 0..500 {
        let arguments = format!(r#"{{"blob":"{blob}","n":{index},"secret":"s3cr3t"}}"#);
        ids.push(roomy_pending(&server, &format!("c{index}"), &arguments).await);
    }
    ids.sort();

    // One page asked for 500 holds far fewer: it is bounded in bytes, well
    // under the 4 MiB a client accepts, and says where to go on.
    let page = server
        .approvals()
        .list_approvals(authed(
            pb::ListApprovalsRequest {
                page_size: 500,
                ..Default::default()
            },
            ALICE,
        ))
        .await
        .expect("first page")
        .into_inner();
    let encoded = prost::Message::encoded_len(&page);
    assert!(encoded <= 3 * 1024 * 1024, "page of {encoded} bytes");
    assert!(!page.approvals.is_empty() && page.approvals.len() < 500);
    assert!(!page.next_page_token.is_empty());
    let mut all: Vec<String> = server
        .all_approvals(ALICE)
        .await
        .into_iter()
        .map(|approval| approval.approval_id)
        .collect();
    all.sort();
    assert_eq!(all, ids, "every approval exactly once across the pages");

    let table = toolgate(
        &["approvals", "list", "--server", &url(&server)],
        Some(ALICE),
    )
    .await;
    assert_eq!(table.code, Some(0), "{:?}", table.stderr);
    assert_eq!(table.stdout.lines().count(), 501);
    assert!(fits_100_columns(&table.stdout));
    assert!(!table.stdout.contains("s3cr3t"));
    server.stop().await;
}

/// `toolgate serve` on `decide.toml` as a child process on `listen`.
fn serve(listen: &str) -> Spawned {
    Serve::new(&portable(POLICY)).listen(listen).start()
}

/// A wire transfer decided on the server at `addr`; its approval id.
async fn request_on(addr: &str) -> String {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .expect("endpoint")
        .connect()
        .await
        .expect("connect");
    let request = decide_request(
        session("payer", "s1", "acme"),
        proposal("w1", "payer", "wire_transfer", 0, r#"{"to":"x"}"#),
    );
    let answer = pb::policy_decision_point_client::PolicyDecisionPointClient::new(channel)
        .decide(authed(request, HOST))
        .await
        .expect("decide")
        .into_inner();
    assert_eq!(answer.outcome(), pb::Outcome::RequireApproval);
    answer.approval_id
}

#[tokio::test]
async fn watch_follow_reconnects_after_the_server_restarts() {
    let mut first = serve("127.0.0.1:0");
    let addr = first.addr.to_string();
    let args: Vec<String> = ["approvals", "watch", "--follow", "--server", &addr]
        .iter()
        .map(|arg| arg.to_string())
        .collect();
    let mut watcher = Watcher::start_with(args).await;
    let before = request_on(&addr).await;
    assert!(
        watcher
            .next_line()
            .await
            .starts_with(&format!("requested {} ", &before[..8]))
    );

    first.kill();
    let ended = watcher.next_error_line().await;
    assert!(ended.starts_with("toolgate: watch ended: "), "{ended:?}");
    assert!(ended.contains("; reconnecting in 200 ms"), "{ended:?}");

    // The same port again; the watcher finds it on its own.
    let _second = serve(&addr);
    loop {
        let line = watcher.next_error_line().await;
        if line.starts_with("toolgate: watching approvals on ") {
            break;
        }
        assert!(line.contains("reconnecting in "), "{line:?}");
    }
    let after = request_on(&addr).await;
    assert!(
        watcher
            .next_line()
            .await
            .starts_with(&format!("requested {} ", &after[..8]))
    );
}

#[tokio::test]
async fn watch_follow_exits_when_a_reload_revokes_its_credential() {
    let server = TestServer::start_file(POLICY).await;
    let args: Vec<String> = ["approvals", "watch", "--follow", "--server"]
        .iter()
        .map(|arg| arg.to_string())
        .chain([url(&server)])
        .collect();
    let watcher = Watcher::start_with(args).await;
    let text = portable(POLICY);
    assert!(text.contains(DECIDE_ALICE_CREDENTIAL));
    let policy = policies::parse(&text.replace(DECIDE_ALICE_CREDENTIAL, ""));
    server.engine.replace_policy(policy);
    let (rest_out, rest_err, code) = watcher.finish().await;
    assert_eq!(rest_out, "");
    assert_eq!(
        rest_err,
        "error: Unauthenticated: the credential of this watch was revoked by a policy reload\n"
    );
    assert_eq!(code, Some(1), "a refusal is not retried");
    server.stop().await;
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
            "credentials[0].sha256: a credential needs a token digest (sha256), a client \
             certificate identity (client_identity), or both",
        ),
        (
            "[tools.x]\nmode = \"read\"\nroles = [\"r\"]\ninput_schema = { type = \"object\", properties = { n = { type = \"integer\", minimum = \"1\" } } }\n",
            "tools.x.input_schema: invalid JSON Schema at /properties/n/minimum: \"1\" is not of type \"number\"",
        ),
    ];
    for (text, expected) in cases {
        let file = PolicyFile::new(&format!("{text}\n{}", policy_text("one_tool")));
        let run = run_cli(&["check-config", file.path()], None, 1).await;
        assert_eq!(run.stdout, "");
        assert_eq!(run.stderr, format!("error: {}: {expected}\n", file.path()));
    }
    // A store `serve` would refuse, named without its password.
    let stored = |store: &str| {
        PolicyFile::new(&policy_text("one_tool").replace(
            "open_host_api = true",
            &format!("open_host_api = true\nstore = {store:?}"),
        ))
    };
    let mistyped = stored("mysql://someone:pw9secret@db/toolgate");
    let run = run_cli(&["check-config", mistyped.path()], None, 1).await;
    assert_eq!(
        run.stderr,
        format!(
            "error: {}: server.store: expected `sqlite`, `memory` or a postgres://… URL, \
             got \"mysql://someone@db/toolgate\"\n",
            mistyped.path()
        )
    );
    let shared = stored("postgres://someone:pw9secret@db.internal/toolgate?schema=agents");
    let run = run_cli(&["check-config", shared.path()], None, 0).await;
    assert!(
        run.rows().contains(
            &[
                "store",
                "postgres://someone@db.internal:5432/toolgate?schema=agents"
            ]
            .map(str::to_string)
            .to_vec()
        ),
        "{}",
        run.stdout
    );
    assert!(!run.stdout.contains("pw9secret"), "{}", run.stdout);
    let closed = PolicyFile::new(&policy_text("one_tool").replace("open_host_api = true", ""));
    let run = run_cli(&["check-config", closed.path()], None, 1).await;
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
    let run = run_cli(&["check-config", empty.path()], None, 1).await;
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
    let run = run_cli(&["check-config", "/nope.toml"], None, 1).await;
    assert_eq!(run.stdout, "");
    assert_eq!(
        run.stderr,
        "error: cannot read /nope.toml: No such file or directory (os error 2)\n"
    );
    let json_run = run_cli(&["check-config", "/nope.toml", "--output", "json"], None, 1).await;
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
        "{}\n[tools.pay]\nmode = \"execute\"\nroles = [\"payer\"]\napproval = \"always\"\napprovers = [\"finance\"]\n\n[reviewers.bob]\nroles = [\"support\"]\nworkspaces = [\"*\"]\n",
        policy_text("one_tool")
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

    let run = run_cli(&["check-config", path], None, 0).await;
    assert_eq!(run.stderr, lines("warning"));
    assert!(
        run.stdout.starts_with(&format!("policy {path}: valid\n")),
        "{run:?}"
    );

    let strict = run_cli(&["check-config", "--strict", path], None, 1).await;
    assert_eq!(strict.stdout, "");
    assert_eq!(strict.stderr, lines("error"));

    let entries: Vec<Value> = warnings
        .iter()
        .map(|(key, message)| json!({ "file": path, "key": key, "message": message }))
        .collect();
    let json_run = run_cli(&["check-config", path, "--output", "json"], None, 0).await;
    assert_eq!(json_run.stderr, "");
    let summary = json_run.json();
    assert_eq!(summary["valid"], true);
    assert_eq!(summary["errors"], json!([]));
    assert_eq!(summary["warnings"], Value::Array(entries.clone()));
    assert_eq!(summary["open_host_api"], true);

    let strict_json = run_cli(
        &["check-config", path, "--strict", "--output", "json"],
        None,
        1,
    )
    .await;
    assert_eq!(
        strict_json.json(),
        json!({ "file": path, "valid": false, "errors": entries, "warnings": [] })
    );

    let broken = PolicyFile::new("[limits]\nlimit = 5\n");
    let broken_json = run_cli(
        &["check-config", broken.path(), "--output", "json"],
        None,
        1,
    )
    .await;
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

/// A policy `serve` starts only with mTLS flags is valid, with a warning
/// that says so (serve refuses it without them).
#[tokio::test]
async fn check_config_warns_that_client_identities_need_mtls_flags() {
    let text = format!(
        "{}\n[reviewers.rita]\nroles = [\"r\"]\nworkspaces = [\"*\"]\n\n[[credentials]]\nkind = \"reviewer\"\nidentity = \"rita\"\nclient_identity = \"spiffe://example.org/rita\"\n",
        policy_text("one_tool")
    );
    let file = PolicyFile::new(&text);
    let path = file.path();
    let run = run_cli(&["check-config", path], None, 0).await;
    assert_eq!(
        run.stderr,
        format!(
            "warning: {path}: credentials: credentials with client_identity need mTLS, which \
             the policy does not serve: serve starts it only with --tls-cert, --tls-key and \
             --tls-client-ca\n"
        )
    );
    // Not a dangling name: --strict leaves it a warning.
    let strict = run_cli(&["check-config", "--strict", path], None, 0).await;
    assert_eq!(strict.stderr, run.stderr);
    let served = spawn::command()
        .args(["serve", "--listen", "127.0.0.1:0", "--config", path])
        .output()
        .expect("run toolgate");
    assert_eq!(served.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&served.stderr);
    assert!(
        stderr.contains("credentials with client_identity need mTLS"),
        "{stderr}"
    );
}

#[tokio::test]
async fn check_config_strict_refuses_a_file_cut_at_any_section() {
    for relative in [
        "examples/policy.toml",
        "examples/tickets.toml",
        POLICY,
        HOSTILE,
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

/// Packaging basics (issue 18): `--version` names the commit, completions
/// for the three shells, and a man page that covers every command.
#[tokio::test]
async fn version_completions_and_man_page() {
    let version = run_cli(&["--version"], None, 0).await;
    let expected = format!("toolgate {} (commit ", env!("CARGO_PKG_VERSION"));
    assert!(version.stdout.starts_with(&expected), "{version:?}");
    let commit = version
        .stdout
        .trim()
        .trim_start_matches(&expected)
        .trim_end_matches(')');
    assert!(
        commit == "unknown"
            || (commit.len() == 12 && commit.chars().all(|c| c.is_ascii_hexdigit())),
        "{commit:?}"
    );
    for (shell, marker) in [
        ("bash", "complete -F _toolgate"),
        ("zsh", "#compdef toolgate"),
        ("fish", "complete -c toolgate"),
    ] {
        let script = run_cli(&["completions", shell], None, 0).await;
        assert!(script.stdout.contains(marker), "{shell}: {}", script.stdout);
        assert!(script.stdout.contains("check-config"), "{shell}");
    }
    run_refused(&["completions", "tcsh"], None, 2, "error: invalid value").await;
    let man = run_cli(&["man"], None, 0).await;
    assert!(
        man.stdout.starts_with(".ie \\n(.g .ds Aq") || man.stdout.contains(".TH toolgate 1"),
        "{}",
        &man.stdout[..200.min(man.stdout.len())]
    );
    for section in [
        "TOOLGATE SERVE",
        "TOOLGATE APPROVALS GRANT",
        "TOOLGATE STORE BACKUP",
        "TOOLGATE COMPLETIONS",
        "EXIT STATUS",
        "SIGHUP",
    ] {
        assert!(man.stdout.contains(section), "man page lacks {section}");
    }
    assert!(
        man.stdout.contains("\\-\\-metrics\\-listen"),
        "serve's options are in the man page"
    );
}

/// The LICENSE file is the full text of the license `Cargo.toml` names.
#[test]
fn the_license_file_matches_the_manifest() {
    let manifest = std::fs::read_to_string(repo_path("Cargo.toml")).expect("Cargo.toml");
    assert!(manifest.contains("\nlicense = \"Apache-2.0\"\n"));
    let license = std::fs::read_to_string(repo_path("LICENSE")).expect("LICENSE");
    assert!(
        license.contains("Apache License\n                           Version 2.0, January 2004")
    );
    assert!(license.contains("END OF TERMS AND CONDITIONS"));
    assert!(license.contains("APPENDIX: How to apply the Apache License to your work."));
}

/// A watch that never opened (a peer that hangs up, a server answering
/// UNAVAILABLE) is an error, not an orderly end: exit non-zero, so a
/// script never takes "nothing watched" for "watched until the server
/// stopped".
#[tokio::test]
async fn a_watch_that_never_opened_is_an_error() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("addr").to_string();
    std::thread::spawn(move || {
        for connection in listener.incoming() {
            drop(connection);
        }
    });
    let run = toolgate(&["approvals", "watch", "--server", &addr], Some(ALICE)).await;
    assert_ne!(run.code, Some(0), "{run:?}");
    assert!(run.stderr.starts_with("error: "), "{run:?}");
    assert!(!run.stderr.contains("watch ended"), "{run:?}");
}
