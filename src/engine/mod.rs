//! `Engine`: the cheap-to-clone handle every RPC goes through. It holds the
//! current policy snapshot, the clock, the one `State` and the writer of the
//! store the state is kept in.
//!
//! Locking: `State` sits behind a `std::sync::Mutex`. Every operation is
//! synchronous and short (no I/O, no `.await` while held), so a blocking
//! mutex is cheaper than an async one and cannot be held across a suspension
//! point by construction. Under the lock an operation also hands its changes
//! to the group-commit writer, in commit order; after the lock it waits
//! until they (and every change it could have observed) are durable, and
//! only then are its answer, its audit line and its ledger events released
//! ([`store::writer`](crate::store::writer)). The policy sits behind an `RwLock<Arc<Policy>>`:
//! readers clone the `Arc` (a snapshot) and release the lock at once; a
//! reload swaps the whole `Arc`.

pub mod bootstrap;
mod publisher;
pub mod reload;
mod replica;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::Duration;

use tokio::sync::broadcast;
use uuid::Uuid;

use crate::audit;
use crate::domain::canonical::Fingerprint;
use crate::domain::canonical::Value;
use crate::domain::clock::{Clock, Timestamp};
use crate::domain::decision::{ANSWER_OVERHEAD_BYTES, Decision, DispatchStatus, Dispatched};
use crate::domain::error::{Error, Result};
use crate::domain::ids::id_text;
use crate::domain::ledger::{Approval, ApprovalEvent, ListQuery, Page, Verdict};
use crate::domain::limits::{ResourceListing, ResourceRead};
use crate::domain::manifest::{Assessment, Manifest};
use crate::domain::pins::PinRecord;
use crate::domain::policy::{Credential, CredentialKind, Policy, Serving};
use crate::domain::proposal::{self, Proposal, SessionRef};
use crate::domain::resources::{PagePosition, ResourcePage};
use crate::domain::session::SessionSummary;
use crate::domain::state::{Grants, State, Stats};
use crate::ops::audit;
use crate::ops::metrics::Metrics;
use crate::store::memory::MemoryStore;
use crate::store::writer::Gate;
use crate::store::writer::Writer;
use crate::store::{Behind, Store};
use publisher::Publisher;

/// Ledger transitions buffered per watcher before it is told it lagged.
pub const WATCH_BUFFER: usize = 1024;

/// What a watcher of the ledger is sent ([`Engine::subscribe`]).
#[derive(Debug, Clone)]
#[allow(
    clippy::large_enum_variant,
    reason = "nearly every message is a transition: boxing it would allocate for each"
)]
pub enum Watched {
    /// A transition, in commit order.
    Transition(ApprovalEvent),
    /// Transitions this replica never saw one by one: it fell too far
    /// behind the other replicas' commits and loaded the whole state
    /// instead. At least this many approvals changed meanwhile.
    Missed(u64),
}

#[derive(Clone, Debug)]
pub struct Engine {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    /// Shared with the store's writer on a shared store (replicas), which
    /// takes what other replicas committed into the state.
    policy: Arc<RwLock<Arc<Policy>>>,
    clock: Arc<dyn Clock>,
    state: Arc<Mutex<State>>,
    /// Ledger transitions out to the audit log and watchers, in commit
    /// order (shared with a shared store's turn host).
    publisher: Arc<Publisher>,
    /// Credentials made at start (the embedded default's reviewer token),
    /// kept across policy reloads.
    runtime_credentials: RwLock<HashMap<Fingerprint, Arc<Credential>>>,
    /// Set once when the server begins to shut down; ends watch streams.
    closing: tokio::sync::watch::Sender<bool>,
    /// Budgets for the audit lines clients can cause at will.
    coalescer: audit::Coalescer,
    /// Counts policy swaps, so that watch streams re-check their credential.
    reloads: tokio::sync::watch::Sender<u64>,
    /// Makes the state's changes durable (group commit).
    writer: Writer,
    /// Set when a change could not be handed to the writer: the state is
    /// then ahead of the store, and every call is refused.
    broken: std::sync::OnceLock<String>,
}

impl Engine {
    /// An engine on a new memory store: it forgets everything when dropped
    /// (tests, benchmarks, `serve --store memory`).
    pub fn new(policy: Policy, clock: Arc<dyn Clock>) -> Result<Self> {
        Engine::open(policy, clock, Box::new(MemoryStore::new()))
    }

