//! What only the PostgreSQL store has: its URL (and that no message shows
//! the password), its turns and replicas, schema versions, and its errors. Against the
//! real server `TOOLGATE_TEST_DATABASE_URL` names (`source .ci/postgres
//! start`); without it, every test that needs one fails saying so. The
//! URL's own tests need no server.

use std::time::{Duration, Instant};

use super::*;
use crate::domain::clock::Clock;
use crate::domain::policy::PostgresSettings;
use crate::store::postgres::{
    self, Connection, DEFAULT_SCHEMA, Migration, PostgresTarget, SCHEMA_VERSION, create_v1_tables,
    create_v2_commit_count,
};
use crate::store::{Behind, Resume};

/// The tables of a store of the current schema version.
const TABLES: [&str; 5] = [
    "commits",
    "records",
    "schema_version",
    "tokens",
    "transitions",
];

/// Where the tests' database is.
pub(super) const URL_VARIABLE: &str = "TOOLGATE_TEST_DATABASE_URL";

/// The test database, or a failure that says how to get one: these tests
/// never pass without having run.
pub(super) fn test_target() -> PostgresTarget {
    let url = std::env::var(URL_VARIABLE).unwrap_or_else(|_| {
        panic!(
            "{URL_VARIABLE} is not set: the PostgreSQL store's tests need a server. Run \
             `source .ci/postgres start` (a private cluster; `.ci/run` does it), or set \
             {URL_VARIABLE} to a postgres:// URL of a database these tests may create \
             schemas in"
        )
    });
    PostgresTarget::parse(&url).unwrap_or_else(|error| panic!("{URL_VARIABLE}: {error}"))
}

/// A fresh schema of the test database for one test, and a connection of
/// the test's own to look at it; dropped (with everything in it) at the
/// end.
pub(super) struct TestSchema {
    pub(super) target: PostgresTarget,
    admin: ::postgres::Client,
}

impl TestSchema {
    pub(super) fn new() -> Self {
        let base = test_target();
        let target = base
            .with_schema(&format!("t_{:016x}", rand::random::<u64>()))
            .unwrap();
        let admin = connect(&target);
        TestSchema { target, admin }
    }

    pub(super) fn name(&self) -> &str {
        self.target.schema()
    }

    pub(super) fn execute(&mut self, sql: &str) {
        self.admin
            .batch_execute(sql)
            .unwrap_or_else(|error| panic!("{sql}: {error}"));
    }

    /// The schema's tables, by name.
    fn tables(&mut self) -> Vec<String> {
        let schema = self.name().to_string();
        self.admin
            .query(
                "SELECT table_name::text FROM information_schema.tables \
                 WHERE table_schema = $1 ORDER BY 1",
                &[&schema],
            )
            .unwrap()
            .iter()
            .map(|row| row.get(0))
            .collect()
    }

    fn version(&mut self) -> i32 {
        let sql = format!("SELECT version FROM {}.schema_version", self.name());
        self.admin.query_one(&sql, &[]).unwrap().get(0)
    }

    /// Every row of `records`, as (kind, key, value).
    fn rows(&mut self) -> Vec<(i16, Vec<u8>, Vec<u8>)> {
        let sql = format!(
            "SELECT kind, key, value FROM {}.records WHERE value IS NOT NULL ORDER BY kind, key",
            self.name()
        );
        self.admin
            .query(&sql, &[])
            .unwrap()
            .iter()
            .map(|row| (row.get(0), row.get(1), row.get(2)))
            .collect()
    }

    /// Ends the backend of `store`'s connection.
    fn terminate(&mut self, store: &mut PostgresStore) {
        let pid = store.backend_pid();
        let ended: bool = self
            .admin
            .query_one("SELECT pg_terminate_backend($1)", &[&pid])
            .unwrap()
            .get(0);
        assert!(ended, "backend {pid} was not ended");
    }
}

impl Drop for TestSchema {
    fn drop(&mut self) {
        let sql = format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name());
        let _ = self.admin.batch_execute(&sql);
    }
}

/// A connection of the test's own (blocking).
fn connect(target: &PostgresTarget) -> ::postgres::Client {
    ::postgres::Config::from(target.config().clone())
        .connect(::postgres::NoTls)
        .unwrap()
}

/// The test database's URL with its password replaced by `password`.
fn with_password(password: &str) -> String {
    let shown = test_target().to_string();
    let (_, rest) = shown.split_once("://").unwrap();
    let (user, hosts) = rest.split_once('@').unwrap();
    format!("postgres://{user}:{password}@{hosts}")
}

// ----- the URL (no server needed) ------------------------------------------------

#[test]
fn the_url_is_shown_without_its_password() {
    let target =
        PostgresTarget::parse("postgresql://alice:s3cret%21@db.example:6543/state").unwrap();
    assert_eq!(
        target.to_string(),
        "postgres://alice@db.example:6543/state?schema=toolgate"
    );
    assert_eq!(
        format!("{target:?}"),
        "PostgresTarget(postgres://alice@db.example:6543/state?schema=toolgate)"
    );
    assert_eq!(target.schema(), DEFAULT_SCHEMA);
    // A password given as a parameter, a schema, a Unix socket.
    let target = PostgresTarget::parse(
        "postgres://bob@%2Fvar%2Frun%2Fpostgresql/db?password=hunter2&schema=tg_one&connect_timeout=3",
    )
    .unwrap();
    assert_eq!(
        target.to_string(),
        "postgres://bob@%2Fvar%2Frun%2Fpostgresql:5432/db?schema=tg_one"
    );
    assert_eq!(target.schema(), "tg_one");
    for shown in [target.to_string(), format!("{target:?}")] {
        assert!(!shown.contains("hunter2"), "{shown}");
    }
}

