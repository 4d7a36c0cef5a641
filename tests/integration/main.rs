//! The integration tests: one binary for everything that does not need a
//! process of its own, each area a module, all of them on `support`
//! (`tests/support/`). Servers run in this process on `127.0.0.1:0` (or as
//! `toolgate serve` children, for signals, reloads, the log sink and exit
//! codes); tests that capture audit lines use a thread-local subscriber.
//!
//! Kept apart, each a crate of its own: `tests/floods.rs` (it measures this
//! process's resident set) and `tests/torture.rs` (it installs the global
//! tracing subscriber).

#[path = "../support/mod.rs"]
mod support;

mod append_receipts;
mod audit_events;
mod auth_watch;
mod byte_budget;
mod canonical_vectors;
mod cli;
mod decide;
mod dispatch;
mod dispatch_model;
mod examples_envoy;
mod ext_authz;
mod fixtures;
mod fuzz_regressions;
mod hostile;
mod log_sink;
mod manifest;
mod metrics_exposition;
mod operations;
mod policy_tests;
mod postgres_store;
mod properties;
mod recovery;
mod replicas;
mod service_surface;
mod store_cli;
mod tls;
mod transport;
