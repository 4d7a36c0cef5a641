//! `Resources` handlers: the versioned state, readable by hosts and reviewers.

use tonic::{Request, Response, Status};

use crate::auth::Caller;
use crate::canonical;
use crate::engine::Engine;
use crate::pb;
use crate::pb::resources_server::Resources;

/// Longest resource name (as in the policy).
pub const MAX_RESOURCE_NAME_LEN: usize = 64;

#[derive(Debug, Clone)]
pub struct ResourcesService {
    engine: Engine,
}

impl ResourcesService {
    pub fn new(engine: Engine) -> Self {
        ResourcesService { engine }
    }
}

#[tonic::async_trait]
impl Resources for ResourcesService {
    #[tracing::instrument(level = "debug", skip_all)]
    async fn get_resource(
        &self,
        request: Request<pb::GetResourceRequest>,
    ) -> Result<Response<pb::Resource>, Status> {
        if request.extensions().get::<Caller>().is_none() {
            return Err(Status::unauthenticated("no authenticated caller"));
        }
        let name = request.into_inner().name;
        if name.is_empty() || name.len() > MAX_RESOURCE_NAME_LEN {
            return Err(crate::error::Error::invalid(
                "name",
                format!("must be 1 to {MAX_RESOURCE_NAME_LEN} bytes"),
            )
            .into());
        }
        let (value, version) = self.engine.resource(&name)?;
        Ok(Response::new(pb::Resource {
            name,
            value_json: canonical::to_canonical(&value),
            version,
        }))
    }
}
