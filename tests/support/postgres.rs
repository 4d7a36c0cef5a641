//! The PostgreSQL test database: `TOOLGATE_TEST_DATABASE_URL` (`source
//! .ci/postgres start` makes one; `.ci/run` does). Without it, a test that
//! needs it fails saying so. Each test works in a fresh schema of its own
//! ([`TestSchema`]), dropped at its end, so tests run in parallel.

use toolgate::store::postgres::PostgresTarget;

pub const URL_VARIABLE: &str = "TOOLGATE_TEST_DATABASE_URL";

/// A schema of the test database for one test; dropped with everything in
/// it when this is.
pub struct TestSchema {
    /// The test database's URL with `schema=NAME`: the `--store` value
    /// (it carries the password).
    pub url: String,
    pub target: PostgresTarget,
}

impl TestSchema {
    pub fn new() -> TestSchema {
        let base = std::env::var(URL_VARIABLE).unwrap_or_else(|_| {
            panic!(
                "{URL_VARIABLE} is not set: the PostgreSQL tests need a server. Run \
                 `source .ci/postgres start` (a private cluster; `.ci/run` does it), or set \
                 {URL_VARIABLE} to a postgres:// URL of a database these tests may create \
                 schemas in"
            )
        });
        TestSchema::on(&base)
    }

    /// A fresh schema of the database at `base`.
    pub fn on(base: &str) -> TestSchema {
        let name = format!("it_{:016x}", rand::random::<u64>());
        let separator = if base.contains('?') { '&' } else { '?' };
        let url = format!("{base}{separator}schema={name}");
        let target = PostgresTarget::parse(&url).expect("the test database URL parses");
        TestSchema { url, target }
    }

    pub fn name(&self) -> &str {
        self.target.schema()
    }

    /// Runs `sql` on a connection of its own, on a thread of its own (the
    /// blocking client cannot run inside the test's runtime).
    pub fn execute(&self, sql: &str) -> Result<(), String> {
        let (target, sql) = (self.target.clone(), sql.to_string());
        std::thread::spawn(move || execute_on(target, sql))
            .join()
            .expect("the SQL thread")
    }
}

/// Runs `sql` on a connection of its own to `target`, blocking (call it
/// on a thread that is not a runtime's).
pub fn execute_on(target: PostgresTarget, sql: String) -> Result<(), String> {
    connect(&target)?
        .batch_execute(&sql)
        .map_err(|error| format!("{sql}: {error}"))
}

/// A blocking connection of its own to `target` (not on a runtime's thread).
pub fn connect(target: &PostgresTarget) -> Result<postgres::Client, String> {
    postgres::Config::from(target.config().clone())
        .connect(postgres::NoTls)
        .map_err(|error| format!("connecting to {target}: {error}"))
}

impl Drop for TestSchema {
    fn drop(&mut self) {
        let _ = self.execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name()));
    }
}

/// A PostgreSQL cluster of one test's own (`bash .ci/postgres start`, with
/// the server binaries this machine has), for tests that stop and restart
/// the server under load without disturbing the other tests' database.
/// Stopped and removed when dropped.
pub struct PrivateCluster {
    /// Its database's URL (with the password).
    pub url: String,
    dir: String,
}

impl PrivateCluster {
    pub fn start() -> PrivateCluster {
        let output = std::process::Command::new("bash")
            .args([".ci/postgres", "start"])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .env_remove(URL_VARIABLE)
            .env_remove("TOOLGATE_TEST_POSTGRES_DIR")
            .output()
            .expect("run .ci/postgres");
        let stdout = String::from_utf8_lossy(&output.stdout);
        let url = stdout
            .lines()
            .find_map(|line| line.strip_prefix("export TOOLGATE_TEST_DATABASE_URL='"))
            .and_then(|rest| rest.strip_suffix('\''));
        let dir = stdout
            .lines()
            .find_map(|line| line.strip_prefix("# stop it with: bash .ci/postgres stop "));
        match (url, dir) {
            (Some(url), Some(dir)) => PrivateCluster {
                url: url.to_string(),
                dir: dir.trim().to_string(),
            },
            _ => panic!(
                "a private PostgreSQL cluster did not start (these tests need PostgreSQL's \
                 server binaries): {}{}",
                stdout,
                String::from_utf8_lossy(&output.stderr)
            ),
        }
    }

    /// A fresh schema of this cluster's database.
    pub fn schema(&self) -> TestSchema {
        TestSchema::on(&self.url)
    }

    /// Stops the server (`mode`: `fast`, or `immediate` for a crash),
    /// waits `pause`, and starts it again on the same port.
    pub fn restart(&self, mode: &str, pause: std::time::Duration) {
        let status = std::process::Command::new("bash")
            .args([".ci/postgres", "restart", &self.dir, mode])
            .arg(pause.as_secs_f64().to_string())
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status()
            .expect("run .ci/postgres restart");
        assert!(status.success(), "the cluster did not restart");
    }
}

impl Drop for PrivateCluster {
    fn drop(&mut self) {
        let _ = std::process::Command::new("bash")
            .args([".ci/postgres", "stop", &self.dir])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .status();
    }
}
