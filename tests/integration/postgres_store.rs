//! `toolgate serve --store postgres://…` as a process of its own, against
//! the real server of `TOOLGATE_TEST_DATABASE_URL` (see
//! `support::postgres`), each test in a fresh schema chosen with the URL's
//! `schema=` parameter: a grant made before a restart is used after it; a
//! lost connection is resumed; `store migrate` creates and then finds the
//! tables; no message shows the password. (Several processes on one
//! schema: `replicas.rs`.)

use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use toolgate::store::postgres::SCHEMA_VERSION;

use tonic_health::pb::health_check_response::ServingStatus;

use crate::support::policies::portable;
use crate::support::postgres::{TestSchema, connect};
use crate::support::recovery::{self, RECOVERY, post, set_note};
use crate::support::spawn::{self, Serve, Spawned};
use crate::support::tokens::EXAMPLE_REVIEWER;
use crate::support::{authed, grant_request, pb, session};

/// The password in `url` (`postgres://user:PASSWORD@…`), if it has one.
fn password_of(url: &str) -> Option<String> {
    let (_, rest) = url.split_once("://")?;
    let (userinfo, _) = rest.split_once('@')?;
    let (_, password) = userinfo.split_once(':')?;
    Some(password.to_string())
}

fn serve_on(schema: &TestSchema) -> Spawned {
    Serve::new(&portable(RECOVERY))
        .args(&["--store", &schema.url, "--migrate"])
        .pipe_stderr()
        .start()
}

/// Stderr lines until one contains `text` (or 10 s pass); all of them.
fn lines_until(lines: &Receiver<String>, text: &str) -> Vec<String> {
    let mut seen = Vec::new();
    while let Ok(line) = lines.recv_timeout(Duration::from_secs(10)) {
        let found = line.contains(text);
        seen.push(line);
        if found {
            break;
        }
    }
    seen
}

/// Dispatch of `call`, which must answer.
async fn dispatch(server: &Spawned, call: &pb::Proposal) -> pb::DispatchResponse {
    recovery::dispatch(server, call)
        .await
        .expect("Dispatch answers")
}

#[tokio::test]
async fn a_grant_made_before_a_restart_commits_once_after_it() {
    let schema = TestSchema::new();
    let password = password_of(&schema.url);
    let mut first = serve_on(&schema);
    let stderr = first.stderr_lines();
    let start = lines_until(&stderr, "toolgate serving");
    let shown = schema.target.to_string();
    assert!(
        start.iter().any(|line| line.contains(&format!(
            "state kept in PostgreSQL at {shown}; created the tables (schema version {SCHEMA_VERSION})"
        ))),
        "{start:#?}"
    );
    if let Some(password) = &password {
        assert!(!start.iter().any(|line| line.contains(password.as_str())));
    }
    // Decide asks for approval; a reviewer grants it.
    let call = set_note("c-note", "after the restart");
    let decided = recovery::decide(&first, &call).await;
    assert_eq!(decided.reason, "approval-required", "{decided:?}");
    let mut approvals = pb::approvals_client::ApprovalsClient::new(first.channel().await);
    let granted = approvals
        .grant_approval(authed(
            grant_request(decided.approval_id.clone(), "checked"),
            EXAMPLE_REVIEWER,
        ))
        .await
        .expect("grant")
        .into_inner();
    assert_eq!(granted.status(), pb::ApprovalStatus::Granted);
    assert_eq!(first.stop(), Some(0));

    // A new process on the same schema: the grant is there, and commits once.
    let mut second = serve_on(&schema);
    let stderr = second.stderr_lines();
    let start = lines_until(&stderr, "state recovered");
    assert!(
        start.iter().any(|line| line.contains(&format!(
            "state kept in PostgreSQL at {shown} (schema version {SCHEMA_VERSION})"
        ))),
        "{start:#?}"
    );
    let committed = dispatch(&second, &call).await;
    assert_eq!(
        (committed.status(), committed.replayed),
        (pb::DispatchStatus::Ok, false),
        "{committed:?}"
    );
    assert_eq!(committed.value_json, r#""after the restart""#);
    // And once more after another restart: the same receipt, replayed.
    assert_eq!(second.stop(), Some(0));
    let third = serve_on(&schema);
    let replayed = dispatch(&third, &call).await;
    assert!(replayed.replayed, "{replayed:?}");
    assert_eq!(replayed.receipt_id, committed.receipt_id);
    let mut approvals = pb::approvals_client::ApprovalsClient::new(third.channel().await);
    let approval = approvals
        .get_approval(authed(
            pb::GetApprovalRequest {
                approval_id: decided.approval_id.clone(),
            },
            EXAMPLE_REVIEWER,
        ))
        .await
        .expect("the approval is kept")
        .into_inner();
    assert_eq!(approval.status(), pb::ApprovalStatus::Consumed);
}

/// Dispatches `call` until it is answered, taking UNAVAILABLE (the store
/// is out) as "not yet" for up to 20 s; anything else fails the test.
async fn dispatch_when_back(server: &Spawned, call: &pb::Proposal) -> pb::DispatchResponse {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let request = crate::support::dispatch_request(session("agent", "s1", "w"), call.clone());
        match server.pdp().await.dispatch(request).await {
            Ok(answer) => return answer.into_inner(),
            Err(status)
                if status.code() == tonic::Code::Unavailable && Instant::now() < deadline =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(status) => panic!("{status:?}"),
        }
    }
}

