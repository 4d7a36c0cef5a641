//! The gRPC edge: converts generated messages to domain types, calls the
//! engine, maps the answer back. Handlers do nothing else.

pub mod approvals;
pub mod convert;
pub mod pdp;
pub mod pins;
pub mod resources;
pub mod status;
