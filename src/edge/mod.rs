//! The gRPC edge: converts generated messages to domain types, calls the
//! engine, maps the answer back (handlers do nothing else); authenticates
//! callers, sheds load, counts RPCs, accepts connections and serves.

pub mod approvals;
pub mod auth;
pub mod connections;
pub mod convert;
pub mod overload;
pub mod pdp;
pub mod pins;
pub mod resources;
pub mod server;
pub mod status;
