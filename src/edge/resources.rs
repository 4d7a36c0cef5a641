//! `Resources` handlers: the versioned state, readable by hosts and reviewers.
//! A queue is read a page at a time, each page bounded in items and bytes.

use tonic::{Request, Response, Status};

use crate::domain::decision::ANSWER_OVERHEAD_BYTES;
use crate::domain::error::Error;
use crate::domain::resources::PagePosition;
use crate::edge::auth::{Caller, Reach};
use crate::engine::Engine;
use crate::pb;
use crate::pb::resources_server::Resources;

/// Longest resource name (as in the policy).
pub(crate) const MAX_RESOURCE_NAME_LEN: usize = 64;
/// `ListResources` page size when the request says 0, and the largest.
pub(crate) const DEFAULT_RESOURCE_PAGE: u32 = 100;
pub(crate) const MAX_RESOURCE_PAGE: u32 = 1000;
/// About how many bytes of values one `ListResources` page holds (at least
/// one resource).
pub(crate) const MAX_RESOURCE_PAGE_BYTES: usize = 2 * 1024 * 1024;

/// Most items in one page of a queue, and the default.
pub(crate) const MAX_RESOURCE_PAGE_SIZE: u32 = 10_000;
pub(crate) const DEFAULT_RESOURCE_PAGE_SIZE: u32 = 1000;

#[derive(Debug, Clone)]
pub(crate) struct ResourcesService {
    engine: Engine,
}

impl ResourcesService {
    pub(crate) fn new(engine: Engine) -> Self {
        ResourcesService { engine }
    }
}

/// A page token: `{replaced}.{index}` (see [`PagePosition`]).
fn page_token(position: PagePosition) -> String {
    format!("{}.{}", position.replaced, position.index)
}

fn parse_page_token(token: &str) -> Result<Option<PagePosition>, Error> {
    if token.is_empty() {
        return Ok(None);
    }
    let invalid = || Error::invalid("page_token", "is not a page token this server issued");
    let (replaced, index) = token.split_once('.').ok_or_else(invalid)?;
    let digits = |text: &str| !text.is_empty() && text.bytes().all(|byte| byte.is_ascii_digit());
    if !digits(replaced) || !digits(index) {
        return Err(invalid());
    }
    Ok(Some(PagePosition {
        replaced: replaced.parse().map_err(|_| invalid())?,
        index: index.parse().map_err(|_| invalid())?,
    }))
}

#[tonic::async_trait]
impl Resources for ResourcesService {
    #[tracing::instrument(level = "debug", skip_all)]
    async fn get_resource(
        &self,
        request: Request<pb::GetResourceRequest>,
    ) -> Result<Response<pb::Resource>, Status> {
        Caller::require(&request, Reach::HostOrReviewer)?;
        let request = request.into_inner();
        let name = request.name;
        if name.is_empty() || name.len() > MAX_RESOURCE_NAME_LEN {
            return Err(Error::invalid(
                "name",
                format!("must be 1 to {MAX_RESOURCE_NAME_LEN} bytes"),
            )
            .into());
        }
        let page_size = match request.page_size {
            0 => DEFAULT_RESOURCE_PAGE_SIZE,
            size if size <= MAX_RESOURCE_PAGE_SIZE => size,
            size => {
                return Err(Error::invalid(
                    "page_size",
                    format!("must be at most {MAX_RESOURCE_PAGE_SIZE}, got {size}"),
                )
                .into());
            }
        };
        let start = parse_page_token(&request.page_token)?;
        let max_bytes = self
            .engine
            .policy()
            .server
            .max_message_bytes
            .saturating_sub(ANSWER_OVERHEAD_BYTES);
        let page = self
            .engine
            .resource_page(&name, start, page_size as usize, max_bytes)?;
        Ok(Response::new(pb::Resource {
            name,
            value_json: page.value_json,
            version: page.version,
            next_page_token: page.next.map(page_token).unwrap_or_default(),
            item_count: page.item_count,
            first_index: page.first_index,
        }))
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn list_resources(
        &self,
        request: Request<pb::ListResourcesRequest>,
    ) -> Result<Response<pb::ListResourcesResponse>, Status> {
        Caller::require(&request, Reach::HostOrReviewer)?;
        let request = request.into_inner();
        let page_size = match request.page_size {
            0 => DEFAULT_RESOURCE_PAGE,
            size if size <= MAX_RESOURCE_PAGE => size,
            size => {
                return Err(crate::domain::error::Error::invalid(
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
                return Err(crate::domain::error::Error::invalid(
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
                .map(|listed| pb::Resource {
                    name: listed.name,
                    value_json: listed.value_json,
                    version: listed.version,
                    // Listed whole: a queue's first page is all of it.
                    next_page_token: String::new(),
                    item_count: listed.item_count,
                    first_index: 0,
                })
                .collect(),
            next_page_token: page.next.unwrap_or_default(),
        }))
    }
}
