//! The durable store: SQLite in WAL mode with `synchronous=FULL`, so that a
//! commit returns only once its WAL frames are synced, in a data directory
//! one process owns.
//!
//! # The data directory
//!
//! - `DIR` itself: owner-only (0700). [`SqliteStore::open`] creates it so
//!   and refuses one that group or others can enter (`chmod 700 DIR`).
//! - `DIR/lock`: held (`flock`, [`File::try_lock`]) for the life of the
//!   store, so that a second toolgate on the same directory is refused
//!   instead of writing beside the first. It holds the owner's pid, for the
//!   refusal's message; the lock, not the file, is what counts.
//! - `DIR/toolgate.sqlite3`, with `-wal` and `-shm` beside it while the
//!   store is open: one table per [`Kind`], `(k BLOB PRIMARY KEY, v BLOB)
//!   WITHOUT ROWID`, the schema's version in `PRAGMA user_version`.
//!
//! # Schema versions
//!
//! [`MIGRATIONS`]`[n]` takes a store from version `n` to `n + 1`; opening
//! applies the missing ones in one transaction (version 0 is a new, empty
//! file). A store of a version newer than this binary knows is refused
//! untouched. A new [`Kind`] needs a migration that creates its table:
//! opening checks that every kind's table is there.
//!
//! # Operations
//!
//! [`check`] and [`backup`] never take the lock: they read through their own
//! read-only connection, which WAL lets run beside a serving toolgate's
//! writer, and each sees one consistent snapshot. So both work on a
//! running server's directory as on a stopped one.
//!
//! To restore a backup: stop toolgate, make a new directory (`mkdir -m 700
//! NEW`), copy the backup into it as `NEW/toolgate.sqlite3`, and start
//! toolgate on `NEW` (or move `NEW` where the old directory was).

use std::fs::{self, DirBuilder, File, OpenOptions, TryLockError};
use std::io::{Read, Write};
use std::os::raw::c_int;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, SyncSender};
use std::thread::JoinHandle;
use std::time::Duration;

use rusqlite::backup::{Backup, StepResult};
use rusqlite::hooks::Wal;
use rusqlite::wal::CheckpointMode;
use rusqlite::{
    CachedStatement, Connection, ErrorCode, OpenFlags, Transaction, TransactionBehavior,
};

use super::{Store, StoreError, StoreResult};
use crate::domain::records::{Change, Kind, Record};
use crate::domain::session;

/// The database file's name in the data directory.
pub const DB_FILE: &str = "toolgate.sqlite3";
/// The name a new store's database is made under, before it is renamed to
/// [`DB_FILE`].
pub const CREATING_FILE: &str = "toolgate.sqlite3.creating";
/// The lock file's name in the data directory.
pub const LOCK_FILE: &str = "lock";
/// Written once a directory holds a store: a [`DB_FILE`] missing beside
/// it is a store lost, not a directory to start a new one in.
pub const CREATED_FILE: &str = "toolgate.created";

