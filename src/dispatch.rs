//! Dispatch (SPEC §6): versioned resources, the receipt log and the types of
//! a commit. The check order itself lives in `State::dispatch`, next to the
//! other operations, so that one critical section covers the whole commit.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use uuid::Uuid;

use crate::canonical::{self, Fingerprint, Object, Value};
use crate::clock::Timestamp;
use crate::policy::{Effect, Limits, StatePolicy, VersionScope};
use crate::state::table::Table;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DispatchStatus {
    Ok,
    Forbidden,
    UnknownTool,
    Denied,
    CallIdConflict,
    StaleVersion,
    ApprovalRequired,
    MissingResource,
    LogFull,
}

impl DispatchStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            DispatchStatus::Ok => "ok",
            DispatchStatus::Forbidden => "forbidden",
            DispatchStatus::UnknownTool => "unknown-tool",
            DispatchStatus::Denied => "denied",
            DispatchStatus::CallIdConflict => "call-id-conflict",
            DispatchStatus::StaleVersion => "stale-version",
            DispatchStatus::ApprovalRequired => "approval-required",
            DispatchStatus::MissingResource => "missing-resource",
            DispatchStatus::LogFull => "log-full",
        }
    }
}

/// What a commit produced; stored in the receipt and returned (as a copy)
/// on every replay. It holds what this commit wrote, never more: for effect
/// `set` the value set, for `append` the item appended and its index, so
/// that a receipt and an answer stay as small as the request that made them
/// (a queue's whole value is read, a page at a time, with GetResource).
#[derive(Debug, Clone, PartialEq)]
pub struct CommitResult {
    pub version: u64,
    /// The resource the effect touched (`None` for effect `none`).
    pub resource: Option<String>,
    /// `set`: the resource's value after the commit; `append`: the item
    /// appended.
    pub value: Option<Value>,
    /// `append`: the item's index in the queue (0 for the first item).
    pub appended_index: Option<u64>,
}

/// Upper bound of what a Dispatch answer carries besides the value's JSON
/// text: status, reason, message (names are at most 64 bytes), fingerprint,
/// version, resource name, receipt id, approval id, policy revision, append
/// index and protobuf framing. A commit is refused when this plus the
/// value's canonical JSON would exceed the message limit, so that every
/// committed answer (and every replay of it) can be sent.
pub const ANSWER_OVERHEAD_BYTES: usize = 1024;

/// The answer to Dispatch.
#[derive(Debug, Clone, PartialEq)]
pub struct Dispatched {
    pub status: DispatchStatus,
    /// Stable kebab-case reason (for DENIED: the Decide reason).
    pub reason: &'static str,
    pub message: String,
    pub fingerprint: Fingerprint,
    /// For OK and replays: the commit's result; for STALE_VERSION: only the
    /// current version.
    pub result: Option<CommitResult>,
    pub receipt_id: Option<Uuid>,
    pub replayed: bool,
    pub approval_id: Option<Uuid>,
}

impl Dispatched {
    pub fn refused(
        status: DispatchStatus,
        reason: &'static str,
        message: String,
        fingerprint: Fingerprint,
    ) -> Self {
        Dispatched {
            status,
            reason,
            message,
            fingerprint,
            result: None,
            receipt_id: None,
            replayed: false,
            approval_id: None,
        }
    }
}

/// A stored receipt: the fingerprint it was made for and a copy of the result.
#[derive(Debug, Clone, PartialEq)]
pub struct Receipt {
    pub id: Uuid,
    pub fingerprint: Fingerprint,
    pub result: CommitResult,
    pub created_at: Timestamp,
}

/// Estimated heap and inline bytes of a value: the allocations its strings,
/// arrays and objects hold. An estimate for the byte budget, not a
/// measurement: allocator rounding is not counted.
pub fn value_bytes(value: &Value) -> usize {
    let inline = std::mem::size_of::<Value>();
    match value {
        Value::Null | Value::Bool(_) | Value::Number(_) => inline,
        Value::String(text) => inline + text.len(),
        Value::Array(items) => inline + items.iter().map(value_bytes).sum::<usize>(),
        Value::Object(object) => {
            inline
                + object
                    .iter()
                    .map(|(key, member)| {
                        std::mem::size_of::<String>() + key.len() + value_bytes(member)
                    })
                    .sum::<usize>()
        }
    }
}

