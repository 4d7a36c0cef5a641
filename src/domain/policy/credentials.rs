//! `[[credentials]]` (bearer-token digests of hosts and reviewers, and the
//! client-certificate identities they may be bound to), and how hosts
//! authenticate.

use std::sync::Arc;

use serde::Deserialize;

use super::parse::Loader;
use super::{ActorSource, Policy, PolicyError, PolicyMap, Reviewer};
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
    /// `client_identity`: the verified client certificate (mTLS) a call
    /// must come with, by subject or URI SAN ([`ClientIdentity`]). With a
    /// token too, both must match; alone, the certificate is the credential.
    pub client_identity: Option<ClientIdentity>,
}

/// What a credential's `client_identity` names in a client certificate:
/// a value with `://` (`spiffe://example.org/host/a`) is a URI SAN, any
/// other value the certificate's subject, as RFC 4514 writes it with `,`
/// between attributes and no spaces (`CN=host-a,O=Example`).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ClientIdentity {
    Uri(String),
    Subject(String),
}

impl ClientIdentity {
    pub fn parse(text: &str) -> ClientIdentity {
        match text.contains("://") {
            true => ClientIdentity::Uri(text.to_string()),
            false => ClientIdentity::Subject(text.to_string()),
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            ClientIdentity::Uri(text) | ClientIdentity::Subject(text) => text,
        }
    }
}

impl Credential {
    /// Whether it may assert every actor (`*` among its actors).
    pub fn may_assert_any(&self) -> bool {
        self.actors.iter().any(|allowed| allowed == "*")
    }

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
    #[serde(default)]
    sha256: Option<String>,
    #[serde(default)]
    actors: Vec<String>,
    /// The client certificate identity the credential is bound to.
    #[serde(default)]
    client_identity: Option<String>,
}

/// Hosts decide the default per-host shares of the limits: the distinct
/// identities of the host credentials (a second token of one host, as in
/// a rotation, is the same host).
pub(super) fn host_count(credentials: &[RawCredential]) -> usize {
    let hosts: std::collections::BTreeSet<&str> = credentials
        .iter()
        .filter(|credential| credential.kind == CredentialKind::Host)
        .map(|credential| credential.identity.as_str())
        .collect();
    hosts.len()
}

/// `[[credentials]]`: those with a token by its digest (a digest is listed
/// once), those with a client certificate alone by its identity (listed
/// once too).
#[derive(Debug, Default)]
pub(super) struct Credentials {
    pub by_token: PolicyMap<Fingerprint, Arc<Credential>>,
    pub by_certificate: PolicyMap<ClientIdentity, Arc<Credential>>,
}

pub(super) fn credentials(
    loader: &Loader<'_>,
    raw_credentials: Vec<RawCredential>,
    reviewers: &PolicyMap<String, Reviewer>,
) -> Result<Credentials, PolicyError> {
    let mut credentials = Credentials::default();
    // Whose each client certificate identity is: one host or reviewer's
    // (several of its tokens may be bound to it).
    let mut certificate_owners: PolicyMap<ClientIdentity, (CredentialKind, String)> =
        PolicyMap::default();
    for (index, raw_credential) in raw_credentials.into_iter().enumerate() {
        let key = |field: &str| format!("credentials[{index}].{field}");
        let (digest, credential) = credential(loader, &key, raw_credential, reviewers)?;
        if let Some(identity) = &credential.client_identity {
            let owner = (credential.kind, credential.identity.clone());
            match certificate_owners.get(identity) {
                Some(first) if *first != owner => {
                    return Err(loader.error(
                        key("client_identity"),
                        format!(
                            "is bound to {} {:?} already: a client certificate identity \
                             belongs to one host or reviewer",
                            first.0.as_str(),
                            first.1
                        ),
                    ));
                }
                Some(_) => {}
                None => {
                    certificate_owners.insert(identity.clone(), owner);
                }
            }
        }
        let credential = Arc::new(credential);
        match (digest, &credential.client_identity) {
            (Some(digest), _) => {
                if credentials.by_token.insert(digest, credential).is_some() {
                    return Err(
                        loader.error(key("sha256"), "the same token digest is listed twice")
                    );
                }
            }
            (None, Some(identity)) => {
                let identity = identity.clone();
                if credentials
                    .by_certificate
                    .insert(identity, credential)
                    .is_some()
                {
                    return Err(loader.error(
                        key("client_identity"),
                        "another credential without a token is bound to the same client identity",
                    ));
                }
            }
            // credential() refuses an entry with neither; kept as an error,
            // not a panic, should that ever change.
            (None, None) => {
                return Err(loader.error(
                    key("sha256"),
                    "a credential needs sha256 or client_identity",
                ));
            }
        }
    }
    Ok(credentials)
}

