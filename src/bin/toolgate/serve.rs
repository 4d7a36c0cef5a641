//! `toolgate serve`: logging set up from the command line, the policy
//! loaded and checked against how it serves ([`Policy::check_serving`],
//! the non-loopback guard), the listeners bound, SIGHUP reload
//! ([`reload`]) and, on the embedded policy, the reviewer token
//! ([`bootstrap`]); the state recovered from the store ([`open_engine`]);
//! then the library's server until SIGTERM or Ctrl-C, and the store's last
//! batch committed.

use std::io::IsTerminal;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::net::TcpListener;
use tokio::signal::unix::{SignalKind, signal};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::{FilterExt, filter_fn};
use tracing_subscriber::prelude::*;

use toolgate::domain::clock::{Clock, MonotonicClock, SystemClock};
use toolgate::domain::policy::{Policy, Serving, TlsFiles};
use toolgate::engine::Engine;
use toolgate::engine::{bootstrap, reload};
use toolgate::ops::audit::{self, AuditFormat, AuditLayer};
use toolgate::ops::logwriter::{self, LogGuard, RotatingFile, SinkStatus};
use toolgate::ops::tls::ServerTls;

use toolgate::store::Store;
use toolgate::store::memory::Volatile;
use toolgate::store::postgres::PostgresStore;
use toolgate::store::sqlite::SqliteStore;

use crate::args::{DEFAULT_DATA_DIR, LogFormat, ServeArgs, StoreKind};

/// Logs go to stderr through a background writer ([`logwriter`]), so a
/// Decide never waits for a `write` system call. It is not lossy: when its
/// buffer is full, callers wait rather than drop audit events. The guard
/// writes what is left at exit. Audit events have their own formatter
/// ([`AuditLayer`]); `RUST_LOG` filters the others. `--log-file` writes to a file
/// rotated by size instead.
fn init_tracing(args: &ServeArgs) -> std::io::Result<(LogGuard, SinkStatus)> {
    let format = args.log_format;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let stall_after = std::time::Duration::from_secs(args.log_stall_seconds);
    let (writer, guard) = match &args.log_file {
        Some(path) => logwriter::spawn_with(
            RotatingFile::open(
                path,
                args.log_max_bytes,
                usize::try_from(args.log_max_files).unwrap_or(usize::MAX),
            )?,
            logwriter::CAPACITY,
            logwriter::HARD_CAPACITY,
            stall_after,
        )?,
        None => logwriter::spawn_with(
            std::io::stderr(),
            logwriter::CAPACITY,
            logwriter::HARD_CAPACITY,
            stall_after,
        )?,
    };
    let sink = writer.status();
    let ansi = args.log_file.is_none() && std::io::stderr().is_terminal();
    // Both layers are filtered by target, so that a callsite neither wants
    // (h2's trace events, say) stays disabled once and for all instead of
    // being asked about on every event.
    // `RUST_LOG` chooses the other logs only: the audit trail is every
    // audit event whatever it says (`RUST_LOG=warn` dropped the decisions).
    // (The target filter says TRACE, so that the pair's hint is
    // `RUST_LOG`'s, the global level with it: `log` records above it are
    // dropped by a level comparison, not by running the filters.)
    let not_audit = filter_fn(|metadata| metadata.target() != audit::TARGET)
        .with_max_level_hint(tracing::Level::TRACE)
        .and(filter);
    let only_audit = filter_fn(|metadata| metadata.target() == audit::TARGET)
        .with_max_level_hint(tracing::Level::INFO);
    let logs = tracing_subscriber::fmt::layer()
        .with_ansi(ansi)
        .with_writer(writer.clone());
    let registry = tracing_subscriber::registry();
    match format {
        LogFormat::Text => registry
            .with(logs.with_filter(not_audit))
            .with(AuditLayer::new(writer, AuditFormat::Text).with_filter(only_audit))
            .init(),
        LogFormat::Json => registry
            .with(logs.json().flatten_event(true).with_filter(not_audit))
            .with(AuditLayer::new(writer, AuditFormat::Json).with_filter(only_audit))
            .init(),
    }
    Ok((guard, sink))
}

