//! What only the SQLite store has: its directory and lock, schema versions,
//! `check` and `backup`.

use std::fs;
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use rusqlite::{Connection, Transaction};

use super::*;
use crate::store::sqlite::{self, DB_FILE, SCHEMA_VERSION};

/// A new owner-only directory `name` in `parent`, as an operator restoring
/// a backup makes one (`mkdir -m 700`).
pub(super) fn private_dir(parent: &Path, name: &str) -> PathBuf {
    let dir = parent.join(name);
    fs::DirBuilder::new().mode(0o700).create(&dir).unwrap();
    dir
}

fn mode(path: &Path) -> u32 {
    fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// A store in a new directory `data` of `parent`, holding `changes`, closed.
fn stopped_store(parent: &Path, changes: &[Change]) -> PathBuf {
    let dir = parent.join("data");
    let mut store = SqliteStore::open(&dir).unwrap();
    store.commit(changes).unwrap();
    drop(store);
    dir
}

fn user_version(db: &Path) -> u32 {
    Connection::open(db)
        .unwrap()
        .query_row("PRAGMA user_version", [], |row| row.get(0))
        .unwrap()
}

/// The directory's files (name and bytes), the lock file left out.
fn files(dir: &Path) -> BTreeMap<String, Vec<u8>> {
    fs::read_dir(dir)
        .unwrap()
        .map(|entry| entry.unwrap())
        .filter(|entry| entry.file_name() != sqlite::LOCK_FILE)
        .map(|entry| {
            (
                entry.file_name().into_string().unwrap(),
                fs::read(entry.path()).unwrap(),
            )
        })
        .collect()
}

fn counts(report_tables: &[sqlite::TableCount]) -> BTreeMap<String, u64> {
    report_tables
        .iter()
        .map(|table| (table.table.clone(), table.records))
        .collect()
}

// ----- the directory and the lock ---------------------------------------------

#[test]
fn a_second_open_is_refused_while_the_first_lives() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("data");
    let mut first = SqliteStore::open(&dir).unwrap();
    first.commit(&[put(Kind::Meta, b"m", b"1")]).unwrap();
    let error = SqliteStore::open(&dir).unwrap_err();
    assert!(
        error.0.contains(&format!(
            "another toolgate process (pid {})",
            std::process::id()
        )) && error.0.contains(&format!("holds {}", dir.display())),
        "{error}"
    );
    // The refusal changed nothing: the first still commits.
    first.commit(&[put(Kind::Meta, b"m", b"2")]).unwrap();
    drop(first);
    let mut second = SqliteStore::open(&dir).unwrap();
    assert_eq!(contents(&mut second), expect(&[(Kind::Meta, b"m", b"2")]));
}

#[test]
fn the_directory_is_created_owner_only() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("a/b/data");
    let store = SqliteStore::open(&dir).unwrap();
    assert_eq!(mode(&dir), 0o700);
    assert_eq!(mode(&dir.join(DB_FILE)), 0o600);
    assert_eq!(mode(&dir.join(sqlite::LOCK_FILE)), 0o600);
    assert_eq!(mode(&dir.join(format!("{DB_FILE}-wal"))), 0o600);
    assert_eq!(store.dir(), dir);
}

#[test]
fn a_directory_group_or_others_can_reach_is_refused() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("data");
    for loose in [0o755, 0o750, 0o710, 0o701, 0o777] {
        fs::create_dir_all(&dir).unwrap();
        fs::set_permissions(&dir, fs::Permissions::from_mode(loose)).unwrap();
        let error = SqliteStore::open(&dir).unwrap_err();
        assert!(
            error.0.contains(&format!("chmod 700 {}", dir.display()))
                && error.0.contains(&format!("mode {loose:04o}")),
            "{error}"
        );
        assert!(!dir.join(DB_FILE).exists(), "nothing is created");
    }
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
    SqliteStore::open(&dir).unwrap();
    // A file where the directory should be.
    let file = parent.path().join("file");
    fs::write(&file, b"").unwrap();
    let error = SqliteStore::open(&file).unwrap_err();
    assert!(error.0.contains("is not a directory"), "{error}");
}