/// What one receipt costs besides its value and key text: the boxed
/// record, its table slot and its entry in the age index.
const RECEIPT_OVERHEAD_BYTES: usize = 256;

/// The bytes a receipt holds under the byte budget.
pub fn receipt_bytes(
    host: &str,
    actor: &str,
    call_id: &str,
    resource: Option<&str>,
    value: Option<&Value>,
) -> usize {
    RECEIPT_OVERHEAD_BYTES
        + host.len()
        + actor.len()
        + call_id.len()
        + resource.map_or(0, str::len)
        + value.map_or(0, value_bytes)
}

/// A host identity, an actor's name and a call id in one shared allocation
/// (the log's table and its age index hold the same one), ordered as the
/// triple.
#[derive(Debug, Clone)]
struct CallKey {
    text: Arc<str>,
    host_len: usize,
    actor_len: usize,
}

impl CallKey {
    fn new(host: &str, actor: &str, call_id: &str) -> Self {
        let mut text = String::with_capacity(host.len() + actor.len() + call_id.len());
        text.push_str(host);
        text.push_str(actor);
        text.push_str(call_id);
        CallKey {
            text: Arc::from(text),
            host_len: host.len(),
            actor_len: actor.len(),
        }
    }

    fn host(&self) -> &str {
        self.text.get(..self.host_len).unwrap_or_default()
    }

    fn actor(&self) -> &str {
        self.text
            .get(self.host_len..self.host_len + self.actor_len)
            .unwrap_or_default()
    }

    fn call_id(&self) -> &str {
        self.text
            .get(self.host_len + self.actor_len..)
            .unwrap_or_default()
    }

    fn parts(&self) -> (&str, &str, &str) {
        (self.host(), self.actor(), self.call_id())
    }

    fn is(&self, host: &str, actor: &str, call_id: &str) -> bool {
        self.parts() == (host, actor, call_id)
    }
}

impl PartialEq for CallKey {
    fn eq(&self, other: &Self) -> bool {
        self.parts() == other.parts()
    }
}

impl Eq for CallKey {}

impl Ord for CallKey {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.parts().cmp(&other.parts())
    }
}

impl PartialOrd for CallKey {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

/// A receipt under its key, boxed in the log so that growing the table
/// moves pointers only.
#[derive(Debug)]
struct StoredReceipt {
    key: CallKey,
    receipt: Receipt,
    /// What it counts under the byte budget ([`receipt_bytes`]).
    bytes: usize,
}

/// Receipts by (host identity, actor, call id): each host and each actor has
/// its own call-id space, so one cannot replay or occupy another's call ids
/// (SPEC §6 step 4). Capped in count and counted in bytes; receipts older
/// than the retention window may be evicted to make room, younger ones never
/// are (exactly-once needs them).
#[derive(Debug, Default)]
pub struct ReceiptLog {
    receipts: Table<Box<StoredReceipt>>,
    /// Oldest first; among receipts of the same millisecond, by key.
    by_age: BTreeSet<(Timestamp, CallKey)>,
    /// Σ bytes of the stored receipts.
    bytes: usize,
}

fn retention_millis(limits: &Limits) -> u64 {
    u64::try_from(limits.receipt_retention.as_millis()).unwrap_or(u64::MAX)
}

impl ReceiptLog {
    pub fn len(&self) -> usize {
        self.receipts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.receipts.is_empty()
    }

    /// What the stored receipts count under the byte budget.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// The hash a key is found under, from borrowed parts (no allocation).
    fn hash(&self, host: &str, actor: &str, call_id: &str) -> u64 {
        self.receipts.hash(&(host, actor, call_id))
    }

    pub fn get(&self, host: &str, actor: &str, call_id: &str) -> Option<&Receipt> {
        self.receipts
            .find(self.hash(host, actor, call_id), |stored| {
                stored.key.is(host, actor, call_id)
            })
            .map(|stored| &stored.receipt)
    }

