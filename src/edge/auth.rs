//! Authentication and the reach of each credential kind, as a tower layer
//! in front of every gRPC service.
//!
//! - `authorization: Bearer <token>`; the token's SHA-256 digest is looked up
//!   among the policy's credentials (tokens themselves are never stored).
//! - With mTLS, the verified client certificate: a credential bound to a
//!   `client_identity` (the certificate's subject or one of its URI SANs)
//!   is refused on a connection whose certificate does not name it (so
//!   never over plaintext); one without a token is the certificate alone,
//!   used when a call comes with no token.
//! - Host credentials reach only `PolicyDecisionPoint` (and Envoy's
//!   `Authorization`, which acts for a host); reviewer credentials
//!   only `Approvals` and `ManifestPins`; `Resources` takes either. Health
//!   and reflection are open.
//! - The host API is open only with `[server] open_host_api = true` (the
//!   caller is then an anonymous host that may assert any actor); never
//!   because credentials are absent. The reviewer API always needs a
//!   reviewer credential: with none configured it is closed.
//! - Missing or unknown token → `UNAUTHENTICATED`; the wrong kind →
//!   `PERMISSION_DENIED`.
//!
//! The layer puts the [`Caller`] into the request's extensions; handlers
//! read it from there, never from a request field. It runs every call in a
//! [`RequestContext`] (for the call's `request_rejected` lines), and writes
//! an `auth_failed` audit line for every refusal: method, code, a stable
//! reason (`missing-token`, `malformed-authorization`, `unknown-token`,
//! `client-identity-mismatch`, `reviewer-api-closed`,
//! `wrong-credential-kind`, and from the handlers
//! `actor-not-permitted`), never the token.

use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};

use tonic::Status;
use tower::{Layer, Service};

use crate::audit;
use crate::domain::canonical::Fingerprint;
use crate::domain::error::Error;
use crate::domain::policy::{Credential, CredentialKind, PeerCertificate};
use crate::edge::BoxFuture;
use crate::edge::connections::ConnectionInfo;
use crate::edge::status::RequestContext;
use crate::engine::Engine;
use crate::ops::audit::Rejection;
use crate::ops::methods;

/// The authenticated identity behind a request: the credential its token
/// matched (shared, not copied, per request).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Caller(Arc<Credential>);

impl std::ops::Deref for Caller {
    type Target = Credential;

    fn deref(&self) -> &Credential {
        &self.0
    }
}

impl Caller {
    /// The caller a credential makes: what the layer attaches once a token
    /// matched it (and what in-process calls attach, `edge::in_process`).
    pub(crate) fn new(credential: Arc<Credential>) -> Caller {
        Caller(credential)
    }

    /// The credential the token matched.
    pub(crate) fn credential(&self) -> Arc<Credential> {
        Arc::clone(&self.0)
    }

    /// The caller the layer attached, required to be one `reach` admits. A
    /// missing caller means the layer is not in front of this service: refuse.
    pub(crate) fn require<T>(request: &tonic::Request<T>, reach: Reach) -> Result<Caller, Error> {
        match request.extensions().get::<Caller>() {
            Some(caller) if reach.admits(caller.kind) => Ok(caller.clone()),
            Some(caller) => Err(Error::PermissionDenied(format!(
                "a {} credential cannot call this service",
                caller.kind.as_str()
            ))),
            None => Err(Error::Unauthenticated("no authenticated caller".into())),
        }
    }

    /// Whether a host caller may speak for `actor`.
    pub(crate) fn may_assert(&self, actor: &str) -> bool {
        self.kind == CredentialKind::Host && self.0.may_assert(actor)
    }

    /// Why this caller may not act for `actor` (when [`Caller::may_assert`]
    /// says it may not).
    pub(crate) fn may_not_act_for(&self, actor: &str) -> String {
        format!("host {:?} may not act for actor {actor:?}", self.identity)
    }

    /// Refuses a host that may not speak for `actor`, with an `auth_failed`
    /// line (reason `actor-not-permitted`) for the call being served.
    pub(crate) fn require_actor(&self, actor: &str) -> Result<(), Error> {
        if self.may_assert(actor) {
            return Ok(());
        }
        let refused = Refused {
            error: Error::PermissionDenied(self.may_not_act_for(actor)),
            reason: "actor-not-permitted",
            identity: Some(self.identity.clone()),
        };
        RequestContext::with_current(|context| {
            audit_refused(context.engine(), context, &refused);
        });
        Err(refused.error)
    }
}

