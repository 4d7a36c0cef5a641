//! What the commands print and how they fail: the failure kinds and their
//! exit statuses, stdout and stderr writers, protobuf's canonical JSON
//! mapping, and the tables (lists fit [`LINE_WIDTH`] columns).
//!
//! Failures end in one `error: …` line on stderr and an exit status:
//! 1 when the server refused the call, 2 for usage, input-file and
//! connection errors. Server- and reviewer-supplied text goes through
//! [`printable`] before it reaches a terminal.

use std::fmt::Write as _;
use std::io::{self, Write as _};
use std::process::ExitCode;
use std::sync::OnceLock;

use prost_reflect::{DescriptorPool, DynamicMessage};
use serde::Serialize;
use tonic::{Code, Status};

use toolgate::domain::canonical;
use toolgate::pb;

// ----- failures and exit codes --------------------------------------------

/// Why a command failed; decides the message and the exit status.
#[derive(Debug)]
pub enum Failure {
    /// Bad command-line value or local input file (exit 2).
    Usage(String),
    /// The server could not be reached (exit 2).
    Connect(String),
    /// The server answered with an error status (exit 1; 2 for `Unavailable`).
    Status(Status),
    /// Refused on the server's answer, by the client (exit 1): e.g. no
    /// approval id starts with the prefix given.
    Refused(String),
    /// Writing to stdout failed (a closed pipe ends quietly).
    Output(io::Error),
}

impl Failure {
    pub fn report(self) -> ExitCode {
        match self {
            Failure::Usage(message) | Failure::Connect(message) => {
                say(&format!("error: {message}"));
                ExitCode::from(2)
            }
            Failure::Refused(message) => {
                say(&format!("error: {message}"));
                ExitCode::FAILURE
            }
            Failure::Status(status) => {
                say(&format!(
                    "error: {:?}: {}",
                    status.code(),
                    printable(status.message())
                ));
                if status.code() == Code::Unavailable {
                    ExitCode::from(2)
                } else {
                    ExitCode::FAILURE
                }
            }
            Failure::Output(error) if error.kind() == io::ErrorKind::BrokenPipe => {
                ExitCode::SUCCESS
            }
            Failure::Output(error) => {
                say(&format!("error: cannot write output: {error}"));
                ExitCode::from(2)
            }
        }
    }
}

impl From<Status> for Failure {
    fn from(status: Status) -> Self {
        Failure::Status(status)
    }
}

impl From<io::Error> for Failure {
    fn from(error: io::Error) -> Self {
        Failure::Output(error)
    }
}

/// One line on stderr. Unlike `eprintln!`, a closed stderr is ignored
/// rather than a panic.
pub fn say(line: &str) {
    let mut stderr = io::stderr().lock();
    let _ = writeln!(stderr, "{line}");
}

/// Server- or reviewer-supplied text made safe for a terminal: control
/// characters are escaped so they cannot move the cursor or recolour it.
pub fn printable(text: &str) -> String {
    if !text.chars().any(char::is_control) {
        return text.to_string();
    }
    text.chars()
        .map(|character| {
            if character.is_control() {
                character.escape_default().to_string()
            } else {
                character.to_string()
            }
        })
        .collect()
}

/// Writes `text` to stdout and flushes it.
pub fn emit(text: &str) -> Result<(), Failure> {
    let mut stdout = io::stdout().lock();
    stdout.write_all(text.as_bytes())?;
    stdout.flush()?;
    Ok(())
}

pub fn emit_json<T: Serialize>(value: &T) -> Result<(), Failure> {
    let mut text = serde_json::to_string_pretty(value)
        .map_err(|error| Failure::Output(io::Error::other(error)))?;
    text.push('\n');
    emit(&text)
}
// ----- JSON: protobuf's canonical JSON mapping -----------------------------

/// The descriptors of the toolgate API, decoded once.
fn descriptor_pool() -> Result<&'static DescriptorPool, Failure> {
    static POOL: OnceLock<Result<DescriptorPool, String>> = OnceLock::new();
    POOL.get_or_init(|| {
        DescriptorPool::decode(pb::FILE_DESCRIPTOR_SET).map_err(|error| error.to_string())
    })
    .as_ref()
    .map_err(|error| {
        Failure::Output(io::Error::other(format!(
            "cannot read the API descriptors: {error}"
        )))
    })
}

