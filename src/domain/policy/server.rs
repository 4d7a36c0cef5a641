//! `[server]`: overload protection, HTTP/2 settings, and `[server.tls]`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::PolicyError;
use super::parse::Loader;

/// The longest HTTP/2 keep-alive interval or timeout: a day.
const MAX_KEEPALIVE_SECONDS: u64 = 86_400;
/// The most calls `max_concurrent_requests` may let run at once.
const MAX_CONCURRENT_REQUESTS: usize = 1 << 20;
/// The largest `max_message_bytes`.
const MAX_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
/// The most connections `postgres_pool_size` may open.
const MAX_POSTGRES_POOL_SIZE: usize = 64;

/// The largest value of a `[server]` number, and what it means.
type Bound = (u64, &'static str);

/// The `[server]` section: overload protection and HTTP/2 settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerSettings {
    /// Calls served at once; more fail fast with RESOURCE_EXHAUSTED.
    pub max_concurrent_requests: usize,
    pub request_timeout: Duration,
    /// Largest decoded request message.
    pub max_message_bytes: usize,
    pub http2_keepalive_interval: Duration,
    pub http2_keepalive_timeout: Duration,
    pub max_concurrent_streams: u32,
    /// How long in-flight calls may take to finish after SIGTERM.
    pub shutdown_grace: Duration,
    /// Connections open at once, and from one peer address.
    pub max_connections: usize,
    pub max_connections_per_peer: usize,
    /// Time a new connection has for its HTTP/2 preface and first request.
    pub handshake_timeout: Duration,
    /// Time a call has for its whole request message to arrive.
    pub read_timeout: Duration,
    /// Time a response (or a blocked socket write) has to make progress.
    pub write_timeout: Duration,
    /// Request and response bytes buffered at once, over all calls.
    pub max_buffered_request_bytes: usize,
    pub max_buffered_response_bytes: usize,
    /// `[server.tls]`: serve TLS (and mTLS with a client CA).
    pub tls: Option<TlsFiles>,
    /// `plaintext_behind_mesh = true`: plaintext on a non-loopback address
    /// is acknowledged (a service mesh provides TLS).
    pub plaintext_behind_mesh: bool,
    /// `store = "…"`: where `serve` keeps the state when neither `--store`
    /// nor `TOOLGATE_STORE` says (`sqlite`, `memory` or a `postgres://` URL,
    /// checked by `serve`).
    pub store: Option<StoreSetting>,
    /// `postgres_*`: the connection pool and time limits of a
    /// `postgres://` store.
    pub postgres: PostgresSettings,
}

impl ServerSettings {
    /// The keys of `[server]` whose settings differ in `other` (the
    /// `postgres_*` ones as one), in the order of the struct.
    pub fn changed_keys(&self, other: &ServerSettings) -> Vec<&'static str> {
        macro_rules! changed {
            ($($field:ident => $key:literal),* $(,)?) => {{
                let mut keys = Vec::new();
                $(if self.$field != other.$field {
                    keys.push($key);
                })*
                keys
            }};
        }
        changed! {
            max_concurrent_requests => "max_concurrent_requests",
            request_timeout => "request_timeout_ms",
            max_message_bytes => "max_message_bytes",
            http2_keepalive_interval => "http2_keepalive_interval_seconds",
            http2_keepalive_timeout => "http2_keepalive_timeout_seconds",
            max_concurrent_streams => "max_concurrent_streams",
            shutdown_grace => "shutdown_grace_seconds",
            max_connections => "max_connections",
            max_connections_per_peer => "max_connections_per_peer",
            handshake_timeout => "handshake_timeout_ms",
            read_timeout => "read_timeout_ms",
            write_timeout => "write_timeout_ms",
            max_buffered_request_bytes => "max_buffered_request_bytes",
            max_buffered_response_bytes => "max_buffered_response_bytes",
            tls => "tls",
            plaintext_behind_mesh => "plaintext_behind_mesh",
            store => "store",
            postgres => "postgres_*",
        }
    }
}

/// `[server] postgres_*`: a `postgres://` store's connection pool and its
/// time limits (each a PostgreSQL setting of the store's sessions unless
/// the URL's `options` sets it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PostgresSettings {
    /// Connections a replica keeps open at most (`postgres_pool_size`).
    pub pool_size: usize,
    /// Connecting, start-up included (`postgres_connect_timeout_ms`; the
    /// URL's `connect_timeout` wins for the connecting itself).
    pub connect_timeout: Duration,
    /// Waiting for a free connection of the pool
    /// (`postgres_pool_wait_timeout_ms`).
    pub pool_wait_timeout: Duration,
    /// Waiting for the store's lock at the start of a turn
    /// (`postgres_lock_timeout_ms`: `lock_timeout`).
    pub lock_timeout: Duration,
    /// A session idle inside a turn is ended by the server, and its lock
    /// with it (`postgres_turn_idle_timeout_ms`:
    /// `idle_in_transaction_session_timeout`).
    pub turn_idle_timeout: Duration,
    /// One statement (`postgres_statement_timeout_ms`:
    /// `statement_timeout`; a migration is not limited).
    pub statement_timeout: Duration,
}

