//! The PostgreSQL store: every record in one table of a schema of its own,
//! each commit one transaction (PostgreSQL's commit is durable once it
//! returns, with `synchronous_commit` on, which the store makes sure of for
//! its session).
//!
//! # Where: the URL
//!
//! `postgres://USER[:PASSWORD]@HOST[:PORT]/DB[?PARAM=VALUE&…]` (or
//! `postgresql://`), as libpq reads it, through [`PostgresTarget::parse`].
//! One parameter is toolgate's own: `schema=NAME` (default
//! [`DEFAULT_SCHEMA`], a lowercase SQL identifier), the PostgreSQL schema
//! the tables live in; every other parameter goes to the driver
//! (`connect_timeout`, `application_name`, `options`, …). A Unix socket is
//! `postgres://USER@%2Fvar%2Frun%2Fpostgresql/DB`. Connections are not
//! encrypted (this toolgate has no TLS for PostgreSQL yet): `sslmode=require`
//! is refused, so use a Unix socket, loopback or a trusted network.
//!
//! The password is never printed: every message names the database by
//! [`PostgresTarget`]'s `Display`, `postgres://USER@HOST:PORT/DB?schema=S`.
//!
//! # The schema
//!
//! - `S.records (kind smallint, key bytea, value bytea, PRIMARY KEY (kind,
//!   key))`: every record, its [`Kind`] by a fixed number ([`kind_code`]).
//! - `S.schema_version (version integer)`: one row, the schema's version.
//! - `S.commits (n bigint)`: one row, the number of commits made (from
//!   version 2). Every commit's transaction moves it on by one, so that
//!   after a lost connection the store reads whether the commit it was
//!   making took effect, instead of guessing or making it twice
//!   ([`Store::resume`]).
//!
//! [`MIGRATIONS`]`[n]` takes a schema from version `n` to `n + 1`; opening
//! applies the missing ones in one transaction (version 0: no
//! `schema_version` table, and no other table either). A schema of a version
//! newer than this binary knows is refused untouched; one that has tables but
//! no `schema_version` is someone else's and refused too.
//!
//! # One process at a time
//!
//! The engine keeps the state in memory and holds it authoritative (a grant
//! is consumed in memory, then journaled), so two toolgate processes on one
//! schema would each consume "their" grant. Until replicas land, opening
//! takes a session-level advisory lock keyed on the schema
//! (`pg_try_advisory_lock`), held as long as the connection, and a second
//! process is refused with the first one's backend pid and
//! `application_name` (`toolgate[PID]` unless the URL sets one).
//!
//! # Blocking
//!
//! The `postgres` crate is blocking: each connection runs its own
//! single-threaded tokio runtime. The store is used from the writer thread;
//! a call made from inside a tokio runtime (a test's, the engine opened in
//! one) runs on a thread of its own, since a runtime cannot be blocked on
//! from inside another.

use std::fmt;
use std::time::{Duration, Instant};

use postgres::config::{Host, SslMode};
use postgres::{Client, Config, NoTls, Statement};

use super::{Resume, Store, StoreError, StoreResult};
use crate::domain::records::{Change, Kind, Record};

/// The schema the tables live in when the URL names none (`?schema=`).
pub const DEFAULT_SCHEMA: &str = "toolgate";

/// How long connecting may take when the URL says nothing
/// (`connect_timeout`).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// How often, at most, the store asks the server for its size: the writer
/// asks after every batch, and the answer is for a gauge.
const SIZE_REFRESH: Duration = Duration::from_secs(1);

/// The first key of every toolgate advisory lock ("tool"); the second is
/// the schema's name hashed ([`lock_keys`]).
const LOCK_NAMESPACE: i32 = 0x746F_6F6C;

