//! The command line. `serve` is wired up in `main.rs`; the offline tools
//! (`canonical`, `fingerprint`, `manifest fingerprint`) live here.

use std::io::{self, BufWriter, Read, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand, ValueEnum};

use crate::canonical::{self, Fingerprint};
use crate::manifest::Manifest;

#[derive(Debug, Parser)]
#[command(
    name = "toolgate",
    version,
    about = "gRPC policy decision point for AI-agent hosts"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the gRPC server.
    Serve(ServeArgs),
    /// Print the canonical JSON of a JSON text (SPEC §1).
    Canonical(JsonInput),
    /// Print the SHA-256 fingerprint (hex) of a JSON text's canonical form.
    Fingerprint(JsonInput),
    /// Manifest tools.
    #[command(subcommand)]
    Manifest(ManifestCommand),
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Policy file (TOML); the embedded default policy serves without one.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:50051")]
    pub listen: SocketAddr,
    /// Log format.
    #[arg(long, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Args)]
pub struct JsonInput {
    /// Input file; standard input when absent.
    pub file: Option<PathBuf>,
    /// Treat every input line as a separate JSON text and print one result
    /// per line (`error: <kind>` for a rejected line).
    #[arg(long)]
    pub lines: bool,
}

#[derive(Debug, Subcommand)]
pub enum ManifestCommand {
    /// Print the fingerprint of a manifest in JSON.
    Fingerprint {
        /// Manifest file (JSON).
        file: PathBuf,
    },
}

fn read_input(file: Option<&Path>) -> io::Result<Vec<u8>> {
    match file {
        Some(path) => std::fs::read(path),
        None => {
            let mut bytes = Vec::new();
            io::stdin().lock().read_to_end(&mut bytes)?;
            Ok(bytes)
        }
    }
}

/// `toolgate canonical` (`hash = false`) and `toolgate fingerprint` (`hash = true`).
pub fn run_json_tool(input: &JsonInput, hash: bool) -> ExitCode {
    let bytes = match read_input(input.file.as_deref()) {
        Ok(bytes) => bytes,
        Err(error) => {
            eprintln!("error: cannot read input: {error}");
            return ExitCode::from(2);
        }
    };
    let render = |text: &[u8]| -> Result<String, canonical::CanonicalError> {
        let value = canonical::parse(text)?;
        Ok(if hash {
            canonical::fingerprint(&value).to_hex()
        } else {
            canonical::to_canonical(&value)
        })
    };
    let stdout = io::stdout();
    let mut out = BufWriter::new(stdout.lock());
    let mut failed = false;
    let written = if input.lines {
        let body = bytes.strip_suffix(b"\n").unwrap_or(&bytes);
        body.split(|byte| *byte == b'\n')
            .try_for_each(|line| match render(line) {
                Ok(text) => writeln!(out, "{text}"),
                Err(error) => {
                    failed = true;
                    writeln!(out, "error: {}", error.kind.as_str())
                }
            })
    } else {
        match render(&bytes) {
            Ok(text) => writeln!(out, "{text}"),
            Err(error) => {
                eprintln!("error: {error}");
                return ExitCode::FAILURE;
            }
        }
    };
    if let Err(error) = written.and_then(|()| out.flush()) {
        eprintln!("error: cannot write output: {error}");
        return ExitCode::from(2);
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

/// `toolgate manifest fingerprint FILE`.
pub fn run_manifest(command: &ManifestCommand) -> ExitCode {
    match command {
        ManifestCommand::Fingerprint { file } => {
            let fingerprint = std::fs::read(file)
                .map_err(|error| format!("cannot read {}: {error}", file.display()))
                .and_then(|bytes| Manifest::from_json(&bytes).map_err(|error| error.to_string()))
                .map(|manifest| manifest.fingerprint());
            match fingerprint {
                Ok(fingerprint) => print_fingerprint(fingerprint),
                Err(message) => {
                    eprintln!("error: {message}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn print_fingerprint(fingerprint: Fingerprint) -> ExitCode {
    println!("{fingerprint}");
    ExitCode::SUCCESS
}
