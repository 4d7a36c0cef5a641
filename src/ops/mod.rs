//! What an operator runs toolgate with: audit events (SPEC §8), the
//! background log writer, the metrics registry.

pub mod audit;
pub mod logwriter;
pub mod metrics;