/// One step of the schema: takes it from version `n` (its index in
/// [`MIGRATIONS`]) to `n + 1`, inside the opening transaction, given the
/// schema's name (a checked identifier, safe to put into SQL).
pub type Migration = fn(&mut postgres::Transaction<'_>, &str) -> Result<(), postgres::Error>;

/// The schema's history, oldest first. Append only: a released migration is
/// never changed, since schemas made with it exist.
pub const MIGRATIONS: &[Migration] = &[create_v1_tables, create_v2_commit_count];

/// The schema version this binary writes (and the newest it can open).
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

pub(super) fn create_v1_tables(
    transaction: &mut postgres::Transaction<'_>,
    schema: &str,
) -> Result<(), postgres::Error> {
    transaction.batch_execute(&format!(
        "CREATE TABLE {schema}.records (\
             kind smallint NOT NULL, \
             key bytea NOT NULL, \
             value bytea NOT NULL, \
             PRIMARY KEY (kind, key))"
    ))
}

/// Version 2: `S.commits (n bigint, token bytea)`, one row: the number of
/// commits made and a random token of the last, written by every commit's
/// transaction, so that after a lost connection the store can tell whether
/// the commit it was making took effect ([`Store::resume`]).
pub(super) fn create_v2_commit_count(
    transaction: &mut postgres::Transaction<'_>,
    schema: &str,
) -> Result<(), postgres::Error> {
    transaction.batch_execute(&format!(
        "CREATE TABLE {schema}.commits (\
             n bigint NOT NULL CHECK (n >= 0), \
             token bytea NOT NULL, \
             one boolean PRIMARY KEY DEFAULT true CHECK (one)); \
         INSERT INTO {schema}.commits (n, token) VALUES (0, '')"
    ))
}

/// The number a kind is kept under in `records.kind`. Fixed forever: a
/// stored number means the same kind to every later toolgate.
pub fn kind_code(kind: Kind) -> i16 {
    match kind {
        Kind::Meta => 1,
        Kind::Approval => 2,
        Kind::Session => 3,
        Kind::DecidedCall => 4,
        Kind::Resource => 5,
        Kind::QueueItem => 6,
        Kind::Receipt => 7,
        Kind::Pin => 8,
        Kind::Assessment => 9,
    }
}

fn kind_of(code: i16) -> Option<Kind> {
    Kind::ALL.into_iter().find(|kind| kind_code(*kind) == code)
}

// ----- the URL ----------------------------------------------------------------

/// A PostgreSQL database and schema to keep the state in, parsed from a
/// URL. Its `Display` and `Debug` forms never show the password.
#[derive(Clone)]
pub struct PostgresTarget {
    config: Config,
    schema: String,
    shown: String,
}

impl PostgresTarget {
    /// Parses `postgres://…` or `postgresql://…` (see the module
    /// documentation). The error names the rule broken, never the password.
    pub fn parse(text: &str) -> StoreResult<Self> {
        let refuse = |rule: &str| StoreError(format!("the store URL {}: {rule}", redact(text)));
        if !(text.starts_with("postgres://") || text.starts_with("postgresql://")) {
            return Err(refuse("must start with postgres:// or postgresql://"));
        }
        let (base, query) = match text.split_once('?') {
            Some((base, query)) => (base, Some(query)),
            None => (text, None),
        };
        // An `@` past the host, or a parameter name that is not one, is a
        // password's `/`, `?` or `@` left as it is: refused, so that none of
        // it is ever taken for a database or parameter name and shown.
        let encode_them = "percent-encode `/`, `?`, `&` and `@` in a user name or \
                           password (%2F, %3F, %26, %40)";
        let after_scheme = base.split_once("://").map_or(base, |(_, rest)| rest);
        if after_scheme
            .split_once('/')
            .is_some_and(|(_, path)| path.contains('@'))
        {
            return Err(refuse(&format!("an `@` after the host: {encode_them}")));
        }
        let mut schema = None;
        let mut passed = Vec::new();
        for pair in query.into_iter().flat_map(|query| query.split('&')) {
            if pair.is_empty() {
                continue;
            }
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(refuse(&format!(
                    "a parameter name that is not [A-Za-z0-9_]+: {encode_them}"
                )));
            }
            if key != "schema" {
                passed.push(pair);
                continue;
            }
            if schema.is_some() {
                return Err(refuse("the schema parameter is given twice"));
            }
            let value = decode(value);
            check_schema(&value).map_err(|rule| refuse(&format!("schema: {rule}")))?;
            schema = Some(value);
        }
        let for_driver = match passed.is_empty() {
            true => base.to_string(),
            false => format!("{base}?{}", passed.join("&")),
        };
        let mut config: Config = for_driver.parse().map_err(|error: postgres::Error| {
            // The driver's parse errors name the option, never its value.
            refuse(&describe(&error))
        })?;
        if config.get_ssl_mode() == SslMode::Require {
            return Err(refuse(
                "sslmode=require: this toolgate has no TLS for PostgreSQL yet; \
                 connect over a Unix socket, loopback or a trusted network",
            ));
        }
        if config.get_hosts().is_empty() {
            return Err(refuse("names no host"));
        }
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(DEFAULT_CONNECT_TIMEOUT);
        }
        if config.get_application_name().is_none() {
            config.application_name(&format!("toolgate[{}]", std::process::id()));
        }
        let schema = schema.unwrap_or_else(|| DEFAULT_SCHEMA.to_string());
        let shown = show(&config, &schema);
        Ok(PostgresTarget {
            config,
            schema,
            shown,
        })
    }

    /// The PostgreSQL schema the tables live in.
    pub fn schema(&self) -> &str {
        &self.schema
    }

    /// The same database with another schema (tests: one schema each).
    pub fn with_schema(&self, schema: &str) -> StoreResult<Self> {
        check_schema(schema)
            .map_err(|rule| StoreError(format!("the store URL {}: schema: {rule}", self.shown)))?;
        Ok(PostgresTarget {
            config: self.config.clone(),
            schema: schema.to_string(),
            shown: show(&self.config, schema),
        })
    }

    /// A new connection, for the store and for tests that look at what it
    /// wrote. The error names the database and the step.
    pub fn connect(&self) -> StoreResult<Client> {
        let config = self.config.clone();
        outside_runtime(move || config.connect(NoTls)).map_err(|error| {
            StoreError(format!(
                "the PostgreSQL store at {self}: connecting: {}",
                describe(&error)
            ))
        })
    }
}