    /// Evicts the oldest receipt if it is past retention; the bytes freed.
    fn evict_oldest_past_retention(&mut self, now: Timestamp, limits: &Limits) -> Option<usize> {
        let (created_at, _) = self.by_age.first()?;
        if now.millis_since(*created_at) < retention_millis(limits) {
            return None;
        }
        let (_, key) = self.by_age.pop_first()?;
        let (host, actor, call_id) = key.parts();
        let hash = self.hash(host, actor, call_id);
        let stored = self
            .receipts
            .remove(hash, |stored| stored.key.is(host, actor, call_id))?;
        self.bytes = self.bytes.saturating_sub(stored.bytes);
        Some(stored.bytes)
    }

    /// Makes room for one more receipt if the log is full, evicting only
    /// receipts past retention. False when the log is full within the window.
    pub fn make_room(&mut self, now: Timestamp, limits: &Limits) -> bool {
        while self.receipts.len() >= limits.receipt_capacity {
            if self.evict_oldest_past_retention(now, limits).is_none() {
                return false;
            }
        }
        true
    }

    /// Bytes that evicting receipts past retention would free, counted
    /// oldest first and only until `enough` is reached (changes nothing).
    pub fn evictable_bytes(&self, now: Timestamp, limits: &Limits, enough: usize) -> usize {
        let retention = retention_millis(limits);
        let mut total = 0usize;
        for (created_at, key) in &self.by_age {
            if total >= enough || now.millis_since(*created_at) < retention {
                break;
            }
            let (host, actor, call_id) = key.parts();
            let hash = self.hash(host, actor, call_id);
            if let Some(stored) = self
                .receipts
                .find(hash, |stored| stored.key.is(host, actor, call_id))
            {
                total = total.saturating_add(stored.bytes);
            }
        }
        total
    }

    /// Evicts receipts past retention, oldest first, until `needed` bytes
    /// are freed or none is left; the bytes freed.
    pub fn evict_bytes(&mut self, now: Timestamp, limits: &Limits, needed: usize) -> usize {
        let mut freed = 0usize;
        while freed < needed {
            match self.evict_oldest_past_retention(now, limits) {
                Some(bytes) => freed = freed.saturating_add(bytes),
                None => break,
            }
        }
        freed
    }

    /// Stores the receipt of a call id; the caller has checked that it has
    /// none yet (Dispatch step 4, under the same lock) and made room.
    pub fn insert(&mut self, host: &str, actor: &str, call_id: &str, receipt: Receipt) {
        let hash = self.hash(host, actor, call_id);
        let key = CallKey::new(host, actor, call_id);
        let bytes = receipt_bytes(
            host,
            actor,
            call_id,
            receipt.result.resource.as_deref(),
            receipt.result.value.as_ref(),
        );
        self.bytes = self.bytes.saturating_add(bytes);
        self.by_age.insert((receipt.created_at, key.clone()));
        self.receipts.insert_unique(
            hash,
            Box::new(StoredReceipt {
                key,
                receipt,
                bytes,
            }),
        );
    }
}

/// One resource Dispatch changes, with its own version (scope `resource`).
#[derive(Debug, Clone, PartialEq)]
struct Resource {
    value: Value,
    version: u64,
    /// Bumped whenever the whole value is replaced (effect `set`), so that a
    /// page token of a queue stops working once the items it counted are gone.
    replaced: u64,
}

/// The versioned state that Dispatch changes.
#[derive(Debug, Clone, PartialEq)]
pub struct Resources {
    scope: VersionScope,
    /// The resources the policy declared (a handful): one lookup gives the
    /// value and the per-resource version.
    resources: BTreeMap<String, Resource>,
    /// Bumped by every commit; the version in scope `global`, and the one
    /// that effect-`none` tools are checked against in scope `resource`.
    global_version: u64,
}

/// Where an effect lands, resolved from the policy and the arguments. It
/// borrows from them: nothing is copied until the commit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Target<'a> {
    /// Effect `none`: nothing but the receipt.
    Nothing,
    Set {
        resource: &'a str,
        value: &'a Value,
    },
    /// The arguments, pushed as an object.
    Append {
        resource: &'a str,
        item: &'a Object,
    },
}