/// One step of the schema: takes a store from version `n` (its index in
/// [`MIGRATIONS`]) to `n + 1`, inside the opening transaction.
pub type Migration = fn(&Transaction<'_>) -> rusqlite::Result<()>;

/// The schema's history, oldest first. Append only: a released migration is
/// never changed, since stores made with it exist.
pub const MIGRATIONS: &[Migration] = &[
    create_v1_tables,
    key_v2_decided_calls_by_time,
    create_v3_approval_changes,
    allow_v4_owed_attempts,
];

/// The schema version this binary writes (and the newest it can open).
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

/// The tables of version 1, spelled out rather than taken from
/// [`Kind::ALL`]: a kind added later comes with a migration of its own.
const V1_TABLES: [&str; 9] = [
    "meta",
    "approvals",
    "sessions",
    "decided_calls",
    "resources",
    "queue_items",
    "receipts",
    "pins",
    "assessments",
];

pub(super) fn create_v1_tables(transaction: &Transaction<'_>) -> rusqlite::Result<()> {
    for table in V1_TABLES {
        transaction.execute_batch(&format!(
            "CREATE TABLE IF NOT EXISTS {table} \
             (k BLOB PRIMARY KEY NOT NULL, v BLOB NOT NULL) WITHOUT ROWID"
        ))?;
    }
    Ok(())
}

/// Version 2: a decided call id's key starts with the time it was decided
/// ([`session::undated_call_key_prefix`] for the ones already stored), so
/// that new call ids append to the table instead of each landing in its
/// session's leaf. Copied into a new table, since SQL's `||` is text
/// concatenation and keys are bytes.
pub(super) fn key_v2_decided_calls_by_time(transaction: &Transaction<'_>) -> rusqlite::Result<()> {
    transaction.execute_batch(
        "CREATE TABLE decided_calls_v2 \
         (k BLOB PRIMARY KEY NOT NULL, v BLOB NOT NULL) WITHOUT ROWID",
    )?;
    let prefix = session::undated_call_key_prefix();
    {
        let mut select = transaction.prepare("SELECT k, v FROM decided_calls")?;
        let mut insert =
            transaction.prepare("INSERT INTO decided_calls_v2 (k, v) VALUES (?1, ?2)")?;
        let mut rows = select.query([])?;
        while let Some(row) = rows.next()? {
            let key: Vec<u8> = row.get(0)?;
            let value: Vec<u8> = row.get(1)?;
            insert.execute(rusqlite::params![[prefix.as_slice(), &key].concat(), value])?;
        }
    }
    transaction.execute_batch(
        "DROP TABLE decided_calls; ALTER TABLE decided_calls_v2 RENAME TO decided_calls",
    )
}

/// Version 3: an approval's steps after its request are records of their
/// own ([`Kind::ApprovalChange`]), keyed by time, instead of the approval's
/// record written again. The records of version 2 stay as they are: an
/// approval without changes is as its record says.
pub(super) fn create_v3_approval_changes(transaction: &Transaction<'_>) -> rusqlite::Result<()> {
    transaction.execute_batch(
        "CREATE TABLE approval_changes \
         (k BLOB PRIMARY KEY NOT NULL, v BLOB NOT NULL) WITHOUT ROWID",
    )
}

/// Version 4: a decided call id may record the tool attempt it owes, and a
/// receipt the grant its commit consumed (optional fields of their
/// values). Nothing changes in the tables; the version stops an older
/// toolgate from opening a store whose records it would read past those
/// fields.
pub(super) fn allow_v4_owed_attempts(_: &Transaction<'_>) -> rusqlite::Result<()> {
    Ok(())
}

/// How long a statement waits for another connection's lock (a backup's or
/// check's read, a checkpoint) before it fails as busy.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// The page cache, in KiB (SQLite's negative form): 8 MiB, which holds
/// the interior pages of every table of a store of 100,000 approvals and
/// receipts. Not more: SQLite walks its whole page cache's hash table at
/// the end of many write transactions, and with 64 MiB that walk was 5 % of
/// the server's CPU per Dispatch (BENCHMARKS.md).
const CACHE_KIB: i64 = 8_192;
/// WAL pages at which a commit wakes the checkpointer thread
/// ([`Checkpointer`]), which copies the WAL into the database beside the
/// writer. SQLite's own automatic checkpoint (at 1,000 pages too) ran
/// inside the commit that crossed the mark, and that commit's stall (7-15
/// ms for 1,000 pages, `measure_commit_rates_and_size`) was every waiting
/// answer's: the p99 of Dispatch at half load (BENCHMARKS.md).
pub(super) const CHECKPOINT_PAGES: c_int = 1_000;
/// WAL pages at which the writer checkpoints what is left itself, inside
/// the commit. SQLite starts the WAL again from its beginning only once
/// all of it is in the database, which a thread copying beside a busy
/// writer never quite reaches; what is left for the writer is what came
/// after the thread's last pass, so its stall is short, and the WAL stays
/// bounded (about this many pages) under any load.
pub(super) const WRITER_CHECKPOINT_PAGES: c_int = 4_000;
/// The shortest time between two passes of the checkpointer thread: a
/// page written by many commits is copied once per pass, not once per
/// commit.
const CHECKPOINT_INTERVAL: Duration = Duration::from_millis(20);
/// The WAL is cut back to this size after a checkpoint, so that one burst
/// does not leave a large file behind.
const JOURNAL_SIZE_LIMIT: i64 = 64 * 1024 * 1024;
/// Prepared statements kept: an upsert and a delete per kind, a select per
/// kind for load, and room to spare.
const STATEMENT_CACHE: usize = 64;

/// The durable store (see the module documentation).
#[derive(Debug)]
pub struct SqliteStore {
    // Fields drop in order: the connection closes, then the checkpointer
    // (the last connection, which checkpoints the WAL as it closes), before
    // the lock is released.
    connection: Connection,
    /// By [`Kind::index`].
    statements: [KindStatements; Kind::ALL.len()],
    _checkpointer: Checkpointer,
    dir: PathBuf,
    _lock: File,
}

/// The SQL of one kind's table: its upsert, then its delete (indexed by
/// [`statement_of`]).
type KindStatements = [String; 2];

fn kind_statements(kind: Kind) -> KindStatements {
    let table = kind.table();
    [
        format!(
            "INSERT INTO {table}(k, v) VALUES (?1, ?2) \
             ON CONFLICT(k) DO UPDATE SET v = excluded.v"
        ),
        format!("DELETE FROM {table} WHERE k = ?1"),
    ]
}

/// Which of its kind's statements a change runs: 0 writes, 1 deletes.
fn statement_of(change: &Change) -> usize {
    usize::from(change.value.is_none())
}

impl SqliteStore {
    /// Opens the store in `dir`, creating the directory (0700) and the
    /// database when absent, and migrating an older schema. Refused: a
    /// directory group or others can enter, one another store holds (in
    /// this process or another), a schema newer than this binary's.
    pub fn open(dir: &Path) -> StoreResult<Self> {
        SqliteStore::open_checkpointing_at(dir, CHECKPOINT_PAGES, WRITER_CHECKPOINT_PAGES)
    }

    /// [`SqliteStore::open`], with the WAL pages at which a commit wakes
    /// the checkpointer thread (`wake_at`) and checkpoints itself
    /// (`write_at`): the tests' lower marks, so that checkpoints come often.
    pub(crate) fn open_checkpointing_at(
        dir: &Path,
        wake_at: c_int,
        write_at: c_int,
    ) -> StoreResult<Self> {
        prepare_dir(dir)?;
        let lock = take_lock(dir)?;
        let db_path = dir.join(DB_FILE);
        let failed = |step: &str| {
            let step = step.to_string();
            move |error| store_error(dir, &step, error)
        };
        refuse_lost_database(dir, &db_path)?;
        if !db_path.exists() {
            create_database(dir, &db_path)?;
        }
        let mut connection = Connection::open_with_flags(
            &db_path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(failed("opening the database"))?;
        connection
            .busy_timeout(BUSY_TIMEOUT)
            .map_err(failed("setting busy_timeout"))?;
        // Before anything writes (journal_mode=WAL rewrites the header): a
        // store of a newer schema, or a database that is not a store, is
        // left exactly as it is.
        let version = user_version(&connection).map_err(failed("reading the schema version"))?;
        refuse_newer(dir, version)?;
        refuse_foreign(&connection, dir, version)?;
        let mode: String = connection
            .pragma_update_and_check(None, "journal_mode", "WAL", |row| row.get(0))
            .map_err(failed("setting journal_mode=WAL"))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(StoreError(format!(
                "the SQLite store at {}: the file system does not allow WAL mode \
                 (journal_mode is {mode}); put the data directory on a local file system",
                dir.display()
            )));
        }
        for (pragma, value) in [
            ("synchronous", 2), // FULL
            ("cache_size", -CACHE_KIB),
            ("journal_size_limit", JOURNAL_SIZE_LIMIT),
        ] {
            connection
                .pragma_update(None, pragma, value)
                .map_err(failed(&format!("setting {pragma}")))?;
        }
        migrate(&mut connection, dir, MIGRATIONS)?;
        let present = tables(&connection).map_err(failed("reading the schema"))?;
        if let Some(missing) = Kind::ALL
            .iter()
            .find(|kind| !present.iter().any(|table| table == kind.table()))
        {
            return Err(StoreError(format!(
                "the SQLite store at {} has no {} table (schema version {SCHEMA_VERSION}); \
                 run `toolgate store check --data-dir {}`",
                dir.display(),
                missing.table(),
                dir.display()
            )));
        }
        // A store now, whatever made it: its loss is never a new store.
        mark_created(dir)?;
        connection.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        let checkpointer = Checkpointer::start(dir, &db_path)?;
        let wake = checkpointer.waker();
        // Replaces SQLite's automatic checkpoint (which is a WAL hook too).
        // Never an error: the commit that calls it has happened, and an
        // error here would make it look failed; a checkpoint that cannot
        // run now (the thread's pass holds the checkpoint lock) is tried
        // again at the next commit.
        connection
            .wal_hook(Some(move |wal: &mut Wal, pages: c_int| {
                if pages >= write_at {
                    let _ = wal.checkpoint();
                } else if pages >= wake_at {
                    let _ = wake.try_send(());
                }
                Ok(())
            }))
            .map_err(failed("setting the WAL hook"))?;
        Ok(SqliteStore {
            connection,
            statements: Kind::ALL.map(kind_statements),
            _checkpointer: checkpointer,
            dir: dir.to_path_buf(),
            _lock: lock,
        })
    }

    /// The data directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The connection, for tests that break the store on purpose.
    #[cfg(test)]
    pub(crate) fn connection(&self) -> &Connection {
        &self.connection
    }

    /// The checkpointer thread's passes that checkpointed, for tests.
    #[cfg(test)]
    pub(crate) fn checkpointer_passes(&self) -> u64 {
        self._checkpointer.passes.load(Ordering::Acquire)
    }
}

impl Store for SqliteStore {
    fn name(&self) -> &'static str {
        "sqlite"
    }

    fn load(&mut self) -> StoreResult<Vec<Record>> {
        let SqliteStore {
            connection, dir, ..
        } = self;
        let failed = |step: &str, error| store_error(dir, step, error);
        // One read transaction: every table as of the same commit.
        let transaction = connection
            .transaction()
            .map_err(|error| failed("beginning the load", error))?;
        let records = read_records(&transaction)
            .map_err(|(kind, error)| failed(&format!("reading {}", kind.table()), error))?;
        transaction
            .commit()
            .map_err(|error| failed("ending the load", error))?;
        Ok(records)
    }

    fn commit(&mut self, changes: &[Change]) -> StoreResult<()> {
        if changes.is_empty() {
            return Ok(());
        }
        let SqliteStore {
            connection,
            statements,
            dir,
            ..
        } = self;
        let failed = |step: &str, error| store_error(dir, step, error);
        // IMMEDIATE: the write lock is taken at BEGIN, so that nothing after
        // it can fail for want of it. A transaction dropped before its
        // commit rolls back: all or nothing.
        let transaction = connection
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(|error| failed("beginning a commit", error))?;
        // Each statement is taken from the cache once per commit, not once
        // per record: a take and a return hash its SQL text and move it in
        // the cache's LRU list, about as much as a small insert costs, and
        // a batch holds dozens of records of the same few kinds.
        let mut prepared: [[Option<CachedStatement<'_>>; 2]; Kind::ALL.len()] =
            std::array::from_fn(|_| [None, None]);
        for change in changes {
            let (kind, which) = (change.kind.index(), statement_of(change));
            let statement = match &mut prepared[kind][which] {
                Some(statement) => Ok(statement),
                empty => transaction
                    .prepare_cached(&statements[kind][which])
                    .map(|statement| empty.insert(statement)),
            };
            let applied = statement.and_then(|statement| match &change.value {
                Some(value) => statement.execute((&change.key, value)),
                None => statement.execute([&change.key]),
            });
            applied.map_err(|error| {
                let what = if change.value.is_some() {
                    "writing"
                } else {
                    "deleting"
                };
                failed(&format!("{what} a {} record", change.kind.table()), error)
            })?;
        }
        drop(prepared);
        transaction
            .commit()
            .map_err(|error| failed("committing", error))
    }

    fn size_bytes(&self) -> u64 {
        files_size(&self.dir.join(DB_FILE))
    }
}

/// The checkpointer thread (see [`CHECKPOINT_PAGES`]): its own connection,
/// PASSIVE checkpoints (which take no lock a writer needs) when a commit
/// wakes it, at most one per [`CHECKPOINT_INTERVAL`]. A checkpoint that
/// fails loses nothing (the WAL still holds every commit); it is logged
/// once until one succeeds again, and the writer's own checkpoint keeps
/// the WAL bounded meanwhile.
#[derive(Debug)]
struct Checkpointer {
    wake: SyncSender<()>,
    stop: Arc<AtomicBool>,
    /// Passes that checkpointed (tests look).
    #[cfg(test)]
    passes: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

impl Checkpointer {
    fn start(dir: &Path, db_path: &Path) -> StoreResult<Self> {
        let connection = Connection::open_with_flags(
            db_path,
            OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
        )
        .map_err(|error| store_error(dir, "opening the checkpointer's connection", error))?;
        // A connection learns that the database is in WAL mode when it
        // first reads it; until then a checkpoint does nothing.
        connection
            .query_row("SELECT count(*) FROM sqlite_schema", [], |_| Ok(()))
            .map_err(|error| {
                store_error(dir, "reading with the checkpointer's connection", error)
            })?;
        let (wake, woken) = mpsc::sync_channel(1);
        let stop = Arc::new(AtomicBool::new(false));
        let passes = Arc::new(AtomicU64::new(0));
        let thread = std::thread::Builder::new()
            .name("toolgate-checkpoint".into())
            .spawn({
                let (stop, passes) = (Arc::clone(&stop), Arc::clone(&passes));
                let dir = dir.to_path_buf();
                move || checkpoint_when_woken(&connection, &woken, &stop, &passes, &dir)
            })
            .map_err(|error| {
                StoreError(format!(
                    "the SQLite store at {}: cannot start the checkpointer thread: {error}",
                    dir.display()
                ))
            })?;
        Ok(Checkpointer {
            wake,
            stop,
            #[cfg(test)]
            passes,
            thread: Some(thread),
        })
    }

    fn waker(&self) -> SyncSender<()> {
        self.wake.clone()
    }
}

impl Drop for Checkpointer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.wake.try_send(());
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn checkpoint_when_woken(
    connection: &Connection,
    woken: &Receiver<()>,
    stop: &AtomicBool,
    passes: &AtomicU64,
    dir: &Path,
) {
    let mut failing = false;
    while woken.recv().is_ok() && !stop.load(Ordering::Acquire) {
        match connection.wal_checkpoint_v2(None::<&str>, CheckpointMode::PASSIVE) {
            Ok(_) => {
                failing = false;
                passes.fetch_add(1, Ordering::Release);
            }
            Err(error) if busy(&error) => {}
            Err(error) => {
                if !failing {
                    tracing::warn!(
                        store = %dir.display(),
                        %error,
                        "the SQLite store's checkpointer failed; the writer checkpoints instead"
                    );
                }
                failing = true;
            }
        }
        std::thread::sleep(CHECKPOINT_INTERVAL);
    }
}

/// Whether SQLite refused for another connection's lock.
fn busy(error: &rusqlite::Error) -> bool {
    matches!(
        error.sqlite_error_code(),
        Some(ErrorCode::DatabaseBusy | ErrorCode::DatabaseLocked)
    )
}

/// A failed step of the store at `dir`: the step and SQLite's message,
/// never a record's contents.
fn store_error(dir: &Path, step: &str, error: rusqlite::Error) -> StoreError {
    StoreError(format!(
        "the SQLite store at {}: {step}: {error}",
        dir.display()
    ))
}

/// Bytes of a database file and its WAL.
fn files_size(db_path: &Path) -> u64 {
    let wal = wal_path(db_path);
    [db_path, wal.as_path()]
        .into_iter()
        .filter_map(|path| fs::metadata(path).ok())
        .map(|metadata| metadata.len())
        .sum()
}

fn wal_path(db_path: &Path) -> PathBuf {
    let mut name = db_path.as_os_str().to_os_string();
    name.push("-wal");
    PathBuf::from(name)
}

/// Syncs the directory that names `path`, so that a file or directory just
/// created there survives a power loss (SQLite syncs the directory of the
/// WAL it creates, not of a database file it did not create).
fn sync_parent(path: &Path) -> std::io::Result<()> {
    let parent = match path.parent() {
        Some(parent) if !parent.as_os_str().is_empty() => parent,
        _ => Path::new("."),
    };
    File::open(parent)?.sync_all()
}

/// Creates `dir` (0700) when absent; refuses one that is not a directory or
/// that group or others can reach.
fn prepare_dir(dir: &Path) -> StoreResult<()> {
    match fs::metadata(dir) {
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .and_then(|()| sync_parent(dir))
            .map_err(|error| {
                StoreError(format!(
                    "cannot create the data directory {}: {error}",
                    dir.display()
                ))
            }),
        Err(error) => Err(StoreError(format!(
            "cannot read the data directory {}: {error}",
            dir.display()
        ))),
        Ok(metadata) if !metadata.is_dir() => Err(StoreError(format!(
            "the data directory {} is not a directory",
            dir.display()
        ))),
        Ok(metadata) => {
            match foreign_owner(dir, &metadata).or_else(|| loose_permissions(dir, &metadata)) {
                Some(message) => Err(StoreError(message)),
                None => Ok(()),
            }
        }
    }
}

/// Why the store may not be opened in `dir` by this process, if so: it
/// belongs to another user, who could rewrite approvals and receipts even
/// in a 0700 directory. (`store check` and `backup` only read, and may be
/// run by root on a store another user serves.)
fn foreign_owner(dir: &Path, metadata: &fs::Metadata) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let user = rustix::process::geteuid().as_raw();
    (metadata.uid() != user).then(|| {
        format!(
            "the data directory {dir} belongs to uid {owner}, not to the user toolgate \
             runs as (uid {user}): run `chown {user} {dir}`, or run toolgate as its owner",
            dir = dir.display(),
            owner = metadata.uid()
        )
    })
}

/// Why `dir` is too open, if it is: the store's records (credentials'
/// sessions, approvals, receipts) are the owner's only.
fn loose_permissions(dir: &Path, metadata: &fs::Metadata) -> Option<String> {
    let mode = metadata.permissions().mode() & 0o777;
    (mode & 0o077 != 0).then(|| {
        format!(
            "the data directory {dir} is accessible to group or others (mode {mode:04o}); \
             it must be the owner's only: run `chmod 700 {dir}`",
            dir = dir.display()
        )
    })
}

/// Takes `DIR/lock` for the life of the store, or says who holds it.
fn take_lock(dir: &Path) -> StoreResult<File> {
    let path = dir.join(LOCK_FILE);
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .mode(0o600)
        .open(&path)
        .map_err(|error| StoreError(format!("cannot open {}: {error}", path.display())))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let mut holder = String::new();
            let _ = file.read_to_string(&mut holder);
            let pid = match holder.trim() {
                pid if !pid.is_empty() && pid.bytes().all(|byte| byte.is_ascii_digit()) => {
                    format!(" (pid {pid})")
                }
                _ => String::new(),
            };
            return Err(StoreError(format!(
                "another toolgate process{pid} holds {}: stop it, or use another data directory",
                dir.display()
            )));
        }
        Err(TryLockError::Error(error)) => {
            return Err(StoreError(format!(
                "cannot lock {}: {error}",
                path.display()
            )));
        }
    }
    // Ours now: the pid is only for the message above.
    let _ = file
        .set_len(0)
        .and_then(|()| writeln!(file, "{}", std::process::id()));
    Ok(file)
}

