//! The one map from domain errors onto gRPC statuses.

use tonic::{Code, Status};
use tonic_types::{ErrorDetails, StatusExt};

use crate::error::Error;

impl From<Error> for Status {
    fn from(error: Error) -> Status {
        match error {
            Error::InvalidArgument { field, rule } => {
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