#[test]
fn a_bad_url_is_refused_naming_the_rule_and_never_the_password() {
    let cases = [
        ("postgre://u:pw1secret@h/db", "must start with postgres://"),
        ("mysql://u:pw1secret@h/db", "must start with postgres://"),
        ("postgres://u:pw1secret@h:notaport/db", "port"),
        (
            "postgres://u:pw1secret@h/db?schema=Upper",
            "schema: \"Upper\" is not a schema name",
        ),
        (
            "postgres://u:pw1secret@h/db?schema=a;drop",
            "is not a schema name",
        ),
        (
            "postgres://u:pw1secret@h/db?schema=",
            "is not a schema name",
        ),
        ("postgres://u:pw1secret@h/db?schema=pg_x", "reserved"),
        ("postgres://u:pw1secret@h/db?schema=public", "reserved"),
        (
            "postgres://u:pw1secret@h/db?schema=a&schema=b",
            "given twice",
        ),
        ("postgres://u:pw1secret@h/db?sslmode=require", "no TLS"),
        (
            "postgres://u:pw1secret@h/db?nonsense=1",
            "unknown option `nonsense`",
        ),
        (
            "postgres://h/db?password=pw1secret&bogus=2",
            "unknown option `bogus`",
        ),
        // Malformed: characters the password should have percent-encoded.
        (
            "postgres://u:pw1/secret@h/db?bogus=1",
            "an `@` after the host",
        ),
        ("postgres://u:pw1/secret@h/db", "percent-encode"),
        (
            "postgres://u:pw1?secret@h/db?schema=X",
            "a parameter name that is not",
        ),
        (
            "postgres://u:pw1@secret@h/db?schema=X",
            "is not a schema name",
        ),
        (
            "postgresx://u:pw1secret@h/db",
            "must start with postgres://",
        ),
        // A password the URL names in capitals, or without its `@`.
        (
            "postgres://u@h/db?PASSWORD=pw1secret&schema=X",
            "is not a schema name",
        ),
        ("postgres://u:pw1secret", "invalid value for option `port`"),
    ];
    // A long password (a token), past what a message shows of the URL.
    let long = format!("postgres://u:{}@h/db?schema=X", "pw1secret".repeat(40));
    let cases = cases
        .iter()
        .copied()
        .chain([(long.as_str(), "is not a schema name")]);
    for (url, rule) in cases {
        let error = PostgresTarget::parse(url).unwrap_err();
        assert!(error.0.contains(rule), "{url}: {error}");
        assert!(
            !error.0.contains("pw1") && !error.0.contains("secret"),
            "{url}: {error}"
        );
        assert!(error.0.starts_with("the store URL "), "{url}: {error}");
    }
    // An IPv6 address, or several hosts, shown whole.
    for (url, shown) in [
        (
            "postgres://[::1]:5432/db?schema=Upper",
            "postgres://[::1]:5432/db",
        ),
        (
            "postgres://h1:5432,h2:5433/db?schema=Upper",
            "postgres://h1:5432,h2:5433/db",
        ),
    ] {
        let error = PostgresTarget::parse(url).unwrap_err();
        assert!(error.0.contains(shown), "{url}: {error}");
    }
}

#[test]
fn an_unreachable_server_is_refused_fast_naming_where_and_the_step() {
    // A port nothing listens on: bound, then let go.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!("postgres://someone:pw2secret@127.0.0.1:{port}/somedb?schema=s1");
    let started = Instant::now();
    let error = PostgresStore::open(&PostgresTarget::parse(&url).unwrap()).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5), "{error}");
    assert!(
        error.0.starts_with(&format!(
            "the PostgreSQL store at postgres://someone@127.0.0.1:{port}/somedb?schema=s1: connecting: "
        )),
        "{error}"
    );
    assert!(error.0.contains("Connection refused"), "{error}");
    assert!(!error.0.contains("pw2secret"), "{error}");
    // A server that takes the connection and never answers (on loopback:
    // the tests reach nothing else): the connect time limit holds.
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = silent.local_addr().unwrap().port();
    let url = format!("postgres://someone:pw2secret@127.0.0.1:{port}/somedb");
    let settings = PostgresSettings {
        connect_timeout: Duration::from_secs(1),
        ..PostgresSettings::default()
    };
    let target = PostgresTarget::parse(&url).unwrap().with_settings(settings);
    let started = Instant::now();
    let error = PostgresStore::open(&target).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5), "{error}");
    assert!(
        error
            .0
            .contains("connecting took longer than postgres_connect_timeout_ms"),
        "{error}"
    );
    assert!(
        error
            .0
            .contains(&format!("postgres://someone@127.0.0.1:{port}/somedb")),
        "{error}"
    );
    assert!(!error.0.contains("pw2secret"), "{error}");
    drop(silent);
}

// ----- against the server --------------------------------------------------------

