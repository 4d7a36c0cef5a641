//! The offline tools: `canonical`, `fingerprint` and `manifest
//! fingerprint`; and reading a manifest file in either form, which
//! `manifest assess` shares.

use std::io::{self, BufWriter, Read, Write};
use std::path::Path;
use std::process::ExitCode;

use toolgate::domain::canonical::{self, Fingerprint};
use toolgate::domain::manifest::{self, Manifest, ManifestForm};

use crate::args::{JsonInput, ManifestFingerprintArgs};

/// Reads a manifest file in either form. `server_id` and `revision` name an
/// MCP result's server and revision; with a reference manifest (which names
/// its own) they are an error rather than silently ignored. `server_flag`
/// is how the command spells the server-id option, for messages.
pub fn read_manifest_file(
    file: &Path,
    server_id: Option<&str>,
    revision: Option<&str>,
    server_flag: &str,
) -> Result<(Manifest, ManifestForm), String> {
    let bytes =
        std::fs::read(file).map_err(|error| format!("cannot read {}: {error}", file.display()))?;
    let at = |error: &dyn std::fmt::Display| format!("{}: {error}", file.display());
    let form = manifest::detect_form(&bytes).map_err(|error| at(&error))?;
    let manifest = match (form, server_id, revision) {
        (ManifestForm::Reference, None, None) => {
            Manifest::from_json(&bytes).map_err(|error| at(&error))?
        }
        (ManifestForm::Reference, _, _) => {
            return Err(format!(
                "{} is a reference manifest, which names its own server and revision; \
                 {server_flag} and --revision apply only to an MCP tools/list result",
                file.display()
            ));
        }
        (ManifestForm::McpToolsList, Some(server_id), Some(revision)) => {
            Manifest::from_mcp_tools_list(&bytes, server_id.to_string(), revision.to_string())
                .map_err(|error| at(&error))?
        }
        (ManifestForm::McpToolsList, _, _) => {
            return Err(format!(
                "{} is an MCP tools/list result, which names no server or revision: \
                 pass {server_flag} ID --revision REV",
                file.display()
            ));
        }
    };
    Ok((manifest, form))
}

/// The stderr line that says what was read.
pub fn describe_manifest(file: &Path, manifest: &Manifest, form: ManifestForm) -> String {
    format!(
        "read {} as {} {}: server {:?}, revision {:?}, {} tool{}",
        file.display(),
        match form {
            ManifestForm::Reference => "a",
            ManifestForm::McpToolsList => "an",
        },
        form.as_str(),
        manifest.server_id,
        manifest.revision,
        manifest.tools.len(),
        if manifest.tools.len() == 1 { "" } else { "s" },
    )
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
pub fn run_manifest_fingerprint(args: &ManifestFingerprintArgs) -> ExitCode {
    let read = read_manifest_file(
        &args.file,
        args.server_id.as_deref(),
        args.revision.as_deref(),
        "--server",
    );
    let (manifest, form) = match read {
        Ok(read) => read,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::FAILURE;
        }
    };
    eprintln!("{}", describe_manifest(&args.file, &manifest, form));
    for problem in manifest.problems() {
        eprintln!(
            "warning: unsafe manifest: {problem}; AssessManifest never accepts it and PinManifest refuses it"
        );
    }
    print_fingerprint(manifest.fingerprint())
}

fn print_fingerprint(fingerprint: Fingerprint) -> ExitCode {
    let mut stdout = io::stdout().lock();
    match writeln!(stdout, "{fingerprint}").and_then(|()| stdout.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) if error.kind() == io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: cannot write output: {error}");
            ExitCode::from(2)
        }
    }
}
