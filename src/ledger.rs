//! The approval ledger (SPEC §5): requests bound to proposal fingerprints,
//! their lifecycle, expiry, caps and the reviewer's authority.
//!
//! `pending → granted | denied | expired`; `granted → consumed | revoked |
//! expired`. Every transition returns an [`ApprovalEvent`] for the audit log
//! and for watchers.

use std::collections::{BTreeSet, HashMap};

use uuid::Uuid;

use crate::canonical::Fingerprint;
use crate::clock::Timestamp;
use crate::error::{Error, Result};
use crate::policy::{Limits, Policy};

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

    fn is_live(self) -> bool {
        matches!(self, ApprovalStatus::Pending | ApprovalStatus::Granted)
    }
}

/// One approval request.
#[derive(Debug, Clone, PartialEq)]
pub struct Approval {
    pub id: Uuid,
    pub fingerprint: Fingerprint,
    pub actor: String,
    pub session_id: String,
    pub workspace: String,
    pub tool: String,
    pub call_id: String,
    pub version: u64,
    /// Canonical JSON of the arguments with sensitive fields redacted. The
    /// real values are bound by the fingerprint and never stored here.
    pub arguments_view: String,
    pub reason: &'static str,
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

/// What a new request is made of.
#[derive(Debug, Clone)]
pub struct NewApproval {
    pub fingerprint: Fingerprint,
    pub actor: String,
    pub session_id: String,
    pub workspace: String,
    pub tool: String,
    pub call_id: String,
    pub version: u64,
    pub arguments_view: String,
    pub reason: &'static str,
}

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
    pub reason: &'static str,
}