#[test]
fn a_wrong_password_is_refused_without_showing_it() {
    let target = PostgresTarget::parse(&with_password("pw3wrong")).unwrap();
    let error = PostgresStore::open(&target).unwrap_err();
    assert!(error.0.contains("connecting"), "{error}");
    assert!(error.0.contains("authentication"), "{error}");
    assert!(!error.0.contains("pw3wrong"), "{error}");
}

#[test]
fn two_stores_on_one_schema_take_turns_and_each_reads_what_the_other_committed() {
    let schema = TestSchema::new();
    let mut first = PostgresStore::open(&schema.target).unwrap();
    let mut second = PostgresStore::open(&schema.target).unwrap();
    assert!(first.shared());
    let turn = first.begin_turn().unwrap();
    assert!(matches!(turn.behind, Some(Behind::Everything(ref all)) if all.is_empty()));
    first
        .commit(&[put(Kind::Meta, b"m", b"1"), put(Kind::Pin, b"p", b"1")])
        .unwrap();
    let turn = second.begin_turn().unwrap();
    let Some(Behind::Everything(all)) = turn.behind else {
        panic!("a first turn loads everything");
    };
    assert_eq!(all.len(), 2);
    second
        .commit(&[put(Kind::Meta, b"m", b"2"), delete(Kind::Pin, b"p")])
        .unwrap();
    let mut third = PostgresStore::open(&schema.target).unwrap();
    third.load().unwrap();
    // The first reads only what the second committed, a deletion included,
    // at the server's clock.
    let before = crate::domain::clock::SystemClock.now();
    let turn = first.begin_turn().unwrap();
    assert!(turn.now.0.abs_diff(before.0) < 60_000, "{:?}", turn.now);
    let Some(Behind::Changes(changes)) = turn.behind else {
        panic!("the first is behind by one commit");
    };
    assert_eq!(
        changes,
        [put(Kind::Meta, b"m", b"2"), delete(Kind::Pin, b"p")]
    );
    // While the first's turn is open, another waits for its own.
    let waiting = std::thread::spawn(move || {
        let started = Instant::now();
        let turn = third.begin_turn().unwrap();
        third.commit(&[]).unwrap();
        (started.elapsed(), turn.behind.is_some())
    });
    std::thread::sleep(Duration::from_millis(300));
    first.commit(&[put(Kind::Meta, b"m", b"3")]).unwrap();
    let (waited, behind) = waiting.join().unwrap();
    assert!(waited >= Duration::from_millis(200), "{waited:?}");
    assert!(behind, "the third's turn began after the first's commit");
    // A turn with nothing to commit ends without one.
    second.begin_turn().unwrap();
    second.commit(&[]).unwrap();
    // Between turns, catching up reads what others committed.
    assert!(second.catch_up().unwrap().is_none());
    first.commit(&[put(Kind::Meta, b"n", b"1")]).unwrap();
    let Some(Behind::Changes(changes)) = second.catch_up().unwrap() else {
        panic!("the second is behind");
    };
    assert_eq!(changes, [put(Kind::Meta, b"n", b"1")]);
    // Another schema of the same database is another store.
    let other = TestSchema::new();
    let mut other_store = PostgresStore::open(&other.target).unwrap();
    assert!(contents(&mut other_store).is_empty());
    assert_eq!(
        contents(&mut second),
        expect(&[(Kind::Meta, b"m", b"3"), (Kind::Meta, b"n", b"1")])
    );
}

/// A turn reads the commits made while it waited for the lock, also on a
/// database whose sessions default to a stricter isolation (a snapshot
/// taken before the lock was granted would hide them).
#[test]
fn a_turn_reads_what_was_committed_while_it_waited_whatever_the_default_isolation() {
    let schema = TestSchema::new();
    let base = std::env::var(URL_VARIABLE).unwrap();
    let separator = if base.contains('?') { '&' } else { '?' };
    let url = format!(
        "{base}{separator}schema={}&options=-c%20default_transaction_isolation%3Dserializable",
        schema.name()
    );
    let mut first = PostgresStore::open(&schema.target).unwrap();
    let mut second = PostgresStore::open(&PostgresTarget::parse(&url).unwrap()).unwrap();
    assert_eq!(
        second.setting("default_transaction_isolation"),
        "serializable"
    );
    first.begin_turn().unwrap();
    first.commit(&[put(Kind::Meta, b"m", b"1")]).unwrap();
    second.begin_turn().unwrap();
    second.commit(&[]).unwrap();
    first.begin_turn().unwrap();
    let waiting = std::thread::spawn(move || {
        let behind = second.begin_turn().unwrap().behind;
        (behind, second.commit(&[put(Kind::Meta, b"n", b"1")]))
    });
    std::thread::sleep(Duration::from_millis(300));
    first.commit(&[put(Kind::Meta, b"m", b"2")]).unwrap();
    let (behind, committed) = waiting.join().unwrap();
    let Some(Behind::Changes(changes)) = behind else {
        panic!("the waiting turn did not read the commit it waited for: {behind:?}");
    };
    assert_eq!(changes, [put(Kind::Meta, b"m", b"2")]);
    committed.unwrap();
}

