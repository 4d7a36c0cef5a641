//! `[[credentials]]` (bearer-token digests of hosts and reviewers), and how
//! hosts authenticate.

use std::collections::HashMap;
use std::sync::Arc;

use serde::Deserialize;

use super::parse::Loader;
use super::{Policy, PolicyError, Reviewer};
use crate::domain::canonical::Fingerprint;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum CredentialKind {
    Host,
    Reviewer,
}

impl CredentialKind {
    pub fn as_str(self) -> &'static str {
        match self {
            CredentialKind::Host => "host",
            CredentialKind::Reviewer => "reviewer",
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    pub kind: CredentialKind,
    pub identity: String,
    /// For hosts: the actors it may assert; `*` means any.
    pub actors: Vec<String>,
}

impl Credential {
    pub fn may_assert(&self, actor: &str) -> bool {
        self.actors
            .iter()
            .any(|allowed| allowed == "*" || allowed == actor)
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCredential {
    kind: CredentialKind,
    identity: String,
    /// Hex SHA-256 digest of the bearer token (never the token itself).
    sha256: String,
    #[serde(default)]
    actors: Vec<String>,
}

/// Host credentials decide the default per-host shares of the limits.
pub(super) fn host_credential_count(credentials: &[RawCredential]) -> usize {
    credentials
        .iter()
        .filter(|credential| credential.kind == CredentialKind::Host)
        .count()
}

/// `[[credentials]]`, by token digest; a digest is listed once.
pub(super) fn credentials(
    loader: &Loader<'_>,
    raw_credentials: Vec<RawCredential>,
    reviewers: &HashMap<String, Reviewer>,
) -> Result<HashMap<Fingerprint, Arc<Credential>>, PolicyError> {
    let mut credentials = HashMap::new();
    for (index, raw_credential) in raw_credentials.into_iter().enumerate() {
        let key = |field: &str| format!("credentials[{index}].{field}");
        let (digest, credential) = credential(loader, &key, raw_credential, reviewers)?;
        if credentials.insert(digest, Arc::new(credential)).is_some() {
            return Err(loader.error(key("sha256"), "the same token digest is listed twice"));
        }
    }
    Ok(credentials)
}

/// One credential: an identifier, a SHA-256 digest, and actors for a host
/// only (at least one); a reviewer credential names a declared reviewer.
fn credential(
    loader: &Loader<'_>,
    key: &impl Fn(&str) -> String,
    raw: RawCredential,
    reviewers: &HashMap<String, Reviewer>,
) -> Result<(Fingerprint, Credential), PolicyError> {
    loader.identifier(&key("identity"), &raw.identity)?;
    let digest = Fingerprint::from_hex(&raw.sha256).ok_or_else(|| {
        loader.error(
            key("sha256"),
            "must be the 64-hex-digit SHA-256 digest of the token",
        )
    })?;
    match raw.kind {
        CredentialKind::Host if raw.actors.is_empty() => {
            return Err(loader.error(
                key("actors"),
                "a host credential must list the actors it may assert (or \"*\")",
            ));
        }
        CredentialKind::Reviewer if !raw.actors.is_empty() => {
            return Err(loader.error(key("actors"), "only host credentials assert actors"));
        }
        CredentialKind::Reviewer if !reviewers.contains_key(&raw.identity) => {
            return Err(loader.error(
                key("identity"),
                format!("no reviewer {:?} in [reviewers]", raw.identity),
            ));
        }
        _ => {}
    }
    let credential = Credential {
        kind: raw.kind,
        identity: raw.identity,
        actors: raw.actors,
    };
    Ok((digest, credential))
}

impl Policy {
    /// Whether the policy declares at least one credential of `kind`.
    pub fn has_credentials(&self, kind: CredentialKind) -> bool {
        self.credentials
            .values()
            .any(|credential| credential.kind == kind)
    }

    /// A policy says how hosts authenticate: host credentials, or the
    /// explicit `open_host_api = true` (never both). A file with neither,
    /// such as one cut short before its `[[credentials]]`, is refused.
    pub(super) fn check_host_access(&self, loader: &Loader<'_>) -> Result<(), PolicyError> {
        if self.tools.is_empty() {
            return Err(loader.error(
                "tools",
                "the policy defines no tools (is the file complete?)",
            ));
        }
        match (
            self.open_host_api,
            self.has_credentials(CredentialKind::Host),
        ) {
            (false, false) => Err(loader.error(
                "credentials",
                "no host credential: declare one ([[credentials]] with kind = \"host\"), \
                 or set [server] open_host_api = true to let any local client call the host API",
            )),
            (true, true) => Err(loader.error(
                "server.open_host_api",
                "cannot be true while [[credentials]] declares host credentials",
            )),
            _ => Ok(()),
        }
    }

    /// Whether the policy may serve on `listen`: an open host API only on a
    /// loopback address. Checked at start and at every reload.
    pub fn check_listen(&self, listen: std::net::SocketAddr) -> Result<(), String> {
        if self.open_host_api && !listen.ip().is_loopback() {
            return Err(format!(
                "refusing to serve an open host API ([server] open_host_api = true) on the non-loopback address {listen}"
            ));
        }
        Ok(())
    }
}
