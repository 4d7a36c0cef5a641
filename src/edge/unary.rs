//! The one shape of a unary handler: the caller the authentication layer
//! attached (refused unless the service's [`Reach`] admits it), the request
//! message, one call that converts it and asks the engine, and the answer
//! or the error through the one map (`edge::status`).
//!
//! The engine's operations hold their blocking mutex for no I/O (see
//! `engine`) and then wait, asynchronously, until what they changed is
//! durable, so they run on the handler's task, not in `spawn_blocking`.

use tonic::{Request, Response, Status};

use crate::domain::error::Result;
use crate::edge::auth::{Caller, Reach};

pub(crate) async fn unary<T, R, F>(
    request: Request<T>,
    reach: Reach,
    call: impl FnOnce(Caller, T) -> F,
) -> Result<Response<R>, Status>
where
    F: Future<Output = Result<R>>,
{
    let caller = Caller::require(&request, reach)?;
    Ok(Response::new(call(caller, request.into_inner()).await?))
}