    /// An engine on the state `store` holds (recovery): the state is
    /// restored under `policy`, what is due expires against `clock`, and
    /// what that changed is committed before the engine answers anything.
    /// On a shared store (replicas) all of it happens in one turn, at the
    /// store's time, and so does every operation after it
    /// ([`store`](crate::store)).
    pub fn open(policy: Policy, clock: Arc<dyn Clock>, mut store: Box<dyn Store>) -> Result<Self> {
        let unavailable =
            |error: crate::store::StoreError| Error::Unavailable(format!("the store: {error}"));
        // A shared store's first turn sets the time; a store of this
        // process alone is read first, and its time set after it.
        let (records, turn_time) = if store.shared() {
            let turn = store.begin_turn().map_err(unavailable)?;
            match turn.behind {
                Some(Behind::Everything(records)) => {
                    (records, Some(replica::time_of(clock.as_ref(), turn.now)))
                }
                _ => {
                    let _ = store.commit(&[]);
                    return Err(Error::Internal(
                        "a shared store's first turn must hand back every record".into(),
                    ));
                }
            }
        } else {
            (store.load().map_err(unavailable)?, None)
        };
        let mut state = State::restore(&policy, records)?;
        // A store of this process alone: its time goes on from the latest
        // the state holds, should the clock have been set back meanwhile.
        let now = match turn_time {
            Some(now) => now,
            None => {
                let latest = state.latest_time();
                let behind = latest.millis_since(clock.now());
                if behind > 1_000 {
                    tracing::warn!(
                        behind_seconds = behind / 1_000,
                        "the clock is behind the latest time the store holds; time goes on \
                         from that time until the clock catches up"
                    );
                }
                clock.not_before(latest);
                clock.now()
            }
        };
        let expired = state.sweep(&policy, now);
        store.commit(&state.take_changes()?).map_err(unavailable)?;
        if !store.keeps_records() {
            state.stop_journaling();
        }
        let policy = Arc::new(policy);
        let shared_policy = Arc::new(RwLock::new(Arc::clone(&policy)));
        let state = Arc::new(Mutex::new(state));
        let (events, _) = broadcast::channel(WATCH_BUFFER);
        let publisher = Arc::new(Publisher::new(events));
        let host = store.shared().then(|| {
            Box::new(replica::Host {
                state: Arc::clone(&state),
                policy: Arc::clone(&shared_policy),
                publisher: Arc::clone(&publisher),
                adopted: policy,
                clock: Arc::clone(&clock),
            }) as Box<dyn crate::store::writer::TurnHost>
        });
        let writer = Writer::start(store, host)
            .map_err(|error| Error::Internal(format!("the store writer did not start: {error}")))?;
        let engine = Engine {
            shared: Arc::new(Shared {
                policy: shared_policy,
                clock,
                state,
                publisher,
                runtime_credentials: RwLock::new(HashMap::new()),
                closing: tokio::sync::watch::Sender::new(false),
                coalescer: audit::Coalescer::default(),
                reloads: tokio::sync::watch::Sender::new(0),
                writer,
                broken: std::sync::OnceLock::new(),
            }),
        };
        engine.shared.publisher.publish(expired);
        Ok(engine)
    }

