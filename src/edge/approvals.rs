//! `Approvals` handlers (reviewer-facing). The reviewer is always the
//! authenticated caller.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast::error::RecvError;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::domain::canonical::Fingerprint;
use crate::domain::error::{Error, Result};
use crate::domain::ids::approval_id;
use crate::domain::ledger::{Approval, Verdict, visible_to};
use crate::domain::limits::{Note, approval_page_token};
use crate::domain::policy::{CredentialKind, PeerCertificate, Policy};
use crate::domain::proposal;
use crate::edge::auth::{Caller, Reach, current_credential, peer_certificate, token_digest};
use crate::edge::convert::list_query;
use crate::edge::unary::unary;
use crate::engine::{Engine, Watched};
use crate::pb;
use crate::pb::approvals_server::Approvals;

#[derive(Debug, Clone)]
pub(crate) struct ApprovalsService {
    engine: Engine,
    watches: Arc<Watches>,
}

/// `WatchApprovals` streams open at once, in all.
pub(crate) const MAX_WATCHES: usize = 256;
/// `WatchApprovals` streams one reviewer may hold open at once.
pub(crate) const MAX_WATCHES_PER_REVIEWER: usize = 16;

/// The open watches by reviewer: a stream holds no call permit once it
/// is answered, so these bound what reviewers' clients can hold open.
#[derive(Debug, Default)]
struct Watches {
    by_reviewer: Mutex<HashMap<String, usize>>,
}

/// One open watch's place in [`Watches`], given back when it is dropped.
struct WatchSlot {
    watches: Arc<Watches>,
    reviewer: String,
}

impl Watches {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, usize>> {
        // Plain counts: a panic elsewhere leaves them usable.
        self.by_reviewer
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// A slot for one more watch of `reviewer`, or RESOURCE_EXHAUSTED.
    fn take(self: &Arc<Self>, reviewer: &str) -> Result<WatchSlot> {
        let mut open = self.lock();
        let total: usize = open.values().sum();
        let held = open.get(reviewer).copied().unwrap_or(0);
        if total >= MAX_WATCHES || held >= MAX_WATCHES_PER_REVIEWER {
            return Err(Error::ResourceExhausted(format!(
                "at most {MAX_WATCHES_PER_REVIEWER} WatchApprovals streams per reviewer and \
                 {MAX_WATCHES} in all are open at once; reviewer {reviewer:?} holds {held}, \
                 all hold {total}: close one first"
            )));
        }
        *open.entry(reviewer.to_string()).or_insert(0) += 1;
        Ok(WatchSlot {
            watches: Arc::clone(self),
            reviewer: reviewer.to_string(),
        })
    }
}

impl Drop for WatchSlot {
    fn drop(&mut self) {
        let mut open = self.watches.lock();
        if let Some(held) = open.get_mut(&self.reviewer) {
            *held = held.saturating_sub(1);
            if *held == 0 {
                open.remove(&self.reviewer);
            }
        }
    }
}

impl ApprovalsService {
    pub(crate) fn new(engine: Engine) -> Self {
        ApprovalsService {
            engine,
            watches: Arc::default(),
        }
    }