/// A 0700 directory of another user's is refused: that user could rewrite
/// approvals and receipts. (Only root can give a directory away; as
/// another user the refusal cannot arise, and `chown` says so.)
#[test]
fn a_data_directory_of_another_user_is_refused() {
    let parent = tempfile::tempdir().unwrap();
    let dir = private_dir(parent.path(), "data");
    match std::os::unix::fs::chown(&dir, Some(65534), None) {
        Ok(()) => {
            let error = SqliteStore::open(&dir).unwrap_err();
            assert!(error.0.contains("belongs to uid 65534"), "{error}");
            assert_eq!(fs::read_dir(&dir).unwrap().count(), 0, "nothing written");
        }
        Err(error) => assert_eq!(error.kind(), std::io::ErrorKind::PermissionDenied),
    }
}

#[test]
fn a_file_that_is_not_a_database_is_refused_untouched() {
    let parent = tempfile::tempdir().unwrap();
    let dir = private_dir(parent.path(), "data");
    let garbage = b"not a database, just some text that is long enough".repeat(200);
    fs::write(dir.join(DB_FILE), &garbage).unwrap();
    let error = SqliteStore::open(&dir).unwrap_err();
    assert!(error.0.contains("not a database"), "{error}");
    assert_eq!(fs::read(dir.join(DB_FILE)).unwrap(), garbage);
}

/// A database file that is missing or empty beside a write-ahead log
/// holding commits is refused, by `serve` and `store check`, and the log
/// is left as it is: SQLite would open an empty store and delete the log.
#[test]
fn an_empty_database_beside_its_log_is_refused_and_the_log_kept() {
    let parent = tempfile::tempdir().unwrap();
    let wal_of = |dir: &Path| dir.join(format!("{DB_FILE}-wal"));
    let log = b"commits of a store whose database file was lost".repeat(100);
    for (name, empty) in [("emptied", true), ("removed", false)] {
        let dir = private_dir(parent.path(), name);
        if empty {
            fs::write(dir.join(DB_FILE), b"").unwrap();
        }
        fs::write(wal_of(&dir), &log).unwrap();
        let error = SqliteStore::open(&dir).unwrap_err();
        assert!(error.0.contains("write-ahead log holds"), "{error}");
        if empty {
            let error = sqlite::check(&dir).unwrap_err();
            assert!(error.0.contains("write-ahead log holds"), "{error}");
        }
        assert_eq!(fs::read(wal_of(&dir)).unwrap(), log);
    }
}

// ----- schema versions --------------------------------------------------------

#[test]
fn a_newer_schema_is_refused_and_left_unchanged() {
    let parent = tempfile::tempdir().unwrap();
    let dir = stopped_store(parent.path(), &[put(Kind::Pin, b"p", b"1")]);
    let db = dir.join(DB_FILE);
    Connection::open(&db)
        .unwrap()
        .pragma_update(None, "user_version", SCHEMA_VERSION + 1)
        .unwrap();
    let before = files(&dir);
    let error = SqliteStore::open(&dir).unwrap_err();
    assert_eq!(
        error.0,
        format!(
            "the store at {} has schema version {}; this toolgate knows up to {SCHEMA_VERSION}: \
             upgrade toolgate",
            dir.display(),
            SCHEMA_VERSION + 1
        )
    );
    assert_eq!(files(&dir), before);
    // check says the same, as a problem of the store.
    let report = sqlite::check(&dir).unwrap();
    assert!(!report.ok());
    assert!(
        report.problems[0].contains("upgrade toolgate"),
        "{report:?}"
    );
    // And backup refuses it.
    let error = sqlite::backup(&dir, &parent.path().join("copy")).unwrap_err();
    assert!(error.0.contains("upgrade toolgate"), "{error}");
    assert!(!parent.path().join("copy").exists());
}

/// A file that had a table once: version 0, no tables, a database.
#[test]
fn a_version_0_file_migrates() {
    let parent = tempfile::tempdir().unwrap();
    let dir = private_dir(parent.path(), "used");
    Connection::open(dir.join(DB_FILE))
        .unwrap()
        .execute_batch("CREATE TABLE t(x); INSERT INTO t VALUES (1); DROP TABLE t;")
        .unwrap();
    assert!(fs::metadata(dir.join(DB_FILE)).unwrap().len() > 0);
    assert_eq!(user_version(&dir.join(DB_FILE)), 0);
    let mut store = SqliteStore::open(&dir).unwrap();
    store.commit(&every_kind()).unwrap();
    drop(store);
    assert_eq!(user_version(&dir.join(DB_FILE)), SCHEMA_VERSION);
    let report = sqlite::check(&dir).unwrap();
    assert!(report.ok(), "{report:?}");
    assert_eq!(report.tables.len(), Kind::ALL.len());
    assert!(report.tables.iter().all(|table| table.records == 3));
}