/// A message in protobuf's canonical JSON mapping, as grpcurl prints it:
/// lowerCamelCase field names, enum value names, 64-bit integers as
/// strings, timestamps in RFC 3339, fields with default values left out.
/// `full_name` is the message's proto name (`toolgate.v1.Approval`).
pub fn proto_json<M: prost::Message>(
    message: &M,
    full_name: &str,
    pretty: bool,
) -> Result<String, Failure> {
    let failed = |what: String| Failure::Output(io::Error::other(what));
    let descriptor = descriptor_pool()?
        .get_message_by_name(full_name)
        .ok_or_else(|| failed(format!("no message {full_name} in the API descriptors")))?;
    let dynamic = DynamicMessage::decode(descriptor, message.encode_to_vec().as_slice())
        .map_err(|error| failed(format!("cannot re-read {full_name}: {error}")))?;
    let text = if pretty {
        serde_json::to_string_pretty(&dynamic)
    } else {
        serde_json::to_string(&dynamic)
    };
    text.map_err(|error| failed(format!("cannot write {full_name} as JSON: {error}")))
}

/// One message as a pretty JSON document on stdout.
pub fn emit_proto<M: prost::Message>(message: &M, full_name: &str) -> Result<(), Failure> {
    let mut text = proto_json(message, full_name, true)?;
    text.push('\n');
    emit(&text)
}

/// A JSON text field for a table cell: canonical (ASCII-only) when it parses.
pub fn json_cell(text: &str) -> String {
    match canonical::parse(text.as_bytes()) {
        Ok(value) => canonical::to_canonical(&value),
        Err(_) => printable(text),
    }
}

pub fn rfc3339(timestamp: Option<&prost_types::Timestamp>) -> Option<String> {
    timestamp.map(ToString::to_string)
}
// ----- tables -------------------------------------------------------------

/// The widest line `approvals list`, `approvals watch` and `resource list`
/// print: they fit a 100-column terminal.
pub const LINE_WIDTH: usize = 100;
/// Ends a cell or line that was cut to fit.
const CUT_MARKER: char = '…';

/// `text` cut to `width` characters, the last one the cut marker.
pub fn clip(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_string();
    }
    let mut clipped: String = text.chars().take(width.saturating_sub(1)).collect();
    if width > 0 {
        clipped.push(CUT_MARKER);
    }
    clipped
}

/// Columns padded to their widest cell; the last column is not padded.
pub fn table(headers: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = headers
        .iter()
        .map(|header| header.chars().count())
        .collect();
    for row in rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut text = String::new();
    let header_row: Vec<String> = headers.iter().map(ToString::to_string).collect();
    for row in std::iter::once(&header_row).chain(rows) {
        let mut line = String::new();
        for (index, (cell, width)) in row.iter().zip(&widths).enumerate() {
            if index + 1 == row.len() {
                line.push_str(cell);
            } else {
                let _ = write!(line, "{cell:<width$}  ");
            }
        }
        text.push_str(line.trim_end());
        text.push('\n');
    }
    text
}

/// A table whose last column is cut so that every line fits [`LINE_WIDTH`]
/// (the other columns are expected to be bounded already).
pub fn fitted_table(headers: &[&str], mut rows: Vec<Vec<String>>) -> String {
    let leading = headers.len().saturating_sub(1);
    let mut widths: Vec<usize> = headers[..leading]
        .iter()
        .map(|header| header.chars().count())
        .collect();
    for row in &rows {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let used: usize = widths.iter().map(|width| width + 2).sum();
    let last_width = LINE_WIDTH.saturating_sub(used).max(1);
    for row in &mut rows {
        if let Some(last) = row.last_mut() {
            *last = clip(last, last_width);
        }
    }
    table(headers, &rows)
}

/// One record as `key  value` lines, keys aligned.
pub fn record(fields: &[(&str, String)]) -> String {
    let width = fields
        .iter()
        .map(|(key, _)| key.chars().count())
        .max()
        .unwrap_or(0);
    let mut text = String::new();
    for (key, value) in fields {
        let _ = writeln!(text, "{key:<width$}  {value}");
    }
    text
}

/// A possibly empty cell: `-` when empty, terminal-safe otherwise.
pub fn cell(text: &str) -> String {
    if text.is_empty() {
        "-".to_string()
    } else {
        printable(text)
    }
}

pub fn time_cell(timestamp: Option<&prost_types::Timestamp>) -> String {
    rfc3339(timestamp).unwrap_or_else(|| "-".to_string())
}