/// One credential: an identifier, a SHA-256 digest and/or a client
/// certificate identity, and actors for a host only (at least one); a
/// reviewer credential names a declared reviewer.
fn credential(
    loader: &Loader<'_>,
    key: &impl Fn(&str) -> String,
    raw: RawCredential,
    reviewers: &PolicyMap<String, Reviewer>,
) -> Result<(Option<Fingerprint>, Credential), PolicyError> {
    loader.identifier(&key("identity"), &raw.identity)?;
    let digest = match &raw.sha256 {
        Some(hex) => {
            let digest = Fingerprint::from_hex(hex).ok_or_else(|| {
                loader.error(
                    key("sha256"),
                    "must be the 64-hex-digit SHA-256 digest of the token",
                )
            })?;
            // No request carries an empty token: such a credential would
            // authenticate nobody yet count as the host access declared.
            if digest == Fingerprint::of_bytes(b"") {
                return Err(loader.error(key("sha256"), "is the digest of an empty token"));
            }
            Some(digest)
        }
        None => None,
    };
    let client_identity = match raw.client_identity.as_deref() {
        Some(text) => Some(client_identity(loader, &key("client_identity"), text)?),
        None => None,
    };
    if digest.is_none() && client_identity.is_none() {
        return Err(loader.error(
            key("sha256"),
            "a credential needs a token digest (sha256), a client certificate identity \
             (client_identity), or both",
        ));
    }
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
        CredentialKind::Host => {
            for actor in raw.actors.iter().filter(|actor| *actor != "*") {
                loader.identifier(&key("actors"), actor)?;
            }
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
        client_identity,
    };
    Ok((digest, credential))
}

/// A `client_identity`: a URI (`scheme://…`, such as a SPIFFE ID) or an
/// RFC 4514 subject (`CN=…,O=…`), printable ASCII without spaces around `,`.
fn client_identity(
    loader: &Loader<'_>,
    key: &str,
    text: &str,
) -> Result<ClientIdentity, PolicyError> {
    if text.is_empty() || !text.bytes().all(|byte| (0x20..0x7f).contains(&byte)) {
        return Err(loader.error(key, "must be non-empty printable ASCII"));
    }
    let identity = ClientIdentity::parse(text);
    match &identity {
        ClientIdentity::Uri(uri) if uri.contains(char::is_whitespace) => Err(loader.error(
            key,
            "a URI (such as spiffe://trust-domain/path) has no spaces",
        )),
        ClientIdentity::Subject(subject)
            if !subject.contains('=') || subject.contains(", ") || subject.contains(" ,") =>
        {
            Err(loader.error(
                key,
                "must be a URI SAN (spiffe://trust-domain/path) or a subject written as \
                 RFC 4514 does, `CN=name,O=org` (no spaces around `,`)",
            ))
        }
        _ => Ok(identity),
    }
}

/// What a verified client certificate says of its holder (mTLS): its
/// subject in RFC 4514 form and its URI SANs (a SPIFFE ID is one).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct PeerCertificate {
    pub subject: String,
    pub uris: Vec<String>,
}

impl PeerCertificate {
    /// Every identity a `client_identity` may name in this certificate.
    pub fn identities(&self) -> impl Iterator<Item = ClientIdentity> + '_ {
        std::iter::once(ClientIdentity::Subject(self.subject.clone()))
            .chain(self.uris.iter().cloned().map(ClientIdentity::Uri))
    }

    pub fn matches(&self, identity: &ClientIdentity) -> bool {
        match identity {
            ClientIdentity::Subject(subject) => *subject == self.subject,
            ClientIdentity::Uri(uri) => self.uris.iter().any(|own| own == uri),
        }
    }
}

