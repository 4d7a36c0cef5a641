//! `Engine`: the cheap-to-clone handle every RPC goes through. It holds the
//! current policy snapshot, the clock and the one `State`.
//!
//! Locking: `State` sits behind a `std::sync::Mutex`. Every operation is
//! synchronous and short (no I/O, no `.await` while held), so a blocking
//! mutex is cheaper than an async one and cannot be held across a suspension
//! point by construction. The policy sits behind an `RwLock<Arc<Policy>>`:
//! readers clone the `Arc` (a snapshot) and release the lock at once; a
//! reload swaps the whole `Arc`.

use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use crate::audit;
use crate::canonical::Fingerprint;
use crate::clock::Clock;
use crate::error::{Error, Result};
use crate::manifest::{Assessment, Manifest};
use crate::policy::Policy;
use crate::state::{PinRecord, State};

#[derive(Clone, Debug)]
pub struct Engine {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    policy: RwLock<Arc<Policy>>,
    clock: Arc<dyn Clock>,
    state: Mutex<State>,
}

impl Engine {
    pub fn new(policy: Policy, clock: Arc<dyn Clock>) -> Self {
        Engine {
            shared: Arc::new(Shared {
                policy: RwLock::new(Arc::new(policy)),
                clock,
                state: Mutex::new(State::default()),
            }),
        }
    }

    /// The policy in force now, as an immutable snapshot.
    pub fn policy(&self) -> Arc<Policy> {
        match self.shared.policy.read() {
            Ok(guard) => Arc::clone(&guard),
            Err(poisoned) => Arc::clone(&poisoned.into_inner()),
        }
    }

    /// Swaps in a new policy whole. State made through the API (pins,
    /// approvals, receipts) is kept.
    pub fn replace_policy(&self, policy: Policy) {
        let revision = policy.revision.clone();
        let new_policy = Arc::new(policy);
        match self.shared.policy.write() {
            Ok(mut guard) => *guard = new_policy,
            Err(poisoned) => *poisoned.into_inner() = new_policy,
        }
        audit!("policy_reloaded", policy_revision = %revision);
    }

    /// Locks the state. A poisoned lock means an operation panicked halfway:
    /// refuse everything rather than act on possibly inconsistent state.
    fn state(&self) -> Result<MutexGuard<'_, State>> {
        self.shared
            .state
            .lock()
            .map_err(|_| Error::Internal("state is unavailable after an internal failure".into()))
    }

    pub fn assess_manifest(&self, manifest: &Manifest) -> Result<Assessment> {
        let policy = self.policy();
        let assessment = self.state()?.assess_manifest(&policy, manifest);
        audit!(
            "manifest_assessed",
            server_id = %manifest.server_id,
            fingerprint = %assessment.fingerprint,
            pinned_fingerprint = ?assessment.pinned_fingerprint.map(|fingerprint| fingerprint.to_hex()),
            reason = assessment.reason.as_str(),
            changed_tools = assessment.diffs.len(),
        );
        Ok(assessment)
    }

    pub fn pin_manifest(
        &self,
        reviewer: &str,
        manifest: Manifest,
        expected: Option<Fingerprint>,
    ) -> Result<PinRecord> {
        let now = self.shared.clock.now();
        let record = self
            .state()?
            .pin_manifest(now, reviewer, manifest, expected)?;
        audit!(
            "pin_changed",
            action = "pinned",
            server_id = %record.server_id,
            fingerprint = %record.fingerprint,
            reviewer = %reviewer,
        );
        Ok(record)
    }

    pub fn list_pins(&self) -> Result<Vec<PinRecord>> {
        let policy = self.policy();
        Ok(self.state()?.list_pins(&policy))
    }

    pub fn remove_pin(&self, reviewer: &str, server_id: &str) -> Result<PinRecord> {
        let policy = self.policy();
        let record = self.state()?.remove_pin(&policy, server_id)?;
        audit!(
            "pin_changed",
            action = "removed",
            server_id = %record.server_id,
            fingerprint = %record.fingerprint,
            reviewer = %reviewer,
        );
        Ok(record)
    }
}