/// An empty database file is a store that lost its contents (toolgate
/// never leaves one): refused by `serve`, `store check` and `store backup`
/// and left as it is, not opened as a new store on which every committed
/// Dispatch would commit again.
#[test]
fn an_empty_database_file_is_refused_not_taken_for_a_new_store() {
    let parent = tempfile::tempdir().unwrap();
    let dir = private_dir(parent.path(), "emptied");
    fs::File::create(dir.join(DB_FILE)).unwrap();
    let error = SqliteStore::open(&dir).unwrap_err();
    assert!(error.0.contains("is empty (0 bytes)"), "{error}");
    let error = sqlite::check(&dir).unwrap_err();
    assert!(error.0.contains("is empty (0 bytes)"), "{error}");
    let error = sqlite::backup(&dir, &parent.path().join("copy")).unwrap_err();
    assert!(error.0.contains("is empty (0 bytes)"), "{error}");
    assert_eq!(fs::metadata(dir.join(DB_FILE)).unwrap().len(), 0);
    assert!(!parent.path().join("copy").exists());
}

/// A directory that held a store and lost its database (deleted, moved,
/// half copied) after a clean stop, which leaves no write-ahead log, is
/// refused, not opened as a new store on which every committed Dispatch
/// would commit again; a store made before the marker gets it at its next
/// open; removing the marker is how to start afresh.
#[test]
fn a_directory_that_lost_its_database_is_not_a_new_store() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("data");
    let mut store = SqliteStore::open(&dir).unwrap();
    store.commit(&receipts(0, 3)).unwrap();
    drop(store);
    assert_eq!(mode(&dir.join(sqlite::CREATED_FILE)), 0o600);
    fs::rename(dir.join(DB_FILE), parent.path().join("moved")).unwrap();
    assert!(!dir.join(format!("{DB_FILE}-wal")).exists());
    let error = SqliteStore::open(&dir).unwrap_err();
    assert!(
        error
            .0
            .contains("is missing, but the directory held a store"),
        "{error}"
    );
    assert!(!dir.join(DB_FILE).exists(), "nothing made in its place");

    // Put back, it opens; a store without the marker (made by an older
    // toolgate) is given one.
    fs::rename(parent.path().join("moved"), dir.join(DB_FILE)).unwrap();
    fs::remove_file(dir.join(sqlite::CREATED_FILE)).unwrap();
    let mut store = SqliteStore::open(&dir).unwrap();
    assert_eq!(contents(&mut store).len(), 3);
    drop(store);
    assert!(dir.join(sqlite::CREATED_FILE).exists());

    // Without the marker, a directory without a database is a new store.
    fs::remove_file(dir.join(DB_FILE)).unwrap();
    fs::remove_file(dir.join(sqlite::CREATED_FILE)).unwrap();
    let mut store = SqliteStore::open(&dir).unwrap();
    assert!(contents(&mut store).is_empty());
}

/// A new store's database takes its name only with its schema in it; the
/// leftover of a creation that crashed (a half-made file under the
/// creating name, its journal) is discarded.
#[test]
fn a_new_store_is_made_whole_before_it_takes_its_name() {
    let parent = tempfile::tempdir().unwrap();
    let dir = private_dir(parent.path(), "data");
    let creating = dir.join(sqlite::CREATING_FILE);
    fs::write(&creating, b"half a database").unwrap();
    fs::write(dir.join(format!("{}-journal", sqlite::CREATING_FILE)), b"j").unwrap();
    let store = SqliteStore::open(&dir).unwrap();
    assert_eq!(user_version(&dir.join(DB_FILE)), SCHEMA_VERSION);
    let mode = fs::metadata(dir.join(DB_FILE))
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    assert!(!creating.exists());
    assert!(
        !dir.join(format!("{}-journal", sqlite::CREATING_FILE))
            .exists()
    );
    drop(store);
    let report = sqlite::check(&dir).unwrap();
    assert!(report.ok(), "{report:?}");
}

