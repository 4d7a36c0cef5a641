//! Dispatch (SPEC §6): versioned resources, the receipt log and the types of
//! a commit. The check order itself lives in `State::dispatch`, next to the
//! other operations, so that one critical section covers the whole commit.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use uuid::Uuid;

use crate::canonical::{Fingerprint, Object, Value};
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
/// on every replay.
#[derive(Debug, Clone, PartialEq)]
pub struct CommitResult {
    pub version: u64,
    /// The resource the effect touched (`None` for effect `none`).
    pub resource: Option<String>,
    /// The resource's value after the commit.
    pub value: Option<Value>,
}

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
}

/// Receipts by (host identity, actor, call id): each host and each actor has
/// its own call-id space, so one cannot replay or occupy another's call ids
/// (SPEC §6 step 4). Capped; receipts older than the
/// retention window may be evicted to make room, younger ones never are.
#[derive(Debug, Default)]
pub struct ReceiptLog {
    receipts: Table<Box<StoredReceipt>>,
    /// Oldest first; among receipts of the same millisecond, by key.
    by_age: BTreeSet<(Timestamp, CallKey)>,
}

impl ReceiptLog {
    pub fn len(&self) -> usize {
        self.receipts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.receipts.is_empty()
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

    /// Makes room for one more receipt if the log is full, evicting only
    /// receipts past retention. False when the log is full within the window.
    pub fn make_room(&mut self, now: Timestamp, limits: &Limits) -> bool {
        let retention = u64::try_from(limits.receipt_retention.as_millis()).unwrap_or(u64::MAX);
        while self.receipts.len() >= limits.receipt_capacity {
            let Some((created_at, _)) = self.by_age.first() else {
                return false;
            };
            if now.millis_since(*created_at) < retention {
                return false;
            }
            let Some((_, key)) = self.by_age.pop_first() else {
                return false;
            };
            let (host, actor, call_id) = key.parts();
            let hash = self.hash(host, actor, call_id);
            self.receipts
                .remove(hash, |stored| stored.key.is(host, actor, call_id));
        }
        true
    }

    /// Stores the receipt of a call id; the caller has checked that it has
    /// none yet (Dispatch step 4, under the same lock).
    pub fn insert(&mut self, host: &str, actor: &str, call_id: &str, receipt: Receipt) {
        let hash = self.hash(host, actor, call_id);
        let key = CallKey::new(host, actor, call_id);
        self.by_age.insert((receipt.created_at, key.clone()));
        self.receipts
            .insert_unique(hash, Box::new(StoredReceipt { key, receipt }));
    }
}

/// One resource Dispatch changes, with its own version (scope `resource`).
#[derive(Debug, Clone, PartialEq)]
struct Resource {
    value: Value,
    version: u64,
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

    /// Applies a checked target and bumps the version(s). Copies the value
    /// in (the proposal keeps its own) and a copy of the new value out.
    pub fn apply(&mut self, target: &Target<'_>) -> CommitResult {
        self.global_version += 1;
        let Some(name) = target.resource() else {
            return CommitResult {
                version: self.global_version,
                resource: None,
                value: None,
            };
        };
        let value = match self.resources.get_mut(name) {
            Some(resource) => {
                match (*target, &mut resource.value) {
                    (Target::Set { value, .. }, stored) => stored.clone_from(value),
                    (Target::Append { item, .. }, Value::Array(items)) => {
                        items.push(Value::Object(item.clone()));
                    }
                    _ => {}
                }
                resource.version += 1;
                Some(resource.value.clone())
            }
            None => None,
        };
        CommitResult {
            version: self.version_of(Some(name)),
            resource: Some(name.to_string()),
            value,
        }
    }
}
