//! `toolgate store check` and `toolgate store backup FILE`: the durable
//! store's offline tools, safe beside a running server (see [`StoreArgs`]);
//! and `toolgate store migrate`, which creates or migrates the tables.

use std::process::ExitCode;

use toolgate::domain::policy::Policy;
use toolgate::domain::state::State;
use toolgate::store::postgres::PostgresStore;
use toolgate::store::sqlite::{self, CheckReport, SqliteStore, TableCount};

use crate::args::{StoreArgs, StoreCommand, StoreKind};
use crate::output::{Failure, emit, printable, record, say, table};

/// `toolgate store [--data-dir DIR] check|backup FILE`.
///
/// - `check`: the report on stdout (file, schema version, bytes, each
///   table's records, then `ok` or each problem: the file's, or a record
///   the state's recovery refuses); exit 0 when sound, 1 with `error: …`
///   on stderr when a problem was found.
/// - `backup FILE`: what was written on stdout, and how to restore it.
/// - `migrate`: the store and its schema version on stdout, and what was
///   done (`created`, `migrated from N`, `current`).
/// - A store that cannot be read at all (no directory, no database, an
///   existing FILE, an unreachable PostgreSQL): `error: …` on stderr, exit 2.
/// - `check` and `backup` are the SQLite store's: with `--store postgres://…`
///   (or `memory`) they are refused, exit 2.
pub fn run_store(args: &StoreArgs) -> ExitCode {
    let store = match store_of(args) {
        Ok(store) => store,
        Err(failure) => return failure.report(),
    };
    let run = match (&args.command, &store) {
        (StoreCommand::Migrate, _) => run_migrate(args, store.as_ref()),
        (StoreCommand::Check | StoreCommand::Backup { .. }, Some(StoreKind::Postgres(target))) => {
            let command = match args.command {
                StoreCommand::Check => "check",
                _ => "backup",
            };
            Err(Failure::Usage(format!(
                "`toolgate store {command}` works on the SQLite store only, and the store \
                 (--store, TOOLGATE_STORE or the policy's [server] store) is {target}; for \
                 PostgreSQL use its own tools (pg_dump --schema {}, amcheck)",
                target.schema()
            )))
        }
        (StoreCommand::Check | StoreCommand::Backup { .. }, Some(StoreKind::Memory)) => Err(
            Failure::Usage("--store memory keeps nothing to check or back up".into()),
        ),
        (StoreCommand::Check, _) => run_check(args),
        (StoreCommand::Backup { file }, _) => run_backup(args, file),
    };
    match run {
        Ok(code) => code,
        Err(failure) => failure.report(),
    }
}

fn run_check(args: &StoreArgs) -> Result<ExitCode, Failure> {
    // Recovery as a start does it. What a record must be does not depend
    // on the policy (a policy only adds the resources it declares), so the
    // embedded one serves.
    let policy = Policy::embedded_default().map_err(|error| Failure::Usage(error.to_string()))?;
    let restore = |records| {
        State::restore(&policy, records)
            .map(drop)
            .map_err(|error| error.to_string())
    };
    let report =
        sqlite::check_records(&args.data_dir, &restore).map_err(|error| Failure::Usage(error.0))?;
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

/// The store the command works on, as `serve` would choose it: `--store`
/// (or TOOLGATE_STORE), else the `[server] store` of `--config`'s policy,
/// else the data directory; a PostgreSQL one with the policy's settings.
fn store_of(args: &StoreArgs) -> Result<Option<StoreKind>, Failure> {
    // The policy is read only where it says something: the store, when
    // --store does not, and a PostgreSQL store's settings.
    let wanted = matches!(args.store, None | Some(StoreKind::Postgres(_)));
    let Some(path) = args.config.as_deref().filter(|_| wanted) else {
        return Ok(args.store.clone());
    };
    let policy = Policy::load(path).map_err(|error| Failure::Usage(error.to_string()))?;
    let kind = match (&args.store, &policy.server.store) {
        (Some(kind), _) => Some(kind.clone()),
        // The message names the key and the rule, never the URL's password.
        (None, Some(setting)) => Some(StoreKind::parse(&setting.0).map_err(|message| {
            Failure::Usage(format!("{}: [server] store: {message}", path.display()))
        })?),
        (None, None) => None,
    };
    Ok(match kind {
        Some(StoreKind::Postgres(target)) => Some(StoreKind::Postgres(Box::new(
            (*target).with_settings(policy.server.postgres),
        ))),
        kind => kind,
    })
}

fn run_migrate(args: &StoreArgs, store: Option<&StoreKind>) -> Result<ExitCode, Failure> {
    let (store, found, version) = match store {
        Some(StoreKind::Memory) => {
            return Err(Failure::Usage(
                "--store memory has no tables to create or migrate".into(),
            ));
        }
        Some(StoreKind::Postgres(target)) => {
            let store = PostgresStore::open(target).map_err(|error| Failure::Usage(error.0))?;
            let opened = store.opened();
            (target.to_string(), opened.found, opened.version)
        }
        None | Some(StoreKind::Sqlite) => {
            let before = sqlite::check(&args.data_dir)
                .map(|report| report.schema_version)
                .unwrap_or(0);
            let store =
                SqliteStore::open(&args.data_dir).map_err(|error| Failure::Usage(error.0))?;
            let shown = store.dir().join(sqlite::DB_FILE).display().to_string();
            (printable(&shown), before, sqlite::SCHEMA_VERSION)
        }
    };
    let done = match found {
        0 => "created".to_string(),
        found if found < version => format!("migrated from schema version {found}"),
        _ => "current".to_string(),
    };
    emit(&record(&[
        ("store", store),
        ("schema", version.to_string()),
        ("done", done),
    ]))?;
    Ok(ExitCode::SUCCESS)
}
