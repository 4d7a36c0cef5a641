//! The policy file (TOML, SPEC §3), parsed into an immutable, validated
//! snapshot. A reload builds a whole new `Policy`; readers never see half of
//! one. Every error names the key path and what is wrong; unknown keys are
//! errors.
//!
//! One file per part of the policy, each with the section as written
//! (`Raw*`, what serde decodes), its validated form, and the rules between
//! them:
//! - `parse`: [`Policy::load`] and [`Policy::parse`], section by section;
//! - `decode`: TOML to the raw policy, with decoding errors in plain words;
//! - `limits`, `server`: `[limits]` and `[server]`;
//! - `actors`: `[profiles]`, `[actors]` and `[reviewers]`;
//! - `credentials`: `[[credentials]]` and how hosts authenticate;
//! - `tools`, `effects`: `[tools]` and their effects;
//! - `state`: `[state]`, the initial versioned resources;
//! - `pins`: `[[pins]]`;
//! - `ext_authz`: `[ext_authz]`, how an Envoy Check maps onto a proposal;
//! - `warnings`: dangling names, and what a reload refuses.

use std::collections::HashMap;
use std::sync::Arc;

use crate::domain::canonical::Fingerprint;
use crate::domain::table::OwnKeys;

mod actors;
mod credentials;
mod decode;
mod effects;
mod ext_authz;
mod limits;
mod parse;
mod pins;
mod server;
mod state;
mod tools;
mod warnings;

pub use actors::{ActorProfile, Reviewer};
pub use credentials::{ClientIdentity, Credential, CredentialKind, PeerCertificate, Serving};
pub use effects::Effect;
pub use ext_authz::{ActorSource, ExtAuthzSettings, WorkspaceSource};
pub use limits::Limits;
pub use pins::PolicyPin;
pub use server::{PostgresSettings, ServerSettings, TlsFiles};
pub use state::{StatePolicy, VersionScope};
pub use tools::{ApprovalRule, Mode, Tool};
pub use warnings::PolicyWarning;

/// A map of the policy: its keys are the operator's (names written in the
/// file, digests of configured tokens), never a client's, so it takes
/// [`OwnKeys`]; every Decide looks up its tool and actor several times.
pub type PolicyMap<K, V> = HashMap<K, V, OwnKeys>;

/// The policy `toolgate serve` uses when no `--config` is given.
pub const EMBEDDED_DEFAULT: &str = include_str!("../../../examples/policy.toml");

/// A policy file that could not be loaded: which key, what is wrong.
///
/// Displayed as `FILE: KEY: MESSAGE`; an empty part is left out (a file
/// that cannot be read has no key, and its message names the file).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", join_parts(&[source_name, key, message]))]
pub struct PolicyError {
    /// The file (or `<embedded>`).
    pub source_name: String,
    /// Key path inside the file, e.g. `tools.payment_execute.approval`.
    pub key: String,
    pub message: String,
}

fn join_parts(parts: &[&String]) -> String {
    parts
        .iter()
        .filter(|part| !part.is_empty())
        .map(|part| part.as_str())
        .collect::<Vec<_>>()
        .join(": ")
}

/// A validated, immutable policy.
#[derive(Debug)]
pub struct Policy {
    /// Short SHA-256 of the file text, reported with every decision.
    pub revision: String,
    pub tools: PolicyMap<String, Tool>,
    pub actors: PolicyMap<String, ActorProfile>,
    pub reviewers: PolicyMap<String, Reviewer>,
    /// Credentials by the SHA-256 digest of their bearer token.
    pub credentials: PolicyMap<Fingerprint, Arc<Credential>>,
    /// Credentials without a token, by the client certificate identity
    /// (mTLS) that is the credential.
    pub certificate_credentials: PolicyMap<ClientIdentity, Arc<Credential>>,
    pub pins: PolicyMap<String, PolicyPin>,
    pub limits: Limits,
    pub state: StatePolicy,
    /// Listener settings; applied at start (a reload does not change them).
    pub server: ServerSettings,
    /// `[server] open_host_api = true`: the host API takes calls without a
    /// token (as an anonymous host that may assert any actor). Only ever
    /// explicit, never the result of an absence; refused with host
    /// credentials and on a non-loopback listener, at start and at reload.
    pub open_host_api: bool,
    /// `[ext_authz]`: how an Envoy external-authorization Check becomes a
    /// session and a proposal.
    pub ext_authz: ExtAuthzSettings,
    /// Dangling names, in key order (see [`PolicyWarning`]).
    pub warnings: Vec<PolicyWarning>,
}

#[cfg(test)]
mod tests;