/// Who may call a gRPC service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Reach {
    Open,
    Host,
    Reviewer,
    HostOrReviewer,
}

impl Reach {
    fn of(path: &str) -> Reach {
        match methods::service_of(path) {
            methods::POLICY_DECISION_POINT | methods::AUTHORIZATION => Reach::Host,
            methods::APPROVALS | methods::MANIFEST_PINS => Reach::Reviewer,
            methods::RESOURCES => Reach::HostOrReviewer,
            // Health and reflection are open; unknown services get
            // UNIMPLEMENTED from the router: nothing to protect.
            _ => Reach::Open,
        }
    }

    fn admits(self, kind: CredentialKind) -> bool {
        match self {
            Reach::Host => kind == CredentialKind::Host,
            Reach::Reviewer => kind == CredentialKind::Reviewer,
            Reach::HostOrReviewer | Reach::Open => true,
        }
    }
}

/// The caller of the host API when the policy says `open_host_api = true`.
pub(crate) fn anonymous_host() -> Caller {
    static ANONYMOUS: LazyLock<Arc<Credential>> = LazyLock::new(|| {
        Arc::new(Credential {
            identity: "anonymous".to_string(),
            kind: CredentialKind::Host,
            actors: vec!["*".to_string()],
            client_identity: None,
        })
    });
    Caller(Arc::clone(&ANONYMOUS))
}

/// A request refused by authentication: the error it is answered with (an
/// [`Error::Unauthenticated`] or [`Error::PermissionDenied`]), and what its
/// `auth_failed` line says (never the token).
struct Refused {
    error: Error,
    /// Stable kebab-case reason.
    reason: &'static str,
    /// The credential the token matched, when it was of the wrong kind.
    identity: Option<String>,
}

impl Refused {
    fn unauthenticated(reason: &'static str, message: &'static str) -> Self {
        Refused {
            error: Error::Unauthenticated(message.to_string()),
            reason,
            identity: None,
        }
    }
}

/// The token of an `authorization: Bearer <token>` header (`bearer` also
/// taken), or `None` when the header has no such shape.
fn bearer_token(header: &[u8]) -> Option<&str> {
    let text = std::str::from_utf8(header).ok()?;
    let token = text
        .strip_prefix("Bearer ")
        .or_else(|| text.strip_prefix("bearer "))?
        .trim();
    (!token.is_empty()).then_some(token)
}

/// The SHA-256 digest of the request's bearer token, read as the layer
/// reads it (`None` for a request without one).
pub(crate) fn token_digest<T>(request: &tonic::Request<T>) -> Option<Fingerprint> {
    let header = request
        .metadata()
        .get(http::header::AUTHORIZATION.as_str())?;
    bearer_token(header.as_bytes()).map(|token| Fingerprint::of_bytes(token.as_bytes()))
}

/// The verified client certificate of the request's connection (mTLS).
pub(crate) fn peer_certificate<T>(request: &tonic::Request<T>) -> Option<PeerCertificate> {
    request
        .extensions()
        .get::<ConnectionInfo>()
        .and_then(ConnectionInfo::peer_certificate)
        .cloned()
}

/// The credential a token digest and a client certificate authenticate as
/// under the policy in force (what the layer decides, less the reach), for
/// the checks a long call repeats at every reload.
pub(crate) fn current_credential(
    engine: &Engine,
    digest: Option<&Fingerprint>,
    peer: Option<&PeerCertificate>,
) -> Option<Arc<Credential>> {
    match digest {
        Some(digest) => engine.credential(digest).filter(|credential| {
            credential
                .client_identity
                .as_ref()
                .is_none_or(|bound| peer.is_some_and(|peer| peer.matches(bound)))
        }),
        None => peer.and_then(|peer| engine.certificate_credential(peer)),
    }
}