impl fmt::Display for PostgresTarget {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter.write_str(&self.shown)
    }
}

impl fmt::Debug for PostgresTarget {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(formatter, "PostgresTarget({})", self.shown)
    }
}

/// A schema name is a plain lowercase SQL identifier, so that it goes into
/// SQL unquoted and means what it says.
fn check_schema(name: &str) -> Result<(), String> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|first| first.is_ascii_lowercase() || first == '_');
    if !first_ok
        || name.len() > 63
        || !name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
    {
        return Err(format!(
            "{:?} is not a schema name: [a-z_][a-z0-9_]*, at most 63 characters",
            name.chars().take(80).collect::<String>()
        ));
    }
    if name.starts_with("pg_") || name == "information_schema" || name == "public" {
        return Err(format!(
            "{name:?} is reserved; name a schema of toolgate's own"
        ));
    }
    Ok(())
}

fn decode(text: &str) -> String {
    percent_encoding::percent_decode_str(text)
        .decode_utf8_lossy()
        .into_owned()
}

/// `postgres://USER@HOST:PORT[,HOST:PORT]/DB?schema=S`, from what the driver
/// parsed: no password, whatever form it was given in.
fn show(config: &Config, schema: &str) -> String {
    let mut shown = String::from("postgres://");
    if let Some(user) = config.get_user() {
        shown.push_str(&encode(user));
        shown.push('@');
    }
    let ports = config.get_ports();
    let hosts: Vec<String> = config
        .get_hosts()
        .iter()
        .enumerate()
        .map(|(index, host)| {
            let port = match ports {
                [] => 5432,
                [port] => *port,
                ports => ports.get(index).copied().unwrap_or(5432),
            };
            let host = match host {
                Host::Tcp(name) if name.contains(':') => format!("[{name}]"),
                Host::Tcp(name) => encode(name),
                Host::Unix(path) => encode(&path.display().to_string()),
            };
            format!("{host}:{port}")
        })
        .collect();
    shown.push_str(&hosts.join(","));
    shown.push('/');
    if let Some(db) = config.get_dbname() {
        shown.push_str(&encode(db));
    }
    shown.push_str("?schema=");
    shown.push_str(schema);
    shown
}

fn encode(text: &str) -> String {
    const SPECIAL: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
        .remove(b'-')
        .remove(b'.')
        .remove(b'_')
        .remove(b'~');
    percent_encoding::utf8_percent_encode(text, SPECIAL).to_string()
}