impl From<&Approval> for ApprovalRef {
    fn from(approval: &Approval) -> Self {
        ApprovalRef {
            id: approval.id,
            expires_at: approval.expires_at,
            reason: approval.reason,
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
    pub after: Option<PageKey>,
    pub page_size: usize,
}

/// One page of approvals, in request order.
#[derive(Debug, Clone, Default)]
pub struct Page {
    pub approvals: Vec<Approval>,
    /// Set when more may follow: pass it as the next query's `after`.
    pub next: Option<PageKey>,
}

#[derive(Debug, Default)]
pub struct Ledger {
    records: HashMap<Uuid, Approval>,
    /// The latest approval per (workspace, fingerprint).
    current: HashMap<(String, Fingerprint), Uuid>,
    /// Live approvals by deadline, for exact and cheap expiry.
    deadlines: BTreeSet<(Timestamp, Uuid)>,
    /// Finished approvals (not denied) by finish time, evicted after retention.
    finished: BTreeSet<(Timestamp, Uuid)>,
    /// Denied approvals by finish time: kept so that denials stick, evicted
    /// only when the record cap needs room.
    denied: BTreeSet<(Timestamp, Uuid)>,
    /// All records by (requested_at, id): listing order and page tokens.
    by_request: BTreeSet<(Timestamp, Uuid)>,
    pending_by_actor: HashMap<String, usize>,
    pending_total: usize,
}

impl Ledger {
    pub fn len(&self) -> usize {
        self.records.len()
    }

    pub fn is_empty(&self) -> bool {
        self.records.is_empty()
    }

    pub fn pending_total(&self) -> usize {
        self.pending_total
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
        while let Some(&(finished_at, id)) = self.finished.first() {
            if finished_at > retention_cutoff {
                break;
            }
            self.evict(id);
        }
        events
    }

    /// The ledger's standing for a proposal in a workspace.
    pub fn standing(&self, workspace: &str, fingerprint: Fingerprint) -> Standing {
        let Some(approval) = self
            .current
            .get(&(workspace.to_string(), fingerprint))
            .and_then(|id| self.records.get(id))
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

    /// Checks the caps for one more pending request by `actor`.
    pub fn check_capacity(&self, actor: &str, limits: &Limits) -> Result<()> {
        if self.pending_total >= limits.max_pending_total {
            return Err(Error::ResourceExhausted(format!(
                "the approval ledger holds its maximum of {} pending requests",
                limits.max_pending_total
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
        while self.records.len() >= limits.max_approval_records {
            let oldest = self
                .finished
                .first()
                .or_else(|| self.denied.first())
                .copied();
            match oldest {
                Some((_, id)) => self.evict(id),
                None => break,
            }
        }
        let approval = Approval {
            id: Uuid::new_v4(),
            fingerprint: new.fingerprint,
            actor: new.actor,
            session_id: new.session_id,
            workspace: new.workspace,
            tool: new.tool,
            call_id: new.call_id,
            version: new.version,
            arguments_view: new.arguments_view,
            reason: new.reason,
            status: ApprovalStatus::Pending,
            requested_at: now,
            expires_at: now.saturating_add(limits.pending_ttl),
            decided_by: None,
            decided_at: None,
            decision_note: String::new(),
            finished_at: None,
        };
        *self
            .pending_by_actor
            .entry(approval.actor.clone())
            .or_insert(0) += 1;
        self.pending_total += 1;
        self.deadlines.insert((approval.expires_at, approval.id));
        self.by_request.insert((approval.requested_at, approval.id));
        self.current.insert(
            (approval.workspace.clone(), approval.fingerprint),
            approval.id,
        );
        self.records.insert(approval.id, approval.clone());
        ApprovalEvent {
            kind: EventKind::Requested,
            approval,
        }
    }

    pub fn get(&self, id: Uuid) -> Result<&Approval> {
        self.records
            .get(&id)
            .ok_or_else(|| Error::NotFound(format!("no approval {id}")))
    }

    /// Grant, deny or revoke by `reviewer`, whose authority is checked
    /// against the policy in force: an approver role of the tool, the
    /// request's workspace, and never its own actor's request.
    pub fn decide(
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
                self.transition(id, |approval| {
                    approval.status = ApprovalStatus::Granted;
                    approval.expires_at = expires_at;
                    approval.decided_by = Some(reviewer.to_string());
                    approval.decided_at = Some(now);
                    approval.decision_note = note;
                });
                self.pending_decrement(id);
                self.deadlines.insert((expires_at, id));
                let approval = self.get(id)?.clone();
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

    /// A page of approvals in request order.
    pub fn list(&self, query: &ListQuery) -> Page {
        let start = match query.after {
            Some(key) => std::ops::Bound::Excluded(key),
            None => std::ops::Bound::Unbounded,
        };
        let mut page = Page::default();
        for key in self.by_request.range((start, std::ops::Bound::Unbounded)) {
            let Some(approval) = self.records.get(&key.1) else {
                continue;
            };
            let matches = query.status.is_none_or(|status| approval.status == status)
                && query
                    .actor
                    .as_deref()
                    .is_none_or(|actor| approval.actor == actor)
                && query
                    .tool
                    .as_deref()
                    .is_none_or(|tool| approval.tool == tool);
            if !matches {
                continue;
            }
            if page.approvals.len() == query.page_size {
                page.next = page
                    .approvals
                    .last()
                    .map(|last| (last.requested_at, last.id));
                return page;
            }
            page.approvals.push(approval.clone());
        }
        page
    }

    fn transition(&mut self, id: Uuid, change: impl FnOnce(&mut Approval)) {
        if let Some(approval) = self.records.get_mut(&id) {
            self.deadlines.remove(&(approval.expires_at, id));
            change(approval);
        }
    }

    fn pending_decrement(&mut self, id: Uuid) {
        let Some(approval) = self.records.get(&id) else {
            return;
        };
        self.pending_total = self.pending_total.saturating_sub(1);
        if let Some(count) = self.pending_by_actor.get_mut(&approval.actor) {
            *count = count.saturating_sub(1);
            if *count == 0 {
                self.pending_by_actor.remove(&approval.actor);
            }
        }
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
        let was = self.records.get(&id)?.status;
        if !was.is_live() {
            return None;
        }
        if was == ApprovalStatus::Pending {
            self.pending_decrement(id);
        }
        self.transition(id, |approval| {
            approval.status = status;
            approval.finished_at = Some(now);
            if let Some(reviewer) = reviewer {
                approval.decided_by = Some(reviewer.to_string());
                approval.decided_at = Some(now);
                approval.decision_note = note;
            }
        });
        if status == ApprovalStatus::Denied {
            self.denied.insert((now, id));
        } else {
            self.finished.insert((now, id));
        }
        let kind = match status {
            ApprovalStatus::Denied => EventKind::Denied,
            ApprovalStatus::Revoked => EventKind::Revoked,
            ApprovalStatus::Consumed => EventKind::Consumed,
            _ => EventKind::Expired,
        };
        let approval = self.records.get(&id)?.clone();
        Some(ApprovalEvent { kind, approval })
    }

    fn evict(&mut self, id: Uuid) {
        let Some(approval) = self.records.remove(&id) else {
            return;
        };
        if approval.status.is_live() {
            // Never evict a live approval; put it back.
            self.records.insert(id, approval);
            return;
        }
        if let Some(finished_at) = approval.finished_at {
            self.finished.remove(&(finished_at, id));
            self.denied.remove(&(finished_at, id));
        }
        self.by_request.remove(&(approval.requested_at, id));
        let key = (approval.workspace, approval.fingerprint);
        if self.current.get(&key) == Some(&id) {
            self.current.remove(&key);
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
    if reviewer.identity == approval.actor {
        return Err(Error::PermissionDenied(
            "a reviewer may not decide a request made by its own actor".into(),
        ));
    }
    let Some(tool) = policy.tools.get(&approval.tool) else {
        return Err(Error::PermissionDenied(format!(
            "tool {:?} is no longer in the policy; nobody may approve it",
            approval.tool
        )));
    };
    if !tool
        .approvers
        .iter()
        .any(|role| reviewer.roles.contains(role))
    {
        return Err(Error::PermissionDenied(format!(
            "reviewer {reviewer_identity:?} holds no approver role of {:?}",
            approval.tool
        )));
    }
    if !reviewer.covers_workspace(&approval.workspace) {
        return Err(Error::PermissionDenied(format!(
            "reviewer {reviewer_identity:?} may not act in workspace {:?}",
            approval.workspace
        )));
    }
    Ok(())
}
