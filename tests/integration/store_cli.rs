//! `toolgate store check` and `toolgate store backup`, run as the built
//! binary on a store this test process made with the library, also while
//! this process holds the store's lock and keeps committing: the commands
//! read beside a running server, from a process of their own.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::Duration;

use toolgate::domain::clock::{Clock, ManualClock, MonotonicClock, SystemClock};
use toolgate::domain::proposal::{Proposal, SessionRef};
use toolgate::domain::records;
use toolgate::engine::Engine;

use crate::support::spawn;
use crate::support::{Change, Kind, Policy, SqliteStore, Store, Timestamp, sqlite};

/// What one run of the binary did.
#[derive(Debug)]
struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl Run {
    /// The value of a `key  value` line.
    fn field(&self, key: &str) -> Option<&str> {
        self.stdout.lines().find_map(|line| {
            let (name, value) = line.split_once(' ')?;
            (name == key).then(|| value.trim_start())
        })
    }
}

fn store_command(data_dir: &Path, args: &[&str]) -> Run {
    let output = spawn::command()
        .arg("store")
        .arg("--data-dir")
        .arg(data_dir)
        .args(args)
        .output()
        .expect("run toolgate");
    Run {
        code: output.status.code(),
        stdout: String::from_utf8(output.stdout).expect("utf-8 stdout"),
        stderr: String::from_utf8(output.stderr).expect("utf-8 stderr"),
    }
}

fn put(kind: Kind, key: &[u8], value: &[u8]) -> Change {
    Change {
        kind,
        key: key.to_vec(),
        value: Some(value.to_vec()),
    }
}

/// The session a [`real_store`] decides in (no host: no authentication).
const SESSION: (&str, &str, &str) = ("support-agent", "s1", "desk");

/// A store made as a server makes it, on the embedded default policy: its
/// resources, a session, `decides` decided call ids of a read tool and a
/// pending approval. Returns its records by kind.
fn real_store(dir: &Path, decides: u32) -> Vec<(Kind, u64)> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let policy = Policy::embedded_default().expect("the default policy");
        let store = SqliteStore::open(dir).expect("open");
        let engine = Engine::open(policy, Arc::new(SystemClock), Box::new(store)).expect("engine");
        let (actor, session_id, workspace) = SESSION;
        let session =
            SessionRef::new(actor.into(), session_id.into(), workspace.into()).expect("session");
        let propose = |call_id: String, name: &str, arguments: &str| {
            Proposal::new(call_id, actor.into(), name.into(), 0, arguments).expect("proposal")
        };
        for index in 0..decides {
            let search = propose(format!("c{index}"), "search_docs", r#"{"query":"lamp"}"#);
            engine.decide(&session, &search).await.expect("decide");
        }
        let set = propose(
            "set".into(),
            "set_ticket",
            r#"{"ticket":"lamp","status":"done"}"#,
        );
        engine.decide(&session, &set).await.expect("decide");
        engine.close_store();
    });
    let mut store = SqliteStore::open(dir).expect("reopen");
    let records = store.load().expect("load");
    Kind::ALL
        .iter()
        .map(|kind| {
            let count = records.iter().filter(|record| record.kind == *kind).count();
            (*kind, count as u64)
        })
        .collect()
}

fn total(counts: &[(Kind, u64)]) -> u64 {
    counts.iter().map(|(_, count)| count).sum()
}