fn user_version(connection: &Connection) -> rusqlite::Result<u32> {
    connection.pragma_query_value(None, "user_version", |row| row.get(0))
}

fn refuse_newer(dir: &Path, version: u32) -> StoreResult<()> {
    if version > SCHEMA_VERSION {
        return Err(StoreError(newer_message(dir, version, SCHEMA_VERSION)));
    }
    Ok(())
}

fn newer_message(dir: &Path, version: u32, known: u32) -> String {
    format!(
        "the store at {} has schema version {version}; this toolgate knows up to \
         {known}: upgrade toolgate",
        dir.display()
    )
}

/// Refuses a database of version 0 that has tables: not a new file, so
/// someone else's (a toolgate store has a version from its first commit).
fn refuse_foreign(connection: &Connection, dir: &Path, version: u32) -> StoreResult<()> {
    if version != 0 {
        return Ok(());
    }
    let existing =
        tables(connection).map_err(|error| store_error(dir, "reading the schema", error))?;
    if existing.is_empty() {
        return Ok(());
    }
    Err(StoreError(format!(
        "{} is not a toolgate store: it has tables ({}) but no schema version",
        dir.join(DB_FILE).display(),
        existing.join(", ")
    )))
}

/// The tables of the main database, by name.
fn tables(connection: &Connection) -> rusqlite::Result<Vec<String>> {
    let mut select =
        connection.prepare("SELECT name FROM sqlite_schema WHERE type = 'table' ORDER BY name")?;
    let names = select.query_map([], |row| row.get(0))?;
    names.collect()
}