    /// The store's name ("memory", "sqlite").
    pub fn store_name(&self) -> &'static str {
        self.shared.writer.store_name()
    }

    /// Commits what is pending and stops the store's writer: the last step
    /// of a shutdown. Every call after it is refused.
    pub fn close_store(&self) {
        self.close_store_within(Duration::MAX);
    }

    /// [`Engine::close_store`], waiting at most `wait` for the store's
    /// writer: whether it ended (a writer stuck in a sync on a hung disk is
    /// left behind; every answer given was durable already).
    pub fn close_store_within(&self, wait: Duration) -> bool {
        // Sessions' last activity, written at most once a second while
        // nothing else of them changes. (A shared store is written only in
        // turns; there it stays at most that late.)
        if self.shared.writer.gate().is_none()
            && let Ok(mut state) = self.state()
        {
            state.note_every_touch();
            let _ = self.hand_to_writer(&mut state, Vec::new());
        }
        let _ = self
            .shared
            .broken
            .set("toolgate has shut down its store".into());
        self.shared.writer.close_within(wait)
    }

    pub fn now(&self) -> Timestamp {
        self.shared.clock.now()
    }

    /// Adds a credential that is not in the policy file and survives reloads.
    pub fn add_runtime_credential(&self, token_digest: Fingerprint, credential: Credential) {
        let credential = Arc::new(credential);
        match self.shared.runtime_credentials.write() {
            Ok(mut guard) => guard.insert(token_digest, credential),
            Err(poisoned) => poisoned.into_inner().insert(token_digest, credential),
        };
    }

    /// The credential whose token has this SHA-256 digest.
    pub fn credential(&self, token_digest: &Fingerprint) -> Option<Arc<Credential>> {
        if let Some(credential) = self.policy().credentials.get(token_digest) {
            return Some(Arc::clone(credential));
        }
        let runtime = match self.shared.runtime_credentials.read() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        runtime.get(token_digest).cloned()
    }

    /// The credential without a token that a verified client certificate
    /// is (by subject or by one of its URI SANs).
    pub fn certificate_credential(
        &self,
        peer: &crate::domain::policy::PeerCertificate,
    ) -> Option<Arc<Credential>> {
        let policy = self.policy();
        peer.identities()
            .find_map(|identity| policy.certificate_credentials.get(&identity))
            .cloned()
    }

    /// True when the policy declares at least one credential of this kind
    /// (or one was made at start).
    pub fn has_credentials(&self, kind: CredentialKind) -> bool {
        if self.policy().has_credentials(kind) {
            return true;
        }
        let runtime = match self.shared.runtime_credentials.read() {
            Ok(guard) => guard,
            Err(poisoned) => poisoned.into_inner(),
        };
        runtime.values().any(|credential| credential.kind == kind)
    }

    /// Attaches the metrics that decisions, dispatches and ledger
    /// transitions are counted in (once; later calls are ignored).
    pub fn attach_metrics(&self, metrics: Arc<Metrics>) {
        let for_batches = Arc::clone(&metrics);
        if self.shared.publisher.metrics.set(metrics).is_ok() {
            self.shared.writer.on_batch(Box::new(move |batch| {
                for_batches.store_batch(
                    batch.operations,
                    batch.sync.as_secs_f64(),
                    batch.store_bytes,
                );
            }));
        }
    }

    /// A policy reload was tried: counted in the metrics, when attached.
    pub fn note_reload(&self, successful: bool) {
        if let Some(metrics) = self.metrics() {
            metrics.reload(successful);
        }
    }

    fn metrics(&self) -> Option<&Metrics> {
        self.shared.publisher.metrics.get().map(Arc::as_ref)
    }

    /// Marks the engine as shutting down: long-lived streams end.
    pub fn begin_shutdown(&self) {
        self.shared.closing.send_replace(true);
    }

    /// Resolves once shutdown has begun.
    pub fn closed(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut closing = self.shared.closing.subscribe();
        async move {
            let _ = closing.wait_for(|closing| *closing).await;
        }
    }

    /// Changes each time a new policy is swapped in.
    pub fn reloads(&self) -> tokio::sync::watch::Receiver<u64> {
        self.shared.reloads.subscribe()
    }

    /// A receiver of every ledger transition from now on.
    pub fn subscribe(&self) -> broadcast::Receiver<Watched> {
        self.shared.publisher.events.subscribe()
    }

    /// Writes the audit line of a client-caused rejection through the
    /// coalescer: `write` gets the count of earlier lines of this kind that
    /// were coalesced (to report) and the policy revision; over the budget
    /// nothing is written and the line is only counted. Never waits.
    pub fn audit_rejection(&self, kind: audit::Rejection, write: impl FnOnce(u64, &str)) {
        // While the log sink is stalled a rejection is only counted: a flood
        // of them (a host retrying an old token) must not fill the log
        // writer's buffer until every caller that logs waits on it.
        if let Some(metrics) = self.metrics()
            && metrics.log_sink_stalled()
        {
            self.shared.coalescer.count(kind);
            metrics.audit_coalesced(kind.event_name());
            return;
        }
        match self.shared.coalescer.admit(kind, self.now()) {
            Some(coalesced) => write(coalesced, &self.policy().revision),
            None => {
                if let Some(metrics) = self.metrics() {
                    metrics.audit_coalesced(kind.event_name());
                }
            }
        }
    }

    /// Reports the rejections coalesced since their kind's last line, so
    /// that the count of a flood that has stopped still reaches the log.
    fn report_coalesced(&self) {
        // Not into a stalled sink: the counts wait until it drains.
        if self.metrics().is_some_and(Metrics::log_sink_stalled) {
            return;
        }
        for kind in audit::Rejection::ALL {
            let coalesced = self.shared.coalescer.take_pending(kind);
            if coalesced > 0 {
                audit!(
                    "audit_coalesced",
                    of = kind.event_name(),
                    coalesced,
                    policy_revision = self.policy().revision.as_str(),
                );
            }
        }
    }

    /// Decide (SPEC §4). Refusals are `Ok` answers; errors are invalid
    /// arguments, exhausted capacity or an internal failure (fail closed).
    pub async fn decide(
        &self,
        session: &SessionRef,
        proposal: &Proposal,
    ) -> Result<(Decision, String)> {
        self.decide_with(session, proposal, None, Grants::Keep)
            .await
    }

    /// An external authorizer's Check of a tool call (issue 17): Decide's
    /// check order, with a grant consumed at once ([`Grants::Consume`]),
    /// durable before the answer. Its audit line and answer carry
    /// `decision_id`.
    pub async fn authorize(
        &self,
        session: &SessionRef,
        proposal: &Proposal,
        decision_id: Uuid,
    ) -> Result<(Decision, String)> {
        self.decide_with(session, proposal, Some(decision_id), Grants::Consume)
            .await
    }

    /// Decide or a Check: screened without the lock, decided under it, the
    /// ledger transition published, counted and audited as `decision`.
    async fn decide_with(
        &self,
        session: &SessionRef,
        proposal: &Proposal,
        decision_id: Option<Uuid>,
        grants: Grants,
    ) -> Result<(Decision, String)> {
        let policy = self.policy();
        let screened = proposal::screen(&policy, session, proposal);
        let decision = self
            .with_expiry(&policy, |state, now, transitions| {
                let (decision, transition) =
                    state.decide(&policy, now, session, proposal, screened, grants)?;
                transitions.extend(transition);
                Ok(decision)
            })
            .await?;
        if let Some(metrics) = self.metrics() {
            metrics.decision(decision.reason);
        }
        let approval_id = decision.approval.map(|(id, _)| id_text(id));
        let decision_id = decision_id.map(id_text);
        audit!(
            "decision",
            outcome = decision.outcome.as_str(),
            reason = decision.reason.as_str(),
            fingerprint = decision.fingerprint.hex().as_str(),
            actor = session.actor.as_str(),
            session_id = session.session_id.as_str(),
            workspace = session.workspace.as_str(),
            tool = proposal.name.as_str(),
            call_id = proposal.call_id.as_str(),
            approval_id = approval_id.as_deref(),
            decision_id = decision_id.as_deref(),
            policy_revision = policy.revision.as_str(),
        );
        Ok((decision, policy.revision.clone()))
    }

    /// Dispatch (SPEC §6): commit one approved change exactly once.
    pub async fn dispatch(
        &self,
        session: &SessionRef,
        proposal: &Proposal,
    ) -> Result<(Dispatched, String)> {
        let policy = self.policy();
        let screened = proposal::screen(&policy, session, proposal);
        let dispatched = self
            .with_expiry(&policy, |state, now, transitions| {
                let (dispatched, events) =
                    state.dispatch(&policy, now, session, proposal, screened)?;
                transitions.extend(events);
                Ok(dispatched)
            })
            .await?;
        let result = dispatched.result.as_ref();
        if let Some(metrics) = self.metrics() {
            metrics.dispatch(dispatched.status);
        }
        let event = match dispatched.status {
            DispatchStatus::Ok => "tool_call_dispatched",
            _ => "dispatch_refused",
        };
        let receipt_id = dispatched.receipt_id.map(id_text);
        let approval_id = dispatched.approval_id.map(id_text);
        audit!(
            event,
            status = dispatched.status.as_str(),
            reason = dispatched.reason.as_str(),
            replayed = dispatched.replayed,
            fingerprint = dispatched.fingerprint.hex().as_str(),
            receipt_id = receipt_id.as_deref(),
            version = result.map_or(0, |result| result.version),
            resource = result
                .and_then(|result| result.resource.as_deref())
                .unwrap_or(""),
            actor = session.actor.as_str(),
            session_id = session.session_id.as_str(),
            tool = proposal.name.as_str(),
            call_id = proposal.call_id.as_str(),
            approval_id = approval_id.as_deref(),
            policy_revision = policy.revision.as_str(),
        );
        Ok((dispatched, policy.revision.clone()))
    }

    /// The sizes of the state in memory (start-up, tests).
    pub fn stats(&self) -> Result<Stats> {
        Ok(self.state()?.stats())
    }

    /// The sizes of the state, answered (as every read is) once what they
    /// count is durable: a scrape never counts a pending approval a crash
    /// would take back.
    pub async fn durable_stats(&self) -> Result<Stats> {
        self.committed(|state, _| Ok(state.stats())).await
    }

    /// A resource's value and version in memory, which the next answer
    /// builds on (tests; an answer to a client reads through
    /// [`Engine::read_resource`], which waits until what it read is
    /// durable).
    pub fn resource(&self, name: &str) -> Result<(Value, u64)> {
        self.state()?.resource(name)
    }

    /// An approval as it stands in memory (tests; see [`Engine::resource`]).
    pub fn get_approval(&self, id: Uuid) -> Result<Approval> {
        self.state()?.get_approval(id)
    }

    /// One page of a resource: a queue a page at a time.
    pub async fn resource_page(
        &self,
        name: &str,
        start: Option<PagePosition>,
        max_items: usize,
        max_bytes: usize,
    ) -> Result<ResourcePage> {
        self.committed(|state, _| state.resource_page(name, start, max_items, max_bytes))
            .await
    }

    /// The page of a resource a `GetResource` asks for, bounded in bytes by
    /// what one answer may carry under the policy in force.
    pub async fn read_resource(&self, read: &ResourceRead) -> Result<ResourcePage> {
        let max_bytes = self
            .policy()
            .server
            .max_message_bytes
            .saturating_sub(ANSWER_OVERHEAD_BYTES);
        self.resource_page(&read.name, read.start, read.max_items, max_bytes)
            .await
    }

    /// A session of the host credential `host` (sessions are namespaced by
    /// host identity).
    pub async fn session(&self, host: &str, session_id: &str) -> Result<SessionSummary> {
        let policy = self.policy();
        self.committed(|state, _| state.session(host, session_id, policy.limits.decision_cost))
            .await
    }

    /// One approval as reviewer `viewer` may see it: one it may not see is
    /// `NOT_FOUND`, exactly like one that does not exist.
    pub async fn get_approval_for(&self, id: Uuid, viewer: &str) -> Result<Approval> {
        let policy = self.policy();
        let approval = self
            .with_expiry(&policy, |state, _, _| state.get_approval(id))
            .await?;
        if crate::domain::ledger::visible_to(&approval, viewer, &policy) {
            Ok(approval)
        } else {
            Err(Error::NotFound(format!("no approval {id}")))
        }
    }

    pub async fn list_approvals(&self, query: &ListQuery) -> Result<Page> {
        let policy = self.policy();
        self.with_expiry(&policy, |state, _, _| {
            Ok(state.list_approvals(&policy, query))
        })
        .await
    }

    /// The page of resources a `ListResources` asks for, each resource
    /// with its first page, bounded in bytes like a `GetResource` answer.
    pub async fn list_resources(
        &self,
        listing: &ResourceListing,
    ) -> Result<crate::domain::state::ResourceList> {
        let max_bytes = self
            .policy()
            .server
            .max_message_bytes
            .saturating_sub(ANSWER_OVERHEAD_BYTES)
            .min(listing.max_bytes);
        let after = listing.after.as_deref();
        self.committed(|state, _| Ok(state.list_resources(after, listing.page_size, max_bytes)))
            .await
    }

    /// Grant, deny or revoke by the authenticated reviewer.
    pub async fn review(
        &self,
        id: Uuid,
        verdict: Verdict,
        reviewer: &str,
        note: String,
    ) -> Result<Approval> {
        let reviewed = self
            .committed_publishing(|state, now, transitions| {
                // The policy in force once the review holds the state (or
                // its turn), not when it asked: a reload that took the
                // reviewer's authority away meanwhile is the one that judges.
                let policy = self.policy();
                transitions.extend(state.expire_due(&policy, now));
                let event = state.review(&policy, now, id, verdict, reviewer, note)?;
                let approval = event.approval.clone();
                transitions.push(event);
                Ok(approval)
            })
            .await;
        match reviewed {
            Ok(approval) => Ok(approval),
            Err(error) => {
                if matches!(
                    error,
                    Error::PermissionDenied(_) | Error::FailedPrecondition(_) | Error::NotFound(_)
                ) {
                    self.audit_rejection(audit::Rejection::ReviewRefused, |coalesced, revision| {
                        audit!(
                            "review_refused",
                            reviewer,
                            approval_id = %id,
                            verdict = match verdict {
                                Verdict::Grant => "grant",
                                Verdict::Deny => "deny",
                                Verdict::Revoke => "revoke",
                            },
                            code = error.code_name(),
                            rule = %error,
                            policy_revision = revision,
                            coalesced,
                        );
                    });
                }
                Err(error)
            }
        }
    }

    /// Expires due approvals and evicts idle sessions; run periodically so
    /// that `approval_expired` is reported even when nothing else happens.
    pub async fn sweep(&self) -> Result<()> {
        let policy = self.policy();
        self.committed_publishing(|state, now, transitions| {
            transitions.extend(state.sweep(&policy, now));
            Ok(())
        })
        .await?;
        self.report_coalesced();
        Ok(())
    }

    /// Runs one operation under the state lock after expiring what is due
    /// and waits until it is durable ([`Engine::committed_publishing`]);
    /// the expirations are published with the operation's transitions
    /// (even when the operation fails). The caller passes the policy
    /// snapshot it already holds.
    async fn with_expiry<T>(
        &self,
        policy: &Policy,
        operation: impl FnOnce(&mut State, Timestamp, &mut Vec<ApprovalEvent>) -> Result<T>,
    ) -> Result<T> {
        self.committed_publishing(|state, now, transitions| {
            transitions.extend(state.expire_due(policy, now));
            operation(state, now, transitions)
        })
        .await
    }

    /// Runs one operation under the state lock, hands what it changed to
    /// the writer there (in commit order), and returns its result once every
    /// change it made or could have observed is durable. When the store
    /// fails first the result is withheld: UNAVAILABLE, as for every call
    /// after it. On a shared store the operation runs in a turn, at the
    /// turn's time ([`Engine::in_turn`]).
    async fn committed<T>(
        &self,
        operation: impl FnOnce(&mut State, Timestamp) -> Result<T>,
    ) -> Result<T> {
        self.committed_publishing(|state, now, _| operation(state, now))
            .await
    }

    /// [`Engine::committed`] for an operation that makes ledger
    /// transitions (it adds them to the list it is given): they are
    /// queued under the state lock with the batch of the operation's
    /// changes, so in commit order, and audited and sent to watchers once
    /// that batch is durable, never before and never out of order
    /// ([`Engine::flush_outbox`]).
    async fn committed_publishing<T>(
        &self,
        operation: impl FnOnce(&mut State, Timestamp, &mut Vec<ApprovalEvent>) -> Result<T>,
    ) -> Result<T> {
        let (result, number) = match self.shared.writer.gate() {
            None => {
                // The time is read under the lock, so that operations
                // write their times in the order they change the state.
                let mut state = self.state()?;
                let now = self.now();
                let mut transitions = Vec::new();
                let result = operation(&mut state, now, &mut transitions);
                (result, self.hand_to_writer(&mut state, transitions)?)
            }
            Some(gate) => self.in_turn(gate, operation).await?,
        };
        let durable = self.shared.writer.durable(number).await;
        self.flush_outbox();
        durable.map_err(|error| match self.shared.writer.gate() {
            // A replica goes on after a turn that failed: the error says
            // what became of this call's commit.
            Some(_) => Error::Unavailable(format!("the shared store: {error}")),
            None => store_failed(&error.to_string()),
        })?;
        result
    }

    /// Publishes the queued transitions whose batch is settled, in commit
    /// order ([`Publisher::flush`]).
    fn flush_outbox(&self) {
        self.shared
            .publisher
            .flush(|number| self.shared.writer.settled(number));
    }

    /// Waits for a turn of the shared store (asking for one when none is
    /// open), runs `operation` in it under the state lock and hands its
    /// changes to the writer: its result and the number to wait for.
    async fn in_turn<T>(
        &self,
        gate: &Gate,
        operation: impl FnOnce(&mut State, Timestamp, &mut Vec<ApprovalEvent>) -> Result<T>,
    ) -> Result<(Result<T>, u64)> {
        let mut opened = gate.subscribe();
        let mut operation = Some(operation);
        let mut ticket = None;
        loop {
            opened.borrow_and_update();
            {
                let mut state = self.state()?;
                if let Some(now) = gate.open_at()
                    && let Some(operation) = operation.take()
                {
                    self.shared.writer.ran_in_turn(ticket);
                    let mut transitions = Vec::new();
                    let result = operation(&mut state, now, &mut transitions);
                    return Ok((result, self.hand_to_writer(&mut state, transitions)?));
                }
                ticket = Some(self.shared.writer.want_turn());
            }
            if opened.changed().await.is_err() {
                return Err(store_failed("the store writer stopped"));
            }
        }
    }

    /// Hands the state's changes to the writer (under the state lock), and
    /// queues `transitions` with their batch: the number the answer must
    /// wait for. A change that cannot be encoded breaks the engine for
    /// good: the state is ahead of the store.
    fn hand_to_writer(&self, state: &mut State, transitions: Vec<ApprovalEvent>) -> Result<u64> {
        match state.take() {
            Ok(taken) => {
                let number = self.shared.writer.append(taken.changes, taken.observable);
                self.shared.publisher.queue(number, transitions);
                Ok(number)
            }
            Err(error) => {
                tracing::error!(%error, "a change could not be made durable; every call is refused from now on");
                let _ = self.shared.broken.set(error.to_string());
                Err(store_failed(&error.to_string()))
            }
        }
    }

    /// The policy in force now, as an immutable snapshot.
    pub fn policy(&self) -> Arc<Policy> {
        snapshot(&self.shared.policy)
    }

    /// The reload decision: swaps in `policy` unless
    /// [`Policy::reload_refusal`] says why not (then the policy in force is
    /// kept, and the reason returned). `serving`: how the server serves.
    pub fn reload(&self, policy: Policy, serving: &Serving) -> std::result::Result<(), String> {
        let running = self.policy();
        let running_kinds: Vec<CredentialKind> = [CredentialKind::Host, CredentialKind::Reviewer]
            .into_iter()
            .filter(|kind| self.has_credentials(*kind))
            .collect();
        if let Some(refusal) = running.reload_refusal(&running_kinds, &policy, serving) {
            return Err(refusal);
        }
        self.replace_policy(policy);
        Ok(())
    }

    /// Swaps in a new policy whole, unchecked (tests; a reload goes through
    /// [`Engine::reload`]). State made through the API (pins, approvals,
    /// receipts) is kept.
    pub fn replace_policy(&self, policy: Policy) {
        let revision = policy.revision.clone();
        let new_policy = Arc::new(policy);
        // On a shared store the new resources are adopted in the next turn
        // (against what every replica committed), not here.
        let mut state = match self.shared.writer.gate() {
            None => self.state().ok(),
            Some(_) => None,
        };
        if let Some(state) = state.as_mut() {
            state.adopt_policy(&new_policy);
            // Nobody is answered about the new resources: they are stored
            // with the next batch, without waiting.
            let _ = self.hand_to_writer(state, Vec::new());
        }
        // Under the state lock, when held: an operation that reads the
        // policy under it sees the state and the policy change together.
        match self.shared.policy.write() {
            Ok(mut guard) => *guard = new_policy,
            Err(poisoned) => *poisoned.into_inner() = new_policy,
        }
        drop(state);
        self.shared
            .reloads
            .send_modify(|generation| *generation = generation.wrapping_add(1));
        audit!("policy_reloaded", policy_revision = %revision);
    }

    /// Why every call is refused until a restart, if it is: the store
    /// failed ([`Engine::store_failure`]), or an operation panicked halfway
    /// under the state lock (every call is then INTERNAL).
    pub fn failure(&self) -> Option<String> {
        self.store_failure().or_else(|| {
            self.shared
                .state
                .is_poisoned()
                .then(|| "an operation failed halfway under the state lock".to_string())
        })
    }

    /// Why the store can take nothing more (a commit it refused, a change
    /// that could not be encoded), once that happened: every call is then
    /// refused until a restart recovers from what the store holds.
    pub fn store_failure(&self) -> Option<String> {
        match self.shared.broken.get() {
            Some(broken) => Some(broken.clone()),
            None => self.shared.writer.failure().map(|error| error.to_string()),
        }
    }

    /// Why the last commit failed, while the store is asked to resume after
    /// it (a PostgreSQL store that lost its connection): every new call is
    /// refused meanwhile, and health is NOT_SERVING.
    pub fn store_outage(&self) -> Option<String> {
        self.shared.writer.outage().map(|error| error.to_string())
    }

    /// Locks the state. A poisoned lock means an operation panicked halfway:
    /// refuse everything rather than act on possibly inconsistent state.
    /// Refuses everything once the store failed: the state in memory is
    /// then ahead of what a restart would recover.
    /// Refuses, too, while the store is in an outage it may come back from
    /// ([`Engine::store_outage`]): what is already waiting is answered
    /// once it is back; nothing new is taken on meanwhile.
    fn state(&self) -> Result<MutexGuard<'_, State>> {
        if let Some(why) = self.store_failure() {
            return Err(store_failed(&why));
        }
        if let Some(why) = self.store_outage() {
            return Err(Error::Unavailable(format!(
                "the store is unreachable ({why}); toolgate is asking it to resume: try again"
            )));
        }
        let state = self.shared.state.lock().map_err(|_| {
            Error::Internal("state is unavailable after an internal failure".into())
        })?;
        // Again under the lock, where it is set: a call that waited for the
        // lock while another's changes could not be made durable must not
        // act on (or reveal) the state they left ahead of the store.
        if let Some(why) = self.shared.broken.get() {
            return Err(store_failed(why));
        }
        Ok(state)
    }

    pub async fn assess_manifest(&self, manifest: &Manifest) -> Result<Assessment> {
        // The pins in force once the state is held (on a store of its own
        // a reload installs its policy under the state lock): a pin added
        // meanwhile is the one the manifest is compared with. So for every
        // call on the pins.
        let assessment = self
            .committed(|state, _| Ok(state.assess_manifest(&self.policy(), manifest)))
            .await?;
        let pinned_fingerprint = assessment.pinned_fingerprint.map(|pinned| pinned.hex());
        audit!(
            "manifest_assessed",
            server_id = %manifest.server_id,
            fingerprint = assessment.fingerprint.hex().as_str(),
            pinned_fingerprint = pinned_fingerprint.as_deref(),
            reason = assessment.reason.as_str(),
            changed_tools = assessment.diffs.len(),
            accepted = assessment.accepted,
        );
        Ok(assessment)
    }

    pub async fn pin_manifest(
        &self,
        reviewer: &str,
        manifest: Manifest,
        expected: Option<Fingerprint>,
    ) -> Result<PinRecord> {
        let record = self
            .committed(|state, now| state.pin_manifest(now, reviewer, manifest, expected))
            .await?;
        audit_pin_change("pinned", &record, reviewer);
        Ok(record)
    }

    pub async fn list_pins(&self) -> Result<Vec<PinRecord>> {
        self.committed(|state, _| Ok(state.list_pins(&self.policy())))
            .await
    }

    pub async fn remove_pin(&self, reviewer: &str, server_id: &str) -> Result<PinRecord> {
        let record = self
            .committed(|state, _| state.remove_pin(&self.policy(), server_id))
            .await?;
        audit_pin_change("removed", &record, reviewer);
        Ok(record)
    }
}