/// Version 1 to 2: every decided call id's key gains the undated prefix,
/// its value and every other table unchanged.
#[test]
fn a_version_1_store_gets_its_decided_call_keys_dated() {
    let parent = tempfile::tempdir().unwrap();
    let dir = private_dir(parent.path(), "data");
    let mut connection = Connection::open(dir.join(DB_FILE)).unwrap();
    sqlite::migrate(&mut connection, &dir, &sqlite::MIGRATIONS[..1]).unwrap();
    let [(c1, dated_c1), (c2, dated_c2)] = [b"c1", b"c2"].map(|name| first_schema_call_key(name));
    let session = crate::domain::records::key(&[b"host", b"session"]);
    let rows = [
        ("decided_calls", c1, b"v1".to_vec()),
        ("decided_calls", c2, b"v2".to_vec()),
        ("sessions", session.clone(), b"s".to_vec()),
    ];
    for (table, key, value) in &rows {
        connection
            .execute(
                &format!("INSERT INTO {table} (k, v) VALUES (?1, ?2)"),
                rusqlite::params![key, value],
            )
            .unwrap();
    }
    drop(connection);
    assert_eq!(user_version(&dir.join(DB_FILE)), 1);
    // `store check` sees the records as the next start will, migrated (it
    // counted no tables and restored nothing of an older schema), and
    // changes nothing.
    let handed = std::sync::Mutex::new(Vec::new());
    let report = sqlite::check_records(&dir, &|records| {
        *handed.lock().unwrap() = records;
        Ok(())
    })
    .unwrap();
    assert!(report.ok(), "{report:?}");
    assert_eq!(report.schema_version, 1);
    let count = |table: &str| {
        report
            .tables
            .iter()
            .find(|t| t.table == table)
            .unwrap()
            .records
    };
    assert_eq!((count("decided_calls"), count("sessions")), (2, 1));
    let mut keys: Vec<Vec<u8>> = handed
        .lock()
        .unwrap()
        .iter()
        .map(|r| r.key.clone())
        .collect();
    keys.sort();
    let mut dated = vec![dated_c1.clone(), dated_c2.clone(), session.clone()];
    dated.sort();
    assert_eq!(keys, dated);
    let refused = sqlite::check_records(&dir, &|_| Err("a record that does not decode".into()));
    assert_eq!(
        refused.unwrap().problems,
        ["the records do not restore: a record that does not decode"]
    );
    assert_eq!(user_version(&dir.join(DB_FILE)), 1);
    let mut store = SqliteStore::open(&dir).unwrap();
    assert_eq!(
        contents(&mut store),
        expect(&[
            (Kind::Session, &session, b"s"),
            (Kind::DecidedCall, &dated_c1, b"v1"),
            (Kind::DecidedCall, &dated_c2, b"v2"),
        ])
    );
    drop(store);
    assert_eq!(user_version(&dir.join(DB_FILE)), SCHEMA_VERSION);
    let report = sqlite::check(&dir).unwrap();
    assert!(report.ok(), "{report:?}");
}

#[test]
fn a_version_0_file_with_tables_is_not_a_store() {
    let parent = tempfile::tempdir().unwrap();
    let dir = private_dir(parent.path(), "data");
    Connection::open(dir.join(DB_FILE))
        .unwrap()
        .execute_batch("CREATE TABLE meta(x); INSERT INTO meta VALUES (1);")
        .unwrap();
    let before = files(&dir);
    let error = SqliteStore::open(&dir).unwrap_err();
    assert!(error.0.contains("is not a toolgate store"), "{error}");
    assert_eq!(files(&dir), before);
    // `store check` says so too (it used to pass it: it looked at tables
    // only at the current schema version).
    let report = sqlite::check(&dir).unwrap();
    assert!(
        report
            .problems
            .iter()
            .any(|problem| problem.contains("is not a toolgate store")),
        "{report:?}"
    );
}

#[test]
fn every_kind_has_a_table_in_the_current_schema() {
    // A kind added without a migration would fail every open; this names it.
    let parent = tempfile::tempdir().unwrap();
    let dir = private_dir(parent.path(), "data");
    let mut connection = Connection::open(dir.join(DB_FILE)).unwrap();
    sqlite::migrate(&mut connection, &dir, sqlite::MIGRATIONS).unwrap();
    let tables: Vec<String> = connection
        .prepare("SELECT name FROM sqlite_schema WHERE type = 'table'")
        .unwrap()
        .query_map([], |row| row.get(0))
        .unwrap()
        .collect::<Result<_, _>>()
        .unwrap();
    for kind in Kind::ALL {
        assert!(tables.iter().any(|table| table == kind.table()), "{kind:?}");
    }
}

fn add_extra(transaction: &Transaction<'_>) -> rusqlite::Result<()> {
    transaction.execute_batch(
        "CREATE TABLE extra (k BLOB PRIMARY KEY NOT NULL, v BLOB NOT NULL) WITHOUT ROWID;
         INSERT INTO meta VALUES (x'01', x'02');",
    )
}

