//! The one shape of a unary handler: the caller the authentication layer
//! attached (refused unless the service's [`Reach`] admits it), the request
//! message, one call that converts it and asks the engine, and the answer
//! or the error through the one map (`edge::status`).
//!
//! The engine's operations are short and never wait (a blocking mutex held
//! for no I/O, see `engine`), so they run on the handler's task, not in
//! `spawn_blocking`.

use tonic::{Request, Response, Status};

use crate::domain::error::Result;
use crate::edge::auth::{Caller, Reach};

pub(crate) fn unary<T, R>(
    request: Request<T>,
    reach: Reach,
    call: impl FnOnce(Caller, T) -> Result<R>,
) -> Result<Response<R>, Status> {
    let caller = Caller::require(&request, reach)?;
    Ok(Response::new(call(caller, request.into_inner())?))
}