fn audit_pin_change(action: &'static str, record: &PinRecord, reviewer: &str) {
    audit!(
        "pin_changed",
        action,
        server_id = record.server_id.as_str(),
        fingerprint = record.fingerprint.hex().as_str(),
        reviewer,
    );
}

/// The policy behind `lock`, as an immutable snapshot (a poisoned lock
/// still holds a whole policy: a swap is one assignment).
fn snapshot(lock: &RwLock<Arc<Policy>>) -> Arc<Policy> {
    match lock.read() {
        Ok(guard) => Arc::clone(&guard),
        Err(poisoned) => Arc::clone(&poisoned.into_inner()),
    }
}

/// The answer to every call once the store failed.
fn store_failed(why: &str) -> Error {
    Error::Unavailable(format!(
        "the store failed ({why}); toolgate refuses every call until it is restarted \
         and recovers from what the store holds"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::clock::{ManualClock, Timestamp};

    /// An operation that panicked under the state lock fails the engine for
    /// good, as a failed store does: health follows [`Engine::failure`].
    #[test]
    fn a_panic_under_the_state_lock_is_a_failure() {
        let policy = Policy::embedded_default().unwrap();
        let engine = Engine::new(policy, Arc::new(ManualClock::starting_at(Timestamp(1)))).unwrap();
        assert_eq!(engine.failure(), None);
        let shared = Arc::clone(&engine.shared);
        let panicked = std::thread::spawn(move || {
            let _state = shared.state.lock();
            panic!("halfway");
        })
        .join();
        assert!(panicked.is_err());
        assert!(
            engine
                .failure()
                .is_some_and(|why| why.contains("halfway under the state lock"))
        );
        assert!(matches!(engine.stats(), Err(Error::Internal(_))));
    }
}