/// A URL's text with any password taken out (`user:secret@` → `user@`,
/// `password=…` dropped), for messages about a URL that did not parse. The
/// user information ends at the last `@`, so that a password with a `/`,
/// `?` or `@` the URL should have percent-encoded is still left out (of a
/// malformed URL, less may be shown than was given, never the password).
pub fn redact(text: &str) -> String {
    let text = text.chars().take(300).collect::<String>();
    let (scheme, rest) = match text.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest.to_string()),
        None => (String::new(), text),
    };
    let rest = match rest.rsplit_once('@') {
        Some((userinfo, after)) => {
            let user = userinfo.split([':', '/', '?']).next().unwrap_or("");
            format!("{user}@{after}")
        }
        None => rest,
    };
    let mut shown = scheme;
    match rest.split_once('?') {
        Some((before, query)) => {
            shown.push_str(before);
            let kept: Vec<&str> = query
                .split('&')
                .filter(|pair| !decode(pair.split('=').next().unwrap_or("")).contains("password"))
                .collect();
            if !kept.is_empty() {
                shown.push('?');
                shown.push_str(&kept.join("&"));
            }
        }
        None => shown.push_str(&rest),
    }
    shown.chars().filter(|c| !c.is_control()).collect()
}

/// The driver's error without anything a record could be in: a server error
/// is its severity, code and message (never its DETAIL, which can quote a
/// row's values).
fn describe(error: &postgres::Error) -> String {
    match error.as_db_error() {
        Some(db) => format!("{} {}: {}", db.severity(), db.code().code(), db.message()),
        None => {
            // The driver's own text is its kind ("error connecting to
            // server"); what went wrong is in the sources.
            let mut text = error.to_string();
            let mut source = std::error::Error::source(error);
            while let Some(cause) = source {
                text.push_str(": ");
                text.push_str(&cause.to_string());
                source = cause.source();
            }
            text
        }
    }
}

/// Runs `work` where a blocking PostgreSQL call may run: here, or on a
/// thread of its own when this thread is inside a tokio runtime.
fn outside_runtime<T: Send>(work: impl FnOnce() -> T + Send) -> T {
    if tokio::runtime::Handle::try_current().is_err() {
        return work();
    }
    std::thread::scope(|scope| {
        scope
            .spawn(work)
            .join()
            .unwrap_or_else(|panic| std::panic::resume_unwind(panic))
    })
}

/// The advisory lock's two keys for `schema`: toolgate's namespace and a
/// hash of the name (FNV-1a, 31 bits, so that it reads back the same from
/// `pg_locks.objid`).
pub(super) fn lock_keys(schema: &str) -> (i32, i32) {
    let mut hash: u32 = 0x811C_9DC5;
    for byte in schema.bytes() {
        hash ^= u32::from(byte);
        hash = hash.wrapping_mul(0x0100_0193);
    }
    (LOCK_NAMESPACE, (hash & 0x7FFF_FFFF) as i32)
}

// ----- the store ----------------------------------------------------------------

/// What opening found and did to the schema.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Opened {
    /// The version found (0: no tables yet).
    pub found: u32,
    /// The version now ([`SCHEMA_VERSION`]).
    pub version: u32,
}

impl Opened {
    /// For the start-up line: "created the tables", "migrated …", or
    /// nothing when the schema was current.
    pub fn describe(&self) -> Option<String> {
        match self.found {
            0 => Some(format!(
                "created the tables (schema version {})",
                self.version
            )),
            found if found < self.version => Some(format!(
                "migrated the schema from version {found} to {}",
                self.version
            )),
            _ => None,
        }
    }
}

/// The PostgreSQL store (see the module documentation).
pub struct PostgresStore {
    /// `None` only while dropping.
    client: Option<Client>,
    target: PostgresTarget,
    upsert: Statement,
    delete: Statement,
    select: Statement,
    size: Statement,
    count: Statement,
    /// Commits made, as `S.commits` holds it after the last one this store
    /// saw succeed.
    commits: i64,
    /// The token of the commit being made, until it is known to have
    /// succeeded: what `S.commits` holds if it took effect.
    making: Option<[u8; 16]>,
    /// Fault injection: the next commit takes effect, then fails as if its
    /// answer was lost with the connection.
    #[cfg(test)]
    pub(super) lose_next_answer: bool,
    bytes: u64,
    measured: Instant,
    opened: Opened,
}

impl fmt::Debug for PostgresStore {
    fn fmt(&self, formatter: &mut fmt::Formatter<'_>) -> fmt::Result {
        formatter
            .debug_struct("PostgresStore")
            .field("target", &self.target)
            .field("opened", &self.opened)
            .finish_non_exhaustive()
    }
}

impl PostgresStore {
    /// Connects, takes the schema's lock, and creates or migrates its
    /// tables. Refused: an unreachable database, a schema another toolgate
    /// holds, one of a newer version (untouched), one with tables that are
    /// not a toolgate store's.
    pub fn open(target: &PostgresTarget) -> StoreResult<Self> {
        Self::open_with(target, MIGRATIONS)
    }