/// Decides whether a request may reach its service, and as whom. `peer` is
/// the client certificate the connection's TLS handshake verified (mTLS).
fn authenticate(
    engine: &Engine,
    path: &str,
    authorization: Option<&[u8]>,
    peer: Option<&PeerCertificate>,
) -> Result<Option<Caller>, Refused> {
    let reach = Reach::of(path);
    if reach == Reach::Open {
        return Ok(None);
    }
    let Some(header) = authorization else {
        return without_token(engine, reach, path, peer);
    };
    let token = bearer_token(header).ok_or_else(|| {
        Refused::unauthenticated(
            "malformed-authorization",
            "authorization must be `Bearer <token>`",
        )
    })?;
    with_token(engine, reach, path, token, peer).map(Some)
}

/// A request without a token: the credential its client certificate is,
/// if it is one; else the anonymous host where the policy opens the host
/// API; refused otherwise.
fn without_token(
    engine: &Engine,
    reach: Reach,
    path: &str,
    peer: Option<&PeerCertificate>,
) -> Result<Option<Caller>, Refused> {
    if let Some(credential) = peer.and_then(|peer| engine.certificate_credential(peer)) {
        return admitted(reach, path, credential).map(Some);
    }
    if reach != Reach::Reviewer && engine.policy().open_host_api {
        return Ok(Some(anonymous_host()));
    }
    if reach == Reach::Reviewer && !engine.has_credentials(CredentialKind::Reviewer) {
        return Err(Refused::unauthenticated(
            "reviewer-api-closed",
            "the reviewer API is closed: the policy declares no reviewer credentials",
        ));
    }
    Err(Refused::unauthenticated(
        "missing-token",
        "missing `authorization: Bearer <token>`",
    ))
}

/// A request with a token: the credential it matches, if the connection's
/// client certificate is the one the credential is bound to (when it is
/// bound to one) and one of that kind may call the service.
fn with_token(
    engine: &Engine,
    reach: Reach,
    path: &str,
    token: &str,
    peer: Option<&PeerCertificate>,
) -> Result<Caller, Refused> {
    let digest = Fingerprint::of_bytes(token.as_bytes());
    let Some(credential) = engine.credential(&digest) else {
        return Err(Refused::unauthenticated("unknown-token", "unknown token"));
    };
    if let Some(bound) = &credential.client_identity
        && !peer.is_some_and(|peer| peer.matches(bound))
    {
        return Err(Refused {
            error: Error::Unauthenticated(
                "this token is bound to a client certificate the connection did not present (mTLS)"
                    .to_string(),
            ),
            reason: "client-identity-mismatch",
            identity: Some(credential.identity.clone()),
        });
    }
    admitted(reach, path, credential)
}

/// The caller `credential` is, if one of its kind may call the service.
fn admitted(reach: Reach, path: &str, credential: Arc<Credential>) -> Result<Caller, Refused> {
    if !reach.admits(credential.kind) {
        return Err(Refused {
            error: Error::PermissionDenied(format!(
                "a {} credential cannot call {}",
                credential.kind.as_str(),
                methods::service_of(path)
            )),
            reason: "wrong-credential-kind",
            identity: Some(credential.identity.clone()),
        });
    }
    Ok(Caller(credential))
}

/// `auth_failed`: method, code, reason, the credential's identity when the
/// token matched one of the wrong kind; never the token.
fn audit_refused(engine: &Engine, context: &RequestContext, refused: &Refused) {
    engine.audit_rejection(Rejection::AuthFailed, |coalesced, revision| {
        audit!(
            "auth_failed",
            method = context.method(),
            code = refused.error.code_name(),
            reason = refused.reason,
            identity = refused.identity.as_deref(),
            policy_revision = revision,
            coalesced,
        );
    });
}