#[test]
fn a_turn_has_time_limits_unless_the_url_sets_its_own() {
    let schema = TestSchema::new();
    let mut store = PostgresStore::open(&schema.target).unwrap();
    assert_eq!(store.setting("lock_timeout"), "10s");
    assert_eq!(store.setting("idle_in_transaction_session_timeout"), "10s");
    let base = std::env::var(URL_VARIABLE).unwrap();
    let separator = if base.contains('?') { '&' } else { '?' };
    let url = format!(
        "{base}{separator}schema={}&options=-c%20lock_timeout%3D1500ms",
        schema.name()
    );
    let settings = PostgresSettings {
        lock_timeout: Duration::from_millis(2500),
        turn_idle_timeout: Duration::from_millis(4000),
        statement_timeout: Duration::from_millis(7000),
        ..PostgresSettings::default()
    };
    // `[server]`'s limits, unless the URL sets its own.
    let mut tuned =
        PostgresStore::open(&PostgresTarget::parse(&url).unwrap().with_settings(settings)).unwrap();
    assert_eq!(tuned.setting("lock_timeout"), "1500ms");
    assert_eq!(tuned.setting("idle_in_transaction_session_timeout"), "4s");
    assert_eq!(tuned.setting("statement_timeout"), "7s");
    // A server that answers commits before they are durable is not
    // believed: the store's sessions wait for the disk.
    assert_eq!(tuned.setting("synchronous_commit"), "on");
}

#[test]
fn a_statement_that_runs_too_long_fails_the_turn_and_frees_the_lock() {
    let schema = TestSchema::new();
    let settings = PostgresSettings {
        statement_timeout: Duration::from_millis(300),
        ..PostgresSettings::default()
    };
    let target = schema.target.clone().with_settings(settings);
    let mut store = PostgresStore::open(&target).unwrap();
    store.begin_turn().unwrap();
    let error = store
        .run("sleeping", |client, _| {
            client.batch_execute("SELECT pg_sleep(5)")
        })
        .unwrap_err();
    assert!(
        error
            .0
            .contains("canceling statement due to statement timeout"),
        "{error}"
    );
    let mut other = PostgresStore::open(&schema.target).unwrap();
    other.begin_turn().unwrap();
    other.commit(&[]).unwrap();
}

#[test]
fn a_replica_uses_one_connection_of_its_pool_and_is_refused_when_none_is_free() {
    let schema = TestSchema::new();
    let settings = PostgresSettings {
        pool_size: 1,
        pool_wait_timeout: Duration::from_millis(200),
        ..PostgresSettings::default()
    };
    let target = schema.target.clone().with_settings(settings);
    let mut store = PostgresStore::open(&target).unwrap();
    // Turn after turn on one connection: the pool gives the same one back.
    let mut pids = std::collections::BTreeSet::new();
    for n in 0..5u8 {
        store.begin_turn().unwrap();
        pids.insert(store.backend_pid());
        store.commit(&[put(Kind::Meta, b"n", &[n])]).unwrap();
    }
    assert_eq!(pids.len(), 1, "{pids:?}");
    // A turn holds the only connection: a second one is not made.
    store.begin_turn().unwrap();
    let pool = store.pool.clone();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let waited = runtime.block_on(pool.get()).unwrap_err();
    assert!(
        matches!(
            waited,
            deadpool_postgres::PoolError::Timeout(deadpool_postgres::TimeoutType::Wait)
        ),
        "{waited}"
    );
    store.commit(&[]).unwrap();
    assert!(runtime.block_on(pool.get()).is_ok());
}

#[test]
fn opening_creates_the_tables_then_finds_them_current() {
    let mut schema = TestSchema::new();
    assert!(schema.tables().is_empty());
    let store = PostgresStore::open(&schema.target).unwrap();
    assert_eq!(
        store.opened(),
        postgres::Opened {
            found: 0,
            version: SCHEMA_VERSION
        }
    );
    assert_eq!(
        store.opened().describe(),
        Some(format!(
            "created the tables (schema version {SCHEMA_VERSION})"
        ))
    );
    assert_eq!(store.name(), "postgres");
    drop(store);
    assert_eq!(schema.tables(), TABLES);
    assert_eq!(schema.version(), SCHEMA_VERSION as i32);
    let store = PostgresStore::open(&schema.target).unwrap();
    assert_eq!(store.opened().found, SCHEMA_VERSION);
    assert_eq!(store.opened().describe(), None);
}

#[test]
fn opening_without_migrating_refuses_a_schema_to_create_or_migrate_untouched() {
    let mut schema = TestSchema::new();
    let error = PostgresStore::open_current(&schema.target).unwrap_err();
    assert!(
        error.0.ends_with(&format!(
            "has no toolgate tables in schema {}; this toolgate needs version {SCHEMA_VERSION}: \
             run `toolgate store migrate`, or serve with --migrate",
            schema.name()
        )),
        "{error}"
    );
    assert!(schema.tables().is_empty());
    const OLDER: &[Migration] = &[create_v1_tables, create_v2_commit_count];
    drop(PostgresStore::open_with(&schema.target, OLDER).unwrap());
    let error = PostgresStore::open_current(&schema.target).unwrap_err();
    assert!(
        error.0.contains(&format!(
            "has schema version 2; this toolgate needs version {SCHEMA_VERSION}"
        )),
        "{error}"
    );
    assert_eq!(schema.version(), 2);
    drop(PostgresStore::open(&schema.target).unwrap());
    let current = PostgresStore::open_current(&schema.target).unwrap();
    assert_eq!(current.opened().found, SCHEMA_VERSION);
}

