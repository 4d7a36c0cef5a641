//! What an operator runs toolgate with: audit events (SPEC §8), the
//! background log writer, the metrics registry and the RPC names it counts
//! by, the process's own figures from `/proc`, the build it runs, and the
//! listener's TLS material.

pub mod audit;
pub mod build_info;
pub mod logwriter;
pub mod methods;
pub mod metrics;
pub mod process;
pub mod tls;
