//! `Approvals` handlers (reviewer-facing). The reviewer is always the
//! authenticated caller.

use std::pin::Pin;

use tokio_stream::wrappers::BroadcastStream;
use tokio_stream::wrappers::errors::BroadcastStreamRecvError;
use tokio_stream::{Stream, StreamExt};
use tonic::{Request, Response, Status};

use crate::auth::Caller;
use crate::engine::Engine;
use crate::grpc::convert::{approval_id, list_query, page_token};
use crate::ledger::Verdict;
use crate::pb;
use crate::pb::approvals_server::Approvals;
use crate::policy::CredentialKind;

/// Longest reviewer comment or reason kept with a decision.
pub const MAX_NOTE_LEN: usize = 2048;

#[derive(Debug, Clone)]
pub struct ApprovalsService {
    engine: Engine,
}

impl ApprovalsService {
    pub fn new(engine: Engine) -> Self {
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
        let caller = Caller::require(&request, CredentialKind::Reviewer)?;
        let (id, note) = fields(request.into_inner());
        let id = approval_id(&id, "approval_id")?;
        if note.chars().count() > MAX_NOTE_LEN {
            return Err(crate::error::Error::invalid(
                note_field,
                format!("must be at most {MAX_NOTE_LEN} characters"),
            )
            .into());
        }
        let approval = self.engine.review(id, verdict, &caller.identity, note)?;
        Ok(Response::new(approval.into()))
    }
}

/// A stream of one final error.
fn futures_once(status: Status) -> impl Stream<Item = Result<pb::ApprovalEvent, Status>> {
    tokio_stream::once(Err(status))
}

type EventStream = Pin<Box<dyn Stream<Item = Result<pb::ApprovalEvent, Status>> + Send>>;

#[tonic::async_trait]
impl Approvals for ApprovalsService {
    type WatchApprovalsStream = EventStream;

    #[tracing::instrument(level = "debug", skip_all)]
    async fn get_approval(
        &self,
        request: Request<pb::GetApprovalRequest>,
    ) -> Result<Response<pb::Approval>, Status> {
        Caller::require(&request, CredentialKind::Reviewer)?;
        let id = approval_id(&request.into_inner().approval_id, "approval_id")?;
        Ok(Response::new(self.engine.get_approval(id)?.into()))
    }

    #[tracing::instrument(level = "debug", skip_all)]
    async fn list_approvals(
        &self,
        request: Request<pb::ListApprovalsRequest>,
    ) -> Result<Response<pb::ListApprovalsResponse>, Status> {
        Caller::require(&request, CredentialKind::Reviewer)?;
        let page = self
            .engine
            .list_approvals(&list_query(request.into_inner())?)?;
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
        Caller::require(&request, CredentialKind::Reviewer)?;
        let events = BroadcastStream::new(self.engine.subscribe()).map(|item| match item {
            Ok(event) => Ok(pb::ApprovalEvent::from(event)),
            Err(BroadcastStreamRecvError::Lagged(missed)) => Ok(pb::ApprovalEvent {
                kind: pb::ApprovalEventKind::Lagged.into(),
                approval: None,
                lagged: missed,
            }),
        });
        let shutting_down = futures_once(Status::unavailable("toolgate is shutting down"));
        let events =
            futures_util::StreamExt::take_until(events, self.engine.closed()).chain(shutting_down);
        Ok(Response::new(Box::pin(events)))
    }
}
