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
//! (`connect_timeout`, `application_name`, `options`, …; a time limit the
//! URL's `options` sets, `-c lock_timeout=…`, wins over `[server]`'s). A
//! Unix socket is
//! `postgres://USER@%2Fvar%2Frun%2Fpostgresql/DB`. Connections are not
//! encrypted (this toolgate has no TLS for PostgreSQL yet): `sslmode=require`
//! is refused, so use a Unix socket, loopback or a trusted network.
//!
//! The password is never printed: every message names the database by
//! [`PostgresTarget`]'s `Display`, `postgres://USER@HOST:PORT/DB?schema=S`.
//!
//! # The schema
//!
//! - `S.records (kind smallint, key bytea, value bytea, seq bigint,
//!   PRIMARY KEY (kind, key))`: every record, its [`Kind`] by a fixed number
//!   ([`kind_code`]), `seq` the commit that wrote it last; a deleted record
//!   stays a while as a tombstone (`value` NULL; from version 3).
//! - `S.schema_version (version integer)`: one row, the schema's version.
//! - `S.commits (n bigint, token bytea, purged bigint)`: one row, the number
//!   of commits made (from version 2), the last one's token, and up to which
//!   commit tombstones are purged (from version 3).
//! - `S.tokens (token bytea, n bigint)`: the token of each recent commit and
//!   its number (from version 3), so that after a lost connection the store
//!   reads whether the commit it was making took effect, instead of
//!   guessing or making it twice ([`Store::resume`]).
//! - `S.transitions (n bigint, ord integer, key bytea, value bytea)`: every
//!   version of an approval record commit `n` wrote, in order (from version
//!   3): what another replica's watchers are told.
//!
//! [`MIGRATIONS`]`[n]` takes a schema from version `n` to `n + 1`; opening
//! applies the missing ones in one transaction, under the store's lock
//! (version 0: no `schema_version` table, and no other table either). A
//! schema of a version newer than this binary knows is refused untouched;
//! one that has tables but no `schema_version` is someone else's and
//! refused too.
//!
//! # Replicas
//!
//! Any number of toolgate processes may share one schema. Each keeps the
//! state in memory and works on it only in a turn
//! ([`Store::begin_turn`](super::Store::begin_turn), see
//! [`store`](super)): a transaction that first takes the store's lock,
//! `pg_advisory_xact_lock` keyed on the schema ([`lock_keys`]), then reads
//! `S.commits` and the server's `clock_timestamp()` (the time of every
//! operation of the turn: the replicas share one clock) and the records
//! with `seq` above what this replica has seen (other replicas' commits,
//! applied to the state before any operation of the turn reads it); the
//! turn's changes are written with the next commit number in one statement
//! that also moves `S.commits` on (only from the number read under the
//! lock) and keeps the token, and the transaction commits, releasing the
//! lock. So every grant consumed, receipt made and version checked is
//! checked against the state every replica committed, in one order, by the
//! database's lock: a replica that dies mid-turn loses its transaction and
//! the lock with it (a session idle in a turn for `[server]
//! postgres_turn_idle_timeout_ms` is ended by the server; a turn waits at
//! most `postgres_lock_timeout_ms` for the lock).
//!
//! # Connections
//!
//! tokio-postgres connections from a deadpool pool, run on a
//! single-threaded tokio runtime of the store's own: the store is used from
//! the writer thread, which blocks on each call (a call made from inside
//! another runtime, a test's or the engine opened in one, runs on a thread
//! of its own, since a runtime cannot be blocked on from inside another).
//! A replica's turns come one after another, so it works on one connection
//! at a time: it takes one from the pool for each turn (or read) and gives
//! it back when the turn ends. The pool ([`PostgresSettings`]) bounds how
//! many stay open, how long waiting for one and connecting may take, and
//! replaces a broken one; after a lost connection every open one is let go
//! ([`Store::resume`]), since a restarted server ended them all. Each new
//! session starts with the turn's time limits (start-up options) and, if
//! the server's `synchronous_commit` is `off`, sets it `on`. Statements are
//! prepared once per connection (deadpool's statement cache).

use std::fmt;
use std::future::Future;
use std::time::{Duration, Instant};

use deadpool_postgres::{
    Hook, HookError, Manager, ManagerConfig, Object, Pool, PoolError, RecyclingMethod, Runtime,
    TimeoutType,
};
use tokio_postgres::config::{Host, SslMode};
use tokio_postgres::types::{FromSqlOwned, ToSql};
use tokio_postgres::{Config, Error, NoTls, Row, SimpleQueryMessage, Statement};

use super::{Behind, Resume, Store, StoreError, StoreResult, Turn};
use crate::domain::clock::Timestamp;
use crate::domain::policy::PostgresSettings;
use crate::domain::records::{Change, Kind, Record};
use crate::domain::session;

/// The schema the tables live in when the URL names none (`?schema=`).
pub const DEFAULT_SCHEMA: &str = "toolgate";

/// How often, at most, the store asks the server for its size: the writer
/// asks after every batch, and the answer is for a gauge.
const SIZE_REFRESH: Duration = Duration::from_secs(1);

/// The first key of every toolgate advisory lock ("tool"); the second is
/// the schema's name hashed ([`lock_keys`]).
const LOCK_NAMESPACE: i32 = 0x746F_6F6C;