    pub(super) fn open_with(
        target: &PostgresTarget,
        migrations: &[Migration],
    ) -> StoreResult<Self> {
        let mut client = target.connect()?;
        let opened = outside_runtime(|| prepare_schema(&mut client, target, migrations));
        let prepared = opened.and_then(|opened| {
            outside_runtime(|| prepare_statements(&mut client, target)).map(|s| (opened, s))
        });
        let prepared = prepared.and_then(|(opened, statements)| {
            let commits = outside_runtime(|| {
                client.query_one(&format!("SELECT n FROM {}.commits", target.schema()), &[])
            })
            .map_err(|error| store_error(target, "reading the commit count", &error))?
            .get(0);
            Ok((opened, statements, commits))
        });
        let (opened, (upsert, delete, select, size, count), commits) = match prepared {
            Ok(prepared) => prepared,
            Err(error) => {
                // The lock goes with the connection, before the caller can
                // try again.
                let _ = outside_runtime(move || unlock_and_close(client, target.schema()));
                return Err(error);
            }
        };
        let mut store = PostgresStore {
            client: Some(client),
            target: target.clone(),
            upsert,
            delete,
            select,
            size,
            count,
            commits,
            making: None,
            #[cfg(test)]
            lose_next_answer: false,
            bytes: 0,
            measured: Instant::now(),
            opened,
        };
        store.measure();
        Ok(store)
    }

    /// The token of the last commit (`S.commits.token`).
    fn last_token(&mut self) -> StoreResult<Vec<u8>> {
        let client = self
            .client
            .as_mut()
            .ok_or_else(|| StoreError("the PostgreSQL store is closed".into()))?;
        let sql = format!("SELECT token FROM {}.commits", self.target.schema());
        client
            .query_one(&sql, &[])
            .map(|row| row.get(0))
            .map_err(|error| store_error(&self.target, "reading the last commit", &error))
    }

    /// The database and schema.
    pub fn target(&self) -> &PostgresTarget {
        &self.target
    }

    /// What opening found and did.
    pub fn opened(&self) -> Opened {
        self.opened
    }

    /// Asks the server what the table and its index take.
    fn measure(&mut self) {
        let Some(client) = self.client.as_mut() else {
            return;
        };
        let size = &self.size;
        // A gauge: when the server cannot say, the last answer stands, and
        // the next commit finds out whether the connection is gone.
        if let Ok(row) = outside_runtime(|| client.query_one(size, &[])) {
            let bytes: i64 = row.get(0);
            self.bytes = bytes.unsigned_abs();
        }
        self.measured = Instant::now();
    }
}

fn store_error(target: &PostgresTarget, step: &str, error: &postgres::Error) -> StoreError {
    StoreError(format!(
        "the PostgreSQL store at {target}: {step}: {}",
        describe(error)
    ))
}