/// `toolgate serve`.
pub fn serve(args: ServeArgs) -> ExitCode {
    let (log_guard, log_sink) = match init_tracing(&args) {
        Ok(started) => started,
        Err(error) => {
            eprintln!("toolgate: cannot start the log writer: {error}");
            return ExitCode::FAILURE;
        }
    };
    // Before the state is loaded: all of it on small pages.
    if let Err(error) = toolgate::ops::process::disable_transparent_huge_pages() {
        tracing::warn!(%error, "cannot turn transparent huge pages off: first touches of fresh memory may stall calls for milliseconds");
    }
    let policy = match &args.config {
        Some(path) => Policy::load(path),
        None => Policy::embedded_default(),
    };
    let policy = match policy {
        Ok(policy) => policy,
        Err(error) => {
            tracing::error!(%error, "cannot load policy");
            return ExitCode::FAILURE;
        }
    };
    // First what the policy says of the address alone (an open host API
    // off loopback): the TLS checks below would otherwise speak first.
    if let Err(refusal) = policy.check_listen(args.listen) {
        tracing::error!(listen = %args.listen, "{refusal}");
        return ExitCode::FAILURE;
    }
    // Dangling names (check-config lists them): said at start too, so that
    // a server whose approver role nobody holds does not start silently.
    // (The embedded policy's reviewer gets its token below.)
    for warning in policy.warnings.iter().filter(|_| args.config.is_some()) {
        tracing::warn!(key = %warning.key, "policy: {}", warning.message);
    }
    let tls = match server_tls(&args, &policy) {
        Ok(tls) => tls,
        Err(refusal) => {
            tracing::error!(listen = %args.listen, "{refusal}");
            return ExitCode::FAILURE;
        }
    };
    // What start and every reload hold the policy to.
    let serving = Serving {
        listen: args.listen,
        ext_authz_listener: args.ext_authz_listen.is_some(),
        mutual_tls: tls.as_ref().is_some_and(ServerTls::mutual),
    };
    if let Err(refusal) = policy.check_serving(&serving) {
        tracing::error!(listen = %args.listen, "{refusal}");
        return ExitCode::FAILURE;
    }
    // How long the end waits for what is still running, and then for the
    // log sink ([server] cannot change without a restart).
    let grace = policy.server.shutdown_grace;
    let engine = match open_engine(&args, policy) {
        Ok(engine) => engine,
        Err(error) => {
            tracing::error!("{error}");
            return ExitCode::FAILURE;
        }
    };
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            tracing::error!(%error, "cannot start the runtime");
            return ExitCode::FAILURE;
        }
    };
    // When the calls' grace ended: the store's writer, the runtime and the
    // log sink share one more from then.
    let stopped = std::sync::OnceLock::new();
    let stopped_at = &stopped;
    let code = runtime.block_on(async move {
        // Everything that can fail is done before anything is announced, so
        // that a busy port prints `cannot bind` and nothing else: no token,
        // no `listening on` for a server that is about to exit.
        let listener = match TcpListener::bind(args.listen).await {
            Ok(listener) => listener,
            Err(error) => {
                tracing::error!(%error, listen = %args.listen, "cannot bind");
                return ExitCode::FAILURE;
            }
        };
        let Ok(metrics) = bind_optional(args.metrics_listen, "metrics").await else {
            return ExitCode::FAILURE;
        };
        let Ok(ext_authz) = bind_optional(args.ext_authz_listen, "ext_authz").await else {
            return ExitCode::FAILURE;
        };
        // SIGHUP is caught from before the address is announced: a reload
        // sent right after `listening on` must not kill the process (nor
        // one sent to a server with nothing to reload).
        if let Err(error) = reload::reload_on_sighup(
                engine.clone(),
                args.config.clone(),
                serving,
                tls.clone(),
            )
        {
            tracing::error!(%error, "cannot listen for SIGHUP; policy and TLS reload are off");
        }
        // SIGTERM too: its handler is installed here, not when the server
        // first polls its shutdown future, so that a SIGTERM sent right
        // after `listening on` stops the process cleanly instead of
        // killing it (seen in CI: answered calls, then killed by it).
        let shutdown = shutdown_signal(log_sink.clone());
        let log_sink_at_end = log_sink.clone();
        if args.config.is_none()
            && let Some(token) = bootstrap::reviewer_token(&engine)
        {
            // Once, to stderr, never through tracing: tokens stay out of logs.
            eprintln!(
                "toolgate: reviewer token for {:?} (embedded policy, valid until exit): {token}",
                bootstrap::REVIEWER
            );
        }
        let local = listener
            .local_addr()
            .map(|addr| addr.to_string())
            .unwrap_or_default();
        let transport = match &tls {
            None => "plaintext",
            Some(tls) if tls.mutual() => "mtls",
            Some(_) => "tls",
        };
        tracing::info!(listen = %local, transport, policy_revision = %engine.policy().revision, "toolgate serving");
        // One machine-readable line for scripts that start toolgate on port 0.
        println!("toolgate listening on {local}");
        if let Some(metrics) = &metrics {
            let local = metrics.local_addr().map(|addr| addr.to_string()).unwrap_or_default();
            tracing::info!(metrics_listen = %local, "serving /metrics");
            println!("toolgate metrics on {local}");
        }
        if let Some(ext_authz) = &ext_authz {
            let local = ext_authz.local_addr().map(|addr| addr.to_string()).unwrap_or_default();
            tracing::info!(ext_authz_listen = %local, "serving envoy.service.auth.v3.Authorization");
            println!("toolgate ext_authz on {local}");
        }
        let listeners = toolgate::server::Listeners {
            grpc: listener,
            metrics,
            ext_authz,
        };
        let options = toolgate::server::ServeOptions {
            log_sink: Some(log_sink),
            tls,
        };
        let served = toolgate::server::serve_with_options(
            listeners,
            engine.clone(),
            options,
            shutdown,
        )
        .await;
        // Whatever ended the serving (a signal, a failure), nothing may
        // wait for room in the log buffer from here on.
        log_sink_at_end.let_callers_through();
        // In-flight calls had their grace; the store's writer, the runtime
        // and the log sink share one more: nothing that hangs (a sync on a
        // hung disk, a stderr pipe nobody reads) keeps the process alive.
        let _ = stopped_at.set(Instant::now());
        // Every answer given was durable already; this only ends the writer.
        let store_closed = engine.close_store_within(grace);
        if !store_closed {
            tracing::error!(
                "the store's writer did not end well within {grace:?} (a sync on a hung disk? \
                 a failure?): what it had not written yet was never acknowledged"
            );
        }
        match served {
            Ok(()) if store_closed => ExitCode::SUCCESS,
            Ok(()) => ExitCode::FAILURE,
            Err(error) => {
                tracing::error!(%error, "server failed");
                ExitCode::FAILURE
            }
        }
    });
    let deadline = *stopped.get_or_init(Instant::now) + grace;
    runtime.shutdown_timeout(deadline.saturating_duration_since(Instant::now()));
    // Lines that could not be written make the exit a failure: the one
    // report left when the log is what failed. (A second at least: a sink
    // that keeps up needs milliseconds.)
    let left = deadline.saturating_duration_since(Instant::now());
    if !log_guard.finish(left.max(Duration::from_secs(1))) {
        return ExitCode::FAILURE;
    }
    code
}

