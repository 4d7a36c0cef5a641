//! `Resources` handlers: the versioned state, readable by hosts and reviewers.

use tonic::{Request, Response, Status};

use crate::auth::Caller;
use crate::canonical;
use crate::engine::Engine;
use crate::pb;
use crate::pb::resources_server::Resources;

/// Longest resource name (as in the policy).
pub const MAX_RESOURCE_NAME_LEN: usize = 64;
/// `ListResources` page size when the request says 0, and the largest.
pub const DEFAULT_RESOURCE_PAGE: u32 = 100;
pub const MAX_RESOURCE_PAGE: u32 = 1000;
/// About how many bytes of values one `ListResources` page holds (at least
/// one resource).
pub const MAX_RESOURCE_PAGE_BYTES: usize = 2 * 1024 * 1024;

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

    #[tracing::instrument(level = "debug", skip_all)]
    async fn list_resources(
        &self,
        request: Request<pb::ListResourcesRequest>,
    ) -> Result<Response<pb::ListResourcesResponse>, Status> {
        if request.extensions().get::<Caller>().is_none() {
            return Err(Status::unauthenticated("no authenticated caller"));
        }
        let request = request.into_inner();
        let page_size = match request.page_size {
            0 => DEFAULT_RESOURCE_PAGE,
            size if size <= MAX_RESOURCE_PAGE => size,
            size => {
                return Err(crate::error::Error::invalid(
                    "page_size",
                    format!("must be at most {MAX_RESOURCE_PAGE}, got {size}"),
                )
                .into());
            }
        };
        // The token is the last name of the previous page.
        let after = match request.page_token.as_str() {
            "" => None,
            token if token.len() <= MAX_RESOURCE_NAME_LEN => Some(token),
            _ => {
                return Err(crate::error::Error::invalid(
                    "page_token",
                    "is not a token from a previous ListResources answer",
                )
                .into());
            }
        };
        let page =
            self.engine
                .list_resources(after, page_size as usize, MAX_RESOURCE_PAGE_BYTES)?;
        Ok(Response::new(pb::ListResourcesResponse {
            resources: page
                .resources
                .into_iter()
                .map(|(name, value_json, version)| pb::Resource {
                    name,
                    value_json,
                    version,
                })
                .collect(),
            next_page_token: page.next.unwrap_or_default(),
        }))
    }
}