/// Brings the schema to the version `migrations` end at ([`MIGRATIONS`]:
/// [`SCHEMA_VERSION`]) in one transaction: all the missing steps or none.
pub(super) fn migrate(
    connection: &mut Connection,
    dir: &Path,
    migrations: &[Migration],
) -> StoreResult<()> {
    let target = migrations.len() as u32;
    let failed = |step: &str, error| store_error(dir, step, error);
    let transaction = connection
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .map_err(|error| failed("beginning the migration", error))?;
    let version =
        user_version(&transaction).map_err(|error| failed("reading the schema version", error))?;
    if version > target {
        return Err(StoreError(newer_message(dir, version, target)));
    }
    if version == target {
        return Ok(());
    }
    refuse_foreign(&transaction, dir, version)?;
    for (from, migration) in migrations.iter().enumerate().skip(version as usize) {
        migration(&transaction).map_err(|error| {
            failed(
                &format!("migrating from schema version {from} to {}", from + 1),
                error,
            )
        })?;
    }
    transaction
        .pragma_update(None, "user_version", target)
        .map_err(|error| failed("setting the schema version", error))?;
    transaction
        .commit()
        .map_err(|error| failed("committing the migration", error))
}

// ----- operations: check and backup ------------------------------------------

/// One table's name and records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TableCount {
    pub table: String,
    pub records: u64,
}

