//! The one map from errors onto gRPC statuses, and the `request_rejected`
//! audit line that every INVALID_ARGUMENT of a handler leaves.
//!
//! Two kinds of error reach a client, and this is the only file that turns
//! either into a [`Status`]:
//!
//! - [`Error`], the domain's: everything a handler or the authentication
//!   layer refuses;
//! - [`EdgeError`]: what the overload layer refuses at the HTTP level,
//!   before a handler runs or after it answered (framing, timeouts, budgets),
//!   where no domain error exists.
//!
//! Every INVALID_ARGUMENT a handler answers is an [`Error::InvalidArgument`]
//! turned into a [`Status`] here, so this is where the line is written: the
//! call it belongs to (method, caller, and the session once it parsed) is in
//! a task-local [`RequestContext`] that the authentication layer puts around
//! every call.

use std::cell::RefCell;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::task::futures::TaskLocalFuture;
use tonic::body::Body;
use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::domain::error::Error;
use crate::domain::policy::Credential;
use crate::domain::proposal::SessionRef;
use crate::engine::Engine;
use crate::ops::audit::Rejection;

/// `grpc-status`, as a header name made once: a header looked up by a
/// `&str` has its name parsed first, on every lookup, and each call looks
/// its status up several times (the metrics and the overload layer).
pub(crate) static GRPC_STATUS: http::HeaderName = http::HeaderName::from_static("grpc-status");
/// `grpc-message`, likewise.
pub(crate) static GRPC_MESSAGE: http::HeaderName = http::HeaderName::from_static("grpc-message");

impl From<Error> for Status {
    fn from(error: Error) -> Status {
        match error {
            Error::InvalidArgument { field, rule } => {
                audit_rejected(&field, &rule);
                bad_request(field, rule)
            }
            Error::NotFound(message) => Status::not_found(message),
            Error::FailedPrecondition(message) => Status::failed_precondition(message),
            Error::PermissionDenied(message) => Status::permission_denied(message),
            Error::Unauthenticated(message) => Status::unauthenticated(message),
            Error::ResourceExhausted(message) => Status::resource_exhausted(message),
            Error::Unavailable(message) => Status::unavailable(message),
            Error::Internal(message) => Status::internal(message),
        }
    }
}

/// The shape of every INVALID_ARGUMENT: `field: rule`, and the same two as
/// a `BadRequest` field violation in the details.
fn bad_request(field: String, rule: String) -> Status {
    let message = format!("{field}: {rule}");
    let details = ErrorDetails::with_bad_request_violation(field, rule);
    Status::with_error_details(Code::InvalidArgument, message, details)
}

/// A call the overload layer refuses at the HTTP level (see
/// `edge::overload`): the request's framing, the time it takes, the memory
/// it would hold. The message is the `Display`; the code is [`code`](Self::code).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum EdgeError {
    /// Not `application/grpc…`: answered with HTTP 415 as well.
    #[error("content-type: must be application/grpc (optionally +proto or ;parameters)")]
    NotGrpc,
    /// The request message as a whole (`request`) or one of its fields is
    /// malformed: framing, or protobuf that cannot be decoded. Shaped like
    /// [`Error::InvalidArgument`], but before any handler, so no
    /// `request_rejected` line (the transport metrics count these).
    #[error("{field}: {rule}")]
    Malformed { field: String, rule: String },
    #[error("toolgate's log sink is not taking audit lines; retry when health is SERVING")]
    LogSinkStalled,
    #[error("the request took longer than the server's {} ms limit", .0.as_millis())]
    RequestTimeout(Duration),
    #[error(
        "the request message did not arrive within the server's {} ms read timeout",
        .0.as_millis()
    )]
    ReadTimeout(Duration),
    #[error(
        "the response could not be sent within the server's {} ms write timeout",
        .0.as_millis()
    )]
    WriteTimeout(Duration),
    #[error("toolgate is at its concurrency limit; retry with backoff")]
    ConcurrencyLimit,
    #[error("toolgate's request buffer is full; retry with backoff")]
    RequestBufferFull,
    #[error("toolgate's response buffer is full; retry with backoff")]
    ResponseBufferFull,
    /// Refused from the length prefix, before the message is read.
    #[error("the request message is too large: {length} bytes, the limit is {limit}")]
    TooLarge { length: usize, limit: usize },
    /// Tonic's own refusal of a message over the decoding limit, with its
    /// message, as RESOURCE_EXHAUSTED (gRPC's convention) not OUT_OF_RANGE.
    #[error("{0}")]
    OverDecodingLimit(String),
    /// The request body failed while being read (the client reset it).
    #[error("request body: {0}")]
    BodyFailed(String),
}

impl EdgeError {
    pub(crate) fn code(&self) -> Code {
        match self {
            EdgeError::NotGrpc | EdgeError::Malformed { .. } => Code::InvalidArgument,
            EdgeError::LogSinkStalled => Code::Unavailable,
            EdgeError::RequestTimeout(_)
            | EdgeError::ReadTimeout(_)
            | EdgeError::WriteTimeout(_) => Code::DeadlineExceeded,
            EdgeError::ConcurrencyLimit
            | EdgeError::RequestBufferFull
            | EdgeError::ResponseBufferFull
            | EdgeError::TooLarge { .. }
            | EdgeError::OverDecodingLimit(_) => Code::ResourceExhausted,
            EdgeError::BodyFailed(_) => Code::Cancelled,
        }
    }

    /// The whole HTTP answer: a trailers-only gRPC response, with HTTP 415
    /// for a request that is not gRPC at all.
    pub(crate) fn into_http(self) -> http::Response<Body> {
        let not_grpc = self == EdgeError::NotGrpc;
        let mut response = Status::from(self).into_http::<Body>();
        if not_grpc {
            *response.status_mut() = http::StatusCode::UNSUPPORTED_MEDIA_TYPE;
        }
        response
    }
}

impl From<EdgeError> for Status {
    fn from(error: EdgeError) -> Status {
        match error {
            EdgeError::Malformed { field, rule } => bad_request(field, rule),
            other => Status::new(other.code(), other.to_string()),
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
    /// The authenticated caller's credential, if any.
    caller: Option<Arc<Credential>>,
    /// The session's actor and id, once the request's session parsed.
    session: RefCell<Option<(String, String)>>,
}

impl RequestContext {
    pub(crate) fn new(engine: Engine, path: &str, caller: Option<Arc<Credential>>) -> Self {
        RequestContext {
            engine,
            method: crate::ops::methods::method_label(path),
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

/// Notes the session of the call being served, so that its rejection names
/// its actor and session: called when a call whose session parsed fails,
/// before its error becomes a status (a copy of both names per call
/// otherwise).
pub(crate) fn note_session(session: &SessionRef) {
    let _ = REQUEST.try_with(|context| {
        *context.session.borrow_mut() = Some((session.actor.clone(), session.session_id.clone()));
    });
}

/// `request_rejected`: method, field path and rule (never a value), the
/// caller, the actor and session when they parsed, the policy revision.
pub(crate) fn audit_rejected(field: &str, rule: &str) {
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
            method = None::<&str>,
            field,
            rule,
            caller = None::<&str>,
            actor = None::<&str>,
            session_id = None::<&str>,
            policy_revision = None::<&str>,
            coalesced = 0u64,
        );
    }
}