impl Default for PostgresSettings {
    fn default() -> Self {
        ServerSettings::default().postgres
    }
}

/// The `[server] store` text. Its `Debug` form never shows it: a
/// `postgres://` URL may hold a password.
#[derive(Clone, PartialEq, Eq)]
pub struct StoreSetting(pub String);

impl std::fmt::Debug for StoreSetting {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter.write_str("StoreSetting(..)")
    }
}

/// The PEM files TLS is served with (resolved against the policy file's
/// folder, or the working directory for `serve` flags). They are read at
/// start and again on every SIGHUP.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// The server's certificate chain, leaf first.
    pub cert: PathBuf,
    /// Its private key (PKCS #8, PKCS #1 or SEC 1).
    pub key: PathBuf,
    /// CA certificates a client certificate must chain to: mTLS. Without
    /// it, clients are not asked for a certificate.
    pub client_ca: Option<PathBuf>,
}

impl Default for ServerSettings {
    fn default() -> Self {
        ServerSettings::from(RawServer::default())
    }
}

impl From<RawServer> for ServerSettings {
    /// Without `[server.tls]`: its paths need the policy's folder
    /// ([`server_settings`]).
    fn from(raw: RawServer) -> Self {
        ServerSettings {
            max_concurrent_requests: raw.max_concurrent_requests,
            request_timeout: Duration::from_millis(raw.request_timeout_ms),
            max_message_bytes: raw.max_message_bytes,
            http2_keepalive_interval: Duration::from_secs(raw.http2_keepalive_interval_seconds),
            http2_keepalive_timeout: Duration::from_secs(raw.http2_keepalive_timeout_seconds),
            max_concurrent_streams: raw.max_concurrent_streams,
            shutdown_grace: Duration::from_secs(raw.shutdown_grace_seconds),
            max_connections: raw.max_connections,
            max_connections_per_peer: raw.max_connections_per_peer,
            handshake_timeout: Duration::from_millis(raw.handshake_timeout_ms),
            read_timeout: Duration::from_millis(raw.read_timeout_ms),
            write_timeout: Duration::from_millis(raw.write_timeout_ms),
            max_buffered_request_bytes: raw.max_buffered_request_bytes,
            max_buffered_response_bytes: raw.max_buffered_response_bytes,
            tls: None,
            plaintext_behind_mesh: raw.plaintext_behind_mesh,
            store: raw.store.map(StoreSetting),
            postgres: PostgresSettings {
                pool_size: raw.postgres_pool_size,
                connect_timeout: Duration::from_millis(raw.postgres_connect_timeout_ms),
                pool_wait_timeout: Duration::from_millis(raw.postgres_pool_wait_timeout_ms),
                lock_timeout: Duration::from_millis(raw.postgres_lock_timeout_ms),
                turn_idle_timeout: Duration::from_millis(raw.postgres_turn_idle_timeout_ms),
                statement_timeout: Duration::from_millis(raw.postgres_statement_timeout_ms),
            },
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawServer {
    max_concurrent_requests: usize,
    request_timeout_ms: u64,
    max_message_bytes: usize,
    http2_keepalive_interval_seconds: u64,
    http2_keepalive_timeout_seconds: u64,
    max_concurrent_streams: u32,
    shutdown_grace_seconds: u64,
    max_connections: usize,
    max_connections_per_peer: usize,
    handshake_timeout_ms: u64,
    read_timeout_ms: u64,
    write_timeout_ms: u64,
    max_buffered_request_bytes: usize,
    max_buffered_response_bytes: usize,
    pub(super) open_host_api: bool,
    plaintext_behind_mesh: bool,
    tls: Option<RawTls>,
    store: Option<String>,
    postgres_pool_size: usize,
    postgres_connect_timeout_ms: u64,
    postgres_pool_wait_timeout_ms: u64,
    postgres_lock_timeout_ms: u64,
    postgres_turn_idle_timeout_ms: u64,
    postgres_statement_timeout_ms: u64,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTls {
    cert: PathBuf,
    key: PathBuf,
    #[serde(default)]
    client_ca: Option<PathBuf>,
}

impl Default for RawServer {
    fn default() -> Self {
        RawServer {
            max_concurrent_requests: 1024,
            request_timeout_ms: 10_000,
            max_message_bytes: 1024 * 1024,
            http2_keepalive_interval_seconds: 30,
            http2_keepalive_timeout_seconds: 10,
            max_concurrent_streams: 100,
            shutdown_grace_seconds: 10,
            max_connections: 1024,
            max_connections_per_peer: 256,
            handshake_timeout_ms: 5_000,
            read_timeout_ms: 5_000,
            write_timeout_ms: 10_000,
            max_buffered_request_bytes: 64 * 1024 * 1024,
            max_buffered_response_bytes: 64 * 1024 * 1024,
            open_host_api: false,
            plaintext_behind_mesh: false,
            tls: None,
            store: None,
            postgres_pool_size: 2,
            postgres_connect_timeout_ms: 10_000,
            postgres_pool_wait_timeout_ms: 10_000,
            postgres_lock_timeout_ms: 10_000,
            postgres_turn_idle_timeout_ms: 10_000,
            postgres_statement_timeout_ms: 30_000,
        }
    }
}

pub(super) fn server_settings(
    loader: &Loader<'_>,
    mut raw: RawServer,
) -> Result<ServerSettings, PolicyError> {
    // Every number is at least 1, and at most what the layer below takes:
    // PostgreSQL's time settings are 32-bit milliseconds; hyper adds the
    // keep-alive times to an `Instant`, which panics past its range (a
    // day is the most that means anything); tokio's semaphore holds at
    // most `usize::MAX >> 3` permits and asserts it (no machine serves
    // more than 2^20 calls at once).
    let postgres_ms = Some((i32::MAX as u64, "(24 days)"));
    let keepalive = Some((MAX_KEEPALIVE_SECONDS, "(a day)"));
    let bounds: [(&str, u64, Option<Bound>); 20] = [
        (
            "max_concurrent_requests",
            raw.max_concurrent_requests as u64,
            Some((MAX_CONCURRENT_REQUESTS as u64, "")),
        ),
        ("request_timeout_ms", raw.request_timeout_ms, None),
        (
            "max_message_bytes",
            raw.max_message_bytes as u64,
            Some((MAX_MESSAGE_BYTES as u64, "(64 MiB)")),
        ),
        (
            "http2_keepalive_interval_seconds",
            raw.http2_keepalive_interval_seconds,
            keepalive,
        ),
        (
            "http2_keepalive_timeout_seconds",
            raw.http2_keepalive_timeout_seconds,
            keepalive,
        ),
        (
            "max_concurrent_streams",
            u64::from(raw.max_concurrent_streams),
            None,
        ),
        ("max_connections", raw.max_connections as u64, None),
        (
            "max_connections_per_peer",
            raw.max_connections_per_peer as u64,
            None,
        ),
        ("handshake_timeout_ms", raw.handshake_timeout_ms, None),
        // 0 would cut every call in flight at SIGTERM.
        (
            "shutdown_grace_seconds",
            raw.shutdown_grace_seconds,
            keepalive,
        ),
        ("read_timeout_ms", raw.read_timeout_ms, None),
        ("write_timeout_ms", raw.write_timeout_ms, None),
        (
            "max_buffered_request_bytes",
            raw.max_buffered_request_bytes as u64,
            None,
        ),
        (
            "max_buffered_response_bytes",
            raw.max_buffered_response_bytes as u64,
            None,
        ),
        (
            "postgres_pool_size",
            raw.postgres_pool_size as u64,
            Some((MAX_POSTGRES_POOL_SIZE as u64, "")),
        ),
        (
            "postgres_connect_timeout_ms",
            raw.postgres_connect_timeout_ms,
            postgres_ms,
        ),
        (
            "postgres_pool_wait_timeout_ms",
            raw.postgres_pool_wait_timeout_ms,
            postgres_ms,
        ),
        (
            "postgres_lock_timeout_ms",
            raw.postgres_lock_timeout_ms,
            postgres_ms,
        ),
        (
            "postgres_turn_idle_timeout_ms",
            raw.postgres_turn_idle_timeout_ms,
            postgres_ms,
        ),
        (
            "postgres_statement_timeout_ms",
            raw.postgres_statement_timeout_ms,
            postgres_ms,
        ),
    ];
    for (key, value, max) in bounds {
        let rule = match max {
            _ if value == 0 => "must be greater than 0".to_string(),
            Some((max, why)) if value > max => format!("must be at most {max} {why}"),
            _ => continue,
        };
        return Err(loader.error(format!("server.{key}"), rule.trim_end()));
    }
    let tls = raw
        .tls
        .take()
        .map(|tls| tls_files(loader, tls))
        .transpose()?;
    Ok(ServerSettings {
        tls,
        ..ServerSettings::from(raw)
    })
}

/// `[server.tls]`: paths relative to the policy file. The files are read
/// when the server starts (and on SIGHUP), not here: `check-config` on
/// another machine still validates the policy.
fn tls_files(loader: &Loader<'_>, raw: RawTls) -> Result<TlsFiles, PolicyError> {
    let resolve = |key: &str, path: PathBuf| -> Result<PathBuf, PolicyError> {
        if path.as_os_str().is_empty() {
            return Err(loader.error(format!("server.tls.{key}"), "must be a file path"));
        }
        match (path.is_absolute(), loader.base_dir) {
            (true, _) => Ok(path),
            (false, Some(base)) => Ok(base.join(path)),
            (false, None) => Ok(Path::new(".").join(path)),
        }
    };
    Ok(TlsFiles {
        cert: resolve("cert", raw.cert)?,
        key: resolve("key", raw.key)?,
        client_ca: raw
            .client_ca
            .map(|path| resolve("client_ca", path))
            .transpose()?,
    })
}