/// What [`check`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckReport {
    /// The database file.
    pub path: PathBuf,
    pub schema_version: u32,
    /// Every kind's table, in [`Kind::ALL`] order (none before version 1).
    pub tables: Vec<TableCount>,
    /// The database file and its WAL.
    pub bytes: u64,
    /// What is wrong; empty when the store is sound.
    pub problems: Vec<String>,
}

impl CheckReport {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }

    pub fn records(&self) -> u64 {
        self.tables.iter().map(|table| table.records).sum()
    }
}

/// What [`backup`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupReport {
    pub file: PathBuf,
    pub schema_version: u32,
    /// Every kind's table in the copy, in [`Kind::ALL`] order.
    pub tables: Vec<TableCount>,
    pub bytes: u64,
}

impl BackupReport {
    pub fn records(&self) -> u64 {
        self.tables.iter().map(|table| table.records).sum()
    }
}

/// The most `integrity_check` lines a report carries.
const INTEGRITY_LINES: u32 = 100;

/// Checks the store in `dir` offline: SQLite's `integrity_check`, the schema
/// version, every kind's table, the directory's mode; counts each table's
/// records. Reads through a read-only connection and never takes the lock,
/// so it also checks a running server's store (a consistent snapshot of
/// it); it changes no record (on a stopped store it leaves behind the empty
/// `-wal` and `-shm` files a reader needs, as any reader does). An `Err` is a store that cannot be read at all
/// (no directory, no database); a store that reads but is damaged is an
/// `Ok` report with problems.
pub fn check(dir: &Path) -> StoreResult<CheckReport> {
    check_with(dir, None)
}

/// [`check`], and then, when the file and its tables are sound, every
/// record of the same snapshot handed to `restore` (the state's recovery,
/// which decodes each of them as a start would): its error is a problem.
/// So a store that SQLite finds sound but that toolgate could not start on
/// fails its check.
pub fn check_records(
    dir: &Path,
    restore: &dyn Fn(Vec<Record>) -> Result<(), String>,
) -> StoreResult<CheckReport> {
    check_with(dir, Some(restore))
}