fn add_extra_then_fail(transaction: &Transaction<'_>) -> rusqlite::Result<()> {
    add_extra(transaction)?;
    transaction.execute_batch("INSERT INTO no_such_table VALUES (1)")
}

#[test]
fn migrations_apply_in_one_transaction_from_the_stored_version() {
    let parent = tempfile::tempdir().unwrap();
    let dir = stopped_store(parent.path(), &[put(Kind::Meta, b"m", b"1")]);
    let db = dir.join(DB_FILE);
    let tables = |connection: &Connection| -> Vec<String> {
        connection
            .prepare("SELECT name FROM sqlite_schema ORDER BY name")
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap()
    };
    // A failing next step: nothing of it stays, the version stays.
    let then = |step: sqlite::Migration| -> Vec<sqlite::Migration> {
        sqlite::MIGRATIONS.iter().copied().chain([step]).collect()
    };
    let mut connection = Connection::open(&db).unwrap();
    let before = tables(&connection);
    let error = sqlite::migrate(&mut connection, &dir, &then(add_extra_then_fail)).unwrap_err();
    assert!(
        error.0.contains(&format!(
            "migrating from schema version {SCHEMA_VERSION} to {}",
            SCHEMA_VERSION + 1
        )),
        "{error}"
    );
    assert_eq!(tables(&connection), before);
    assert_eq!(user_version(&db), SCHEMA_VERSION);
    // A working next step runs alone (the earlier ones are not run again).
    sqlite::migrate(&mut connection, &dir, &then(add_extra)).unwrap();
    assert_eq!(user_version(&db), SCHEMA_VERSION + 1);
    assert!(tables(&connection).contains(&"extra".to_string()));
    let metas: i64 = connection
        .query_row("SELECT count(*) FROM meta", [], |row| row.get(0))
        .unwrap();
    assert_eq!(metas, 2);
    // This binary, knowing only its own version, now refuses the store.
    drop(connection);
    let error = SqliteStore::open(&dir).unwrap_err();
    assert!(
        error
            .0
            .contains(&format!("schema version {}", SCHEMA_VERSION + 1)),
        "{error}"
    );
}

// ----- check ------------------------------------------------------------------

#[test]
fn check_reports_ok_and_counts() {
    let parent = tempfile::tempdir().unwrap();
    let mut changes = every_kind();
    changes.push(put(Kind::Receipt, b"one more", b"r"));
    let dir = stopped_store(parent.path(), &changes);
    let report = sqlite::check(&dir).unwrap();
    assert!(report.ok(), "{report:?}");
    assert_eq!(report.schema_version, SCHEMA_VERSION);
    assert_eq!(report.path, dir.join(DB_FILE));
    let found = counts(&report.tables);
    let expected: BTreeMap<String, u64> = Kind::ALL
        .iter()
        .map(|kind| {
            let records = if *kind == Kind::Receipt { 4 } else { 3 };
            (kind.table().to_string(), records)
        })
        .collect();
    assert_eq!(found, expected);
    assert_eq!(report.records(), 3 * Kind::ALL.len() as u64 + 1);
    assert!(report.bytes >= fs::metadata(dir.join(DB_FILE)).unwrap().len());
    // The check wrote nothing a store would read differently.
    let mut store = SqliteStore::open(&dir).unwrap();
    assert_eq!(contents(&mut store), as_map(&changes));
}

#[test]
fn check_reads_a_running_store_without_its_lock() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("data");
    let mut store = SqliteStore::open(&dir).unwrap();
    store.commit(&every_kind()).unwrap();
    let report = sqlite::check(&dir).unwrap();
    assert!(report.ok(), "{report:?}");
    assert_eq!(report.records(), 3 * Kind::ALL.len() as u64);
    // The running store keeps working, and the check sees its next commit.
    store
        .commit(&[delete(Kind::Meta, &every_kind()[0].key)])
        .unwrap();
    assert_eq!(
        sqlite::check(&dir).unwrap().records(),
        3 * Kind::ALL.len() as u64 - 1
    );
    assert_eq!(store.size_bytes(), sqlite::check(&dir).unwrap().bytes);
}