#[tokio::test]
async fn a_lost_connection_is_resumed_and_nothing_commits_twice() {
    let schema = TestSchema::new();
    let application = format!("tg_{}", schema.name());
    let url = format!("{}&application_name={application}", schema.url);
    let serve = || {
        Serve::new(&portable(RECOVERY))
            .args(&["--store", &url, "--migrate"])
            .pipe_stderr()
            .start()
    };
    let mut server = serve();
    let stderr = server.stderr_lines();
    lines_until(&stderr, "toolgate serving");
    let first = dispatch(&server, &post("c1", 0, "one")).await;
    assert_eq!(first.status(), pb::DispatchStatus::Ok, "{first:?}");
    // The connection is cut under the server (as a restart of PostgreSQL
    // or a failover would).
    schema
        .execute(&format!(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
             WHERE application_name = '{application}'"
        ))
        .unwrap();
    // The next commit finds it gone; the store resumes, and the call is
    // answered (or refused as UNAVAILABLE until it is back, then answered).
    let second = dispatch_when_back(&server, &post("c2", 1, "two")).await;
    assert_eq!(
        (second.status(), second.replayed),
        (pb::DispatchStatus::Ok, false),
        "{second:?}"
    );
    let said = lines_until(&stderr, "the store is back");
    assert!(
        said.iter().any(|line| line.contains("the store is back")),
        "{said:#?}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while server.health().await != ServingStatus::Serving {
        assert!(Instant::now() < deadline, "health stayed NOT_SERVING");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Each committed once: both replay with their receipts, and after a
    // restart the queue's version is 2 (a third post at version 2 commits).
    let replayed = dispatch(&server, &post("c2", 1, "two")).await;
    assert!(replayed.replayed, "{replayed:?}");
    assert_eq!(replayed.receipt_id, second.receipt_id);
    assert_eq!(server.stop(), Some(0));
    let server = serve();
    let replayed = dispatch(&server, &post("c1", 0, "one")).await;
    assert_eq!(
        (replayed.replayed, &replayed.receipt_id),
        (true, &first.receipt_id)
    );
    let third = dispatch(&server, &post("c3", 2, "three")).await;
    assert_eq!(
        (third.status(), third.replayed),
        (pb::DispatchStatus::Ok, false),
        "{third:?}"
    );
}

#[tokio::test]
async fn a_scrape_is_answered_while_the_store_waits_on_a_lock() {
    use crate::support::metrics::scrape;
    let schema = TestSchema::new();
    let mut server = Serve::new(&portable(RECOVERY))
        .args(&["--store", &schema.url, "--migrate"])
        .with_metrics()
        .pipe_stderr()
        .start();
    let stderr = server.stderr_lines();
    lines_until(&stderr, "toolgate serving");
    let addr = server.metrics_addr.expect("metrics listener");
    let sizes = |text: &str| {
        let line = |name: &str| {
            text.lines()
                .find(|line| line.starts_with(&format!("{name} ")))
                .map(str::to_owned)
        };
        (
            line("toolgate_state_sizes_read"),
            line("toolgate_approvals_pending"),
        )
    };
    assert_eq!(
        sizes(&scrape(addr).await),
        (
            Some("toolgate_state_sizes_read 1".into()),
            Some("toolgate_approvals_pending 0".into())
        )
    );
    // Another session holds the commit head (as a replica's long turn
    // would), for less than the lock timeout (10 s): a turn waits for it.
    let (locked, held) = std::sync::mpsc::channel();
    let holder = {
        let (target, name) = (schema.target.clone(), schema.name().to_owned());
        std::thread::spawn(move || -> Result<(), String> {
            let mut client = connect(&target)?;
            client
                .batch_execute(&format!(
                    "BEGIN; LOCK TABLE {name}.commits IN ACCESS EXCLUSIVE MODE"
                ))
                .map_err(|error| error.to_string())?;
            let _ = locked.send(());
            client
                .batch_execute("SELECT pg_sleep(6); COMMIT")
                .map_err(|error| error.to_string())
        })
    };
    match held.recv_timeout(Duration::from_secs(30)) {
        Ok(()) => {}
        // The holder failed: its error says why.
        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            panic!("the lock was not taken: {:?}", holder.join())
        }
        Err(timeout) => panic!("the lock was not taken: {timeout}"),
    }
    // Answered before the lock is let go, without the sizes (waiting,
    // it would have answered them after).
    assert_eq!(
        sizes(&scrape(addr).await),
        (Some("toolgate_state_sizes_read 0".into()), None)
    );
    holder
        .join()
        .expect("the holder")
        .expect("the lock was held");
    assert_eq!(
        sizes(&scrape(addr).await).0,
        Some("toolgate_state_sizes_read 1".into())
    );
    assert_eq!(server.stop(), Some(0));
}

