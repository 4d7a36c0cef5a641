//! `[limits]`: capacities and lifetimes.

use std::time::Duration;

use serde::Deserialize;

use super::PolicyError;
use super::parse::Loader;

/// Capacities and lifetimes.
#[derive(Debug, Clone, PartialEq)]
pub struct Limits {
    pub pending_ttl: Duration,
    pub grant_ttl: Duration,
    pub max_pending_per_actor: usize,
    pub max_pending_total: usize,
    /// Approval records kept in all (terminal ones are evicted oldest first).
    pub max_approval_records: usize,
    /// How long a finished (expired, consumed, revoked) approval stays readable.
    pub approval_retention: Duration,
    pub max_sessions: usize,
    pub session_idle_ttl: Duration,
    pub decision_cost: u64,
    pub receipt_capacity: usize,
    pub receipt_retention: Duration,
    /// Longest (redacted, canonical) arguments of one approval request.
    pub max_approval_argument_bytes: usize,
    /// Bytes the approval ledger, the receipt log and the sessions'
    /// remembered call ids may hold together.
    pub max_state_bytes: usize,
    /// Sessions one host may hold (sessions are namespaced by host
    /// identity); by default the whole table when the policy declares at
    /// most one host identity, half of it otherwise.
    pub max_sessions_per_host: usize,
    /// Pending approval requests one host may hold; by default
    /// `max_pending_total` with at most one host identity, half otherwise.
    pub max_pending_per_host: usize,
}

/// `max_sessions` when the policy does not say.
pub(super) const DEFAULT_MAX_SESSIONS: usize = 10_000;

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub(super) struct RawLimits {
    pending_ttl_seconds: u64,
    grant_ttl_seconds: u64,
    max_pending_per_actor: usize,
    max_pending_total: usize,
    max_approval_records: usize,
    approval_retention_seconds: u64,
    max_sessions: usize,
    session_idle_seconds: u64,
    decision_cost: u64,
    receipt_capacity: usize,
    receipt_retention_seconds: u64,
    max_approval_argument_bytes: usize,
    max_state_bytes: usize,
    max_sessions_per_host: Option<usize>,
    max_pending_per_host: Option<usize>,
}

impl Default for RawLimits {
    fn default() -> Self {
        RawLimits {
            pending_ttl_seconds: 300,
            grant_ttl_seconds: 600,
            max_pending_per_actor: 64,
            max_pending_total: 4096,
            max_approval_records: 100_000,
            approval_retention_seconds: 3600,
            max_sessions: DEFAULT_MAX_SESSIONS,
            session_idle_seconds: 3600,
            decision_cost: 1,
            receipt_capacity: 100_000,
            receipt_retention_seconds: 86_400,
            max_approval_argument_bytes: 64 * 1024,
            max_state_bytes: 256 * 1024 * 1024,
            max_sessions_per_host: None,
            max_pending_per_host: None,
        }
    }
}

/// `[limits]`: every cap and lifetime positive, the caps consistent with
/// each other, and the per-host shares of the global caps.
pub(super) fn limits(
    loader: &Loader<'_>,
    raw: RawLimits,
    hosts: usize,
) -> Result<Limits, PolicyError> {
    check_positive_limits(loader, &raw)?;
    check_limit_relations(loader, &raw)?;
    Ok(Limits {
        pending_ttl: Duration::from_secs(raw.pending_ttl_seconds),
        grant_ttl: Duration::from_secs(raw.grant_ttl_seconds),
        max_pending_per_actor: raw.max_pending_per_actor,
        max_pending_total: raw.max_pending_total,
        max_approval_records: raw.max_approval_records,
        approval_retention: Duration::from_secs(raw.approval_retention_seconds),
        max_sessions: raw.max_sessions,
        session_idle_ttl: Duration::from_secs(raw.session_idle_seconds),
        decision_cost: raw.decision_cost,
        receipt_capacity: raw.receipt_capacity,
        receipt_retention: Duration::from_secs(raw.receipt_retention_seconds),
        max_approval_argument_bytes: raw.max_approval_argument_bytes,
        max_state_bytes: raw.max_state_bytes,
        max_sessions_per_host: per_host_share(
            loader,
            "max_sessions_per_host",
            raw.max_sessions_per_host,
            raw.max_sessions,
            hosts,
        )?,
        max_pending_per_host: per_host_share(
            loader,
            "max_pending_per_host",
            raw.max_pending_per_host,
            raw.max_pending_total,
            hosts,
        )?,
    })
}

