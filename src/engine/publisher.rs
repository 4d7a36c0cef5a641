//! Where ledger transitions go out: audited, counted and sent to watchers,
//! in commit order, each once its batch is durable.
//!
//! A call's transitions are queued under the state lock with the number
//! of its batch, so the queue is in commit order. Whichever call finds a
//! batch durable first publishes it and everything before it
//! ([`Publisher::flush`]); a batch that never took effect is dropped. On a
//! shared store (replicas) the turn host takes what is queued at the start
//! of a turn or a catch-up, when the turn before has committed, and
//! publishes it before the other replicas' transitions it takes in
//! ([`Publisher::take_settled`]), which came after it in the store.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};

use tokio::sync::broadcast;

use super::Watched;
use crate::audit;
use crate::domain::ids::id_text;
use crate::domain::ledger::ApprovalEvent;
use crate::ops::metrics::Metrics;

#[derive(Debug)]
pub(super) struct Publisher {
    /// Every ledger transition, for `WatchApprovals`. A broadcast channel
    /// never blocks the sender: a slow watcher lags, the ledger does not wait.
    pub(super) events: broadcast::Sender<Watched>,
    /// This replica's transitions waiting for their batch, in commit order.
    queued: Mutex<VecDeque<(u64, Vec<ApprovalEvent>)>>,
    /// Counters, when a server attached them (lock-free to read).
    pub(super) metrics: OnceLock<Arc<Metrics>>,
}

impl Publisher {
    pub(super) fn new(events: broadcast::Sender<Watched>) -> Self {
        Publisher {
            events,
            queued: Mutex::new(VecDeque::new()),
            metrics: OnceLock::new(),
        }
    }

    fn queued(&self) -> MutexGuard<'_, VecDeque<(u64, Vec<ApprovalEvent>)>> {
        match self.queued.lock() {
            Ok(queued) => queued,
            Err(poisoned) => poisoned.into_inner(),
        }
    }

    /// Queues the transitions of the batch `number` (under the state lock).
    pub(super) fn queue(&self, number: u64, transitions: Vec<ApprovalEvent>) {
        if !transitions.is_empty() {
            self.queued().push_back((number, transitions));
        }
    }

    /// Publishes the queued transitions whose batch `settled` says is
    /// durable (`Some(true)`), oldest first, drops those of a batch that
    /// never took effect (`Some(false)`), and stops at the first still in
    /// flight (`None`); under the queue's lock, so in commit order however
    /// the calls that made them are scheduled.
    pub(super) fn flush(&self, settled: impl Fn(u64) -> Option<bool>) {
        let mut queued = self.queued();
        drain_settled(&mut queued, &settled, |transitions| {
            self.publish(transitions)
        });
    }

    /// The transitions of the settled batches, taken out by a shared
    /// store's turn host under the state lock when the turn before has
    /// committed: those of durable batches, in order (an abandoned batch's
    /// are dropped: its callers were told it did not take effect; one not
    /// settled stays queued). Published by the host, with
    /// [`Publisher::publish`], before the transitions it takes in, also
    /// when it loads everything again: what was durable was committed.
    pub(super) fn take_settled(&self, settled: &dyn Fn(u64) -> Option<bool>) -> Vec<ApprovalEvent> {
        let mut durable = Vec::new();
        drain_settled(&mut self.queued(), settled, |transitions| {
            durable.extend(transitions);
        });
        durable
    }

    /// Audits ledger transitions, counts them and sends them to watchers,
    /// in the order given.
    pub(super) fn publish(&self, transitions: impl IntoIterator<Item = ApprovalEvent>) {
        for event in transitions {
            let approval = &event.approval;
            let approval_id = id_text(approval.id);
            audit!(
                event.kind.audit_name(),
                approval_id = &*approval_id,
                fingerprint = approval.request.fingerprint.hex().as_str(),
                actor = approval.request.actor.as_str(),
                session_id = approval.request.session_id.as_str(),
                workspace = approval.request.workspace.as_str(),
                tool = approval.request.tool.as_str(),
                call_id = approval.request.call_id.as_str(),
                status = approval.status.as_str(),
                reviewer = approval.decided_by.as_deref(),
                // The reviewer's words: a grant's comment, a denial's or
                // revocation's reason.
                note = Some(approval.decision_note.as_str()).filter(|note| !note.is_empty()),
            );
            if let Some(metrics) = self.metrics.get() {
                metrics.transition(event.kind.audit_name());
            }
            // No receivers is fine: nobody is watching.
            let _ = self.events.send(Watched::Transition(event));
        }
    }

    /// Sends what a replica took in from the others (already durable, and
    /// audited where it was made).
    pub(super) fn send(&self, watched: Vec<Watched>) {
        for event in watched {
            // No receivers is fine: nobody is watching.
            let _ = self.events.send(event);
        }
    }
}

/// Takes the settled batches off the front of `queued`, in order, handing
/// the transitions of each durable one to `durable` (an abandoned batch's
/// are dropped); stops at the first batch not settled.
fn drain_settled(
    queued: &mut VecDeque<(u64, Vec<ApprovalEvent>)>,
    settled: &dyn Fn(u64) -> Option<bool>,
    mut durable: impl FnMut(Vec<ApprovalEvent>),
) {
    while let Some((number, _)) = queued.front() {
        let Some(made) = settled(*number) else {
            break;
        };
        let Some((_, transitions)) = queued.pop_front() else {
            break;
        };
        if made {
            durable(transitions);
        } else {
            // Not published: nobody was told they took effect. Named, so
            // that an operator can look up those whose commit's outcome was
            // unknown (the store says whether each took place).
            for event in transitions {
                tracing::warn!(
                    approval_id = %event.approval.id,
                    transition = event.kind.audit_name(),
                    "an approval transition of a commit that did not take effect (or whose \
                     outcome is unknown) is not audited"
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::clock::Timestamp;
    use crate::domain::ledger::{Ledger, NewApproval};
    use crate::domain::policy::Policy;

    fn requested(
        ledger: &mut Ledger,
        call_id: &str,
        limits: &crate::domain::policy::Limits,
    ) -> ApprovalEvent {
        ledger.create(NewApproval::sample("t", call_id), Timestamp(1), limits)
    }

    /// A replica that loads everything again still publishes its own
    /// transitions of durable batches (their callers were told they took
    /// effect): only an abandoned batch's are dropped, and a batch not yet
    /// settled stays queued.
    #[test]
    fn the_settled_batches_give_their_durable_transitions() {
        let policy = Policy::embedded_default().unwrap();
        let mut ledger = Ledger::default();
        let (events, _) = broadcast::channel(8);
        let publisher = Publisher::new(events);
        for (number, call_id) in [(1, "durable"), (2, "abandoned"), (3, "unsettled")] {
            publisher.queue(
                number,
                vec![requested(&mut ledger, call_id, &policy.limits)],
            );
        }
        let settled = |number: u64| match number {
            1 => Some(true),
            2 => Some(false),
            _ => None,
        };
        let taken = publisher.take_settled(&settled);
        let calls: Vec<&str> = (taken.iter())
            .map(|event| event.approval.request.call_id.as_str())
            .collect();
        assert_eq!(calls, ["durable"]);
        let left: Vec<u64> = publisher
            .queued()
            .iter()
            .map(|(number, _)| *number)
            .collect();
        assert_eq!(left, [3]);
    }
}
