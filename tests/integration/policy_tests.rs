//! `toolgate eval` and `toolgate test`, run as the built binary: the
//! shipped test files of both example policies pass, a failing one exits 1
//! and prints what differed, a malformed one exits 2 naming the key, and
//! `eval` answers what a real server on the same policy answers.

use std::process::Output;

use serde_json::Value;

use crate::support::policies::{DECIDE, TICKETS, repo_path};
use crate::support::spawn;
use crate::support::tokens::HOST;
use crate::support::{TestServer, pb, proposal, session};

/// `toolgate ARGS` run from the repository root; exit code, stdout, stderr.
fn toolgate(args: &[&str]) -> (Option<i32>, String, String) {
    let Output {
        status,
        stdout,
        stderr,
    } = spawn::command()
        .current_dir(repo_path(""))
        .args(args)
        .output()
        .expect("run toolgate");
    (
        status.code(),
        String::from_utf8(stdout).expect("utf-8 stdout"),
        String::from_utf8(stderr).expect("utf-8 stderr"),
    )
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or_else(|error| panic!("not JSON ({error}): {text}"))
}

/// A proposal file in a temporary directory (kept alive by the caller).
fn proposal_file(text: &str) -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().expect("temporary file");
    std::fs::write(file.path(), text).expect("write proposal");
    file
}

const LAMP_DONE: &str = "tests/fixtures/policy_tests/lamp-done.json";

#[test]
fn the_shipped_tests_of_both_example_policies_pass() {
    for (policy, tests, cases) in [
        ("examples/policy.toml", "examples/policy.test.toml", 14),
        ("examples/tickets.toml", "examples/tickets.test.toml", 8),
    ] {
        let (code, stdout, stderr) = toolgate(&["test", "--config", policy, tests]);
        assert_eq!(code, Some(0), "{tests}: {stdout}{stderr}");
        assert!(
            stdout.ends_with(&format!("\n{cases} cases: {cases} passed, 0 failed\n")),
            "{stdout}"
        );
        assert_eq!(
            stdout
                .lines()
                .filter(|line| line.starts_with("ok    "))
                .count(),
            cases,
            "{stdout}"
        );
    }
}