/// One step of the schema: takes it from version `n` (its index in
/// [`MIGRATIONS`]) to `n + 1`, inside the opening transaction, given the
/// schema's name (a checked identifier, safe to put into SQL).
pub type Migration = fn(&Connection<'_>, &str) -> Result<(), Error>;

/// The schema's history, oldest first. Append only: a released migration is
/// never changed, since schemas made with it exist.
pub const MIGRATIONS: &[Migration] = &[
    create_v1_tables,
    create_v2_commit_count,
    create_v3_replicas,
    key_v4_decided_calls_by_time,
    allow_v5_approval_changes,
    allow_v6_owed_attempts,
];

/// The schema version this binary writes (and the newest it can open).
pub const SCHEMA_VERSION: u32 = MIGRATIONS.len() as u32;

pub(super) fn create_v1_tables(transaction: &Connection<'_>, schema: &str) -> Result<(), Error> {
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
    transaction: &Connection<'_>,
    schema: &str,
) -> Result<(), Error> {
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
        Kind::ApprovalChange => 10,
    }
}

/// Version 5: records of [`Kind::ApprovalChange`] (an approval's steps
/// after its request, apart from its record). The records table holds any
/// kind, so nothing changes in the schema; the version tells a toolgate
/// that does not know the kind not to open it.
pub(super) fn allow_v5_approval_changes(_: &Connection<'_>, _: &str) -> Result<(), Error> {
    Ok(())
}

/// Version 6: a decided call id may record the tool attempt it owes, and a
/// receipt the grant its commit consumed (optional fields of their
/// values). Nothing changes in the schema; the version stops a toolgate
/// that would read past those fields (and let an owed attempt go unpaid).
pub(super) fn allow_v6_owed_attempts(_: &Connection<'_>, _: &str) -> Result<(), Error> {
    Ok(())
}

fn kind_of(code: i16) -> Option<Kind> {
    Kind::ALL.into_iter().find(|kind| kind_code(*kind) == code)
}

/// Version 3, replicas: every record carries `seq`, the number of the
/// commit that wrote it last, and a deleted one stays a while as a
/// tombstone (`value` NULL), so that a replica reads what the others
/// committed since it last looked (`seq > n`); `S.commits.purged` says up
/// to which commit tombstones are gone (a replica further behind loads
/// everything); `S.tokens` keeps each recent commit's token with its number,
/// so that after a lost connection a replica reads whether its commit took
/// effect though others committed since.
pub(super) fn create_v3_replicas(transaction: &Connection<'_>, schema: &str) -> Result<(), Error> {
    transaction.batch_execute(&format!(
        "ALTER TABLE {schema}.records ALTER COLUMN value DROP NOT NULL, \
             ADD COLUMN seq bigint NOT NULL DEFAULT 0; \
         CREATE INDEX records_by_seq ON {schema}.records (seq); \
         ALTER TABLE {schema}.commits ADD COLUMN purged bigint NOT NULL DEFAULT 0; \
         CREATE TABLE {schema}.tokens (token bytea PRIMARY KEY, n bigint NOT NULL); \
         CREATE INDEX tokens_by_n ON {schema}.tokens (n); \
         CREATE TABLE {schema}.transitions (n bigint NOT NULL, ord integer NOT NULL, \
             key bytea NOT NULL, value bytea NOT NULL, PRIMARY KEY (n, ord)); \
         ALTER TABLE {schema}.records ADD CONSTRAINT receipts_once \
             EXCLUDE USING btree ((substring(key FROM {tail})) WITH =) \
             WHERE (kind = {receipt} AND value IS NOT NULL AND length(key) >= {tail}) \
             DEFERRABLE INITIALLY DEFERRED",
        tail = RECEIPT_KEY_TAIL,
        receipt = kind_code(Kind::Receipt),
    ))
}

/// Version 4: a decided call id's key starts with the time it was decided
/// ([`session::undated_call_key_prefix`] for the ones already stored,
/// tombstones included), so that new call ids append to the index instead
/// of each landing in its session's leaf.
pub(super) fn key_v4_decided_calls_by_time(
    transaction: &Connection<'_>,
    schema: &str,
) -> Result<(), Error> {
    transaction.execute(
        &format!("UPDATE {schema}.records SET key = $1 || key WHERE kind = $2"),
        &[
            &session::undated_call_key_prefix(),
            &kind_code(Kind::DecidedCall),
        ],
    )?;
    Ok(())
}

/// Where the (host, actor, call id) part of a receipt's key begins (1-based,
/// for SQL's `substring`): after the length-prefixed time
/// ([`records::key`](crate::domain::records::key)).
const RECEIPT_KEY_TAIL: usize = 4 + 8 + 1;

// ----- the URL ----------------------------------------------------------------