/// Makes sure commits are durable, takes the lock, checks what the schema
/// holds and brings it to the version `migrations` end at.
fn prepare_schema(
    client: &mut Client,
    target: &PostgresTarget,
    migrations: &[Migration],
) -> StoreResult<Opened> {
    let failed = |step: &str| {
        let step = step.to_string();
        move |error: postgres::Error| store_error(target, &step, &error)
    };
    let schema = target.schema();
    // The server's notices ("already exists, skipping") would reach the log
    // through the driver; warnings and errors still do.
    client
        .batch_execute("SET client_min_messages = warning")
        .map_err(failed("setting client_min_messages"))?;
    // `off` would answer a commit before it is on disk; `local`, `on` and
    // stronger settings are durable and kept as the server has them.
    let synchronous: String = client
        .query_one("SHOW synchronous_commit", &[])
        .map_err(failed("reading synchronous_commit"))?
        .get(0);
    if synchronous == "off" {
        client
            .batch_execute("SET synchronous_commit = on")
            .map_err(failed("setting synchronous_commit = on"))?;
    }
    let (namespace, key) = lock_keys(schema);
    let locked: bool = client
        .query_one("SELECT pg_try_advisory_lock($1, $2)", &[&namespace, &key])
        .map_err(failed("taking the schema's lock"))?
        .get(0);
    if !locked {
        return Err(StoreError(in_use_message(client, target, namespace, key)));
    }
    let mut transaction = client
        .transaction()
        .map_err(failed("beginning the migration"))?;
    let tables: Vec<String> = transaction
        .query(
            "SELECT c.relname::text FROM pg_catalog.pg_class c \
             JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
             WHERE n.nspname = $1 AND c.relkind IN ('r', 'p', 'v', 'm', 'f') \
             ORDER BY 1",
            &[&schema],
        )
        .map_err(failed("reading the schema"))?
        .iter()
        .map(|row| row.get(0))
        .collect();
    let found = if tables.iter().any(|table| table == "schema_version") {
        let rows = transaction
            .query(&format!("SELECT version FROM {schema}.schema_version"), &[])
            .map_err(failed("reading the schema version"))?;
        let version: Option<i32> = match rows.as_slice() {
            [row] => row.get(0),
            _ => None,
        };
        match version.and_then(|version| u32::try_from(version).ok()) {
            Some(version) if version > 0 => version,
            _ => {
                return Err(StoreError(format!(
                    "the PostgreSQL store at {target}: {schema}.schema_version must hold one \
                     positive version; it holds {} row(s): not a toolgate schema, or a damaged one",
                    rows.len()
                )));
            }
        }
    } else if tables.is_empty() {
        0
    } else {
        return Err(StoreError(format!(
            "the PostgreSQL store at {target}: schema {schema} is not a toolgate store: it has \
             tables ({}) but no schema_version; name another schema (?schema=NAME)",
            tables.join(", ")
        )));
    };
    let target_version = migrations.len() as u32;
    if found > target_version {
        return Err(StoreError(format!(
            "the PostgreSQL store at {target} has schema version {found}; this toolgate knows \
             up to {target_version}: upgrade toolgate"
        )));
    }
    if found < target_version {
        transaction
            .batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {schema}"))
            .map_err(failed("creating the schema"))?;
        if found == 0 {
            transaction
                .batch_execute(&format!(
                    "CREATE TABLE {schema}.schema_version (\
                         version integer NOT NULL CHECK (version > 0), \
                         one boolean PRIMARY KEY DEFAULT true CHECK (one))"
                ))
                .map_err(failed("creating the schema_version table"))?;
        }
        for (from, migration) in migrations.iter().enumerate().skip(found as usize) {
            migration(&mut transaction, schema).map_err(failed(&format!(
                "migrating from schema version {from} to {}",
                from + 1
            )))?;
        }
        let version = i32::try_from(target_version).unwrap_or(i32::MAX);
        transaction
            .execute(
                &format!(
                    "INSERT INTO {schema}.schema_version (version) VALUES ($1) \
                     ON CONFLICT (one) DO UPDATE SET version = excluded.version"
                ),
                &[&version],
            )
            .map_err(failed("setting the schema version"))?;
    }
    let has_records: bool = transaction
        .query_one(
            "SELECT to_regclass($1) IS NOT NULL",
            &[&format!("{schema}.records")],
        )
        .map_err(failed("reading the schema"))?
        .get(0);
    if !has_records {
        return Err(StoreError(format!(
            "the PostgreSQL store at {target} has no {schema}.records table \
             (schema version {found}): damaged; restore it or name another schema"
        )));
    }
    transaction
        .commit()
        .map_err(failed("committing the migration"))?;
    Ok(Opened {
        found,
        version: target_version,
    })
}

/// The refusal of a schema another session holds, naming that session as
/// far as the server tells.
fn in_use_message(
    client: &mut Client,
    target: &PostgresTarget,
    namespace: i32,
    key: i32,
) -> String {
    let holder = client
        .query_opt(
            "SELECT l.pid, a.application_name, host(a.client_addr) \
             FROM pg_catalog.pg_locks l \
             LEFT JOIN pg_catalog.pg_stat_activity a ON a.pid = l.pid \
             WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2 \
             AND l.classid::int8 = $1 AND l.objid::int8 = $2 \
             AND l.database = (SELECT oid FROM pg_catalog.pg_database \
                               WHERE datname = current_database()) \
             LIMIT 1",
            &[&i64::from(namespace), &i64::from(key)],
        )
        .ok()
        .flatten()
        .map(|row| {
            let pid: i32 = row.get(0);
            let name: Option<String> = row.get(1);
            let from: Option<String> = row.get(2);
            let mut holder = format!("backend pid {pid}");
            if let Some(name) = name.filter(|name| !name.is_empty()) {
                holder.push_str(&format!(", application_name {name:?}"));
            }
            if let Some(from) = from {
                holder.push_str(&format!(", from {from}"));
            }
            holder
        });
    format!(
        "the PostgreSQL store at {target} is in use by another toolgate process ({}): \
         one toolgate process per database and schema for now (several replicas on one \
         database are not supported yet); stop the other or name another schema (?schema=NAME)",
        holder.unwrap_or_else(|| "the server did not say which".into())
    )
}

