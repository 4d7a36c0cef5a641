//! `toolgate store check` and `toolgate store backup FILE`: the durable
//! store's offline tools, safe beside a running server (see [`StoreArgs`]).

use std::process::ExitCode;

use toolgate::store::sqlite::{self, CheckReport, TableCount};

use crate::args::{StoreArgs, StoreCommand};
use crate::output::{Failure, emit, printable, record, say, table};

/// `toolgate store [--data-dir DIR] check|backup FILE`.
///
/// - `check`: the report on stdout (file, schema version, bytes, each
///   table's records, then `ok` or each problem); exit 0 when sound, 1 with
///   `error: …` on stderr when a problem was found.
/// - `backup FILE`: what was written on stdout, and how to restore it.
/// - A store that cannot be read at all (no directory, no database, an
///   existing FILE): `error: …` on stderr, exit 2.
pub fn run_store(args: &StoreArgs) -> ExitCode {
    let run = match &args.command {
        StoreCommand::Check => run_check(args),
        StoreCommand::Backup { file } => run_backup(args, file),
    };
    match run {
        Ok(code) => code,
        Err(failure) => failure.report(),
    }
}

fn run_check(args: &StoreArgs) -> Result<ExitCode, Failure> {
    let report = sqlite::check(&args.data_dir).map_err(|error| Failure::Usage(error.0))?;
    emit(&check_text(&report))?;
    if report.ok() {
        return Ok(ExitCode::SUCCESS);
    }
    say(&format!(
        "error: the store at {} failed its check ({} problem{})",
        printable(&args.data_dir.display().to_string()),
        report.problems.len(),
        if report.problems.len() == 1 { "" } else { "s" }
    ));
    Ok(ExitCode::FAILURE)
}

fn check_text(report: &CheckReport) -> String {
    let mut text = record(&[
        ("store", printable(&report.path.display().to_string())),
        ("schema", report.schema_version.to_string()),
        ("bytes", report.bytes.to_string()),
        ("records", report.records().to_string()),
    ]);
    if !report.tables.is_empty() {
        text.push('\n');
        text.push_str(&tables_text(&report.tables));
    }
    text.push('\n');
    if report.ok() {
        text.push_str("ok\n");
    }
    for problem in &report.problems {
        text.push_str(&format!("problem: {}\n", printable(problem)));
    }
    text
}

fn tables_text(tables: &[TableCount]) -> String {
    let rows: Vec<Vec<String>> = tables
        .iter()
        .map(|table| vec![table.table.clone(), table.records.to_string()])
        .collect();
    table(&["TABLE", "RECORDS"], &rows)
}

fn run_backup(args: &StoreArgs, file: &std::path::Path) -> Result<ExitCode, Failure> {
    let report = sqlite::backup(&args.data_dir, file).map_err(|error| Failure::Usage(error.0))?;
    let file = printable(&report.file.display().to_string());
    let mut text = record(&[
        ("backup", file.clone()),
        ("schema", report.schema_version.to_string()),
        ("bytes", report.bytes.to_string()),
        ("records", report.records().to_string()),
        (
            "restore",
            format!("mkdir -m 700 NEW && cp {file} NEW/{}", sqlite::DB_FILE),
        ),
    ]);
    text.push('\n');
    text.push_str(&tables_text(&report.tables));
    emit(&text)?;
    Ok(ExitCode::SUCCESS)
}