fn check_with(
    dir: &Path,
    restore: Option<&dyn Fn(Vec<Record>) -> Result<(), String>>,
) -> StoreResult<CheckReport> {
    let (db_path, mut problems) = existing_store(dir)?;
    let mut report = CheckReport {
        path: db_path.clone(),
        schema_version: 0,
        tables: Vec::new(),
        bytes: files_size(&db_path),
        problems: Vec::new(),
    };
    let mut connection = open_read_only(dir, &db_path)?;
    let corrupt_or = |step: &str, error: rusqlite::Error, problems: &mut Vec<String>| {
        if is_corruption(&error) {
            problems.push(format!("the database is damaged ({step}: {error})"));
            Ok(())
        } else {
            Err(store_error(dir, step, error))
        }
    };
    // One read transaction: the counts and the check of the same commit.
    let transaction = match connection.transaction() {
        Ok(transaction) => transaction,
        Err(error) => {
            corrupt_or("beginning a read", error, &mut problems)?;
            report.problems = problems;
            return Ok(report);
        }
    };
    match user_version(&transaction) {
        Ok(version) => report.schema_version = version,
        Err(error) => {
            corrupt_or("reading the schema version", error, &mut problems)?;
            report.problems = problems;
            return Ok(report);
        }
    }
    if report.schema_version > SCHEMA_VERSION {
        problems.push(newer_message(dir, report.schema_version, SCHEMA_VERSION));
        report.problems = problems;
        return Ok(report);
    }
    match integrity_check(&transaction) {
        Ok(lines) => problems.extend(
            lines
                .into_iter()
                .filter(|line| line != "ok")
                .map(|line| format!("integrity_check: {line}")),
        ),
        Err(error) => corrupt_or("integrity_check", error, &mut problems)?,
    }
    // What `serve` refuses, `check` reports: tables but no schema version
    // is a file of something else's.
    if let Err(foreign) = refuse_foreign(&transaction, dir, report.schema_version) {
        problems.push(foreign.0);
    }
    if report.schema_version == SCHEMA_VERSION {
        check_contents(
            &transaction,
            restore,
            &mut report,
            &mut problems,
            corrupt_or,
        )?;
    } else if report.schema_version > 0 && problems.is_empty() {
        // An older schema is checked as the next start will see it: this
        // snapshot, copied into memory and migrated there, must migrate
        // and restore. (Version 0, created and never migrated, holds
        // nothing.)
        match migrated_copy(&transaction, dir) {
            Ok(copy) => check_contents(&copy, restore, &mut report, &mut problems, corrupt_or)?,
            Err(why) => problems.push(format!(
                "the store does not migrate to schema version {SCHEMA_VERSION}: {why}"
            )),
        }
    }
    drop(transaction);
    report.problems = problems;
    Ok(report)
}

/// The tables of a store at this binary's schema, counted, and its records
/// handed to `restore` when the tables are sound.
fn check_contents(
    connection: &Connection,
    restore: Option<&dyn Fn(Vec<Record>) -> Result<(), String>>,
    report: &mut CheckReport,
    problems: &mut Vec<String>,
    corrupt_or: impl Fn(&str, rusqlite::Error, &mut Vec<String>) -> StoreResult<()>,
) -> StoreResult<()> {
    match table_counts(connection) {
        Ok((tables, missing)) => {
            report.tables = tables;
            problems.extend(
                missing
                    .into_iter()
                    .map(|table| format!("the {table} table is missing")),
            );
        }
        Err(error) => corrupt_or("counting records", error, problems)?,
    }
    if let Some(restore) = restore
        && problems.is_empty()
    {
        match read_records(connection) {
            Ok(records) => {
                if let Err(why) = restore(records) {
                    problems.push(format!("the records do not restore: {why}"));
                }
            }
            Err((_, error)) => corrupt_or("reading the records", error, problems)?,
        }
    }
    Ok(())
}

/// A copy in memory of what `source` reads, migrated to this binary's
/// schema (it takes memory the size of the store).
fn migrated_copy(source: &Connection, dir: &Path) -> Result<Connection, String> {
    let mut copy = Connection::open_in_memory().map_err(|error| error.to_string())?;
    // Every page in one step, from the snapshot `source` reads.
    let copied = Backup::new(source, &mut copy).and_then(|backup| backup.step(-1));
    match copied {
        Ok(StepResult::Done) => {}
        Ok(other) => return Err(format!("copying it: {other:?}")),
        Err(error) => return Err(format!("copying it: {error}")),
    }
    migrate(&mut copy, dir, MIGRATIONS).map_err(|error| error.0)?;
    Ok(copy)
}

/// Copies the store in `dir` to the new file `file`: one consistent
/// snapshot through SQLite's online backup API, taken from a read-only
/// connection without the lock, so that it works beside a running server
/// that keeps committing (which meanwhile cannot restart the WAL, so a
/// long backup lets it grow). The copy is made under `FILE.partial-PID`
/// and takes the name `file` only once whole and synced, so a backup
/// killed half-way leaves no `file`, only its partial copy. Refuses to
/// overwrite `file`; removes its partial copy when it fails. The copy opens as a store (see the module documentation
/// for restoring it).
pub fn backup(dir: &Path, file: &Path) -> StoreResult<BackupReport> {
    let (db_path, _) = existing_store(dir)?;
    let source = open_read_only(dir, &db_path)?;
    let version = user_version(&source)
        .map_err(|error| store_error(dir, "reading the schema version", error))?;
    refuse_newer(dir, version)?;
    let exists = || {
        StoreError(format!(
            "{} exists: a backup never overwrites a file; remove it or name another",
            file.display()
        ))
    };
    if fs::symlink_metadata(file).is_ok() {
        return Err(exists());
    }
    // A name of this backup's own: two backups to one FILE never share a
    // partial copy, and the rename below lets only one of them take FILE.
    let partial = sibling(file, &format!(".partial-{}", std::process::id()));
    claim_partial(&partial)?;
    let copied = copy_into(&source, &partial)
        .and_then(|report| sync_to_disk(&partial).map(|()| report))
        .and_then(|report| {
            // Never replacing a name: a file made meanwhile is kept.
            put_in_place(&partial, file).map_err(|error| match error.kind() {
                std::io::ErrorKind::AlreadyExists => exists(),
                _ => StoreError(format!("cannot create {}: {error}", file.display())),
            })?;
            sync_to_disk(file)?;
            Ok(BackupReport {
                file: file.to_path_buf(),
                bytes: files_size(file),
                ..report
            })
        });
    drop(source);
    if copied.is_err() {
        // This backup's own name, whatever happened.
        for suffix in ["", "-journal", "-wal", "-shm"] {
            let _ = fs::remove_file(sibling(&partial, suffix));
        }
    }
    copied
}

/// `path` with `suffix` added to its name.
fn sibling(path: &Path, suffix: &str) -> PathBuf {
    let mut name = path.as_os_str().to_os_string();
    name.push(suffix);
    PathBuf::from(name)
}

