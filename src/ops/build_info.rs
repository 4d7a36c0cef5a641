//! What the binary was built from: the package version and the commit
//! (`build.rs` sets `TOOLGATE_COMMIT`: the variable given to the build,
//! `git rev-parse` in a checkout, or `unknown`). `--version` prints them
//! and `toolgate_build_info{version,commit}` exports them.

/// The package version (`Cargo.toml`).
pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// The commit the binary was built from (12 hex digits), or `unknown`.
pub const COMMIT: &str = env!("TOOLGATE_COMMIT");

/// `VERSION (commit COMMIT)`, as `toolgate --version` prints it.
pub const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("TOOLGATE_COMMIT"),
    ")"
);