/// Runs `toolgate ARGS` to its end, the store named by TOOLGATE_STORE (as
/// an operator would pass a URL) when given: exit code, stdout, stderr.
fn toolgate(args: &[&str], store: Option<&str>) -> (Option<i32>, String, String) {
    let mut command = spawn::command();
    command.args(args);
    if let Some(store) = store {
        command.env("TOOLGATE_STORE", store);
    }
    let output = command.output().expect("run toolgate");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

#[test]
fn store_migrate_creates_the_tables_then_finds_them_current() {
    let schema = TestSchema::new();
    let store = Some(schema.url.as_str());
    let migrate = || toolgate(&["store", "migrate"], store);
    let shown = schema.target.to_string();
    // serve creates no tables unless asked: a replica of another version
    // never changes the schema under the others.
    let (code, _, stderr) = toolgate(&["serve", "--listen", "127.0.0.1:0"], store);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains(&format!(
            "the PostgreSQL store at {shown} has no toolgate tables in schema {}; this \
             toolgate needs version {SCHEMA_VERSION}: run `toolgate store migrate`, or serve with \
             --migrate",
            schema.name()
        )),
        "{stderr}"
    );
    let (code, stdout, stderr) = migrate();
    assert_eq!(code, Some(0), "{stderr}");
    assert_eq!(
        stdout,
        format!("store   {shown}\nschema  {SCHEMA_VERSION}\ndone    created\n")
    );
    let (code, stdout, _) = migrate();
    assert_eq!(code, Some(0));
    assert!(stdout.ends_with("done    current\n"), "{stdout}");
    // `store check` is the SQLite store's: refused, saying so.
    let (code, _, stderr) = toolgate(&["store", "check", "--store", &schema.url], None);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("`toolgate store check` works on the SQLite store only"),
        "{stderr}"
    );
    // --migrate is a postgres store's.
    let serve = ["serve", "--listen", "127.0.0.1:0", "--store"];
    let (code, _, stderr) = toolgate(&[&serve[..], &["memory", "--migrate"]].concat(), None);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("--migrate is for a postgres:// store"),
        "{stderr}"
    );
    // serve refuses --data-dir with a postgres store.
    let with_data_dir = [
        &serve[..],
        &[schema.url.as_str(), "--data-dir", "/nonexistent"],
    ]
    .concat();
    let (code, _, stderr) = toolgate(&with_data_dir, None);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("--data-dir /nonexistent has no effect with a postgres:// store"),
        "{stderr}"
    );
}

#[test]
fn a_bad_store_value_is_refused_without_echoing_a_password() {
    for (value, rule) in [
        (
            "postgress://u:pw9secret@h/db",
            "expected `sqlite`, `memory` or a postgres://… URL",
        ),
        (
            "postgres://u:pw9secret@h/db?schema=Bad",
            "is not a schema name",
        ),
        ("postgres://u:pw9secret@h/db?sslmode=require", "no TLS"),
    ] {
        let output = spawn::command()
            .args(["serve", "--store", value])
            .output()
            .expect("run toolgate");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(2), "{stderr}");
        assert!(stderr.contains("invalid value for '--store"), "{stderr}");
        assert!(stderr.contains(rule), "{value}: {stderr}");
        assert!(!stderr.contains("pw9secret"), "{stderr}");
        // The same in the policy's [server] store: refused at start, naming
        // the key.
        let policy = portable(RECOVERY).replace(
            "open_host_api = true",
            &format!("open_host_api = true\nstore = {value:?}"),
        );
        let directory = tempfile::tempdir().expect("temp dir");
        let path = directory.path().join("policy.toml");
        std::fs::write(&path, policy).expect("write the policy");
        let output = spawn::command()
            .args(["serve", "--listen", "127.0.0.1:0", "--config"])
            .arg(&path)
            .env_remove("TOOLGATE_STORE")
            .output()
            .expect("run toolgate");
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert_eq!(output.status.code(), Some(1), "{stderr}");
        assert!(stderr.contains("[server] store: "), "{stderr}");
        assert!(stderr.contains(rule), "{value}: {stderr}");
        assert!(!stderr.contains("pw9secret"), "{stderr}");
    }
}