/// Makes `partial` anew, owner-only: a leftover of this process id (a
/// backup killed long ago) is removed first; `create_new` never follows a
/// link planted under the name.
fn claim_partial(partial: &Path) -> StoreResult<()> {
    let failed =
        |error: std::io::Error| StoreError(format!("cannot create {}: {error}", partial.display()));
    for suffix in ["", "-journal", "-wal", "-shm"] {
        match fs::remove_file(sibling(partial, suffix)) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                return Err(failed(error));
            }
            _ => {}
        }
    }
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(partial)
        .map(drop)
        .map_err(failed)
}

/// Gives the whole copy `partial` the name `file`, never replacing a file
/// of that name: a rename that refuses to replace where the file system
/// has one, else a hard link (then the partial name removed).
fn put_in_place(partial: &Path, file: &Path) -> std::io::Result<()> {
    use rustix::fs::{CWD, RenameFlags, renameat_with};
    use rustix::io::Errno;
    match renameat_with(CWD, partial, CWD, file, RenameFlags::NOREPLACE) {
        Ok(()) => Ok(()),
        Err(Errno::INVAL | Errno::NOSYS | Errno::NOTSUP) => {
            fs::hard_link(partial, file)?;
            fs::remove_file(partial)
        }
        Err(error) => Err(error.into()),
    }
}

/// How often, and how long apart, a backup retries a source that is busy.
const BACKUP_RETRIES: u32 = 200;
const BACKUP_PAUSE: Duration = Duration::from_millis(25);

/// Copies every page of `source` into the (empty) `file` and reads the copy
/// back: its schema version and records.
fn copy_into(source: &Connection, file: &Path) -> StoreResult<BackupReport> {
    let failed = |step: &str, error: &dyn std::fmt::Display| {
        StoreError(format!("the backup to {}: {step}: {error}", file.display()))
    };
    let mut destination = Connection::open_with_flags(
        file,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|error| failed("opening the copy", &error))?;
    {
        let backup = Backup::new(source, &mut destination)
            .map_err(|error| failed("starting the backup", &error))?;
        // Every page in one step: one read transaction on the source, so
        // one snapshot however fast the server writes (a step at a time
        // would restart whenever it commits).
        let mut retries = 0;
        loop {
            match backup
                .step(-1)
                .map_err(|error| failed("copying pages", &error))?
            {
                StepResult::Done => break,
                StepResult::More => {}
                StepResult::Busy | StepResult::Locked if retries < BACKUP_RETRIES => {
                    retries += 1;
                    std::thread::sleep(BACKUP_PAUSE);
                }
                _ => {
                    return Err(StoreError(format!(
                        "the backup to {}: the store stayed busy; try again",
                        file.display()
                    )));
                }
            }
        }
    }
    // The copy's header says WAL, as the source's does: made a single
    // rollback-journal file again, it needs no -wal or -shm beside it
    // wherever it is kept. A store opened on it goes back to WAL.
    destination
        .pragma_update(None, "journal_mode", "DELETE")
        .map_err(|error| failed("making the copy one file", &error))?;
    let schema_version =
        user_version(&destination).map_err(|error| failed("reading the copy back", &error))?;
    let (tables, missing) =
        table_counts(&destination).map_err(|error| failed("reading the copy back", &error))?;
    if schema_version == SCHEMA_VERSION
        && let Some(table) = missing.first()
    {
        return Err(failed(
            "reading the copy back",
            &format!("no {table} table"),
        ));
    }
    destination
        .close()
        .map_err(|(_, error)| failed("closing the copy", &error))?;
    Ok(BackupReport {
        file: file.to_path_buf(),
        schema_version,
        tables,
        bytes: files_size(file),
    })
}

/// Syncs `file` and the directory that names it.
fn sync_to_disk(file: &Path) -> StoreResult<()> {
    let failed = |step: &str, error: std::io::Error| {
        StoreError(format!("the backup to {}: {step}: {error}", file.display()))
    };
    File::open(file)
        .and_then(|copy| copy.sync_all())
        .map_err(|error| failed("syncing the copy", error))?;
    sync_parent(file).map_err(|error| failed("syncing its directory", error))
}

/// The database file of the store in `dir`, and what is wrong with the
/// directory's mode (a problem for [`check`], not a reason not to read).
fn existing_store(dir: &Path) -> StoreResult<(PathBuf, Vec<String>)> {
    let metadata = fs::metadata(dir).map_err(|error| {
        StoreError(format!(
            "no store at {}: cannot read the directory: {error}",
            dir.display()
        ))
    })?;
    if !metadata.is_dir() {
        return Err(StoreError(format!(
            "no store at {}: not a directory",
            dir.display()
        )));
    }
    let db_path = dir.join(DB_FILE);
    if !db_path.is_file() {
        return Err(StoreError(format!(
            "no store at {}: it holds no {DB_FILE}",
            dir.display()
        )));
    }
    Ok((
        db_path,
        loose_permissions(dir, &metadata).into_iter().collect(),
    ))
}