fn add_extra(transaction: &Connection<'_>, schema: &str) -> Result<(), tokio_postgres::Error> {
    transaction.batch_execute(&format!("CREATE TABLE {schema}.extra (x integer)"))
}

fn fail(transaction: &Connection<'_>, schema: &str) -> Result<(), tokio_postgres::Error> {
    transaction.batch_execute(&format!("SELECT * FROM {schema}.no_such_table"))
}

#[test]
fn an_older_schema_migrates_in_one_transaction_and_a_newer_is_refused_untouched() {
    let mut schema = TestSchema::new();
    let mut store = PostgresStore::open(&schema.target).unwrap();
    store.commit(&[put(Kind::Pin, b"p", b"1")]).unwrap();
    drop(store);
    // A migration that fails leaves the current version as it was.
    let then = |steps: &[Migration]| -> Vec<Migration> {
        postgres::MIGRATIONS.iter().chain(steps).copied().collect()
    };
    let (current, next) = (SCHEMA_VERSION, SCHEMA_VERSION + 1);
    let error = PostgresStore::open_with(&schema.target, &then(&[add_extra, fail])).unwrap_err();
    assert!(
        error.0.contains(&format!(
            "migrating from schema version {next} to {}",
            next + 1
        )),
        "{error}"
    );
    assert_eq!(schema.tables(), TABLES);
    assert_eq!(schema.version(), current as i32);
    // One step further.
    let later = then(&[add_extra]);
    let store = PostgresStore::open_with(&schema.target, &later).unwrap();
    assert_eq!(
        store.opened().describe(),
        Some(format!(
            "migrated the schema from version {current} to {next}"
        ))
    );
    drop(store);
    let with_extra = [
        "commits",
        "extra",
        "records",
        "schema_version",
        "tokens",
        "transitions",
    ];
    assert_eq!(schema.tables(), with_extra);
    assert_eq!(schema.version(), next as i32);
    // This binary knows its own version only: the next is refused, untouched.
    let rows = schema.rows();
    let error = PostgresStore::open(&schema.target).unwrap_err();
    assert!(
        error.0.contains(&format!(
            "has schema version {next}; this toolgate knows up to {current}: upgrade toolgate"
        )),
        "{error}"
    );
    assert_eq!(schema.tables(), with_extra);
    assert_eq!(schema.version(), next as i32);
    assert_eq!(schema.rows(), rows);
    // And the refused open let go of the store's lock.
    PostgresStore::open_with(&schema.target, &later).unwrap();
}

#[test]
fn a_version_1_schema_is_migrated_to_the_latest_and_keeps_its_records() {
    let mut schema = TestSchema::new();
    let name = schema.name().to_string();
    // Version 1 as the first release made it.
    schema.execute(&format!(
        "CREATE SCHEMA {name}; \
         CREATE TABLE {name}.schema_version (version integer NOT NULL CHECK (version > 0), \
             one boolean PRIMARY KEY DEFAULT true CHECK (one)); \
         INSERT INTO {name}.schema_version (version) VALUES (1); \
         CREATE TABLE {name}.records (kind smallint NOT NULL, key bytea NOT NULL, \
             value bytea NOT NULL, PRIMARY KEY (kind, key)); \
         INSERT INTO {name}.records VALUES ({}, 'r', '1')",
        postgres::kind_code(Kind::Receipt)
    ));
    let mut store = PostgresStore::open(&schema.target).unwrap();
    assert_eq!(
        store.opened().describe(),
        Some(format!(
            "migrated the schema from version 1 to {SCHEMA_VERSION}"
        ))
    );
    assert_eq!(contents(&mut store), expect(&[(Kind::Receipt, b"r", b"1")]));
    store.commit(&[put(Kind::Receipt, b"s", b"2")]).unwrap();
    drop(store);
    assert_eq!(schema.tables(), TABLES);
    assert_eq!(schema.version(), SCHEMA_VERSION as i32);
}

/// Version 3 to 4: every decided call id's key gains the undated prefix,
/// tombstones included; other kinds' keys stay.
#[test]
fn a_version_3_schema_gets_its_decided_call_keys_dated() {
    let mut schema = TestSchema::new();
    let store = PostgresStore::open_with(&schema.target, &postgres::MIGRATIONS[..3]).unwrap();
    drop(store);
    let [(c1, dated_c1), (c2, dated_c2)] = [b"c1", b"c2"].map(|name| first_schema_call_key(name));
    let session = crate::domain::records::key(&[b"host", b"session"]);
    let (calls, sessions) = (
        postgres::kind_code(Kind::DecidedCall),
        postgres::kind_code(Kind::Session),
    );
    let name = schema.name().to_string();
    let insert =
        format!("INSERT INTO {name}.records (kind, key, value, seq) VALUES ($1, $2, $3, 1)");
    // The second call id is a tombstone (value NULL).
    let rows = [
        (calls, c1, Some(b"v1".to_vec())),
        (calls, c2, None),
        (sessions, session.clone(), Some(b"s".to_vec())),
    ];
    for (kind, key, value) in &rows {
        schema.admin.execute(&insert, &[kind, key, value]).unwrap();
    }
    let mut store = PostgresStore::open(&schema.target).unwrap();
    assert_eq!(
        store.opened().describe(),
        Some(format!(
            "migrated the schema from version 3 to {SCHEMA_VERSION}"
        ))
    );
    assert_eq!(
        contents(&mut store),
        expect(&[
            (Kind::Session, &session, b"s"),
            (Kind::DecidedCall, &dated_c1, b"v1"),
        ])
    );
    drop(store);
    let mut keys: Vec<(i16, Vec<u8>)> = schema
        .admin
        .query(&format!("SELECT kind, key FROM {name}.records"), &[])
        .unwrap()
        .iter()
        .map(|row| (row.get(0), row.get(1)))
        .collect();
    keys.sort();
    let mut want = vec![(calls, dated_c1), (calls, dated_c2), (sessions, session)];
    want.sort();
    assert_eq!(keys, want);
}