/// A decided call id of [`SESSION`], as the state writes one.
fn decided_call(at: u64, call_id: &str) -> Change {
    let (_, session_id, _) = SESSION;
    let key = records::key(&[
        &records::time_part(Timestamp(at)),
        b"",
        session_id.as_bytes(),
        call_id.as_bytes(),
    ]);
    let value = format!(r#"{{"fingerprint":"{}","refused":null}}"#, "ab".repeat(32));
    put(Kind::DecidedCall, &key, value.as_bytes())
}

fn private_dir(parent: &Path, name: &str) -> PathBuf {
    let dir = parent.join(name);
    fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .expect("mkdir");
    dir
}

/// `TABLE  RECORDS` rows of the report, by table.
fn table_rows(run: &Run) -> Vec<(String, u64)> {
    run.stdout
        .lines()
        .skip_while(|line| !line.starts_with("TABLE"))
        .skip(1)
        .map_while(|line| {
            let (table, records) = line.split_once(' ')?;
            Some((table.to_string(), records.trim().parse().ok()?))
        })
        .collect()
}

#[test]
fn store_check_and_backup_on_a_stopped_store() {
    let parent = tempfile::tempdir().expect("temp dir");
    let dir = parent.path().join("data");
    let counts = real_store(&dir, 10);
    let records = total(&counts).to_string();

    let run = store_command(&dir, &["check"]);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(run.stderr, "");
    assert_eq!(
        run.field("store"),
        Some(dir.join(sqlite::DB_FILE).to_str().expect("utf-8"))
    );
    let version = sqlite::SCHEMA_VERSION.to_string();
    assert_eq!(run.field("schema"), Some(version.as_str()));
    assert_eq!(run.field("records"), Some(records.as_str()));
    let bytes: u64 = run
        .field("bytes")
        .expect("bytes")
        .parse()
        .expect("a number");
    assert!(bytes >= fs::metadata(dir.join(sqlite::DB_FILE)).expect("db").len());
    let rows = table_rows(&run);
    assert_eq!(rows.len(), Kind::ALL.len(), "{run:?}");
    for ((kind, count), (table, records)) in counts.iter().zip(&rows) {
        assert_eq!(table, kind.table());
        assert_eq!(records, count);
    }
    assert_eq!(
        rows[Kind::ALL
            .iter()
            .position(|kind| *kind == Kind::DecidedCall)
            .unwrap()]
        .1,
        11
    );
    assert_eq!(run.stdout.lines().last(), Some("ok"));

    let file = parent.path().join("backup.sqlite3");
    let run = store_command(&dir, &["backup", file.to_str().expect("utf-8")]);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(run.field("backup"), file.to_str());
    assert_eq!(run.field("records"), Some(records.as_str()));
    assert_eq!(run.field("schema"), Some(version.as_str()));
    assert!(
        run.field("restore")
            .is_some_and(|restore| restore.starts_with("mkdir -m 700 NEW && cp ")),
        "{run:?}"
    );
    // Never over an existing file.
    let again = store_command(&dir, &["backup", file.to_str().expect("utf-8")]);
    assert_eq!(again.code, Some(2), "{again:?}");
    assert!(
        again.stderr.starts_with("error: ") && again.stderr.contains("never overwrites"),
        "{again:?}"
    );
    assert_eq!(again.stdout, "");

    // Restored as the help says, it is the same store.
    let restored = private_dir(parent.path(), "restored");
    fs::copy(&file, restored.join(sqlite::DB_FILE)).expect("copy");
    let run = store_command(&restored, &["check"]);
    assert_eq!(run.code, Some(0), "{run:?}");
    assert_eq!(run.field("records"), Some(records.as_str()));
    let mut copy = SqliteStore::open(&restored).expect("open the restored copy");
    assert_eq!(copy.load().expect("load").len().to_string(), records);
}

/// A record SQLite finds sound but toolgate cannot restore (a value that
/// does not decode) fails the check, as it would fail a start.
#[test]
fn store_check_reads_every_record_as_a_start_would() {
    let parent = tempfile::tempdir().expect("temp dir");
    let dir = parent.path().join("data");
    let counts = real_store(&dir, 2);
    let mut store = SqliteStore::open(&dir).expect("open");
    store
        .commit(&[decided_call(1, "late"), put(Kind::Approval, b"k", b"{}")])
        .expect("commit");
    drop(store);
    let run = store_command(&dir, &["check"]);
    assert_eq!(run.code, Some(1), "{run:?}");
    assert_eq!(
        run.field("records"),
        Some((total(&counts) + 2).to_string().as_str())
    );
    let problem = run
        .stdout
        .lines()
        .find(|line| line.starts_with("problem: the records do not restore: "))
        .expect("a problem line");
    assert!(problem.contains("approvals"), "{problem}");
    assert!(
        run.stderr.contains("failed its check (1 problem)"),
        "{run:?}"
    );
}

#[test]
fn store_check_and_backup_beside_a_writing_store() {
    let parent = tempfile::tempdir().expect("temp dir");
    let dir = parent.path().join("data");
    let base = total(&real_store(&dir, 3));
    let mut store = SqliteStore::open(&dir).expect("open");
    // This process holds the lock and keeps committing, as a server would.
    let stop = Arc::new(AtomicBool::new(false));
    let committed = Arc::new(AtomicU64::new(0));
    let writer = thread::spawn({
        let (stop, committed) = (stop.clone(), committed.clone());
        move || {
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                n += 1;
                let batch: Vec<Change> = (0..50u32)
                    .map(|index| decided_call(n, &format!("w{n}x{index}")))
                    .collect();
                store.commit(&batch).expect("commit");
                committed.store(n, Ordering::SeqCst);
                thread::sleep(Duration::from_millis(1));
            }
            store
        }
    });
    while committed.load(Ordering::SeqCst) < 5 {
        thread::sleep(Duration::from_millis(1));
    }
    // The lock is held: a second store is refused...
    let error = SqliteStore::open(&dir).expect_err("locked");
    assert!(error.0.contains("another toolgate process"), "{error}");
    // ...but check and backup, in processes of their own, read.
    for attempt in 0..3 {
        let before = committed.load(Ordering::SeqCst);
        let run = store_command(&dir, &["check"]);
        assert_eq!(run.code, Some(0), "{run:?}");
        let records: u64 = run.field("records").expect("records").parse().expect("n");
        assert!(
            records >= base + before * 50,
            "{records} < {before} batches"
        );
        assert_eq!((records - base) % 50, 0, "whole batches only: {records}");

        let before = committed.load(Ordering::SeqCst);
        let file = parent.path().join(format!("backup{attempt}"));
        let run = store_command(&dir, &["backup", file.to_str().expect("utf-8")]);
        assert_eq!(run.code, Some(0), "{run:?}");
        let restored = private_dir(parent.path(), &format!("restored{attempt}"));
        fs::rename(&file, restored.join(sqlite::DB_FILE)).expect("move");
        let mut copy = SqliteStore::open(&restored).expect("open the backup");
        let records = copy.load().expect("load").len() as u64;
        assert!(
            records >= base + before * 50,
            "{records} < {before} batches"
        );
        assert_eq!((records - base) % 50, 0, "whole batches only: {records}");
        assert_eq!(run.field("records"), Some(records.to_string().as_str()));
    }
    stop.store(true, Ordering::SeqCst);
    let store = writer.join().expect("writer");
    drop(store);
    assert_eq!(store_command(&dir, &["check"]).code, Some(0));
}

