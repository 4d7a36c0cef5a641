//! Services declared in the proto whose behaviour lands in later issues.
//! Every RPC answers `UNIMPLEMENTED` until then.

use std::pin::Pin;

use tokio_stream::Stream;
use tonic::{Request, Response, Status};

use crate::pb;
use crate::pb::approvals_server::Approvals;
use crate::pb::resources_server::Resources;

#[derive(Debug, Clone, Default)]
pub struct PendingServices;

fn not_yet(method: &str) -> Status {
    Status::unimplemented(format!("{method} is not implemented yet"))
}

#[tonic::async_trait]
impl Approvals for PendingServices {
    type WatchApprovalsStream =
        Pin<Box<dyn Stream<Item = Result<pb::ApprovalEvent, Status>> + Send>>;

    async fn get_approval(
        &self,
        _request: Request<pb::GetApprovalRequest>,
    ) -> Result<Response<pb::Approval>, Status> {
        Err(not_yet("GetApproval"))
    }

    async fn list_approvals(
        &self,
        _request: Request<pb::ListApprovalsRequest>,
    ) -> Result<Response<pb::ListApprovalsResponse>, Status> {
        Err(not_yet("ListApprovals"))
    }

    async fn grant_approval(
        &self,
        _request: Request<pb::GrantApprovalRequest>,
    ) -> Result<Response<pb::Approval>, Status> {
        Err(not_yet("GrantApproval"))
    }

    async fn deny_approval(
        &self,
        _request: Request<pb::DenyApprovalRequest>,
    ) -> Result<Response<pb::Approval>, Status> {
        Err(not_yet("DenyApproval"))
    }

    async fn revoke_approval(
        &self,
        _request: Request<pb::RevokeApprovalRequest>,
    ) -> Result<Response<pb::Approval>, Status> {
        Err(not_yet("RevokeApproval"))
    }

    async fn watch_approvals(
        &self,
        _request: Request<pb::WatchApprovalsRequest>,
    ) -> Result<Response<Self::WatchApprovalsStream>, Status> {
        Err(not_yet("WatchApprovals"))
    }
}

#[tonic::async_trait]
impl Resources for PendingServices {
    async fn get_resource(
        &self,
        _request: Request<pb::GetResourceRequest>,
    ) -> Result<Response<pb::Resource>, Status> {
        Err(not_yet("GetResource"))
    }
}