/// An optional listener (`--metrics-listen`, `--ext-authz-listen`), bound;
/// `Err` once the failure is logged.
async fn bind_optional(address: Option<SocketAddr>, what: &str) -> Result<Option<TcpListener>, ()> {
    let Some(address) = address else {
        return Ok(None);
    };
    match TcpListener::bind(address).await {
        Ok(listener) => Ok(Some(listener)),
        Err(error) => {
            tracing::error!(%error, listen = %address, "cannot bind the {what} listener");
            Err(())
        }
    }
}

/// The TLS to serve: `--tls-cert`/`--tls-key`/`--tls-client-ca` (paths
/// from the working directory), else the policy's `[server.tls]`, loaded
/// now so that a bad file stops the start. Refused: plaintext on a
/// non-loopback address (`--listen` or `--ext-authz-listen`, whose callers
/// need no token) without `--insecure-plaintext-behind-mesh` (or `[server]
/// plaintext_behind_mesh = true`), flags that would drop the policy's
/// `client_ca`, and credentials bound to a client certificate without mTLS.
fn server_tls(args: &ServeArgs, policy: &Policy) -> Result<Option<ServerTls>, String> {
    let files = match (&args.tls_cert, &args.tls_key) {
        (Some(_), Some(_))
            if args.tls_client_ca.is_none()
                && policy
                    .server
                    .tls
                    .as_ref()
                    .is_some_and(|tls| tls.client_ca.is_some()) =>
        {
            return Err(
                "--tls-cert/--tls-key replace the policy's [server.tls], whose client_ca \
                 requires client certificates: give --tls-client-ca too (or remove client_ca \
                 from the policy), so that mTLS is not dropped unseen"
                    .to_string(),
            );
        }
        (Some(cert), Some(key)) => Some(TlsFiles {
            cert: cert.clone(),
            key: key.clone(),
            client_ca: args.tls_client_ca.clone(),
        }),
        _ => policy.server.tls.clone(),
    };
    let plaintext_acknowledged =
        args.insecure_plaintext_behind_mesh || policy.server.plaintext_behind_mesh;
    let addresses = [
        ("--listen", Some(args.listen)),
        ("--ext-authz-listen", args.ext_authz_listen),
    ];
    for (flag, address) in addresses {
        let Some(address) = address else { continue };
        if files.is_none() && !address.ip().is_loopback() && !plaintext_acknowledged {
            return Err(format!(
                "refusing to serve plaintext on the non-loopback address {address} ({flag}): \
                 configure TLS ([server.tls] or --tls-cert/--tls-key), or acknowledge that a \
                 service mesh provides it (--insecure-plaintext-behind-mesh or [server] \
                 plaintext_behind_mesh = true)"
            ));
        }
    }
    files
        .map(ServerTls::load)
        .transpose()
        .map_err(|error| format!("cannot load tls: {error}"))
}

