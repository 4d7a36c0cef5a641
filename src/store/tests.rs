//! The store tests, against real files for SQLite.
//!
//! - Here: one suite every [`Store`] passes, written once over a
//!   [`Subject`] and instantiated per store by [`suite!`] (`memory::…`,
//!   `sqlite::…`, `postgres::…`).
//! - [`sqlite_only`]: what only the SQLite store has: its directory, lock,
//!   schema versions, `check` and `backup`.
//! - [`postgres_only`]: the PostgreSQL store's URL, lock, schema versions
//!   and errors, against a real server: `TOOLGATE_TEST_DATABASE_URL`
//!   (`source .ci/postgres start` makes one). Each test works in a schema
//!   of its own, dropped at its end, so they run in parallel.
//! - [`recovery`]: crash images and backups taken while a writer commits.

use std::collections::BTreeMap;

use super::Store;
use super::memory::MemoryStore;
use super::postgres::PostgresStore;
use super::sqlite::SqliteStore;
use crate::domain::records::{Change, Kind, Record};

mod postgres_only;
mod recovery;
mod sqlite_only;

/// A store under test, with what the suite needs besides the [`Store`]
/// methods.
trait Subject {
    type Store: Store;
    /// What [`Store::name`] says.
    const NAME: &'static str;

    fn new() -> Self;
    fn store(&mut self) -> &mut Self::Store;
    /// Replaces the store with one opened afresh on what it kept.
    fn reopen(&mut self);
    /// Makes any commit that touches `kind` fail, if this store can be made
    /// to fail; false when it cannot (the memory store never fails).
    fn break_kind(&mut self, kind: Kind) -> bool;
    /// Undoes [`Subject::break_kind`].
    fn repair_kind(&mut self, kind: Kind);
}

struct MemorySubject(MemoryStore);

impl Subject for MemorySubject {
    type Store = MemoryStore;
    const NAME: &'static str = "memory";

    fn new() -> Self {
        MemorySubject(MemoryStore::new())
    }

    fn store(&mut self) -> &mut MemoryStore {
        &mut self.0
    }

    fn reopen(&mut self) {
        // A clone shares the records: the memory store's "reopen".
        self.0 = self.0.clone();
    }

    fn break_kind(&mut self, _kind: Kind) -> bool {
        false
    }

    fn repair_kind(&mut self, _kind: Kind) {}
}

struct SqliteSubject {
    // Declared first so that it drops (and closes) before the directory.
    store: Option<SqliteStore>,
    dir: tempfile::TempDir,
}

impl SqliteSubject {
    fn data_dir(&self) -> std::path::PathBuf {
        self.dir.path().join("data")
    }
}

impl Subject for SqliteSubject {
    type Store = SqliteStore;
    const NAME: &'static str = "sqlite";

    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let mut subject = SqliteSubject { store: None, dir };
        subject.store = Some(SqliteStore::open(&subject.data_dir()).unwrap());
        subject
    }

    fn store(&mut self) -> &mut SqliteStore {
        self.store.as_mut().unwrap()
    }

    fn reopen(&mut self) {
        // The first must be gone (its lock released) before the second opens.
        self.store = None;
        self.store = Some(SqliteStore::open(&self.data_dir()).unwrap());
    }

    fn break_kind(&mut self, kind: Kind) -> bool {
        // The table goes; a commit that reaches a change of this kind fails
        // there, after the changes before it were applied.
        let sql = format!("DROP TABLE {}", kind.table());
        self.store().connection().execute_batch(&sql).unwrap();
        true
    }

    fn repair_kind(&mut self, kind: Kind) {
        let sql = format!(
            "CREATE TABLE {} (k BLOB PRIMARY KEY NOT NULL, v BLOB NOT NULL) WITHOUT ROWID",
            kind.table()
        );
        self.store().connection().execute_batch(&sql).unwrap();
    }
}