#[test]
fn store_check_exit_codes() {
    let parent = tempfile::tempdir().expect("temp dir");
    // No store: exit 2, and nothing created.
    let absent = parent.path().join("absent");
    let run = store_command(&absent, &["check"]);
    assert_eq!(run.code, Some(2), "{run:?}");
    assert!(run.stderr.starts_with("error: no store at "), "{run:?}");
    assert_eq!(run.stdout, "");
    assert!(!absent.exists());
    let run = store_command(&absent, &["backup", "copy"]);
    assert_eq!(run.code, Some(2), "{run:?}");
    // A usage error: exit 2.
    assert_eq!(store_command(&absent, &["backup"]).code, Some(2));

    // A problem: exit 1, the report and each problem on stdout.
    let dir = parent.path().join("data");
    let records = total(&real_store(&dir, 0)).to_string();
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o750)).expect("chmod");
    let run = store_command(&dir, &["check"]);
    assert_eq!(run.code, Some(1), "{run:?}");
    assert_eq!(run.field("records"), Some(records.as_str()));
    let problem = run
        .stdout
        .lines()
        .find(|line| line.starts_with("problem: "))
        .expect("a problem line");
    assert!(
        problem.contains(&format!("run `chmod 700 {}`", dir.display())),
        "{problem}"
    );
    assert!(!run.stdout.lines().any(|line| line == "ok"), "{run:?}");
    assert_eq!(
        run.stderr,
        format!(
            "error: the store at {} failed its check (1 problem)\n",
            dir.display()
        )
    );
}

