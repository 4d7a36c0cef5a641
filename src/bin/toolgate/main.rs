//! The `toolgate` binary: parse the command line, set up tracing, load the
//! policy, bind, serve. Everything else lives in the library.

#![warn(clippy::unwrap_used, clippy::expect_used)]

use std::io::IsTerminal;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use tokio::net::TcpListener;
use tokio::signal::unix::{Signal, SignalKind, signal};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::filter::filter_fn;
use tracing_subscriber::prelude::*;

use crate::args::{Cli, Command, LogFormat, ManifestCommand, ServeArgs};

use toolgate::audit;
use toolgate::audit::{AuditFormat, AuditLayer};
use toolgate::logwriter::{self, LogGuard, RotatingFile, SinkStatus};

use toolgate::clock::SystemClock;
use toolgate::engine::Engine;
use toolgate::policy::{CredentialKind, Policy};

mod approvals;
mod args;
mod assess;
mod check_config;
mod client;
mod offline;
mod output;
mod pins;
mod resource;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve(args),
        Command::Canonical(input) => offline::run_json_tool(&input, false),
        Command::Fingerprint(input) => offline::run_json_tool(&input, true),
        Command::Manifest(ManifestCommand::Fingerprint(args)) => {
            offline::run_manifest_fingerprint(&args)
        }
        Command::Manifest(ManifestCommand::Assess(args)) => assess::run_manifest_assess(&args),
        Command::Approvals(args) => approvals::run_approvals(args),
        Command::Pins(args) => pins::run_pins(args),
        Command::Resource(args) => resource::run_resource(args),
        Command::CheckConfig(args) => check_config::run_check_config(&args),
    }
}

/// Logs go to stderr through a background writer ([`logwriter`]), so a
/// Decide never waits for a `write` system call. It is not lossy: when its
/// buffer is full, callers wait rather than drop audit events. The guard
/// writes what is left at exit. Audit events have their own formatter
/// ([`AuditLayer`]); `RUST_LOG` filters both. `--log-file` writes to a file
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
    let not_audit = filter_fn(|metadata| metadata.target() != audit::TARGET);
    let only_audit = filter_fn(|metadata| metadata.target() == audit::TARGET);
    let logs = tracing_subscriber::fmt::layer()
        .with_ansi(ansi)
        .with_writer(writer.clone());
    let registry = tracing_subscriber::registry().with(filter);
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

fn serve(args: ServeArgs) -> ExitCode {
    let (_flush_logs_at_exit, log_sink) = match init_tracing(&args) {
        Ok(started) => started,
        Err(error) => {
            eprintln!("toolgate: cannot start the log writer: {error}");
            return ExitCode::FAILURE;
        }
    };
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
    if let Err(refusal) = policy.check_listen(args.listen) {
        tracing::error!(listen = %args.listen, "{refusal}");
        return ExitCode::FAILURE;
    }
    let engine = Engine::new(policy, Arc::new(SystemClock));
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            tracing::error!(%error, "cannot start the runtime");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
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
        let metrics = match args.metrics_listen {
            None => None,
            Some(address) => match TcpListener::bind(address).await {
                Ok(listener) => Some(listener),
                Err(error) => {
                    tracing::error!(%error, metrics_listen = %address, "cannot bind the metrics listener");
                    return ExitCode::FAILURE;
                }
            },
        };
        // SIGHUP is caught from before the address is announced: a reload
        // sent right after `listening on` must not kill the process.
        let hangups = match &args.config {
            Some(path) => match signal(SignalKind::hangup()) {
                Ok(hangups) => Some((hangups, path.clone())),
                Err(error) => {
                    tracing::error!(%error, "cannot listen for SIGHUP; policy reload is off");
                    None
                }
            },
            None => None,
        };
        if args.config.is_none() && !engine.has_credentials(CredentialKind::Reviewer) {
            let token = bootstrap::reviewer_token(&engine);
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
        tracing::info!(listen = %local, policy_revision = %engine.policy().revision, "toolgate serving");
        // One machine-readable line for scripts that start toolgate on port 0.
        println!("toolgate listening on {local}");
        if let Some(metrics) = &metrics {
            let local = metrics.local_addr().map(|addr| addr.to_string()).unwrap_or_default();
            tracing::info!(metrics_listen = %local, "serving /metrics");
            println!("toolgate metrics on {local}");
        }
        if let Some((hangups, path)) = hangups {
            tokio::spawn(reload_on_hangup(engine.clone(), path, args.listen, hangups));
        }
        let listeners = toolgate::server::Listeners {
            grpc: listener,
            metrics,
        };
        let options = toolgate::server::ServeOptions {
            log_sink: Some(log_sink),
        };
        match toolgate::server::serve_with_options(listeners, engine, options, shutdown_signal())
            .await
        {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                tracing::error!(%error, "server failed");
                ExitCode::FAILURE
            }
        }
    })
}

/// Resolves on Ctrl-C or SIGTERM.
async fn shutdown_signal() {
    let terminate = async {
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => {
                terminate.recv().await;
            }
            Err(error) => {
                tracing::error!(%error, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = terminate => {}
    }
    tracing::info!("shutting down");
}

/// Reloads the policy file on SIGHUP. A file that does not load, or one the
/// reload decision ([`Engine::reload`]) refuses, keeps the old policy and is
/// reported at WARN.
async fn reload_on_hangup(
    engine: Engine,
    path: PathBuf,
    listen: std::net::SocketAddr,
    mut hangups: Signal,
) {
    while hangups.recv().await.is_some() {
        let load_path = path.to_path_buf();
        match tokio::task::spawn_blocking(move || Policy::load(&load_path)).await {
            Ok(Ok(policy)) => {
                if let Err(refusal) = engine.reload(policy, listen) {
                    toolgate::audit_warn!(
                        "policy_reload_failed",
                        error = %refusal,
                        kept_revision = %engine.policy().revision,
                    );
                }
            }
            Ok(Err(error)) => toolgate::audit_warn!(
                "policy_reload_failed",
                %error,
                kept_revision = %engine.policy().revision,
            ),
            Err(error) => toolgate::audit_warn!(
                "policy_reload_failed",
                %error,
                kept_revision = %engine.policy().revision,
            ),
        }
    }
}

mod bootstrap {
    use rand::RngCore;
    use toolgate::canonical::Fingerprint;
    use toolgate::engine::Engine;
    use toolgate::policy::{Credential, CredentialKind};

    /// The embedded default policy's reviewer.
    pub const REVIEWER: &str = "admin";

    /// Makes a random reviewer token for the embedded policy's reviewer and
    /// registers its digest; returns the token.
    pub fn reviewer_token(engine: &Engine) -> String {
        let mut bytes = [0u8; 32];
        rand::rng().fill_bytes(&mut bytes);
        let token = format!("tgr_{}", hex::encode(bytes));
        engine.add_runtime_credential(
            Fingerprint::of_bytes(token.as_bytes()),
            Credential {
                kind: CredentialKind::Reviewer,
                identity: REVIEWER.to_string(),
                actors: Vec::new(),
            },
        );
        token
    }
}
