//! `[ext_authz]`: how an Envoy external-authorization Check of an MCP
//! request becomes a session and a proposal (issue 17; README, "toolgate as
//! Envoy's external authorizer").

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::Deserialize;

use super::limits::DEFAULT_MAX_SESSIONS;
use super::parse::Loader;
use super::{Credential, CredentialKind, Limits, Policy, PolicyError};

/// Where the actor of a Check comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ActorSource {
    /// A request header set by a trusted upstream (lowercase name).
    Header(String),
    /// A claim of the JWT that `envoy.filters.http.jwt_authn` verified, from
    /// the Check's `metadata_context`: the claim, under the payload key
    /// that filter's `payload_in_metadata` names.
    Claim { claim: String, payload: String },
    /// The peer principal, `attributes.source.principal` (mTLS, Istio):
    /// the actor a `[ext_authz.principals]` entry names for it, or the
    /// principal itself when it is an identifier.
    Principal(BTreeMap<String, String>),
    /// None given: every `tools/call` is denied `actor-missing`. There is no
    /// default header: one a client can set would name any actor the host
    /// credential may assert.
    Unset,
}

/// Where an actor came from, for a refusal's message.
impl std::fmt::Display for ActorSource {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ActorSource::Header(header) => write!(formatter, "header {header}"),
            ActorSource::Claim { claim, .. } => write!(formatter, "JWT claim {claim:?}"),
            ActorSource::Principal(_) => formatter.write_str("the peer principal"),
            ActorSource::Unset => formatter.write_str("no actor source"),
        }
    }
}

/// Where the workspace of a Check comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WorkspaceSource {
    /// A request header (lowercase name).
    Header(String),
    /// The same workspace for every Check.
    Fixed(String),
}

/// The `[ext_authz]` section, validated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExtAuthzSettings {
    pub actor: ActorSource,
    /// The header of the MCP session id (lowercase).
    pub session_header: String,
    pub workspace: WorkspaceSource,
    /// The host credential whose authority Checks act with: its identity
    /// namespaces the sessions and bounds the actors; a Check on the gRPC
    /// listener must authenticate as it. `None`: the authenticated host.
    pub host_credential: Option<String>,
    /// Whether MCP requests other than `tools/call` (`initialize`,
    /// `tools/list`, notifications, the GET stream) are let through.
    pub allow_other_methods: bool,
    /// Sessions one actor's Checks may hold. An MCP client picks the
    /// session id it sends, so without this share one client could fill
    /// the host's share of the session table for every other.
    pub max_sessions_per_actor: usize,
}

impl Default for ExtAuthzSettings {
    fn default() -> Self {
        ExtAuthzSettings {
            actor: ActorSource::Unset,
            session_header: DEFAULT_SESSION_HEADER.to_string(),
            workspace: WorkspaceSource::Fixed(DEFAULT_WORKSPACE.to_string()),
            host_credential: None,
            allow_other_methods: false,
            // A policy's one host credential holds the whole default table.
            max_sessions_per_actor: default_actor_share(DEFAULT_MAX_SESSIONS),
        }
    }
}

const DEFAULT_SESSION_HEADER: &str = "mcp-session-id";
const DEFAULT_WORKSPACE: &str = "default";
const DEFAULT_JWT_PAYLOAD: &str = "jwt_payload";

/// The section as written.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawExtAuthz {
    actor_header: Option<String>,
    actor_claim: Option<String>,
    jwt_payload: Option<String>,
    actor_from_principal: Option<bool>,
    session_header: Option<String>,
    workspace_header: Option<String>,
    workspace: Option<String>,
    host_credential: Option<String>,
    other_methods: Option<String>,
    principals: Option<BTreeMap<String, String>>,
    max_sessions_per_actor: Option<usize>,
}

/// An eighth of a host's share of the session table: no fewer than eight
/// actors fill it.
fn default_actor_share(max_sessions_per_host: usize) -> usize {
    (max_sessions_per_host / 8).max(1)
}

