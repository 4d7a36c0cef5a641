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
        let target = self.target.clone();
        let sql = sql.to_string();
        std::thread::spawn(move || {
            let mut client = target.connect().map_err(|error| error.0)?;
            client
                .batch_execute(&sql)
                .map_err(|error| format!("{sql}: {error}"))
        })
        .join()
        .expect("the SQL thread")
    }
}

impl Drop for TestSchema {
    fn drop(&mut self) {
        let _ = self.execute(&format!("DROP SCHEMA IF EXISTS {} CASCADE", self.name()));
    }
}