impl<'a> Target<'a> {
    pub fn resource(&self) -> Option<&'a str> {
        match *self {
            Target::Nothing => None,
            Target::Set { resource, .. } | Target::Append { resource, .. } => Some(resource),
        }
    }
}

/// Resolves a tool's effect against the proposal's arguments. `Err` names
/// why the target resource cannot be found.
pub fn target<'a>(effect: &'a Effect, arguments: &'a Object) -> Result<Target<'a>, String> {
    match effect {
        Effect::None => Ok(Target::Nothing),
        Effect::Set {
            resource_argument,
            value_argument,
            resources,
        } => {
            let resource = match arguments.get(resource_argument) {
                Some(Value::String(name)) => name.as_str(),
                Some(_) => {
                    return Err(format!(
                        "argument {resource_argument:?} must name a resource"
                    ));
                }
                None => return Err(format!("argument {resource_argument:?} is missing")),
            };
            if let Some(allowed) = resources
                && !allowed.iter().any(|name| name == resource)
            {
                return Err(format!("{resource:?} is not a resource this tool may set"));
            }
            let value = arguments
                .get(value_argument)
                .ok_or_else(|| format!("argument {value_argument:?} is missing"))?;
            Ok(Target::Set { resource, value })
        }
        Effect::Append { resource } => Ok(Target::Append {
            resource,
            item: arguments,
        }),
    }
}

impl Resources {
    pub fn new(policy: &StatePolicy) -> Self {
        Resources {
            scope: policy.version_scope,
            resources: policy
                .resources
                .iter()
                .map(|(name, value)| {
                    let resource = Resource {
                        value: value.clone(),
                        version: 0,
                        replaced: 0,
                    };
                    (name.clone(), resource)
                })
                .collect(),
            global_version: 0,
        }
    }

    /// After a policy reload: resources the new policy declares that do not
    /// exist yet get their initial values; existing values and versions stay.
    pub fn adopt(&mut self, policy: &StatePolicy) {
        for (name, value) in &policy.resources {
            if !self.resources.contains_key(name) {
                let resource = Resource {
                    value: value.clone(),
                    version: 0,
                    replaced: 0,
                };
                self.resources.insert(name.clone(), resource);
            }
        }
        self.scope = policy.version_scope;
    }

    /// The version in force for a resource (or for effect `none`).
    fn version_of(&self, resource: Option<&str>) -> u64 {
        match (self.scope, resource) {
            (VersionScope::Resource, Some(name)) => self
                .resources
                .get(name)
                .map_or(0, |resource| resource.version),
            _ => self.global_version,
        }
    }

    /// The version a proposal for this target must carry.
    pub fn version_for(&self, target: &Target<'_>) -> u64 {
        self.version_of(target.resource())
    }

