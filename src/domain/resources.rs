//! Versioned resources (SPEC §6): their values and versions, an effect's target, the commit and paging.

use std::collections::BTreeMap;

use crate::domain::canonical::{self, Object, Value};
use crate::domain::error::{Error, Result, first_chars};
use crate::domain::ids::MAX_RESOURCE_NAME_LEN;
use crate::domain::policy::{Effect, StatePolicy, Tool, VersionScope};
use crate::domain::proposal;
use crate::domain::records::{self, Change, Journal, Kind, Record};

/// What a commit produced; stored in the receipt and returned (as a copy)
/// on every replay. It holds what this commit wrote, never more: for effect
/// `set` the value set, for `append` the item appended and its index, so
/// that a receipt and an answer stay as small as the request that made them
/// (a queue's whole value is read, a page at a time, with GetResource).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
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
    /// Σ [`value_bytes`] of the items of every list: what appends grow,
    /// counted under the state's byte budget (a resource's other values
    /// are bounded by the policy's resources and the message limit).
    items_bytes: usize,
    /// Resources written since the state last took the changes.
    journal: Journal,
}

/// Σ [`value_bytes`] of a list's items (0 for a value that is not a list).
fn items_bytes(value: &Value) -> usize {
    match value {
        Value::Array(items) => items_bytes_of(items),
        _ => 0,
    }
}

fn items_bytes_of(items: &[Value]) -> usize {
    items.iter().map(value_bytes).sum()
}

/// `count` less `bytes` of items it holds (never below 0: the count only
/// ever holds what was added to it).
fn less(count: usize, bytes: usize) -> usize {
    debug_assert!(count >= bytes, "list items counted out of step");
    count.saturating_sub(bytes)
}

/// A resource as it is stored. A list's items are records of their own
/// ([`Kind::QueueItem`]), so that an append writes one item, not the queue.
#[derive(serde::Serialize, serde::Deserialize)]
struct ResourceRecord {
    version: u64,
    replaced: u64,
    /// The value, unless it is a list.
    value: Option<Value>,
}

/// A stored resource record, decoded ([`decode_resource`]).
pub struct StoredResource(ResourceRecord);

/// The name and record of a stored resource of this key and value.
pub fn decode_resource(key: &[u8], value: &[u8]) -> Result<(String, StoredResource)> {
    let name = String::from_utf8(key.to_vec()).map_err(|_| records::corrupt_key(Kind::Resource))?;
    let record = records::decode_value(Kind::Resource, value)?;
    Ok((name, StoredResource(record)))
}

/// The name of a resource of this key.
pub fn decode_resource_key(key: &[u8]) -> Result<String> {
    String::from_utf8(key.to_vec()).map_err(|_| records::corrupt_key(Kind::Resource))
}

/// The queue items one batch of changes writes and drops, per resource and
/// index, the last change to each index winning; applied together by
/// [`Resources::apply_items`].
#[derive(Debug, Default)]
pub struct QueueItemChanges {
    items: BTreeMap<String, BTreeMap<usize, Option<Value>>>,
}

impl QueueItemChanges {
    /// An item written (decoded now: a corrupt one fails here).
    pub fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        let (name, index) = item_parts(key).ok_or_else(|| records::corrupt_key(Kind::QueueItem))?;
        let item = records::decode_value(Kind::QueueItem, value)?;
        self.items
            .entry(name)
            .or_default()
            .insert(index, Some(item));
        Ok(())
    }

    /// An item dropped.
    pub fn delete(&mut self, key: &[u8]) -> Result<()> {
        let (name, index) = item_parts(key).ok_or_else(|| records::corrupt_key(Kind::QueueItem))?;
        self.items.entry(name).or_default().insert(index, None);
        Ok(())
    }

    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

/// The meta record of the global version.
const GLOBAL_VERSION_KEY: &[u8] = b"global_version";
/// The meta record of the scope the versions are kept under.
const SCOPE_KEY: &[u8] = b"version_scope";

fn scope_name(scope: VersionScope) -> &'static str {
    match scope {
        VersionScope::Global => "global",
        VersionScope::Resource => "resource",
    }
}