struct PostgresSubject {
    // Declared first so that it drops (and lets go of its lock) before the
    // schema is dropped.
    store: Option<PostgresStore>,
    schema: postgres_only::TestSchema,
}

impl Subject for PostgresSubject {
    type Store = PostgresStore;
    const NAME: &'static str = "postgres";

    fn new() -> Self {
        let schema = postgres_only::TestSchema::new();
        let store = PostgresStore::open(&schema.target).unwrap();
        PostgresSubject {
            store: Some(store),
            schema,
        }
    }

    fn store(&mut self) -> &mut PostgresStore {
        self.store.as_mut().unwrap()
    }

    fn reopen(&mut self) {
        self.store = None;
        self.store = Some(PostgresStore::open(&self.schema.target).unwrap());
    }

    fn break_kind(&mut self, kind: Kind) -> bool {
        // A trigger refuses every write of this kind; a commit that reaches
        // one fails there, after its deletions were applied.
        let schema = self.schema.target.schema();
        let code = super::postgres::kind_code(kind);
        self.schema.execute(&format!(
            "CREATE FUNCTION {schema}.refuse() RETURNS trigger LANGUAGE plpgsql AS \
             $$ BEGIN RAISE EXCEPTION 'refused on purpose'; END $$; \
             CREATE TRIGGER refuse BEFORE INSERT OR UPDATE ON {schema}.records \
             FOR EACH ROW WHEN (NEW.kind = {code}) EXECUTE FUNCTION {schema}.refuse()"
        ));
        true
    }

    fn repair_kind(&mut self, _kind: Kind) {
        let schema = self.schema.target.schema();
        self.schema.execute(&format!(
            "DROP TRIGGER refuse ON {schema}.records; DROP FUNCTION {schema}.refuse()"
        ));
    }
}

pub(super) fn put(kind: Kind, key: &[u8], value: &[u8]) -> Change {
    Change {
        kind,
        key: key.to_vec(),
        value: Some(value.to_vec()),
    }
}

pub(super) fn delete(kind: Kind, key: &[u8]) -> Change {
    Change {
        kind,
        key: key.to_vec(),
        value: None,
    }
}

/// Every record, keyed by (kind, key), whatever order the store returns.
pub(super) fn contents(store: &mut impl Store) -> BTreeMap<(Kind, Vec<u8>), Vec<u8>> {
    let records = store.load().unwrap();
    let count = records.len();
    let map: BTreeMap<_, _> = records
        .into_iter()
        .map(|Record { kind, key, value }| ((kind, key), value))
        .collect();
    assert_eq!(map.len(), count, "load returned a key twice");
    map
}

fn expect(entries: &[(Kind, &[u8], &[u8])]) -> BTreeMap<(Kind, Vec<u8>), Vec<u8>> {
    entries
        .iter()
        .map(|(kind, key, value)| ((*kind, key.to_vec()), value.to_vec()))
        .collect()
}

/// The key of decided call id `name` of session (`host`, `session`) as the
/// first schema wrote it (no time), and as the migrations rewrite it (the
/// undated prefix before it).
fn first_schema_call_key(name: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let undated = crate::domain::records::key(&[b"host", b"session", name]);
    let prefix = crate::domain::session::undated_call_key_prefix();
    let dated = [prefix.as_slice(), &undated].concat();
    (undated, dated)
}

/// Three records of every kind, binary keys and values included.
fn every_kind() -> Vec<Change> {
    let mut changes = Vec::new();
    for (index, kind) in Kind::ALL.into_iter().enumerate() {
        for record in 0..3u8 {
            let key = [&[0, 0xff, index as u8, record][..], kind.table().as_bytes()].concat();
            let value = [
                &[record, 0, 0xfe][..],
                format!("{{\"kind\":{index}}}").as_bytes(),
            ]
            .concat();
            changes.push(Change {
                kind,
                key,
                value: Some(value),
            });
        }
    }
    changes
}

