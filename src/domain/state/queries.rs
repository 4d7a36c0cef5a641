//! Reads: resources, sessions, resource listings.

use crate::domain::canonical::Value;
use crate::domain::error::{Error, Result};
use crate::domain::limits::QUEUE_PAGE;
use crate::domain::resources::{PageError, PagePosition, ResourcePage};
use crate::domain::session::SessionSummary;

use super::*;

impl State {
    /// A resource's value and version (GetResource).
    pub fn resource(&self, name: &str) -> Result<(Value, u64)> {
        self.resources
            .get(name)
            .map(|(value, version)| (value.clone(), version))
            .ok_or_else(|| Error::NotFound(format!("no resource {name:?}")))
    }

    /// One page of a resource (GetResource): a queue a page at a time.
    pub fn resource_page(
        &self,
        name: &str,
        start: Option<PagePosition>,
        max_items: usize,
        max_bytes: usize,
    ) -> Result<ResourcePage> {
        self.resources
            .page(name, start, max_items, max_bytes)
            .map_err(|error| match error {
                PageError::NotFound => Error::NotFound(format!("no resource {name:?}")),
                PageError::NotAQueue => Error::invalid(
                    "page_token",
                    format!("resource {name:?} is not a queue; it is read whole, without a token"),
                ),
                PageError::BadIndex => Error::invalid(
                    "page_token",
                    "is not a page token this server issued for this resource",
                ),
                PageError::Replaced => Error::FailedPrecondition(format!(
                    "resource {name:?} was replaced since the page token was issued; read it \
                     again from the first page"
                )),
            })
    }

    /// A session of host `host` (GetSession).
    pub fn session(
        &self,
        host: &str,
        session_id: &str,
        decision_cost: u64,
    ) -> Result<SessionSummary> {
        self.sessions
            .get(host, session_id)
            .map(|session| session.summary(decision_cost))
            .ok_or_else(|| Error::NotFound(format!("no session {session_id:?}")))
    }

    /// Resources in name order after `after`: at most `page_size` of them
    /// and about `max_bytes` (at least one). Each is read as GetResource
    /// reads its first page: a queue (which grows without a bound of its
    /// own) with at most GetResource's default page of its items
    /// ([`QUEUE_PAGE`]), within what
    /// is left of `max_bytes`, and a token to read on with GetResource;
    /// nothing is rendered whole under the lock. The name to continue
    /// after, when more follow.
    pub fn list_resources(
        &self,
        after: Option<&str>,
        page_size: usize,
        max_bytes: usize,
    ) -> ResourceList {
        let mut page: Vec<ListedResource> = Vec::new();
        let mut bytes = 0usize;
        for name in self.resources.names() {
            if after.is_some_and(|after| name <= after) {
                continue;
            }
            let room = max_bytes.saturating_sub(bytes);
            let items = QUEUE_PAGE.default as usize;
            let listed = match self.resources.page(name, None, items, room) {
                Ok(listed) => listed,
                Err(_) => continue,
            };
            let size = name.len() + listed.value_json.len();
            if page.len() == page_size || (!page.is_empty() && size > room) {
                let next = page.last().map(|listed| listed.name.clone());
                return ResourceList {
                    resources: page,
                    next,
                };
            }
            bytes = bytes.saturating_add(size);
            page.push(ListedResource {
                name: name.to_string(),
                page: listed,
            });
        }
        ResourceList {
            resources: page,
            next: None,
        }
    }
}
