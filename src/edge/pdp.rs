//! `PolicyDecisionPoint` handlers (host-facing).

use tonic::{Request, Response, Status};

use crate::domain::error::{Error, Result};
use crate::domain::ids::check_identifier;
use crate::domain::manifest::Manifest;
use crate::domain::proposal::{Proposal, SessionRef};
use crate::domain::session::SessionSummary;
use crate::edge::auth::{Caller, Reach};
use crate::edge::convert::{
    decide_response, dispatch_response, required, session_and_proposal, session_info,
};
use crate::edge::status::note_session;
use crate::edge::unary::unary;
use crate::engine::Engine;
use crate::pb;
use crate::pb::policy_decision_point_server::PolicyDecisionPoint;

#[derive(Debug, Clone)]
pub(crate) struct PdpService {
    engine: Engine,
}

impl PdpService {
    pub(crate) fn new(engine: Engine) -> Self {
        PdpService { engine }
    }
}

/// The session and proposal of a Decide or Dispatch: converted, the actor
/// one this host may speak for, the session in the host's namespace.
fn host_proposal(
    caller: &Caller,
    session: Option<pb::Session>,
    proposal: Option<pb::Proposal>,
) -> Result<(SessionRef, Proposal)> {
    let (session, proposal) = session_and_proposal(session, proposal)?;
    caller.require_actor(&session.actor)?;
    Ok((session.for_host(&caller.identity), proposal))
}

/// A session of this host, if it may assert the session's actor. One it may
/// not is reported exactly like a missing one: the answer must not reveal
/// that it exists.
async fn host_session(
    engine: &Engine,
    caller: &Caller,
    session_id: &str,
) -> Result<SessionSummary> {
    check_identifier("session_id", session_id)?;
    let hidden = || Error::NotFound(format!("no session {session_id:?} for this host"));
    match engine.session(&caller.identity, session_id).await {
        Ok(session) if caller.may_assert(&session.actor) => Ok(session),
        Ok(_) | Err(Error::NotFound(_)) => Err(hidden()),
        Err(other) => Err(other),
    }
}

#[tonic::async_trait]
impl PolicyDecisionPoint for PdpService {
    #[tracing::instrument(level = "debug", skip_all)]
    async fn decide(
        &self,
        request: Request<pb::DecideRequest>,
    ) -> Result<Response<pb::DecideResponse>, Status> {
        unary(request, Reach::Host, |caller, message| async move {
            let (session, proposal) = host_proposal(&caller, message.session, message.proposal)?;
            let (decision, policy_revision) = self
                .engine
                .decide(&session, &proposal)
                .await
                .inspect_err(|_| note_session(&session))?;
            Ok(decide_response(decision, policy_revision))
        })
        .await
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn dispatch(
        &self,
        request: Request<pb::DispatchRequest>,
    ) -> Result<Response<pb::DispatchResponse>, Status> {
        unary(request, Reach::Host, |caller, message| async move {
            let (session, proposal) = host_proposal(&caller, message.session, message.proposal)?;
            let (dispatched, policy_revision) = self
                .engine
                .dispatch(&session, &proposal)
                .await
                .inspect_err(|_| note_session(&session))?;
            Ok(dispatch_response(dispatched, policy_revision))
        })
        .await
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn assess_manifest(
        &self,
        request: Request<pb::AssessManifestRequest>,
    ) -> Result<Response<pb::AssessManifestResponse>, Status> {
        unary(request, Reach::Host, |_, message| async move {
            let manifest = required(message.manifest, "manifest")?;
            let manifest = Manifest::try_from(manifest).map_err(|error| error.under("manifest"))?;
            Ok(self.engine.assess_manifest(&manifest).await?.into())
        })
        .await
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn get_session(
        &self,
        request: Request<pb::GetSessionRequest>,
    ) -> Result<Response<pb::SessionInfo>, Status> {
        unary(request, Reach::Host, |caller, message| async move {
            let session = host_session(&self.engine, &caller, &message.session_id).await?;
            Ok(session_info(session))
        })
        .await
    }
}