pub(super) fn ext_authz_settings(
    loader: &Loader<'_>,
    raw: RawExtAuthz,
    limits: &Limits,
) -> Result<ExtAuthzSettings, PolicyError> {
    let actor = actor_source(loader, &raw)?;
    let session_header = match raw.session_header {
        Some(name) => header_name(loader, "ext_authz.session_header", &name)?,
        None => DEFAULT_SESSION_HEADER.to_string(),
    };
    let workspace = match (raw.workspace_header, raw.workspace) {
        (Some(_), Some(_)) => {
            return Err(loader.error(
                "ext_authz.workspace",
                "give either workspace_header or workspace, not both",
            ));
        }
        (Some(name), None) => {
            WorkspaceSource::Header(header_name(loader, "ext_authz.workspace_header", &name)?)
        }
        (None, Some(workspace)) => {
            loader.identifier("ext_authz.workspace", &workspace)?;
            WorkspaceSource::Fixed(workspace)
        }
        (None, None) => WorkspaceSource::Fixed(DEFAULT_WORKSPACE.to_string()),
    };
    check_distinct_headers(loader, &actor, &session_header, &workspace)?;
    if let Some(identity) = &raw.host_credential {
        loader.identifier("ext_authz.host_credential", identity)?;
    }
    let allow_other_methods = match raw.other_methods.as_deref() {
        None | Some("deny") => false,
        Some("allow") => true,
        Some(other) => {
            return Err(loader.error(
                "ext_authz.other_methods",
                format!("must be \"allow\" or \"deny\", not {other:?}"),
            ));
        }
    };
    let max_sessions_per_actor = match raw.max_sessions_per_actor {
        None => default_actor_share(limits.max_sessions_per_host),
        Some(share) if (1..=limits.max_sessions_per_host).contains(&share) => share,
        Some(share) => {
            return Err(loader.error(
                "ext_authz.max_sessions_per_actor",
                format!(
                    "must be from 1 to limits.max_sessions_per_host ({}), not {share}",
                    limits.max_sessions_per_host
                ),
            ));
        }
    };
    Ok(ExtAuthzSettings {
        actor,
        session_header,
        workspace,
        host_credential: raw.host_credential,
        allow_other_methods,
        max_sessions_per_actor,
    })
}

/// The actor's, the session's and the workspace's headers are three: the
/// session id is the client's to pick, and a header read for two of them
/// would let it pick the other too.
fn check_distinct_headers(
    loader: &Loader<'_>,
    actor: &ActorSource,
    session_header: &str,
    workspace: &WorkspaceSource,
) -> Result<(), PolicyError> {
    let actor_header = match actor {
        ActorSource::Header(name) => Some(name.as_str()),
        _ => None,
    };
    let workspace_header = match workspace {
        WorkspaceSource::Header(name) => Some(name.as_str()),
        WorkspaceSource::Fixed(_) => None,
    };
    let clash = if actor_header == Some(session_header) {
        Some(("ext_authz.actor_header", "the session header"))
    } else if workspace_header == Some(session_header) {
        Some(("ext_authz.workspace_header", "the session header"))
    } else if workspace_header.is_some() && workspace_header == actor_header {
        Some(("ext_authz.workspace_header", "the actor header"))
    } else {
        None
    };
    match clash {
        Some((key, other)) => Err(loader.error(
            key,
            format!("is {other}: the actor, the session and the workspace each have a header of their own"),
        )),
        None => Ok(()),
    }
}