    /// Every resource name, in order.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.resources.keys().map(String::as_str)
    }

    /// A resource's value and the version a proposal against it must carry.
    pub fn get(&self, name: &str) -> Option<(&Value, u64)> {
        let resource = self.resources.get(name)?;
        let version = match self.scope {
            VersionScope::Global => self.global_version,
            VersionScope::Resource => resource.version,
        };
        Some((&resource.value, version))
    }

    /// Checks that the target can be applied; the message says why not.
    pub fn check(&self, target: &Target<'_>) -> Result<(), String> {
        match *target {
            Target::Nothing => Ok(()),
            Target::Set { resource, .. } => match self.resources.contains_key(resource) {
                true => Ok(()),
                false => Err(format!("no resource {resource:?}")),
            },
            Target::Append { resource, .. } => match self.resources.get(resource) {
                Some(Resource {
                    value: Value::Array(_),
                    ..
                }) => Ok(()),
                Some(_) => Err(format!("resource {resource:?} is not a list")),
                None => Err(format!("no resource {resource:?}")),
            },
        }
    }

    /// A copy of what the answer to a commit of `target` carries: the value
    /// set, or the item appended. Made before the commit, so that its size
    /// can refuse the commit (see [`ANSWER_OVERHEAD_BYTES`]).
    pub fn carried_value(target: &Target<'_>) -> Option<Value> {
        match *target {
            Target::Nothing => None,
            Target::Set { value, .. } => Some(value.clone()),
            Target::Append { item, .. } => Some(Value::Object(item.clone())),
        }
    }

    /// Applies a checked target and bumps the version(s). `carried` is
    /// [`Resources::carried_value`] of the same target: stored in the
    /// resource and returned in the result. Amortised O(size of the change):
    /// an append never copies the queue.
    pub fn apply(&mut self, target: &Target<'_>, carried: Option<Value>) -> CommitResult {
        self.global_version += 1;
        let Some(name) = target.resource() else {
            return CommitResult {
                version: self.global_version,
                resource: None,
                value: None,
                appended_index: None,
            };
        };
        let mut appended_index = None;
        if let (Some(resource), Some(carried)) = (self.resources.get_mut(name), carried.as_ref()) {
            match (*target, &mut resource.value) {
                (Target::Set { .. }, stored) => {
                    stored.clone_from(carried);
                    resource.replaced += 1;
                }
                (Target::Append { .. }, Value::Array(items)) => {
                    appended_index = u64::try_from(items.len()).ok();
                    items.push(carried.clone());
                }
                _ => {}
            }
            resource.version += 1;
        }
        CommitResult {
            version: self.version_of(Some(name)),
            resource: Some(name.to_string()),
            value: carried,
            appended_index,
        }
    }

    /// One page of a resource (GetResource). A queue (an array) is read
    /// from `start` on, at most `max_items` items and `max_bytes` bytes of
    /// JSON text, but always at least one item so that paging progresses;
    /// any other value is read whole and has no pages.
    pub fn page(
        &self,
        name: &str,
        start: Option<PagePosition>,
        max_items: usize,
        max_bytes: usize,
    ) -> Result<ResourcePage, PageError> {
        let resource = self.resources.get(name).ok_or(PageError::NotFound)?;
        let version = match self.scope {
            VersionScope::Global => self.global_version,
            VersionScope::Resource => resource.version,
        };
        let Value::Array(items) = &resource.value else {
            if start.is_some() {
                return Err(PageError::NotAQueue);
            }
            return Ok(ResourcePage {
                value_json: canonical::to_canonical(&resource.value),
                version,
                item_count: None,
                first_index: 0,
                next: None,
            });
        };
        let first = match start {
            None => 0,
            Some(position) if position.replaced != resource.replaced => {
                return Err(PageError::Replaced);
            }
            Some(position) => usize::try_from(position.index)
                .ok()
                .filter(|index| *index <= items.len())
                .ok_or(PageError::BadIndex)?,
        };
        let mut value_json = String::from("[");
        let mut end = first;
        let mut item_json = String::new();
        for item in items.iter().skip(first).take(max_items) {
            item_json.clear();
            canonical::write_canonical(item, &mut item_json);
            // `[`, `]` and a comma per item besides the text.
            if end > first && value_json.len() + item_json.len() + 2 > max_bytes {
                break;
            }
            if end > first {
                value_json.push(',');
            }
            value_json.push_str(&item_json);
            end += 1;
        }
        value_json.push(']');
        let next = (end < items.len()).then_some(PagePosition {
            replaced: resource.replaced,
            index: end as u64,
        });
        Ok(ResourcePage {
            value_json,
            version,
            item_count: Some(items.len() as u64),
            first_index: first as u64,
            next,
        })
    }
}

/// Where the next page of a queue starts: the item index, valid while the
/// queue has not been replaced since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PagePosition {
    pub replaced: u64,
    pub index: u64,
}

/// One page of a resource's value.
#[derive(Debug, Clone, PartialEq)]
pub struct ResourcePage {
    /// Canonical JSON: the whole value, or for a queue a JSON array of the
    /// page's items.
    pub value_json: String,
    /// The version a proposal against this resource must carry.
    pub version: u64,
    /// For a queue: how many items it holds.
    pub item_count: Option<u64>,
    /// For a queue: the index of the page's first item.
    pub first_index: u64,
    /// Set when more items follow.
    pub next: Option<PagePosition>,
}

/// Why a page cannot be read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PageError {
    NotFound,
    /// A page position for a value that is not a queue.
    NotAQueue,
    /// The queue was replaced (effect `set`) since the position was issued.
    Replaced,
    /// A position past the end of the queue.
    BadIndex,
}