/// The engine on the store `--store` names, with the state it holds
/// recovered (and how long that took, logged).
fn open_engine(args: &ServeArgs, policy: Policy) -> Result<Engine, String> {
    let started = std::time::Instant::now();
    let kind = match (&args.store, &policy.server.store) {
        (Some(kind), _) => kind.clone(),
        // The message names the key and the rule, never the URL's password.
        (None, Some(setting)) => {
            StoreKind::parse(&setting.0).map_err(|message| format!("[server] store: {message}"))?
        }
        (None, None) => StoreKind::Sqlite,
    };
    let store: Box<dyn Store> = match &kind {
        StoreKind::Memory | StoreKind::Postgres(_) if args.data_dir.is_some() => {
            let dir = args.data_dir.as_deref().unwrap_or(std::path::Path::new(""));
            let store = match &kind {
                StoreKind::Postgres(_) => "a postgres:// store",
                _ => "--store memory",
            };
            return Err(format!(
                "--data-dir {} has no effect with {store}; give one or the other",
                dir.display()
            ));
        }
        StoreKind::Memory | StoreKind::Sqlite if args.migrate => {
            return Err(
                "--migrate is for a postgres:// store; the embedded store migrates itself, \
                 and --store memory has no tables"
                    .to_string(),
            );
        }
        StoreKind::Memory => {
            tracing::warn!(
                "--store memory: the state (approvals, receipts, sessions, pins, resources) \
                 is forgotten when this process exits"
            );
            Box::new(Volatile)
        }
        StoreKind::Sqlite => {
            let dir = args
                .data_dir
                .clone()
                .unwrap_or_else(|| DEFAULT_DATA_DIR.into());
            let store = SqliteStore::open(&dir).map_err(|error| error.to_string())?;
            tracing::info!(data_dir = %dir.display(), "state kept in {} (sqlite)", dir.display());
            Box::new(store)
        }
        StoreKind::Postgres(target) => {
            // The pool and time limits of `[server] postgres_*`.
            let target = (**target).clone().with_settings(policy.server.postgres);
            let opened = match args.migrate {
                true => PostgresStore::open(&target),
                false => PostgresStore::open_current(&target),
            };
            let store = opened.map_err(|error| error.to_string())?;
            let opened = store.opened();
            // The URL as shown everywhere: without its password.
            match opened.describe() {
                Some(what) => tracing::info!(
                    store = %target,
                    schema_version = opened.version,
                    "state kept in PostgreSQL at {target}; {what}"
                ),
                None => tracing::info!(
                    store = %target,
                    schema_version = opened.version,
                    "state kept in PostgreSQL at {target} (schema version {})",
                    opened.version
                ),
            }
            Box::new(store)
        }
    };
    // Replicas take their time from the database's clock, so that they
    // share one; a store of this process alone runs on the monotonic clock.
    let clock: Arc<dyn Clock> = match kind {
        StoreKind::Postgres(_) => Arc::new(SystemClock),
        StoreKind::Memory | StoreKind::Sqlite => Arc::new(MonotonicClock::new()),
    };
    let engine = Engine::open(policy, clock, store)
        .map_err(|error| format!("cannot recover the state: {error}"))?;
    let stats = engine.stats().map_err(|error| error.to_string())?;
    tracing::info!(
        store = engine.store_name(),
        approvals = stats.approvals,
        receipts = stats.receipts,
        sessions = stats.sessions,
        millis = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        "state recovered"
    );
    Ok(engine)
}

/// Catches SIGTERM and Ctrl-C from now on (the handlers are installed
/// before this returns); the future resolves on either.
fn shutdown_signal(log_sink: SinkStatus) -> impl Future<Output = ()> + Send + 'static {
    let terminate = signal(SignalKind::terminate());
    let interrupt = signal(SignalKind::interrupt());
    async move {
        let next = |caught: std::io::Result<tokio::signal::unix::Signal>, name: &'static str| async move {
            match caught {
                Ok(mut caught) => {
                    caught.recv().await;
                }
                Err(error) => {
                    tracing::error!(%error, "cannot listen for {name}");
                    std::future::pending::<()>().await;
                }
            }
        };
        tokio::select! {
            () = next(terminate, "SIGTERM") => {}
            () = next(interrupt, "SIGINT") => {}
        }
        // No caller may wait for room in the log buffer from now on: the
        // exit would wait for it (its lines are still written, or counted
        // as lost at the exit).
        log_sink.let_callers_through();
        tracing::info!("shutting down");
    }
}
