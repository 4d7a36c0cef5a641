//! The domain error: one enum for every operation, mapped onto gRPC status
//! codes in exactly one place (`edge::status`).

/// An operation's failure. Refusals that SPEC calls answers (DENY, dispatch
/// statuses) are not errors; these are the calls that could not be answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// Malformed input: which field (a path like `proposal.arguments.amount`)
    /// and which rule it broke. Changes no state.
    #[error("{field}: {rule}")]
    InvalidArgument { field: String, rule: String },
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    FailedPrecondition(String),
    /// The caller is known but may not do this (a credential of the wrong
    /// kind, a host speaking for an actor it may not assert).
    #[error("{0}")]
    PermissionDenied(String),
    /// The caller is not known: no token, an unknown one, or a credential
    /// taken away by a policy reload.
    #[error("{0}")]
    Unauthenticated(String),
    #[error("{0}")]
    ResourceExhausted(String),
    /// Toolgate cannot answer now (it is shutting down); retry elsewhere or
    /// later.
    #[error("{0}")]
    Unavailable(String),
    /// Something inside toolgate failed; the caller is refused (fail closed).
    #[error("{0}")]
    Internal(String),
}

impl Error {
    pub fn invalid(field: impl Into<String>, rule: impl Into<String>) -> Self {
        Error::InvalidArgument {
            field: field.into(),
            rule: rule.into(),
        }
    }

    /// The canonical status code name (`INVALID_ARGUMENT`, …), as audit
    /// lines and metrics spell it.
    pub fn code_name(&self) -> &'static str {
        match self {
            Error::InvalidArgument { .. } => "INVALID_ARGUMENT",
            Error::NotFound(_) => "NOT_FOUND",
            Error::FailedPrecondition(_) => "FAILED_PRECONDITION",
            Error::PermissionDenied(_) => "PERMISSION_DENIED",
            Error::Unauthenticated(_) => "UNAUTHENTICATED",
            Error::ResourceExhausted(_) => "RESOURCE_EXHAUSTED",
            Error::Unavailable(_) => "UNAVAILABLE",
            Error::Internal(_) => "INTERNAL",
        }
    }

    /// Puts `prefix.` in front of an invalid-argument field path, so that a
    /// domain validator's `tools[2].name` becomes `manifest.tools[2].name`.
    pub fn under(self, prefix: &str) -> Self {
        match self {
            Error::InvalidArgument { field, rule } => {
                let field = if field.is_empty() {
                    prefix.to_string()
                } else if field.starts_with('[') {
                    format!("{prefix}{field}")
                } else {
                    format!("{prefix}.{field}")
                };
                Error::InvalidArgument { field, rule }
            }
            other => other,
        }
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// The first `max` characters of a client's `text`, for a message, and
/// whether anything was cut off (so an answer stays small whatever was
/// sent).
pub fn first_chars(text: &str, max: usize) -> (&str, bool) {
    match text.char_indices().nth(max) {
        Some((cut, _)) => (text.get(..cut).unwrap_or_default(), true),
        None => (text, false),
    }
}
