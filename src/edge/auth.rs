//! Authentication and the reach of each credential kind, as a tower layer
//! in front of every gRPC service.
//!
//! - `authorization: Bearer <token>`; the token's SHA-256 digest is looked up
//!   among the policy's credentials (tokens themselves are never stored).
//! - Host credentials reach only `PolicyDecisionPoint`; reviewer credentials
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
//! `reviewer-api-closed`, `wrong-credential-kind`, and from the handlers
//! `actor-not-permitted`), never the token.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, LazyLock};
use std::task::{Context, Poll};

use tonic::Status;
use tower::{Layer, Service};

use crate::audit;
use crate::domain::canonical::Fingerprint;
use crate::domain::policy::{Credential, CredentialKind};
use crate::edge::status::RequestContext;
use crate::engine::Engine;
use crate::ops::audit::Rejection;

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
    /// The caller the layer attached, required to be of `kind`. A missing
    /// caller means the layer is not in front of this service: refuse.
    #[allow(clippy::result_large_err)] // tonic::Status is the handler's error type
    pub(crate) fn require<T>(
        request: &tonic::Request<T>,
        kind: CredentialKind,
    ) -> Result<Caller, Status> {
        match request.extensions().get::<Caller>() {
            Some(caller) if caller.kind == kind => Ok(caller.clone()),
            Some(caller) => Err(Status::permission_denied(format!(
                "a {} credential cannot call this service",
                caller.kind.as_str()
            ))),
            None => Err(Status::unauthenticated("no authenticated caller")),
        }
    }

    /// Whether a host caller may speak for `actor`.
    pub(crate) fn may_assert(&self, actor: &str) -> bool {
        self.kind == CredentialKind::Host && self.0.may_assert(actor)
    }

    /// Refuses a host that may not speak for `actor`, with an `auth_failed`
    /// line (reason `actor-not-permitted`) for the call being served.
    #[allow(clippy::result_large_err)] // tonic::Status is the handler's error type
    pub(crate) fn require_actor(&self, actor: &str) -> Result<(), Status> {
        if self.may_assert(actor) {
            return Ok(());
        }
        let refused = Refused {
            status: Status::permission_denied(format!(
                "host {:?} may not act for actor {actor:?}",
                self.identity
            )),
            code: "PERMISSION_DENIED",
            reason: "actor-not-permitted",
            identity: Some(self.identity.clone()),
        };
        RequestContext::with_current(|context| {
            audit_refused(context.engine(), context, &refused);
        });
        Err(refused.status)
    }
}

/// Who may call a gRPC service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reach {
    Open,
    Host,
    Reviewer,
    HostOrReviewer,
}

fn reach_of(path: &str) -> Reach {
    let service = path.trim_start_matches('/').split('/').next().unwrap_or("");
    match service {
        "toolgate.v1.PolicyDecisionPoint" => Reach::Host,
        "toolgate.v1.Approvals" | "toolgate.v1.ManifestPins" => Reach::Reviewer,
        "toolgate.v1.Resources" => Reach::HostOrReviewer,
        "grpc.health.v1.Health"
        | "grpc.reflection.v1.ServerReflection"
        | "grpc.reflection.v1alpha.ServerReflection" => Reach::Open,
        // Unknown services get UNIMPLEMENTED from the router; nothing to protect.
        _ => Reach::Open,
    }
}

/// The caller of the host API when the policy says `open_host_api = true`.
fn anonymous_host() -> Caller {
    static ANONYMOUS: LazyLock<Arc<Credential>> = LazyLock::new(|| {
        Arc::new(Credential {
            identity: "anonymous".to_string(),
            kind: CredentialKind::Host,
            actors: vec!["*".to_string()],
        })
    });
    Caller(Arc::clone(&ANONYMOUS))
}

/// A request refused by authentication: the status it is answered with,
/// and what its `auth_failed` line says (never the token).
struct Refused {
    status: Status,
    code: &'static str,
    /// Stable kebab-case reason.
    reason: &'static str,
    /// The credential the token matched, when it was of the wrong kind.
    identity: Option<String>,
}

