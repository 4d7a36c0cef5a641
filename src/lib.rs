//! toolgate: a gRPC policy decision point for AI-agent hosts.
//!
//! "SPEC §N" in comments names section N of the contract, `docs/contract.md`.
//!
//! # Layout
//! Layers, lowest first; a module imports only from its own layer or the ones below it.
//!
//! - [`domain`]: the core, with no gRPC, protobuf or command-line types:
//!   canonical JSON, policy, manifests, the proposal envelope and its screening,
//!   decisions and their reasons, sessions, the approval ledger, resources,
//!   receipts, pins, and `State`, one method per operation.
//! - [`ops`]: what an operator runs it with: audit events, the log writer,
//!   the metrics registry, the `process_*` figures and the build's version
//!   and commit, the listener's TLS material (reloadable).
//! - [`store`]: where the state is kept between runs: the `Store` seam,
//!   the memory and SQLite stores, and the group-commit writer.
//! - [`engine`]: `Engine`, the handle every RPC goes through: the state behind
//!   its lock, the policy snapshot, the clock, approval events; policy reload
//!   on SIGHUP ([`reload`](engine::reload)) and the default policy's bootstrap token
//!   ([`bootstrap`](engine::bootstrap)).
//! - `edge` (private): the gRPC edge: handlers, conversions, the one
//!   error-to-status map, authentication, overload, the metrics layer, the
//!   accept loop and [`serve`](server::serve); [`in_process`]: the same
//!   handlers called in this process, with no listener (`toolgate eval`,
//!   `toolgate test`).
//! - [`pb`]: generated protobuf and gRPC code (`toolgate.v1`), with
//!   [`codec`], prost's codec with buffers sized for toolgate's messages.
//! - `fuzzing` (feature `fuzzing`): the fuzz harnesses shared by `tests/fuzz/`
//!   and the regression test.
#![forbid(unsafe_code)]
// Every `pub` item is part of the library API; the rest say `pub(crate)`.
#![warn(unreachable_pub)]
// Server code never unwraps what a client can influence; tests may.
#![warn(clippy::unwrap_used, clippy::expect_used)]

pub mod codec;
pub mod domain;
mod edge;
pub mod engine;
#[cfg(feature = "fuzzing")]
pub mod fuzzing;
pub mod ops;
pub mod store;

pub use edge::{in_process, server};

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

    /// Encoded descriptor set of Envoy's `envoy.service.auth.v3` and what it
    /// imports (compiled from the envoy-types crate's protos), served by
    /// reflection.
    pub const ENVOY_AUTH_DESCRIPTOR_SET: &[u8] =
        include_bytes!(concat!(env!("OUT_DIR"), "/envoy_auth_descriptor.bin"));

    /// The server of Envoy's `envoy.service.auth.v3.Authorization` over
    /// envoy-types' messages, with toolgate's codec ([`crate::codec`]):
    /// envoy-types' own server has tonic's default codec, whose two 8 KiB
    /// buffers per call cost what they cost toolgate's own services.
    pub mod envoy_auth {
        include!(concat!(
            env!("OUT_DIR"),
            "/envoy.service.auth.v3.Authorization.rs"
        ));
    }
}
