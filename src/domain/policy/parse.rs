//! Loading: the file as a whole, validated section by section.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;

use super::actors::{RawActor, RawProfile, RawReviewer, actors, check_profiles, reviewers};
use super::credentials::{RawCredential, credentials, host_count};
use super::decode::decode;
use super::ext_authz::{RawExtAuthz, ext_authz_settings};
use super::limits::{RawLimits, limits};
use super::pins::{RawPin, pins};
use super::server::{RawServer, server_settings};
use super::state::{RawState, state_policy};
use super::tools::{RawTool, tools};
use super::{EMBEDDED_DEFAULT, Policy, PolicyError};
use crate::domain::canonical::Fingerprint;
use crate::domain::ids::{check_identifier, check_server_id};

/// The file as written: what serde decodes, before any rule is checked.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawPolicy {
    #[serde(default)]
    limits: RawLimits,
    #[serde(default)]
    profiles: BTreeMap<String, RawProfile>,
    #[serde(default)]
    actors: BTreeMap<String, RawActor>,
    #[serde(default)]
    tools: BTreeMap<String, RawTool>,
    #[serde(default)]
    reviewers: BTreeMap<String, RawReviewer>,
    #[serde(default)]
    credentials: Vec<RawCredential>,
    #[serde(default)]
    pins: Vec<RawPin>,
    #[serde(default)]
    state: RawState,
    #[serde(default)]
    server: RawServer,
    #[serde(default)]
    ext_authz: RawExtAuthz,
}

/// Collects the error context while validating.
pub(super) struct Loader<'a> {
    source_name: &'a str,
    pub(super) base_dir: Option<&'a Path>,
}

impl Loader<'_> {
    pub(super) fn error(&self, key: impl Into<String>, message: impl Into<String>) -> PolicyError {
        PolicyError {
            source_name: self.source_name.to_string(),
            key: key.into(),
            message: message.into(),
        }
    }

    pub(super) fn server_id(&self, key: &str, value: &str) -> Result<(), PolicyError> {
        check_server_id(key, value).map_err(|error| match error {
            crate::domain::error::Error::InvalidArgument { rule, .. } => self.error(key, rule),
            other => self.error(key, other.to_string()),
        })
    }

    pub(super) fn identifier(&self, key: &str, value: &str) -> Result<(), PolicyError> {
        check_identifier(key, value).map_err(|error| match error {
            crate::domain::error::Error::InvalidArgument { rule, .. } => self.error(key, rule),
            other => self.error(key, other.to_string()),
        })
    }
}

impl Policy {
    /// Reads and validates a policy file.
    pub fn load(path: &Path) -> Result<Policy, PolicyError> {
        let source_name = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|error| PolicyError {
            source_name: String::new(),
            key: String::new(),
            message: format!("cannot read {source_name}: {error}"),
        })?;
        Policy::parse(&text, &source_name, path.parent())
    }

    /// The embedded default policy.
    pub fn embedded_default() -> Result<Policy, PolicyError> {
        Policy::parse(EMBEDDED_DEFAULT, "<embedded>", None)
    }

    /// Parses and validates policy text. `base_dir` resolves relative paths
    /// (manifest files); without one they are refused.
    ///
    /// Sections are checked in this order, and the first error wins:
    /// limits, actors, profiles, state, tools, reviewers, credentials, pins,
    /// server, ext_authz; then how hosts authenticate and the credential
    /// `ext_authz` names.
    pub fn parse(
        text: &str,
        source_name: &str,
        base_dir: Option<&Path>,
    ) -> Result<Policy, PolicyError> {
        let loader = Loader {
            source_name,
            base_dir,
        };
        let raw: RawPolicy = decode(&loader, text)?;
        let limits = limits(&loader, raw.limits, host_count(&raw.credentials))?;
        let actors = actors(&loader, raw.actors, &raw.profiles)?;
        check_profiles(&loader, &raw.profiles)?;
        let state = state_policy(&loader, raw.state)?;
        let tools = tools(&loader, raw.tools, &state)?;
        let reviewers = reviewers(&loader, raw.reviewers)?;
        let credentials = credentials(&loader, raw.credentials, &reviewers)?;
        let pins = pins(&loader, raw.pins)?;
        let open_host_api = raw.server.open_host_api;
        let server = server_settings(&loader, raw.server)?;
        let ext_authz = ext_authz_settings(&loader, raw.ext_authz, &limits)?;
        let mut policy = Policy {
            revision: revision_of(text),
            tools,
            actors,
            reviewers,
            credentials: credentials.by_token,
            certificate_credentials: credentials.by_certificate,
            pins,
            limits,
            state,
            server,
            open_host_api,
            ext_authz,
            warnings: Vec::new(),
        };
        policy.check_host_access(&loader)?;
        policy.check_ext_authz_credential(&loader)?;
        policy.check_client_identities(&loader)?;
        policy.warnings = policy.dangling_names();
        Ok(policy)
    }
}

/// First 12 hex digits of the SHA-256 of the policy text.
fn revision_of(text: &str) -> String {
    let mut hex = Fingerprint::of_bytes(text.as_bytes()).to_hex();
    hex.truncate(12);
    hex
}