fn as_map(changes: &[Change]) -> BTreeMap<(Kind, Vec<u8>), Vec<u8>> {
    changes
        .iter()
        .map(|change| {
            (
                (change.kind, change.key.clone()),
                change.value.clone().unwrap(),
            )
        })
        .collect()
}

fn round_trip_of_every_kind<S: Subject>() {
    let mut subject = S::new();
    assert!(contents(subject.store()).is_empty());
    let changes = every_kind();
    subject.store().commit(&changes).unwrap();
    assert_eq!(contents(subject.store()), as_map(&changes));
    assert!(subject.store().size_bytes() > 0);
}

fn overwrite_replaces<S: Subject>() {
    let mut subject = S::new();
    let store = subject.store();
    store
        .commit(&[put(Kind::Resource, b"r", b"a long first value")])
        .unwrap();
    store.commit(&[put(Kind::Resource, b"r", b"2")]).unwrap();
    assert_eq!(contents(store), expect(&[(Kind::Resource, b"r", b"2")]));
}

fn delete_removes<S: Subject>() {
    let mut subject = S::new();
    let store = subject.store();
    store
        .commit(&[put(Kind::Pin, b"a", b"1"), put(Kind::Pin, b"b", b"2")])
        .unwrap();
    store.commit(&[delete(Kind::Pin, b"a")]).unwrap();
    assert_eq!(contents(store), expect(&[(Kind::Pin, b"b", b"2")]));
}

fn delete_of_a_missing_key_is_no_error<S: Subject>() {
    let mut subject = S::new();
    let store = subject.store();
    store.commit(&[delete(Kind::Session, b"never")]).unwrap();
    // The same key of another kind is another record.
    store.commit(&[put(Kind::Receipt, b"k", b"v")]).unwrap();
    store.commit(&[delete(Kind::Pin, b"k")]).unwrap();
    assert_eq!(contents(store), expect(&[(Kind::Receipt, b"k", b"v")]));
}

fn an_empty_commit_changes_nothing<S: Subject>() {
    let mut subject = S::new();
    let store = subject.store();
    store.commit(&[]).unwrap();
    assert!(contents(store).is_empty());
    store.commit(&[put(Kind::Meta, b"m", b"1")]).unwrap();
    store.commit(&[]).unwrap();
    assert_eq!(contents(store), expect(&[(Kind::Meta, b"m", b"1")]));
}

fn a_batch_applies_in_order<S: Subject>() {
    let mut subject = S::new();
    let store = subject.store();
    store
        .commit(&[
            // put then delete: absent
            put(Kind::Approval, b"gone", b"1"),
            delete(Kind::Approval, b"gone"),
            // delete then put: present
            delete(Kind::Approval, b"kept"),
            put(Kind::Approval, b"kept", b"2"),
            // two puts: the last
            put(Kind::Approval, b"twice", b"first"),
            put(Kind::Approval, b"twice", b"second"),
        ])
        .unwrap();
    assert_eq!(
        contents(store),
        expect(&[
            (Kind::Approval, b"kept", b"2"),
            (Kind::Approval, b"twice", b"second"),
        ])
    );
}

