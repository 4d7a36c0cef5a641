//! The approval ledger (SPEC §5): requests bound to proposal fingerprints,
//! their lifecycle, expiry, caps and the reviewer's authority.
//!
//! `pending → granted | denied | expired`; `granted → consumed | revoked |
//! expired`. Every transition returns an [`ApprovalEvent`] for the audit log
//! and for watchers.

use std::borrow::Cow;
use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, BTreeSet, HashMap};

use uuid::Uuid;

use crate::domain::table::{IdTable, Table};

use crate::domain::canonical::Fingerprint;
use crate::domain::clock::Timestamp;
use crate::domain::decision::Reason;
use crate::domain::error::{Error, Result};
use crate::domain::policy::{Limits, Policy};
use crate::domain::records::{self, Journal, Kind};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ApprovalStatus {
    Pending,
    Granted,
    Denied,
    Expired,
    Consumed,
    Revoked,
}

impl ApprovalStatus {
    pub const ALL: [ApprovalStatus; 6] = [
        ApprovalStatus::Pending,
        ApprovalStatus::Granted,
        ApprovalStatus::Denied,
        ApprovalStatus::Expired,
        ApprovalStatus::Consumed,
        ApprovalStatus::Revoked,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalStatus::Pending => "pending",
            ApprovalStatus::Granted => "granted",
            ApprovalStatus::Denied => "denied",
            ApprovalStatus::Expired => "expired",
            ApprovalStatus::Consumed => "consumed",
            ApprovalStatus::Revoked => "revoked",
        }
    }

    /// How far along its lifecycle: requested (0), granted (1), ended (2).
    /// Also the last byte of a change's key ([`change_key`]): stored, so
    /// these numbers never change.
    fn stage(self) -> u8 {
        match self {
            ApprovalStatus::Pending => 0,
            ApprovalStatus::Granted => 1,
            _ => 2,
        }
    }

    fn is_live(self) -> bool {
        matches!(self, ApprovalStatus::Pending | ApprovalStatus::Granted)
    }
}

/// One approval request.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Approval {
    pub id: Uuid,
    /// What was asked for, as the request was made.
    pub request: NewApproval,
    pub status: ApprovalStatus,
    pub requested_at: Timestamp,
    /// Pending: when the request expires; granted: when the grant expires.
    pub expires_at: Timestamp,
    pub decided_by: Option<String>,
    pub decided_at: Option<Timestamp>,
    pub decision_note: String,
    /// When the record reached a final status.
    pub finished_at: Option<Timestamp>,
}

/// What a request is made of.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct NewApproval {
    pub fingerprint: Fingerprint,
    pub host: String,
    pub actor: String,
    pub session_id: String,
    pub workspace: String,
    pub tool: String,
    pub call_id: String,
    pub version: u64,
    /// Canonical JSON of the arguments with sensitive fields redacted. The
    /// real values are bound by the fingerprint and never stored here.
    pub arguments_view: String,
    pub reason: Reason,
}

/// What an approval's step changed: every field that changes after the
/// request, as they are after that step. An approval's record is written
/// once, at its request; each later step is one of these, appended under
/// its own key ([`change_key`]) where the changes of the same moment are,
/// so that consuming a grant writes a small record at the end of the
/// store's tree instead of rewriting the approval's record in its page
/// (which made the approvals' pages three quarters of a durable commit's
/// writes: BENCHMARKS.md). Recovery applies the latest step's change to
/// the record ([`Ledger::restore`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ApprovalChange<'a> {
    pub status: ApprovalStatus,
    pub expires_at: Timestamp,
    pub decided_by: Option<Cow<'a, str>>,
    pub decided_at: Option<Timestamp>,
    pub decision_note: Cow<'a, str>,
    pub finished_at: Option<Timestamp>,
}

impl<'a> ApprovalChange<'a> {
    /// The fields of `approval` that its steps change.
    fn of(approval: &'a Approval) -> Self {
        ApprovalChange {
            status: approval.status,
            expires_at: approval.expires_at,
            decided_by: approval.decided_by.as_deref().map(Cow::Borrowed),
            decided_at: approval.decided_at,
            decision_note: Cow::Borrowed(&approval.decision_note),
            finished_at: approval.finished_at,
        }
    }

    fn apply_to(self, approval: &mut Approval) {
        approval.status = self.status;
        approval.expires_at = self.expires_at;
        approval.decided_by = self.decided_by.map(Cow::into_owned);
        approval.decided_at = self.decided_at;
        approval.decision_note = self.decision_note.into_owned();
        approval.finished_at = self.finished_at;
    }
}

/// A stored step of one approval: its id ([`parse_change_key`]) and the
/// change decoded.
pub type StoredChange = (Uuid, ApprovalChange<'static>);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Requested,
    Granted,
    Denied,
    Revoked,
    Expired,
    Consumed,
}

impl EventKind {
    /// The stable audit event name (SPEC §8).
    pub fn audit_name(self) -> &'static str {
        match self {
            EventKind::Requested => "tool_call_require_approval",
            EventKind::Granted => "approval_granted",
            EventKind::Denied => "approval_denied",
            EventKind::Revoked => "approval_revoked",
            EventKind::Expired => "approval_expired",
            EventKind::Consumed => "approval_consumed",
        }
    }
}

/// A ledger transition: what happened and the approval after it.
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalEvent {
    pub kind: EventKind,
    pub approval: Approval,
}

/// The few facts of an approval that Decide and Dispatch answer with
/// (cheap to copy, unlike the whole record).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApprovalRef {
    pub id: Uuid,
    pub expires_at: Timestamp,
    pub reason: Reason,
}

impl From<&Approval> for ApprovalRef {
    fn from(approval: &Approval) -> Self {
        ApprovalRef {
            id: approval.id,
            expires_at: approval.expires_at,
            reason: approval.request.reason,
        }
    }
}

/// What the ledger holds for one proposal in one workspace (SPEC §4 step 8).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    Granted(ApprovalRef),
    Denied(ApprovalRef),
    Pending(ApprovalRef),
    /// Nothing usable: none yet, or expired, consumed or revoked.
    None,
}

/// Reviewer decisions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Grant,
    Deny,
    Revoke,
}