fn prepare_statements(
    client: &mut Client,
    target: &PostgresTarget,
) -> StoreResult<(Statement, Statement, Statement, Statement, Statement)> {
    let schema = target.schema();
    let prepare = |client: &mut Client, sql: &str| {
        client
            .prepare(sql)
            .map_err(|error| store_error(target, "preparing statements", &error))
    };
    let upsert = prepare(
        client,
        &format!(
            "INSERT INTO {schema}.records (kind, key, value) \
             SELECT * FROM unnest($1::int2[], $2::bytea[], $3::bytea[]) \
             ON CONFLICT (kind, key) DO UPDATE SET value = excluded.value"
        ),
    )?;
    let delete = prepare(
        client,
        &format!(
            "DELETE FROM {schema}.records r \
             USING unnest($1::int2[], $2::bytea[]) AS d(kind, key) \
             WHERE r.kind = d.kind AND r.key = d.key"
        ),
    )?;
    let select = prepare(
        client,
        &format!("SELECT kind, key, value FROM {schema}.records"),
    )?;
    let size = prepare(
        client,
        &format!("SELECT pg_total_relation_size('{schema}.records'::regclass)"),
    )?;
    let count = prepare(
        client,
        &format!("UPDATE {schema}.commits SET n = $1, token = $3 WHERE n = $2"),
    )?;
    Ok((upsert, delete, select, size, count))
}

fn unlock_and_close(mut client: Client, schema: &str) -> Result<(), postgres::Error> {
    let (namespace, key) = lock_keys(schema);
    // Explicitly, so that the lock is free when this returns: the server
    // ends a closed session's backend (and its locks) in its own time.
    // Only a lock this session holds: unlocking another's is a warning.
    client.execute(
        "SELECT pg_advisory_unlock($1, $2) FROM pg_catalog.pg_locks \
         WHERE locktype = 'advisory' AND granted AND pid = pg_backend_pid() \
         AND objsubid = 2 AND classid::int8 = $3 AND objid::int8 = $4",
        &[&namespace, &key, &i64::from(namespace), &i64::from(key)],
    )?;
    client.close()
}

impl Drop for PostgresStore {
    fn drop(&mut self) {
        if let Some(client) = self.client.take() {
            let schema = self.target.schema().to_string();
            let _ = outside_runtime(move || unlock_and_close(client, &schema));
        }
    }
}

/// The kinds' table names, for a message about a statement over them.
fn kinds_named(kinds: &[i16]) -> String {
    let mut named: Vec<&str> = Vec::new();
    for kind in Kind::ALL {
        if kinds.contains(&kind_code(kind)) {
            named.push(kind.table());
        }
    }
    named.join(", ")
}