#[test]
fn check_names_what_is_missing() {
    let parent = tempfile::tempdir().unwrap();
    let error = sqlite::check(&parent.path().join("absent")).unwrap_err();
    assert!(error.0.starts_with("no store at"), "{error}");
    let dir = private_dir(parent.path(), "empty");
    let error = sqlite::check(&dir).unwrap_err();
    assert!(error.0.contains("holds no toolgate.sqlite3"), "{error}");
    assert!(!dir.join(DB_FILE).exists(), "check creates nothing");
    // Loose permissions: readable, but a problem (the server would refuse).
    let dir = stopped_store(parent.path(), &[put(Kind::Meta, b"m", b"1")]);
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o755)).unwrap();
    let report = sqlite::check(&dir).unwrap();
    assert!(!report.ok());
    assert!(report.problems[0].contains("chmod 700"), "{report:?}");
    assert_eq!(report.records(), 1);
    // A table gone.
    fs::set_permissions(&dir, fs::Permissions::from_mode(0o700)).unwrap();
    Connection::open(dir.join(DB_FILE))
        .unwrap()
        .execute_batch("DROP TABLE pins")
        .unwrap();
    let report = sqlite::check(&dir).unwrap();
    assert_eq!(
        report.problems,
        vec!["the pins table is missing".to_string()]
    );
}

#[test]
fn check_detects_a_damaged_data_page() {
    let parent = tempfile::tempdir().unwrap();
    let changes: Vec<Change> = (0..3000u32)
        .map(|index| put(Kind::Receipt, &index.to_be_bytes(), &bytes(300)))
        .collect();
    let dir = stopped_store(parent.path(), &changes);
    let db = dir.join(DB_FILE);
    assert!(
        !dir.join(format!("{DB_FILE}-wal")).exists(),
        "checkpointed at close"
    );
    // A leaf page of the receipts table, in the middle of the file.
    let (page, page_size): (i64, i64) = {
        let connection = Connection::open(&db).unwrap();
        let pages: Vec<i64> = connection
            .prepare("SELECT pageno FROM dbstat WHERE name = 'receipts' AND pagetype = 'leaf'")
            .unwrap()
            .query_map([], |row| row.get(0))
            .unwrap()
            .collect::<Result<_, _>>()
            .unwrap();
        let page_size = connection
            .query_row("PRAGMA page_size", [], |row| row.get(0))
            .unwrap();
        (pages[pages.len() / 2], page_size)
    };
    let mut image = fs::read(&db).unwrap();
    let start = ((page - 1) * page_size) as usize;
    assert!(
        start > image.len() / 4 && start < image.len() * 3 / 4,
        "mid-file"
    );
    // 0x0a: an index b-tree leaf (a WITHOUT ROWID table's rows).
    assert_eq!(image[start], 0x0a, "a data page");
    // Its header and cell pointers, overwritten.
    image[start..start + 64].fill(0x5a);
    fs::write(&db, &image).unwrap();

    let report = sqlite::check(&dir);
    assert!(
        report.as_ref().is_err() || !report.as_ref().unwrap().ok(),
        "{report:?}"
    );
    let report = report.unwrap();
    assert!(
        report
            .problems
            .iter()
            .any(|problem| problem.contains("integrity_check") || problem.contains("damaged")),
        "{report:?}"
    );
    // And recovery does not read it as if it were whole.
    let mut store = SqliteStore::open(&dir).unwrap();
    assert!(store.load().is_err());
}

// ----- backup -----------------------------------------------------------------

#[test]
fn a_backup_restores_as_a_store() {
    let parent = tempfile::tempdir().unwrap();
    let changes = every_kind();
    let dir = parent.path().join("data");
    let mut store = SqliteStore::open(&dir).unwrap();
    store.commit(&changes).unwrap();
    // Taken while the store is open (its lock held).
    let file = parent.path().join("backup.sqlite3");
    let report = sqlite::backup(&dir, &file).unwrap();
    assert_eq!(report.file, file);
    assert_eq!(report.schema_version, SCHEMA_VERSION);
    assert_eq!(report.records(), 3 * Kind::ALL.len() as u64);
    assert_eq!(report.bytes, fs::metadata(&file).unwrap().len());
    assert_eq!(mode(&file), 0o600);
    // One file: nothing beside it.
    let beside: Vec<_> = fs::read_dir(parent.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name())
        .collect();
    assert_eq!(beside.len(), 2, "{beside:?}");
    store
        .commit(&[put(Kind::Meta, b"after", b"the backup")])
        .unwrap();
    // The restore the module documents: a new 0700 directory, the file in
    // it as toolgate.sqlite3.
    let restored = private_dir(parent.path(), "restored");
    fs::copy(&file, restored.join(DB_FILE)).unwrap();
    let mut copy = SqliteStore::open(&restored).unwrap();
    assert_eq!(contents(&mut copy), as_map(&changes));
    copy.commit(&[put(Kind::Meta, b"restored", b"yes")])
        .unwrap();
    assert!(sqlite::check(&restored).unwrap().ok());
}