/// A PostgreSQL database and schema to keep the state in, parsed from a
/// URL, and the pool and time limits to use it with. Its `Display` and
/// `Debug` forms never show the password.
#[derive(Clone)]
pub struct PostgresTarget {
    /// As the URL says.
    config: Config,
    schema: String,
    shown: String,
    settings: PostgresSettings,
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
        let mut config: Config = for_driver.parse().map_err(|error: Error| {
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
        if config.get_application_name().is_none() {
            config.application_name(format!("toolgate[{}]", std::process::id()));
        }
        let schema = schema.unwrap_or_else(|| DEFAULT_SCHEMA.to_string());
        let shown = show(&config, &schema);
        Ok(PostgresTarget {
            config,
            schema,
            shown,
            settings: PostgresSettings::default(),
        })
    }

    /// The same, used with `settings` (`[server] postgres_*`).
    pub fn with_settings(mut self, settings: PostgresSettings) -> Self {
        self.settings = settings;
        self
    }

    /// The pool and time limits it is used with.
    pub fn settings(&self) -> &PostgresSettings {
        &self.settings
    }

    /// The driver's configuration, as the URL says (tests connect with
    /// it, to look at what the store wrote).
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// What the store's sessions connect with: the URL's configuration,
    /// its `connect_timeout` or the settings', and the turn's time limits
    /// as start-up options before the URL's own (a later `-c` wins).
    fn session_config(&self) -> Config {
        let mut config = self.config.clone();
        if config.get_connect_timeout().is_none() {
            config.connect_timeout(self.settings.connect_timeout);
        }
        let limits = &self.settings;
        let mut options = format!(
            "-c client_min_messages=warning -c lock_timeout={}ms \
             -c idle_in_transaction_session_timeout={}ms -c statement_timeout={}ms",
            limits.lock_timeout.as_millis(),
            limits.turn_idle_timeout.as_millis(),
            limits.statement_timeout.as_millis()
        );
        if let Some(own) = self.config.get_options() {
            options.push(' ');
            options.push_str(own);
        }
        config.options(options);
        config
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
            settings: self.settings,
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
    let (scheme, rest) = match text.split_once("://") {
        Some((scheme, rest)) => (format!("{scheme}://"), rest),
        None => (String::new(), text),
    };
    let rest = match rest.rsplit_once('@') {
        Some((userinfo, after)) => {
            let user = userinfo.split([':', '/', '?']).next().unwrap_or("");
            format!("{user}@{after}")
        }
        // No user information: what follows a `:` of a single host name is
        // a port, or shown as nothing (`user:secret` without its `@`). An
        // IPv6 address or a list of hosts is shown as given.
        None => {
            let host_end = rest.find(['/', '?']).unwrap_or(rest.len());
            let hosts = &rest[..host_end];
            match hosts.split_once(':') {
                Some((host, port))
                    if !hosts.starts_with('[')
                        && !hosts.contains(',')
                        && !port.bytes().all(|byte| byte.is_ascii_digit()) =>
                {
                    format!("{host}{}", &rest[host_end..])
                }
                _ => rest.to_string(),
            }
        }
    };
    let mut shown = scheme;
    match rest.split_once('?') {
        Some((before, query)) => {
            shown.push_str(before);
            let kept: Vec<&str> = query
                .split('&')
                .filter(|pair| {
                    let name = decode(pair.split('=').next().unwrap_or(""));
                    !name.to_ascii_lowercase().contains("password")
                })
                .collect();
            if !kept.is_empty() {
                shown.push('?');
                shown.push_str(&kept.join("&"));
            }
        }
        None => shown.push_str(&rest),
    }
    // Cut only now, so that no password lost its end of user information.
    (shown.chars().filter(|c| !c.is_control()))
        .take(300)
        .collect()
}

/// The driver's error without anything a record could be in: a server error
/// is its severity, code and message (never its DETAIL, which can quote a
/// row's values).
fn describe(error: &Error) -> String {
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

/// The statements of a store, prepared once per connection (deadpool's
/// statement cache, keyed by their text).
pub(super) struct Statements {
    /// Begins a turn: BEGIN, the store's lock, then the head row as
    /// `head` reads it; one simple query, so one round trip.
    begin: String,
    /// Writes a turn's records (a deletion as a tombstone, `value` NULL),
    /// moves the count of commits on and keeps the commit's token: one
    /// round trip. Answers 1 when the count was the one expected.
    write: String,
    /// Every live record.
    select: String,
    /// The records (tombstones included) committed after a count.
    since: String,
    /// The count of commits, how far tombstones are purged, the server's
    /// clock in milliseconds and the schema's version.
    head: String,
    /// The count at which a commit's token was kept.
    token: String,
    size: String,
}

/// A connection of the store's pool, and the runtime it runs on: each call
/// runs to its end before it returns.
pub struct Connection<'a> {
    runtime: &'a tokio::runtime::Runtime,
    client: &'a Object,
}

type Params<'p> = &'p [&'p (dyn ToSql + Sync)];

impl Connection<'_> {
    fn wait<T>(&self, work: impl Future<Output = Result<T, Error>>) -> Result<T, Error> {
        self.runtime.block_on(work)
    }

    /// Statements without parameters, as one simple query.
    pub fn batch_execute(&self, sql: &str) -> Result<(), Error> {
        self.wait(self.client.batch_execute(sql))
    }

    pub fn simple_query(&self, sql: &str) -> Result<Vec<SimpleQueryMessage>, Error> {
        self.wait(self.client.simple_query(sql))
    }

    /// Runs `call` with `sql` prepared (once per connection).
    fn prepared<T>(
        &self,
        sql: &str,
        call: impl AsyncFnOnce(&tokio_postgres::Client, &Statement) -> Result<T, Error>,
    ) -> Result<T, Error> {
        self.wait(async {
            let statement = self.client.prepare_cached(sql).await?;
            call(self.client, &statement).await
        })
    }

    pub fn query(&self, sql: &str, params: Params<'_>) -> Result<Vec<Row>, Error> {
        self.prepared(sql, async |client, statement| {
            client.query(statement, params).await
        })
    }

    pub fn query_one(&self, sql: &str, params: Params<'_>) -> Result<Row, Error> {
        self.prepared(sql, async |client, statement| {
            client.query_one(statement, params).await
        })
    }

    pub fn query_opt(&self, sql: &str, params: Params<'_>) -> Result<Option<Row>, Error> {
        self.prepared(sql, async |client, statement| {
            client.query_opt(statement, params).await
        })
    }

    pub fn execute(&self, sql: &str, params: Params<'_>) -> Result<u64, Error> {
        self.prepared(sql, async |client, statement| {
            client.execute(statement, params).await
        })
    }

    fn is_closed(&self) -> bool {
        self.client.is_closed()
    }
}

/// The PostgreSQL store (see the module documentation).
pub struct PostgresStore {
    /// The runtime the pool's connections run on; `None` only while
    /// dropping.
    runtime: Option<tokio::runtime::Runtime>,
    pub(super) pool: Pool,
    /// The connection of the turn (or read) in progress, while one is.
    held: Option<Object>,
    target: PostgresTarget,
    statements: Statements,
    /// The count of commits the state in memory has taken in (loaded,
    /// caught up with, or committed itself); `None` before the first load.
    seen: Option<i64>,
    /// The count of commits at the start of the turn in progress, while
    /// one is (the store's lock is held).
    turn: Option<i64>,
    /// The token of the commit being made, until it is known to have
    /// succeeded or not.
    making: Option<[u8; 16]>,
    /// Fault injection: the next commit takes effect, then fails as if its
    /// answer was lost with the connection.
    #[cfg(test)]
    pub(super) lose_next_answer: bool,
    /// Fault injection: called with the backend's pid between a catch-up's
    /// read and the end of its read-only transaction.
    #[cfg(test)]
    pub(super) before_release: Option<Box<dyn FnOnce(i32) + Send>>,
    bytes: u64,
    measured: Instant,
    opened: Opened,
    /// Set once a turn or read found the schema migrated since it was
    /// opened ([`PostgresStore::check_version`]): never back from that.
    migrated: Option<StoreError>,
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

/// Commits after which tombstones and tokens are purged, and how many of
/// the latest commits' tombstones and tokens every purge keeps: a replica
/// further behind than that loads everything again.
pub const PURGE_EVERY: i64 = 512;
pub const KEEP_COMMITS: i64 = 8_192;

impl PostgresStore {
    /// Connects and creates or migrates the schema's tables. Refused: an
    /// unreachable database, a schema of a newer version (untouched), one
    /// with tables that are not a toolgate store's.
    pub fn open(target: &PostgresTarget) -> StoreResult<Self> {
        Self::open_with(target, MIGRATIONS)
    }

    /// Connects to a schema of the current version, creating and migrating
    /// nothing (`serve` without `--migrate`): one with no tables or an
    /// older version is refused untouched, naming `toolgate store migrate`.
    /// So that replicas of several versions never race to change the
    /// schema under each other, migrating is asked for.
    pub fn open_current(target: &PostgresTarget) -> StoreResult<Self> {
        Self::open_migrating(target, MIGRATIONS, false)
    }

    pub(super) fn open_with(
        target: &PostgresTarget,
        migrations: &[Migration],
    ) -> StoreResult<Self> {
        Self::open_migrating(target, migrations, true)
    }

    fn open_migrating(
        target: &PostgresTarget,
        migrations: &[Migration],
        migrate: bool,
    ) -> StoreResult<Self> {
        let failed = |what: &str| StoreError(format!("the PostgreSQL store at {target}: {what}"));
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|error| failed(&format!("starting its runtime: {error}")))?;
        let settings = target.settings();
        let manager = Manager::from_config(
            target.session_config(),
            NoTls,
            ManagerConfig {
                // A broken connection shows when it is used: the turn
                // fails and resumes on a new one.
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(settings.pool_size)
            .runtime(Runtime::Tokio1)
            .wait_timeout(Some(settings.pool_wait_timeout))
            .create_timeout(Some(settings.connect_timeout))
            .post_create(Hook::async_fn(|client, _| {
                Box::pin(async move { durable_commits(client).await.map_err(HookError::Backend) })
            }))
            .build()
            .map_err(|error| failed(&format!("making its connection pool: {error}")))?;
        let mut store = PostgresStore {
            runtime: Some(runtime),
            pool,
            held: None,
            target: target.clone(),
            statements: statements(target.schema()),
            seen: None,
            turn: None,
            making: None,
            #[cfg(test)]
            lose_next_answer: false,
            #[cfg(test)]
            before_release: None,
            bytes: 0,
            measured: Instant::now(),
            opened: Opened {
                found: 0,
                version: 0,
            },
            migrated: None,
        };
        store.opened = store.session(|connection, _, target| {
            prepare_schema(connection, target, migrations, migrate)
        })?;
        store.held = None;
        store.measure();
        Ok(store)
    }

    /// The database and schema.
    pub fn target(&self) -> &PostgresTarget {
        &self.target
    }

    /// What opening found and did.
    pub fn opened(&self) -> Opened {
        self.opened
    }

    /// A setting of this store's session (tests).
    #[cfg(test)]
    pub(super) fn setting(&mut self, name: &str) -> String {
        let sql = format!("SHOW {name}");
        let value = self
            .run("reading a setting", |connection, _| {
                Ok(connection.query_one(&sql, &[])?.get(0))
            })
            .unwrap();
        self.give_back();
        value
    }

    /// The server's process for the connection of the turn in progress
    /// (tests end it).
    #[cfg(test)]
    pub(super) fn backend_pid(&mut self) -> i32 {
        self.run("reading the backend's pid", |connection, _| {
            Ok(connection.query_one("SELECT pg_backend_pid()", &[])?.get(0))
        })
        .unwrap()
    }

    /// What a resume that found the server unreachable leaves of a lost
    /// commit (its token kept, `seen` forgotten), as the writer gives the
    /// commit up after [`RESUME_FOR`](super::writer::RESUME_FOR).
    #[cfg(test)]
    pub(super) fn give_up_commit(&mut self) {
        assert!(self.making.is_some(), "no commit to give up");
        self.seen = None;
    }

    /// Asks the server what the table and its index take.
    fn measure(&mut self) {
        // A gauge: when the server cannot say, the last answer stands, and
        // the next commit finds out whether the connection is gone.
        if let Ok(bytes) = self.run("measuring the store", |connection, statements| {
            Ok(connection
                .query_one(&statements.size, &[])?
                .get::<_, i64>(0))
        }) {
            self.bytes = bytes.unsigned_abs();
        }
        self.give_back();
        self.measured = Instant::now();
    }

    /// Gives the connection back to the pool: no transaction is open on it.
    fn give_back(&mut self) {
        self.held = None;
    }

    /// Runs `work` on the connection of the turn in progress, or one from
    /// the pool. On an error it ends the transaction the connection was in
    /// (so that the lock is let go at once, not when the server notices a
    /// lost connection) and gives it back.
    fn session<T: Send>(
        &mut self,
        work: impl FnOnce(&Connection<'_>, &Statements, &PostgresTarget) -> StoreResult<T> + Send,
    ) -> StoreResult<T> {
        let Some(runtime) = self.runtime.as_ref() else {
            return Err(StoreError("the PostgreSQL store is closed".into()));
        };
        let held = match self.held.take() {
            Some(held) => held,
            None => {
                let pool = &self.pool;
                outside_runtime(|| runtime.block_on(pool.get()))
                    .map_err(|error| pool_error(&self.target, error))?
            }
        };
        let connection = Connection {
            runtime,
            client: &held,
        };
        let (statements, target) = (&self.statements, &self.target);
        let done = outside_runtime(|| {
            let done = work(&connection, statements, target);
            if done.is_err() && !connection.is_closed() {
                let _ = connection.batch_execute("ROLLBACK");
            }
            done
        });
        match done {
            Ok(done) => {
                self.held = Some(held);
                Ok(done)
            }
            Err(error) => {
                self.turn = None;
                Err(error)
            }
        }
    }

    /// [`session`](Self::session), naming `step` in the error.
    pub(super) fn run<T: Send>(
        &mut self,
        step: &str,
        work: impl FnOnce(&Connection<'_>, &Statements) -> Result<T, Error> + Send,
    ) -> StoreResult<T> {
        self.session(|connection, statements, target| {
            work(connection, statements).map_err(|error| store_error(target, step, &error))
        })
    }

    /// Refuses to go on with a schema another toolgate migrated since this
    /// one opened it: what it writes and reads is of its own version, and
    /// the records of another version could be misread or written in a
    /// form the new version cannot read. Checked in every turn and read, so
    /// that a replica left running through `toolgate store migrate` stops
    /// (its calls answer UNAVAILABLE) instead.
    fn check_version(&mut self, version: i64) -> StoreResult<()> {
        if version == i64::from(self.opened.version) {
            return Ok(());
        }
        let error = StoreError(format!(
            "the PostgreSQL store at {}: the schema is now version {version}, and this toolgate \
             opened it at version {}: it was migrated under this replica; restart it with a \
             toolgate of version {version}",
            self.target, self.opened.version
        ));
        self.migrated = Some(error.clone());
        Err(error)
    }

    /// Takes the store's lock (in a transaction of its own), then reads the
    /// count of commits, how far tombstones are purged, and the clock, and
    /// checks the schema's version ([`PostgresStore::check_version`]).
    fn lock(&mut self) -> StoreResult<(i64, i64, Timestamp)> {
        let messages = self.run("taking the store's lock", |client, statements| {
            client.simple_query(&statements.begin)
        })?;
        let head = messages.iter().find_map(|message| match message {
            SimpleQueryMessage::Row(row) if row.len() == 4 => {
                let number = |index: usize| row.get(index)?.parse::<i64>().ok();
                Some((number(0)?, number(1)?, number(2)?, number(3)?))
            }
            _ => None,
        });
        let Some((count, purged, now, version)) = head else {
            let _ = self.release();
            return Err(StoreError(format!(
                "the PostgreSQL store at {}: reading {}.commits under the store's lock: \
                 not one row of four numbers (damaged?)",
                self.target,
                self.target.schema()
            )));
        };
        if let Err(error) = self.check_version(version) {
            let _ = self.release();
            return Err(error);
        }
        self.turn = Some(count);
        Ok((count, purged, Timestamp(now.unsigned_abs())))
    }

    /// What the state has not taken in, read in the transaction in
    /// progress, which sees the store at `count` commits, tombstones purged
    /// up to `purged`; and the state is then at `count`.
    fn behind(&mut self, count: i64, purged: i64) -> StoreResult<Option<Behind>> {
        let behind = match self.seen {
            Some(seen) if seen == count => None,
            Some(seen) if seen >= purged && seen < count => {
                let rows = self.run("reading what other replicas committed", |client, s| {
                    client.query(&s.since, &[&seen])
                })?;
                let changes = self.rows_as(rows, |kind, key, value| Change { kind, key, value })?;
                Some(Behind::Changes(changes))
            }
            _ => Some(Behind::Everything(self.select_all()?)),
        };
        self.seen = Some(count);
        Ok(behind)
    }

    fn kind(&self, code: i16) -> StoreResult<Kind> {
        kind_of(code).ok_or_else(|| {
            StoreError(format!(
                "the PostgreSQL store at {}: a record of kind {code}, which this toolgate \
                 does not know (written by a newer one?)",
                self.target
            ))
        })
    }

    /// Every live record, in the transaction in progress.
    fn select_all(&mut self) -> StoreResult<Vec<Record>> {
        let rows = self.run("reading the records", |client, statements| {
            client.query(&statements.select, &[])
        })?;
        self.rows_as(rows, |kind, key, value| Record { kind, key, value })
    }

    /// Rows of (kind, key, value) as `make` builds them; a kind this
    /// toolgate does not know is refused.
    fn rows_as<V: FromSqlOwned, T>(
        &self,
        rows: Vec<Row>,
        make: impl Fn(Kind, Vec<u8>, V) -> T,
    ) -> StoreResult<Vec<T>> {
        rows.into_iter()
            .map(|row| Ok(make(self.kind(row.get(0))?, row.get(1), row.get(2))))
            .collect()
    }

    /// Writes `changes` as commit number `count + 1` and commits the turn
    /// in progress (begun at `count`).
    fn write(&mut self, count: i64, changes: &[Change]) -> StoreResult<()> {
        // The last change of each record is the one that counts; with one
        // left per record, all of them go as one statement.
        let (mut kinds, mut keys, mut values) = (Vec::new(), Vec::new(), Vec::new());
        let last = changes
            .iter()
            .zip(super::last_of_each_record(changes))
            .filter_map(|(change, last)| last.then_some(change));
        for change in last {
            kinds.push(kind_code(change.kind));
            keys.push(change.key.as_slice());
            values.push(change.value.as_deref());
        }
        // Every version of an approval, in order, for other replicas'
        // watchers.
        let (mut ords, mut transition_keys, mut transition_values) =
            (Vec::new(), Vec::new(), Vec::new());
        for change in changes
            .iter()
            .filter(|change| change.kind == Kind::Approval)
        {
            if let Some(value) = &change.value {
                ords.push(i32::try_from(ords.len()).unwrap_or(i32::MAX));
                transition_keys.push(change.key.as_slice());
                transition_values.push(value.as_slice());
            }
        }
        let after = count + 1;
        let token: [u8; 16] = rand::random();
        self.making = Some(token);
        let schema = self.target.schema().to_string();
        let written = self.run(
            &format!(
                "writing {} record(s) of {}",
                kinds.len(),
                kinds_named(&kinds)
            ),
            |client, statements| {
                let counted: i64 = client
                    .query_one(
                        &statements.write,
                        &[
                            &kinds,
                            &keys,
                            &values,
                            &after,
                            &count,
                            &token.as_slice(),
                            &ords,
                            &transition_keys,
                            &transition_values,
                        ],
                    )?
                    .get(0);
                if counted == 1 && after % PURGE_EVERY == 0 {
                    let horizon = after - KEEP_COMMITS;
                    client.batch_execute(&format!(
                        "DELETE FROM {schema}.records WHERE value IS NULL AND seq <= {horizon}; \
                         DELETE FROM {schema}.tokens WHERE n <= {horizon}; \
                         DELETE FROM {schema}.transitions WHERE n <= {horizon}; \
                         UPDATE {schema}.commits SET purged = greatest(purged, {horizon})"
                    ))?;
                }
                if counted == 1 {
                    client.batch_execute("COMMIT")?;
                } else {
                    client.batch_execute("ROLLBACK")?;
                }
                Ok(counted)
            },
        )?;
        self.turn = None;
        self.give_back();
        if written != 1 {
            // The lock orders every writer: a count that moved under it is
            // a writer that does not take it. Nothing of this batch was
            // committed, and the state in memory holds it: the next turn
            // loads everything again.
            self.making = None;
            self.seen = None;
            return Err(StoreError(format!(
                "the PostgreSQL store at {}: the count of commits is not {count} under the \
                 store's lock: something else writes to this schema",
                self.target
            )));
        }
        self.making = None;
        if self.seen == Some(count) {
            self.seen = Some(after);
        }
        #[cfg(test)]
        if std::mem::take(&mut self.lose_next_answer) {
            self.making = Some(token);
            return Err(StoreError(
                "the answer to the commit was lost (a test)".into(),
            ));
        }
        if self.measured.elapsed() >= SIZE_REFRESH {
            self.measure();
        }
        Ok(())
    }

    /// Ends the turn in progress without a commit.
    fn release(&mut self) -> StoreResult<()> {
        self.run("ending a turn", |client, _| {
            client.batch_execute("ROLLBACK")
        })?;
        self.turn = None;
        self.give_back();
        Ok(())
    }
}

fn store_error(target: &PostgresTarget, step: &str, error: &Error) -> StoreError {
    StoreError(format!(
        "the PostgreSQL store at {target}: {step}: {}",
        describe(error)
    ))
}

/// How a failure to get a connection from the pool reads: which limit ran
/// out, or what connecting met.
fn pool_error(target: &PostgresTarget, error: PoolError) -> StoreError {
    let why = match error {
        PoolError::Timeout(TimeoutType::Wait) => format!(
            "no connection of its pool ({}) was free within postgres_pool_wait_timeout_ms",
            target.settings.pool_size
        ),
        PoolError::Timeout(TimeoutType::Create | TimeoutType::Recycle) => {
            "connecting took longer than postgres_connect_timeout_ms".to_string()
        }
        PoolError::Backend(error) => format!("connecting: {}", describe(&error)),
        PoolError::PostCreateHook(HookError::Backend(error)) => {
            format!("setting up a new session: {}", describe(&error))
        }
        other => format!("connecting: {other}"),
    };
    StoreError(format!("the PostgreSQL store at {target}: {why}"))
}

/// Makes a new session's commits durable: `off` would answer a commit
/// before it is on disk; `local`, `on` and stronger settings are durable
/// and kept as the server has them.
async fn durable_commits(client: &tokio_postgres::Client) -> Result<(), Error> {
    let rows = client.simple_query("SHOW synchronous_commit").await?;
    let off = rows.iter().any(
        |message| matches!(message, SimpleQueryMessage::Row(row) if row.get(0) == Some("off")),
    );
    if off {
        client.batch_execute("SET synchronous_commit = on").await?;
    }
    Ok(())
}

/// Checks what the schema holds and, if `migrate`, brings it to the version
/// `migrations` end at, in one transaction under the store's lock, so that
/// replicas starting together migrate once (a migration has no statement
/// time limit: it may rewrite a large table).
fn prepare_schema(
    client: &Connection<'_>,
    target: &PostgresTarget,
    migrations: &[Migration],
    migrate: bool,
) -> StoreResult<Opened> {
    let failed = |step: &str| {
        let step = step.to_string();
        move |error: Error| store_error(target, &step, &error)
    };
    let schema = target.schema();
    let (namespace, key) = lock_keys(schema);
    client
        .batch_execute("BEGIN ISOLATION LEVEL READ COMMITTED; SET LOCAL statement_timeout = 0")
        .map_err(failed("beginning the migration"))?;
    let transaction = client;
    transaction
        .execute("SELECT pg_advisory_xact_lock($1, $2)", &[&namespace, &key])
        .map_err(failed("taking the store's lock"))?;
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
    if found < target_version && !migrate {
        let has = match found {
            0 => format!("has no toolgate tables in schema {schema}"),
            found => format!("has schema version {found}"),
        };
        return Err(StoreError(format!(
            "the PostgreSQL store at {target} {has}; this toolgate needs version \
             {target_version}: run `toolgate store migrate`, or serve with --migrate"
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
            migration(transaction, schema).map_err(failed(&format!(
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
        .batch_execute("COMMIT")
        .map_err(failed("committing the migration"))?;
    Ok(Opened {
        found,
        version: target_version,
    })
}

/// The statements of a store on `schema` (a checked identifier).
fn statements(schema: &str) -> Statements {
    let head = format!(
        "SELECT n, purged, (extract(epoch FROM clock_timestamp()) * 1000)::int8, \
             (SELECT version FROM {schema}.schema_version) \
         FROM {schema}.commits"
    );
    let (namespace, key) = lock_keys(schema);
    Statements {
        // Read committed whatever the session's default: each statement
        // after the lock sees what the lock's last holder committed (a
        // snapshot taken while waiting for it would not).
        begin: format!(
            "BEGIN ISOLATION LEVEL READ COMMITTED; \
             SELECT pg_advisory_xact_lock({namespace}, {key}); {head}"
        ),
        write: format!(
            "WITH written AS (\
                 INSERT INTO {schema}.records (kind, key, value, seq) \
                 SELECT kind, key, value, $4 FROM unnest($1::int2[], $2::bytea[], $3::bytea[]) \
                     AS w(kind, key, value) \
                 ON CONFLICT (kind, key) DO UPDATE SET value = excluded.value, seq = excluded.seq \
                 RETURNING 1), \
             logged AS (\
                 INSERT INTO {schema}.transitions (n, ord, key, value) \
                 SELECT $4, ord, key, value FROM unnest($7::int4[], $8::bytea[], $9::bytea[]) \
                     AS t(ord, key, value) \
                 RETURNING 1), \
             counted AS (\
                 UPDATE {schema}.commits SET n = $4, token = $6 WHERE n = $5 RETURNING n), \
             kept AS (\
                 INSERT INTO {schema}.tokens (token, n) SELECT $6, n FROM counted RETURNING 1) \
             SELECT (SELECT count(*) FROM counted) + 0 * (SELECT count(*) FROM written) \
                 + 0 * (SELECT count(*) FROM logged) + 0 * (SELECT count(*) FROM kept)"
        ),
        select: format!("SELECT kind, key, value FROM {schema}.records WHERE value IS NOT NULL"),
        // An approval's versions come from the transitions (each one, in
        // order), its deletion from the records; the records of a commit
        // after its transitions.
        since: format!(
            "SELECT kind, key, value FROM (\
                 SELECT seq, 2147483647 AS ord, kind, key, value FROM {schema}.records \
                     WHERE seq > $1 AND (kind <> {approval} OR value IS NULL) \
                 UNION ALL \
                 SELECT n, ord, {approval}::int2, key, value FROM {schema}.transitions \
                     WHERE n > $1) AS c \
             ORDER BY seq, ord, kind, key",
            approval = kind_code(Kind::Approval)
        ),
        head,
        token: format!("SELECT n FROM {schema}.tokens WHERE token = $1"),
        size: format!("SELECT pg_total_relation_size('{schema}.records'::regclass)"),
    }
}

impl Drop for PostgresStore {
    fn drop(&mut self) {
        let Some(runtime) = self.runtime.take() else {
            return;
        };
        let (held, pool, in_turn) = (self.held.take(), self.pool.clone(), self.turn.is_some());
        outside_runtime(move || {
            // Explicitly, so that a turn in progress ends (and its lock is
            // free) when this returns.
            if let (Some(held), true) = (&held, in_turn) {
                let _ = runtime.block_on(held.batch_execute("ROLLBACK"));
            }
            drop(held);
            pool.close();
            // With the runtime go the connections' tasks, and their sockets.
            drop(runtime);
        });
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

    /// Every live record, as of one commit: in the turn in progress, or
    /// in a read-only snapshot of its own.
    fn load(&mut self) -> StoreResult<Vec<Record>> {
        if self.turn.is_some() {
            return self.select_all();
        }
        let (count, version): (i64, i32) = self.run("reading the records", |client, s| {
            client.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")?;
            let row = client.query_one(&s.head, &[])?;
            Ok((row.get(0), row.get(3)))
        })?;
        if let Err(error) = self.check_version(version.into()) {
            self.release()?;
            return Err(error);
        }
        let records = self.select_all()?;
        self.run("reading the records", |client, _| {
            client.batch_execute("COMMIT")
        })?;
        self.give_back();
        self.seen = Some(count);
        Ok(records)
    }

    /// Commits the turn in progress with `changes` (none: ends it), or,
    /// outside a turn, takes one for them.
    fn commit(&mut self, changes: &[Change]) -> StoreResult<()> {
        let count = match self.turn {
            Some(count) => count,
            None if changes.is_empty() => return Ok(()),
            None => self.lock()?.0,
        };
        if changes.is_empty() {
            return self.release();
        }
        self.write(count, changes)
    }

    fn size_bytes(&self) -> u64 {
        self.bytes
    }

    /// Lets go of every open connection (a restarted server ended them
    /// all) and reads, on a new one, whether the failed commit took effect:
    /// its token is kept with the commit. Under the store's lock, which the
    /// lost session's transaction holds until it has committed or rolled
    /// back, so that the answer cannot change after it is read. A commit
    /// that did not take effect leaves the state in memory ahead of the
    /// store: the next turn loads everything.
    fn resume(&mut self) -> Resume {
        if let Some(migrated) = &self.migrated {
            return Resume::Final(Some(migrated.clone()));
        }
        if let Some(held) = self.held.take() {
            drop(Object::take(held));
        }
        self.pool.retain(|_, _| false);
        self.turn = None;
        let Some(token) = self.making else {
            // Nothing was being committed: the state is the store's, once
            // the server answers again.
            return match self.run("connecting again", |client, _| client.batch_execute("")) {
                Ok(()) => {
                    self.give_back();
                    Resume::NotCommitted
                }
                Err(error) => Resume::Unreachable(error),
            };
        };
        let found = self.lock().and_then(|_| {
            let found = self.run("reading whether the commit took effect", |client, s| {
                client.query_opt(&s.token, &[&token.as_slice()])
            })?;
            self.release()?;
            Ok(found.map(|row| row.get::<_, i64>(0)))
        });
        self.making = None;
        match found {
            Err(error) => {
                self.making = Some(token);
                // The commit's fate is unknown, and the writer may give it
                // up as not made while this replica's memory holds it: the
                // next turn reads everything again rather than what came
                // after a count that may already include it or never will.
                self.seen = None;
                Resume::Unreachable(error)
            }
            Ok(Some(count)) => {
                // Everything up to it was taken in when the turn began.
                self.seen = self.seen.map(|_| count);
                Resume::Committed
            }
            Ok(None) => {
                self.seen = None;
                Resume::NotCommitted
            }
        }
    }

    fn shared(&self) -> bool {
        true
    }

    fn begin_turn(&mut self) -> StoreResult<Turn> {
        if self.turn.is_some() {
            self.release()?;
        }
        let (count, purged, now) = self.lock()?;
        let behind = self.behind(count, purged)?;
        // A commit whose fate a resume never learned (the writer gave it
        // up, and `seen` was forgotten) is in what this turn read, or never
        // will be: a later resume must not find it and move `seen` back.
        self.making = None;
        Ok(Turn { now, behind })
    }

    fn catch_up(&mut self) -> StoreResult<Option<Behind>> {
        if self.turn.is_some() {
            return Ok(None);
        }
        let (count, purged, version): (i64, i64, i32) =
            self.run("reading the count of commits", |client, s| {
                client.batch_execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")?;
                let row = client.query_one(&s.head, &[])?;
                Ok((row.get(0), row.get(1), row.get(3)))
            })?;
        if let Err(error) = self.check_version(version.into()) {
            self.release()?;
            return Err(error);
        }
        // Too far behind for the changes: everything is loaded in the next
        // turn instead, under the lock, so that what the state makes of it
        // (resources a policy declares that the store lacks) commits against
        // the state every replica committed.
        if self.seen.is_none_or(|seen| seen < purged) {
            self.release()?;
            return Ok(None);
        }
        self.turn = Some(count);
        let taken_in = self.seen;
        let behind = self.behind(count, purged)?;
        #[cfg(test)]
        if let Some(hook) = self.before_release.take() {
            let pid = self.backend_pid();
            hook(pid);
        }
        if let Err(error) = self.release() {
            // What was read goes with the error, never to the state: the
            // next catch-up or turn reads it again.
            self.seen = taken_in;
            return Err(error);
        }
        Ok(behind)
    }
}