    /// Grant, deny or revoke as the authenticated reviewer; `note_field`
    /// names the note (`comment`, `reason`) in errors.
    async fn review(
        &self,
        caller: &Caller,
        verdict: Verdict,
        id: &str,
        (note_field, note): (&str, String),
    ) -> Result<pb::Approval> {
        let id = approval_id("approval_id", id)?;
        let note = Note::new(note_field, note)?;
        let approval = self
            .engine
            .review(id, verdict, &caller.identity, note.into_string())
            .await?;
        Ok(shown(approval, &self.engine.policy()).into())
    }
}

/// An approval as reviewers are shown it under the policy in force: its
/// arguments with what the tool marks sensitive now redacted too
/// ([`proposal::view_under`]).
fn shown(mut approval: Approval, policy: &Policy) -> Approval {
    let request = &mut approval.request;
    if let Some(view) = proposal::view_under(policy, &request.tool, &request.arguments_view) {
        request.arguments_view = view;
    }
    approval
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::ApprovalEvent, Status>> + Send>>;

/// One reviewer's watch: the ledger's transitions that it may see, until
/// shutdown, or until a policy reload takes its credential away.
struct Watch {
    engine: Engine,
    identity: String,
    /// The watcher's token digest and client certificate; re-checked at
    /// every policy reload.
    digest: Option<Fingerprint>,
    peer: Option<PeerCertificate>,
    events: tokio::sync::broadcast::Receiver<Watched>,
    reloads: tokio::sync::watch::Receiver<u64>,
    closed: Pin<Box<dyn Future<Output = ()> + Send>>,
    /// Set once the final status has been sent.
    ended: bool,
    _slot: WatchSlot,
}

impl Watch {
    /// Whether the token this watch was opened with still authenticates
    /// the same reviewer under the policy in force.
    fn credential_holds(&self) -> bool {
        current_credential(&self.engine, self.digest.as_ref(), self.peer.as_ref()).is_some_and(
            |credential| {
                credential.kind == CredentialKind::Reviewer && credential.identity == self.identity
            },
        )
    }

    /// Opens a watch for `caller`, subscribed before the call answers, so
    /// that nothing after the answer is missed; the credential is checked
    /// once more after subscribing to reloads, so that a reload racing the
    /// call cannot be missed either.
    fn open(
        engine: &Engine,
        caller: &Caller,
        digest: Option<Fingerprint>,
        peer: Option<PeerCertificate>,
        slot: WatchSlot,
    ) -> Result<Watch> {
        let watch = Watch {
            engine: engine.clone(),
            identity: caller.identity.clone(),
            digest,
            peer,
            events: engine.subscribe(),
            reloads: engine.reloads(),
            closed: Box::pin(engine.closed()),
            ended: false,
            _slot: slot,
        };
        if !watch.credential_holds() {
            return Err(revoked());
        }
        Ok(watch)
    }

    fn into_stream(self) -> EventStream {
        Box::pin(futures_util::stream::unfold(self, |mut watch| async move {
            let item = watch.next().await?;
            Some((item, watch))
        }))
    }

    async fn next(&mut self) -> Option<Result<pb::ApprovalEvent, Status>> {
        if self.ended {
            return None;
        }
        loop {
            tokio::select! {
                biased;
                () = &mut self.closed => {
                    self.ended = true;
                    return Some(Err(Error::Unavailable("toolgate is shutting down".into()).into()));
                }
                changed = self.reloads.changed() => {
                    if changed.is_err() || !self.credential_holds() {
                        self.ended = true;
                        return Some(Err(revoked().into()));
                    }
                }
                received = self.events.recv() => match received {
                    Ok(Watched::Transition(mut event)) => {
                        // Visibility follows the policy in force at each event.
                        let policy = self.engine.policy();
                        if visible_to(&event.approval, &self.identity, &policy) {
                            event.approval = shown(event.approval, &policy);
                            return Some(Ok(pb::ApprovalEvent::from(event)));
                        }
                    }
                    // This watcher fell behind, or this replica did.
                    Err(RecvError::Lagged(missed)) | Ok(Watched::Missed(missed)) => {
                        return Some(Ok(pb::ApprovalEvent {
                            kind: pb::ApprovalEventKind::Lagged.into(),
                            approval: None,
                            lagged: missed,
                        }));
                    }
                    Err(RecvError::Closed) => return None,
                },
            }
        }
    }
}

fn revoked() -> Error {
    Error::Unauthenticated("the credential of this watch was revoked by a policy reload".into())
}

#[tonic::async_trait]
impl Approvals for ApprovalsService {
    type WatchApprovalsStream = EventStream;

    #[tracing::instrument(level = "debug", skip_all)]
    async fn get_approval(
        &self,
        request: Request<pb::GetApprovalRequest>,
    ) -> Result<Response<pb::Approval>, Status> {
        unary(request, Reach::Reviewer, |caller, message| async move {
            let id = approval_id("approval_id", &message.approval_id)?;
            let approval = self.engine.get_approval_for(id, &caller.identity).await?;
            Ok(shown(approval, &self.engine.policy()).into())
        })
        .await
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn list_approvals(
        &self,
        request: Request<pb::ListApprovalsRequest>,
    ) -> Result<Response<pb::ListApprovalsResponse>, Status> {
        unary(request, Reach::Reviewer, |caller, message| async move {
            let mut query = list_query(message)?;
            query.viewer = Some(caller.identity.clone());
            let page = self.engine.list_approvals(&query).await?;
            let policy = self.engine.policy();
            Ok(pb::ListApprovalsResponse {
                approvals: (page.approvals.into_iter())
                    .map(|approval| shown(approval, &policy).into())
                    .collect(),
                next_page_token: page.next.map(approval_page_token).unwrap_or_default(),
            })
        })
        .await
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn grant_approval(
        &self,
        request: Request<pb::GrantApprovalRequest>,
    ) -> Result<Response<pb::Approval>, Status> {
        unary(request, Reach::Reviewer, |caller, message| async move {
            let note = ("comment", message.comment);
            self.review(&caller, Verdict::Grant, &message.approval_id, note)
                .await
        })
        .await
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn deny_approval(
        &self,
        request: Request<pb::DenyApprovalRequest>,
    ) -> Result<Response<pb::Approval>, Status> {
        unary(request, Reach::Reviewer, |caller, message| async move {
            let note = ("reason", message.reason);
            self.review(&caller, Verdict::Deny, &message.approval_id, note)
                .await
        })
        .await
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn revoke_approval(
        &self,
        request: Request<pb::RevokeApprovalRequest>,
    ) -> Result<Response<pb::Approval>, Status> {
        unary(request, Reach::Reviewer, |caller, message| async move {
            let note = ("reason", message.reason);
            self.review(&caller, Verdict::Revoke, &message.approval_id, note)
                .await
        })
        .await
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn watch_approvals(
        &self,
        request: Request<pb::WatchApprovalsRequest>,
    ) -> Result<Response<Self::WatchApprovalsStream>, Status> {
        let caller = Caller::require(&request, Reach::Reviewer)?;
        let slot = self.watches.take(&caller.identity)?;
        let watch = Watch::open(
            &self.engine,
            &caller,
            token_digest(&request),
            peer_certificate(&request),
            slot,
        )?;
        Ok(Response::new(watch.into_stream()))
    }
}