/// Caps and lifetimes that cannot be 0 (the first one that is, in this
/// order, is the error).
fn check_positive_limits(loader: &Loader<'_>, raw: &RawLimits) -> Result<(), PolicyError> {
    let positive = [
        ("pending_ttl_seconds", raw.pending_ttl_seconds as usize),
        ("grant_ttl_seconds", raw.grant_ttl_seconds as usize),
        ("max_pending_per_actor", raw.max_pending_per_actor),
        ("max_pending_total", raw.max_pending_total),
        ("max_approval_records", raw.max_approval_records),
        ("max_sessions", raw.max_sessions),
        ("session_idle_seconds", raw.session_idle_seconds as usize),
        ("receipt_capacity", raw.receipt_capacity),
        // A receipt past retention may be evicted, and a replay of its
        // Dispatch would then commit again: 0 would leave exactly-once to
        // the receipt log's room.
        (
            "receipt_retention_seconds",
            raw.receipt_retention_seconds as usize,
        ),
        (
            "max_approval_argument_bytes",
            raw.max_approval_argument_bytes,
        ),
        ("max_state_bytes", raw.max_state_bytes),
    ];
    for (key, value) in positive {
        if value == 0 {
            return Err(loader.error(format!("limits.{key}"), "must be greater than 0"));
        }
    }
    let lifetimes = [
        ("pending_ttl_seconds", raw.pending_ttl_seconds),
        ("grant_ttl_seconds", raw.grant_ttl_seconds),
        ("approval_retention_seconds", raw.approval_retention_seconds),
        ("session_idle_seconds", raw.session_idle_seconds),
        ("receipt_retention_seconds", raw.receipt_retention_seconds),
    ];
    for (key, seconds) in lifetimes {
        check_lifetime(loader, &format!("limits.{key}"), seconds)?;
    }
    Ok(())
}

/// The longest lifetime a policy may give anything (ten years): a grant of
/// `u64::MAX` seconds would never expire, and its time would be past what
/// a protobuf `Timestamp` (year 9999) can carry to the reviewers' clients.
pub(super) const MAX_LIFETIME_SECONDS: u64 = 10 * 365 * 86_400;

/// A lifetime in seconds is at most [`MAX_LIFETIME_SECONDS`].
pub(super) fn check_lifetime(
    loader: &Loader<'_>,
    key: &str,
    seconds: u64,
) -> Result<(), PolicyError> {
    if seconds > MAX_LIFETIME_SECONDS {
        return Err(loader.error(
            key,
            format!("must be at most {MAX_LIFETIME_SECONDS} (ten years)"),
        ));
    }
    Ok(())
}

/// Records hold at least every pending request; one request's arguments
/// fit in the state's byte budget.
fn check_limit_relations(loader: &Loader<'_>, raw: &RawLimits) -> Result<(), PolicyError> {
    if raw.max_approval_records < raw.max_pending_total {
        return Err(loader.error(
            "limits.max_approval_records",
            "must be at least limits.max_pending_total",
        ));
    }
    if raw.max_approval_argument_bytes > raw.max_state_bytes {
        return Err(loader.error(
            "limits.max_approval_argument_bytes",
            "must be at most limits.max_state_bytes",
        ));
    }
    Ok(())
}

/// A per-host share of a global cap: as set (at most the cap), else the
/// whole cap for one host and half of it (rounded up) for more.
fn per_host_share(
    loader: &Loader<'_>,
    key: &str,
    set: Option<usize>,
    global: usize,
    hosts: usize,
) -> Result<usize, PolicyError> {
    match set {
        Some(0) => Err(loader.error(format!("limits.{key}"), "must be greater than 0")),
        Some(share) if share > global => Err(loader.error(
            format!("limits.{key}"),
            format!("must be at most the global cap ({global})"),
        )),
        Some(share) => Ok(share),
        None if hosts > 1 => Ok(global.div_ceil(2)),
        None => Ok(global),
    }
}