/// Where a page of approvals starts: after this (requested_at, id).
pub type PageKey = (Timestamp, Uuid);

/// Filters and paging for listing.
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    pub status: Option<ApprovalStatus>,
    pub actor: Option<String>,
    pub tool: Option<String>,
    /// Only approvals whose id (lowercase hyphenated form) starts with this.
    pub id_prefix: Option<String>,
    /// Only approvals this reviewer may see ([`visible_to`]); every
    /// approval when `None` (in-process callers only).
    pub viewer: Option<String>,
    pub after: Option<PageKey>,
    pub page_size: usize,
    /// Stop a page before it exceeds this many bytes ([`approx_size`]);
    /// a page always holds at least one approval. 0: no byte bound.
    pub max_bytes: usize,
}

/// Most records one [`Ledger::list`] looks at: a page of a filter that
/// matches few ends there, with the key to go on from.
pub const MAX_EXAMINED: usize = 10_000;

/// About how many bytes an approval takes on the wire: its text fields plus
/// a fixed allowance for ids, timestamps and framing. Only used to bound
/// pages, so it errs on the large side.
pub fn approx_size(approval: &Approval) -> usize {
    const FIXED: usize = 256;
    FIXED
        + approval.request.actor.len()
        + approval.request.session_id.len()
        + approval.request.workspace.len()
        + approval.request.tool.len()
        + approval.request.call_id.len()
        + approval.request.arguments_view.len()
        + approval.request.reason.as_str().len()
        + approval.decided_by.as_ref().map_or(0, String::len)
        + approval.decision_note.len()
}

/// Whether reviewer `viewer` may see an approval (list, get, watch): only
/// what it could review (a tool one of its roles approves, in one of its
/// workspaces), unless the policy gives it `see_all`. An identity that is
/// not a reviewer in the policy sees nothing.
pub fn visible_to(approval: &Approval, viewer: &str, policy: &Policy) -> bool {
    let Some(reviewer) = policy.reviewers.get(viewer) else {
        return false;
    };
    if reviewer.see_all {
        return true;
    }
    reviewer.covers_workspace(&approval.request.workspace)
        && policy
            .tools
            .get(&approval.request.tool)
            .is_some_and(|tool| {
                tool.approvers
                    .iter()
                    .any(|role| reviewer.roles.contains(role))
            })
}

/// One page of approvals, in request order.
#[derive(Debug, Clone, Default)]
pub struct Page {
    pub approvals: Vec<Approval>,
    /// Set when more may follow: pass it as the next query's `after`.
    pub next: Option<PageKey>,
}

/// The latest approval for one (workspace, fingerprint).
#[derive(Debug)]
struct Current {
    workspace: String,
    fingerprint: Fingerprint,
    id: Uuid,
}

/// Records are boxed so that growing the table moves pointers, not records.
type Records = IdTable<Box<Approval>>;

fn find_record(records: &Records, id: Uuid) -> Option<&Approval> {
    records
        .find(records.hash(&id), |approval| approval.id == id)
        .map(|approval| &**approval)
}

fn find_record_mut(records: &mut Records, id: Uuid) -> Option<&mut Approval> {
    records
        .find_mut(records.hash(&id), |approval| approval.id == id)
        .map(|approval| &mut **approval)
}

/// The hash a (workspace, fingerprint) is found under, from borrowed parts.
fn current_hash(current: &Table<Current>, workspace: &str, fingerprint: &Fingerprint) -> u64 {
    current.hash(&(workspace, fingerprint))
}

/// What one record costs besides its strings: the boxed record, its table
/// slot, its entries in the request, deadline and finish indexes and in the
/// (workspace, fingerprint) index.
const RECORD_OVERHEAD_BYTES: usize = 512;

/// The bytes a record holds under the byte budget (an estimate: its strings
/// and a fixed overhead).
fn record_bytes(approval: &Approval) -> usize {
    approval.request.bytes()
        + approval.decided_by.as_ref().map_or(0, String::len)
        + approval.decision_note.len()
}

impl NewApproval {
    /// What the record made of this request will count under the byte budget.
    pub fn bytes(&self) -> usize {
        RECORD_OVERHEAD_BYTES
            + self.host.len()
            + self.actor.len()
            + self.session_id.len()
            + 2 * self.workspace.len()
            + self.tool.len()
            + self.call_id.len()
            + self.arguments_view.len()
    }
}

#[derive(Debug, Default)]
pub struct Ledger {
    records: Records,
    /// Σ [`record_bytes`] of all records.
    bytes: usize,
    /// Σ [`record_bytes`] of finished records (in `finished` or `denied`):
    /// what eviction could free.
    evictable_bytes: usize,
    /// The latest approval per (workspace, fingerprint).
    current: Table<Current>,
    /// Live approvals by deadline, for exact and cheap expiry.
    deadlines: BTreeSet<(Timestamp, Uuid)>,
    /// Finished approvals (not denied) by (finish time, finish serial),
    /// evicted oldest first after retention. The serial orders approvals
    /// finished in the same millisecond as they finished, so a new entry
    /// lands at the end of the tree instead of at a random place.
    finished: BTreeMap<(Timestamp, u64), Uuid>,
    /// Denied approvals by finish time: kept so that denials stick, evicted
    /// only when the record cap needs room.
    denied: BTreeMap<(Timestamp, u64), Uuid>,
    /// The next finish serial.
    finish_serial: u64,
    /// All records by (requested_at, id): listing order and page tokens.
    by_request: BTreeSet<(Timestamp, Uuid)>,
    pending_by_actor: HashMap<String, usize>,
    /// Pending requests per host identity (for the per-host cap).
    pending_by_host: HashMap<String, usize>,
    pending_total: usize,
    /// Every record written or dropped since the state last took the
    /// changes.
    journal: Journal,
}

/// The key an approval is stored under: by request time, so that new
/// records land at the end of the store's tree.
fn record_key(approval: &Approval) -> Vec<u8> {
    records::key(&[
        &records::time_part(approval.requested_at),
        approval.id.as_bytes(),
    ])
}

