//! toolgate: a gRPC policy decision point for AI-agent hosts.
//!
//! "SPEC §N" in comments names section N of the contract, `docs/contract.md`.
//!
//! # Layout
//! - [`canonical`]: canonical JSON (strict parser, Python-identical printer) and fingerprints (SPEC §1).
//! - [`ids`]: identifier rules shared by proposals, sessions and manifests.
//! - [`manifest`]: tool-server manifests: fingerprint, diff, assessment (SPEC §7).
//! - [`policy`]: the TOML policy file parsed into an immutable snapshot (SPEC §3).
//! - [`proposal`]: the proposal envelope, the trusted session, the policy-only checks.
//! - [`session`]: agent sessions and their budgets.
//! - [`ledger`]: the approval ledger and its lifecycle (SPEC §5).
//! - [`dispatch`]: versioned resources, effects and the receipt log (SPEC §6).
//! - [`state`]: `State`, everything remembered between calls; one method per operation;
//!   `state::table`, the hash table its records live in (grows a shard at a time).
//! - [`engine`]: `Engine`, the clone handle holding policy snapshot, clock and state.
//! - [`clock`]: injectable time.
//! - [`audit`](mod@audit): structured audit events (SPEC §8) and the layer that writes them.
//! - [`logwriter`]: the background writer logs and audit lines go through.
//! - [`auth`]: the authenticated caller of a request.
//! - [`error`]: the domain error enum.
//! - [`grpc`]: the edge: conversions, handlers, the error-to-status map.
//! - [`metrics`]: Prometheus metrics and the latency layer.
//! - [`overload`]: load shedding, request timeout and message-size status layer.
//! - [`connections`]: the accept loop, connection caps and handshake/write deadlines.
//! - [`server`]: assembles services, health and reflection; `serve`.
//! - [`reload`]: reloading the policy file on SIGHUP.
//! - [`bootstrap`]: the embedded default policy's one-time reviewer token.
//! - `fuzzing` (hidden): the fuzz harnesses shared by `tests/fuzz/` and `tests/fuzz_regressions.rs`.
//! - [`pb`]: generated protobuf and gRPC code (`toolgate.v1`).
#![forbid(unsafe_code)]
// Server code never unwraps what a client can influence; tests may.
#![warn(clippy::unwrap_used, clippy::expect_used)]

pub mod audit;
pub mod auth;
pub mod bootstrap;
pub mod canonical;
pub mod clock;
pub mod connections;
pub mod dispatch;
pub mod engine;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod grpc;
pub mod ids;
pub mod ledger;
pub mod logwriter;
pub mod manifest;
pub mod metrics;
pub mod overload;
pub mod policy;
pub mod proposal;
pub mod reload;
pub mod server;
pub mod session;
pub mod state;

/// Generated code for package `toolgate.v1`.
#[allow(
    clippy::all,
    clippy::pedantic,
    clippy::unwrap_used,
    clippy::expect_used
)]
pub mod pb {
    tonic::include_proto!("toolgate.v1");

    /// Encoded descriptor set of `toolgate.v1`, served by reflection.
    pub const FILE_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/toolgate_descriptor.bin"));
}