/// A replica left running while another toolgate migrates the schema stops:
/// every turn and read refuses, naming the versions, and lets go of the
/// store's lock.
#[test]
fn a_replica_whose_schema_was_migrated_under_it_refuses_every_turn() {
    let mut schema = TestSchema::new();
    let mut store = PostgresStore::open(&schema.target).unwrap();
    store.load().unwrap();
    store.commit(&[put(Kind::Pin, b"p", b"1")]).unwrap();
    let name = schema.name().to_string();
    schema.execute(&format!(
        "UPDATE {name}.schema_version SET version = version + 1"
    ));
    let next = SCHEMA_VERSION + 1;
    let refused = |result: crate::store::StoreResult<()>| {
        let error = result.unwrap_err();
        assert!(
            error.0.contains(&format!(
                "the schema is now version {next}, and this toolgate opened it at version \
                 {SCHEMA_VERSION}"
            )),
            "{error}"
        );
    };
    refused(store.begin_turn().map(drop));
    refused(store.commit(&[put(Kind::Pin, b"q", b"2")]));
    refused(store.catch_up().map(drop));
    refused(store.load().map(drop));
    // Never back: the writer stops asking it to resume.
    assert!(
        matches!(store.resume(), Resume::Final(Some(error)) if error.0.contains("migrated under this replica")),
        "not final"
    );
    // Nothing was written, and the lock is free for a toolgate of the new
    // version.
    let newer: Vec<Migration> = postgres::MIGRATIONS
        .iter()
        .copied()
        .chain([add_extra as Migration])
        .collect();
    let mut other = PostgresStore::open_with(&schema.target, &newer).unwrap();
    assert_eq!(contents(&mut other), expect(&[(Kind::Pin, b"p", b"1")]));
    other.begin_turn().unwrap();
    other.commit(&[put(Kind::Pin, b"r", b"3")]).unwrap();
}

#[test]
fn a_schema_that_is_not_a_store_is_refused_untouched() {
    let mut schema = TestSchema::new();
    let name = schema.name().to_string();
    schema.execute(&format!(
        "CREATE SCHEMA {name}; CREATE TABLE {name}.orders (id integer)"
    ));
    let error = PostgresStore::open(&schema.target).unwrap_err();
    assert!(
        error.0.contains(&format!(
            "schema {name} is not a toolgate store: it has tables (orders) but no schema_version"
        )),
        "{error}"
    );
    assert_eq!(schema.tables(), ["orders"]);
    // A schema_version that holds no version is not a store's either.
    schema.execute(&format!(
        "CREATE TABLE {name}.schema_version (version integer)"
    ));
    let error = PostgresStore::open(&schema.target).unwrap_err();
    assert!(
        error.0.contains("must hold one positive version"),
        "{error}"
    );
    assert_eq!(schema.tables(), ["orders", "schema_version"]);
}

#[test]
fn a_record_of_a_kind_this_toolgate_does_not_know_is_refused_at_load() {
    let mut schema = TestSchema::new();
    let mut store = PostgresStore::open(&schema.target).unwrap();
    schema.execute(&format!(
        "INSERT INTO {}.records VALUES (99, '\\x01', '\\x02')",
        schema.name()
    ));
    let error = store.load().unwrap_err();
    assert!(error.0.contains("a record of kind 99"), "{error}");
}

#[test]
fn a_lost_connection_fails_the_commit_and_frees_the_schema() {
    let mut schema = TestSchema::new();
    let mut store = PostgresStore::open(&schema.target).unwrap();
    store.commit(&[put(Kind::Receipt, b"r", b"1")]).unwrap();
    store.begin_turn().unwrap();
    schema.terminate(&mut store);
    let error = store.commit(&[put(Kind::Receipt, b"r", b"2")]).unwrap_err();
    assert!(
        error
            .0
            .starts_with(&format!("the PostgreSQL store at {}: ", schema.target)),
        "{error}"
    );
    // The lost turn's lock went with its session: another store takes a
    // turn at once.
    let mut other = PostgresStore::open(&schema.target).unwrap();
    other.begin_turn().unwrap();
    other.commit(&[]).unwrap();
    assert_eq!(contents(&mut other), expect(&[(Kind::Receipt, b"r", b"1")]));
}