/// With `--config`, the store is the one `serve` would use on that policy:
/// a policy whose `[server] store` is PostgreSQL is not checked as the data
/// directory beside it (which would answer ok about a store nobody uses).
#[test]
fn store_check_takes_the_policys_store() {
    let parent = tempfile::tempdir().expect("temp dir");
    let dir = parent.path().join("data");
    real_store(&dir, 0);
    let policy_text = |store: &str| {
        crate::support::policies::decide_text(&format!("[server]\nstore = \"{store}\"\n"))
    };
    let policy = parent.path().join("postgres.toml");
    fs::write(
        &policy,
        policy_text("postgres://toolgate:secret@127.0.0.1:1/toolgate"),
    )
    .expect("write");
    let config = policy.to_str().expect("utf-8 path");
    for command in [&["check"][..], &["backup", "copy"]] {
        let run = store_command(&dir, &[command, &["--config", config]].concat());
        assert_eq!(run.code, Some(2), "{run:?}");
        assert!(
            run.stderr.contains("works on the SQLite store only"),
            "{run:?}"
        );
        assert!(!run.stderr.contains("secret"), "{run:?}");
    }
    // A policy on the embedded store: the data directory, as before.
    let policy = parent.path().join("sqlite.toml");
    fs::write(&policy, policy_text("sqlite")).expect("write");
    let run = store_command(
        &dir,
        &["check", "--config", policy.to_str().expect("utf-8")],
    );
    assert_eq!(run.code, Some(0), "{run:?}");
}

/// A clock set back while the server was down: the restarted engine's
/// time goes on from the latest time its store holds (an approval
/// requested a day "ahead"), so that approval's deadline is still as far
/// off as it was, not a day further.
#[test]
fn a_restart_on_a_clock_set_back_goes_on_from_the_stores_latest_time() {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let parent = tempfile::tempdir().expect("temp dir");
    let dir = parent.path().join("data");
    let ahead = SystemClock
        .now()
        .saturating_add(Duration::from_secs(86_400));
    let (actor, session_id, workspace) = SESSION;
    let session =
        SessionRef::new(actor.into(), session_id.into(), workspace.into()).expect("session");
    let set = Proposal::new(
        "set".into(),
        actor.into(),
        "set_ticket".into(),
        0,
        r#"{"ticket":"lamp","status":"done"}"#,
    )
    .expect("proposal");
    let (id, expires_at) = runtime.block_on(async {
        let policy = Policy::embedded_default().expect("the default policy");
        let store = SqliteStore::open(&dir).expect("open");
        let clock = Arc::new(ManualClock::starting_at(ahead));
        let engine = Engine::open(policy, clock, Box::new(store)).expect("engine");
        let (decision, _) = engine.decide(&session, &set).await.expect("decide");
        engine.close_store();
        decision.approval.expect("a pending approval")
    });
    let policy = Policy::embedded_default().expect("the default policy");
    let store = SqliteStore::open(&dir).expect("reopen");
    let clock = Arc::new(MonotonicClock::new());
    let engine = Engine::open(policy, clock.clone(), Box::new(store)).expect("engine");
    let now = engine.now();
    assert!(
        now >= ahead && now < expires_at,
        "{now:?} {ahead:?} {expires_at:?}"
    );
    assert!(clock.now() >= ahead);
    let approval = engine.get_approval(id).expect("the approval");
    assert_eq!(
        approval.status,
        toolgate::domain::ledger::ApprovalStatus::Pending
    );
    engine.close_store();
}