fn item_key(name: &str, index: usize) -> Vec<u8> {
    records::key(&[name.as_bytes(), &(index as u64).to_be_bytes()])
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
                return Err(format!(
                    "{} is not a resource this tool may set",
                    shown(resource)
                ));
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
            items_bytes: policy.resources.values().map(items_bytes).sum(),
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
            journal: Journal::default(),
        }
    }

    /// Takes the policy's version scope on, the versions having been kept
    /// under `kept` until now. From `global` to `resource`, every
    /// resource's own version (a count of its commits, below the global
    /// version) is raised to the global version, at least any version a
    /// proposal against it could have carried: a version never goes back,
    /// or an old proposal (a call id whose receipt is gone, a grant of a
    /// stale one) would be valid again and commit twice. The scope is
    /// journaled when it is not what the store holds, so that a restart
    /// knows what the versions were kept under.
    pub fn take_scope(&mut self, kept: Option<VersionScope>, scope: VersionScope) {
        if kept.unwrap_or(VersionScope::Global) == VersionScope::Global
            && scope == VersionScope::Resource
        {
            let global = self.global_version;
            let behind: Vec<String> = self
                .resources
                .iter()
                .filter(|(_, resource)| resource.version < global)
                .map(|(name, _)| name.clone())
                .collect();
            for name in behind {
                if let Some(resource) = self.resources.get_mut(&name) {
                    resource.version = global;
                }
                self.journal_resource(&name, false);
            }
        }
        if kept != Some(scope) {
            self.journal
                .put(Kind::Meta, SCOPE_KEY.to_vec(), &scope_name(scope));
        }
        self.scope = scope;
    }

    /// The scope a meta record says the versions were kept under, if it is
    /// that record (recovery).
    pub fn stored_scope(record: &Record) -> Result<Option<VersionScope>> {
        if record.key != SCOPE_KEY {
            return Ok(None);
        }
        match records::decode::<String>(record)?.as_str() {
            "global" => Ok(Some(VersionScope::Global)),
            "resource" => Ok(Some(VersionScope::Resource)),
            other => Err(Error::Internal(format!(
                "the store holds a version scope {other:?} this toolgate does not know"
            ))),
        }
    }

    /// After a policy reload: resources the new policy declares that do not
    /// exist yet get their initial values; existing values and versions stay
    /// (raised to the global version when the scope becomes `resource`).
    pub fn adopt(&mut self, policy: &StatePolicy) {
        for (name, value) in &policy.resources {
            if !self.resources.contains_key(name) {
                let resource = Resource {
                    value: value.clone(),
                    version: 0,
                    replaced: 0,
                };
                self.items_bytes += items_bytes(value);
                self.resources.insert(name.clone(), resource);
                self.journal_resource(name, true);
            }
        }
        if self.scope != policy.version_scope {
            self.take_scope(Some(self.scope), policy.version_scope);
        }
    }

    /// Journals a resource's record, and every item of a list when
    /// `with_items`.
    fn journal_resource(&mut self, name: &str, with_items: bool) {
        if !self.journal.is_on() {
            return;
        }
        let Some(resource) = self.resources.get(name) else {
            return;
        };
        let record = ResourceRecord {
            version: resource.version,
            replaced: resource.replaced,
            value: match &resource.value {
                Value::Array(_) => None,
                value => Some(value.clone()),
            },
        };
        self.journal
            .put(Kind::Resource, name.as_bytes().to_vec(), &record);
        if let (true, Value::Array(items)) = (with_items, &resource.value) {
            for (index, item) in items.iter().enumerate() {
                self.journal
                    .put(Kind::QueueItem, item_key(name, index), item);
            }
        }
    }

    /// The resources of the policy, overlaid with the stored ones
    /// (recovery). A resource the store does not hold yet keeps the
    /// policy's initial value and is journaled, so that the next commit
    /// stores it and a later policy cannot change it behind a restart.
    pub fn restore(policy: &StatePolicy, stored: &[Record], items: &[Record]) -> Result<Self> {
        let mut restored = Resources::new(policy);
        for record in stored {
            let (name, stored) = decode_resource(&record.key, &record.value)?;
            // The store's record replaces the policy's value, items and all.
            if let Some(initial) = restored.resources.remove(&name) {
                restored.forget_items(items_bytes(&initial.value));
            }
            restored.put_resource(name, stored);
        }
        let mut changes = QueueItemChanges::default();
        for record in items {
            changes.put(&record.key, &record.value)?;
        }
        restored.apply_items(changes)?;
        let names: Vec<String> = restored
            .resources
            .keys()
            .filter(|name| !stored.iter().any(|record| record.key == name.as_bytes()))
            .cloned()
            .collect();
        for name in names {
            restored.journal_resource(&name, true);
        }
        Ok(restored)
    }

    /// A resource record as another replica wrote it (or stored it): its
    /// version and, unless it is a list, its value. A list keeps the items
    /// it holds (records of their own, see [`Resources::apply_items`]); a
    /// resource that was not a list becomes an empty one. Nothing is
    /// journaled.
    pub fn put_resource(&mut self, name: String, stored: StoredResource) {
        let StoredResource(stored) = stored;
        let held = self.resources.remove(&name);
        if let Some(held) = &held {
            self.forget_items(items_bytes(&held.value));
        }
        let value = match (stored.value, held) {
            (Some(value), _) => value,
            (
                None,
                Some(Resource {
                    value: Value::Array(items),
                    ..
                }),
            ) => Value::Array(items),
            (None, _) => Value::Array(Vec::new()),
        };
        self.items_bytes += items_bytes(&value);
        let resource = Resource {
            value,
            version: stored.version,
            replaced: stored.replaced,
        };
        self.resources.insert(name, resource);
    }

    /// Drops a resource record as another replica did (no operation does):
    /// what restore would make of the store without it — the policy's
    /// initial value when it declares the resource, else no resource.
    /// Nothing is journaled.
    pub fn delete_resource(&mut self, policy: &StatePolicy, name: &str) {
        let held = match policy.resources.get(name) {
            Some(value) => {
                self.items_bytes += items_bytes(value);
                let resource = Resource {
                    value: value.clone(),
                    version: 0,
                    replaced: 0,
                };
                self.resources.insert(name.to_string(), resource)
            }
            None => self.resources.remove(name),
        };
        if let Some(held) = held {
            self.forget_items(items_bytes(&held.value));
        }
    }

    /// Applies the queue items one batch of changes wrote and dropped, after
    /// the batch's resource records: each queue is its items held, with
    /// those written replaced or added and those dropped removed, and must
    /// hold them at indexes 0, 1, … without a gap (else the store is
    /// corrupt). Items may come in any order. Amortised O(the changes) when
    /// nothing but the end of a queue is dropped. Nothing is journaled.
    pub fn apply_items(&mut self, changes: QueueItemChanges) -> Result<()> {
        for (name, items) in changes.items {
            let stray = |index: usize| stray_item(&name, index);
            let list = match self
                .resources
                .get_mut(&name)
                .map(|resource| &mut resource.value)
            {
                Some(Value::Array(list)) => list,
                _ => match items.iter().find(|(_, item)| item.is_some()) {
                    Some((index, _)) => return Err(stray(*index)),
                    None => continue,
                },
            };
            let held = list.len();
            let drops_held = items.range(..held).any(|(_, item)| item.is_none());
            if !drops_held {
                for (index, item) in items {
                    let Some(item) = item else { continue };
                    let len = list.len();
                    self.items_bytes += value_bytes(&item);
                    match list.get_mut(index) {
                        Some(slot) => {
                            self.items_bytes = less(self.items_bytes, value_bytes(slot));
                            *slot = item;
                        }
                        None if index == len => list.push(item),
                        None => return Err(stray(index)),
                    }
                }
                continue;
            }
            self.items_bytes = less(self.items_bytes, items_bytes_of(list));
            let mut by_index: BTreeMap<usize, Value> =
                std::mem::take(list).into_iter().enumerate().collect();
            for (index, item) in items {
                match item {
                    Some(item) => by_index.insert(index, item),
                    None => by_index.remove(&index),
                };
            }
            for (expected, (index, item)) in by_index.into_iter().enumerate() {
                if index != expected {
                    return Err(stray(index));
                }
                self.items_bytes += value_bytes(&item);
                list.push(item);
            }
        }
        Ok(())
    }

    /// Takes `bytes` of items off the count.
    fn forget_items(&mut self, bytes: usize) {
        self.items_bytes = less(self.items_bytes, bytes);
    }

    /// Σ [`value_bytes`] of every list's items.
    pub fn items_bytes(&self) -> usize {
        self.items_bytes
    }

    /// How many bytes of items a commit of `target` adds (a `set` of a list
    /// may free some instead: 0).
    pub fn items_growth(&self, target: &Target<'_>, carried: Option<&Value>) -> usize {
        match (*target, carried) {
            (Target::Append { .. }, Some(item)) => value_bytes(item),
            (Target::Set { resource, .. }, Some(value)) => {
                let held = self
                    .resources
                    .get(resource)
                    .map_or(0, |held| items_bytes(&held.value));
                items_bytes(value).saturating_sub(held)
            }
            _ => 0,
        }
    }

    /// Checks, before any change of a batch is applied, that
    /// [`Resources::apply_items`] will find no gap once the batch's
    /// resource records (`records`, in order: a record written, or `None`
    /// for one dropped) are applied as [`Resources::put_resource`] and
    /// [`Resources::delete_resource`] apply them: so that a corrupt batch
    /// changes nothing. O(the changes).
    pub fn check_items<'a>(
        &self,
        policy: &StatePolicy,
        records: impl IntoIterator<Item = (&'a str, Option<&'a StoredResource>)>,
        changes: &QueueItemChanges,
    ) -> Result<()> {
        // A queue's shape: how many items it holds, `None` when not a list.
        let shape = |value: Option<&Value>| match value {
            Some(Value::Array(items)) => Some(items.len()),
            _ => None,
        };
        let held = |name: &str| shape(self.resources.get(name).map(|resource| &resource.value));
        let mut shapes: BTreeMap<&str, Option<usize>> = BTreeMap::new();
        for (name, record) in records {
            if !changes.items.contains_key(name) {
                continue;
            }
            let before = shapes.get(name).copied().unwrap_or_else(|| held(name));
            let after = match record {
                Some(StoredResource(stored)) => match &stored.value {
                    Some(value) => shape(Some(value)),
                    None => Some(before.unwrap_or(0)),
                },
                None => shape(policy.resources.get(name)),
            };
            shapes.insert(name, after);
        }
        for (name, items) in &changes.items {
            let shape = shapes
                .get(name.as_str())
                .copied()
                .unwrap_or_else(|| held(name));
            let Some(held) = shape else {
                if let Some((index, _)) = items.iter().find(|(_, item)| item.is_some()) {
                    return Err(stray_item(name, *index));
                }
                continue;
            };
            // The indexes held after: those held but not dropped, and those
            // written; without a gap, the last is one less than their count.
            let dropped = |index: usize| matches!(items.get(&index), Some(None));
            let dropped_held = items
                .range(..held)
                .filter(|(_, item)| item.is_none())
                .count();
            let added = items
                .range(held..)
                .filter(|(_, item)| item.is_some())
                .count();
            let count = held - dropped_held + added;
            let mut last_held = held;
            while last_held > 0 && dropped(last_held - 1) {
                last_held -= 1;
            }
            let last_written = items
                .iter()
                .rev()
                .find(|(_, item)| item.is_some())
                .map_or(0, |(index, _)| index + 1);
            let end = last_held.max(last_written);
            if end != count {
                let gap = (0..end)
                    .find(|index| {
                        let written = matches!(items.get(index), Some(Some(_)));
                        !written && (*index >= held || dropped(*index))
                    })
                    .unwrap_or(end);
                return Err(stray_item(name, gap));
            }
        }
        Ok(())
    }

    /// Sets the global version (recovery).
    pub fn restore_global_version(&mut self, record: &Record) -> Result<()> {
        self.global_version = records::decode(record)?;
        Ok(())
    }

    /// Sets the global version as another replica wrote it (`None`: its
    /// record dropped, as if never written). Nothing is journaled.
    pub fn set_global_version(&mut self, version: Option<u64>) {
        self.global_version = version.unwrap_or(0);
    }

    /// Whether `key` is the global version's meta key.
    pub fn is_global_version_key(key: &[u8]) -> bool {
        key == GLOBAL_VERSION_KEY
    }

    /// Whether `record` is the global version's meta record.
    pub fn is_global_version(record: &Record) -> bool {
        record.key == GLOBAL_VERSION_KEY
    }

    /// Journals nothing from now on ([`Journal::stop`]).
    pub fn stop_journaling(&mut self) {
        self.journal.stop();
    }

    /// The resources written since the last call, in order.
    pub fn take_changes(&mut self, out: &mut Vec<Change>) -> Result<()> {
        self.journal.take_into(out)
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
                false => Err(format!("no resource {}", shown(resource))),
            },
            Target::Append { resource, .. } => match self.resources.get(resource) {
                Some(Resource {
                    value: Value::Array(_),
                    ..
                }) => Ok(()),
                Some(_) => Err(format!("resource {} is not a list", shown(resource))),
                None => Err(format!("no resource {}", shown(resource))),
            },
        }
    }

    /// A copy of what the answer to a commit of `target` by `tool` carries,
    /// and the resource keeps: the value set, or the item appended, with
    /// the arguments the tool marks sensitive redacted (a resource is read
    /// by every host and reviewer, as an approval request is by its
    /// reviewers). Made before the commit, so that its size can refuse the
    /// commit (see [`ANSWER_OVERHEAD_BYTES`](crate::domain::decision::ANSWER_OVERHEAD_BYTES)).
    pub fn carried_value(target: &Target<'_>, tool: &Tool) -> Option<Value> {
        match (*target, &tool.effect) {
            (Target::Nothing, _) => None,
            (Target::Set { .. }, Effect::Set { value_argument, .. })
                if tool.sensitive.contains(value_argument) =>
            {
                Some(Value::from(proposal::REDACTED))
            }
            (Target::Set { value, .. }, _) => Some(value.clone()),
            (Target::Append { item, .. }, _) => Some(Value::Object(
                proposal::redacted(tool, item).unwrap_or_else(|| item.clone()),
            )),
        }
    }

    /// Applies a checked target and bumps the version(s). `carried` is
    /// [`Resources::carried_value`] of the same target: stored in the
    /// resource and returned in the result. Amortised O(size of the change):
    /// an append never copies the queue.
    pub fn apply(&mut self, target: &Target<'_>, carried: Option<Value>) -> CommitResult {
        self.global_version += 1;
        self.journal.put(
            Kind::Meta,
            GLOBAL_VERSION_KEY.to_vec(),
            &self.global_version,
        );
        let Some(name) = target.resource() else {
            return CommitResult {
                version: self.global_version,
                resource: None,
                value: None,
                appended_index: None,
            };
        };
        let mut appended_index = None;
        let mut replaced_items = None;
        if let (Some(resource), Some(carried)) = (self.resources.get_mut(name), carried.as_ref()) {
            match (*target, &mut resource.value) {
                (Target::Set { .. }, stored) => {
                    if let Value::Array(items) = stored {
                        replaced_items = Some(items.len());
                    }
                    self.items_bytes = less(self.items_bytes, items_bytes(stored));
                    self.items_bytes += items_bytes(carried);
                    stored.clone_from(carried);
                    resource.replaced += 1;
                }
                (Target::Append { .. }, Value::Array(items)) => {
                    appended_index = Some(items.len());
                    self.items_bytes += value_bytes(carried);
                    items.push(carried.clone());
                }
                _ => {}
            }
            resource.version += 1;
        }
        for index in 0..replaced_items.unwrap_or(0) {
            self.journal.delete(Kind::QueueItem, item_key(name, index));
        }
        self.journal_resource(name, replaced_items.is_some() || appended_index.is_none());
        if let (Some(index), Some(item)) = (appended_index, carried.as_ref()) {
            self.journal
                .put(Kind::QueueItem, item_key(name, index), item);
        }
        let appended_index = appended_index.and_then(|index| u64::try_from(index).ok());
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
            if let Some(position) = start {
                // A token of a queue that a set has replaced since.
                if position.replaced != resource.replaced {
                    return Err(PageError::Replaced);
                }
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
        let first = first_index(start, resource.replaced, items.len())?;
        let (value_json, end) = page_items(items, first, max_items, max_bytes);
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

/// A resource name a client's arguments chose, as a message shows it:
/// quoted, and cut after [`MAX_RESOURCE_NAME_LEN`] characters (no resource
/// has a longer name), so that an answer stays small whatever it was sent.
fn shown(name: &str) -> String {
    match first_chars(name, MAX_RESOURCE_NAME_LEN) {
        (kept, true) => format!("{kept:?}…"),
        (whole, false) => format!("{whole:?}"),
    }
}

/// Where a page of a queue of `len` items starts: 0 without a position,
/// else its index, while the queue has not been replaced since (`replaced`
/// is the queue's count now) and the index is at most `len`.
fn first_index(start: Option<PagePosition>, replaced: u64, len: usize) -> Result<usize, PageError> {
    match start {
        None => Ok(0),
        Some(position) if position.replaced != replaced => Err(PageError::Replaced),
        Some(position) => usize::try_from(position.index)
            .ok()
            .filter(|index| *index <= len)
            .ok_or(PageError::BadIndex),
    }
}

/// The JSON array of the items from `first` on, at most `max_items` of
/// them and `max_bytes` bytes, but at least one; with the index after the
/// last item taken.
fn page_items(
    items: &[Value],
    first: usize,
    max_items: usize,
    max_bytes: usize,
) -> (String, usize) {
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
    (value_json, end)
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

/// The error for a queue whose items leave a gap.
fn stray_item(name: &str, index: usize) -> Error {
    Error::Internal(format!(
        "the store holds a stray {} record: item {index} of resource {name:?} (a gap in \
         a queue, or an item of a value that is not one); run `toolgate store check`",
        Kind::QueueItem.table()
    ))
}

/// The (resource, index) of a queue item's key.
fn item_parts(key: &[u8]) -> Option<(String, usize)> {
    let [name, index] = <[&[u8]; 2]>::try_from(records::split_key(key)?).ok()?;
    let index = u64::from_be_bytes(index.try_into().ok()?);
    Some((
        String::from_utf8(name.to_vec()).ok()?,
        usize::try_from(index).ok()?,
    ))
}

#[cfg(test)]
impl Resources {
    /// Every resource, its items and versions, for tests that compare two.
    pub(crate) fn dump(&self) -> String {
        format!(
            "scope {:?} global {}\nresources {:#?}\n",
            self.scope, self.global_version, self.resources
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn records_of(changes: Vec<Change>, kind: Kind) -> Vec<Record> {
        changes
            .into_iter()
            .filter(|change| change.kind == kind)
            .filter_map(|change| {
                Some(Record {
                    kind,
                    key: change.key,
                    value: change.value?,
                })
            })
            .collect()
    }

    /// A list's items count under the byte budget as they are held: after a
    /// restore, the store's items, not the policy's initial list that the
    /// store's record replaced.
    #[test]
    fn a_restore_counts_the_items_the_store_holds() {
        let policy = StatePolicy {
            version_scope: VersionScope::Resource,
            resources: [(
                "queue".to_string(),
                Value::Array(vec![Value::from("an initial item")]),
            )]
            .into(),
        };
        let mut live = Resources::new(&policy);
        assert!(live.items_bytes() > 0);
        let emptied = Value::Array(Vec::new());
        let target = Target::Set {
            resource: "queue",
            value: &emptied,
        };
        live.apply(&target, Some(emptied.clone()));
        let item = Object::new();
        let append = Target::Append {
            resource: "queue",
            item: &item,
        };
        live.apply(&append, Some(Value::Object(item.clone())));
        let mut changes = Vec::new();
        live.take_changes(&mut changes).unwrap();
        let restored = Resources::restore(
            &policy,
            &records_of(changes.clone(), Kind::Resource),
            &records_of(changes, Kind::QueueItem),
        )
        .unwrap();
        assert_eq!(live.items_bytes(), value_bytes(&Value::Object(item)));
        assert_eq!(restored.items_bytes(), live.items_bytes());
    }

    /// A resource name from the arguments is cut in a message: 262,000 DEL
    /// characters (1.5 MiB once escaped) were quoted whole, and the answer
    /// was over the message limit.
    #[test]
    fn a_missing_resource_is_named_in_a_bounded_message() {
        let resources = Resources::new(&StatePolicy {
            version_scope: VersionScope::Resource,
            resources: [("scalar".to_string(), Value::from("x"))].into(),
        });
        let name = "\u{7f}".repeat(262_000);
        let value = Value::Null;
        let item = Object::new();
        for target in [
            Target::Set {
                resource: &name,
                value: &value,
            },
            Target::Append {
                resource: &name,
                item: &item,
            },
        ] {
            let message = resources.check(&target).unwrap_err();
            assert!(message.len() < 512, "{} bytes", message.len());
            assert!(
                message.starts_with("no resource \"\\u{7f}"),
                "{message:.40}"
            );
        }
    }

    /// A page token of a queue that a set has replaced with a value that is
    /// not a list is FAILED_PRECONDITION's `Replaced`, as for any replaced
    /// queue, not a token sent for a value read whole.
    #[test]
    fn a_token_of_a_queue_replaced_by_a_scalar_is_replaced() {
        let mut resources = Resources::new(&StatePolicy {
            version_scope: VersionScope::Resource,
            resources: [(
                "queue".to_string(),
                Value::Array(vec![Value::from("a"), Value::from("b")]),
            )]
            .into(),
        });
        let first = resources.page("queue", None, 1, 1 << 20).unwrap();
        let next = first.next.expect("a second page");
        let scalar = Value::Null;
        let target = Target::Set {
            resource: "queue",
            value: &scalar,
        };
        resources.apply(&target, Some(scalar.clone()));
        assert!(matches!(
            resources.page("queue", Some(next), 1, 1 << 20),
            Err(PageError::Replaced)
        ));
        assert!(matches!(
            resources.page(
                "queue",
                Some(PagePosition {
                    replaced: next.replaced + 1,
                    index: 0
                }),
                1,
                1 << 20
            ),
            Err(PageError::NotAQueue)
        ));
    }
}