/// At most one of `actor_header`, `actor_claim`, `actor_from_principal =
/// true` (none: [`ActorSource::Unset`]).
fn actor_source(loader: &Loader<'_>, raw: &RawExtAuthz) -> Result<ActorSource, PolicyError> {
    let from_principal = raw.actor_from_principal == Some(true);
    let given = usize::from(raw.actor_header.is_some())
        + usize::from(raw.actor_claim.is_some())
        + usize::from(from_principal);
    if given > 1 {
        return Err(loader.error(
            "ext_authz.actor_header",
            "give one of actor_header, actor_claim and actor_from_principal = true",
        ));
    }
    if raw.jwt_payload.is_some() && raw.actor_claim.is_none() {
        return Err(loader.error(
            "ext_authz.jwt_payload",
            "names where actor_claim is read; it needs actor_claim",
        ));
    }
    if let Some(name) = &raw.actor_header {
        return Ok(ActorSource::Header(header_name(
            loader,
            "ext_authz.actor_header",
            name,
        )?));
    }
    if let Some(claim) = &raw.actor_claim {
        if claim.is_empty() {
            return Err(loader.error("ext_authz.actor_claim", "must not be empty"));
        }
        let payload = raw
            .jwt_payload
            .clone()
            .unwrap_or_else(|| DEFAULT_JWT_PAYLOAD.to_string());
        if payload.is_empty() {
            return Err(loader.error("ext_authz.jwt_payload", "must not be empty"));
        }
        return Ok(ActorSource::Claim {
            claim: claim.clone(),
            payload,
        });
    }
    if let Some(principals) = &raw.principals {
        if !from_principal {
            return Err(loader.error(
                "ext_authz.principals",
                "maps peer principals to actors; it needs actor_from_principal = true",
            ));
        }
        for (principal, actor) in principals {
            if principal.is_empty() {
                return Err(loader.error("ext_authz.principals", "a principal must not be empty"));
            }
            loader.identifier(&format!("ext_authz.principals.{principal:?}"), actor)?;
        }
    }
    if from_principal {
        return Ok(ActorSource::Principal(
            raw.principals.clone().unwrap_or_default(),
        ));
    }
    Ok(ActorSource::Unset)
}

/// An HTTP header name as Envoy sends it in a Check: lowercase token
/// characters, not a pseudo-header.
fn header_name(loader: &Loader<'_>, key: &str, name: &str) -> Result<String, PolicyError> {
    let valid = !name.is_empty()
        && name.len() <= 128
        && name.bytes().all(|byte| {
            byte.is_ascii_lowercase() || byte.is_ascii_digit() || b"-_.!#$%&'*+^`|~".contains(&byte)
        });
    if !valid {
        return Err(loader.error(
            key,
            format!(
                "must be a lowercase HTTP header name (at most 128 of a-z, 0-9 and the token \
                 characters -_.!#$%&'*+^`|~), not {name:?}"
            ),
        ));
    }
    Ok(name.to_string())
}

impl Policy {
    /// The host credentials of this identity: its tokens and its client
    /// certificates.
    pub fn host_credentials<'a>(
        &'a self,
        identity: &'a str,
    ) -> impl Iterator<Item = &'a Arc<Credential>> + 'a {
        (self.credentials.values())
            .chain(self.certificate_credentials.values())
            .filter(move |credential| {
                credential.kind == CredentialKind::Host && credential.identity == identity
            })
    }

    /// The actors the credentials of host `identity` allow, sorted: `None`
    /// when it has no credential, `Some(Err(()))` when its credentials
    /// allow different actors (a call asserts those of the one it
    /// authenticates with, so a caller without a token cannot say which).
    pub fn host_actors(&self, identity: &str) -> Option<Result<Vec<String>, ()>> {
        // `*` allows every actor, whatever else is listed beside it.
        let actors = |credential: &Credential| match credential.may_assert_any() {
            true => vec!["*".to_string()],
            false => {
                let mut actors = credential.actors.clone();
                actors.sort();
                actors.dedup();
                actors
            }
        };
        let mut credentials = self.host_credentials(identity);
        let first = actors(credentials.next()?);
        match credentials.all(|other| actors(other) == first) {
            true => Some(Ok(first)),
            false => Some(Err(())),
        }
    }

    /// `ext_authz.host_credential` names a host of the policy, whose
    /// credentials all allow the same actors: the ext_authz listener sees
    /// no token, so which of them it acts with must not matter.
    pub(super) fn check_ext_authz_credential(
        &self,
        loader: &Loader<'_>,
    ) -> Result<(), PolicyError> {
        let Some(identity) = &self.ext_authz.host_credential else {
            return Ok(());
        };
        let message = match self.host_actors(identity) {
            Some(Ok(_)) => return Ok(()),
            None => format!(
                "names no host credential: no [[credentials]] of kind \"host\" has identity \
                 {identity:?}"
            ),
            Some(Err(())) => format!(
                "the credentials of host {identity:?} allow different actors; the ext_authz \
                 listener, which sees no token, could act with any of them: give them the \
                 same actors"
            ),
        };
        Err(loader.error("ext_authz.host_credential", message))
    }
}
