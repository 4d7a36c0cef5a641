//! `PolicyDecisionPoint` handlers (host-facing).

use tonic::{Request, Response, Status};

use crate::engine::Engine;
use crate::grpc::convert::required;
use crate::manifest::Manifest;
use crate::pb;
use crate::pb::policy_decision_point_server::PolicyDecisionPoint;

#[derive(Debug, Clone)]
pub struct PdpService {
    engine: Engine,
}

impl PdpService {
    pub fn new(engine: Engine) -> Self {
        PdpService { engine }
    }
}

#[tonic::async_trait]
impl PolicyDecisionPoint for PdpService {
    async fn decide(
        &self,
        _request: Request<pb::DecideRequest>,
    ) -> Result<Response<pb::DecideResponse>, Status> {
        Err(Status::unimplemented("Decide is not implemented yet"))
    }

    async fn dispatch(
        &self,
        _request: Request<pb::DispatchRequest>,
    ) -> Result<Response<pb::DispatchResponse>, Status> {
        Err(Status::unimplemented("Dispatch is not implemented yet"))
    }

    #[tracing::instrument(skip_all)]
    async fn assess_manifest(
        &self,
        request: Request<pb::AssessManifestRequest>,
    ) -> Result<Response<pb::AssessManifestResponse>, Status> {
        let message = required(request.into_inner().manifest, "manifest")?;
        let manifest = Manifest::try_from(message).map_err(|error| error.under("manifest"))?;
        let assessment = self.engine.assess_manifest(&manifest)?;
        Ok(Response::new(assessment.into()))
    }

    async fn get_session(
        &self,
        _request: Request<pb::GetSessionRequest>,
    ) -> Result<Response<pb::SessionInfo>, Status> {
        Err(Status::unimplemented("GetSession is not implemented yet"))
    }
}
