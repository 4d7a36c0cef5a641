//! The approvals API over the ledger (SPEC §5): reviews, reads, expiry.

use uuid::Uuid;

use crate::domain::clock::Timestamp;
use crate::domain::error::Result;
use crate::domain::ledger::{Approval, ApprovalEvent, ListQuery, Page, Verdict};
use crate::domain::policy::Policy;

use super::*;

impl State {
    /// Expires due approvals (exactly at their deadline, before any
    /// operation reads the ledger) and evicts finished records past retention.
    pub fn expire_due(&mut self, policy: &Policy, now: Timestamp) -> Vec<ApprovalEvent> {
        self.ledger.expire_due(now, &policy.limits)
    }

    /// Periodic sweep: also evicts idle sessions.
    pub fn sweep(&mut self, policy: &Policy, now: Timestamp) -> Vec<ApprovalEvent> {
        self.sessions.evict_idle(now, &policy.limits);
        self.ledger.expire_due(now, &policy.limits)
    }

    pub fn get_approval(&self, id: Uuid) -> Result<Approval> {
        self.ledger.get(id).cloned()
    }

    pub fn list_approvals(&self, policy: &Policy, query: &ListQuery) -> Page {
        self.ledger.list(query, policy)
    }

    /// Grant, deny or revoke (SPEC §5) by the authenticated reviewer.
    pub fn review(
        &mut self,
        policy: &Policy,
        now: Timestamp,
        id: Uuid,
        verdict: Verdict,
        reviewer: &str,
        note: String,
    ) -> Result<ApprovalEvent> {
        self.ledger.review(id, verdict, reviewer, note, policy, now)
    }
}
