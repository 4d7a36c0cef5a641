//! The `toolgate` binary: parse the command line, set up tracing, load the
//! policy, bind, serve. Everything else lives in the library.

#![warn(clippy::unwrap_used, clippy::expect_used)]

use std::io::IsTerminal;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use tokio::net::TcpListener;
use tracing_subscriber::EnvFilter;

use toolgate::cli::{Cli, Command, LogFormat, ServeArgs};
use toolgate::clock::SystemClock;
use toolgate::engine::Engine;
use toolgate::policy::Policy;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve(args),
        Command::Canonical(input) => toolgate::cli::run_json_tool(&input, false),
        Command::Fingerprint(input) => toolgate::cli::run_json_tool(&input, true),
        Command::Manifest(command) => toolgate::cli::run_manifest(&command),
    }
}

fn init_tracing(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    match format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().flatten_event(true).init(),
    }
}

fn serve(args: ServeArgs) -> ExitCode {
    init_tracing(args.log_format);
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
    let runtime = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime,
        Err(error) => {
            tracing::error!(%error, "cannot start the runtime");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let listener = match TcpListener::bind(args.listen).await {
            Ok(listener) => listener,
            Err(error) => {
                tracing::error!(%error, listen = %args.listen, "cannot bind");
                return ExitCode::FAILURE;
            }
        };
        let local = listener
            .local_addr()
            .map(|addr| addr.to_string())
            .unwrap_or_default();
        tracing::info!(listen = %local, policy_revision = %policy.revision, "toolgate serving");
        // One machine-readable line for scripts that start toolgate on port 0.
        println!("toolgate listening on {local}");
        let engine = Engine::new(policy, Arc::new(SystemClock));
        let shutdown = async {
            let _ = tokio::signal::ctrl_c().await;
        };
        match toolgate::server::serve(listener, engine, shutdown).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(error) => {
                tracing::error!(%error, "server failed");
                ExitCode::FAILURE
            }
        }
    })
}
