//! `ManifestPins` handlers (reviewer-facing).

use tonic::{Request, Response, Status};

use crate::domain::manifest::Manifest;
use crate::edge::auth::{Caller, Reach};
use crate::edge::convert::{optional_fingerprint, required};
use crate::engine::Engine;
use crate::pb;
use crate::pb::manifest_pins_server::ManifestPins;

#[derive(Debug, Clone)]
pub(crate) struct PinsService {
    engine: Engine,
}

impl PinsService {
    pub(crate) fn new(engine: Engine) -> Self {
        PinsService { engine }
    }
}

#[tonic::async_trait]
impl ManifestPins for PinsService {
    #[tracing::instrument(level = "debug", skip_all)]
    async fn pin_manifest(
        &self,
        request: Request<pb::PinManifestRequest>,
    ) -> Result<Response<pb::Pin>, Status> {
        let caller = Caller::require(&request, Reach::Reviewer)?;
        let message = request.into_inner();
        let expected = optional_fingerprint(&message.expected_fingerprint, "expected_fingerprint")?;
        let manifest = Manifest::try_from(required(message.manifest, "manifest")?)
            .map_err(|error| error.under("manifest"))?;
        let record = self
            .engine
            .pin_manifest(&caller.identity, manifest, expected)?;
        Ok(Response::new(record.into()))
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn list_pins(
        &self,
        request: Request<pb::ListPinsRequest>,
    ) -> Result<Response<pb::ListPinsResponse>, Status> {
        Caller::require(&request, Reach::Reviewer)?;
        let pins = self
            .engine
            .list_pins()?
            .into_iter()
            .map(pb::Pin::from)
            .collect();
        Ok(Response::new(pb::ListPinsResponse { pins }))
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn remove_pin(
        &self,
        request: Request<pb::RemovePinRequest>,
    ) -> Result<Response<pb::Pin>, Status> {
        let caller = Caller::require(&request, Reach::Reviewer)?;
        let server_id = request.into_inner().server_id;
        crate::domain::ids::check_server_id("server_id", &server_id)?;
        let record = self.engine.remove_pin(&caller.identity, &server_id)?;
        Ok(Response::new(record.into()))
    }
}
