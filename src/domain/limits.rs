//! What one request may ask for, checked where its values become domain
//! values: page sizes and the bytes a page holds, page tokens, reviewer
//! notes. The edge converts a message and calls these constructors; it
//! checks no length or shape itself.
//!
//! Field paths in errors are the request's own (`page_size`, `page_token`),
//! as with [`ids`](crate::domain::ids).

use uuid::Uuid;

use crate::domain::clock::Timestamp;
use crate::domain::error::{Error, Result};
use crate::domain::ids::{MAX_RESOURCE_NAME_LEN, check_resource_name};
use crate::domain::ledger::{ApprovalStatus, ListQuery, PageKey};
use crate::domain::resources::PagePosition;

/// A listing's page size: what a request for 0 gets, and the most it may
/// ask for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PageLimit {
    pub default: u32,
    pub max: u32,
}

impl PageLimit {
    /// The page size a request asks for in `page_size` (0: the default).
    pub fn size(self, requested: u32) -> Result<usize> {
        match requested {
            0 => Ok(self.default as usize),
            size if size <= self.max => Ok(size as usize),
            size => Err(Error::invalid(
                "page_size",
                format!("must be at most {}, got {size}", self.max),
            )),
        }
    }
}

/// Approvals in one `ListApprovals` page.
pub const APPROVALS_PAGE: PageLimit = PageLimit {
    default: 50,
    max: 500,
};
/// Resources in one `ListResources` page.
pub const RESOURCES_PAGE: PageLimit = PageLimit {
    default: 100,
    max: 1000,
};
/// Items of a queue in one `GetResource` page.
pub const QUEUE_PAGE: PageLimit = PageLimit {
    default: 1000,
    max: 10_000,
};

/// About how many bytes one `ListApprovals` or `ListResources` page holds
/// (at least one item): well under the 4 MiB a gRPC client accepts by
/// default.
pub const MAX_PAGE_BYTES: usize = 2 * 1024 * 1024;

/// Longest reviewer comment or reason kept with a decision, in characters.
pub const MAX_NOTE_LEN: usize = 2048;

/// A reviewer's words with a grant (its comment), a denial or a revocation
/// (its reason): at most [`MAX_NOTE_LEN`] characters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note(String);

impl Note {
    /// `field` names the note in the request (`comment`, `reason`).
    pub fn new(field: &str, text: String) -> Result<Note> {
        if text.chars().count() > MAX_NOTE_LEN {
            return Err(Error::invalid(
                field,
                format!("must be at most {MAX_NOTE_LEN} characters"),
            ));
        }
        Ok(Note(text))
    }

    pub fn into_string(self) -> String {
        self.0
    }
}

impl ListQuery {
    /// A `ListApprovals` query as a reviewer sends it: filters (an empty
    /// string is no filter), the page size (0: the default) and the token of
    /// the previous page (empty: the first page). Pages are bounded by
    /// [`MAX_PAGE_BYTES`]; the caller sets the viewer.
    pub fn new(
        status: Option<ApprovalStatus>,
        actor: String,
        tool: String,
        id_prefix: &str,
        page_size: u32,
        page_token: &str,
    ) -> Result<ListQuery> {
        let page_size = APPROVALS_PAGE.size(page_size)?;
        let after = match page_token {
            "" => None,
            token => Some(parse_approval_page_token(token)?),
        };
        check_id_prefix(id_prefix)?;
        // A filter names an actor or a tool as the policy does (an
        // identifier): one that could match nothing is the caller's error.
        for (field, name) in [("actor", &actor), ("tool", &tool)] {
            if !name.is_empty() {
                crate::domain::ids::check_identifier(field, name)?;
            }
        }
        let non_empty = |text: String| (!text.is_empty()).then_some(text);
        Ok(ListQuery {
            status,
            actor: non_empty(actor),
            tool: non_empty(tool),
            id_prefix: non_empty(id_prefix.to_ascii_lowercase()),
            after,
            page_size,
            max_bytes: MAX_PAGE_BYTES,
            ..ListQuery::default()
        })
    }
}

