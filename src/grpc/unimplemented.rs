//! Services declared in the proto whose behaviour lands in later issues.
//! Every RPC answers `UNIMPLEMENTED` until then.

use tonic::{Request, Response, Status};

use crate::pb;
use crate::pb::resources_server::Resources;

#[derive(Debug, Clone, Default)]
pub struct PendingServices;

fn not_yet(method: &str) -> Status {
    Status::unimplemented(format!("{method} is not implemented yet"))
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