/// The key of the change that took an approval to `status`: by the time
/// it happened, so that changes land at the end of the store's tree, with
/// the status's stage last (a grant and its end in one millisecond).
fn change_key(at: Timestamp, id: Uuid, status: ApprovalStatus) -> Vec<u8> {
    records::key(&[&records::time_part(at), id.as_bytes(), &[status.stage()]])
}

/// The keys of every change stored for a finished `approval`: its end's,
/// and its grant's when it was granted and that change is still stored (a
/// revoke drops it, see [`Ledger::finish`]).
fn finished_change_keys(approval: &Approval) -> impl Iterator<Item = Vec<u8>> {
    let id = approval.id;
    let granted_at = match approval.status {
        ApprovalStatus::Consumed | ApprovalStatus::Expired => approval.decided_at,
        _ => None,
    };
    let ended = approval
        .finished_at
        .map(|at| change_key(at, id, approval.status));
    let granted = granted_at.map(|at| change_key(at, id, ApprovalStatus::Granted));
    ended.into_iter().chain(granted)
}

impl Ledger {
    pub fn len(&self) -> usize {
        self.records.len()
    }

    /// The latest time an approval was requested, decided or finished at.
    pub fn latest_time(&self) -> Timestamp {
        self.records
            .iter()
            .flat_map(|approval| {
                [approval.decided_at, approval.finished_at]
                    .into_iter()
                    .flatten()
                    .chain([approval.requested_at])
            })
            .max()
            .unwrap_or_default()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    /// How many of `later`'s approvals this ledger does not hold as they
    /// are there (new ones, or changed): at least how many transitions lead
    /// from this ledger to `later`.
    pub fn changed_in(&self, later: &Ledger) -> usize {
        later
            .records
            .iter()
            .filter(|approval| {
                find_record(&self.records, approval.id).is_none_or(|mine| mine != &***approval)
            })
            .count()
    }

    pub fn pending_total(&self) -> usize {
        self.pending_total
    }

    /// What the records count under the byte budget.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// What evicting every finished record would free.
    pub fn evictable_bytes(&self) -> usize {
        self.evictable_bytes
    }

    /// Evicts finished records, oldest first (denied ones last, so that
    /// denials stick as long as they can), until `needed` bytes are freed
    /// or none is left; the bytes freed. Live records are never evicted.
    pub fn evict_bytes(&mut self, needed: usize) -> usize {
        let before = self.bytes;
        while before.saturating_sub(self.bytes) < needed {
            let oldest = self
                .finished
                .pop_first()
                .or_else(|| self.denied.pop_first());
            match oldest {
                Some((_, id)) => self.evict(id),
                None => break,
            }
        }
        before.saturating_sub(self.bytes)
    }

    /// Expires every live approval whose deadline has passed and evicts
    /// finished records past retention.
    pub fn expire_due(&mut self, now: Timestamp, limits: &Limits) -> Vec<ApprovalEvent> {
        let mut events = Vec::new();
        while let Some(&(deadline, id)) = self.deadlines.first() {
            if deadline > now {
                break;
            }
            self.deadlines.pop_first();
            if let Some(event) = self.finish(id, ApprovalStatus::Expired, now, None, String::new())
            {
                events.push(event);
            }
        }
        let retention_cutoff = Timestamp(now.0.saturating_sub(
            u64::try_from(limits.approval_retention.as_millis()).unwrap_or(u64::MAX),
        ));
        while let Some((&(finished_at, _), &id)) = self.finished.first_key_value() {
            if finished_at > retention_cutoff {
                break;
            }
            self.finished.pop_first();
            self.evict(id);
        }
        events
    }

    /// The ledger's standing for a proposal in a workspace.
    pub fn standing(&self, workspace: &str, fingerprint: Fingerprint) -> Standing {
        let hash = current_hash(&self.current, workspace, &fingerprint);
        let Some(approval) = self
            .current
            .find(hash, |current| {
                current.fingerprint == fingerprint && current.workspace == workspace
            })
            .and_then(|current| find_record(&self.records, current.id))
        else {
            return Standing::None;
        };
        let found = ApprovalRef::from(approval);
        match approval.status {
            ApprovalStatus::Granted => Standing::Granted(found),
            ApprovalStatus::Denied => Standing::Denied(found),
            ApprovalStatus::Pending => Standing::Pending(found),
            _ => Standing::None,
        }
    }

    /// Checks the caps for one more pending request by `actor` of `host`.
    pub fn check_capacity(&self, host: &str, actor: &str, limits: &Limits) -> Result<()> {
        if self.pending_total >= limits.max_pending_total {
            return Err(Error::ResourceExhausted(format!(
                "the approval ledger holds its maximum of {} pending requests",
                limits.max_pending_total
            )));
        }
        if self.pending_by_host.get(host).copied().unwrap_or(0) >= limits.max_pending_per_host {
            return Err(Error::ResourceExhausted(format!(
                "this host has its maximum of {} pending approval requests (limits.max_pending_per_host)",
                limits.max_pending_per_host
            )));
        }
        if self.pending_by_actor.get(actor).copied().unwrap_or(0) >= limits.max_pending_per_actor {
            return Err(Error::ResourceExhausted(format!(
                "actor {actor:?} has its maximum of {} pending approval requests",
                limits.max_pending_per_actor
            )));
        }
        if self.records.len() >= limits.max_approval_records
            && self.finished.is_empty()
            && self.denied.is_empty()
        {
            return Err(Error::ResourceExhausted(format!(
                "the approval ledger holds its maximum of {} records",
                limits.max_approval_records
            )));
        }
        Ok(())
    }

    /// Creates a pending request. The caller has checked the standing
    /// (idempotency) and the capacity.
    pub fn create(&mut self, new: NewApproval, now: Timestamp, limits: &Limits) -> ApprovalEvent {
        self.make_room(limits.max_approval_records);
        let approval = pending_approval(new, now, limits);
        self.count_pending(&approval);
        self.deadlines.insert((approval.expires_at, approval.id));
        self.by_request.insert((approval.requested_at, approval.id));
        self.make_current(&approval);
        let record_hash = self.records.hash(&approval.id);
        self.bytes = self.bytes.saturating_add(record_bytes(&approval));
        self.journal
            .put(Kind::Approval, record_key(&approval), &approval);
        self.records
            .insert_unique(record_hash, Box::new(approval.clone()));
        ApprovalEvent {
            kind: EventKind::Requested,
            approval,
        }
    }

    /// The ledger of stored records (recovery), every index rebuilt as the
    /// operations that made the records left it: the latest request per
    /// (workspace, fingerprint) is current, live records have deadlines,
    /// finished ones queue for eviction in the order they finished. (Of two
    /// records with one id, the earlier request is kept.) Each record is as
    /// the change of its latest step left it (none: as requested, or as a
    /// store written before changes were kept apart left it); a change of
    /// no record is a corrupt store, since a record and its changes are
    /// dropped together.
    pub fn restore(mut approvals: Vec<Approval>, changes: Vec<StoredChange>) -> Result<Ledger> {
        approvals.sort_unstable_by_key(|approval| (approval.id, approval.requested_at));
        approvals.dedup_by_key(|approval| approval.id);
        let mut latest: HashMap<Uuid, ApprovalChange<'static>> =
            HashMap::with_capacity(changes.len());
        for (id, change) in changes {
            match latest.entry(id) {
                Entry::Occupied(held) if held.get().status.stage() >= change.status.stage() => {}
                Entry::Occupied(mut held) => {
                    held.insert(change);
                }
                Entry::Vacant(slot) => {
                    slot.insert(change);
                }
            }
        }
        for approval in &mut approvals {
            if let Some(change) = latest.remove(&approval.id) {
                change.apply_to(approval);
            }
        }
        if !latest.is_empty() {
            return Err(Error::Internal(format!(
                "the store holds changes of {} approval(s) it holds no record of; \
                 run `toolgate store check`",
                latest.len()
            )));
        }
        // Finished records are put in the order they finished (by request
        // among those of one millisecond), so that they queue in that order.
        approvals.sort_unstable_by_key(|approval| {
            (
                approval.status.is_live(),
                finish_time(approval),
                approval.requested_at,
                approval.id,
            )
        });
        let mut ledger = Ledger::default();
        for approval in approvals {
            ledger.put(approval);
        }
        Ok(ledger)
    }

    /// A record as another replica wrote it (or stored it): added, or
    /// replacing the record of its id whole unless that one is further
    /// along its lifecycle, every index kept as
    /// [`Ledger::restore`] of the records would build it; nothing is
    /// journaled. The transition it represents, for watchers: a new pending
    /// record is `Requested`, a status changed (or a record first seen in a
    /// final status) is the event of its new status, an unchanged status is
    /// none.
    pub fn apply(&mut self, approval: Approval) -> Option<ApprovalEvent> {
        let id = approval.id;
        // A record is written at its request and its steps apart: the
        // request read again after them (the store's records read again)
        // takes nothing back.
        if find_record(&self.records, id)
            .is_some_and(|held| held.status.stage() > approval.status.stage())
        {
            return None;
        }
        let before = self.put(approval);
        let approval = find_record(&self.records, id)?;
        if before == Some(approval.status) {
            return None;
        }
        let kind = match approval.status {
            ApprovalStatus::Pending => EventKind::Requested,
            ApprovalStatus::Granted => EventKind::Granted,
            ApprovalStatus::Denied => EventKind::Denied,
            ApprovalStatus::Revoked => EventKind::Revoked,
            ApprovalStatus::Consumed => EventKind::Consumed,
            ApprovalStatus::Expired => EventKind::Expired,
        };
        Some(ApprovalEvent {
            kind,
            approval: approval.clone(),
        })
    }

    /// A step's change as another replica stored it, applied to the record
    /// of its id as [`Ledger::apply`] applies a record (a grant's change
    /// once the record has ended changes nothing), with its transition. A
    /// change of a record not held is none.
    pub fn apply_change(&mut self, id: Uuid, change: ApprovalChange<'_>) -> Option<ApprovalEvent> {
        let mut approval = find_record(&self.records, id)?.clone();
        change.apply_to(&mut approval);
        self.apply(approval)
    }

    /// Drops the record stored under (`requested_at`, `id`) as another
    /// replica did, and its index entries; nothing is journaled. A record
    /// not held (or held under another request time) is no error.
    ///
    /// When it was the current record of its (workspace, fingerprint),
    /// none is current afterwards, as after an eviction: every older record
    /// of the same (workspace, fingerprint) is final and neither denied (a
    /// newer request is only made when the standing is none), so its
    /// standing is none whether or not it is current.
    pub fn remove(&mut self, requested_at: Timestamp, id: Uuid) {
        match find_record(&self.records, id) {
            Some(approval) if approval.requested_at == requested_at => {}
            _ => return,
        }
        if let Some((approval, _)) = self.take_out(id) {
            let hash = current_hash(
                &self.current,
                &approval.request.workspace,
                &approval.request.fingerprint,
            );
            self.current.remove(hash, |entry| entry.id == id);
        }
    }

    /// Adds a record, or replaces the record of its id whole, with every
    /// index; the status it replaced, if any. A finished record keeps its
    /// place in its eviction queue when it finished at the same time; a
    /// record newly finished queues last.
    fn put(&mut self, approval: Approval) -> Option<ApprovalStatus> {
        let id = approval.id;
        let mut before = None;
        let mut serial = None;
        if let Some((old, queued)) = self.take_out(id) {
            before = Some(old.status);
            let same_queue = !old.status.is_live()
                && !approval.status.is_live()
                && finish_time(&old) == finish_time(&approval)
                && (old.status == ApprovalStatus::Denied)
                    == (approval.status == ApprovalStatus::Denied);
            if same_queue {
                serial = queued;
            }
            if old.request.workspace != approval.request.workspace
                || old.request.fingerprint != approval.request.fingerprint
            {
                let hash = current_hash(
                    &self.current,
                    &old.request.workspace,
                    &old.request.fingerprint,
                );
                self.current.remove(hash, |entry| entry.id == id);
            }
        }
        let bytes = record_bytes(&approval);
        if approval.status == ApprovalStatus::Pending {
            self.count_pending(&approval);
        }
        if approval.status.is_live() {
            self.deadlines.insert((approval.expires_at, id));
        } else {
            let serial = serial.unwrap_or_else(|| {
                let next = self.finish_serial;
                self.finish_serial += 1;
                next
            });
            let queue = if approval.status == ApprovalStatus::Denied {
                &mut self.denied
            } else {
                &mut self.finished
            };
            queue.insert((finish_time(&approval), serial), id);
            self.evictable_bytes = self.evictable_bytes.saturating_add(bytes);
        }
        self.by_request.insert((approval.requested_at, id));
        self.make_latest_current(&approval);
        self.bytes = self.bytes.saturating_add(bytes);
        let hash = self.records.hash(&id);
        self.records.insert_unique(hash, Box::new(approval));
        before
    }

    /// Takes a record out of the table and of every index but `current`;
    /// the record and the serial of its eviction queue entry, if it had one.
    fn take_out(&mut self, id: Uuid) -> Option<(Box<Approval>, Option<u64>)> {
        let hash = self.records.hash(&id);
        let approval = self.records.remove(hash, |approval| approval.id == id)?;
        let bytes = record_bytes(&approval);
        self.bytes = self.bytes.saturating_sub(bytes);
        if approval.status == ApprovalStatus::Pending {
            decrement_pending(
                &mut self.pending_total,
                &mut self.pending_by_actor,
                &mut self.pending_by_host,
                &approval,
            );
        }
        let mut serial = None;
        if approval.status.is_live() {
            self.deadlines.remove(&(approval.expires_at, id));
        } else {
            self.evictable_bytes = self.evictable_bytes.saturating_sub(bytes);
            let queue = if approval.status == ApprovalStatus::Denied {
                &mut self.denied
            } else {
                &mut self.finished
            };
            let at = finish_time(&approval);
            let queued = queue
                .range((at, 0)..=(at, u64::MAX))
                .find(|(_, queued)| **queued == id)
                .map(|(key, _)| *key);
            if let Some(key) = queued {
                queue.remove(&key);
                serial = Some(key.1);
            }
        }
        self.by_request.remove(&(approval.requested_at, id));
        Some((approval, serial))
    }

    /// Makes `approval` the current one for its (workspace, fingerprint)
    /// unless a later request (by request time, then id) is: what restore
    /// makes current, whatever the order records come in.
    fn make_latest_current(&mut self, approval: &Approval) {
        let (current, records) = (&mut self.current, &self.records);
        let hash = current_hash(
            current,
            &approval.request.workspace,
            &approval.request.fingerprint,
        );
        let found = current.find_mut(hash, |current| {
            current.fingerprint == approval.request.fingerprint
                && current.workspace == approval.request.workspace
        });
        match found {
            Some(current) => {
                let later = current.id == approval.id
                    || find_record(records, current.id).is_none_or(|held| {
                        (held.requested_at, held.id) < (approval.requested_at, approval.id)
                    });
                if later {
                    current.id = approval.id;
                }
            }
            None => {
                current.insert_unique(
                    hash,
                    Current {
                        workspace: approval.request.workspace.clone(),
                        fingerprint: approval.request.fingerprint,
                        id: approval.id,
                    },
                );
            }
        }
    }

    /// Journals nothing from now on ([`Journal::stop`]).
    pub fn stop_journaling(&mut self) {
        self.journal.stop();
    }

    /// The records written or dropped since the last call, in order.
    pub fn take_changes(&mut self, out: &mut Vec<records::Change>) -> Result<()> {
        self.journal.take_into(out)
    }

    /// Evicts finished records, oldest first (denied ones last), until one
    /// more record fits under `max_records` or none is left to evict.
    fn make_room(&mut self, max_records: usize) {
        while self.records.len() >= max_records {
            let oldest = self
                .finished
                .pop_first()
                .or_else(|| self.denied.pop_first());
            match oldest {
                Some((_, id)) => self.evict(id),
                None => break,
            }
        }
    }

    /// One pending request more for the approval's actor and host (undone
    /// by [`decrement_pending`]).
    fn count_pending(&mut self, approval: &Approval) {
        match self.pending_by_actor.get_mut(&approval.request.actor) {
            Some(count) => *count += 1,
            None => {
                self.pending_by_actor
                    .insert(approval.request.actor.clone(), 1);
            }
        }
        *self
            .pending_by_host
            .entry(approval.request.host.clone())
            .or_insert(0) += 1;
        self.pending_total += 1;
    }

    /// Makes `approval` the latest for its (workspace, fingerprint).
    fn make_current(&mut self, approval: &Approval) {
        let hash = current_hash(
            &self.current,
            &approval.request.workspace,
            &approval.request.fingerprint,
        );
        match self.current.find_mut(hash, |current| {
            current.fingerprint == approval.request.fingerprint
                && current.workspace == approval.request.workspace
        }) {
            Some(current) => current.id = approval.id,
            None => {
                self.current.insert_unique(
                    hash,
                    Current {
                        workspace: approval.request.workspace.clone(),
                        fingerprint: approval.request.fingerprint,
                        id: approval.id,
                    },
                );
            }
        }
    }

    pub fn get(&self, id: Uuid) -> Result<&Approval> {
        find_record(&self.records, id).ok_or_else(|| Error::NotFound(format!("no approval {id}")))
    }

    /// Grant, deny or revoke by `reviewer`, whose authority is checked
    /// against the policy in force: an approver role of the tool, the
    /// request's workspace, and never its own actor's request.
    pub fn review(
        &mut self,
        id: Uuid,
        verdict: Verdict,
        reviewer: &str,
        note: String,
        policy: &Policy,
        now: Timestamp,
    ) -> Result<ApprovalEvent> {
        let approval = self.get(id)?;
        check_authority(approval, reviewer, policy)?;
        let status = approval.status;
        match (verdict, status) {
            (Verdict::Grant, ApprovalStatus::Pending) => {
                let expires_at = now.saturating_add(policy.limits.grant_ttl);
                let Some(approval) = find_record_mut(&mut self.records, id) else {
                    return Err(Error::Internal("approval vanished while granting".into()));
                };
                decrement_pending(
                    &mut self.pending_total,
                    &mut self.pending_by_actor,
                    &mut self.pending_by_host,
                    approval,
                );
                self.deadlines.remove(&(approval.expires_at, id));
                let bytes_before = record_bytes(approval);
                approval.status = ApprovalStatus::Granted;
                approval.expires_at = expires_at;
                approval.decided_by = Some(reviewer.to_string());
                approval.decided_at = Some(now);
                approval.decision_note = note;
                self.bytes = (self.bytes + record_bytes(approval)).saturating_sub(bytes_before);
                self.journal.put(
                    Kind::ApprovalChange,
                    change_key(now, id, ApprovalStatus::Granted),
                    &ApprovalChange::of(approval),
                );
                let approval = approval.clone();
                self.deadlines.insert((expires_at, id));
                Ok(ApprovalEvent {
                    kind: EventKind::Granted,
                    approval,
                })
            }
            (Verdict::Deny, ApprovalStatus::Pending) => self
                .finish(id, ApprovalStatus::Denied, now, Some(reviewer), note)
                .ok_or_else(|| Error::Internal("approval vanished while denying".into())),
            (Verdict::Revoke, ApprovalStatus::Granted) => self
                .finish(id, ApprovalStatus::Revoked, now, Some(reviewer), note)
                .ok_or_else(|| Error::Internal("approval vanished while revoking".into())),
            (Verdict::Revoke, _) => Err(Error::FailedPrecondition(format!(
                "approval {id} is {}; only a granted approval can be revoked",
                status.as_str()
            ))),
            (_, _) => Err(Error::FailedPrecondition(format!(
                "approval {id} is {}, not pending",
                status.as_str()
            ))),
        }
    }

    /// Consumes a grant (Dispatch commit). The caller holds the state lock
    /// for the whole commit, so exactly one commit consumes a grant.
    pub fn consume(&mut self, id: Uuid, now: Timestamp) -> Result<ApprovalEvent> {
        let approval = self.get(id)?;
        if approval.status != ApprovalStatus::Granted || approval.expires_at <= now {
            return Err(Error::FailedPrecondition(format!(
                "approval {id} is {}, not a usable grant",
                approval.status.as_str()
            )));
        }
        self.finish(id, ApprovalStatus::Consumed, now, None, String::new())
            .ok_or_else(|| Error::Internal("approval vanished while consuming".into()))
    }

    /// A page of approvals in request order, bounded by `page_size` and
    /// `max_bytes`, and by [`MAX_EXAMINED`] records looked at: a filter
    /// that matches few of them ends a page short (even empty) with the
    /// key to go on from, so that no call holds the state lock for a walk
    /// of the whole ledger. That key is never one of a record the viewer
    /// may not see (its id is not the viewer's to learn): such a page goes
    /// on to the end of that record's millisecond and hands the viewer
    /// the millisecond's end.
    pub fn list(&self, query: &ListQuery, policy: &Policy) -> Page {
        let start = match query.after {
            Some(key) => std::ops::Bound::Excluded(key),
            None => std::ops::Bound::Unbounded,
        };
        let mut page = Page::default();
        let mut page_bytes = 0usize;
        let mut id_text = Uuid::encode_buffer();
        let seen = |approval: &Approval| {
            (query.viewer.as_deref()).is_none_or(|viewer| visible_to(approval, viewer, policy))
        };
        let mut examined: Option<&PageKey> = None;
        // Set when the scan bound fell on a record the viewer may not see:
        // the page then ends with that record's millisecond, so that its
        // token names the millisecond, never that record's id.
        let mut ending_with: Option<Timestamp> = None;
        for (count, key) in self
            .by_request
            .range((start, std::ops::Bound::Unbounded))
            .enumerate()
        {
            if count == MAX_EXAMINED
                && let Some(last) = examined
            {
                if find_record(&self.records, last.1).is_some_and(seen) {
                    page.next = Some(*last);
                    return page;
                }
                ending_with = Some(last.0);
            }
            if let Some(millisecond) = ending_with
                && key.0 != millisecond
            {
                page.next = Some((millisecond, Uuid::max()));
                return page;
            }
            examined = Some(key);
            let Some(approval) = find_record(&self.records, key.1) else {
                continue;
            };
            let matches = query.status.is_none_or(|status| approval.status == status)
                && query
                    .actor
                    .as_deref()
                    .is_none_or(|actor| approval.request.actor == actor)
                && query
                    .tool
                    .as_deref()
                    .is_none_or(|tool| approval.request.tool == tool)
                && query.id_prefix.as_deref().is_none_or(|prefix| {
                    approval
                        .id
                        .hyphenated()
                        .encode_lower(&mut id_text)
                        .starts_with(prefix)
                })
                && seen(approval);
            if !matches {
                continue;
            }
            let size = approx_size(approval);
            let over_bytes = query.max_bytes > 0
                && !page.approvals.is_empty()
                && page_bytes.saturating_add(size) > query.max_bytes;
            if page.approvals.len() == query.page_size || over_bytes {
                page.next = page
                    .approvals
                    .last()
                    .map(|last| (last.requested_at, last.id));
                return page;
            }
            page_bytes = page_bytes.saturating_add(size);
            page.approvals.push(approval.clone());
        }
        page
    }

    /// Moves a live approval to a final status.
    fn finish(
        &mut self,
        id: Uuid,
        status: ApprovalStatus,
        now: Timestamp,
        reviewer: Option<&str>,
        note: String,
    ) -> Option<ApprovalEvent> {
        let approval = find_record_mut(&mut self.records, id)?;
        let was = approval.status;
        if !was.is_live() {
            return None;
        }
        if was == ApprovalStatus::Pending {
            decrement_pending(
                &mut self.pending_total,
                &mut self.pending_by_actor,
                &mut self.pending_by_host,
                approval,
            );
        }
        self.deadlines.remove(&(approval.expires_at, id));
        let bytes_before = record_bytes(approval);
        approval.status = status;
        approval.finished_at = Some(now);
        if let Some(reviewer) = reviewer {
            // A revoke replaces the grant's time, which finds its change
            // (`finished_change_keys`): that change goes now, the end's
            // holds all it held.
            if let (ApprovalStatus::Granted, Some(granted_at)) = (was, approval.decided_at) {
                self.journal.delete(
                    Kind::ApprovalChange,
                    change_key(granted_at, id, ApprovalStatus::Granted),
                );
            }
            approval.decided_by = Some(reviewer.to_string());
            approval.decided_at = Some(now);
            approval.decision_note = note;
        }
        let bytes_after = record_bytes(approval);
        self.bytes = (self.bytes + bytes_after).saturating_sub(bytes_before);
        self.evictable_bytes = self.evictable_bytes.saturating_add(bytes_after);
        self.journal.put(
            Kind::ApprovalChange,
            change_key(now, id, status),
            &ApprovalChange::of(approval),
        );
        let kind = match status {
            ApprovalStatus::Denied => EventKind::Denied,
            ApprovalStatus::Revoked => EventKind::Revoked,
            ApprovalStatus::Consumed => EventKind::Consumed,
            _ => EventKind::Expired,
        };
        let event = ApprovalEvent {
            kind,
            approval: approval.clone(),
        };
        if status == ApprovalStatus::Denied {
            self.denied.insert((now, self.finish_serial), id);
        } else {
            self.finished.insert((now, self.finish_serial), id);
        }
        self.finish_serial += 1;
        Some(event)
    }

    /// Drops a finished record (already taken out of `finished` or
    /// `denied` by the caller) and its index entries; a live one is kept.
    fn evict(&mut self, id: Uuid) {
        let hash = self.records.hash(&id);
        match self.records.find(hash, |approval| approval.id == id) {
            Some(approval) if !approval.status.is_live() => {}
            _ => return,
        }
        let Some(approval) = self.records.remove(hash, |approval| approval.id == id) else {
            return;
        };
        self.journal.delete(Kind::Approval, record_key(&approval));
        for key in finished_change_keys(&approval) {
            self.journal.delete(Kind::ApprovalChange, key);
        }
        let bytes = record_bytes(&approval);
        self.bytes = self.bytes.saturating_sub(bytes);
        self.evictable_bytes = self.evictable_bytes.saturating_sub(bytes);
        self.by_request.remove(&(approval.requested_at, id));
        // Only when it is still the latest for its (workspace, fingerprint).
        let current = current_hash(
            &self.current,
            &approval.request.workspace,
            &approval.request.fingerprint,
        );
        self.current.remove(current, |entry| entry.id == id);
    }
}

/// When a finished record finished, as its eviction queue orders it.
fn finish_time(approval: &Approval) -> Timestamp {
    approval.finished_at.unwrap_or(approval.requested_at)
}

/// The (request time, id) of the key an approval is stored under; `None`
/// when the key was not made by [`record_key`].
pub fn parse_record_key(key: &[u8]) -> Option<(Timestamp, Uuid)> {
    let [at, id] = <[&[u8]; 2]>::try_from(records::split_key(key)?).ok()?;
    let at = u64::from_be_bytes(at.try_into().ok()?);
    let id = Uuid::from_slice(id).ok()?;
    Some((Timestamp(at), id))
}

/// The (time, id) of the key a change is stored under; `None` when the key
/// was not made by [`change_key`].
pub fn parse_change_key(key: &[u8]) -> Option<(Timestamp, Uuid)> {
    let [at, id, [1 | 2]] = <[&[u8]; 3]>::try_from(records::split_key(key)?).ok()? else {
        return None;
    };
    let at = u64::from_be_bytes(at.try_into().ok()?);
    let id = Uuid::from_slice(id).ok()?;
    Some((Timestamp(at), id))
}

/// A stored change: its key and value decoded.
pub fn decode_change(key: &[u8], value: &[u8]) -> Result<StoredChange> {
    let (_, id) =
        parse_change_key(key).ok_or_else(|| records::corrupt_key(Kind::ApprovalChange))?;
    // Its text is owned whatever the value holds (no `serde(borrow)`).
    let change = records::decode_value(Kind::ApprovalChange, value)?;
    Ok((id, change))
}

/// A new pending record for `new`, requested `now`, expiring after the
/// pending TTL.
fn pending_approval(mut request: NewApproval, now: Timestamp, limits: &Limits) -> Approval {
    // The byte budget counts the text's length: hold no more than that.
    request.arguments_view.shrink_to_fit();
    Approval {
        id: Uuid::new_v4(),
        request,
        status: ApprovalStatus::Pending,
        requested_at: now,
        expires_at: now.saturating_add(limits.pending_ttl),
        decided_by: None,
        decided_at: None,
        decision_note: String::new(),
        finished_at: None,
    }
}

/// One pending request fewer for the approval's actor and host.
fn decrement_pending(
    pending_total: &mut usize,
    pending_by_actor: &mut HashMap<String, usize>,
    pending_by_host: &mut HashMap<String, usize>,
    approval: &Approval,
) {
    *pending_total = pending_total.saturating_sub(1);
    for (counts, key) in [
        (pending_by_actor, &approval.request.actor),
        (pending_by_host, &approval.request.host),
    ] {
        if let Some(count) = counts.get_mut(key) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                counts.remove(key);
            }
        }
    }
}

