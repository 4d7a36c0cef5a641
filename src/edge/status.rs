//! The one map from domain errors onto gRPC statuses, and the
//! `request_rejected` audit line that every INVALID_ARGUMENT leaves.
//!
//! Every INVALID_ARGUMENT a handler answers is an [`Error::InvalidArgument`]
//! turned into a [`Status`] here, so this is where the line is written: the
//! call it belongs to (method, caller, and the session once it parsed) is in
//! a task-local [`RequestContext`] that the authentication layer puts around
//! every call.

use std::cell::RefCell;
use std::future::Future;

use tokio::task::futures::TaskLocalFuture;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::domain::error::Error;
use crate::domain::proposal::SessionRef;
use crate::edge::auth::Caller;
use crate::engine::Engine;
use crate::ops::audit::{Rejection, blank};

impl From<Error> for Status {
    fn from(error: Error) -> Status {
        match error {
            Error::InvalidArgument { field, rule } => {
                audit_rejected(&field, &rule);
                let message = format!("{field}: {rule}");
                let details = ErrorDetails::with_bad_request_violation(field, rule);
                Status::with_error_details(Code::InvalidArgument, message, details)
            }
            Error::NotFound(message) => Status::not_found(message),
            Error::FailedPrecondition(message) => Status::failed_precondition(message),
            Error::PermissionDenied(message) => Status::permission_denied(message),
            Error::Unauthenticated(message) => Status::unauthenticated(message),
            Error::ResourceExhausted(message) => Status::resource_exhausted(message),
            Error::Internal(message) => Status::internal(message),
        }
    }
}

tokio::task_local! {
    static REQUEST: RequestContext;
}

/// What the edge knows of the call being served, for its audit lines.
#[derive(Debug)]
pub(crate) struct RequestContext {
    engine: Engine,
    method: &'static str,
    caller: Option<Caller>,
    /// The session's actor and id, once the request's session parsed.
    session: RefCell<Option<(String, String)>>,
}

impl RequestContext {
    pub(crate) fn new(engine: Engine, path: &str, caller: Option<Caller>) -> Self {
        let trimmed = path.trim_start_matches('/');
        let method = crate::ops::metrics::METHODS
            .iter()
            .find(|method| **method == trimmed)
            .copied()
            .unwrap_or("other");
        RequestContext {
            engine,
            method,
            caller,
            session: RefCell::new(None),
        }
    }

    /// The called method, `service/method` (`other` for unknown ones).
    pub(crate) fn method(&self) -> &'static str {
        self.method
    }

    pub(crate) fn engine(&self) -> &Engine {
        &self.engine
    }

    /// Runs `with` on the context of the call being served, if any.
    pub(crate) fn with_current(with: impl FnOnce(&RequestContext)) {
        let _ = REQUEST.try_with(with);
    }

    /// Runs `call` (a call's whole future) with this context.
    pub(crate) fn scope<F: Future>(self, call: F) -> TaskLocalFuture<RequestContext, F> {
        REQUEST.scope(self, call)
    }
}

/// Notes the session of the call being served, so that a later rejection
/// of the same call names its actor and session.
pub(crate) fn note_session(session: &SessionRef) {
    let _ = REQUEST.try_with(|context| {
        *context.session.borrow_mut() = Some((session.actor.clone(), session.session_id.clone()));
    });
}

/// `request_rejected`: method, field path and rule (never a value), the
/// caller, the actor and session when they parsed, the policy revision.
fn audit_rejected(field: &str, rule: &str) {
    let in_call = REQUEST.try_with(|context| {
        let session = context.session.borrow();
        let (actor, session_id) = match &*session {
            Some((actor, session_id)) => (Some(actor.as_str()), Some(session_id.as_str())),
            None => (None, None),
        };
        let caller = context
            .caller
            .as_ref()
            .map(|caller| caller.identity.as_str());
        context
            .engine
            .audit_rejection(Rejection::RequestRejected, |coalesced, revision| {
                crate::audit!(
                    "request_rejected",
                    method = context.method,
                    field,
                    rule,
                    caller,
                    actor,
                    session_id,
                    policy_revision = revision,
                    coalesced,
                );
            });
    });
    if in_call.is_err() {
        // Not inside a served call (a library user converting an error):
        // no engine to coalesce with, and nothing to flood.
        crate::audit!(
            "request_rejected",
            method = blank::<&str>(None),
            field,
            rule,
            caller = blank::<&str>(None),
            actor = blank::<&str>(None),
            session_id = blank::<&str>(None),
            policy_revision = blank::<&str>(None),
            coalesced = 0u64,
        );
    }
}