fn a_batch_is_all_or_nothing<S: Subject>() {
    let mut subject = S::new();
    let base = [
        put(Kind::Meta, b"version", b"1"),
        put(Kind::Session, b"s", b"old"),
        put(Kind::Resource, b"r", b"old"),
    ];
    subject.store().commit(&base).unwrap();
    let before = contents(subject.store());
    if !subject.break_kind(Kind::Receipt) {
        // This store's commits cannot fail: nothing to see.
        return;
    }
    let batch = [
        put(Kind::Meta, b"version", b"2"),
        delete(Kind::Session, b"s"),
        put(Kind::Resource, b"r", b"new"),
        put(Kind::Approval, b"a", b"new"),
        // Fails here, after four changes were applied in the transaction.
        put(Kind::Receipt, b"x", b"new"),
        put(Kind::Pin, b"p", b"new"),
    ];
    let error = subject.store().commit(&batch).unwrap_err();
    assert!(error.0.contains("receipts"), "{error}");
    assert!(
        !error.0.contains("new"),
        "the error names no record: {error}"
    );
    subject.repair_kind(Kind::Receipt);
    assert_eq!(contents(subject.store()), before);
    subject.reopen();
    assert_eq!(contents(subject.store()), before);
    // And the store still commits.
    subject.store().commit(&batch).unwrap();
    assert_eq!(
        contents(subject.store()),
        expect(&[
            (Kind::Meta, b"version", b"2"),
            (Kind::Resource, b"r", b"new"),
            (Kind::Approval, b"a", b"new"),
            (Kind::Receipt, b"x", b"new"),
            (Kind::Pin, b"p", b"new"),
        ])
    );
}

fn reopening_sees_everything<S: Subject>() {
    let mut subject = S::new();
    let changes = every_kind();
    subject.store().commit(&changes).unwrap();
    subject
        .store()
        .commit(&[
            delete(
                Kind::Pin,
                &changes.iter().find(|c| c.kind == Kind::Pin).unwrap().key,
            ),
            put(Kind::Meta, b"after", b"reopen"),
        ])
        .unwrap();
    let before = contents(subject.store());
    assert_eq!(before.len(), changes.len());
    subject.reopen();
    assert_eq!(contents(subject.store()), before);
    subject.reopen();
    assert_eq!(contents(subject.store()), before);
}

/// A value of `len` bytes: every byte value, so no encoding can hide one.
fn bytes(len: usize) -> Vec<u8> {
    (0..len).map(|index| (index % 251) as u8).collect()
}

fn large_and_empty_values<S: Subject>() {
    let mut subject = S::new();
    let store = subject.store();
    let large = bytes(3 << 20);
    store
        .commit(&[
            put(Kind::QueueItem, b"large", &large),
            put(Kind::QueueItem, b"empty", b""),
            put(Kind::QueueItem, b"", b"empty key"),
        ])
        .unwrap();
    let found = contents(store);
    assert_eq!(found[&(Kind::QueueItem, b"large".to_vec())], large);
    assert_eq!(found[&(Kind::QueueItem, b"empty".to_vec())], b"");
    assert_eq!(found[&(Kind::QueueItem, Vec::new())], b"empty key");
}

fn names_itself<S: Subject>() {
    let mut subject = S::new();
    assert_eq!(subject.store().name(), S::NAME);
}

macro_rules! suite {
    ($module:ident, $subject:ty) => {
        mod $module {
            #[test]
            fn round_trip_of_every_kind() {
                super::round_trip_of_every_kind::<$subject>();
            }
            #[test]
            fn overwrite_replaces() {
                super::overwrite_replaces::<$subject>();
            }
            #[test]
            fn delete_removes() {
                super::delete_removes::<$subject>();
            }
            #[test]
            fn delete_of_a_missing_key_is_no_error() {
                super::delete_of_a_missing_key_is_no_error::<$subject>();
            }
            #[test]
            fn an_empty_commit_changes_nothing() {
                super::an_empty_commit_changes_nothing::<$subject>();
            }
            #[test]
            fn a_batch_applies_in_order() {
                super::a_batch_applies_in_order::<$subject>();
            }
            #[test]
            fn a_batch_is_all_or_nothing() {
                super::a_batch_is_all_or_nothing::<$subject>();
            }
            #[test]
            fn reopening_sees_everything() {
                super::reopening_sees_everything::<$subject>();
            }
            #[test]
            fn large_and_empty_values() {
                super::large_and_empty_values::<$subject>();
            }
            #[test]
            fn names_itself() {
                super::names_itself::<$subject>();
            }
        }
    };
}

suite!(memory, super::MemorySubject);
suite!(sqlite, super::SqliteSubject);
suite!(postgres, super::PostgresSubject);