#[test]
fn a_backup_never_overwrites() {
    let parent = tempfile::tempdir().unwrap();
    let dir = stopped_store(parent.path(), &[put(Kind::Meta, b"m", b"1")]);
    let file = parent.path().join("existing");
    fs::write(&file, b"keep me").unwrap();
    let error = sqlite::backup(&dir, &file).unwrap_err();
    assert!(error.0.contains("never overwrites"), "{error}");
    assert_eq!(fs::read(&file).unwrap(), b"keep me");
    // Nor is a missing store backed up into an empty file.
    let error =
        sqlite::backup(&parent.path().join("absent"), &parent.path().join("new")).unwrap_err();
    assert!(error.0.starts_with("no store at"), "{error}");
    assert!(!parent.path().join("new").exists());
    // A file it cannot create: nothing left behind.
    let error = sqlite::backup(&dir, &parent.path().join("no/such/dir/file")).unwrap_err();
    assert!(error.0.contains("cannot create"), "{error}");
}

/// The copy takes its name only whole, under a partial name of its own
/// (`FILE.partial-PID`): a backup killed half-way leaves that, never
/// `FILE`; a leftover of the same name is replaced, never written into (a
/// link under that name, planted or left, keeps what it points to); and
/// two backups to one `FILE` never share a partial copy.
#[test]
fn a_backup_takes_its_name_only_whole() {
    let parent = tempfile::tempdir().unwrap();
    let dir = stopped_store(parent.path(), &[put(Kind::Meta, b"m", b"1")]);
    let partial = |name: &str| {
        parent
            .path()
            .join(format!("{name}.partial-{}", std::process::id()))
    };
    fs::write(
        partial("nightly"),
        b"half a copy from a backup that was killed",
    )
    .unwrap();
    fs::write(
        parent
            .path()
            .join(format!("nightly.partial-{}-journal", std::process::id())),
        b"j",
    )
    .unwrap();
    let file = parent.path().join("nightly");
    let report = sqlite::backup(&dir, &file).unwrap();
    assert_eq!(report.file, file);
    assert_eq!(report.records(), 1);
    assert_eq!(mode(&file), 0o600);
    let beside: Vec<_> = fs::read_dir(parent.path())
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.starts_with("nightly"))
        .collect();
    assert_eq!(beside, ["nightly"]);

    let target = parent.path().join("precious");
    fs::write(&target, b"not a backup").unwrap();
    std::os::unix::fs::symlink(&target, partial("third")).unwrap();
    fs::hard_link(&target, partial("fourth")).unwrap();
    for name in ["third", "fourth"] {
        let report = sqlite::backup(&dir, &parent.path().join(name)).unwrap();
        assert_eq!(report.records(), 1);
        assert!(!partial(name).exists());
    }
    assert_eq!(fs::read(&target).unwrap(), b"not a backup");
}

// ----- checkpoints -------------------------------------------------------------

/// `count` receipts of 300 bytes, numbered from `first`.
fn receipts(first: u64, count: u64) -> Vec<Change> {
    (first..first + count)
        .map(|serial| put(Kind::Receipt, &serial.to_be_bytes(), &bytes(300)))
        .collect()
}

const PAGE: u64 = 4_096;