/// A database file that is missing or empty beside a write-ahead log that
/// holds commits is not a new store: SQLite would open it as one and
/// delete the log (every approval and receipt in it), even through a
/// read-only connection. Nor is an empty database file on its own: toolgate
/// makes a new store whole before it takes that name
/// ([`create_database`]), so an empty one is a store that lost its
/// contents (a failed copy or restore, a truncation), and opening it as new
/// would let every committed Dispatch commit again. Both refused, saying
/// what to do, for `serve` and for `store check` alike.
fn refuse_lost_database(dir: &Path, db_path: &Path) -> StoreResult<()> {
    let db_bytes = fs::metadata(db_path).map(|metadata| metadata.len());
    let wal_bytes = fs::metadata(wal_path(db_path)).map_or(0, |metadata| metadata.len());
    if db_bytes.as_ref().map_or(true, |bytes| *bytes == 0) && wal_bytes > 0 {
        return Err(StoreError(format!(
            "the SQLite store at {}: {DB_FILE} is missing or empty, but its write-ahead log \
             holds {wal_bytes} bytes of commits; not opened (SQLite would discard the log). \
             Restore {DB_FILE} from a backup (toolgate store backup), or move {DB_FILE}-wal, \
             {CREATED_FILE} and an empty {DB_FILE} away to start an empty store",
            dir.display()
        )));
    }
    if db_bytes.as_ref().is_ok_and(|bytes| *bytes == 0) {
        return Err(StoreError(format!(
            "the SQLite store at {}: {DB_FILE} is empty (0 bytes), and toolgate never leaves \
             one so: the store lost its contents; not opened as a new store. Restore \
             {DB_FILE} from a backup (toolgate store backup), or remove it and \
             {CREATED_FILE} to start an empty store",
            dir.display()
        )));
    }
    if db_bytes.is_err() && dir.join(CREATED_FILE).exists() {
        return Err(StoreError(format!(
            "the SQLite store at {}: {DB_FILE} is missing, but the directory held a store \
             ({CREATED_FILE}): it was moved, deleted or lost in a copy; not opened as a new \
             store, on which every committed Dispatch would commit again. Restore {DB_FILE} \
             from a backup (toolgate store backup), or remove {CREATED_FILE} to start an \
             empty store",
            dir.display()
        )));
    }
    Ok(())
}

/// Writes [`CREATED_FILE`] (once) beside a store's database, durably.
fn mark_created(dir: &Path) -> StoreResult<()> {
    let marker = dir.join(CREATED_FILE);
    if marker.exists() {
        return Ok(());
    }
    let note = format!(
        "toolgate keeps a store in this directory: {DB_FILE} missing beside this file is a \
         store lost, and toolgate refuses to start a new one here.\n"
    );
    OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&marker)
        .and_then(|mut file| {
            file.write_all(note.as_bytes())
                .and_then(|()| file.sync_all())
        })
        .and_then(|()| sync_parent(&marker))
        .map_err(|error| StoreError(format!("cannot write {}: {error}", marker.display())))
}

/// Makes a new store's database whole (its schema committed) under
/// [`CREATING_FILE`], then renames it to [`DB_FILE`]: a crash leaves either
/// no database, or one with its schema, never an empty file that
/// [`refuse_lost_database`] would take for a store that lost its contents.
/// Owner-only, like the WAL files SQLite gives the same mode (SQLite's own
/// default is 0644). A leftover of a creation that crashed is discarded:
/// nothing was ever committed to it.
fn create_database(dir: &Path, db_path: &Path) -> StoreResult<()> {
    let creating = dir.join(CREATING_FILE);
    let failed = |step: &str, error: &dyn std::fmt::Display| {
        StoreError(format!(
            "cannot create {} ({step}): {error}",
            db_path.display()
        ))
    };
    for suffix in ["", "-journal", "-wal", "-shm"] {
        let mut leftover = creating.clone().into_os_string();
        leftover.push(suffix);
        match fs::remove_file(&leftover) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                return Err(failed("removing a leftover", &error));
            }
            _ => {}
        }
    }
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&creating)
        .map_err(|error| failed("creating the file", &error))?;
    let mut connection = Connection::open_with_flags(
        &creating,
        OpenFlags::SQLITE_OPEN_READ_WRITE | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|error| failed("opening it", &error))?;
    migrate(&mut connection, dir, MIGRATIONS)?;
    connection
        .close()
        .map_err(|(_, error)| failed("closing it", &error))?;
    File::open(&creating)
        .and_then(|file| file.sync_all())
        .and_then(|()| fs::rename(&creating, db_path))
        .and_then(|()| sync_parent(db_path))
        .map_err(|error| failed("putting it in place", &error))
}

fn open_read_only(dir: &Path, db_path: &Path) -> StoreResult<Connection> {
    refuse_lost_database(dir, db_path)?;
    let connection = Connection::open_with_flags(
        db_path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|error| store_error(dir, "opening the database", error))?;
    connection
        .busy_timeout(BUSY_TIMEOUT)
        .map_err(|error| store_error(dir, "setting busy_timeout", error))?;
    Ok(connection)
}

fn is_corruption(error: &rusqlite::Error) -> bool {
    matches!(
        error.sqlite_error_code(),
        Some(ErrorCode::DatabaseCorrupt | ErrorCode::NotADatabase)
    )
}

fn integrity_check(connection: &Connection) -> rusqlite::Result<Vec<String>> {
    let mut lines = Vec::new();
    connection.pragma(None, "integrity_check", INTEGRITY_LINES, |row| {
        lines.push(row.get(0)?);
        Ok(())
    })?;
    Ok(lines)
}

/// Each kind's table's records, and the kinds' tables that are missing.
/// Every record of every kind's table, by kind and key (a load, and the
/// check of what a load would read); an error with the kind whose table
/// could not be read.
fn read_records(connection: &Connection) -> Result<Vec<Record>, (Kind, rusqlite::Error)> {
    let mut records = Vec::new();
    for kind in Kind::ALL {
        let mut read = || -> rusqlite::Result<()> {
            let sql = format!("SELECT k, v FROM {} ORDER BY k", kind.table());
            let mut select = connection.prepare_cached(&sql)?;
            let rows = select.query_map([], |row| {
                Ok(Record {
                    kind,
                    key: row.get(0)?,
                    value: row.get(1)?,
                })
            })?;
            for row in rows {
                records.push(row?);
            }
            Ok(())
        };
        read().map_err(|error| (kind, error))?;
    }
    Ok(records)
}

fn table_counts(connection: &Connection) -> rusqlite::Result<(Vec<TableCount>, Vec<String>)> {
    let present = tables(connection)?;
    let mut counts = Vec::new();
    let mut missing = Vec::new();
    for kind in Kind::ALL {
        let table = kind.table();
        if !present.iter().any(|name| name == table) {
            missing.push(table.to_string());
            continue;
        }
        let records: i64 =
            connection.query_row(&format!("SELECT count(*) FROM {table}"), [], |row| {
                row.get(0)
            })?;
        counts.push(TableCount {
            table: table.to_string(),
            records: records.unsigned_abs(),
        });
    }
    Ok((counts, missing))
}
