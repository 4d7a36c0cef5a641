//! What an operator runs toolgate with: audit events (SPEC §8), the
//! background log writer, the metrics registry and the RPC names it counts
//! by, and the listener's TLS material.

pub mod audit;
pub mod logwriter;
pub mod methods;
pub mod metrics;
pub mod tls;