#[test]
fn a_failing_case_exits_1_and_says_what_differed() {
    let (code, stdout, _) = toolgate(&[
        "test",
        "--config",
        TICKETS,
        "tests/fixtures/policy_tests/failing.test.toml",
    ]);
    assert_eq!(code, Some(1), "{stdout}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines[0], "ok    a change needs approval");
    assert_eq!(
        lines[1],
        "FAIL  a change commits without a grant (wrong on purpose)"
    );
    let step = "      step 1 (dispatch lamp-done): ";
    assert_eq!(
        lines[2],
        format!("{step}status: expected OK, got APPROVAL_REQUIRED")
    );
    assert_eq!(
        lines[3],
        format!("{step}reason: expected \"committed\", got \"approval-required\"")
    );
    assert_eq!(lines[4], format!("{step}version: expected 1, got 0"));
    // The whole answer, in the API's JSON mapping, to see the rest.
    let answer = lines[5]
        .strip_prefix(&format!("{step}answer: "))
        .expect("answer line");
    assert_eq!(json(answer)["status"], "DISPATCH_STATUS_APPROVAL_REQUIRED");
    assert!(
        stdout.ends_with("\n2 cases: 1 passed, 1 failed\n"),
        "{stdout}"
    );
}

#[test]
fn a_malformed_test_file_or_policy_exits_2_naming_the_problem() {
    let (code, stdout, stderr) = toolgate(&[
        "test",
        "--config",
        TICKETS,
        "tests/fixtures/policy_tests/malformed.test.toml",
    ]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stdout.is_empty(), "{stdout}");
    assert!(stderr.contains("unknown field `reasn`"), "{stderr}");
    assert!(stderr.contains("line 7"), "{stderr}");

    // Checked against the policy before anything runs: an unknown reason,
    // a Dispatch-only field on a Decide, a reviewer the policy lacks.
    for (text, says) in [
        (
            "expect = { outcome = \"ALLOW\", reason = \"alowed\" }",
            "case[0].expect.reason: \"alowed\" is not a reason",
        ),
        (
            "expect = { outcome = \"ALLOW\", version = 1 }",
            "case[0].expect: replayed, version, resource and value are Dispatch's",
        ),
        (
            "expect = { outcome = \"OK\" }",
            "case[0].expect.outcome: \"OK\" is not a decide outcome",
        ),
    ] {
        let file = proposal_file(&format!(
            "[[case]]\nname = \"x\"\nsession = {{ actor = \"learner\", session_id = \"s\", workspace = \"w\" }}\n\
             proposal_file = \"{}\"\n{text}\n",
            repo_path(LAMP_DONE).display()
        ));
        let path = file.path().to_str().expect("utf-8 path");
        let (code, _, stderr) = toolgate(&["test", "--config", TICKETS, path]);
        assert_eq!(code, Some(2), "{stderr}");
        assert!(stderr.contains(says), "{says}: {stderr}");
    }
    let review = proposal_file(
        "[[case]]\nname = \"x\"\n[[case.step]]\nreview = \"grant\"\nreviewer = \"mallory\"\n",
    );
    let path = review.path().to_str().expect("utf-8 path");
    let (code, _, stderr) = toolgate(&["test", "--config", TICKETS, path]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("case[0].step[0]: no reviewer \"mallory\" in the policy's [reviewers]"),
        "{stderr}"
    );

    let (code, _, stderr) = toolgate(&[
        "test",
        "--config",
        "/nope.toml",
        "examples/tickets.test.toml",
    ]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.starts_with("error: cannot read /nope.toml"),
        "{stderr}"
    );
}

#[test]
fn eval_prints_the_decide_and_dispatch_answers_of_both_example_policies() {
    let (code, stdout, stderr) = toolgate(&[
        "eval",
        "--config",
        TICKETS,
        "--session",
        "learner,s1,tickets",
        LAMP_DONE,
    ]);
    assert_eq!(code, Some(0), "{stderr}");
    let answer = json(&stdout);
    assert_eq!(answer["outcome"], "OUTCOME_REQUIRE_APPROVAL");
    assert_eq!(answer["reason"], "approval-required");
    assert!(answer["approvalId"].is_string(), "{answer}");
    // The fingerprint is the proposal file's, as `toolgate fingerprint` says.
    let (_, fingerprint, _) = toolgate(&["fingerprint", LAMP_DONE]);
    assert_eq!(answer["fingerprint"], fingerprint.trim_end());

    let (code, stdout, _) = toolgate(&[
        "eval",
        "--config",
        TICKETS,
        "--session",
        "learner,s1,tickets",
        "--dispatch",
        LAMP_DONE,
    ]);
    assert_eq!(code, Some(0));
    let answer = json(&stdout);
    assert_eq!(answer["status"], "DISPATCH_STATUS_APPROVAL_REQUIRED");
    assert_eq!(answer["reason"], "approval-required");

    let small_payment = proposal_file(
        r#"{"call_id": "p1", "actor": "payments-agent", "name": "payment_execute", "version": 0,
            "arguments": {"amount": 120, "currency": "EUR", "account_number": "12345678"}}"#,
    );
    let path = small_payment.path().to_str().expect("utf-8 path");
    let session = "payments-agent,s1,acme";
    let config = "examples/policy.toml";
    let (code, stdout, _) = toolgate(&["eval", "--config", config, "--session", session, path]);
    assert_eq!(code, Some(0));
    let answer = json(&stdout);
    assert_eq!(answer["outcome"], "OUTCOME_ALLOW");
    assert_eq!(answer["reason"], "allowed");
    let (code, stdout, _) = toolgate(&[
        "eval",
        "--config",
        config,
        "--session",
        session,
        "--dispatch",
        path,
    ]);
    assert_eq!(code, Some(0));
    let answer = json(&stdout);
    assert_eq!(answer["status"], "DISPATCH_STATUS_OK");
    assert_eq!(answer["reason"], "committed");
    assert!(answer["receiptId"].is_string(), "{answer}");
}