/// SPEC §5 authority: an approver role of the tool, the request's workspace,
/// and never the reviewer's own actor's request.
fn check_authority(approval: &Approval, reviewer_identity: &str, policy: &Policy) -> Result<()> {
    let Some(reviewer) = policy.reviewers.get(reviewer_identity) else {
        return Err(Error::PermissionDenied(format!(
            "{reviewer_identity:?} is not a reviewer in the policy"
        )));
    };
    // An approval the reviewer may not see, it learns nothing of here
    // either (reading it is NOT_FOUND): not its tool, workspace or actor.
    if !visible_to(approval, reviewer_identity, policy) {
        return Err(Error::PermissionDenied(format!(
            "reviewer {reviewer_identity:?} may not review this approval \
             (it needs an approver role of its tool and its workspace)"
        )));
    }
    // Identifiers are ASCII: case is the only way to spell one name twice.
    if reviewer
        .identity
        .eq_ignore_ascii_case(&approval.request.actor)
    {
        return Err(Error::PermissionDenied(
            "a reviewer may not decide a request made by its own actor".into(),
        ));
    }
    let Some(tool) = policy.tools.get(&approval.request.tool) else {
        return Err(Error::PermissionDenied(format!(
            "tool {:?} is no longer in the policy; nobody may approve it",
            approval.request.tool
        )));
    };
    if !tool
        .approvers
        .iter()
        .any(|role| reviewer.roles.contains(role))
    {
        return Err(Error::PermissionDenied(format!(
            "reviewer {reviewer_identity:?} holds no approver role of {:?}",
            approval.request.tool
        )));
    }
    if !reviewer.covers_workspace(&approval.request.workspace) {
        return Err(Error::PermissionDenied(format!(
            "reviewer {reviewer_identity:?} may not act in workspace {:?}",
            approval.request.workspace
        )));
    }
    Ok(())
}