/// On `--ext-authz-listen`, which serves only Envoy's `Authorization` to a
/// proxy that sends no token: every call acts with the authority of the
/// host `[ext_authz] host_credential` names (refused while the policy
/// names none). When any of that host's credentials is bound to a client
/// certificate, the connection must have presented one of those (mTLS),
/// as a call with its token would have to.
fn ext_authz_listener_caller(
    engine: &Engine,
    peer: Option<&PeerCertificate>,
) -> Result<Option<Caller>, Refused> {
    let policy = engine.policy();
    let Some(identity) = policy.ext_authz.host_credential.as_deref() else {
        return Err(Refused::unauthenticated(
            "ext-authz-no-host-credential",
            "the ext_authz listener acts with [ext_authz] host_credential, and the policy names none",
        ));
    };
    // The policy's load made sure they all allow the same actors.
    let mut credentials = policy.host_credentials(identity).peekable();
    let Some(&first) = credentials.peek() else {
        return Err(Refused::unauthenticated(
            "ext-authz-no-host-credential",
            "the ext_authz listener acts with [ext_authz] host_credential, and the policy has none",
        ));
    };
    let mut bound = credentials
        .filter(|credential| credential.client_identity.is_some())
        .peekable();
    if bound.peek().is_none() {
        return Ok(Some(Caller(Arc::clone(first))));
    }
    let matched = bound.find(|credential| {
        (credential.client_identity.as_ref())
            .is_some_and(|bound| peer.is_some_and(|peer| peer.matches(bound)))
    });
    match matched {
        Some(credential) => Ok(Some(Caller(Arc::clone(credential)))),
        None => Err(Refused {
            error: Error::Unauthenticated(
                "the ext_authz listener's host credential is bound to a client certificate the \
                 connection did not present (mTLS)"
                    .to_string(),
            ),
            reason: "client-identity-mismatch",
            identity: Some(identity.to_string()),
        }),
    }
}

/// Who the callers of a listener are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Callers {
    /// Each call's bearer token says (the gRPC listener).
    ByToken,
    /// The ext_authz listener's host credential.
    ExtAuthzHost,
}

/// The tower layer that authenticates every request.
#[derive(Debug, Clone)]
pub(crate) struct AuthLayer {
    engine: Engine,
    callers: Callers,
}

impl AuthLayer {
    pub(crate) fn new(engine: Engine) -> Self {
        AuthLayer {
            engine,
            callers: Callers::ByToken,
        }
    }

    /// The layer of `--ext-authz-listen`: no token, the authority of
    /// `[ext_authz] host_credential`.
    pub(crate) fn ext_authz_listener(engine: Engine) -> Self {
        AuthLayer {
            engine,
            callers: Callers::ExtAuthzHost,
        }
    }
}

impl<S> Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AuthService {
            inner,
            engine: self.engine.clone(),
            callers: self.callers,
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct AuthService<S> {
    inner: S,
    engine: Engine,
    callers: Callers,
}

impl<S, RequestBody, ResponseBody> Service<http::Request<RequestBody>> for AuthService<S>
where
    S: Service<http::Request<RequestBody>, Response = http::Response<ResponseBody>>,
    S::Future: Send + 'static,
    ResponseBody: Default + Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<Self::Response, Self::Error>;

    fn poll_ready(&mut self, context: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(context)
    }

    fn call(&mut self, mut request: http::Request<RequestBody>) -> Self::Future {
        let authorization = request
            .headers()
            .get(http::header::AUTHORIZATION)
            .map(http::HeaderValue::as_bytes);
        let path = request.uri().path();
        let peer = request
            .extensions()
            .get::<ConnectionInfo>()
            .and_then(ConnectionInfo::peer_certificate);
        let authenticated = match self.callers {
            Callers::ByToken => authenticate(&self.engine, path, authorization, peer),
            Callers::ExtAuthzHost => ext_authz_listener_caller(&self.engine, peer),
        };
        match authenticated {
            Ok(caller) => {
                // The call runs in its context, for the audit lines of its
                // rejections (`edge::status`).
                let context = RequestContext::new(
                    self.engine.clone(),
                    path,
                    caller.as_ref().map(Caller::credential),
                );
                // Whatever a client sent, the only Caller is the one made here.
                request.extensions_mut().remove::<Caller>();
                if let Some(caller) = caller {
                    request.extensions_mut().insert(caller);
                }
                Box::pin(context.scope(self.inner.call(request)))
            }
            Err(refused) => {
                let context = RequestContext::new(self.engine.clone(), path, None);
                audit_refused(&self.engine, &context, &refused);
                let response = Status::from(refused.error).into_http::<ResponseBody>();
                Box::pin(async move { Ok(response) })
            }
        }
    }
}