impl Policy {
    /// Credentials bound to a client certificate need mTLS: with
    /// `[server.tls]` and no `client_ca`, no client ever shows one, so the
    /// policy is refused rather than left with credentials nobody can use.
    /// (Without `[server.tls]`, `serve` refuses to start such a policy
    /// unless `--tls-client-ca` is given; over plaintext no call ever
    /// matches a bound credential.)
    pub(super) fn check_client_identities(&self, loader: &Loader<'_>) -> Result<(), PolicyError> {
        let needs_mtls = self.binds_client_identities();
        match &self.server.tls {
            Some(tls) if needs_mtls && tls.client_ca.is_none() => Err(loader.error(
                "server.tls.client_ca",
                "credentials with client_identity need mTLS: set client_ca \
                 (the CA that signs client certificates)",
            )),
            _ => Ok(()),
        }
    }

    /// Whether the policy declares at least one credential of `kind`.
    pub fn has_credentials(&self, kind: CredentialKind) -> bool {
        self.all_credentials()
            .any(|credential| credential.kind == kind)
    }

    /// Every credential: with a token, and with a client certificate alone.
    pub fn all_credentials(&self) -> impl Iterator<Item = &Arc<Credential>> {
        self.credentials
            .values()
            .chain(self.certificate_credentials.values())
    }

    /// Whether a credential is bound to a client certificate: such a policy
    /// needs mTLS (`[server.tls] client_ca` or `--tls-client-ca`).
    pub fn binds_client_identities(&self) -> bool {
        self.all_credentials()
            .any(|credential| credential.client_identity.is_some())
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
    /// loopback address.
    pub fn check_listen(&self, listen: std::net::SocketAddr) -> Result<(), String> {
        if self.open_host_api && !listen.ip().is_loopback() {
            return Err(format!(
                "refusing to serve an open host API ([server] open_host_api = true) on the non-loopback address {listen}"
            ));
        }
        Ok(())
    }

    /// Whether the policy may run the server as `serving` says it serves:
    /// checked at start and at every reload, so that a reload never leaves
    /// the server in a state start would refuse. The listen address
    /// ([`Policy::check_listen`]); an ext_authz listener's host credential
    /// and actor source (its Checks carry no token); credentials bound to a
    /// client certificate only where mTLS is served.
    pub fn check_serving(&self, serving: &Serving) -> Result<(), String> {
        self.check_listen(serving.listen)?;
        if serving.ext_authz_listener && self.ext_authz.host_credential.is_none() {
            return Err(
                "--ext-authz-listen needs [ext_authz] host_credential: the host \
                        credential its Checks act as"
                    .to_string(),
            );
        }
        if serving.ext_authz_listener && self.ext_authz.actor == ActorSource::Unset {
            return Err("--ext-authz-listen needs an actor source in [ext_authz] \
                        (actor_header, actor_claim or actor_from_principal): without one \
                        every tools/call is denied"
                .to_string());
        }
        if self.binds_client_identities() && !serving.mutual_tls {
            return Err(
                "credentials with client_identity need mTLS: give [server.tls] \
                        client_ca or --tls-client-ca (without it no call could ever use them)"
                    .to_string(),
            );
        }
        Ok(())
    }
}

/// How the running server serves, fixed at its start ([`Policy::check_serving`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Serving {
    /// The gRPC listener's address.
    pub listen: std::net::SocketAddr,
    /// Whether `--ext-authz-listen` is bound.
    pub ext_authz_listener: bool,
    /// Whether client certificates are asked for (a TLS client CA).
    pub mutual_tls: bool,
}

impl Serving {
    /// A gRPC listener on `listen` alone, without mTLS.
    pub fn plain(listen: std::net::SocketAddr) -> Serving {
        Serving {
            listen,
            ext_authz_listener: false,
            mutual_tls: false,
        }
    }
}
