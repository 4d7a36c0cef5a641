//! The gRPC edge: converts generated messages to domain types, calls the
//! engine, maps the answer back (handlers do nothing else, in the one
//! shape of [`unary::unary`]); authenticates
//! callers, sheds load, counts RPCs, accepts connections and serves.

pub(crate) mod approvals;
pub(crate) mod auth;
pub(crate) mod connections;
pub(crate) mod convert;
pub(crate) mod ext_authz;
pub mod in_process;
pub(crate) mod metrics_layer;
pub(crate) mod overload;
pub(crate) mod pdp;
pub(crate) mod pins;
pub(crate) mod resources;
pub(crate) mod router;
pub mod server;
pub(crate) mod status;
pub(crate) mod unary;

use std::future::Future;
use std::pin::Pin;

/// The future of the tower layers' services (auth, overload, metrics).
pub(crate) type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;