#[cfg(test)]
impl NewApproval {
    /// A request of `tool` with `call_id` (tests): one host, actor, session
    /// and workspace, the fingerprint of the call id.
    pub(crate) fn sample(tool: &str, call_id: &str) -> NewApproval {
        NewApproval {
            fingerprint: Fingerprint::of_bytes(call_id.as_bytes()),
            host: "h".into(),
            actor: "a".into(),
            session_id: "s".into(),
            workspace: "w".into(),
            tool: tool.into(),
            call_id: call_id.into(),
            version: 0,
            arguments_view: "{}".into(),
            reason: Reason::ApprovalRequired,
        }
    }
}

#[cfg(test)]
impl Ledger {
    /// Every record and index, in a stable order, for tests that compare
    /// two ledgers. `ties_sorted`: records finished in one millisecond are
    /// listed by id, not in the order they queue (which restore cannot know).
    pub(crate) fn dump(&self, ties_sorted: bool) -> String {
        let mut records: Vec<&Approval> = self.records.iter().map(|record| &**record).collect();
        records.sort_by_key(|record| record.id);
        let sorted = |counts: &HashMap<String, usize>| {
            let mut counts: Vec<(String, usize)> = counts
                .iter()
                .map(|(key, count)| (key.clone(), *count))
                .collect();
            counts.sort();
            counts
        };
        let mut current: Vec<(String, String, Uuid)> = self
            .current
            .iter()
            .map(|current| {
                let fingerprint = current.fingerprint.to_string();
                (current.workspace.clone(), fingerprint, current.id)
            })
            .collect();
        current.sort();
        let queue = |queue: &BTreeMap<(Timestamp, u64), Uuid>| {
            let mut listed: Vec<(Timestamp, Uuid)> =
                queue.iter().map(|((at, _), id)| (*at, *id)).collect();
            if ties_sorted {
                listed.sort();
            }
            listed
        };
        format!(
            "records {records:#?}\nbytes {} evictable {} pending {}\nby actor {:?}\n\
             by host {:?}\ncurrent {current:?}\ndeadlines {:?}\nfinished {:?}\n\
             denied {:?}\nby request {:?}\n",
            self.bytes,
            self.evictable_bytes,
            self.pending_total,
            sorted(&self.pending_by_actor),
            sorted(&self.pending_by_host),
            self.deadlines,
            queue(&self.finished),
            queue(&self.denied),
            self.by_request,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const POLICY: &str = r#"
[profiles.agent]
roles = ["agent"]

[actors.a]
profile = "agent"

[tools.shown]
mode = "execute"
roles = ["agent"]
approvers = ["seer"]
approval = "always"

[tools.hidden]
mode = "execute"
roles = ["agent"]
approvers = ["other"]
approval = "always"

[reviewers.seer]
roles = ["seer"]
workspaces = ["*"]

[server]
open_host_api = true
"#;

    fn request(ledger: &mut Ledger, policy: &Policy, tool: &str, n: usize, at: u64) -> Uuid {
        let new = NewApproval::sample(tool, &format!("{tool}-{n}"));
        ledger
            .create(new, Timestamp(at), &policy.limits)
            .approval
            .id
    }

    /// A page that ends at the scan bound on a record its reviewer may not
    /// see hands out no part of that record's id, skips nothing and still
    /// goes on: the token is the end of that record's millisecond.
    #[test]
    fn a_page_ending_at_the_scan_bound_names_no_hidden_record() {
        let mut policy = Policy::parse(POLICY, "list.toml", None).unwrap();
        policy.limits.max_approval_records = 3 * MAX_EXAMINED;
        policy.limits.max_pending_total = 3 * MAX_EXAMINED;
        let mut ledger = Ledger::default();
        let mut hidden = BTreeSet::new();
        // Hidden records in two milliseconds, the bound falling inside the
        // second, which also holds a record the reviewer sees.
        for n in 0..MAX_EXAMINED + 5 {
            let at = if n < MAX_EXAMINED - 5 { 1 } else { 2 };
            hidden.insert(request(&mut ledger, &policy, "hidden", n, at));
        }
        let shown = [
            request(&mut ledger, &policy, "shown", 0, 2),
            request(&mut ledger, &policy, "shown", 1, 3),
        ];
        let mut query = ListQuery {
            viewer: Some("seer".into()),
            page_size: 100,
            ..ListQuery::default()
        };
        let mut listed = Vec::new();
        let mut pages = 0;
        loop {
            let page = ledger.list(&query, &policy);
            listed.extend(page.approvals.iter().map(|approval| approval.id));
            pages += 1;
            let Some(next) = page.next else { break };
            assert!(
                !hidden.contains(&next.1),
                "page {pages} names a hidden record"
            );
            query.after = Some(next);
        }
        assert_eq!(listed, shown);
        assert!(pages <= 3);

        // The bound's millisecond holds only hidden records: the token is
        // its end.
        let mut ledger = Ledger::default();
        for n in 0..MAX_EXAMINED + 5 {
            request(&mut ledger, &policy, "hidden", n, 1 + (n / 1000) as u64);
        }
        query.after = None;
        let page = ledger.list(&query, &policy);
        assert!(page.approvals.is_empty());
        assert_eq!(page.next, Some((Timestamp(10), Uuid::max())));
        // The bound on a record the caller sees is that record's key.
        query.viewer = None;
        query.status = Some(ApprovalStatus::Granted);
        let page = ledger.list(&query, &policy);
        let bound = ledger.by_request.iter().nth(MAX_EXAMINED - 1).copied();
        assert_eq!(page.next, bound);
    }
}
