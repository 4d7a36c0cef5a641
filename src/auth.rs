//! Who is calling. The authentication layer (added with credentials) puts a
//! `Caller` into each request's extensions; handlers read it from there and
//! never from a request field.

/// The authenticated identity behind a request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub identity: String,
}

impl Caller {
    /// The identity used when the policy declares no credentials.
    pub fn anonymous() -> Self {
        Caller {
            identity: "anonymous".to_string(),
        }
    }

    pub fn of<T>(request: &tonic::Request<T>) -> Caller {
        request
            .extensions()
            .get::<Caller>()
            .cloned()
            .unwrap_or_else(Caller::anonymous)
    }
}
