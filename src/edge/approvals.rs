//! `Approvals` handlers (reviewer-facing). The reviewer is always the
//! authenticated caller.

use std::future::Future;
use std::pin::Pin;

use tokio::sync::broadcast::error::RecvError;
use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::domain::canonical::Fingerprint;
use crate::domain::error::Error;
use crate::domain::ledger::{ApprovalEvent, Verdict, visible_to};
use crate::domain::policy::CredentialKind;
use crate::edge::auth::{Caller, Reach, token_digest};
use crate::edge::convert::{approval_id, list_query, page_token};
use crate::engine::Engine;
use crate::pb;
use crate::pb::approvals_server::Approvals;

/// Longest reviewer comment or reason kept with a decision.
pub(crate) const MAX_NOTE_LEN: usize = 2048;

/// About how many bytes of approvals one `ListApprovals` page holds (at
/// least one approval): well under the 4 MiB a gRPC client accepts by default.
pub(crate) const MAX_PAGE_BYTES: usize = 2 * 1024 * 1024;

#[derive(Debug, Clone)]
pub(crate) struct ApprovalsService {
    engine: Engine,
}

impl ApprovalsService {
    pub(crate) fn new(engine: Engine) -> Self {
        ApprovalsService { engine }
    }

    /// Grant, deny or revoke as the authenticated reviewer. `fields` takes
    /// the approval id and the note out of the request message; `note_field`
    /// names the note in errors.
    fn review<T>(
        &self,
        request: Request<T>,
        verdict: Verdict,
        note_field: &str,
        fields: impl FnOnce(T) -> (String, String),
    ) -> Result<Response<pb::Approval>, Status> {
        let caller = Caller::require(&request, Reach::Reviewer)?;
        let (id, note) = fields(request.into_inner());
        let id = approval_id(&id, "approval_id")?;
        if note.chars().count() > MAX_NOTE_LEN {
            return Err(crate::domain::error::Error::invalid(
                note_field,
                format!("must be at most {MAX_NOTE_LEN} characters"),
            )
            .into());
        }
        let approval = self.engine.review(id, verdict, &caller.identity, note)?;
        Ok(Response::new(approval.into()))
    }
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::ApprovalEvent, Status>> + Send>>;

/// One reviewer's watch: the ledger's transitions that it may see, until
/// shutdown, or until a policy reload takes its credential away.
struct Watch {
    engine: Engine,
    identity: String,
    /// The watcher's token digest; re-checked at every policy reload.
    digest: Option<Fingerprint>,
    events: tokio::sync::broadcast::Receiver<ApprovalEvent>,
    reloads: tokio::sync::watch::Receiver<u64>,
    closed: Pin<Box<dyn Future<Output = ()> + Send>>,
    /// Set once the final status has been sent.
    ended: bool,
}

impl Watch {
    /// Whether the token this watch was opened with still authenticates
    /// the same reviewer under the policy in force.
    fn credential_holds(&self) -> bool {
        self.digest
            .and_then(|digest| self.engine.credential(&digest))
            .is_some_and(|credential| {
                credential.kind == CredentialKind::Reviewer && credential.identity == self.identity
            })
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
                    Ok(event) => {
                        // Visibility follows the policy in force at each event.
                        if visible_to(&event.approval, &self.identity, &self.engine.policy()) {
                            return Some(Ok(pb::ApprovalEvent::from(event)));
                        }
                    }
                    Err(RecvError::Lagged(missed)) => {
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
        let caller = Caller::require(&request, Reach::Reviewer)?;
        let id = approval_id(&request.into_inner().approval_id, "approval_id")?;
        let approval = self.engine.get_approval_for(id, &caller.identity)?;
        Ok(Response::new(approval.into()))
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn list_approvals(
        &self,
        request: Request<pb::ListApprovalsRequest>,
    ) -> Result<Response<pb::ListApprovalsResponse>, Status> {
        let caller = Caller::require(&request, Reach::Reviewer)?;
        let mut query = list_query(request.into_inner())?;
        query.viewer = Some(caller.identity.clone());
        query.max_bytes = MAX_PAGE_BYTES;
        let page = self.engine.list_approvals(&query)?;
        Ok(Response::new(pb::ListApprovalsResponse {
            approvals: page.approvals.into_iter().map(pb::Approval::from).collect(),
            next_page_token: page.next.map(page_token).unwrap_or_default(),
        }))
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn grant_approval(
        &self,
        request: Request<pb::GrantApprovalRequest>,
    ) -> Result<Response<pb::Approval>, Status> {
        self.review(request, Verdict::Grant, "comment", |message| {
            (message.approval_id, message.comment)
        })
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn deny_approval(
        &self,
        request: Request<pb::DenyApprovalRequest>,
    ) -> Result<Response<pb::Approval>, Status> {
        self.review(request, Verdict::Deny, "reason", |message| {
            (message.approval_id, message.reason)
        })
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn revoke_approval(
        &self,
        request: Request<pb::RevokeApprovalRequest>,
    ) -> Result<Response<pb::Approval>, Status> {
        self.review(request, Verdict::Revoke, "reason", |message| {
            (message.approval_id, message.reason)
        })
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn watch_approvals(
        &self,
        request: Request<pb::WatchApprovalsRequest>,
    ) -> Result<Response<Self::WatchApprovalsStream>, Status> {
        let caller = Caller::require(&request, Reach::Reviewer)?;
        // Subscribed before answering, so nothing after the answer is
        // missed; the credential is checked once more after subscribing to
        // reloads, so a reload racing this call cannot be missed either.
        let watch = Watch {
            engine: self.engine.clone(),
            identity: caller.identity.clone(),
            digest: token_digest(&request),
            events: self.engine.subscribe(),
            reloads: self.engine.reloads(),
            closed: Box::pin(self.engine.closed()),
            ended: false,
        };
        if !watch.credential_holds() {
            return Err(revoked().into());
        }
        let events = futures_util::stream::unfold(watch, |mut watch| async move {
            let item = watch.next().await?;
            Some((item, watch))
        });
        Ok(Response::new(Box::pin(events)))
    }
}
