//! The one support module of the Rust tests: a server in the test process
//! ([`TestServer`]), `toolgate` as a process of its own ([`spawn`]), the
//! tokens ([`tokens`]), request builders ([`requests`]), policy fixtures
//! ([`policies`]), raw HTTP/2 calls ([`raw`]), `/metrics` ([`metrics`]),
//! the PostgreSQL test database ([`postgres`]) and the one model of SPEC
//! §4–§6 ([`model`]).
//!
//! `tests/integration/` uses every item of it (the dead-code lint checks
//! that there); `tests/floods.rs` and `tests/torture.rs`, which need a
//! process of their own, use a part.

pub mod metrics;
pub mod model;
pub mod policies;
pub mod postgres;
pub mod raw;
pub mod recovery;
pub mod requests;
pub mod server;
pub mod spawn;
pub mod tokens;

pub use requests::{
    assert_invalid, authed, decide_request, deny_request, dispatch_request, grant_request,
    pin_request, proposal, read_balance, remove_pin_request, revoke_request, session,
    violation_field, violation_rule,
};
pub use server::{EPOCH, TestServer};

// ----- the library ----------------------------------------------------------
// Every `toolgate::` path the integration tests use, imported once: the
// tests take them from here, so that when the library's modules move only
// this list follows. (floods.rs and torture.rs import the few paths only
// they use themselves.)

pub use toolgate::domain::canonical;
pub use toolgate::domain::clock::{ManualClock, Timestamp};
pub use toolgate::domain::decision::DispatchStatus;
pub use toolgate::domain::decision::Outcome;
pub use toolgate::domain::error::Error;
pub use toolgate::domain::ledger::{ApprovalEvent, ApprovalStatus, EventKind, Verdict};
pub use toolgate::domain::manifest::Manifest;
pub use toolgate::domain::policy::Policy;
pub use toolgate::domain::proposal::{MAX_ARGUMENTS_BYTES, Proposal, SessionRef};
pub use toolgate::domain::records::{Change, Kind};
pub use toolgate::domain::state::Stats;
pub use toolgate::engine::{Engine, reload};
pub use toolgate::fuzzing;
pub use toolgate::ops::audit::{
    AuditFormat, AuditLayer, REJECTION_BURST, REJECTION_LINES_PER_SECOND,
};
pub use toolgate::ops::tls::ServerTls;
pub use toolgate::pb;
pub use toolgate::server::{Listeners, ServeOptions, serve_with, serve_with_options};
pub use toolgate::store::Store;
pub use toolgate::store::postgres::PostgresStore;
pub use toolgate::store::sqlite::{self, SqliteStore};

/// Runs an engine operation to its answer on this thread (for tests that
/// drive the engine without a server): the operation waits for the store's
/// writer like a server's calls do.
#[allow(dead_code)]
pub fn block_on<F: std::future::Future>(operation: F) -> F::Output {
    thread_local! {
        static RUNTIME: tokio::runtime::Runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
    }
    RUNTIME.with(|runtime| runtime.block_on(operation))
}