#[test]
fn eval_refusals_are_the_servers_errors_with_exit_1() {
    // Arguments failing the schema: INVALID_ARGUMENT naming the field.
    let bad = proposal_file(
        r#"{"call_id": "c1", "actor": "learner", "name": "set_ticket", "version": 0,
            "arguments": {"ticket": "lamp", "status": "closed"}}"#,
    );
    let path = bad.path().to_str().expect("utf-8 path");
    let (code, stdout, stderr) = toolgate(&[
        "eval",
        "--config",
        TICKETS,
        "--session",
        "learner,s1,tickets",
        path,
    ]);
    assert_eq!(code, Some(1), "{stdout}");
    assert!(
        stderr.starts_with("error: InvalidArgument: proposal.arguments.status"),
        "{stderr}"
    );
    // A host that may not assert the actor: PERMISSION_DENIED, as served.
    let (code, _, stderr) = toolgate(&[
        "eval",
        "--config",
        DECIDE,
        "--host",
        "other-host",
        "--session",
        "payer,s1,acme",
        LAMP_DONE,
    ]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.starts_with("error: PermissionDenied: host \"other-host\""),
        "{stderr}"
    );
    // Usage: a session that is not three parts, a proposal key that is not one.
    let (code, _, stderr) = toolgate(&[
        "eval",
        "--config",
        TICKETS,
        "--session",
        "learner,s1",
        LAMP_DONE,
    ]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("--session must be ACTOR,SESSION_ID,WORKSPACE"),
        "{stderr}"
    );
    let odd = proposal_file(r#"{"call_id": "c1", "tool": "set_ticket"}"#);
    let path = odd.path().to_str().expect("utf-8 path");
    let (code, _, stderr) = toolgate(&[
        "eval",
        "--config",
        TICKETS,
        "--session",
        "learner,s1,w",
        path,
    ]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("unknown key \"tool\""), "{stderr}");
}

/// `eval` acts as one credential of its host, as a served call does: a
/// host whose credentials allow different actors cannot be tested (which
/// one a call used would decide its answer), and a host that is a client
/// certificate alone can.
#[test]
fn eval_acts_as_one_credential_of_its_host() {
    let text = crate::support::policies::decide_text(
        "[[credentials]]\nkind = \"host\"\nidentity = \"agent-host\"\nactors = [\"guest\"]\n\
         sha256 = \"8f434346648f6b96df89dda901c5176b10a6d83961dd3c1ac88b59b2dc327aa4\"\n\n\
         [[credentials]]\nkind = \"host\"\nidentity = \"cert-host\"\nactors = [\"payer\"]\n\
         client_identity = \"spiffe://toolgate.test/host/cert\"\n",
    );
    let policy = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(policy.path(), text).expect("write");
    let config = policy.path().to_str().expect("utf-8 path");
    let eval = |host: &str| {
        toolgate(&[
            "eval",
            "--config",
            config,
            "--host",
            host,
            "--session",
            "payer,s1,acme",
            LAMP_DONE,
        ])
    };
    let (code, _, stderr) = eval("agent-host");
    assert_eq!(code, Some(2), "{stderr}");
    assert!(stderr.contains("allow different actors"), "{stderr}");
    let (code, stdout, stderr) = eval("cert-host");
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("\"outcome\""), "{stdout}");
}

#[tokio::test]
async fn eval_answers_what_a_server_on_the_policy_answers() {
    let payment = r#"{"call_id": "p1", "actor": "payer", "name": "payment_execute", "version": 0, "arguments": {"amount": 15000, "account_number": "12345678"}}"#;
    let file = proposal_file(payment);
    let path = file.path().to_str().expect("utf-8 path").to_string();
    // The default host is the alphabetically first: agent-host, HOST's identity.
    let (code, stdout, stderr) = tokio::task::spawn_blocking(move || {
        toolgate(&[
            "eval",
            "--config",
            DECIDE,
            "--session",
            "payer,s1,acme",
            &path,
        ])
    })
    .await
    .expect("join");
    assert_eq!(code, Some(0), "{stderr}");
    let offline = json(&stdout);

    let server = TestServer::start_file(DECIDE).await;
    let served = server
        .decide_ok(
            HOST,
            &session("payer", "s1", "acme"),
            &proposal(
                "p1",
                "payer",
                "payment_execute",
                0,
                r#"{"amount": 15000, "account_number": "12345678"}"#,
            ),
        )
        .await;
    assert_eq!(offline["outcome"], served.outcome().as_str_name());
    assert_eq!(offline["reason"], served.reason);
    assert_eq!(offline["message"], served.message);
    assert_eq!(offline["fingerprint"], served.fingerprint);
    assert_eq!(offline["policyRevision"], served.policy_revision);
    let _: pb::DecideResponse = served;
}