#[test]
fn a_commit_count_moved_by_a_writer_without_the_lock_makes_the_next_turn_load_everything() {
    let mut schema = TestSchema::new();
    let mut store = PostgresStore::open(&schema.target).unwrap();
    store.load().unwrap();
    store.commit(&[put(Kind::Receipt, b"r", b"1")]).unwrap();
    store.begin_turn().unwrap();
    schema.execute(&format!("UPDATE {}.commits SET n = n + 1", schema.name()));
    let error = store.commit(&[put(Kind::Receipt, b"r", b"2")]).unwrap_err();
    assert!(error.0.contains("something else writes"), "{error}");
    // Memory holds the batch that was not committed: it is not the store's.
    assert_eq!(resumed(&mut store), Resume::NotCommitted);
    let turn = store.begin_turn().unwrap();
    assert!(matches!(turn.behind, Some(Behind::Everything(_))));
}

/// Resumes `store`, which must reach the server.
fn resumed(store: &mut PostgresStore) -> Resume {
    match store.resume() {
        Resume::Unreachable(error) => panic!("{error}"),
        other => other,
    }
}

#[test]
fn after_a_lost_connection_a_commit_that_did_not_take_effect_is_known_not_to_have() {
    let mut schema = TestSchema::new();
    let mut store = PostgresStore::open(&schema.target).unwrap();
    store.commit(&[put(Kind::Receipt, b"r", b"1")]).unwrap();
    store.begin_turn().unwrap();
    schema.terminate(&mut store);
    let lost = [put(Kind::Receipt, b"r", b"2"), put(Kind::Meta, b"m", b"2")];
    store.commit(&lost).unwrap_err();
    assert_eq!(resumed(&mut store), Resume::NotCommitted);
    // The state that made it is not the store's: the next turn loads
    // everything.
    let turn = store.begin_turn().unwrap();
    assert!(matches!(turn.behind, Some(Behind::Everything(_))));
    store.commit(&[put(Kind::Receipt, b"s", b"3")]).unwrap();
    drop(store);
    let mut reopened = PostgresStore::open(&schema.target).unwrap();
    assert_eq!(
        contents(&mut reopened),
        expect(&[(Kind::Receipt, b"r", b"1"), (Kind::Receipt, b"s", b"3")])
    );
}

#[test]
fn after_a_lost_answer_the_commit_that_took_effect_is_known_to_have() {
    let schema = TestSchema::new();
    let mut store = PostgresStore::open(&schema.target).unwrap();
    let mut other = PostgresStore::open(&schema.target).unwrap();
    store.load().unwrap();
    store.commit(&[put(Kind::Receipt, b"r", b"1")]).unwrap();
    store.lose_next_answer = true;
    store.begin_turn().unwrap();
    store.commit(&[put(Kind::Receipt, b"r", b"2")]).unwrap_err();
    // Another replica commits meanwhile: the lost commit is still found.
    other.commit(&[put(Kind::Receipt, b"o", b"1")]).unwrap();
    assert_eq!(resumed(&mut store), Resume::Committed);
    // And the next turn reads the other's commit, not its own again.
    let Some(Behind::Changes(changes)) = store.begin_turn().unwrap().behind else {
        panic!("behind by the other's commit");
    };
    assert_eq!(changes, [put(Kind::Receipt, b"o", b"1")]);
    store.commit(&[put(Kind::Receipt, b"r", b"3")]).unwrap();
    drop(store);
    let mut reopened = PostgresStore::open(&schema.target).unwrap();
    assert_eq!(
        contents(&mut reopened),
        expect(&[(Kind::Receipt, b"o", b"1"), (Kind::Receipt, b"r", b"3")])
    );
}

#[test]
fn the_database_refuses_two_receipts_of_one_call() {
    let schema = TestSchema::new();
    let mut store = PostgresStore::open(&schema.target).unwrap();
    let receipt = |at: u64, call_id: &str| {
        crate::domain::records::key(&[
            &crate::domain::records::time_part(crate::domain::clock::Timestamp(at)),
            b"host",
            b"actor",
            call_id.as_bytes(),
        ])
    };
    store
        .commit(&[put(Kind::Receipt, &receipt(1, "c1"), b"first")])
        .unwrap();
    // Another receipt of the same call, later: refused at commit, nothing
    // of the commit kept.
    let error = store
        .commit(&[
            put(Kind::Receipt, &receipt(2, "c1"), b"second"),
            put(Kind::Meta, b"m", b"1"),
        ])
        .unwrap_err();
    assert!(error.0.contains("receipts_once"), "{error}");
    let mut store = PostgresStore::open(&schema.target).unwrap();
    assert_eq!(
        contents(&mut store),
        expect(&[(Kind::Receipt, &receipt(1, "c1"), b"first")])
    );
    // Another call, or the same one once its receipt is gone, is let in.
    store
        .commit(&[
            delete(Kind::Receipt, &receipt(1, "c1")),
            put(Kind::Receipt, &receipt(2, "c1"), b"again"),
            put(Kind::Receipt, &receipt(2, "c2"), b"other"),
        ])
        .unwrap();
}

