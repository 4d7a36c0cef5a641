//! Audit events (SPEC §8): structured `tracing` events on the
//! `toolgate::audit` target with a stable `event` name, ids and fingerprints,
//! never secrets or argument values.

/// The tracing target every audit event is emitted on.
pub const TARGET: &str = "toolgate::audit";

/// Emits an audit event: `audit!("manifest_assessed", server_id = %id, ...)`.
#[macro_export]
macro_rules! audit {
    ($event:expr $(, $($fields:tt)*)?) => {
        ::tracing::info!(target: "toolgate::audit", event = $event $(, $($fields)*)?)
    };
}