#[test]
fn the_checkpointer_copies_the_wal_into_the_database_beside_the_writer() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("data");
    let mut store = SqliteStore::open(&dir).unwrap();
    // Past CHECKPOINT_PAGES, short of the writer's own checkpoint.
    let pages = u64::try_from(sqlite::CHECKPOINT_PAGES).unwrap() * 3 / 2;
    let mut serial = 0;
    while fs::metadata(dir.join(format!("{DB_FILE}-wal")))
        .unwrap()
        .len()
        < pages * PAGE
    {
        store.commit(&receipts(serial, 64)).unwrap();
        serial += 64;
    }
    let db = dir.join(DB_FILE);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    // The WAL holds interior pages many times over; the database once.
    while fs::metadata(&db).unwrap().len() < pages / 4 * PAGE {
        assert!(
            std::time::Instant::now() < deadline,
            "nothing was checkpointed into {} ({} bytes)",
            db.display(),
            fs::metadata(&db).unwrap().len()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    drop(store);
    let mut store = SqliteStore::open(&dir).unwrap();
    assert_eq!(
        store.load().unwrap().len(),
        usize::try_from(serial).unwrap()
    );
}

#[test]
fn the_wal_stays_bounded_under_steady_commits() {
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("data");
    let mut store = SqliteStore::open(&dir).unwrap();
    let wal = dir.join(format!("{DB_FILE}-wal"));
    // A WAL frame is a page and a 24-byte header; a batch of 64 receipts
    // is a few pages, so the writer's checkpoint comes within a batch of
    // its mark.
    let bound = (u64::try_from(sqlite::WRITER_CHECKPOINT_PAGES).unwrap() + 100) * (PAGE + 24);
    let mut serial = 0;
    let mut largest = 0;
    // Four times the bound's worth of frames, as fast as one writer goes.
    while serial < 4 * bound / 300 {
        store.commit(&receipts(serial, 64)).unwrap();
        serial += 64;
        largest = largest.max(fs::metadata(&wal).unwrap().len());
    }
    assert!(
        largest <= bound,
        "the WAL grew to {largest} bytes (bound {bound})"
    );
    drop(store);
    let mut store = SqliteStore::open(&dir).unwrap();
    assert_eq!(
        store.load().unwrap().len(),
        usize::try_from(serial).unwrap()
    );
}

// ----- measurement ------------------------------------------------------------

/// Commits a second and bytes on disk a record, printed, never asserted:
/// `cargo test --release --lib store::tests::sqlite_only::measure -- --ignored --nocapture`.
#[test]
#[ignore = "a measurement: run by hand, in release"]
fn measure_commit_rates_and_size() {
    use std::time::{Duration, Instant};

    use crate::domain::records::key;

    let value = bytes(300);
    let mut serial = 0u64;
    let mut next_change = || {
        serial += 1;
        let call = format!("call-{serial:012}");
        put(
            Kind::Receipt,
            &key(&[
                &serial.to_be_bytes(),
                b"host-1",
                b"actor-1",
                call.as_bytes(),
            ]),
            &value,
        )
    };
    for autocheckpoint in [1_000, 10_000] {
        for batch_size in [1usize, 64, 1024] {
            let parent = tempfile::tempdir().unwrap();
            let mut store = SqliteStore::open(&parent.path().join("data")).unwrap();
            store
                .connection()
                .pragma_update(None, "wal_autocheckpoint", autocheckpoint)
                .unwrap();
            let budget = Duration::from_secs(4);
            let started = Instant::now();
            let mut commits = 0u64;
            let mut worst = Duration::ZERO;
            while started.elapsed() < budget {
                let batch: Vec<Change> = (0..batch_size).map(|_| next_change()).collect();
                let one = Instant::now();
                store.commit(&batch).unwrap();
                worst = worst.max(one.elapsed());
                commits += 1;
            }
            let seconds = started.elapsed().as_secs_f64();
            eprintln!(
                "autocheckpoint {autocheckpoint:>5}  batch {batch_size:>4}: {:>8.1} commits/s \
                 {:>9.0} changes/s  mean {:>7.2} ms  worst {:>7.2} ms",
                commits as f64 / seconds,
                (commits * batch_size as u64) as f64 / seconds,
                seconds * 1e3 / commits as f64,
                worst.as_secs_f64() * 1e3,
            );
        }
    }
    // Bytes a record on disk: 100 000 receipts as above, checkpointed.
    let parent = tempfile::tempdir().unwrap();
    let dir = parent.path().join("data");
    let mut store = SqliteStore::open(&dir).unwrap();
    let mut payload = 0u64;
    for _ in 0..100 {
        let batch: Vec<Change> = (0..1000).map(|_| next_change()).collect();
        payload += batch
            .iter()
            .map(|change| (change.key.len() + change.value.as_ref().unwrap().len()) as u64)
            .sum::<u64>();
        store.commit(&batch).unwrap();
    }
    let live = store.size_bytes();
    drop(store);
    let closed = fs::metadata(dir.join(DB_FILE)).unwrap().len();
    eprintln!(
        "100000 records, {:.0} payload bytes each: {:.0} bytes each on disk \
         (open, db + WAL: {:.0})",
        payload as f64 / 1e5,
        closed as f64 / 1e5,
        live as f64 / 1e5
    );
}