#[test]
fn tombstones_are_purged_and_a_replica_behind_them_loads_everything() {
    let schema = TestSchema::new();
    let mut behind = PostgresStore::open(&schema.target).unwrap();
    behind.load().unwrap();
    let mut busy = PostgresStore::open(&schema.target).unwrap();
    busy.commit(&[put(Kind::Receipt, b"gone", b"1")]).unwrap();
    busy.commit(&[delete(Kind::Receipt, b"gone")]).unwrap();
    for n in 0..super::super::postgres::KEEP_COMMITS + super::super::postgres::PURGE_EVERY {
        busy.commit(&[put(Kind::Meta, b"n", &n.to_be_bytes())])
            .unwrap();
    }
    let tombstones: i64 = connect(busy.target())
        .query_one(
            &format!(
                "SELECT count(*) FROM {}.records WHERE value IS NULL",
                schema.name()
            ),
            &[],
        )
        .unwrap()
        .get(0);
    assert_eq!(tombstones, 0);
    // Between turns nothing is read: everything waits for a turn.
    assert!(behind.catch_up().unwrap().is_none());
    let Some(Behind::Everything(all)) = behind.begin_turn().unwrap().behind else {
        panic!("too far behind for the changes");
    };
    assert_eq!(all.len(), 1);
    behind.commit(&[]).unwrap();
}

#[test]
fn a_batch_writes_each_record_once_as_its_last_change_says() {
    let mut schema = TestSchema::new();
    let mut store = PostgresStore::open(&schema.target).unwrap();
    // Many records of every kind in one commit, some of them changed twice.
    let mut changes = Vec::new();
    for index in 0..2_000u32 {
        let kind = Kind::ALL[index as usize % Kind::ALL.len()];
        changes.push(put(kind, &index.to_be_bytes(), b"first"));
        if index % 3 == 0 {
            changes.push(put(kind, &index.to_be_bytes(), &index.to_le_bytes()));
        }
        if index % 5 == 0 {
            changes.push(delete(kind, &index.to_be_bytes()));
        }
    }
    store.commit(&changes).unwrap();
    let rows = schema.rows();
    let kept = (0..2_000u32).filter(|index| index % 5 != 0).count();
    assert_eq!(rows.len(), kept);
    for (kind, key, value) in rows {
        let index = u32::from_be_bytes(key.as_slice().try_into().unwrap());
        assert_eq!(
            kind,
            postgres::kind_code(Kind::ALL[index as usize % Kind::ALL.len()])
        );
        let expected: &[u8] = if index % 3 == 0 {
            &index.to_le_bytes()
        } else {
            b"first"
        };
        assert_eq!(value, expected);
    }
    assert!(store.size_bytes() > 0);
}

/// A catch-up whose connection is lost after it read what another replica
/// committed, but before its read-only transaction ended, has taken none of
/// it in: the next turn reads it (it was skipped for good, so a grant the
/// other consumed could be consumed again here).
#[test]
fn a_catch_up_lost_before_it_ends_takes_nothing_in() {
    let schema = TestSchema::new();
    let mut first = PostgresStore::open(&schema.target).unwrap();
    let mut second = PostgresStore::open(&schema.target).unwrap();
    first.begin_turn().unwrap();
    first.commit(&[]).unwrap();
    // The second commits a consumed grant (say) the first has not seen.
    second.begin_turn().unwrap();
    second
        .commit(&[put(Kind::ApprovalChange, b"consumed", b"1")])
        .unwrap();
    let target = schema.target.clone();
    first.before_release = Some(Box::new(move |pid| {
        let mut admin = connect(&target);
        let ended: bool = admin
            .query_one("SELECT pg_terminate_backend($1)", &[&pid])
            .unwrap()
            .get(0);
        assert!(ended);
        std::thread::sleep(Duration::from_millis(200));
    }));
    first.catch_up().unwrap_err();
    // The writer's reconnect: nothing was being committed.
    assert_eq!(resumed(&mut first), Resume::NotCommitted);
    let Some(Behind::Changes(changes)) = first.begin_turn().unwrap().behind else {
        panic!("the first's next turn hands back nothing: the second's commit is skipped");
    };
    assert_eq!(changes, [put(Kind::ApprovalChange, b"consumed", b"1")]);
    first.commit(&[]).unwrap();
}

/// A commit whose fate a resume never learned (the writer gave it up and
/// forgot what it had seen) is in what the next turn loads: a later resume
/// does not find it again and move the replica back to before it.
#[test]
fn a_commit_given_up_is_not_found_again_after_the_next_turn() {
    let schema = TestSchema::new();
    let mut store = PostgresStore::open(&schema.target).unwrap();
    let mut other = PostgresStore::open(&schema.target).unwrap();
    store.load().unwrap();
    store.lose_next_answer = true;
    store.begin_turn().unwrap();
    store.commit(&[put(Kind::Receipt, b"r", b"1")]).unwrap_err();
    // What the writer leaves when a resume stayed unreachable and it gave
    // the commit up.
    store.give_up_commit();
    other.commit(&[put(Kind::Receipt, b"o", b"1")]).unwrap();
    let Some(Behind::Everything(_)) = store.begin_turn().unwrap().behind else {
        panic!("a replica that gave a commit up loads everything");
    };
    store.commit(&[]).unwrap();
    // A lost connection later: nothing is being committed now.
    assert_eq!(resumed(&mut store), Resume::NotCommitted);
    assert!(
        store.begin_turn().unwrap().behind.is_none(),
        "the replica went back to before commits it had loaded"
    );
    store.commit(&[]).unwrap();
}