fn check_id_prefix(prefix: &str) -> Result<()> {
    let hex_or_dash = |character: char| character.is_ascii_hexdigit() || character == '-';
    if prefix.len() > 36 || !prefix.chars().all(hex_or_dash) {
        return Err(Error::invalid(
            "approval_id_prefix",
            "must be at most 36 hexadecimal digits and `-` (the start of a UUID)",
        ));
    }
    Ok(())
}

/// A `ListApprovals` page token, `<requested_at millis>.<approval id>`:
/// opaque to clients, stable across inserts.
pub fn approval_page_token(key: PageKey) -> String {
    format!("{}.{}", key.0.0, key.1)
}

fn parse_approval_page_token(token: &str) -> Result<PageKey> {
    let invalid = || {
        Error::invalid(
            "page_token",
            "is not a token from a previous ListApprovals answer",
        )
    };
    let (millis, id) = token.split_once('.').ok_or_else(invalid)?;
    let millis = millis.parse::<u64>().map_err(|_| invalid())?;
    let id = Uuid::parse_str(id).map_err(|_| invalid())?;
    Ok((Timestamp(millis), id))
}

/// Which page of a resource a `GetResource` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceRead {
    pub name: String,
    /// Where a queue's page starts (`None`: its first page, or a value
    /// read whole).
    pub start: Option<PagePosition>,
    pub max_items: usize,
}

impl ResourceRead {
    /// `page_size` 0 is the default; `page_token` empty is the first page.
    pub fn new(name: String, page_size: u32, page_token: &str) -> Result<ResourceRead> {
        check_resource_name("name", &name)?;
        let max_items = QUEUE_PAGE.size(page_size)?;
        let start = parse_queue_page_token(page_token)?;
        Ok(ResourceRead {
            name,
            start,
            max_items,
        })
    }
}

/// A queue's page token: `{replaced}.{index}` (see [`PagePosition`]).
pub fn queue_page_token(position: PagePosition) -> String {
    format!("{}.{}", position.replaced, position.index)
}

fn parse_queue_page_token(token: &str) -> Result<Option<PagePosition>> {
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

/// Which page of resources a `ListResources` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResourceListing {
    /// The last name of the previous page (its token).
    pub after: Option<String>,
    pub page_size: usize,
    pub max_bytes: usize,
}

impl ResourceListing {
    /// `page_size` 0 is the default; `page_token` empty is the first page.
    pub fn new(page_size: u32, page_token: String) -> Result<ResourceListing> {
        let page_size = RESOURCES_PAGE.size(page_size)?;
        if page_token.len() > MAX_RESOURCE_NAME_LEN {
            return Err(Error::invalid(
                "page_token",
                "is not a token from a previous ListResources answer",
            ));
        }
        Ok(ResourceListing {
            after: (!page_token.is_empty()).then_some(page_token),
            page_size,
            max_bytes: MAX_PAGE_BYTES,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_sizes_default_at_zero_and_stop_at_the_max() {
        assert_eq!(APPROVALS_PAGE.size(0), Ok(50));
        assert_eq!(APPROVALS_PAGE.size(500), Ok(500));
        assert_eq!(
            APPROVALS_PAGE.size(501),
            Err(Error::invalid("page_size", "must be at most 500, got 501"))
        );
    }

    #[test]
    fn page_tokens_round_trip() {
        let key = (Timestamp(17), Uuid::nil());
        let query = ListQuery::new(
            None,
            String::new(),
            String::new(),
            "",
            0,
            &approval_page_token(key),
        );
        assert_eq!(query.map(|query| query.after), Ok(Some(key)));
        let position = PagePosition {
            replaced: 3,
            index: 40,
        };
        let read = ResourceRead::new("queue".into(), 0, &queue_page_token(position));
        assert_eq!(read.map(|read| read.start), Ok(Some(position)));
    }

    #[test]
    fn notes_are_counted_in_characters() {
        assert!(Note::new("comment", "é".repeat(MAX_NOTE_LEN)).is_ok());
        assert_eq!(
            Note::new("reason", "a".repeat(MAX_NOTE_LEN + 1)),
            Err(Error::invalid("reason", "must be at most 2048 characters"))
        );
    }
}