impl Store for PostgresStore {
    fn name(&self) -> &'static str {
        "postgres"
    }

    fn load(&mut self) -> StoreResult<Vec<Record>> {
        let client = self
            .client
            .as_mut()
            .ok_or_else(|| StoreError("the PostgreSQL store is closed".into()))?;
        let select = &self.select;
        let rows = outside_runtime(|| client.query(select, &[]))
            .map_err(|error| store_error(&self.target, "reading the records", &error))?;
        let mut records = Vec::with_capacity(rows.len());
        for row in rows {
            let code: i16 = row.get(0);
            let kind = kind_of(code).ok_or_else(|| {
                StoreError(format!(
                    "the PostgreSQL store at {}: a record of kind {code}, which this toolgate \
                     does not know (written by a newer one?)",
                    self.target
                ))
            })?;
            records.push(Record {
                kind,
                key: row.get(1),
                value: row.get(2),
            });
        }
        Ok(records)
    }

    fn commit(&mut self, changes: &[Change]) -> StoreResult<()> {
        if changes.is_empty() {
            return Ok(());
        }
        // The last change of each record is the one that counts; with one
        // left per record, the deletions and writes can go as one statement
        // each, in either order.
        let (mut put_kinds, mut put_keys, mut put_values) = (Vec::new(), Vec::new(), Vec::new());
        let (mut gone_kinds, mut gone_keys) = (Vec::new(), Vec::new());
        let last = changes
            .iter()
            .zip(super::last_of_each_record(changes))
            .filter_map(|(change, last)| last.then_some(change));
        for change in last {
            match &change.value {
                Some(value) => {
                    put_kinds.push(kind_code(change.kind));
                    put_keys.push(change.key.as_slice());
                    put_values.push(value.as_slice());
                }
                None => {
                    gone_kinds.push(kind_code(change.kind));
                    gone_keys.push(change.key.as_slice());
                }
            }
        }
        let client = self
            .client
            .as_mut()
            .ok_or_else(|| StoreError("the PostgreSQL store is closed".into()))?;
        let (upsert, delete, count) = (&self.upsert, &self.delete, &self.count);
        let (before, after) = (self.commits, self.commits + 1);
        let token: [u8; 16] = rand::random();
        self.making = Some(token);
        let target = &self.target;
        let committed = outside_runtime(|| -> Result<(), (String, Option<postgres::Error>)> {
            let step = |what: String| move |error| (what, Some(error));
            // A transaction dropped before its commit rolls back: all or
            // nothing.
            let mut transaction = client
                .transaction()
                .map_err(step("beginning a commit".into()))?;
            if !gone_kinds.is_empty() {
                transaction
                    .execute(delete, &[&gone_kinds, &gone_keys])
                    .map_err(step(format!(
                        "deleting {} record(s) of {}",
                        gone_kinds.len(),
                        kinds_named(&gone_kinds)
                    )))?;
            }
            if !put_kinds.is_empty() {
                transaction
                    .execute(upsert, &[&put_kinds, &put_keys, &put_values])
                    .map_err(step(format!(
                        "writing {} record(s) of {}",
                        put_kinds.len(),
                        kinds_named(&put_kinds)
                    )))?;
            }
            let counted = transaction
                .execute(count, &[&after, &before, &token.as_slice()])
                .map_err(step("counting the commit".into()))?;
            if counted != 1 {
                // Only another writer on the schema moves the count: refuse
                // to write beside it.
                return Err(("counting the commit".into(), None));
            }
            transaction.commit().map_err(step("committing".into()))
        });
        committed.map_err(|(step, error)| match error {
            Some(error) => store_error(target, &step, &error),
            None => StoreError(format!(
                "the PostgreSQL store at {target}: {step}: the count of commits is not {before}: \
                 another process writes to this schema"
            )),
        })?;
        self.commits = after;
        self.making = None;
        #[cfg(test)]
        if std::mem::take(&mut self.lose_next_answer) {
            self.making = Some(token);
            self.commits = before;
            return Err(StoreError(
                "the answer to the commit was lost (a test)".into(),
            ));
        }
        if self.measured.elapsed() >= SIZE_REFRESH {
            self.measure();
        }
        Ok(())
    }

    fn size_bytes(&self) -> u64 {
        self.bytes
    }

    /// Connects again (taking the schema's lock again: the lost session's
    /// went with it, though the server may take a moment to notice) and
    /// reads `S.commits`: the token of the failed commit means it took
    /// effect; the count this store saw succeed, that it did not; anything
    /// else, that another process wrote meanwhile (final).
    fn resume(&mut self) -> Resume {
        if let Some(client) = self.client.take() {
            let schema = self.target.schema().to_string();
            let _ = outside_runtime(move || unlock_and_close(client, &schema));
        }
        let mut fresh = match PostgresStore::open(&self.target) {
            Ok(fresh) => fresh,
            Err(error) => return Resume::Unreachable(error),
        };
        let (saw, found) = (self.commits, fresh.commits);
        let token = match outside_runtime(|| fresh.last_token()) {
            Ok(token) => token,
            Err(error) => return Resume::Unreachable(error),
        };
        let resumed =
            if found == saw + 1 && self.making.is_some_and(|making| making[..] == token[..]) {
                Resume::Committed
            } else if found == saw {
                Resume::NotCommitted
            } else {
                return Resume::Final(Some(StoreError(format!(
                    "the PostgreSQL store at {}: the count of commits is {found}, not {saw} or one \
                 more: another process wrote to this schema while the connection was lost",
                    self.target
                ))));
            };
        *self = fresh;
        resumed
    }
}
