//! Dispatch (SPEC §6): versioned resources, the receipt log and the types of
//! a commit. The check order itself lives in `State::dispatch`, next to the
//! other operations, so that one critical section covers the whole commit.

use std::collections::{BTreeMap, BTreeSet, HashMap};

use uuid::Uuid;

use crate::canonical::{Fingerprint, Object, Value};
use crate::clock::Timestamp;
use crate::policy::{Effect, Limits, StatePolicy, VersionScope};

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

/// Receipts by (actor, call id): each actor has its own call-id space, so one
/// actor cannot occupy another's call ids. Capped; receipts older than the
/// retention window may be evicted to make room, younger ones never are.
#[derive(Debug, Default)]
pub struct ReceiptLog {
    receipts: HashMap<(String, String), Receipt>,
    by_age: BTreeSet<(Timestamp, String, String)>,
}

impl ReceiptLog {
    pub fn len(&self) -> usize {
        self.receipts.len()
    }

    pub fn is_empty(&self) -> bool {
        self.receipts.is_empty()
    }

    pub fn get(&self, actor: &str, call_id: &str) -> Option<&Receipt> {
        self.receipts.get(&(actor.to_string(), call_id.to_string()))
    }

    /// Makes room for one more receipt if the log is full, evicting only
    /// receipts past retention. False when the log is full within the window.
    pub fn make_room(&mut self, now: Timestamp, limits: &Limits) -> bool {
        let retention = u64::try_from(limits.receipt_retention.as_millis()).unwrap_or(u64::MAX);
        while self.receipts.len() >= limits.receipt_capacity {
            let Some((created_at, actor, call_id)) = self.by_age.first().cloned() else {
                return false;
            };
            if now.millis_since(created_at) < retention {
                return false;
            }
            self.by_age.pop_first();
            self.receipts.remove(&(actor, call_id));
        }
        true
    }

    pub fn insert(&mut self, actor: &str, call_id: &str, receipt: Receipt) {
        self.by_age
            .insert((receipt.created_at, actor.to_string(), call_id.to_string()));
        self.receipts
            .insert((actor.to_string(), call_id.to_string()), receipt);
    }
}

/// The versioned state that Dispatch changes.
#[derive(Debug, Clone, PartialEq)]
pub struct Resources {
    scope: VersionScope,
    values: BTreeMap<String, Value>,
    /// Per-resource versions (scope `resource`).
    versions: HashMap<String, u64>,
    /// Bumped by every commit; the version in scope `global`, and the one
    /// that effect-`none` tools are checked against in scope `resource`.
    global_version: u64,
}

/// Where an effect lands, resolved from the policy and the arguments.
#[derive(Debug, Clone, PartialEq)]
pub enum Target {
    /// Effect `none`: nothing but the receipt.
    Nothing,
    Set {
        resource: String,
        value: Value,
    },
    Append {
        resource: String,
        item: Value,
    },
}

impl Target {
    pub fn resource(&self) -> Option<&str> {
        match self {
            Target::Nothing => None,
            Target::Set { resource, .. } | Target::Append { resource, .. } => Some(resource),
        }
    }
}

/// Resolves a tool's effect against the proposal's arguments. `Err` names
/// why the target resource cannot be found.
pub fn target(effect: &Effect, arguments: &Object) -> Result<Target, String> {
    match effect {
        Effect::None => Ok(Target::Nothing),
        Effect::Set {
            resource_argument,
            value_argument,
            resources,
        } => {
            let resource = match arguments.get(resource_argument) {
                Some(Value::String(name)) => name.clone(),
                Some(_) => {
                    return Err(format!(
                        "argument {resource_argument:?} must name a resource"
                    ));
                }
                None => return Err(format!("argument {resource_argument:?} is missing")),
            };
            if let Some(allowed) = resources
                && !allowed.contains(&resource)
            {
                return Err(format!("{resource:?} is not a resource this tool may set"));
            }
            let value = arguments
                .get(value_argument)
                .cloned()
                .ok_or_else(|| format!("argument {value_argument:?} is missing"))?;
            Ok(Target::Set { resource, value })
        }
        Effect::Append { resource } => Ok(Target::Append {
            resource: resource.clone(),
            item: Value::Object(arguments.clone()),
        }),
    }
}

impl Resources {
    pub fn new(policy: &StatePolicy) -> Self {
        Resources {
            scope: policy.version_scope,
            values: policy.resources.clone(),
            versions: policy
                .resources
                .keys()
                .map(|name| (name.clone(), 0))
                .collect(),
            global_version: 0,
        }
    }

    /// After a policy reload: resources the new policy declares that do not
    /// exist yet get their initial values; existing values and versions stay.
    pub fn adopt(&mut self, policy: &StatePolicy) {
        for (name, value) in &policy.resources {
            if !self.values.contains_key(name) {
                self.values.insert(name.clone(), value.clone());
                self.versions.insert(name.clone(), 0);
            }
        }
        self.scope = policy.version_scope;
    }

    /// The version a proposal for this target must carry.
    pub fn version_for(&self, target: &Target) -> u64 {
        match (self.scope, target.resource()) {
            (VersionScope::Resource, Some(resource)) => {
                self.versions.get(resource).copied().unwrap_or(0)
            }
            _ => self.global_version,
        }
    }

    /// A resource's value and the version a proposal against it must carry.
    pub fn get(&self, name: &str) -> Option<(&Value, u64)> {
        let value = self.values.get(name)?;
        let version = match self.scope {
            VersionScope::Global => self.global_version,
            VersionScope::Resource => self.versions.get(name).copied().unwrap_or(0),
        };
        Some((value, version))
    }

    /// Checks that the target can be applied; the message says why not.
    pub fn check(&self, target: &Target) -> Result<(), String> {
        match target {
            Target::Nothing => Ok(()),
            Target::Set { resource, .. } => match self.values.contains_key(resource) {
                true => Ok(()),
                false => Err(format!("no resource {resource:?}")),
            },
            Target::Append { resource, .. } => match self.values.get(resource) {
                Some(Value::Array(_)) => Ok(()),
                Some(_) => Err(format!("resource {resource:?} is not a list")),
                None => Err(format!("no resource {resource:?}")),
            },
        }
    }

    /// Applies a checked target and bumps the version(s).
    pub fn apply(&mut self, target: Target) -> CommitResult {
        self.global_version += 1;
        let resource = target.resource().map(str::to_string);
        match target {
            Target::Nothing => {}
            Target::Set { resource, value } => {
                self.values.insert(resource, value);
            }
            Target::Append { resource, item } => {
                if let Some(Value::Array(items)) = self.values.get_mut(&resource) {
                    items.push(item);
                }
            }
        }
        if let Some(name) = &resource
            && let Some(version) = self.versions.get_mut(name)
        {
            *version += 1;
        }
        let version = match (self.scope, &resource) {
            (VersionScope::Resource, Some(name)) => self.versions.get(name).copied().unwrap_or(0),
            _ => self.global_version,
        };
        CommitResult {
            version,
            value: resource
                .as_ref()
                .and_then(|name| self.values.get(name).cloned()),
            resource,
        }
    }
}
