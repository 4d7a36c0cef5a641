//! `Resources` handlers: the versioned state, readable by hosts and reviewers.
//! A queue is read a page at a time, each page bounded in items and bytes
//! (the limits and page tokens are `domain::limits`).

use tonic::{Request, Response, Status};

use crate::domain::limits::{ResourceListing, ResourceRead};
use crate::edge::auth::Reach;
use crate::edge::convert::resource_page;
use crate::edge::unary::unary;
use crate::engine::Engine;
use crate::pb;
use crate::pb::resources_server::Resources;

#[derive(Debug, Clone)]
pub(crate) struct ResourcesService {
    engine: Engine,
}

impl ResourcesService {
    pub(crate) fn new(engine: Engine) -> Self {
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
        unary(request, Reach::HostOrReviewer, |_, message| async move {
            let read = ResourceRead::new(message.name, message.page_size, &message.page_token)?;
            let page = self.engine.read_resource(&read).await?;
            Ok(resource_page(read.name, page))
        })
        .await
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn list_resources(
        &self,
        request: Request<pb::ListResourcesRequest>,
    ) -> Result<Response<pb::ListResourcesResponse>, Status> {
        unary(request, Reach::HostOrReviewer, |_, message| async move {
            let listing = ResourceListing::new(message.page_size, message.page_token)?;
            let page = self.engine.list_resources(&listing).await?;
            Ok(page.into())
        })
        .await
    }
}
