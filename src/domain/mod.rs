//! The domain core: every rule of the contract, with no gRPC, protobuf or
//! command-line types. Each operation is a method on [`state::State`],
//! called with the policy snapshot and the time.
//!
//! - [`canonical`]: canonical JSON: parse, print, fingerprint (SPEC §1),
//!   and validation against a JSON Schema in place.
//! - [`ids`]: identifier rules shared by proposals, sessions, manifests,
//!   resources and approvals.
//! - [`limits`]: what one request may ask for (page sizes, page tokens,
//!   notes), checked in the constructors of the domain values it becomes.
//! - [`clock`]: injectable time. [`error`]: the domain error enum.
//! - [`policy`]: the TOML policy file as an immutable snapshot (SPEC §3).
//! - [`manifest`]: tool-server manifests: fingerprint, diff, assessment (SPEC §7).
//! - [`mcp`]: an MCP request over HTTP, as Envoy's external authorizer
//!   sees it, mapped to a session and a proposal; its JSON-RPC error body.
//! - [`proposal`]: the proposal envelope and the policy-only screening.
//! - [`reason`]: outcomes, stable reasons and Dispatch statuses (a leaf).
//! - [`decision`]: what Decide and Dispatch answer, and every message.
//! - [`session`]: agent sessions and their budgets.
//! - [`ledger`]: the approval ledger and its lifecycle (SPEC §5).
//! - [`resources`]: versioned resources and effects (SPEC §6).
//! - [`receipts`]: the receipt log (SPEC §6).
//! - [`pins`]: manifest pins made through the API.
//! - [`records`]: the state's durable form: the changes an operation
//!   makes, as keyed records every store keeps alike.
//! - [`state`]: `State`, everything remembered between calls, split by operation.
//! - `table`: the hash table records live in (grows a shard at a time); a leaf.

pub mod canonical;
pub mod clock;
pub mod decision;
pub mod error;
pub mod ids;
pub mod ledger;
pub mod limits;
pub mod manifest;
pub mod mcp;
pub mod pins;
pub mod policy;
pub mod proposal;
pub mod reason;
pub mod receipts;
pub mod records;
pub mod resources;
pub mod session;
pub mod state;
pub(crate) mod table;
