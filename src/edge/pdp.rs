//! `PolicyDecisionPoint` handlers (host-facing).

use tonic::{Request, Response, Status};

use crate::domain::error::Error;
use crate::domain::manifest::Manifest;
use crate::edge::auth::{Caller, Reach};
use crate::edge::convert::{
    decide_response, dispatch_response, required, session_and_proposal, session_info,
};
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

#[tonic::async_trait]
impl PolicyDecisionPoint for PdpService {
    #[tracing::instrument(level = "debug", skip_all)]
    async fn decide(
        &self,
        request: Request<pb::DecideRequest>,
    ) -> Result<Response<pb::DecideResponse>, Status> {
        let caller = Caller::require(&request, Reach::Host)?;
        let message = request.into_inner();
        let (session, proposal) = session_and_proposal(message.session, message.proposal)?;
        caller.require_actor(&session.actor)?;
        let session = session.for_host(&caller.identity);
        let (decision, policy_revision) = self.engine.decide(&session, &proposal)?;
        Ok(Response::new(decide_response(decision, policy_revision)))
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn dispatch(
        &self,
        request: Request<pb::DispatchRequest>,
    ) -> Result<Response<pb::DispatchResponse>, Status> {
        let caller = Caller::require(&request, Reach::Host)?;
        let message = request.into_inner();
        let (session, proposal) = session_and_proposal(message.session, message.proposal)?;
        caller.require_actor(&session.actor)?;
        let session = session.for_host(&caller.identity);
        let (dispatched, policy_revision) = self.engine.dispatch(&session, &proposal)?;
        Ok(Response::new(dispatch_response(
            dispatched,
            policy_revision,
        )))
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn assess_manifest(
        &self,
        request: Request<pb::AssessManifestRequest>,
    ) -> Result<Response<pb::AssessManifestResponse>, Status> {
        Caller::require(&request, Reach::Host)?;
        let message = required(request.into_inner().manifest, "manifest")?;
        let manifest = Manifest::try_from(message).map_err(|error| error.under("manifest"))?;
        let assessment = self.engine.assess_manifest(&manifest)?;
        Ok(Response::new(assessment.into()))
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn get_session(
        &self,
        request: Request<pb::GetSessionRequest>,
    ) -> Result<Response<pb::SessionInfo>, Status> {
        let caller = Caller::require(&request, Reach::Host)?;
        let session_id = request.into_inner().session_id;
        crate::domain::ids::check_identifier("session_id", &session_id)?;
        // A session of an actor this host may not assert is reported exactly
        // like a missing one: the answer must not reveal that it exists.
        let not_found = || Error::NotFound(format!("no session {session_id:?} for this host"));
        let session = match self.engine.session(&caller.identity, &session_id) {
            Ok(found) => found,
            Err(Error::NotFound(_)) => return Err(not_found().into()),
            Err(other) => return Err(other.into()),
        };
        if !caller.may_assert(&session.actor) {
            return Err(not_found().into());
        }
        Ok(Response::new(session_info(session)))
    }
}
