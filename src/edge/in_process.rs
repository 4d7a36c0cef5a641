//! The host and reviewer RPCs of an [`Engine`], called in this process with
//! no listener and no token: the gRPC handlers themselves (`edge::pdp`,
//! `edge::approvals`), so the same conversions, validation, engine calls
//! and error-to-status map, with the [`Caller`] the authentication layer
//! would have attached for a credential of the policy. `toolgate eval` and
//! `toolgate test` run a policy through it, so that an offline answer is
//! the answer a server on that policy gives.
//!
//! What it leaves out is only what sits in front of a handler: tokens (the
//! caller is chosen, see [`host_credential`]), load shedding, timeouts and
//! message-size limits.

use std::future::Future;
use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::domain::policy::{Credential, CredentialKind, Policy};
use crate::edge::approvals::ApprovalsService;
use crate::edge::auth::{Caller, anonymous_host};
use crate::edge::pdp::PdpService;
use crate::edge::status::RequestContext;
use crate::engine::Engine;
use crate::ops::methods;
use crate::pb;
use crate::pb::approvals_server::Approvals;
use crate::pb::policy_decision_point_server::PolicyDecisionPoint;

/// The host the server would see for a caller of `policy`'s host API:
/// with `[server] open_host_api = true`, the anonymous host (identity
/// `anonymous`, any actor), as every caller is then; otherwise a host
/// credential (token or client certificate) of `identity`, or of the
/// alphabetically first host identity when `identity` is `None`. The
/// server lets a call assert the actors of the one credential it
/// authenticated with, so an identity whose credentials allow different
/// actors is refused here: which of them a test acts as would decide its
/// answers.
pub fn host_credential(policy: &Policy, identity: Option<&str>) -> Result<Arc<Credential>, String> {
    if policy.open_host_api {
        let anonymous = anonymous_host().credential();
        return match identity {
            None => Ok(anonymous),
            Some(identity) if identity == anonymous.identity => Ok(anonymous),
            Some(identity) => Err(format!(
                "the policy's host API is open (open_host_api = true): every caller is host \
                 {:?}, not {identity:?}",
                anonymous.identity
            )),
        };
    }
    let mut hosts: Vec<&str> = (policy.credentials.values())
        .chain(policy.certificate_credentials.values())
        .filter(|credential| credential.kind == CredentialKind::Host)
        .map(|credential| credential.identity.as_str())
        .collect();
    hosts.sort_unstable();
    hosts.dedup();
    let chosen = match (identity, hosts.first()) {
        (Some(identity), _) => identity,
        (None, Some(first)) => first,
        (None, None) => return Err("the policy declares no host credential".to_string()),
    };
    match policy.host_actors(chosen) {
        Some(Ok(actors)) => Ok(Arc::new(Credential {
            kind: CredentialKind::Host,
            identity: chosen.to_string(),
            actors,
            client_identity: None,
        })),
        None => Err(format!(
            "no host credential {chosen:?} in the policy (hosts: {})",
            hosts.join(", ")
        )),
        Some(Err(())) => Err(format!(
            "the credentials of host {chosen:?} allow different actors, and a call may assert \
             only those of the credential it authenticates with: give them the same actors to \
             test this host"
        )),
    }
}

/// A reviewer as a reviewer credential of `identity` makes it (the policy
/// only lets such a credential name a reviewer of its `[reviewers]`).
pub fn reviewer_credential(identity: &str) -> Arc<Credential> {
    Arc::new(Credential {
        kind: CredentialKind::Reviewer,
        identity: identity.to_string(),
        actors: Vec::new(),
        client_identity: None,
    })
}

/// The handlers of one engine, called in this process.
#[derive(Debug, Clone)]
pub struct InProcess {
    engine: Engine,
    pdp: PdpService,
    approvals: ApprovalsService,
}

impl InProcess {
    pub fn new(engine: Engine) -> Self {
        InProcess {
            pdp: PdpService::new(engine.clone()),
            approvals: ApprovalsService::new(engine.clone()),
            engine,
        }
    }

    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// `PolicyDecisionPoint/Decide` as `caller`.
    pub async fn decide(
        &self,
        caller: &Arc<Credential>,
        request: pb::DecideRequest,
    ) -> Result<pb::DecideResponse, Status> {
        self.call(
            caller,
            methods::POLICY_DECISION_POINT,
            "Decide",
            request,
            |request| self.pdp.decide(request),
        )
        .await
    }

    /// `PolicyDecisionPoint/Dispatch` as `caller`.
    pub async fn dispatch(
        &self,
        caller: &Arc<Credential>,
        request: pb::DispatchRequest,
    ) -> Result<pb::DispatchResponse, Status> {
        self.call(
            caller,
            methods::POLICY_DECISION_POINT,
            "Dispatch",
            request,
            |request| self.pdp.dispatch(request),
        )
        .await
    }

    /// `Approvals/GrantApproval` as `caller`.
    pub async fn grant_approval(
        &self,
        caller: &Arc<Credential>,
        request: pb::GrantApprovalRequest,
    ) -> Result<pb::Approval, Status> {
        self.call(
            caller,
            methods::APPROVALS,
            "GrantApproval",
            request,
            |request| self.approvals.grant_approval(request),
        )
        .await
    }

    /// `Approvals/DenyApproval` as `caller`.
    pub async fn deny_approval(
        &self,
        caller: &Arc<Credential>,
        request: pb::DenyApprovalRequest,
    ) -> Result<pb::Approval, Status> {
        self.call(
            caller,
            methods::APPROVALS,
            "DenyApproval",
            request,
            |request| self.approvals.deny_approval(request),
        )
        .await
    }

    /// `Approvals/RevokeApproval` as `caller`.
    pub async fn revoke_approval(
        &self,
        caller: &Arc<Credential>,
        request: pb::RevokeApprovalRequest,
    ) -> Result<pb::Approval, Status> {
        self.call(
            caller,
            methods::APPROVALS,
            "RevokeApproval",
            request,
            |request| self.approvals.revoke_approval(request),
        )
        .await
    }

    /// One call of a handler, as the authentication layer runs it: the
    /// caller in the request's extensions, the call in its request context
    /// (for its audit lines).
    async fn call<T, R, F>(
        &self,
        caller: &Arc<Credential>,
        service: &str,
        method: &str,
        message: T,
        handler: impl FnOnce(Request<T>) -> F,
    ) -> Result<R, Status>
    where
        F: Future<Output = Result<Response<R>, Status>>,
    {
        let mut request = Request::new(message);
        request
            .extensions_mut()
            .insert(Caller::new(Arc::clone(caller)));
        let path = format!("/{service}/{method}");
        let context = RequestContext::new(self.engine.clone(), &path, Some(Arc::clone(caller)));
        context
            .scope(handler(request))
            .await
            .map(Response::into_inner)
    }
}