impl Refused {
    fn unauthenticated(reason: &'static str, message: &'static str) -> Self {
        Refused {
            status: Status::unauthenticated(message),
            code: "UNAUTHENTICATED",
            reason,
            identity: None,
        }
    }
}

/// Decides whether a request may reach its service, and as whom.
fn authenticate(
    engine: &Engine,
    path: &str,
    authorization: Option<&[u8]>,
) -> Result<Option<Caller>, Box<Refused>> {
    let reach = reach_of(path);
    if reach == Reach::Open {
        return Ok(None);
    }
    let token = match authorization {
        None => None,
        Some(header) => {
            let text = std::str::from_utf8(header).ok();
            let token = text.and_then(|text| {
                text.strip_prefix("Bearer ")
                    .or_else(|| text.strip_prefix("bearer "))
            });
            match token.map(str::trim) {
                Some(token) if !token.is_empty() => Some(token),
                _ => {
                    return Err(Box::new(Refused::unauthenticated(
                        "malformed-authorization",
                        "authorization must be `Bearer <token>`",
                    )));
                }
            }
        }
    };
    let Some(token) = token else {
        if reach != Reach::Reviewer && engine.policy().open_host_api {
            return Ok(Some(anonymous_host()));
        }
        return Err(Box::new(match reach {
            Reach::Reviewer if !engine.has_credentials(CredentialKind::Reviewer) => {
                Refused::unauthenticated(
                    "reviewer-api-closed",
                    "the reviewer API is closed: the policy declares no reviewer credentials",
                )
            }
            _ => {
                Refused::unauthenticated("missing-token", "missing `authorization: Bearer <token>`")
            }
        }));
    };
    let digest = Fingerprint::of_bytes(token.as_bytes());
    let Some(credential) = engine.credential(&digest) else {
        return Err(Box::new(Refused::unauthenticated(
            "unknown-token",
            "unknown token",
        )));
    };
    let allowed = match reach {
        Reach::Host => credential.kind == CredentialKind::Host,
        Reach::Reviewer => credential.kind == CredentialKind::Reviewer,
        Reach::HostOrReviewer | Reach::Open => true,
    };
    if !allowed {
        return Err(Box::new(Refused {
            status: Status::permission_denied(format!(
                "a {} credential cannot call {}",
                credential.kind.as_str(),
                path.trim_start_matches('/').split('/').next().unwrap_or("")
            )),
            code: "PERMISSION_DENIED",
            reason: "wrong-credential-kind",
            identity: Some(credential.identity.clone()),
        }));
    }
    Ok(Some(Caller(credential)))
}

/// `auth_failed`: method, code, reason, the credential's identity when the
/// token matched one of the wrong kind; never the token.
fn audit_refused(engine: &Engine, context: &RequestContext, refused: &Refused) {
    engine.audit_rejection(Rejection::AuthFailed, |coalesced, revision| {
        audit!(
            "auth_failed",
            method = context.method(),
            code = refused.code,
            reason = refused.reason,
            identity = refused.identity.as_deref(),
            policy_revision = revision,
            coalesced,
        );
    });
}

/// The tower layer that authenticates every request.
#[derive(Debug, Clone)]
pub(crate) struct AuthLayer {
    engine: Engine,
}

impl AuthLayer {
    pub(crate) fn new(engine: Engine) -> Self {
        AuthLayer { engine }
    }
}

impl<S> Layer<S> for AuthLayer {
    type Service = AuthService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        AuthService {
            inner,
            engine: self.engine.clone(),
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct AuthService<S> {
    inner: S,
    engine: Engine,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

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
        match authenticate(&self.engine, path, authorization) {
            Ok(caller) => {
                // The call runs in its context, for the audit lines of its
                // rejections (`grpc::status`).
                let context = RequestContext::new(self.engine.clone(), path, caller.clone());
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
                let response = refused.status.into_http::<ResponseBody>();
                Box::pin(async move { Ok(response) })
            }
        }
    }
}
