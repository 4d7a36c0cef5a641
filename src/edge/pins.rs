//! `ManifestPins` handlers (reviewer-facing).

use tonic::{Request, Response, Status};

use crate::domain::ids::check_server_id;
use crate::domain::manifest::Manifest;
use crate::edge::auth::Reach;
use crate::edge::convert::{optional_fingerprint, required};
use crate::edge::unary::unary;
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
        unary(request, Reach::Reviewer, |caller, message| async move {
            let expected =
                optional_fingerprint(&message.expected_fingerprint, "expected_fingerprint")?;
            let manifest = Manifest::try_from(required(message.manifest, "manifest")?)
                .map_err(|error| error.under("manifest"))?;
            // A server id that could never be pinned is the request's
            // error, named by its own field.
            check_server_id("manifest.server_id", &manifest.server_id)?;
            let record = self
                .engine
                .pin_manifest(&caller.identity, manifest, expected)
                .await?;
            Ok(record.into())
        })
        .await
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn list_pins(
        &self,
        request: Request<pb::ListPinsRequest>,
    ) -> Result<Response<pb::ListPinsResponse>, Status> {
        unary(request, Reach::Reviewer, |_, _| async move {
            let pins = self.engine.list_pins().await?;
            let pins = pins.into_iter().map(pb::Pin::from).collect();
            Ok(pb::ListPinsResponse { pins })
        })
        .await
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn remove_pin(
        &self,
        request: Request<pb::RemovePinRequest>,
    ) -> Result<Response<pb::Pin>, Status> {
        unary(request, Reach::Reviewer, |caller, message| async move {
            check_server_id("server_id", &message.server_id)?;
            let record = self
                .engine
                .remove_pin(&caller.identity, &message.server_id)
                .await?;
            Ok(record.into())
        })
        .await
    }
}
